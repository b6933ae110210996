package dev.edgereg.internal;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** Semantic versions (releases) and dotted versions with ranges (MNN, app, OS): docs/protocol.md section 7. */
public final class Versions {
    private Versions() {}

    private static final String ID = "(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)";
    static final Pattern SEMVER = Pattern.compile(
            "(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)"
                    + "(?:-(" + ID + "(?:\\." + ID + ")*))?"
                    + "(?:\\+([0-9a-zA-Z-]+(?:\\.[0-9a-zA-Z-]+)*))?");
    static final Pattern DOTTED = Pattern.compile("[0-9]+(\\.[0-9A-Za-z]+)*");
    private static final Pattern COMPARATOR = Pattern.compile("(>=|<=|==|>|<)\\s*([0-9]+(?:\\.[0-9A-Za-z]+)*)");

    public static boolean isSemver(String v) {
        return SEMVER.matcher(v).matches();
    }

    public static boolean isDotted(String v) {
        return DOTTED.matcher(v).matches();
    }

    /** SemVer 2.0 precedence (build metadata ignored); both must be semantic versions. */
    public static int compareSemver(String a, String b) {
        Matcher ma = SEMVER.matcher(a);
        Matcher mb = SEMVER.matcher(b);
        if (!ma.matches() || !mb.matches()) throw new IllegalArgumentException("not a semantic version");
        for (int i = 1; i <= 3; i++) {
            int c = new BigInteger(ma.group(i)).compareTo(new BigInteger(mb.group(i)));
            if (c != 0) return Integer.signum(c);
        }
        String pa = ma.group(4);
        String pb = mb.group(4);
        if (pa == null || pb == null) return pa == null ? (pb == null ? 0 : 1) : -1;
        String[] xa = pa.split("\\.");
        String[] xb = pb.split("\\.");
        for (int i = 0; i < Math.min(xa.length, xb.length); i++) {
            boolean na = xa[i].matches("[0-9]+");
            boolean nb = xb[i].matches("[0-9]+");
            int c;
            if (na && nb) c = new BigInteger(xa[i]).compareTo(new BigInteger(xb[i]));
            else if (na != nb) c = na ? -1 : 1;
            else c = xa[i].compareTo(xb[i]);
            if (c != 0) return Integer.signum(c);
        }
        return Integer.signum(xa.length - xb.length);
    }

    private static List<Object[]> key(String version) {
        if (!isDotted(version)) throw new IllegalArgumentException("'" + version + "' is not a version like 3.6.1");
        List<Object[]> parts = new ArrayList<Object[]>();
        for (String part : version.split("\\.", -1)) {
            int i = 0;
            while (i < part.length() && part.charAt(i) >= '0' && part.charAt(i) <= '9') i++;
            BigInteger n = i == 0 ? BigInteger.ZERO : new BigInteger(part.substring(0, i));
            parts.add(new Object[] {n, part.substring(i)});
        }
        while (!parts.isEmpty()) {
            Object[] last = parts.get(parts.size() - 1);
            if (((BigInteger) last[0]).signum() == 0 && ((String) last[1]).isEmpty()) parts.remove(parts.size() - 1);
            else break;
        }
        return parts;
    }

    /** Dotted versions part by part: leading number, then the rest as text; 3.7 equals 3.7.0. */
    public static int compareDotted(String a, String b) {
        List<Object[]> ka = key(a);
        List<Object[]> kb = key(b);
        for (int i = 0; i < Math.min(ka.size(), kb.size()); i++) {
            int c = ((BigInteger) ka.get(i)[0]).compareTo((BigInteger) kb.get(i)[0]);
            if (c == 0) c = ((String) ka.get(i)[1]).compareTo((String) kb.get(i)[1]);
            if (c != 0) return Integer.signum(c);
        }
        return Integer.signum(ka.size() - kb.size());
    }

    /** The comparators of a range like {@code >=2.3.0, <3}, or null when it does not parse. */
    public static List<String[]> parseRange(String text) {
        if (text.trim().isEmpty()) return null;
        List<String[]> out = new ArrayList<String[]>();
        for (String part : text.split(",", -1)) {
            Matcher m = COMPARATOR.matcher(pyStrip(part));
            if (!m.matches()) return null;
            out.add(new String[] {m.group(1), m.group(2)});
        }
        return out;
    }

    public static boolean satisfies(String version, String range) {
        List<String[]> comparators = parseRange(range);
        if (comparators == null) throw new IllegalArgumentException("not a version range: " + range);
        for (String[] c : comparators) {
            int cmp = compareDotted(version, c[1]);
            boolean ok;
            if (c[0].equals(">=")) ok = cmp >= 0;
            else if (c[0].equals(">")) ok = cmp > 0;
            else if (c[0].equals("<=")) ok = cmp <= 0;
            else if (c[0].equals("<")) ok = cmp < 0;
            else ok = cmp == 0;
            if (!ok) return false;
        }
        return true;
    }

    private static String pyStrip(String s) {
        int a = 0;
        int b = s.length();
        while (a < b && Character.isWhitespace(s.charAt(a))) a++;
        while (b > a && Character.isWhitespace(s.charAt(b - 1))) b--;
        return s.substring(a, b);
    }
}
