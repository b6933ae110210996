package dev.edgereg.internal;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Pattern;

/**
 * The manifest (docs/protocol.md section 3), read strictly: known keys with exact JSON types,
 * unknown keys ignored (after the signature verified), integers without fraction or exponent
 * within their bounds and 2^53 - 1.
 */
public final class Wire {
    private Wire() {}

    public static final long MAX_SAFE_INTEGER = 9007199254740991L;
    public static final String PAYLOAD_TYPE_MANIFEST = "application/vnd.edgereg.manifest+json";

    static final Pattern NAME = Pattern.compile("[a-z][a-z0-9_-]{0,62}");
    static final Pattern SHA256 = Pattern.compile("[0-9a-f]{64}");
    static final Pattern SALT = Pattern.compile("[0-9a-f]{8,64}");
    static final Pattern BLOB_PATH = Pattern.compile("blobs/sha256/[0-9a-f]{64}");
    /** Printable ASCII but the space after the scheme: the same in every regex engine (docs/protocol.md section 3, "Patterns"). */
    static final Pattern REPORT_URL = Pattern.compile("(https?://[!-~]+|[A-Za-z0-9][A-Za-z0-9._/-]*)");
    static final Pattern TASK_KIND = Pattern.compile("[a-z][a-z0-9_]{0,62}");
    static final Pattern DIM_NAME = Pattern.compile("[A-Za-z_][A-Za-z0-9_]{0,63}");
    /** A CPU feature name (docs/protocol.md section 3): a pattern, not a list, so a feature named later never breaks a client. */
    public static final Pattern CPU_FEATURE = Pattern.compile("[a-z0-9][a-z0-9_-]{0,31}");
    /** The largest memory figure a document carries, MiB (1 TiB). */
    public static final double MAX_MEMORY_MB = 1048576;
    static final Pattern TRIAL_ID = Pattern.compile("[0-9a-f]{8}");
    static final Pattern CPU_CLASS = Pattern.compile("[a-z0-9][a-z0-9._-]{0,31}");
    static final Pattern SOC = Pattern.compile("[!-~]([ -~]{0,62}[!-~])?");
    static final int MAX_TRIAL_SETTINGS = 8;
    static final int MAX_HINT_RULES = 32;
    static final List<String> BACKENDS = Arrays.asList("cpu", "opencl", "vulkan", "metal", "opengl", "coreml", "nnapi");
    static final List<String> DTYPES = Arrays.asList("float32", "float16", "int8", "uint8", "int32", "int64", "bool");
    /** App metrics a unit's entry may declare at most (docs/protocol.md section 3, "App metrics"). */
    public static final int MAX_METRICS = 16;
    /** Bucket edges of a distribution at most (so at most 32 buckets). */
    public static final int MAX_METRIC_EDGES = 31;

    /** A blob by digest: an artifact, a golden probe, a labels blob. */
    public static final class BlobRef {
        public final String path;
        public final String sha256;
        public final long size;

        public BlobRef(String sha256, long size) {
            this.path = "blobs/sha256/" + sha256;
            this.sha256 = sha256;
            this.size = size;
        }
    }

    /** requires: app and OS version ranges (null: any). */
    public static final class Requirements {
        public final String app;
        public final String android;
        public final String ios;

        Requirements(String app, String android, String ios) {
            this.app = app;
            this.android = android;
            this.ios = ios;
        }

        public Map<String, Object> toJson() {
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            if (app != null) m.put("app", app);
            if (android != null) m.put("android", android);
            if (ios != null) m.put("ios", ios);
            return m;
        }
    }

    /**
     * An app metric a release declares (docs/protocol.md section 3, "App metrics"): a {@code rate}
     * (events and successes) or a {@code distribution} (counts in fixed buckets).
     */
    public static final class Metric {
        public static final String RATE = "rate";
        public static final String DISTRIBUTION = "distribution";
        public final String kind;
        /** A distribution's bucket edges, finite and strictly increasing; empty for a rate. */
        private final double[] buckets;

        public Metric(String kind, double[] buckets) {
            this.kind = kind;
            this.buckets = buckets.clone();
        }

        public double[] buckets() { return buckets.clone(); }

        /** The declaration as the wire says it: {@code {"kind"}} and a distribution's {@code buckets}. */
        public Map<String, Object> toJson() {
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            m.put("kind", kind);
            if (kind.equals(DISTRIBUTION)) {
                List<Object> edges = new ArrayList<Object>();
                for (double e : buckets) edges.add(e);
                m.put("buckets", edges);
            }
            return m;
        }

        /** Declarations as the wire says them, by name (sorted), or null for none. */
        public static Map<String, Object> toJson(Map<String, Metric> metrics) {
            if (metrics == null) return null;
            Map<String, Object> m = new TreeMap<String, Object>();
            for (Map.Entry<String, Metric> e : metrics.entrySet()) m.put(e.getKey(), e.getValue().toJson());
            return m;
        }
    }

    /** A model's entry. */
    public static final class Entry {
        public final String version;
        public final String variant;
        public final BlobRef blob;
        public final String minMnnRuntime;
        public final int threads;
        public final List<String> backends;
        public final String precision;
        /** The contract as read (known keys only), or null. */
        public final Map<String, Object> contract;
        /** Inline labels of the contract, or null. */
        public final List<String> labels;
        public final BlobRef labelsBlob;
        public final Requirements requires;
        public final BlobRef probe;
        /** The probe's tensors too large to inline (docs/protocol.md section 11), or null. */
        public final BlobRef probeData;
        /** Measured peak memory in MiB (fit rule (d)), or null: not measured. */
        public final Double peakMemoryMb;
        /** CPU features this variant must not run on (fit rule (e)), or null. */
        public final List<String> avoidCpu;
        /** What a device with an avoided feature installs in its place (same version), or null. */
        public final Entry instead;
        /** The app metrics this entry declares itself (a model's entry only), or null. */
        public final Map<String, Metric> metrics;
        /** The try-set (section 3, "Runtime trials and hints"), or null: nothing to try. */
        public final Trials trials;
        /** The hint rules in order (section 11, "Runtime hints"), or null: every device uses the declared runtime. */
        public final List<HintRule> hints;
        /** The entry as read (known keys only): what the client stores. */
        public final Map<String, Object> json;

        Entry(String version, String variant, BlobRef blob, String minMnnRuntime, int threads, List<String> backends,
                String precision, Map<String, Object> contract, List<String> labels, BlobRef labelsBlob,
                Requirements requires, BlobRef probe, BlobRef probeData, Double peakMemoryMb, List<String> avoidCpu,
                Entry instead, Map<String, Metric> metrics, Trials trials, List<HintRule> hints, Map<String, Object> json) {
            this.version = version;
            this.variant = variant;
            this.blob = blob;
            this.minMnnRuntime = minMnnRuntime;
            this.threads = threads;
            this.backends = backends;
            this.precision = precision;
            this.contract = contract;
            this.labels = labels;
            this.labelsBlob = labelsBlob;
            this.requires = requires;
            this.probe = probe;
            this.probeData = probeData;
            this.peakMemoryMb = peakMemoryMb;
            this.avoidCpu = avoidCpu;
            this.instead = instead;
            this.metrics = metrics;
            this.trials = trials;
            this.hints = hints;
            this.json = json;
        }

        /** Every blob this entry ships: the artifact, its probe (and its data), its labels. */
        public List<BlobRef> blobs() {
            List<BlobRef> out = new ArrayList<BlobRef>();
            out.add(blob);
            if (probe != null) out.add(probe);
            if (probeData != null) out.add(probeData);
            if (labelsBlob != null) out.add(labelsBlob);
            return out;
        }
    }

    /** One setting of a try-set: a thread count on one backend. */
    public static final class Setting {
        public final int threads;
        public final String backend;

        Setting(int threads, String backend) {
            this.threads = threads;
            this.backend = backend;
        }
    }

    /** An entry's {@code runtime_trials} as read: the settings a device may time the probe under. */
    public static final class Trials {
        public final String id;
        public final List<Setting> settings;
        public final int maxRunsPerSetting;
        public final int maxTotalMs;

        Trials(String id, List<Setting> settings, int maxRunsPerSetting, int maxTotalMs) {
            this.id = id;
            this.settings = settings;
            this.maxRunsPerSetting = maxRunsPerSetting;
            this.maxTotalMs = maxTotalMs;
        }

        /** As the wire says it, defaults filled in and unknown keys dropped. */
        public Map<String, Object> toJson() {
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            m.put("id", id);
            List<Object> list = new ArrayList<Object>();
            for (Setting st : settings) {
                Map<String, Object> o = new LinkedHashMap<String, Object>();
                o.put("threads", (long) st.threads);
                o.put("backend", st.backend);
                list.add(o);
            }
            m.put("settings", list);
            m.put("max_runs_per_setting", (long) maxRunsPerSetting);
            m.put("max_total_ms", (long) maxTotalMs);
            return m;
        }
    }

    /** One rule of an entry's {@code runtime_hints} (section 3; how it applies: section 11). */
    public static final class HintRule {
        /** The match's known keys, each null when the rule does not name it. */
        public final String cpuClass;
        public final Long cores;
        public final String soc;
        /** Keys of the match this client does not know: the rule never matches when there is one. */
        public final List<String> unknownKeys;
        public final int threads;
        public final List<String> backends;
        /** The percent as written, and as basis points (1 to 10000) for the cohort. */
        public final Object percent;
        public final int basisPoints;
        public final String salt;

        HintRule(String cpuClass, Long cores, String soc, List<String> unknownKeys, int threads, List<String> backends, Object percent,
                int basisPoints, String salt) {
            this.cpuClass = cpuClass;
            this.cores = cores;
            this.soc = soc;
            this.unknownKeys = unknownKeys;
            this.threads = threads;
            this.backends = backends;
            this.percent = percent;
            this.basisPoints = basisPoints;
            this.salt = salt;
        }

        /** Whether every key the rule names equals the device's own (null: the device does not know it). */
        public boolean matches(String deviceCpuClass, Integer deviceCores, String deviceSoc) {
            if (!unknownKeys.isEmpty()) return false;
            if (cpuClass != null && !cpuClass.equals(deviceCpuClass)) return false;
            if (cores != null && (deviceCores == null || cores.longValue() != deviceCores.longValue())) return false;
            return soc == null || soc.equals(deviceSoc);
        }
    }

    /** A stable or candidate: one model's entry, or a bundle's (every member). */
    public static final class Unit {
        public final String version;
        /** Member name to entry; a model's unit has one member named after the model. */
        public final Map<String, Entry> members;
        public final boolean bundle;
        public final Requirements requires;
        /**
         * The app metrics the release declares (a model's entry's, or the bundle entry's), or
         * null: what the device counts while it runs this unit, its {@code instead} included.
         */
        public final Map<String, Metric> metrics;

        Unit(String version, Map<String, Entry> members, boolean bundle, Requirements requires, Map<String, Metric> metrics) {
            this.version = version;
            this.members = members;
            this.bundle = bundle;
            this.requires = requires;
            this.metrics = metrics;
        }

        public Entry single() {
            return members.values().iterator().next();
        }
    }

    public static final class Manifest {
        public final String model;
        public final String tier;
        public final long sequence;
        public final long expires;
        public final String expiresText;
        public final Unit stableUnit;
        public final Unit candidateUnit;
        public final Double percent;
        public final int basisPoints;
        public final String salt;
        public final boolean paused;
        public final String reportUrl;

        Manifest(String model, String tier, long sequence, long expires, String expiresText, Unit stable, Unit candidate,
                Double percent, int basisPoints, String salt, boolean paused, String reportUrl) {
            this.model = model;
            this.tier = tier;
            this.sequence = sequence;
            this.expires = expires;
            this.expiresText = expiresText;
            this.stableUnit = stable;
            this.candidateUnit = candidate;
            this.percent = percent;
            this.basisPoints = basisPoints;
            this.salt = salt;
            this.paused = paused;
            this.reportUrl = reportUrl;
        }

        public boolean isBundle() {
            Unit u = stableUnit != null ? stableUnit : candidateUnit;
            return u != null && u.bundle;
        }
    }

    // --- reading ---------------------------------------------------------------------

    static Rejected bad(String where, String what) {
        return new Rejected(Reasons.MALFORMED, "manifest is not valid: " + where + ": " + what);
    }

    /** Parse and validate a manifest payload. */
    public static Manifest manifest(byte[] payload) throws Rejected {
        Object parsed;
        try {
            parsed = Json.parse(payload);
        } catch (Json.JsonException e) {
            throw new Rejected(Reasons.MALFORMED, "manifest is not JSON: " + e.getMessage());
        }
        Map<String, Object> m = object(parsed, "(top level)");
        Object sv = m.get("schema_version");
        if (!(sv instanceof Json.Num && ((Json.Num) sv).integer && ((Json.Num) sv).bigInteger().equals(BigInteger.ONE))) {
            throw bad("schema_version", "is " + sv + ", this client reads schema version 1");
        }
        String model = name(required(m, "model", "model"), "model");
        String tier = name(required(m, "tier", "tier"), "tier");
        long sequence = integer(required(m, "sequence", "sequence"), "sequence", 1, MAX_SAFE_INTEGER);
        String expiresText = string(required(m, "expires", "expires"), "expires");
        Long expires = Codec.parseTime(expiresText);
        if (expires == null) throw bad("expires", "'" + expiresText + "' is not a time like 2025-01-31T12:00:00Z (RFC 3339, UTC, 'Z', whole seconds)");
        Unit stable = optionalUnit(m.get("stable"), "stable", model);
        Unit candidate = optionalUnit(m.get("candidate"), "candidate", model);
        Double percent = null;
        int points = 0;
        Object p = m.get("percent");
        if (p != null && p != Json.NULL) {
            points = basisPoints(p, "percent");
            percent = ((Json.Num) p).doubleValue();
        }
        String salt = null;
        Object s = m.get("salt");
        if (s != null && s != Json.NULL) salt = matching(s, SALT, "salt", "is not a salt: expected 8 to 64 lowercase hex characters");
        boolean paused = false;
        if (m.containsKey("paused")) paused = bool(m.get("paused"), "paused");
        String reportUrl = null;
        Object r = m.get("report_url");
        if (r != null && r != Json.NULL) {
            reportUrl = string(r, "report_url");
            if (reportUrl.codePointCount(0, reportUrl.length()) > 2048 || !REPORT_URL.matcher(reportUrl).matches()) {
                throw bad("report_url", "is not an http(s) URL or a relative path");
            }
        }
        if (candidate != null) {
            if (percent == null || salt == null) throw bad("(top level)", "a candidate needs percent and salt");
        } else {
            if (percent != null || salt != null) throw bad("(top level)", "percent and salt may only be set with a candidate");
            if (paused) throw bad("(top level)", "paused may only be true during a rollout (with a candidate)");
        }
        if (stable != null && candidate != null) {
            if (stable.bundle != candidate.bundle) throw bad("(top level)", "stable and candidate must both be bundle entries, or neither");
            if (Versions.compareSemver(candidate.version, stable.version) <= 0) {
                throw bad("(top level)", "candidate " + candidate.version + " must be a higher version than stable " + stable.version);
            }
        }
        return new Manifest(model, tier, sequence, expires, expiresText, stable, candidate, percent, points, salt, paused, reportUrl);
    }

    private static Unit optionalUnit(Object v, String where, String model) throws Rejected {
        if (v == null || v == Json.NULL) return null;
        if (v instanceof Map && ((Map<?, ?>) v).containsKey("members")) {
            Map<String, Object> m = object(v, where);
            String version = semver(required(m, "version", where + ".version"), where + ".version");
            Map<String, Object> members = object(required(m, "members", where + ".members"), where + ".members");
            if (members.isEmpty()) throw bad(where + ".members", "needs at least one member");
            Map<String, Entry> entries = new TreeMap<String, Entry>();
            for (Map.Entry<String, Object> e : members.entrySet()) {
                String key = e.getKey();
                if (!NAME.matcher(key).matches()) throw bad(where + ".members." + key, "is not a valid name");
                Entry member = entry(e.getValue(), where + ".members." + key);
                if (member.metrics != null) throw bad(where + ".members." + key + ".metrics", "a bundle's app metrics are declared on the bundle entry, not on a member");
                entries.put(key, member);
            }
            Requirements req = requirements(m.get("requires"), where + ".requires");
            return new Unit(version, Collections.unmodifiableMap(entries), true, req, metrics(m.get("metrics"), where + ".metrics"));
        }
        Entry entry = entry(v, where);
        Map<String, Entry> one = new LinkedHashMap<String, Entry>();
        one.put(model, entry);
        return new Unit(entry.version, one, false, entry.requires, entry.metrics);
    }

    static Entry entry(Object v, String where) throws Rejected {
        return entry(v, where, null);
    }

    /** @param outerVersion the version of the entry this one is the {@code instead} of, or null for a manifest's entry */
    static Entry entry(Object v, String where, String outerVersion) throws Rejected {
        Map<String, Object> m = object(v, where);
        Map<String, Object> json = new LinkedHashMap<String, Object>();
        String version = semver(required(m, "version", where + ".version"), where + ".version");
        String variant = name(required(m, "variant", where + ".variant"), where + ".variant");
        String path = matching(required(m, "path", where + ".path"), BLOB_PATH, where + ".path", "is not a blob path: expected blobs/sha256/<64 lowercase hex>");
        String sha = matching(required(m, "sha256", where + ".sha256"), SHA256, where + ".sha256", "is not a sha256: expected 64 lowercase hex characters");
        long size = integer(required(m, "size", where + ".size"), where + ".size", 1, MAX_SAFE_INTEGER);
        String minMnn = string(required(m, "min_mnn_runtime", where + ".min_mnn_runtime"), where + ".min_mnn_runtime");
        if (minMnn.length() > Versions.VERSION_MAX_LENGTH) {
            // The longest version any client compares (docs/protocol.md section 3): longer is malformed.
            throw bad(where + ".min_mnn_runtime", "is longer than " + Versions.VERSION_MAX_LENGTH + " characters");
        }
        if (!Versions.isDotted(minMnn)) throw bad(where + ".min_mnn_runtime", "'" + minMnn + "' is not a version like 3.6.1");
        Map<String, Object> runtime = object(required(m, "runtime", where + ".runtime"), where + ".runtime");
        int threads = 4;
        if (runtime.containsKey("threads")) threads = (int) integer(runtime.get("threads"), where + ".runtime.threads", 1, 16);
        List<String> backends = Collections.singletonList("cpu");
        if (runtime.containsKey("backends")) backends = backends(runtime.get("backends"), where + ".runtime.backends");
        String precision = "normal";
        if (runtime.containsKey("precision")) {
            precision = string(runtime.get("precision"), where + ".runtime.precision");
            if (!Arrays.asList("low", "normal", "high").contains(precision)) throw bad(where + ".runtime.precision", "must be low, normal or high");
        }
        if (!path.equals("blobs/sha256/" + sha)) throw bad(where, "path is '" + path + "', expected 'blobs/sha256/" + sha + "'");
        Map<String, Object> contract = null;
        List<String> labels = null;
        BlobRef labelsBlob = null;
        Object c = m.get("contract");
        if (c != null && c != Json.NULL) {
            contract = contract(c, where + ".contract");
            Object l = contract.get("labels");
            if (l != null && l != Json.NULL) {
                labels = new ArrayList<String>();
                for (Object x : (List<?>) l) labels.add((String) x);
            }
            Object lb = contract.get("labels_blob");
            if (lb != null && lb != Json.NULL) labelsBlob = blobRef(lb, where + ".contract.labels_blob");
        }
        Requirements req = requirements(m.get("requires"), where + ".requires");
        BlobRef probe = null;
        Object pr = m.get("probe");
        if (pr != null && pr != Json.NULL) probe = blobRef(pr, where + ".probe");
        BlobRef probeData = null;
        Object pd = m.get("probe_data");
        if (pd != null && pd != Json.NULL) {
            probeData = blobRef(pd, where + ".probe_data");
            if (probe == null) throw bad(where + ".probe_data", "probe_data needs probe");
        }
        Double peak = null;
        Object pk = m.get("peak_memory_mb");
        if (pk != null && pk != Json.NULL) {
            if (!(pk instanceof Json.Num)) throw bad(where + ".peak_memory_mb", "must be a number");
            double d = ((Json.Num) pk).doubleValue();
            if (!(d > 0 && d <= MAX_MEMORY_MB)) throw bad(where + ".peak_memory_mb", pk + " is outside 0 (excluded) to " + (long) MAX_MEMORY_MB + " MiB");
            peak = d;
        }
        List<String> avoid = null;
        Object ac = m.get("avoid_cpu");
        if (ac != null && ac != Json.NULL) {
            List<Object> list = array(ac, where + ".avoid_cpu");
            if (list.isEmpty() || list.size() > 8) throw bad(where + ".avoid_cpu", "names 1 to 8 CPU features, got " + list.size());
            List<String> names = new ArrayList<String>();
            for (Object f : list) {
                String name = matching(f, CPU_FEATURE, where + ".avoid_cpu",
                        "is not a CPU feature name: a lowercase letter or digit, then up to 31 lowercase letters, digits, '_' or '-'");
                if (names.contains(name)) throw bad(where + ".avoid_cpu", "names '" + name + "' twice");
                names.add(name);
            }
            avoid = Collections.unmodifiableList(names);
        }
        Entry instead = null;
        Object in = m.get("instead");
        if (in != null && in != Json.NULL) {
            // One level only: a substitute names no substitute of its own.
            if (outerVersion != null) throw bad(where + ".instead", "an instead may not have an instead of its own (one level only)");
            instead = entry(in, where + ".instead", version);
        }
        if (outerVersion != null && !outerVersion.equals(version)) {
            throw bad(where + ".version", "instead is version " + version + ", the entry " + outerVersion + ": a substitute is another variant of the same release");
        }
        Map<String, Metric> metrics = metrics(m.get("metrics"), where + ".metrics");
        // The outer entry's metrics apply to its substitute, which declares none of its own.
        if (metrics != null && outerVersion != null) throw bad(where + ".metrics", "an instead declares no app metrics (its entry's apply)");
        for (String k : new String[] {"version", "variant", "path", "sha256", "size", "min_mnn_runtime", "runtime", "contract", "requires", "probe", "probe_data"}) {
            if (m.containsKey(k)) json.put(k, m.get(k));
        }
        Map<String, Object> rt = new LinkedHashMap<String, Object>();
        rt.put("threads", (long) threads);
        rt.put("backends", new ArrayList<Object>(backends));
        rt.put("precision", precision);
        json.put("runtime", rt);
        if (contract != null) json.put("contract", contract);
        Trials trials = trials(m.get("runtime_trials"), where + ".runtime_trials");
        List<HintRule> hints = hints(m.get("runtime_hints"), where + ".runtime_hints");
        return new Entry(version, variant, new BlobRef(sha, size), minMnn, threads, backends, precision, contract, labels, labelsBlob, req, probe,
                probeData, peak, avoid, instead, metrics, trials, hints, json);
    }

    /** A backend order: known names, each once, ending with {@code cpu} (section 3). */
    static List<String> backends(Object v, String where) throws Rejected {
        List<Object> list = array(v, where);
        if (list.isEmpty()) throw bad(where, "needs at least one backend");
        List<String> names = new ArrayList<String>();
        for (Object b : list) {
            String name = string(b, where);
            if (!BACKENDS.contains(name)) throw bad(where, "'" + name + "' is not a backend");
            names.add(name);
        }
        if (!names.get(names.size() - 1).equals("cpu")) throw bad(where, "the backend list must end with \"cpu\"");
        if (new HashSet<String>(names).size() != names.size()) throw bad(where, "each backend may appear once");
        return Collections.unmodifiableList(names);
    }

    /**
     * An entry's {@code runtime_trials} (section 3, "Runtime trials and hints"), or null when
     * absent or null: the id as written (never recomputed), 1 to 8 distinct settings, the bounds
     * with their defaults filled in; unknown keys dropped.
     */
    static Trials trials(Object v, String where) throws Rejected {
        if (v == null || v == Json.NULL) return null;
        Map<String, Object> m = object(v, where);
        String id = matching(required(m, "id", where + ".id"), TRIAL_ID, where + ".id", "is not a try-set id: expected 8 lowercase hex characters");
        List<Object> list = array(required(m, "settings", where + ".settings"), where + ".settings");
        if (list.isEmpty() || list.size() > MAX_TRIAL_SETTINGS) {
            throw bad(where + ".settings", "holds 1 to " + MAX_TRIAL_SETTINGS + " settings, got " + list.size());
        }
        List<Setting> settings = new ArrayList<Setting>();
        Set<String> seen = new HashSet<String>();
        for (int i = 0; i < list.size(); i++) {
            String w = where + ".settings[" + i + "]";
            Map<String, Object> o = object(list.get(i), w);
            int threads = (int) integer(required(o, "threads", w + ".threads"), w + ".threads", 1, 16);
            String backend = string(required(o, "backend", w + ".backend"), w + ".backend");
            if (!BACKENDS.contains(backend)) throw bad(w + ".backend", "'" + backend + "' is not a backend");
            if (!seen.add(threads + " " + backend)) throw bad(w, threads + " threads on " + backend + " is offered twice");
            settings.add(new Setting(threads, backend));
        }
        int runs = 5;
        Object r = m.get("max_runs_per_setting");
        if (r != null && r != Json.NULL) runs = (int) integer(r, where + ".max_runs_per_setting", 1, 20);
        int total = 2000;
        Object t = m.get("max_total_ms");
        if (t != null && t != Json.NULL) total = (int) integer(t, where + ".max_total_ms", 1, 10000);
        return new Trials(id, Collections.unmodifiableList(settings), runs, total);
    }

    /**
     * An entry's {@code runtime_hints} (section 3), or null when absent or null: 1 to 32 rules.
     * A match keeps the keys it does not know (such a rule never matches, section 11).
     */
    static List<HintRule> hints(Object v, String where) throws Rejected {
        if (v == null || v == Json.NULL) return null;
        List<Object> list = array(v, where);
        if (list.isEmpty() || list.size() > MAX_HINT_RULES) throw bad(where, "holds 1 to " + MAX_HINT_RULES + " rules, got " + list.size());
        List<HintRule> rules = new ArrayList<HintRule>();
        for (int i = 0; i < list.size(); i++) {
            String w = where + "[" + i + "]";
            Map<String, Object> o = object(list.get(i), w);
            Map<String, Object> match = object(required(o, "match", w + ".match"), w + ".match");
            String cpuClass = null;
            Long cores = null;
            String soc = null;
            List<String> unknown = new ArrayList<String>();
            for (Map.Entry<String, Object> k : match.entrySet()) {
                Object x = k.getValue();
                String key = k.getKey();
                if (key.equals("cpu_class")) {
                    if (x != Json.NULL) cpuClass = matching(x, CPU_CLASS, w + ".match.cpu_class", "is not a CPU class: a lowercase letter or digit, then up to 31 lowercase letters, digits, '.', '_' or '-'");
                } else if (key.equals("cores")) {
                    if (x != Json.NULL) cores = integer(x, w + ".match.cores", 1, 1024);
                } else if (key.equals("soc")) {
                    if (x != Json.NULL) soc = matching(x, SOC, w + ".match.soc", "is not an SoC family: 1 to 64 printable ASCII characters, spaces only inside");
                } else {
                    unknown.add(key); // as the reference: named, even null, a key this client does not know
                }
            }
            Map<String, Object> rt = object(required(o, "runtime", w + ".runtime"), w + ".runtime");
            int threads = (int) integer(required(rt, "threads", w + ".runtime.threads"), w + ".runtime.threads", 1, 16);
            List<String> backends = backends(required(rt, "backends", w + ".runtime.backends"), w + ".runtime.backends");
            Object percent = required(o, "percent", w + ".percent");
            int points = basisPoints(percent, w + ".percent");
            String salt = matching(required(o, "salt", w + ".salt"), SALT, w + ".salt", "is not a salt: expected 8 to 64 lowercase hex characters");
            rules.add(new HintRule(cpuClass, cores, soc, Collections.unmodifiableList(unknown), threads, backends, percent, points, salt));
        }
        return Collections.unmodifiableList(rules);
    }

    /**
     * A unit's app metric declarations (docs/protocol.md section 3, "App metrics"): 1 to 16 names,
     * each a {@code rate} or a {@code distribution} of 1 to 31 finite, strictly increasing bucket
     * edges; an unknown key of a declaration is ignored. Null when absent (or null).
     */
    static Map<String, Metric> metrics(Object v, String where) throws Rejected {
        if (v == null || v == Json.NULL) return null;
        Map<String, Object> m = object(v, where);
        if (m.isEmpty() || m.size() > MAX_METRICS) throw bad(where, "declares 1 to " + MAX_METRICS + " metrics, got " + m.size());
        Map<String, Metric> out = new TreeMap<String, Metric>();
        for (Map.Entry<String, Object> e : m.entrySet()) {
            String w = where + "." + e.getKey();
            if (!NAME.matcher(e.getKey()).matches()) throw bad(w, "is not a metric name: a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'");
            Map<String, Object> d = object(e.getValue(), w);
            String kind = string(required(d, "kind", w + ".kind"), w + ".kind");
            if (kind.equals(Metric.RATE)) {
                out.put(e.getKey(), new Metric(kind, new double[0]));
                continue;
            }
            if (!kind.equals(Metric.DISTRIBUTION)) throw bad(w + ".kind", "'" + kind + "' is not a metric kind: rate or distribution");
            List<Object> edges = array(required(d, "buckets", w + ".buckets"), w + ".buckets");
            if (edges.isEmpty() || edges.size() > MAX_METRIC_EDGES) {
                throw bad(w + ".buckets", "has " + edges.size() + " edges, expected 1 to " + MAX_METRIC_EDGES);
            }
            double[] buckets = new double[edges.size()];
            for (int i = 0; i < buckets.length; i++) {
                Object x = edges.get(i);
                if (!(x instanceof Json.Num)) throw bad(w + ".buckets", "holds " + x + ", expected numbers");
                buckets[i] = ((Json.Num) x).doubleValue();
                if (Double.isNaN(buckets[i]) || Double.isInfinite(buckets[i])) throw bad(w + ".buckets", x + " is not a finite number");
                if (i > 0 && !(buckets[i] > buckets[i - 1])) throw bad(w + ".buckets", "must increase strictly, got " + edges);
            }
            out.put(e.getKey(), new Metric(kind, buckets));
        }
        return Collections.unmodifiableMap(out);
    }

    static BlobRef blobRef(Object v, String where) throws Rejected {
        Map<String, Object> m = object(v, where);
        String path = matching(required(m, "path", where + ".path"), BLOB_PATH, where + ".path", "is not a blob path");
        String sha = matching(required(m, "sha256", where + ".sha256"), SHA256, where + ".sha256", "is not a sha256");
        long size = integer(required(m, "size", where + ".size"), where + ".size", 1, MAX_SAFE_INTEGER);
        if (!path.equals("blobs/sha256/" + sha)) throw bad(where, "path is '" + path + "', expected 'blobs/sha256/" + sha + "'");
        return new BlobRef(sha, size);
    }

    static Requirements requirements(Object v, String where) throws Rejected {
        if (v == null || v == Json.NULL) return null;
        Map<String, Object> m = object(v, where);
        String[] out = new String[3];
        String[] keys = {"app", "android", "ios"};
        for (int i = 0; i < 3; i++) {
            Object x = m.get(keys[i]);
            if (x == null || x == Json.NULL) continue;
            String range = string(x, where + "." + keys[i]);
            // Only the type here: the content is read at rule 12, where a range that does not
            // parse makes the entry not fit (docs/protocol.md section 7, "Version ranges").
            out[i] = range;
        }
        return new Requirements(out[0], out[1], out[2]);
    }

    /** The I/O contract (docs/protocol.md section 3.2), checked and reduced to its known keys. */
    static Map<String, Object> contract(Object v, String where) throws Rejected {
        Map<String, Object> m = object(v, where);
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        List<Object> inputs = array(required(m, "inputs", where + ".inputs"), where + ".inputs");
        if (inputs.isEmpty()) throw bad(where + ".inputs", "needs at least one input");
        Set<String> inputNames = new HashSet<String>();
        List<Object> ins = new ArrayList<Object>();
        for (int i = 0; i < inputs.size(); i++) {
            String w = where + ".inputs." + i;
            Map<String, Object> t = object(inputs.get(i), w);
            Map<String, Object> spec = tensorSpec(t, w);
            if (t.containsKey("batch_axis") && t.get("batch_axis") != Json.NULL) {
                strictInt(t.get("batch_axis"), w + ".batch_axis");
                spec.put("batch_axis", t.get("batch_axis"));
            }
            optionalEnum(t, spec, "kind", w, "tensor", "image");
            optionalEnum(t, spec, "layout", w, "NCHW", "NHWC");
            optionalEnum(t, spec, "color", w, "RGB", "BGR", "GRAY");
            for (String k : new String[] {"mean", "std"}) {
                Object x = t.get(k);
                if (x == null || x == Json.NULL) continue;
                for (Object n : array(x, w + "." + k)) {
                    if (!(n instanceof Json.Num)) throw bad(w + "." + k, "must be numbers");
                }
                spec.put(k, x);
            }
            inputNames.add((String) spec.get("name"));
            ins.add(spec);
        }
        out.put("inputs", ins);
        List<Object> outputs = array(required(m, "outputs", where + ".outputs"), where + ".outputs");
        if (outputs.isEmpty()) throw bad(where + ".outputs", "needs at least one output");
        Set<String> outputNames = new HashSet<String>();
        List<Object> outs = new ArrayList<Object>();
        for (int i = 0; i < outputs.size(); i++) {
            Map<String, Object> spec = tensorSpec(object(outputs.get(i), where + ".outputs." + i), where + ".outputs." + i);
            outputNames.add((String) spec.get("name"));
            outs.add(spec);
        }
        out.put("outputs", outs);
        List<Object> state = new ArrayList<Object>();
        if (m.containsKey("state")) {
            for (Object s : array(m.get("state"), where + ".state")) {
                Map<String, Object> link = object(s, where + ".state");
                String in = tensorName(required(link, "input", where + ".state.input"), where + ".state.input");
                String o = tensorName(required(link, "output", where + ".state.output"), where + ".state.output");
                if (!inputNames.contains(in) || !outputNames.contains(o)) throw bad(where, "state " + in + " <- " + o + " names a tensor the contract lacks");
                Map<String, Object> l = new LinkedHashMap<String, Object>();
                l.put("input", in);
                l.put("output", o);
                state.add(l);
            }
        }
        out.put("state", state);
        Map<String, Object> task = object(required(m, "task", where + ".task"), where + ".task");
        Map<String, Object> t = new LinkedHashMap<String, Object>();
        t.put("kind", matching(required(task, "kind", where + ".task.kind"), TASK_KIND, where + ".task.kind", "is not a task kind"));
        Object to = task.get("output");
        if (to != null && to != Json.NULL) {
            String name = tensorName(to, where + ".task.output");
            if (!outputNames.contains(name)) throw bad(where + ".task.output", "'" + name + "' is not an output");
            t.put("output", name);
        }
        Object th = task.get("threshold");
        if (th != null && th != Json.NULL) {
            if (!(th instanceof Json.Num)) throw bad(where + ".task.threshold", "must be a number");
            t.put("threshold", th);
        }
        Object bl = task.get("blank");
        if (bl != null && bl != Json.NULL) {
            strictInt(bl, where + ".task.blank");
            t.put("blank", bl);
        }
        out.put("task", t);
        Object labels = m.get("labels");
        boolean hasLabels = labels != null && labels != Json.NULL;
        if (hasLabels) {
            for (Object x : array(labels, where + ".labels")) string(x, where + ".labels");
            out.put("labels", labels);
        }
        Object lb = m.get("labels_blob");
        if (lb != null && lb != Json.NULL) {
            if (hasLabels) throw bad(where, "labels and labels_blob are exclusive");
            BlobRef ref = blobRef(lb, where + ".labels_blob");
            Map<String, Object> r = new LinkedHashMap<String, Object>();
            r.put("path", ref.path);
            r.put("sha256", ref.sha256);
            r.put("size", ref.size);
            out.put("labels_blob", r);
        }
        Object api = m.get("mnn_api");
        if (api != null && api != Json.NULL) {
            String name = string(api, where + ".mnn_api");
            if (!name.equals("session") && !name.equals("module")) throw bad(where + ".mnn_api", "'" + name + "' is not session or module");
            out.put("mnn_api", name);
        }
        return out;
    }

    private static Map<String, Object> tensorSpec(Map<String, Object> t, String w) throws Rejected {
        Map<String, Object> spec = new LinkedHashMap<String, Object>();
        spec.put("name", tensorName(required(t, "name", w + ".name"), w + ".name"));
        String dtype = string(required(t, "dtype", w + ".dtype"), w + ".dtype");
        if (!DTYPES.contains(dtype)) throw bad(w + ".dtype", "'" + dtype + "' is not a tensor type");
        spec.put("dtype", dtype);
        List<Object> shape = array(required(t, "shape", w + ".shape"), w + ".shape");
        for (Object d : shape) {
            if (d instanceof String) {
                if (!DIM_NAME.matcher((String) d).matches()) throw bad(w + ".shape", "'" + d + "' is not a dimension name");
            } else {
                if (!(d instanceof Json.Num) || !((Json.Num) d).integer || ((Json.Num) d).bigInteger().signum() < 0) {
                    throw bad(w + ".shape", "each size is an integer >= 0 or a dimension name");
                }
            }
        }
        spec.put("shape", shape);
        return spec;
    }

    private static void optionalEnum(Map<String, Object> t, Map<String, Object> spec, String key, String w, String... allowed) throws Rejected {
        Object x = t.get(key);
        if (x == null) return;
        if (x == Json.NULL) {
            if (key.equals("kind")) throw bad(w + "." + key, "must be one of " + Arrays.toString(allowed));
            return;
        }
        String s = string(x, w + "." + key);
        if (!Arrays.asList(allowed).contains(s)) throw bad(w + "." + key, "must be one of " + Arrays.toString(allowed));
        spec.put(key, s);
    }

    private static String tensorName(Object v, String where) throws Rejected {
        String s = string(v, where);
        int n = s.codePointCount(0, s.length());
        if (n < 1 || n > 256) throw bad(where, "a tensor name has 1 to 256 characters");
        return s;
    }

    /** A percent, 0 < percent <= 100 with at most two decimals, as basis points (1 to 10000). */
    static int basisPoints(Object p, String where) throws Rejected {
        if (!(p instanceof Json.Num)) throw bad(where, "must be a number");
        double d = ((Json.Num) p).doubleValue();
        if (Double.isNaN(d) || Double.isInfinite(d) || d < 0 || d > 100) throw bad(where, "must be between 0 and 100, got " + p);
        double scaled = d * 100;
        double rounded = Math.rint(scaled);
        if (Math.abs(scaled - rounded) > 1e-6) throw bad(where, p + " has more than two decimals");
        if (rounded == 0) throw bad(where, "must be greater than 0, got " + p);
        return (int) rounded;
    }

    // --- typed getters ------------------------------------------------------------------

    @SuppressWarnings("unchecked")
    public static Map<String, Object> object(Object v, String where) throws Rejected {
        if (!(v instanceof Map)) throw bad(where, "must be an object");
        return (Map<String, Object>) v;
    }

    @SuppressWarnings("unchecked")
    static List<Object> array(Object v, String where) throws Rejected {
        if (!(v instanceof List)) throw bad(where, "must be a list");
        return (List<Object>) v;
    }

    static Object required(Map<String, Object> m, String key, String where) throws Rejected {
        if (!m.containsKey(key)) throw bad(where, "missing");
        return m.get(key);
    }

    static String string(Object v, String where) throws Rejected {
        if (!(v instanceof String)) throw bad(where, "must be a string");
        return (String) v;
    }

    static boolean bool(Object v, String where) throws Rejected {
        if (!(v instanceof Boolean)) throw bad(where, "must be true or false");
        return (Boolean) v;
    }

    static void strictInt(Object v, String where) throws Rejected {
        if (!(v instanceof Json.Num) || !((Json.Num) v).integer) throw bad(where, "must be an integer (no fraction or exponent)");
    }

    static long integer(Object v, String where, long min, long max) throws Rejected {
        strictInt(v, where);
        BigInteger b = ((Json.Num) v).bigInteger();
        if (b.compareTo(BigInteger.valueOf(min)) < 0 || b.compareTo(BigInteger.valueOf(max)) > 0) {
            throw bad(where, b + " is outside " + min + " to " + max);
        }
        return b.longValue();
    }

    static String name(Object v, String where) throws Rejected {
        return matching(v, NAME, where, "is not a valid name: a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'");
    }

    static String semver(Object v, String where) throws Rejected {
        String s = string(v, where);
        if (!Versions.isSemver(s)) throw bad(where, "'" + s + "' is not a semantic version (MAJOR.MINOR.PATCH, e.g. 1.2.0)");
        return s;
    }

    static String matching(Object v, Pattern p, String where, String rule) throws Rejected {
        String s = string(v, where);
        if (!p.matcher(s).matches()) throw bad(where, "'" + s + "' " + rule);
        return s;
    }
}
