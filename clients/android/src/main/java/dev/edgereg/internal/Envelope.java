package dev.edgereg.internal;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** The one envelope reader (docs/protocol.md section 7, rules 2 to 5). */
public final class Envelope {
    private Envelope() {}

    /** DSSE pre-authentication encoding: what a signature covers. */
    public static byte[] pae(String payloadType, byte[] payload) {
        byte[] type = Codec.utf8(payloadType);
        byte[] head = Codec.utf8("DSSEv1 " + type.length + " " + payloadType + " " + payload.length + " ");
        byte[] out = new byte[head.length + payload.length];
        System.arraycopy(head, 0, out, 0, head.length);
        System.arraycopy(payload, 0, out, head.length, payload.length);
        return out;
    }

    /**
     * Verify an envelope against pinned keys (key id to raw 32-byte key) and return the payload.
     *
     * @throws Rejected malformed, unknown-key or bad-signature
     */
    public static byte[] verify(byte[] envelope, Map<String, byte[]> trusted, String payloadType, Ed25519 ed) throws Rejected {
        Object parsed;
        try {
            parsed = Json.parse(envelope);
        } catch (Json.JsonException e) {
            throw new Rejected(Reasons.MALFORMED, "envelope is not JSON (" + e.getMessage() + "); expected a signed envelope");
        }
        if (!(parsed instanceof Map)) throw new Rejected(Reasons.MALFORMED, "envelope is not a JSON object");
        @SuppressWarnings("unchecked")
        Map<String, Object> data = (Map<String, Object>) parsed;
        if (!(data.get("payload") instanceof String)) throw new Rejected(Reasons.MALFORMED, "envelope has no string 'payload'");
        if (!(data.get("payloadType") instanceof String)) throw new Rejected(Reasons.MALFORMED, "envelope has no string 'payloadType'");
        if (!(data.get("signatures") instanceof List)) throw new Rejected(Reasons.MALFORMED, "envelope has no list 'signatures'");
        @SuppressWarnings("unchecked")
        List<Object> signatures = (List<Object>) data.get("signatures");
        if (signatures.isEmpty()) throw new Rejected(Reasons.MALFORMED, "envelope has no signatures, expected at least one");
        List<Map<String, Object>> byTrusted = new ArrayList<Map<String, Object>>();
        for (int i = 0; i < signatures.size(); i++) {
            Object s = signatures.get(i);
            if (!(s instanceof Map)) throw new Rejected(Reasons.MALFORMED, "envelope signatures[" + i + "] is not an object");
            @SuppressWarnings("unchecked")
            Map<String, Object> sig = (Map<String, Object>) s;
            if (!(sig.get("keyid") instanceof String)) throw new Rejected(Reasons.MALFORMED, "envelope signatures[" + i + "] has no string 'keyid'");
            if (trusted.containsKey(sig.get("keyid"))) byTrusted.add(sig);
        }
        String type = (String) data.get("payloadType");
        if (!type.equals(payloadType)) {
            throw new Rejected(Reasons.MALFORMED, "envelope payload type is '" + type + "', expected '" + payloadType + "'");
        }
        if (byTrusted.isEmpty()) {
            throw new Rejected(Reasons.UNKNOWN_KEY, "no signature by a trusted key (the envelope is signed by keys this app does not pin)");
        }
        byte[] payload = Codec.base64Decode((String) data.get("payload"));
        if (payload == null) throw new Rejected(Reasons.BAD_SIGNATURE, "envelope payload is not canonical standard base64 (RFC 4648, padded)");
        if (ed == null) throw new Rejected(Reasons.UNTRUSTED, "no Ed25519 implementation: the platform has none (Android < 13) and BouncyCastle is not in the app");
        byte[] message = pae(type, payload);
        for (Map<String, Object> sig : byTrusted) {
            String keyid = (String) sig.get("keyid");
            Object s = sig.get("sig");
            if (!(s instanceof String)) throw new Rejected(Reasons.BAD_SIGNATURE, "signature by trusted key " + keyid.substring(0, 12) + " has no 'sig'");
            byte[] raw = Codec.base64Decode((String) s);
            if (raw == null) throw new Rejected(Reasons.BAD_SIGNATURE, "signature by trusted key " + keyid.substring(0, 12) + " is not canonical base64");
            if (!ed.verify(trusted.get(keyid), message, raw)) {
                throw new Rejected(Reasons.BAD_SIGNATURE, "signature by trusted key " + keyid.substring(0, 12)
                        + " does not verify: the payload, its type or the signature was altered");
            }
        }
        return payload;
    }
}
