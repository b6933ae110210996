package dev.edgereg.internal;

import java.io.UnsupportedEncodingException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * Base64, hex, SHA-256 and the one time spelling the wire allows: java.util.Base64 and java.time
 * are API 26, so Android 7.0 needs these.
 */
public final class Codec {
    private static final char[] B64 =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".toCharArray();
    private static final int[] B64_INDEX = new int[128];
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    static {
        java.util.Arrays.fill(B64_INDEX, -1);
        for (int i = 0; i < B64.length; i++) B64_INDEX[B64[i]] = i;
    }

    private Codec() {}

    public static String base64(byte[] data) {
        StringBuilder b = new StringBuilder((data.length + 2) / 3 * 4);
        int i = 0;
        for (; i + 2 < data.length; i += 3) {
            int n = ((data[i] & 0xff) << 16) | ((data[i + 1] & 0xff) << 8) | (data[i + 2] & 0xff);
            b.append(B64[n >>> 18]).append(B64[(n >>> 12) & 63]).append(B64[(n >>> 6) & 63]).append(B64[n & 63]);
        }
        int rest = data.length - i;
        if (rest == 1) {
            int n = (data[i] & 0xff) << 16;
            b.append(B64[n >>> 18]).append(B64[(n >>> 12) & 63]).append("==");
        } else if (rest == 2) {
            int n = ((data[i] & 0xff) << 16) | ((data[i + 1] & 0xff) << 8);
            b.append(B64[n >>> 18]).append(B64[(n >>> 12) & 63]).append(B64[(n >>> 6) & 63]).append('=');
        }
        return b.toString();
    }

    /**
     * Decode standard padded base64 (RFC 4648 section 4), only its canonical spelling: re-encoding
     * must give the same text, so the unused low bits of the last character cannot vary.
     *
     * @return the bytes, or null when the text is not canonical base64
     */
    public static byte[] base64Decode(String text) {
        if (text.length() % 4 != 0) return null;
        int pad = 0;
        if (text.endsWith("==")) pad = 2;
        else if (text.endsWith("=")) pad = 1;
        int n = text.length() / 4 * 3 - pad;
        byte[] out = new byte[n];
        int o = 0;
        for (int i = 0; i < text.length(); i += 4) {
            int acc = 0;
            for (int j = 0; j < 4; j++) {
                char c = text.charAt(i + j);
                int v;
                if (c == '=' && i + 4 == text.length() && j >= 4 - pad) v = 0;
                else if (c < 128 && B64_INDEX[c] >= 0) v = B64_INDEX[c];
                else return null;
                acc = (acc << 6) | v;
            }
            if (o < n) out[o++] = (byte) (acc >>> 16);
            if (o < n) out[o++] = (byte) (acc >>> 8);
            if (o < n) out[o++] = (byte) acc;
        }
        return base64(out).equals(text) ? out : null;
    }

    public static String hex(byte[] data) {
        char[] c = new char[data.length * 2];
        for (int i = 0; i < data.length; i++) {
            c[2 * i] = HEX[(data[i] >> 4) & 15];
            c[2 * i + 1] = HEX[data[i] & 15];
        }
        return new String(c);
    }

    public static byte[] unhex(String text) {
        if (text.length() % 2 != 0) throw new IllegalArgumentException("odd hex length");
        byte[] out = new byte[text.length() / 2];
        for (int i = 0; i < out.length; i++) {
            int hi = Character.digit(text.charAt(2 * i), 16);
            int lo = Character.digit(text.charAt(2 * i + 1), 16);
            if (hi < 0 || lo < 0) throw new IllegalArgumentException("not hex: " + text);
            out[i] = (byte) (hi * 16 + lo);
        }
        return out;
    }

    public static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is part of every Java platform", e);
        }
    }

    public static String sha256Hex(byte[] data) {
        return hex(sha256().digest(data));
    }

    public static byte[] utf8(String s) {
        try {
            return s.getBytes("UTF-8");
        } catch (UnsupportedEncodingException e) {
            throw new IllegalStateException(e);
        }
    }

    public static String utf8(byte[] b) {
        try {
            return new String(b, "UTF-8");
        } catch (UnsupportedEncodingException e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * Parse exactly {@code YYYY-MM-DDTHH:MM:SSZ} (RFC 3339, UTC, whole seconds).
     *
     * @return epoch seconds, or null for any other spelling or an impossible date
     */
    public static Long parseTime(String s) {
        if (s.length() != 20) return null;
        for (int i = 0; i < 20; i++) {
            char c = s.charAt(i);
            char want = "dddd-dd-ddTdd:dd:ddZ".charAt(i);
            if (want == 'd' ? !(c >= '0' && c <= '9') : c != want) return null;
        }
        int year = Integer.parseInt(s.substring(0, 4));
        int month = Integer.parseInt(s.substring(5, 7));
        int day = Integer.parseInt(s.substring(8, 10));
        int hour = Integer.parseInt(s.substring(11, 13));
        int minute = Integer.parseInt(s.substring(14, 16));
        int second = Integer.parseInt(s.substring(17, 19));
        if (year < 1 || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || second > 59) return null;
        if (day > daysIn(year, month)) return null;
        return daysFromCivil(year, month, day) * 86400L + hour * 3600L + minute * 60L + second;
    }

    /**
     * {@code YYYY-MM-DDTHH:MM:SSZ} of epoch seconds (proleptic Gregorian, UTC), by arithmetic:
     * ASCII digits whatever the default locale (String.format would localize them), and no
     * Calendar, TimeZone or Formatter to load (they cost a cold JVM tens of milliseconds per
     * update).
     */
    public static String formatTime(long epochSeconds) {
        long days = Math.floorDiv(epochSeconds, 86400L);
        long secs = Math.floorMod(epochSeconds, 86400L);
        // Howard Hinnant's civil_from_days, the inverse of daysFromCivil.
        long z = days + 719468;
        long era = Math.floorDiv(z, 146097L);
        long doe = z - era * 146097;
        long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        long mp = (5 * doy + 2) / 153;
        long day = doy - (153 * mp + 2) / 5 + 1;
        long month = mp < 10 ? mp + 3 : mp - 9;
        long year = yoe + era * 400 + (month <= 2 ? 1 : 0);
        StringBuilder b = new StringBuilder(20);
        pad(b, year, 4).append('-');
        pad(b, month, 2).append('-');
        pad(b, day, 2).append('T');
        pad(b, secs / 3600, 2).append(':');
        pad(b, secs / 60 % 60, 2).append(':');
        return pad(b, secs % 60, 2).append('Z').toString();
    }

    private static StringBuilder pad(StringBuilder b, long value, int width) {
        String digits = Long.toString(value);
        for (int i = digits.length(); i < width; i++) b.append('0');
        return b.append(digits);
    }

    /**
     * A looser RFC 3339 reader for clock overrides (the device program's {@code now}): fractions
     * and offsets allowed. Returns epoch seconds (fraction dropped) or null.
     */
    public static Long parseLooseTime(String s) {
        Long strict = parseTime(s);
        if (strict != null) return strict;
        java.util.regex.Matcher m = java.util.regex.Pattern.compile(
                "^(\\d{4}-\\d{2}-\\d{2})[Tt ](\\d{2}:\\d{2}:\\d{2})(\\.\\d+)?([Zz]|[+-]\\d{2}:\\d{2})$").matcher(s);
        if (!m.matches()) return null;
        Long base = parseTime(m.group(1) + "T" + m.group(2) + "Z");
        if (base == null) return null;
        String off = m.group(4);
        if (off.equalsIgnoreCase("z")) return base;
        int sign = off.charAt(0) == '-' ? -1 : 1;
        int mins = Integer.parseInt(off.substring(1, 3)) * 60 + Integer.parseInt(off.substring(4, 6));
        return base - sign * mins * 60L;
    }

    private static int daysIn(int year, int month) {
        switch (month) {
            case 2: return (year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)) ? 29 : 28;
            case 4: case 6: case 9: case 11: return 30;
            default: return 31;
        }
    }

    /** Days since 1970-01-01 (Howard Hinnant's algorithm, proleptic Gregorian). */
    private static long daysFromCivil(int y, int m, int d) {
        y -= m <= 2 ? 1 : 0;
        long era = (y >= 0 ? y : y - 399) / 400;
        long yoe = y - era * 400;
        long doy = (153L * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
        long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + doe - 719468;
    }
}
