package dev.edgereg.internal;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The conformance vectors' two pure checks (docs/protocol.md section 9), shared by the JUnit
 * suite and the device program's {@code decide} and {@code check_blob}: input object in, the
 * vector's {@code expected} shape out.
 */
public final class Conformance {
    private Conformance() {}

    public static Map<String, Object> decide(Map<String, Object> input, Ed25519 ed) throws IllegalArgumentException {
        byte[] manifest = Codec.base64Decode(str(input, "manifest"));
        if (manifest == null) throw new IllegalArgumentException("manifest is not base64");
        Map<String, byte[]> trusted = trustedKeys((List<?>) input.get("trusted_keys"));
        @SuppressWarnings("unchecked")
        Map<String, Object> device = (Map<String, Object>) input.get("device");
        if (device == null) throw new IllegalArgumentException("missing device");
        Decision.AppFacts facts = new Decision.AppFacts(opt(device, "mnn_runtime"), opt(device, "app_version"), opt(device, "os"), opt(device, "os_version"));
        Object seen = input.get("highest_seen_sequence");
        Long highest = seen instanceof Json.Num ? ((Json.Num) seen).longValue() : null;
        Long now = Codec.parseLooseTime(str(input, "now"));
        if (now == null) throw new IllegalArgumentException("now is not an RFC 3339 time");
        boolean bundle = Boolean.TRUE.equals(input.get("bundle"));
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        try {
            Decision d = Decision.decide(manifest, trusted, ed, str(input, "model"), str(input, "tier"), bundle,
                    str(device, "device_id"), facts, highest, now, true);
            out.put("accept", true);
            out.put("entry", d.unit == null ? Json.NULL : entryJson(d.unit));
            out.put("is_candidate", d.isCandidate);
            out.put("runtime_fallback", d.fallback != null);
            out.put("fallback", d.fallback == null ? Json.NULL : d.fallback);
            out.put("sequence", d.sequence);
        } catch (Rejected r) {
            out.put("accept", false);
            out.put("reason", r.code);
        }
        return out;
    }

    static Map<String, Object> entryJson(Wire.Unit unit) {
        if (!unit.bundle) return memberJson(unit.single());
        Map<String, Object> e = new LinkedHashMap<String, Object>();
        e.put("version", unit.version);
        Map<String, Object> members = new LinkedHashMap<String, Object>();
        for (Map.Entry<String, Wire.Entry> m : unit.members.entrySet()) members.put(m.getKey(), memberJson(m.getValue()));
        e.put("members", members);
        return e;
    }

    static Map<String, Object> memberJson(Wire.Entry entry) {
        Map<String, Object> e = new LinkedHashMap<String, Object>();
        e.put("version", entry.version);
        e.put("variant", entry.variant);
        e.put("sha256", entry.blob.sha256);
        e.put("size", entry.blob.size);
        return e;
    }

    public static Map<String, Object> checkBlob(Map<String, Object> input) {
        @SuppressWarnings("unchecked")
        Map<String, Object> entry = (Map<String, Object>) input.get("entry");
        Object cl = input.get("content_length");
        Long contentLength = cl instanceof Json.Num ? ((Json.Num) cl).longValue() : null;
        byte[] body = Codec.base64Decode(str(input, "body"));
        if (body == null) throw new IllegalArgumentException("body is not base64");
        Wire.BlobRef ref = new Wire.BlobRef(str(entry, "sha256"), ((Json.Num) entry.get("size")).longValue());
        Decision.BlobCheck check = new Decision.BlobCheck(ref);
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        try {
            check.expect(contentLength);
            // Fed in small chunks, as a download arrives.
            for (int off = 0; off < body.length; off += 64) check.update(body, off, Math.min(64, body.length - off));
            check.finish();
            out.put("accept", true);
        } catch (Rejected r) {
            out.put("accept", false);
            out.put("reason", r.code);
        }
        return out;
    }

    public static Map<String, byte[]> trustedKeys(List<?> pems) {
        Map<String, byte[]> trusted = new LinkedHashMap<String, byte[]>();
        if (pems == null) return trusted;
        for (Object pem : pems) {
            byte[] raw = Ed25519.rawPublicKey(Codec.utf8((String) pem));
            trusted.put(Codec.sha256Hex(raw), raw);
        }
        return trusted;
    }

    static String str(Map<String, Object> m, String key) {
        Object v = m.get(key);
        if (!(v instanceof String)) throw new IllegalArgumentException("missing string '" + key + "'");
        return (String) v;
    }

    static String opt(Map<String, Object> m, String key) {
        Object v = m.get(key);
        return v instanceof String ? (String) v : null;
    }
}
