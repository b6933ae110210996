package dev.edgereg.internal;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The conformance vectors' two pure checks (docs/protocol.md section 9), shared by the JUnit
 * suite and the device program's {@code decide} and {@code check_blob}: input object in, the
 * vector's {@code expected} shape out.
 */
public final class Conformance {
    private Conformance() {}

    public static Map<String, Object> decide(Map<String, Object> input, Ed25519 ed) throws IllegalArgumentException {
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        try {
            Decision d = decision(input, ed);
            out.put("accept", true);
            out.put("entry", d.unit == null ? Json.NULL : entryJson(d.unit));
            out.put("is_candidate", d.isCandidate);
            out.put("runtime_fallback", d.fallback != null);
            out.put("fallback", d.fallback == null ? Json.NULL : d.fallback);
            out.put("substitute", d.substitute == null ? Json.NULL : d.substitute);
            out.put("sequence", d.sequence);
        } catch (Rejected r) {
            out.put("accept", false);
            out.put("reason", r.code);
        }
        return out;
    }

    /**
     * tests/vectors/hints: the decision, then the try-set of the chosen entry and the runtime the
     * device uses (section 11, "Runtime hints"); the vector's device holds the hint facts
     * ({@code cpu_class}, {@code cores}, {@code soc}; left out: not known).
     */
    public static Map<String, Object> hints(Map<String, Object> input, Ed25519 ed) throws IllegalArgumentException {
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        Decision d;
        try {
            d = decision(input, ed);
        } catch (Rejected r) {
            out.put("accept", false);
            out.put("reason", r.code);
            return out;
        }
        out.put("accept", true);
        if (d.unit == null || d.unit.bundle) {
            for (String k : new String[] {"entry", "runtime_trials", "runtime", "rule", "matched"}) out.put(k, Json.NULL);
            return out;
        }
        Wire.Entry entry = d.unit.single();
        @SuppressWarnings("unchecked")
        Map<String, Object> device = (Map<String, Object>) input.get("device");
        Object cores = device.get("cores");
        Rules.HintFacts facts = new Rules.HintFacts(opt(device, "cpu_class"),
                cores instanceof Json.Num ? Integer.valueOf(((Json.Num) cores).longValue().intValue()) : null, opt(device, "soc"));
        Rules.RuntimeChoice c = Rules.chooseRuntime(entry, facts, str(device, "device_id"));
        out.put("entry", memberJson(entry));
        out.put("runtime_trials", entry.trials == null ? Json.NULL : entry.trials.toJson());
        Map<String, Object> runtime = new LinkedHashMap<String, Object>();
        runtime.put("threads", (long) c.threads);
        runtime.put("backends", new java.util.ArrayList<Object>(c.backends));
        runtime.put("precision", c.precision);
        out.put("runtime", runtime);
        out.put("rule", c.rule == null ? Json.NULL : (Object) (long) c.rule);
        out.put("matched", c.matched == null ? Json.NULL : (Object) (long) c.matched);
        return out;
    }

    private static Decision decision(Map<String, Object> input, Ed25519 ed) throws Rejected {
        byte[] manifest = Codec.base64Decode(str(input, "manifest"));
        if (manifest == null) throw new IllegalArgumentException("manifest is not base64");
        Map<String, byte[]> trusted = trustedKeys((List<?>) input.get("trusted_keys"));
        @SuppressWarnings("unchecked")
        Map<String, Object> device = (Map<String, Object>) input.get("device");
        if (device == null) throw new IllegalArgumentException("missing device");
        Decision.AppFacts facts = new Decision.AppFacts(opt(device, "mnn_runtime"), opt(device, "app_version"), opt(device, "os"),
                opt(device, "os_version"), features(device.get("cpu_features")), budget(device.get("memory_budget_mb")),
                features(device.get("mnn_apis")));
        Object seen = input.get("highest_seen_sequence");
        Long highest = seen instanceof Json.Num ? ((Json.Num) seen).longValue() : null;
        Long now = Codec.parseLooseTime(str(input, "now"));
        if (now == null) throw new IllegalArgumentException("now is not an RFC 3339 time");
        boolean bundle = Boolean.TRUE.equals(input.get("bundle"));
        return Decision.decide(manifest, trusted, ed, str(input, "model"), str(input, "tier"), bundle, str(device, "device_id"), facts,
                highest, now, true);
    }

    /** A vector's cpu_features: absent or null is not said; a list (even empty) says them. */
    static java.util.Set<String> features(Object v) {
        if (v == null || v == Json.NULL) return null;
        if (!(v instanceof List)) throw new IllegalArgumentException("cpu_features is a list of names");
        java.util.Set<String> out = new java.util.TreeSet<String>();
        for (Object f : (List<?>) v) {
            if (!(f instanceof String)) throw new IllegalArgumentException("cpu_features is a list of names");
            out.add((String) f);
        }
        return out;
    }

    static Double budget(Object v) {
        if (v == null || v == Json.NULL) return null;
        if (!(v instanceof Json.Num)) throw new IllegalArgumentException("memory_budget_mb is a number");
        return ((Json.Num) v).doubleValue();
    }

    /** The chosen entry; its {@code metrics} as the wire says them when it (or the bundle entry) declares any. */
    static Map<String, Object> entryJson(Wire.Unit unit) {
        if (!unit.bundle) {
            Map<String, Object> e = memberJson(unit.single());
            if (unit.single().metrics != null) e.put("metrics", Wire.Metric.toJson(unit.single().metrics));
            return e;
        }
        Map<String, Object> e = new LinkedHashMap<String, Object>();
        e.put("version", unit.version);
        Map<String, Object> members = new LinkedHashMap<String, Object>();
        for (Map.Entry<String, Wire.Entry> m : unit.members.entrySet()) members.put(m.getKey(), memberJson(m.getValue()));
        e.put("members", members);
        if (unit.metrics != null) e.put("metrics", Wire.Metric.toJson(unit.metrics));
        return e;
    }

    static Map<String, Object> memberJson(Wire.Entry entry) {
        Map<String, Object> e = new LinkedHashMap<String, Object>();
        e.put("version", entry.version);
        e.put("variant", entry.variant);
        e.put("sha256", entry.blob.sha256);
        e.put("size", entry.blob.size);
        return e;
    }

    public static Map<String, Object> checkBlob(Map<String, Object> input) {
        @SuppressWarnings("unchecked")
        Map<String, Object> entry = (Map<String, Object>) input.get("entry");
        Object cl = input.get("content_length");
        Long contentLength = cl instanceof Json.Num ? ((Json.Num) cl).longValue() : null;
        byte[] body = Codec.base64Decode(str(input, "body"));
        if (body == null) throw new IllegalArgumentException("body is not base64");
        Wire.BlobRef ref = new Wire.BlobRef(str(entry, "sha256"), ((Json.Num) entry.get("size")).longValue());
        Decision.BlobCheck check = new Decision.BlobCheck(ref);
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        try {
            check.expect(contentLength);
            // Fed in small chunks, as a download arrives.
            for (int off = 0; off < body.length; off += 64) check.update(body, off, Math.min(64, body.length - off));
            if (check.remaining() > 0) throw check.endedEarly(contentLength, "vector");
            check.finish();
            out.put("accept", true);
        } catch (Rejected r) {
            out.put("accept", false);
            out.put("reason", r.code);
        }
        return out;
    }

    /** tests/vectors/versions: {"result": match | no-match | invalid-version | invalid-range}. */
    public static Map<String, Object> versions(Map<String, Object> input) {
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        Object range = input.get("range");
        Object version = input.get("version");
        if (!(range instanceof String) || Versions.parseRange((String) range) == null) out.put("result", "invalid-range");
        else if (!(version instanceof String) || !Versions.isVersion((String) version)) out.put("result", "invalid-version");
        else out.put("result", Versions.satisfies((String) version, (String) range) ? "match" : "no-match");
        return out;
    }

    /** tests/vectors/probes: {"pass", "reason"}. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> probe(Map<String, Object> input) {
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        Probe probe;
        try {
            byte[] data = Codec.base64Decode(str(input, "probe"));
            if (data == null) throw new IllegalArgumentException("probe is not base64");
            // The entry's probe_data: its declared size, and the blob as downloaded and verified.
            Object blob = input.get("probe_data");
            byte[] tensors = null;
            String tensorsSha = null;
            if (blob instanceof Map) {
                Map<String, Object> b = (Map<String, Object>) blob;
                if (((Json.Num) b.get("size")).longValue() > Probe.MAX_DATA_BYTES) throw new Rejected(Reasons.MALFORMED, "probe data declared too large");
                tensors = Codec.base64Decode((String) b.get("data"));
                tensorsSha = Codec.hex(Codec.sha256().digest(tensors));
            }
            probe = Probe.parse(data, str(input, "artifact_sha256"), tensorsSha, tensors);
        } catch (Rejected r) {
            out.put("pass", false);
            out.put("reason", r.code);
            return out;
        }
        List<Object> computed = (List<Object>) input.get("computed");
        String reason = null;
        if (computed.size() != probe.cases.size()) reason = "count-mismatch";
        for (int c = 0; reason == null && c < probe.cases.size(); c++) {
            List<Object> steps = (List<Object>) computed.get(c);
            if (steps.size() != probe.cases.get(c).size()) {
                reason = "count-mismatch";
                break;
            }
            for (int s = 0; reason == null && s < steps.size(); s++) {
                Map<String, Map<String, Object>> byName = new LinkedHashMap<String, Map<String, Object>>();
                for (Object t : (List<Object>) steps.get(s)) byName.put((String) ((Map<String, Object>) t).get("name"), (Map<String, Object>) t);
                for (Probe.T want : probe.cases.get(c).get(s).expected) {
                    Map<String, Object> got = byName.get(want.name);
                    String[] failure;
                    if (got == null) {
                        failure = probe.check(want.name, null, null, null, want);
                    } else {
                        List<Object> dims = (List<Object>) got.get("shape");
                        int[] shape = new int[dims.size()];
                        for (int i = 0; i < shape.length; i++) shape[i] = ((Json.Num) dims.get(i)).longValue().intValue();
                        failure = probe.check(want.name, (String) got.get("dtype"), shape, Codec.base64Decode((String) got.get("data")), want);
                    }
                    if (failure != null) {
                        reason = failure[0];
                        break;
                    }
                }
            }
        }
        out.put("pass", reason == null);
        out.put("reason", reason == null ? Json.NULL : reason);
        return out;
    }

    /** tests/vectors/labels: {"accept", "labels"} or {"accept": false, "reason"}. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> labels(Map<String, Object> input) {
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        Map<String, Object> entry = (Map<String, Object>) input.get("entry");
        long size = ((Json.Num) entry.get("size")).longValue();
        byte[] body = Codec.base64Decode(str(input, "body"));
        try {
            if (size > Labels.MAX_BYTES) throw new Rejected(Reasons.MALFORMED, "labels blob declared larger than 4 MiB");
            Decision.BlobCheck check = new Decision.BlobCheck(new Wire.BlobRef(str(entry, "sha256"), size));
            check.update(body, 0, body.length);
            check.finish();
            List<String> labels = Labels.parse(body, "vector");
            out.put("accept", true);
            out.put("labels", new java.util.ArrayList<Object>(labels));
        } catch (Rejected r) {
            out.put("accept", false);
            out.put("reason", r.code);
        }
        return out;
    }

    /** tests/vectors/reports: {"accept": true} or {"accept": false, "reason", "field"}. */
    public static Map<String, Object> report(Map<String, Object> input) {
        Map<String, Object> out = new LinkedHashMap<String, Object>();
        String[] r = ReportCheck.check(Codec.base64Decode(str(input, "body")));
        out.put("accept", r == null);
        if (r != null) {
            out.put("reason", r[0]);
            out.put("field", r[1] == null ? Json.NULL : r[1]);
        }
        return out;
    }

    public static Map<String, byte[]> trustedKeys(List<?> pems) {
        Map<String, byte[]> trusted = new LinkedHashMap<String, byte[]>();
        if (pems == null) return trusted;
        for (Object pem : pems) {
            byte[] raw = Ed25519.rawPublicKey(Codec.utf8((String) pem));
            trusted.put(Codec.sha256Hex(raw), raw);
        }
        return trusted;
    }

    static String str(Map<String, Object> m, String key) {
        Object v = m.get(key);
        if (!(v instanceof String)) throw new IllegalArgumentException("missing string '" + key + "'");
        return (String) v;
    }

    static String opt(Map<String, Object> m, String key) {
        Object v = m.get(key);
        return v instanceof String ? (String) v : null;
    }
}
