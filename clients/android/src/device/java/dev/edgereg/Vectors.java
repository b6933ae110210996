package dev.edgereg;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Json;
import dev.edgereg.internal.Rules;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The conformance checks of docs/protocol.md section 9 that read the library's package-private
 * parts (the self-test's verdict, tier resolution): the vector's {@code input} in, its
 * {@code expected} shape out. Device and test code only, never in the library jar.
 */
public final class Vectors {
    private Vectors() {}

    /** tests/vectors/conditions: why the policy defers a download, if it does (section 8). */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> conditions(Map<String, Object> input) {
        Map<String, Object> p = (Map<String, Object>) input.get("policy");
        Map<String, Object> c = (Map<String, Object>) input.get("conditions");
        if (p == null || c == null) throw new IllegalArgumentException("a conditions vector has 'policy' and 'conditions'");
        DownloadPolicy policy = new DownloadPolicy(flag(p, "allow_metered"), flag(p, "require_charging"), flag(p, "require_idle"),
                flag(p, "require_storage_not_low"), 0);
        DownloadPolicy.Conditions said = new DownloadPolicy.Conditions(said(c, "metered"), said(c, "charging"), said(c, "idle"), said(c, "storage_low"));
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        String why = policy.unmet(said);
        out.put("deferred", why == null ? Json.NULL : why);
        return out;
    }

    private static boolean flag(Map<String, Object> m, String key) {
        Object v = m.get(key);
        if (!(v instanceof Boolean)) throw new IllegalArgumentException("policy." + key + " is a boolean");
        return (Boolean) v;
    }

    private static Boolean said(Map<String, Object> m, String key) {
        Object v = m.get(key);
        return v instanceof Boolean ? (Boolean) v : null; // absent or null: not said
    }

    /** A vector's scratch cache directory (flat: the ledgers write there only) and its files. */
    private static void removeScratch(java.io.File dir) {
        java.io.File[] files = dir.listFiles();
        if (files != null) for (java.io.File f : files) f.delete();
        dir.delete();
    }

    /**
     * tests/vectors/health: the confirmation ledger (section 11) over the vector's steps, in a
     * fresh cache directory: launch (a new process), install, app_started (a revert it decides is
     * carried out at once), confirm. Per step: the ledger, the revert decided, the count reported.
     */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> health(Map<String, Object> input) throws Exception {
        long max = ((Json.Num) input.get("max_unconfirmed_starts")).longValue();
        java.io.File dir = java.nio.file.Files.createTempDirectory("edgereg-health").toFile();
        try {
            Health health = new Health(new dev.edgereg.internal.Store(dir), (int) max);
            boolean started = false;
            List<Object> out = new ArrayList<Object>();
            for (Object o : (List<Object>) input.get("steps")) {
                Map<String, Object> step = (Map<String, Object>) o;
                String what = (String) step.get("do");
                Object version = step.get("version");
                Map<String, Object> revert = null;
                Object reported = Json.NULL;
                if ("launch".equals(what)) {
                    started = false;
                } else if ("install".equals(what)) {
                    health.installed("unit", (String) version, started);
                } else if ("confirm".equals(what)) {
                    health.confirm("unit", version instanceof String ? (String) version : null);
                } else if ("app_started".equals(what)) {
                    started = true;
                    Object[] before = health.unconfirmed("unit");
                    String[] due = health.appStarted("unit");
                    Object[] now = health.unconfirmed("unit");
                    if (now != null && (Long) now[1] > (before == null ? 0L : (Long) before[1])) reported = now[1];
                    if (due != null) {
                        revert = new LinkedHashMap<String, Object>();
                        revert.put("version", due[0]);
                        revert.put("to_version", due[1] == null ? Json.NULL : due[1]);
                        health.reverted("unit", due[1]);
                    }
                } else {
                    throw new IllegalArgumentException("not a health step: " + what);
                }
                Map<String, Object> row = new LinkedHashMap<String, Object>();
                Object[] h = health.view("unit");
                row.put("installed", h[0] == null ? Json.NULL : h[0]);
                row.put("confirmed", h[1]);
                row.put("unconfirmed_starts", h[2]);
                row.put("revert", revert == null ? Json.NULL : revert);
                row.put("reported", reported);
                out.add(row);
            }
            Map<String, Object> result = new LinkedHashMap<String, Object>();
            result.put("steps", out);
            return result;
        } finally {
            removeScratch(dir);
        }
    }

    /**
     * tests/vectors/metrics: app metric calls counted into an install's totals (section 11), from
     * the totals before (saved as an earlier session of the app left them), and what the next
     * report carries.
     */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> metrics(Map<String, Object> input) throws Exception {
        Map<String, AppMetric> declared = AppMetric.fromJson(input.get("declared"));
        java.io.File dir = java.nio.file.Files.createTempDirectory("edgereg-metrics").toFile();
        try {
            dev.edgereg.internal.Store store = new dev.edgereg.internal.Store(dir);
            Map<String, Object> install = new LinkedHashMap<String, Object>();
            install.put("metrics", input.get("counts"));
            install.put("changed", false);
            Map<String, Object> installs = new LinkedHashMap<String, Object>();
            installs.put("t", install);
            Map<String, Object> saved = new LinkedHashMap<String, Object>();
            saved.put("installs", installs);
            dev.edgereg.internal.Store.atomicWrite(new java.io.File(dir, "metrics.json"), Json.canonical(saved));
            MetricCounts counts = new MetricCounts(store);
            List<Object> outcomes = new ArrayList<Object>();
            for (Object o : (List<Object>) input.get("calls")) {
                Map<String, Object> call = (Map<String, Object>) o;
                boolean rate = call.containsKey("record");
                String name = (String) (rate ? call.get("record") : call.get("observe"));
                double value = 0;
                if (!rate) {
                    Object v = call.get("value");
                    value = "NaN".equals(v) ? Double.NaN : "Infinity".equals(v) ? Double.POSITIVE_INFINITY
                            : "-Infinity".equals(v) ? Double.NEGATIVE_INFINITY : ((Json.Num) v).doubleValue();
                }
                String why = AppMetric.refusal(declared, name, rate, value);
                if (why == null) {
                    AppMetric m = declared.get(name);
                    counts.count("t", m, rate ? (Boolean.TRUE.equals(call.get("success")) ? 1 : 0) : m.bucket(value));
                }
                outcomes.add(why == null ? "counted" : why);
            }
            counts.awaitSaved(5000);
            Map<String, Object> totals = counts.totals("t");
            Map<String, Object> result = new LinkedHashMap<String, Object>();
            result.put("calls", outcomes);
            result.put("metrics", totals == null ? Json.NULL : totals);
            return result;
        } finally {
            removeScratch(dir);
        }
    }

    /** tests/vectors/selftest: the verdict of rules 15 to 20 on each backend's outcome if tried. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> selfTest(Map<String, Object> input) {
        List<Object> backends = (List<Object>) input.get("backends");
        Map<String, Object> remembered = (Map<String, Object>) input.get("remembered");
        Map<String, Object> outcomes = (Map<String, Object>) input.get("trials");
        boolean probe = Boolean.TRUE.equals(input.get("probe"));
        if (backends == null || remembered == null || outcomes == null) throw new IllegalArgumentException("not a self-test vector");
        List<String[]> trials = new ArrayList<String[]>();
        for (Object o : backends) {
            String backend = (String) o;
            if (remembered.containsKey(backend)) {
                trials.add(new String[] {backend, "remembered"});
                continue;
            }
            String kind = (String) outcomes.get(backend);
            if (kind == null) throw new IllegalArgumentException("no trial outcome for " + backend);
            if (kind.equals("passed") && !probe) kind = "loaded";
            trials.add(new String[] {backend, kind});
            if (kind.equals("passed") || kind.equals("loaded")) break;
        }
        String[] verdict = SelfTest.judge(trials);
        List<Object> skipped = new ArrayList<Object>();
        List<Object> tried = new ArrayList<Object>();
        boolean anyTried = false;
        boolean allLoadFailed = true;
        for (String[] t : trials) {
            if (t[1].equals("failed") || t[1].equals("load-failed") || t[1].equals("remembered")) skipped.add(t[0]);
            if (!t[1].equals("remembered")) tried.add(t[0]);
            if (t[1].equals("failed") || t[1].equals("load-failed")) {
                anyTried = true;
                allLoadFailed &= t[1].equals("load-failed");
            }
        }
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        out.put("verdict", verdict[0]);
        out.put("backend", verdict[1] == null ? Json.NULL : verdict[1]);
        out.put("tried", tried);
        out.put("mark_bad", verdict[0].equals("reject"));
        if (verdict[0].equals("not-run")) {
            out.put("report", Json.NULL);
        } else {
            Map<String, Object> report = new LinkedHashMap<String, Object>();
            boolean install = verdict[0].equals("install");
            report.put("probe", install ? (probe ? "passed" : "none") : "failed");
            report.put("backend", install ? verdict[1] : Json.NULL);
            report.put("backends_skipped", skipped);
            report.put("load_failed", !install && anyTried && allLoadFailed);
            out.put("report", report);
        }
        return out;
    }

    /** tests/vectors/tiers: read a tier file, then resolve the device's tier (section 5). */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> tierFile(Map<String, Object> input) {
        byte[] file = Codec.base64Decode((String) input.get("file"));
        if (file == null) throw new IllegalArgumentException("file is not base64");
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        Tiers tiers;
        try {
            tiers = Tiers.fromJson(file);
        } catch (IllegalArgumentException e) {
            out.put("accept", false);
            return out;
        }
        out.put("accept", true);
        out.put("order", new ArrayList<Object>(tiers.names()));
        Tiers.Resolution r = tiers.resolve(device((Map<String, Object>) input.get("device")));
        out.put("tier", r == null ? Json.NULL : r.tier);
        return out;
    }

    /** One case of tests/vectors/rules/tiers.json: its tiers (an array) and a device. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> resolveTier(List<Object> listed, Map<String, Object> device) {
        LinkedHashMap<String, Rules.TierRules> tiers = new LinkedHashMap<String, Rules.TierRules>();
        for (Object t : listed) {
            Map<String, Object> tier = (Map<String, Object>) t;
            tiers.put((String) tier.get("name"), Tiers.rulesFromJson((Map<String, Object>) tier.get("rules")));
        }
        Tiers.Resolution r = Tiers.resolve(tiers, device(device));
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        out.put("tier", r == null ? Json.NULL : r.tier);
        return out;
    }

    /** One case of tests/vectors/rules/cohorts.json: the bucket and the cohort at each percent. */
    public static Map<String, Object> cohort(String salt, String deviceId, List<Object> percents) {
        long bucket = Rules.cohortBucket(deviceId, salt);
        Map<String, Object> in = new LinkedHashMap<String, Object>();
        for (Object p : percents) {
            long points = Math.round(Double.parseDouble((String) p) * 100);
            in.put((String) p, bucket < points);
        }
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        out.put("bucket", bucket);
        out.put("in_cohort", in);
        return out;
    }

    static DeviceFacts device(Map<String, Object> d) {
        if (d == null) throw new IllegalArgumentException("missing device");
        return DeviceFacts.builder("any")
                .ramMb(((Json.Num) d.get("ram_mb")).longValue())
                .cpuCores(((Json.Num) d.get("cpu_cores")).longValue().intValue())
                .soc(d.get("soc") instanceof String ? (String) d.get("soc") : null)
                .os(d.get("os") instanceof String ? (String) d.get("os") : null, null)
                .build();
    }
}
