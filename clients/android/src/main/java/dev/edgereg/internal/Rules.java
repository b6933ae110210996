package dev.edgereg.internal;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/** Cohorts (section 6) and tiers (section 5), bit for bit as the reference decides them. */
public final class Rules {
    private Rules() {}

    /** The device's bucket in [0, 10000): a 32-bit unsigned prefix of sha256(salt:device_id), modulo 10000. */
    public static long cohortBucket(String deviceId, String salt) {
        byte[] d = Codec.sha256().digest(Codec.utf8(salt + ":" + deviceId));
        long prefix = ((d[0] & 0xffL) << 24) | ((d[1] & 0xffL) << 16) | ((d[2] & 0xffL) << 8) | (d[3] & 0xffL);
        return prefix % 10000L;
    }

    /** One tier's rules; null fields are unset. */
    public static final class TierRules {
        public final Long minRamMb;
        public final Long minCpuCores;
        public final List<String> socAllow;
        public final List<String> os;

        public TierRules(Long minRamMb, Long minCpuCores, List<String> socAllow, List<String> os) {
            this.minRamMb = minRamMb;
            this.minCpuCores = minCpuCores;
            this.socAllow = socAllow;
            this.os = os;
        }
    }

    /** Case-insensitive; '*' any run, '?' exactly one, everything else (brackets too) only itself. */
    public static boolean socMatches(String pattern, String soc) {
        return glob(pattern.toLowerCase(Locale.ROOT), 0, soc.toLowerCase(Locale.ROOT), 0);
    }

    private static boolean glob(String p, int i, String s, int j) {
        // Iterative with one backtrack point: linear enough for SoC names, never recursive on '*' runs.
        int star = -1;
        int mark = 0;
        while (j < s.length()) {
            if (i < p.length() && (p.charAt(i) == '?' || p.charAt(i) == s.charAt(j))) {
                i++;
                j++;
            } else if (i < p.length() && p.charAt(i) == '*') {
                star = i++;
                mark = j;
            } else if (star >= 0) {
                i = star + 1;
                j = ++mark;
            } else {
                return false;
            }
        }
        while (i < p.length() && p.charAt(i) == '*') i++;
        return i == p.length();
    }

    /** Each rule of a tier the device misses, as a phrase; empty when it meets them all. */
    public static List<String> unmet(TierRules r, long ramMb, long cores, String soc, String os) {
        List<String> out = new ArrayList<String>();
        if (r.minRamMb != null && ramMb < r.minRamMb) out.add("needs " + r.minRamMb + " MB RAM, has " + ramMb);
        if (r.minCpuCores != null && cores < r.minCpuCores) out.add("needs " + r.minCpuCores + " cores, has " + cores);
        if (r.socAllow != null) {
            boolean any = false;
            if (soc != null) for (String p : r.socAllow) any |= socMatches(p, soc);
            if (!any) out.add("needs a SoC in " + join(r.socAllow) + ", has " + (soc == null ? "none" : soc));
        }
        if (r.os != null && (os == null || !r.os.contains(os))) out.add("needs OS " + join(r.os) + ", has " + (os == null ? "none" : os));
        return out;
    }

    /** Why a device met a tier, as a phrase. */
    public static String met(String name, TierRules r, long ramMb, long cores, String soc, String os) {
        List<String> met = new ArrayList<String>();
        if (r.minRamMb != null) met.add(ramMb + " MB RAM >= " + r.minRamMb);
        if (r.minCpuCores != null) met.add(cores + " cores >= " + r.minCpuCores);
        if (r.socAllow != null) met.add("SoC " + soc + " allowed");
        if (r.os != null) met.add("OS " + os);
        return "tier " + name + ": " + (met.isEmpty() ? "the catch-all tier" : join(met));
    }

    static String join(List<String> l) {
        StringBuilder b = new StringBuilder();
        for (String s : l) {
            if (b.length() > 0) b.append(", ");
            b.append(s);
        }
        return b.toString();
    }
}
