package dev.edgereg.internal;


import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * The client's decision (docs/protocol.md section 7, rules 1 to 12): pure, the clock passed in.
 */
public final class Decision {
    public static final int MAX_MANIFEST_BYTES = 64 * 1024;

    public final Wire.Manifest manifest;
    /**
     * What the device should install, or null (a first release still a canary outside the cohort,
     * a withdrawn model): the manifest's entry, or its {@code instead} when it fits only so (a
     * bundle: with each substituted member replaced by its {@code instead}).
     */
    public final Wire.Unit unit;
    public final boolean isCandidate;
    public final long sequence;
    /** Why the candidate was passed over for stable (a rule-12 code or bad-release), or null. */
    public final String fallback;
    /** {@code cpu-unsupported} when {@link #unit} is (or holds) an {@code instead}, else null. */
    public final String substitute;

    public Decision(Wire.Manifest manifest, Wire.Unit unit, boolean isCandidate, long sequence, String fallback, String substitute) {
        this.manifest = manifest;
        this.unit = unit;
        this.isCandidate = isCandidate;
        this.sequence = sequence;
        this.fallback = fallback;
        this.substitute = substitute;
    }

    /** What the app says about itself for the fit rule; null fields: not said. */
    public static final class AppFacts {
        public final String mnnRuntime;
        public final String appVersion;
        public final String os;
        public final String osVersion;
        /** The device's CPU features (rule (e)); null: not said, an empty set: none. */
        public final Set<String> cpuFeatures;
        /** MiB one model (or one bundle, its members together) may take (rule (d)); null: not said. */
        public final Double memoryBudgetMb;
        /** The MNN APIs the app's model runner calls, session and/or module (rule (f)); null: not said. */
        public final Set<String> mnnApis;

        public AppFacts(String mnnRuntime, String appVersion, String os, String osVersion) {
            this(mnnRuntime, appVersion, os, osVersion, null, null);
        }

        public AppFacts(String mnnRuntime, String appVersion, String os, String osVersion, Set<String> cpuFeatures, Double memoryBudgetMb) {
            this(mnnRuntime, appVersion, os, osVersion, cpuFeatures, memoryBudgetMb, null);
        }

        public AppFacts(String mnnRuntime, String appVersion, String os, String osVersion, Set<String> cpuFeatures, Double memoryBudgetMb,
                Set<String> mnnApis) {
            this.mnnRuntime = mnnRuntime;
            this.appVersion = appVersion;
            this.os = os;
            this.osVersion = osVersion;
            this.cpuFeatures = cpuFeatures == null ? null : Collections.unmodifiableSet(new TreeSet<String>(cpuFeatures));
            this.memoryBudgetMb = memoryBudgetMb;
            this.mnnApis = mnnApis == null ? null : Collections.unmodifiableSet(new TreeSet<String>(mnnApis));
        }
    }

    /** What fits: the unit to install and whether it is a substitute; or why nothing does. */
    public static final class Fit {
        /** What to install, or null when it does not fit. */
        public final Wire.Unit unit;
        /** {@code cpu-unsupported} when {@link #unit} is or holds an {@code instead}, else null. */
        public final String substitute;
        /** {code, message} when it does not fit, else null. */
        public final String[] misfit;

        Fit(Wire.Unit unit, String substitute, String[] misfit) {
            this.unit = unit;
            this.substitute = substitute;
            this.misfit = misfit;
        }
    }

    /**
     * Verify a manifest and choose what this device runs.
     *
     * @param highestSeen the highest sequence accepted for this unit, or null on first use
     * @param now epoch seconds
     * @param checkExpiry false only for a release shipped inside the app (docs/protocol.md section 10)
     */
    public static Decision decide(byte[] manifestBytes, Map<String, byte[]> trusted, Ed25519 ed, String unitName,
            String tier, boolean bundle, String deviceId, AppFacts facts, Long highestSeen, long now, boolean checkExpiry)
            throws Rejected {
        if (manifestBytes.length > MAX_MANIFEST_BYTES) {
            throw new Rejected(Reasons.MALFORMED, "manifest is " + manifestBytes.length + " bytes, more than the limit of " + MAX_MANIFEST_BYTES);
        }
        byte[] payload = Envelope.verify(manifestBytes, trusted, Wire.PAYLOAD_TYPE_MANIFEST, ed);
        Wire.Manifest m = Wire.manifest(payload);
        if (!m.model.equals(unitName)) throw new Rejected(Reasons.WRONG_MODEL, "manifest is for model '" + m.model + "', expected '" + unitName + "'");
        if (!m.tier.equals(tier)) throw new Rejected(Reasons.WRONG_TIER, "manifest is for tier '" + m.tier + "', expected '" + tier + "'");
        boolean hasEntries = m.stableUnit != null || m.candidateUnit != null;
        if (hasEntries && m.isBundle() != bundle) {
            throw new Rejected(Reasons.MALFORMED, "the manifest of '" + m.model + "' is a " + (bundle ? "model" : "bundle")
                    + "'s, the client asked for a " + (bundle ? "bundle" : "model"));
        }
        if (highestSeen != null && m.sequence < highestSeen) {
            throw new Rejected(Reasons.ROLLBACK, "sequence " + m.sequence + " is older than " + highestSeen + " already seen");
        }
        if (checkExpiry && now >= m.expires) {
            throw new Rejected(Reasons.EXPIRED, "manifest expired at " + m.expiresText + " (now " + Codec.formatTime(now) + ")");
        }
        long sequence = Math.max(m.sequence, highestSeen == null ? 0 : highestSeen);
        Wire.Unit chosen = null;
        boolean isCandidate = false;
        if (m.candidateUnit != null && !m.paused && m.salt != null && Rules.cohortBucket(deviceId, m.salt) < m.basisPoints) {
            chosen = m.candidateUnit;
            isCandidate = true;
        } else if (m.stableUnit != null) {
            chosen = m.stableUnit;
        }
        if (chosen == null) return new Decision(m, null, false, sequence, null, null);
        Fit fitted = fit(chosen, facts);
        if (fitted.misfit == null) return new Decision(m, fitted.unit, isCandidate, sequence, null, fitted.substitute);
        String[] misfit = fitted.misfit;
        Wire.Unit stable = m.stableUnit;
        Fit stableFit = isCandidate && stable != null ? fit(stable, facts) : null;
        if (stableFit != null && stableFit.misfit == null) return new Decision(m, stableFit.unit, false, sequence, misfit[0], stableFit.substitute);
        String message = (isCandidate ? "candidate " : "stable ") + chosen.version + " " + misfit[1];
        if (stableFit != null) message += "; stable " + stable.version + " " + stableFit.misfit[1];
        throw new Rejected(misfit[0], message);
    }

    /** Why a unit does not fit (code, message), or null when it fits (perhaps only as its instead: see {@link #fit}). */
    public static String[] unfit(Wire.Unit unit, AppFacts facts) {
        return fit(unit, facts).misfit;
    }

    /** Rule 12, (a) to (f): what the device installs for {@code unit}, or why it does not fit. */
    public static Fit fit(Wire.Unit unit, AppFacts facts) {
        if (unit.bundle) return fitBundle(unit, facts);
        Wire.Entry entry = unit.single();
        String[] misfit = unfitEntry(entry, facts, true);
        if (misfit != null) return new Fit(null, null, misfit);
        Object cpu = fitApi(fitCpu(entry, facts, true), facts);
        if (cpu instanceof String[]) return new Fit(null, null, (String[]) cpu);
        if (cpu == entry) return new Fit(unit, null, null);
        Map<String, Wire.Entry> one = new LinkedHashMap<String, Wire.Entry>();
        one.put(unit.members.keySet().iterator().next(), (Wire.Entry) cpu);
        return new Fit(new Wire.Unit(unit.version, one, false, ((Wire.Entry) cpu).requires, unit.metrics), Reasons.CPU_UNSUPPORTED, null);
    }

    private static Fit fitBundle(Wire.Unit unit, AppFacts facts) {
        String[] own = unmet(unit.requires, facts);
        if (own != null) return new Fit(null, null, own);
        Map<String, Wire.Entry> chosen = new TreeMap<String, Wire.Entry>();
        boolean substituted = false;
        for (Map.Entry<String, Wire.Entry> e : unit.members.entrySet()) { // sorted by name
            // Members load together: (d) is the bundle's sum, checked after every member.
            String[] misfit = unfitEntry(e.getValue(), facts, false);
            Object cpu = misfit != null ? misfit : fitApi(fitCpu(e.getValue(), facts, false), facts);
            if (cpu instanceof String[]) {
                String[] m = (String[]) cpu;
                return new Fit(null, null, new String[] {m[0], "(member " + e.getKey() + ") " + m[1]});
            }
            substituted |= cpu != e.getValue();
            chosen.put(e.getKey(), (Wire.Entry) cpu);
        }
        if (facts.memoryBudgetMb != null) {
            double total = 0;
            StringBuilder parts = new StringBuilder();
            for (Map.Entry<String, Wire.Entry> e : chosen.entrySet()) {
                Double peak = e.getValue().peakMemoryMb;
                if (peak == null) continue; // not measured: counts 0
                total += peak;
                parts.append(parts.length() == 0 ? "" : ", ").append(e.getKey()).append(' ').append(mb(peak));
            }
            if (total > facts.memoryBudgetMb) {
                return new Fit(null, null, new String[] {Reasons.INSUFFICIENT_MEMORY, "needs " + mb(total) + " MiB for its members together ("
                        + parts + "), the device's budget is " + mb(facts.memoryBudgetMb) + " MiB"});
            }
        }
        if (!substituted) return new Fit(unit, null, null);
        return new Fit(new Wire.Unit(unit.version, Collections.unmodifiableMap(chosen), true, unit.requires, unit.metrics), Reasons.CPU_UNSUPPORTED, null);
    }

    static String mb(double v) {
        return v == Math.rint(v) && Math.abs(v) < 1e15 ? String.valueOf((long) v) : String.valueOf(v);
    }

    /** The features of the entry's avoid_cpu this device has, sorted; empty when either is not said. */
    static List<String> avoided(Wire.Entry entry, AppFacts facts) {
        List<String> out = new ArrayList<String>();
        if (entry.avoidCpu == null || facts.cpuFeatures == null) return out;
        for (String f : entry.avoidCpu) if (facts.cpuFeatures.contains(f)) out.add(f);
        Collections.sort(out);
        return out;
    }

    /**
     * Rule (e) on an entry that passed (a) to (d): the entry itself, its {@code instead} (which
     * must fit by (a) to (e) on its own; (d) only outside a bundle), or a misfit {code, message}.
     */
    static Object fitCpu(Wire.Entry entry, AppFacts facts, boolean memory) {
        List<String> avoided = avoided(entry, facts);
        if (avoided.isEmpty()) return entry;
        String message = "(" + entry.variant + ") must not run on a CPU with " + join(avoided);
        Wire.Entry instead = entry.instead;
        if (instead == null) return new String[] {Reasons.CPU_UNSUPPORTED, message + ", and the release names no variant instead"};
        String[] misfit = unfitEntry(instead, facts, memory);
        if (misfit == null && !avoided(instead, facts).isEmpty()) {
            misfit = new String[] {Reasons.CPU_UNSUPPORTED, "(" + instead.variant + ") must not run on a CPU with " + join(avoided(instead, facts))};
        }
        // Whatever the instead breaks, the entry's reason is the CPU (docs/protocol.md section 7, (e)).
        if (misfit != null) return new String[] {Reasons.CPU_UNSUPPORTED, message + ", and its instead " + misfit[1]};
        return instead;
    }

    /** Rule (f) on what (e) chose (an entry, or a misfit passed through). */
    static Object fitApi(Object chosen, AppFacts facts) {
        if (!(chosen instanceof Wire.Entry) || facts.mnnApis == null || facts.mnnApis.contains("module")) return chosen;
        Wire.Entry entry = (Wire.Entry) chosen;
        if (entry.contract == null || !"module".equals(entry.contract.get("mnn_api"))) return chosen;
        return new String[] {Reasons.API_UNSUPPORTED, "(" + entry.variant + ") needs MNN's Module API (its graph has control-flow subgraphs); the app's model runner calls "
                + (facts.mnnApis.isEmpty() ? "no MNN API" : join(new ArrayList<String>(facts.mnnApis)))};
    }

    private static String join(List<String> names) {
        StringBuilder b = new StringBuilder();
        for (String n : names) b.append(b.length() == 0 ? "" : ", ").append(n);
        return b.toString();
    }

    /** Rules (a) to (c), and (d) when {@code memory} (a bundle checks its members' sum instead). */
    static String[] unfitEntry(Wire.Entry entry, AppFacts facts, boolean memory) {
        if (facts.mnnRuntime != null && !Versions.isVersion(facts.mnnRuntime)) {
            return new String[] {Reasons.RUNTIME_TOO_OLD, "(" + entry.variant + ") needs MNN " + entry.minMnnRuntime + ", the app says '" + facts.mnnRuntime + "', which is not a version"};
        }
        if (facts.mnnRuntime != null && Versions.compareDotted(entry.minMnnRuntime, facts.mnnRuntime) > 0) {
            return new String[] {Reasons.RUNTIME_TOO_OLD, "(" + entry.variant + ") needs MNN " + entry.minMnnRuntime + ", the app has " + facts.mnnRuntime};
        }
        String[] found = unmet(entry.requires, facts);
        if (found != null || !memory) return found;
        if (facts.memoryBudgetMb != null && entry.peakMemoryMb != null && entry.peakMemoryMb > facts.memoryBudgetMb) {
            return new String[] {Reasons.INSUFFICIENT_MEMORY, "(" + entry.variant + ") needs " + mb(entry.peakMemoryMb)
                    + " MiB at its peak, the device's budget is " + mb(facts.memoryBudgetMb) + " MiB"};
        }
        return null;
    }

    static String[] unmet(Wire.Requirements r, AppFacts facts) {
        if (r == null) return null;
        if (r.app != null) {
            String missed = misses(r.app, facts.appVersion, "app", "the app");
            if (missed != null) return new String[] {Reasons.APP_INCOMPATIBLE, missed};
        }
        String[][] oses = {{"android", r.android, "Android API"}, {"ios", r.ios, "iOS"}};
        for (String[] os : oses) {
            if (os[1] == null || !os[0].equals(facts.os)) continue;
            String missed = misses(os[1], facts.osVersion, os[2], "the device");
            if (missed != null) return new String[] {Reasons.OS_INCOMPATIBLE, missed};
        }
        return null;
    }

    /** Why a version misses a range (a range or version that does not parse misses it), or null. */
    static String misses(String wanted, String version, String label, String who) {
        if (Versions.parseRange(wanted) == null) return "needs " + label + " '" + wanted + "', which is not a version range this client reads";
        if (version == null) return "needs " + label + " " + wanted + ", " + who + " did not say its version";
        if (!Versions.isVersion(version)) return "needs " + label + " " + wanted + ", " + who + " says '" + version + "', which is not a version";
        if (!Versions.satisfies(version, wanted)) return "needs " + label + " " + wanted + ", " + who + " has " + version;
        return null;
    }

    /** Rules 13 and 14, chunk by chunk. */
    public static final class BlobCheck {
        public final Wire.BlobRef blob;
        private long received;
        private java.security.MessageDigest hash = Codec.sha256();

        public BlobCheck(Wire.BlobRef blob) {
            this.blob = blob;
        }

        public long received() { return received; }

        public long remaining() { return blob.size - received; }

        public void reset() {
            received = 0;
            hash = Codec.sha256();
        }

        public void expect(Long contentLength) throws Rejected {
            if (contentLength != null && contentLength > remaining()) {
                throw new Rejected(Reasons.BLOB_TOO_LARGE, "the server announces " + (received + contentLength) + " bytes for blob "
                        + blob.sha256.substring(0, 12) + ", the manifest declares " + blob.size);
            }
            // A complete answer of another length is another file: asking again brings it again.
            if (contentLength != null && contentLength < remaining()) {
                throw new Rejected(Reasons.BAD_BLOB, "the server announces " + (received + contentLength) + " bytes for blob "
                        + blob.sha256.substring(0, 12) + ", the manifest declares " + blob.size + "; refused before reading");
            }
        }

        /**
         * The body ended before the blob's size. With a Content-Length (which {@link #expect} held
         * to exactly what remained) the connection was cut: transport, the .part resumes later.
         * Without one nothing says more was coming: the blob is short (rule 14).
         */
        public Rejected endedEarly(Long contentLength, String where) {
            if (contentLength != null) {
                return new Rejected(Reasons.TRANSPORT, where + ": connection closed after " + received + " of " + blob.size
                        + " bytes; the next update resumes");
            }
            return new Rejected(Reasons.BAD_BLOB, where + ": the body ended after " + received + " of " + blob.size
                    + " bytes without a Content-Length; blob " + blob.sha256.substring(0, 12) + " is short");
        }

        public void update(byte[] chunk, int off, int len) throws Rejected {
            count(len);
            hash.update(chunk, off, len);
        }

        /** The size rules of {@link #update} alone, for bytes a {@link HashPipe} hashes into {@link #digest}. */
        public void count(int len) throws Rejected {
            if (len > remaining()) {
                throw new Rejected(Reasons.BLOB_TOO_LARGE, "blob " + blob.sha256.substring(0, 12) + " is larger than the " + blob.size
                        + " bytes the manifest declares; stopped reading");
            }
            received += len;
        }

        /** The running digest (a resumed part's bytes already in it), for a {@link HashPipe}. */
        public java.security.MessageDigest digest() { return hash; }

        public void finish() throws Rejected {
            if (received != blob.size) {
                throw new Rejected(Reasons.BAD_BLOB, "blob " + blob.sha256.substring(0, 12) + " is " + received + " bytes, the manifest declares " + blob.size);
            }
            String digest = Codec.hex(hash.digest());
            if (!digest.equals(blob.sha256)) {
                throw new Rejected(Reasons.BAD_BLOB, "blob has sha256 " + digest.substring(0, 12) + "..., the manifest declares " + blob.sha256.substring(0, 12) + "...");
            }
        }
    }

}
