package dev.edgereg.internal;

import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import java.security.KeyFactory;
import java.security.PublicKey;
import java.security.Signature;
import java.security.spec.X509EncodedKeySpec;

/**
 * Ed25519 verification (RFC 8032): the platform's where it has one (JDK 15+, Android 13+),
 * else BouncyCastle's lightweight API, loaded by reflection so that an app that never runs on
 * Android older than 13 needs no BouncyCastle at all.
 */
public abstract class Ed25519 {
    /** SubjectPublicKeyInfo prefix of an Ed25519 key (RFC 8410): the 32 raw bytes follow. */
    static final byte[] SPKI_PREFIX = Codec.unhex("302a300506032b6570032100");

    /** The provider's name, for diagnostics and tests. */
    public abstract String name();

    /** True when {@code sig} (64 bytes) is a valid signature of {@code message} by {@code rawKey} (32 bytes). */
    public abstract boolean verify(byte[] rawKey, byte[] message, byte[] sig);

    private static volatile Ed25519 best;

    /** The platform's provider when it works, else BouncyCastle's, else null. */
    public static Ed25519 best() {
        Ed25519 b = best;
        if (b != null) return b;
        Ed25519 p = platform();
        b = p != null ? p : bouncyCastle();
        best = b;
        return b;
    }

    /** The platform's Ed25519 ({@code Signature.getInstance("Ed25519")}), or null when it has none. */
    public static Ed25519 platform() {
        try {
            Signature.getInstance("Ed25519");
            KeyFactory.getInstance("Ed25519");
        } catch (Exception e) {
            return null;
        }
        Ed25519 candidate = new Platform();
        return candidate.selfTest() ? candidate : null;
    }

    /** BouncyCastle's Ed25519 (bcprov on the class path), or null when it is absent. */
    public static Ed25519 bouncyCastle() {
        try {
            Ed25519 candidate = new Bc();
            return candidate.selfTest() ? candidate : null;
        } catch (Throwable e) {
            return null;
        }
    }

    /** RFC 8032 section 7.1, test 2: a provider that fails it is not used. */
    boolean selfTest() {
        try {
            byte[] pk = Codec.unhex("3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c");
            byte[] sig = Codec.unhex("92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
                    + "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00");
            byte[] msg = {0x72};
            byte[] bad = {0x73};
            return verify(pk, msg, sig) && !verify(pk, bad, sig);
        } catch (Throwable e) {
            return false;
        }
    }

    static final class Platform extends Ed25519 {
        @Override public String name() { return "platform"; }

        @Override public boolean verify(byte[] rawKey, byte[] message, byte[] sig) {
            if (rawKey.length != 32 || sig.length != 64) return false;
            try {
                byte[] spki = new byte[SPKI_PREFIX.length + 32];
                System.arraycopy(SPKI_PREFIX, 0, spki, 0, SPKI_PREFIX.length);
                System.arraycopy(rawKey, 0, spki, SPKI_PREFIX.length, 32);
                PublicKey key = KeyFactory.getInstance("Ed25519").generatePublic(new X509EncodedKeySpec(spki));
                Signature s = Signature.getInstance("Ed25519");
                s.initVerify(key);
                s.update(message);
                return s.verify(sig);
            } catch (Exception e) {
                // An invalid point or a signature the provider cannot parse does not verify.
                return false;
            }
        }
    }

    static final class Bc extends Ed25519 {
        private final Constructor<?> keyParams;
        private final Constructor<?> signer;
        private final Method init;
        private final Method update;
        private final Method verifySignature;

        Bc() throws ReflectiveOperationException {
            Class<?> params = Class.forName("org.bouncycastle.crypto.params.Ed25519PublicKeyParameters");
            Class<?> signerClass = Class.forName("org.bouncycastle.crypto.signers.Ed25519Signer");
            Class<?> cipherParams = Class.forName("org.bouncycastle.crypto.CipherParameters");
            keyParams = params.getConstructor(byte[].class, int.class);
            signer = signerClass.getConstructor();
            init = signerClass.getMethod("init", boolean.class, cipherParams);
            update = signerClass.getMethod("update", byte[].class, int.class, int.class);
            verifySignature = signerClass.getMethod("verifySignature", byte[].class);
        }

        @Override public String name() { return "bouncycastle"; }

        @Override public boolean verify(byte[] rawKey, byte[] message, byte[] sig) {
            if (rawKey.length != 32 || sig.length != 64) return false;
            try {
                Object key = keyParams.newInstance(rawKey, 0);
                Object s = signer.newInstance();
                init.invoke(s, false, key);
                update.invoke(s, message, 0, message.length);
                return (Boolean) verifySignature.invoke(s, (Object) sig);
            } catch (Exception e) {
                return false;
            }
        }
    }

    /**
     * The raw 32-byte key from a PEM SubjectPublicKeyInfo, a DER one, or the raw bytes.
     *
     * @throws IllegalArgumentException not an Ed25519 public key
     */
    public static byte[] rawPublicKey(byte[] keyMaterial) {
        if (keyMaterial.length == 32) return keyMaterial.clone();
        String text = Codec.utf8(keyMaterial).trim();
        byte[] der;
        if (text.startsWith("-----BEGIN PUBLIC KEY-----")) {
            int end = text.indexOf("-----END PUBLIC KEY-----");
            if (end < 0) throw new IllegalArgumentException("PEM public key without its END line");
            String body = text.substring("-----BEGIN PUBLIC KEY-----".length(), end).replaceAll("\\s", "");
            der = Codec.base64Decode(body);
            if (der == null) throw new IllegalArgumentException("PEM public key body is not base64");
        } else if (text.startsWith("-----BEGIN")) {
            throw new IllegalArgumentException("expected '-----BEGIN PUBLIC KEY-----' (an Ed25519 public key), found another PEM block");
        } else {
            der = keyMaterial;
        }
        if (der.length != SPKI_PREFIX.length + 32) {
            throw new IllegalArgumentException("not an Ed25519 public key (SubjectPublicKeyInfo of " + der.length + " bytes, expected 44)");
        }
        for (int i = 0; i < SPKI_PREFIX.length; i++) {
            if (der[i] != SPKI_PREFIX[i]) throw new IllegalArgumentException("not an Ed25519 public key (another algorithm)");
        }
        byte[] raw = new byte[32];
        System.arraycopy(der, SPKI_PREFIX.length, raw, 0, 32);
        return raw;
    }
}
