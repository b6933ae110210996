package dev.edgereg;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Ed25519;
import dev.edgereg.internal.Json;
import org.junit.jupiter.api.Test;

class CoreTest {
    // RFC 8032 section 7.1, tests 1 to 3 and SHA(abc).
    static final String[][] RFC8032 = {
        {"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
         "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"},
        {"3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
         "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"},
        {"fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
         "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"},
    };

    @Test
    void rfc8032VectorsVerifyWithBothProviders() {
        for (Ed25519 ed : TestSupport.providers()) {
            for (String[] v : RFC8032) {
                byte[] pk = Codec.unhex(v[0]);
                byte[] msg = Codec.unhex(v[1]);
                byte[] sig = Codec.unhex(v[2]);
                assertTrue(ed.verify(pk, msg, sig), ed.name() + " " + v[0]);
                byte[] flipped = sig.clone();
                flipped[5] ^= 1;
                assertFalse(ed.verify(pk, msg, flipped), ed.name() + " accepts a flipped bit");
                assertFalse(ed.verify(pk, Codec.utf8("other"), sig), ed.name() + " accepts another message");
            }
        }
    }

    @Test
    void strictJson() {
        String[] valid = {"{}", "[]", "0", "-0", "1.5e3", " {\"a\":[1,2,{\"b\":null}]} ", "\"\\u00e9\\ud83d\\ude00\"", "\"\\uD83D\\uDE00\"", "\"\\\\ud800\"",
            "123456789012345678901234567890"};
        String[] invalid = {"", "{\"a\":1,\"a\":2}", "{\"a\":1,\"\\u0061\":2}", "NaN", "Infinity", "-Infinity", "1e400", "01", "1.", "1e",
            "[1,]", "{\"a\" 1}", "\"\u0001\"", "\ufeff{}", "[" + new String(new char[65]).replace("\0", "[") , "tru", "{'a':1}",
            // Lone surrogate escapes (docs/protocol.md section 2): high alone, low alone, high then not low.
            "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\udc00\\ud800\"", "{\"\\ud800\":1}",
            "[\"\\ud800\",\"\\udc00\"]", "\"\\ud83d\ud83d\ude00\""};
        for (String s : valid) assertTrue(Json.isValid(Codec.utf8(s)), s);
        for (String s : invalid) assertFalse(Json.isValid(Codec.utf8(s)), s);
        StringBuilder deep = new StringBuilder();
        for (int i = 0; i < 64; i++) deep.append('[');
        for (int i = 0; i < 64; i++) deep.append(']');
        assertTrue(Json.isValid(Codec.utf8(deep.toString())), "64 deep is allowed");
        StringBuilder deeper = new StringBuilder();
        for (int i = 0; i < 60000; i++) deeper.append('[');
        assertFalse(Json.isValid(Codec.utf8(deeper.toString())), "60,000 [ do not exhaust the stack");
        assertFalse(Json.isValid(new byte[] {'"', (byte) 0xff, '"'}), "not UTF-8");
        assertEquals("{\"a\":[1,true,null],\"b\":\"x\"}", Json.canonicalString(parse("{\"b\":\"x\",\"a\":[1,true,null]}")));
    }

    static Object parse(String s) {
        try {
            return Json.parse(s);
        } catch (Json.JsonException e) {
            throw new AssertionError(e);
        }
    }

    @Test
    void canonicalBase64() {
        for (int n = 0; n < 40; n++) {
            byte[] b = new byte[n];
            for (int i = 0; i < n; i++) b[i] = (byte) (i * 37 + n);
            assertEquals(java.util.Base64.getEncoder().encodeToString(b), Codec.base64(b));
            assertArrayEquals(b, Codec.base64Decode(Codec.base64(b)));
        }
        assertNull(Codec.base64Decode("aGk"), "unpadded");
        assertNull(Codec.base64Decode("aGl="), "non-zero unused bits");
        assertNull(Codec.base64Decode("aG k"), "space");
        assertNull(Codec.base64Decode("aGk-"), "url-safe alphabet");
    }

    @Test
    void rfc3339() {
        assertEquals(Long.valueOf(1751371200L), Codec.parseTime("2025-07-01T12:00:00Z"));
        assertEquals(Long.valueOf(0L), Codec.parseTime("1970-01-01T00:00:00Z"));
        assertEquals(Long.valueOf(951782400L), Codec.parseTime("2000-02-29T00:00:00Z"));
        for (String bad : new String[] {"2025-07-01T12:00:00.5Z", "2025-07-01T12:00:00+00:00", "2025-07-01t12:00:00z", "2025-02-30T00:00:00Z",
            "2025-07-01T24:00:00Z", "2025-07-01 12:00:00Z", "2025-07-01T12:00:00Z\n"}) {
            assertNull(Codec.parseTime(bad), bad);
        }
        assertEquals("2025-07-01T12:00:00Z", Codec.formatTime(1751371200L));
        assertEquals(Long.valueOf(1751371200L), Codec.parseLooseTime("2025-07-01T14:00:00.25+02:00"));
    }

    @Test
    void formatTimeAgreesWithJavaTimeAndIgnoresTheLocale() {
        java.util.Locale before = java.util.Locale.getDefault();
        java.util.Locale.setDefault(java.util.Locale.forLanguageTag("ar-EG")); // Arabic-Indic digits
        try {
            java.util.Random random = new java.util.Random(28);
            long[] fixed = {0L, -1L, 951782400L, 951868799L, 4102444800L - 1, 253402300799L, -62135596800L};
            for (int i = 0; i < fixed.length + 20000; i++) {
                long t = i < fixed.length ? fixed[i] : Math.floorMod(random.nextLong(), 253402300800L + 62135596800L) - 62135596800L;
                String want = java.time.format.DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss'Z'", java.util.Locale.ROOT)
                    .format(java.time.Instant.ofEpochSecond(t).atOffset(java.time.ZoneOffset.UTC));
                assertEquals(want, Codec.formatTime(t), "epoch second " + t);
                assertEquals(Long.valueOf(t), Codec.parseTime(want), want);
            }
        } finally {
            java.util.Locale.setDefault(before);
        }
    }
}
