package dev.edgereg.internal;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/** Cohorts (section 6), tiers (section 5) and runtime hints (section 11), bit for bit as the reference decides them. */
public final class Rules {
    private Rules() {}

    /** The device's bucket in [0, 10000): a 32-bit unsigned prefix of sha256(salt:device_id), modulo 10000. */
    public static long cohortBucket(String deviceId, String salt) {
        byte[] d = Codec.sha256().digest(Codec.utf8(salt + ":" + deviceId));
        long prefix = ((d[0] & 0xffL) << 24) | ((d[1] & 0xffL) << 16) | ((d[2] & 0xffL) << 8) | (d[3] & 0xffL);
        return prefix % 10000L;
    }

    /** A device's hint facts (section 11, "Runtime hints"); null: the device does not know it. */
    public static final class HintFacts {
        public final String cpuClass;
        public final Integer cores;
        public final String soc;

        public HintFacts(String cpuClass, Integer cores, String soc) {
            this.cpuClass = cpuClass;
            this.cores = cores;
            this.soc = soc;
        }
    }

    /** The runtime a device uses for an entry, and the rules behind it. */
    public static final class RuntimeChoice {
        public final int threads;
        public final List<String> backends;
        public final String precision;
        /** The index of the rule whose runtime this is, or null: the declared runtime. */
        public final Integer rule;
        /** The index of the first rule that matched, or null (a device outside its percent: rule null, matched set). */
        public final Integer matched;

        RuntimeChoice(int threads, List<String> backends, String precision, Integer rule, Integer matched) {
            this.threads = threads;
            this.backends = backends;
            this.precision = precision;
            this.rule = rule;
            this.matched = matched;
        }
    }

    /**
     * Section 11, "Runtime hints": the first rule whose every named key equals the device's fact
     * decides alone; inside its cohort (the rule's salt and percent) the device uses the rule's
     * threads and backends with the declared precision, outside it the declared runtime, and no
     * later rule is read. No rule matches: the declared runtime.
     */
    public static RuntimeChoice chooseRuntime(Wire.Entry entry, HintFacts facts, String deviceId) {
        if (entry.hints != null) {
            for (int i = 0; i < entry.hints.size(); i++) {
                Wire.HintRule r = entry.hints.get(i);
                if (!r.matches(facts.cpuClass, facts.cores, facts.soc)) continue;
                if (cohortBucket(deviceId, r.salt) >= r.basisPoints) return new RuntimeChoice(entry.threads, entry.backends, entry.precision, null, i);
                return new RuntimeChoice(r.threads, r.backends, entry.precision, i, i);
            }
        }
        return new RuntimeChoice(entry.threads, entry.backends, entry.precision, null, null);
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
