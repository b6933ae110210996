package dev.edgereg.internal;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.ByteBuffer;
import java.nio.charset.Charset;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Strict JSON in, canonical JSON out (docs/protocol.md section 2).
 *
 * <p>Values: {@code Map<String,Object>} (insertion order), {@code List<Object>}, {@code String},
 * {@code Boolean}, {@link #NULL}, and {@link Num} for numbers (which keeps whether the literal
 * was an integer, so {@code 9.0} can be refused where an integer is wanted).
 *
 * <p>Refused: invalid UTF-8 (a BOM too), lone surrogate escapes, duplicate keys (after
 * unescaping), NaN and infinity literals, nesting deeper than 64, and any number whose nearest
 * double is infinite, integers included ({@code 1e400}, or an integer of 2^1024 - 2^970 and up,
 * so more than 309 digits).
 */
public final class Json {
    public static final int MAX_DEPTH = 64;
    /** JSON null inside maps and lists (Java null means "absent"). */
    public static final Object NULL = new Object() {
        @Override public String toString() { return "null"; }
    };

    private static final Charset UTF8 = Charset.forName("UTF-8");
    /** Digits of the largest double, 1.7976931348623157e308, written as an integer. */
    private static final int MAX_DOUBLE_INT_DIGITS = 309;

    private Json() {}

    /** A JSON number, as spelled. */
    public static final class Num {
        public final String text;
        public final boolean integer;

        Num(String text, boolean integer) {
            this.text = text;
            this.integer = integer;
        }

        public double doubleValue() { return Double.parseDouble(text); }

        public BigInteger bigInteger() { return new BigInteger(text); }

        /** The integer value when it fits a long, else null. */
        public Long longValue() {
            if (!integer) return null;
            BigInteger b = bigInteger();
            return b.bitLength() < 64 ? Long.valueOf(b.longValue()) : null;
        }

        @Override public boolean equals(Object o) {
            return o instanceof Num && new BigDecimal(((Num) o).text).compareTo(new BigDecimal(text)) == 0;
        }

        @Override public int hashCode() { return new BigDecimal(text).stripTrailingZeros().hashCode(); }

        @Override public String toString() { return text; }
    }

    /** Bytes that are not strict JSON. */
    public static final class JsonException extends Exception {
        public JsonException(String message) { super(message); }
    }

    public static Object parse(byte[] data) throws JsonException {
        String text;
        try {
            text = UTF8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(data)).toString();
        } catch (CharacterCodingException e) {
            throw new JsonException("not UTF-8");
        }
        return parse(text);
    }

    public static Object parse(String text) throws JsonException {
        Parser p = new Parser(text);
        p.ws();
        Object value = p.value(0);
        p.ws();
        if (p.pos != text.length()) throw p.error("extra data");
        return value;
    }

    public static boolean isValid(byte[] data) {
        try {
            parse(data);
            return true;
        } catch (JsonException e) {
            return false;
        } catch (RuntimeException e) {
            return false;
        }
    }

    private static final class Parser {
        final String s;
        int pos;

        Parser(String s) { this.s = s; }

        JsonException error(String what) { return new JsonException(what + " at character " + pos); }

        void ws() {
            while (pos < s.length()) {
                char c = s.charAt(pos);
                if (c == ' ' || c == '\t' || c == '\n' || c == '\r') pos++;
                else break;
            }
        }

        Object value(int depth) throws JsonException {
            if (pos >= s.length()) throw error("expected a value");
            char c = s.charAt(pos);
            switch (c) {
                case '{': return object(depth + 1);
                case '[': return array(depth + 1);
                case '"': return string();
                case 't': return literal("true", Boolean.TRUE);
                case 'f': return literal("false", Boolean.FALSE);
                case 'n': return literal("null", NULL);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) return number();
                    throw error("expected a value");
            }
        }

        Object literal(String word, Object v) throws JsonException {
            if (!s.startsWith(word, pos)) throw error("expected a value");
            pos += word.length();
            return v;
        }

        Map<String, Object> object(int depth) throws JsonException {
            if (depth > MAX_DEPTH) throw error("nested deeper than " + MAX_DEPTH);
            pos++;
            Map<String, Object> map = new LinkedHashMap<String, Object>();
            ws();
            if (pos < s.length() && s.charAt(pos) == '}') {
                pos++;
                return map;
            }
            while (true) {
                ws();
                if (pos >= s.length() || s.charAt(pos) != '"') throw error("expected a key");
                String key = string();
                ws();
                if (pos >= s.length() || s.charAt(pos) != ':') throw error("expected ':'");
                pos++;
                ws();
                Object v = value(depth);
                if (map.containsKey(key)) throw error("duplicate key '" + key + "'");
                map.put(key, v);
                ws();
                if (pos >= s.length()) throw error("unterminated object");
                char c = s.charAt(pos++);
                if (c == '}') return map;
                if (c != ',') throw error("expected ',' or '}'");
            }
        }

        List<Object> array(int depth) throws JsonException {
            if (depth > MAX_DEPTH) throw error("nested deeper than " + MAX_DEPTH);
            pos++;
            List<Object> list = new ArrayList<Object>();
            ws();
            if (pos < s.length() && s.charAt(pos) == ']') {
                pos++;
                return list;
            }
            while (true) {
                ws();
                list.add(value(depth));
                ws();
                if (pos >= s.length()) throw error("unterminated array");
                char c = s.charAt(pos++);
                if (c == ']') return list;
                if (c != ',') throw error("expected ',' or ']'");
            }
        }

        String string() throws JsonException {
            pos++;
            StringBuilder b = new StringBuilder();
            boolean surrogateEscape = false;
            while (true) {
                if (pos >= s.length()) throw error("unterminated string");
                char c = s.charAt(pos++);
                if (c == '"') {
                    if (surrogateEscape) checkSurrogates(b);
                    return b.toString();
                }
                if (c < 0x20) throw error("control character in string");
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (pos >= s.length()) throw error("unterminated string");
                char e = s.charAt(pos++);
                switch (e) {
                    case '"': b.append('"'); break;
                    case '\\': b.append('\\'); break;
                    case '/': b.append('/'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'n': b.append('\n'); break;
                    case 'r': b.append('\r'); break;
                    case 't': b.append('\t'); break;
                    case 'u': {
                        if (pos + 4 > s.length()) throw error("bad \\u escape");
                        int v = 0;
                        for (int i = 0; i < 4; i++) {
                            int d = Character.digit(s.charAt(pos + i), 16);
                            char h = s.charAt(pos + i);
                            boolean ascii = (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
                            if (d < 0 || !ascii) throw error("bad \\u escape");
                            v = v * 16 + d;
                        }
                        pos += 4;
                        if (v >= 0xD800 && v <= 0xDFFF) surrogateEscape = true;
                        b.append((char) v);
                        break;
                    }
                    default: throw error("bad escape");
                }
            }
        }

        /**
         * A lone surrogate escape ({@code "\\ud800"}, an unpaired {@code "\\udc00"}, a high one
         * followed by anything but a low one) is malformed (docs/protocol.md section 2, RFC 8259
         * section 8.2): it is no Unicode text, and parsers disagree on what it reads as. Literal
         * characters are well-formed UTF-8, so their surrogates always come in pairs.
         */
        private void checkSurrogates(CharSequence b) throws JsonException {
            for (int i = 0; i < b.length(); i++) {
                char c = b.charAt(i);
                if (Character.isHighSurrogate(c) && i + 1 < b.length() && Character.isLowSurrogate(b.charAt(i + 1))) {
                    i++;
                } else if (Character.isSurrogate(c)) {
                    throw error("lone surrogate escape \\u" + Integer.toHexString(c) + " in a string");
                }
            }
        }

        Num number() throws JsonException {
            int start = pos;
            if (s.charAt(pos) == '-') pos++;
            if (pos >= s.length()) throw error("bad number");
            char c = s.charAt(pos);
            if (c == '0') pos++;
            else if (c >= '1' && c <= '9') {
                while (pos < s.length() && isDigit(s.charAt(pos))) pos++;
            } else throw error("bad number");
            int intEnd = pos;
            boolean integer = true;
            if (pos < s.length() && s.charAt(pos) == '.' && pos + 1 < s.length() && isDigit(s.charAt(pos + 1))) {
                integer = false;
                pos++;
                while (pos < s.length() && isDigit(s.charAt(pos))) pos++;
            }
            if (pos < s.length() && (s.charAt(pos) == 'e' || s.charAt(pos) == 'E')) {
                int save = pos;
                pos++;
                if (pos < s.length() && (s.charAt(pos) == '+' || s.charAt(pos) == '-')) pos++;
                if (pos < s.length() && isDigit(s.charAt(pos))) {
                    integer = false;
                    while (pos < s.length() && isDigit(s.charAt(pos))) pos++;
                } else {
                    pos = save; // not an exponent: the caller sees extra data
                }
            }
            // Integers too (section 2): the rule is the double's range, not a digit limit. More
            // than 309 digits is beyond it whatever the digits, so those are never converted.
            int digits = intEnd - start - (s.charAt(start) == '-' ? 1 : 0);
            if ((integer && digits > MAX_DOUBLE_INT_DIGITS)
                    || Double.isInfinite(Double.parseDouble(s.substring(start, pos)))) {
                throw error("number too large for a double");
            }
            return new Num(s.substring(start, pos), integer);
        }

        static boolean isDigit(char c) { return c >= '0' && c <= '9'; }
    }

    // --- canonical output ------------------------------------------------------------

    /** Canonical JSON (sorted keys, no whitespace, UTF-8), as the reference writes it. */
    public static byte[] canonical(Object value) {
        StringBuilder b = new StringBuilder();
        write(b, value);
        return b.toString().getBytes(UTF8);
    }

    public static String canonicalString(Object value) {
        StringBuilder b = new StringBuilder();
        write(b, value);
        return b.toString();
    }

    /** Compact JSON keeping each object's key order (where the order means something, like tiers). */
    public static String orderedString(Object value) {
        StringBuilder b = new StringBuilder();
        write(b, value, false);
        return b.toString();
    }

    private static void write(StringBuilder b, Object v) {
        write(b, v, true);
    }

    @SuppressWarnings("unchecked")
    private static void write(StringBuilder b, Object v, boolean sort) {
        if (v == null || v == NULL) {
            b.append("null");
        } else if (v instanceof String) {
            quote(b, (String) v);
        } else if (v instanceof Boolean) {
            b.append(((Boolean) v).booleanValue() ? "true" : "false");
        } else if (v instanceof Num) {
            b.append(((Num) v).text);
        } else if (v instanceof Integer || v instanceof Long || v instanceof BigInteger) {
            b.append(v.toString());
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) throw new IllegalArgumentException("NaN or infinity is not JSON");
            b.append(pyFloat(d));
        } else if (v instanceof Map) {
            Map<String, Object> sorted = sort ? new TreeMap<String, Object>((Map<String, Object>) v) : (Map<String, Object>) v;
            b.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : sorted.entrySet()) {
                if (!first) b.append(',');
                first = false;
                quote(b, e.getKey());
                b.append(':');
                write(b, e.getValue(), sort);
            }
            b.append('}');
        } else if (v instanceof List) {
            b.append('[');
            Iterator<Object> it = ((List<Object>) v).iterator();
            while (it.hasNext()) {
                write(b, it.next(), sort);
                if (it.hasNext()) b.append(',');
            }
            b.append(']');
        } else {
            throw new IllegalArgumentException("not JSON data: " + v.getClass().getName());
        }
    }

    /** Python's repr of a float (shortest round-trip), so reports match the reference byte for byte. */
    static String pyFloat(double d) {
        if (d == Math.rint(d) && Math.abs(d) < 1e16) {
            return String.valueOf((long) d) + ".0";
        }
        String s = Double.toString(d);
        int e = s.indexOf('E');
        if (e < 0) return s;
        String mant = s.substring(0, e);
        int exp = Integer.parseInt(s.substring(e + 1));
        if (mant.endsWith(".0")) mant = mant.substring(0, mant.length() - 2);
        if (exp >= -4 && exp < 16) {
            return new BigDecimal(s).toPlainString();
        }
        return mant + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
    }

    private static void quote(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                case '\b': b.append("\\b"); break;
                case '\f': b.append("\\f"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }
}
