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
    static final String VERSION = "[vV]?([0-9]+(?:\\.[0-9A-Za-z]+)*)(?:-([0-9A-Za-z-]+(?:\\.[0-9A-Za-z-]+)*))?(?:\\+[0-9A-Za-z.-]+| \\([0-9A-Za-z.-]+\\))?";
    static final Pattern VERSION_RE = Pattern.compile(VERSION);
    /** A runtime pin in a manifest (min_mnn_runtime): digits, then dot-separated parts. */
    static final Pattern DOTTED = Pattern.compile("[0-9]+(\\.[0-9A-Za-z]+)*");
    private static final Pattern COMPARATOR = Pattern.compile(" *(>=|<=|==|>|<) *(" + VERSION + ") *");
    public static final int VERSION_MAX_LENGTH = 64;
    public static final int RANGE_MAX_LENGTH = 200;

    public static boolean isSemver(String v) {
        return SEMVER.matcher(v).matches();
    }

    public static boolean isDotted(String v) {
        return DOTTED.matcher(v).matches();
    }

    /** An app, OS or MNN runtime version (docs/protocol.md section 7, "Versions"). */
    public static boolean isVersion(String v) {
        return v != null && v.length() <= VERSION_MAX_LENGTH && VERSION_RE.matcher(v).matches();
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

    private static List<Object[]> core(String core) {
        List<Object[]> parts = new ArrayList<Object[]>();
        for (String part : core.split("\\.", -1)) {
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

    private static int compareCore(List<Object[]> ka, List<Object[]> kb) {
        for (int i = 0; i < Math.min(ka.size(), kb.size()); i++) {
            int c = ((BigInteger) ka.get(i)[0]).compareTo((BigInteger) kb.get(i)[0]);
            if (c == 0) c = ((String) ka.get(i)[1]).compareTo((String) kb.get(i)[1]);
            if (c != 0) return Integer.signum(c);
        }
        return Integer.signum(ka.size() - kb.size());
    }

    private static int comparePre(String pa, String pb) {
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

    /** Compare two versions: core part by part, then pre-release; a leading v and the build ignored. */
    public static int compareDotted(String a, String b) {
        Matcher ma = VERSION_RE.matcher(a);
        Matcher mb = VERSION_RE.matcher(b);
        if (!ma.matches() || !mb.matches()) throw new IllegalArgumentException("not a version: " + a + " / " + b);
        int c = compareCore(core(ma.group(1)), core(mb.group(1)));
        return c != 0 ? c : comparePre(ma.group(2), mb.group(2));
    }

    /** The comparators of a range like {@code >=2.3.0, <3}, or null when it does not parse. */
    public static List<String[]> parseRange(String text) {
        if (text == null || text.codePointCount(0, text.length()) > RANGE_MAX_LENGTH) return null;
        List<String[]> out = new ArrayList<String[]>();
        for (String part : text.split(",", -1)) {
            Matcher m = COMPARATOR.matcher(part);
            if (!m.matches() || m.group(2).length() > VERSION_MAX_LENGTH) return null;
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

}
