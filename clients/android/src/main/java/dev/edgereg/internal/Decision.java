package dev.edgereg.internal;


import java.util.Map;

/**
 * The client's decision (docs/protocol.md section 7, rules 1 to 12): pure, the clock passed in.
 */
public final class Decision {
    public static final int MAX_MANIFEST_BYTES = 64 * 1024;

    public final Wire.Manifest manifest;
    /** What the device should run, or null (a first release still a canary outside the cohort, a withdrawn model). */
    public final Wire.Unit unit;
    public final boolean isCandidate;
    public final long sequence;
    /** Why the candidate was passed over for stable (a rule-12 code or bad-release), or null. */
    public final String fallback;

    public Decision(Wire.Manifest manifest, Wire.Unit unit, boolean isCandidate, long sequence, String fallback) {
        this.manifest = manifest;
        this.unit = unit;
        this.isCandidate = isCandidate;
        this.sequence = sequence;
        this.fallback = fallback;
    }

    /** What the app says about itself for the fit rule; null fields: not said. */
    public static final class AppFacts {
        public final String mnnRuntime;
        public final String appVersion;
        public final String os;
        public final String osVersion;

        public AppFacts(String mnnRuntime, String appVersion, String os, String osVersion) {
            this.mnnRuntime = mnnRuntime;
            this.appVersion = appVersion;
            this.os = os;
            this.osVersion = osVersion;
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
        if (chosen == null) return new Decision(m, null, false, sequence, null);
        String[] misfit = unfit(chosen, facts);
        if (misfit == null) return new Decision(m, chosen, isCandidate, sequence, null);
        Wire.Unit stable = m.stableUnit;
        String[] stableMisfit = isCandidate && stable != null ? unfit(stable, facts) : null;
        if (isCandidate && stable != null && stableMisfit == null) return new Decision(m, stable, false, sequence, misfit[0]);
        String message = (isCandidate ? "candidate " : "stable ") + chosen.version + " " + misfit[1];
        if (stableMisfit != null) message += "; stable " + stable.version + " " + stableMisfit[1];
        throw new Rejected(misfit[0], message);
    }

    /** Why a unit does not fit (code, message), or null when it fits. */
    public static String[] unfit(Wire.Unit unit, AppFacts facts) {
        if (unit.bundle) {
            String[] own = unmet(unit.requires, facts);
            if (own != null) return own;
            for (Map.Entry<String, Wire.Entry> e : unit.members.entrySet()) { // sorted by name
                String[] member = unfitEntry(e.getValue(), facts);
                if (member != null) return new String[] {member[0], "(member " + e.getKey() + ") " + member[1]};
            }
            return null;
        }
        return unfitEntry(unit.single(), facts);
    }

    static String[] unfitEntry(Wire.Entry entry, AppFacts facts) {
        if (facts.mnnRuntime != null && !Versions.isVersion(facts.mnnRuntime)) {
            return new String[] {Reasons.RUNTIME_TOO_OLD, "(" + entry.variant + ") needs MNN " + entry.minMnnRuntime + ", the app says '" + facts.mnnRuntime + "', which is not a version"};
        }
        if (facts.mnnRuntime != null && Versions.compareDotted(entry.minMnnRuntime, facts.mnnRuntime) > 0) {
            return new String[] {Reasons.RUNTIME_TOO_OLD, "(" + entry.variant + ") needs MNN " + entry.minMnnRuntime + ", the app has " + facts.mnnRuntime};
        }
        return unmet(entry.requires, facts);
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
        }

        public void update(byte[] chunk, int off, int len) throws Rejected {
            if (len > remaining()) {
                throw new Rejected(Reasons.BLOB_TOO_LARGE, "blob " + blob.sha256.substring(0, 12) + " is larger than the " + blob.size
                        + " bytes the manifest declares; stopped reading");
            }
            received += len;
            hash.update(chunk, off, len);
        }

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
