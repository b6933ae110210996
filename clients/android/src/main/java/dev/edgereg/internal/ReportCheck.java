package dev.edgereg.internal;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/** The report schema of docs/protocol.md section 12, as a receiver reads it: {reason, field} or null. */
public final class ReportCheck {
    private ReportCheck() {}

    static final List<String> KEYS = Arrays.asList("schema_version", "token", "unit", "model", "version", "unit_version", "variant", "tier",
            "arm", "sequence", "probe", "backend", "backends_skipped", "load_ms", "load_failed", "inference", "confirmed", "reverted",
            "mnn_runtime", "os", "os_version", "device_class", "unconfirmed_starts", "cpu_class", "memory_peak_mb", "memory_steady_mb",
            "first_inference_ms", "metrics");
    /** The keys schema version 2 adds: unknown in a version 1 report, even null. */
    public static final List<String> V2_KEYS = Arrays.asList("unconfirmed_starts", "cpu_class", "memory_peak_mb", "memory_steady_mb",
            "first_inference_ms");
    /** The key schema version 3 adds (app metrics): unknown in a version 1 or 2 report, even null. */
    public static final List<String> V3_KEYS = Arrays.asList("metrics");
    /** The largest report a receiver reads (docs/protocol.md section 12, "Size"). */
    public static final int MAX_BYTES = 16384;
    /** The largest count an app metric carries in a report. */
    public static final long MAX_COUNT = 1000000000L;
    static final Pattern CPU_CLASS = Pattern.compile("[a-z0-9][a-z0-9._-]{0,31}");
    static final Pattern SHORT = Pattern.compile("[A-Za-z0-9._ -]{1,32}");

    public static String[] check(byte[] body) {
        if (body.length > MAX_BYTES) return new String[] {"too-large", null};
        Object v;
        try {
            v = Json.parse(body);
        } catch (Json.JsonException e) {
            return new String[] {"not-json", null};
        }
        if (!(v instanceof Map)) return new String[] {"invalid", null};
        @SuppressWarnings("unchecked")
        Map<String, Object> m = (Map<String, Object>) v;
        for (String k : m.keySet()) if (!KEYS.contains(k)) return new String[] {"invalid", k};
        Object sv = m.get("schema_version");
        // A receiver takes a missing schema_version as 1 (shipped senders are kept); 1.0, 4: refused.
        if (m.containsKey("schema_version") && !(sv instanceof Json.Num && Arrays.asList("1", "2", "3").contains(sv.toString()))) {
            return new String[] {"invalid", "schema_version"};
        }
        if (sv == null || "1".equals(sv.toString())) {
            for (String k : V2_KEYS) if (m.containsKey(k)) return bad(k);
        }
        if (sv == null || !"3".equals(sv.toString())) {
            for (String k : V3_KEYS) if (m.containsKey(k)) return bad(k);
        }
        if (!matches(m.get("token"), "[0-9a-f]{32}")) return bad("token");
        for (String k : new String[] {"unit", "model", "variant", "tier"}) if (!(m.get(k) instanceof String) || !Wire.NAME.matcher((String) m.get(k)).matches()) return bad(k);
        for (String k : new String[] {"version", "unit_version"}) if (!(m.get(k) instanceof String) || !Versions.isSemver((String) m.get(k))) return bad(k);
        if (!oneOf(m.get("arm"), "candidate", "stable")) return bad("arm");
        if (!intIn(m.get("sequence"), 1, Wire.MAX_SAFE_INTEGER)) return bad("sequence");
        if (!oneOf(m.get("probe"), "passed", "failed", "none")) return bad("probe");
        if (present(m, "backend") && !(m.get("backend") instanceof String && Wire.BACKENDS.contains(m.get("backend")))) return bad("backend");
        if (m.containsKey("backends_skipped")) {
            Object s = m.get("backends_skipped");
            if (!(s instanceof List) || ((List<?>) s).size() > 8) return bad("backends_skipped");
            for (Object b : (List<?>) s) if (!(b instanceof String && Wire.BACKENDS.contains(b))) return bad("backends_skipped");
        }
        if (present(m, "load_ms") && !ms(m.get("load_ms"))) return bad("load_ms");
        for (String k : new String[] {"load_failed", "confirmed", "reverted"}) if (m.containsKey(k) && !(m.get(k) instanceof Boolean)) return bad(k);
        if (present(m, "inference")) {
            if (!(m.get("inference") instanceof Map)) return bad("inference");
            @SuppressWarnings("unchecked")
            Map<String, Object> inf = (Map<String, Object>) m.get("inference");
            for (String k : inf.keySet()) if (!Arrays.asList("count", "p50_ms", "p90_ms", "p99_ms").contains(k)) return bad("inference." + k);
            if (!intIn(inf.get("count"), 1, 1000000000L)) return bad("inference.count");
            for (String k : new String[] {"p50_ms", "p90_ms", "p99_ms"}) if (!ms(inf.get(k))) return bad("inference." + k);
        }
        if (present(m, "mnn_runtime") && !(m.get("mnn_runtime") instanceof String && Versions.isVersion((String) m.get("mnn_runtime")))) return bad("mnn_runtime");
        if (present(m, "os") && !oneOf(m.get("os"), "android", "ios")) return bad("os");
        Object os = m.get("os_version");
        if (present(m, "os_version") && !matches(os, SHORT.pattern()) && !(os instanceof String && Versions.isVersion((String) os))) return bad("os_version");
        if (present(m, "device_class") && !matches(m.get("device_class"), SHORT.pattern())) return bad("device_class");
        if (present(m, "unconfirmed_starts") && !intIn(m.get("unconfirmed_starts"), 0, 1000)) return bad("unconfirmed_starts");
        if (present(m, "cpu_class") && !matches(m.get("cpu_class"), CPU_CLASS.pattern())) return bad("cpu_class");
        for (String k : new String[] {"memory_peak_mb", "memory_steady_mb"}) if (present(m, k) && !within(m.get(k), Wire.MAX_MEMORY_MB)) return bad(k);
        if (present(m, "first_inference_ms") && !ms(m.get("first_inference_ms"))) return bad("first_inference_ms");
        if (present(m, "metrics")) return metrics(m.get("metrics"));
        return null;
    }

    /**
     * {@code metrics}: 1 to 16 names, each {@code {"events", "successes"}} (a rate, successes at
     * most events) or {@code {"counts": [2 to 32 counts]}} (a distribution), counts 0 to 10^9.
     */
    @SuppressWarnings("unchecked")
    static String[] metrics(Object v) {
        if (!(v instanceof Map)) return bad("metrics");
        Map<String, Object> all = (Map<String, Object>) v;
        if (all.isEmpty() || all.size() > Wire.MAX_METRICS) return bad("metrics");
        for (Map.Entry<String, Object> e : all.entrySet()) {
            String w = "metrics." + e.getKey();
            if (!Wire.NAME.matcher(e.getKey()).matches() || !(e.getValue() instanceof Map)) return bad(w);
            Map<String, Object> c = (Map<String, Object>) e.getValue();
            // Told apart by their keys, as the reference does: counts make a distribution.
            List<String> known = c.containsKey("counts") ? Arrays.asList("counts") : Arrays.asList("events", "successes");
            for (String k : known) {
                if (!c.containsKey(k)) return bad(w + "." + k);
                if (k.equals("counts")) {
                    if (!(c.get(k) instanceof List)) return bad(w + ".counts");
                    List<Object> counts = (List<Object>) c.get(k);
                    if (counts.size() < 2 || counts.size() > Wire.MAX_METRIC_EDGES + 1) return bad(w + ".counts");
                    for (int i = 0; i < counts.size(); i++) if (!intIn(counts.get(i), 0, MAX_COUNT)) return bad(w + ".counts." + i);
                } else if (!intIn(c.get(k), 0, MAX_COUNT)) {
                    return bad(w + "." + k);
                }
            }
            for (String k : c.keySet()) if (!known.contains(k)) return bad(w + "." + k);
            if (!known.contains("counts") && ((Json.Num) c.get("successes")).bigInteger().compareTo(((Json.Num) c.get("events")).bigInteger()) > 0) {
                return bad(w); // more successes than events
            }
        }
        return null;
    }

    static String[] bad(String field) { return new String[] {"invalid", field}; }

    static boolean present(Map<String, Object> m, String k) { return m.containsKey(k) && m.get(k) != Json.NULL; }

    static boolean matches(Object v, String regex) { return v instanceof String && ((String) v).matches(regex); }

    static boolean oneOf(Object v, String... allowed) { return v instanceof String && Arrays.asList(allowed).contains(v); }

    static boolean intIn(Object v, long min, long max) {
        if (!(v instanceof Json.Num) || !((Json.Num) v).integer) return false;
        java.math.BigInteger b = ((Json.Num) v).bigInteger();
        return b.compareTo(java.math.BigInteger.valueOf(min)) >= 0 && b.compareTo(java.math.BigInteger.valueOf(max)) <= 0;
    }

    static boolean ms(Object v) {
        return within(v, 3600000);
    }

    static boolean within(Object v, double max) {
        if (!(v instanceof Json.Num)) return false;
        double d = ((Json.Num) v).doubleValue();
        return d >= 0 && d <= max;
    }
}
