package dev.edgereg.device;

import dev.edgereg.AppStart;
import dev.edgereg.BundledRelease;
import dev.edgereg.DeviceFacts;
import dev.edgereg.DownloadPolicy;
import dev.edgereg.EdgeregClient;
import dev.edgereg.InstalledModel;
import dev.edgereg.InstalledUnit;
import dev.edgereg.ModelChange;
import dev.edgereg.ModelListener;
import dev.edgereg.ProgressListener;
import dev.edgereg.UpdateCheck;
import dev.edgereg.Status;
import dev.edgereg.Tiers;
import dev.edgereg.Vectors;
import dev.edgereg.UpdateResult;
import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Conformance;
import dev.edgereg.internal.Ed25519;
import dev.edgereg.internal.Json;
import java.io.BufferedReader;
import java.io.File;
import java.util.List;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.util.LinkedHashMap;
import java.util.Map;

/** The device program (docs/reference/device-program.md): one JSON object per line in and out. */
public final class DeviceMain {
    private DeviceMain() {}

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(System.out, false, "UTF-8");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        Device device = new Device();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.trim().isEmpty()) continue;
            Map<String, Object> response = new LinkedHashMap<String, Object>();
            Object id = Json.NULL;
            boolean quit = false;
            try {
                Object parsed = Json.parse(line);
                if (!(parsed instanceof Map)) throw new Misuse("a request is a JSON object");
                @SuppressWarnings("unchecked")
                Map<String, Object> request = (Map<String, Object>) parsed;
                if (request.containsKey("id")) id = request.get("id");
                Object op = request.get("op");
                if (!(op instanceof String)) throw new Misuse("missing 'op'");
                quit = "quit".equals(op);
                Map<String, Object> result = device.handle((String) op, request);
                response.put("id", id);
                response.put("ok", true);
                response.put("result", result);
            } catch (Misuse | Json.JsonException | IllegalArgumentException | ClassCastException | NullPointerException e) {
                response.put("id", id);
                response.put("ok", false);
                Map<String, Object> error = new LinkedHashMap<String, Object>();
                error.put("message", String.valueOf(e.getMessage() == null ? e.toString() : e.getMessage()));
                response.put("error", error);
            }
            out.print(Json.canonicalString(response));
            out.print('\n');
            out.flush();
            if (quit) break;
        }
        device.close();
        out.flush();
        System.exit(0);
    }

    /** Misuse of the harness itself: an unknown op, a missing argument. */
    static final class Misuse extends Exception {
        private static final long serialVersionUID = 1L;

        Misuse(String message) { super(message); }
    }

    static final class Device {
        private EdgeregClient client;
        private String unit;
        private HostRunner runner;
        private Long fixedNow;
        private Thread background;
        private List<Object> backgroundProgress;
        private Object[] backgroundResult;
        private final List<ModelChange> events = new java.util.ArrayList<ModelChange>();

        @SuppressWarnings("unchecked")
        Map<String, Object> handle(String op, Map<String, Object> request) throws Misuse {
            Map<String, Object> result = new LinkedHashMap<String, Object>();
            if (op.equals("hello")) {
                result.put("client", "jvm");
                result.put("sdk_version", EdgeregClient.SDK_VERSION);
            } else if (op.equals("decide")) {
                result = Conformance.decide(object(request, "vector"), Ed25519.best());
            } else if (op.equals("check_hints")) {
                result = Conformance.hints(object(request, "vector"), Ed25519.best());
            } else if (op.equals("check_blob")) {
                result = Conformance.checkBlob(object(request, "vector"));
            } else if (op.equals("check_probe")) {
                result = Conformance.probe(object(request, "vector"));
            } else if (op.equals("check_version")) {
                result = Conformance.versions(object(request, "vector"));
            } else if (op.equals("check_report")) {
                result = Conformance.report(object(request, "vector"));
            } else if (op.equals("check_labels")) {
                result = Conformance.labels(object(request, "vector"));
            } else if (op.equals("check_conditions")) {
                result = vector(op, request, "conditions");
            } else if (op.equals("check_selftest")) {
                result = vector(op, request, "selftest");
            } else if (op.equals("check_tiers")) {
                result = vector(op, request, "tiers");
            } else if (op.equals("check_health")) {
                result = vector(op, request, "health");
            } else if (op.equals("check_metrics")) {
                result = vector(op, request, "metrics");
            } else if (op.equals("resolve_tier")) {
                Object tiers = request.get("tiers");
                if (!(tiers instanceof List)) throw new Misuse("resolve_tier needs 'tiers' (an array)");
                try {
                    result = Vectors.resolveTier((List<Object>) tiers, object(request, "device"));
                } catch (RuntimeException e) {
                    throw new Misuse("not a tier case: " + e);
                }
            } else if (op.equals("cohort")) {
                Object percents = request.get("percents");
                if (!(percents instanceof List)) throw new Misuse("cohort needs 'percents'");
                try {
                    result = Vectors.cohort(str(request, "salt"), str(request, "device_id"), (List<Object>) percents);
                } catch (RuntimeException e) {
                    throw new Misuse("not a cohort case: " + e);
                }
            } else if (op.equals("check_json")) {
                Object data = request.get("data");
                if (!(data instanceof String)) throw new Misuse("check_json needs 'data' (base64)");
                byte[] bytes = Codec.base64Decode((String) data);
                if (bytes == null) throw new Misuse("'data' is not canonical base64");
                result.put("valid", Json.isValid(bytes));
            } else if (op.equals("configure")) {
                result = configure(request);
            } else if (op.equals("set_clock")) {
                fixedNow = time(request.get("now"));
            } else if (op.equals("update")) {
                result = resultJson(client().update(unit, conditions(request)));
            } else if (op.equals("start_update")) {
                final EdgeregClient c = client();
                if (background != null && background.isAlive()) throw new Misuse("an update is already running: wait_update first");
                final DownloadPolicy.Conditions said = conditions(request);
                final List<Object> progress = new java.util.ArrayList<Object>();
                final Object[] done = new Object[1];
                backgroundProgress = progress;
                backgroundResult = done;
                background = new Thread(new Runnable() {
                    @Override public void run() {
                        done[0] = c.update(unit, said, new ProgressListener() {
                            @Override public void onProgress(long bytes, long total) {
                                synchronized (progress) {
                                    progress.add(new java.util.ArrayList<Object>(java.util.Arrays.asList((Object) bytes, (Object) total)));
                                }
                            }
                        });
                    }
                }, "edgereg-device-update");
                background.start();
            } else if (op.equals("cancel")) {
                client().cancel(unit);
            } else if (op.equals("wait_update")) {
                if (background == null) throw new Misuse("no update was started");
                try {
                    background.join();
                } catch (InterruptedException e) {
                    throw new Misuse("interrupted");
                }
                background = null;
                result = resultJson((UpdateResult) backgroundResult[0]);
                synchronized (backgroundProgress) {
                    result.put("progress", new java.util.ArrayList<Object>(backgroundProgress));
                }
            } else if (op.equals("events")) {
                List<Object> out = new java.util.ArrayList<Object>();
                synchronized (events) {
                    for (ModelChange ch : events) {
                        Map<String, Object> e = new LinkedHashMap<String, Object>();
                        e.put("unit", ch.unit);
                        e.put("kind", ch.kind);
                        e.put("version", nul(ch.version));
                        e.put("previous", nul(ch.previous));
                        out.add(e);
                    }
                    events.clear();
                }
                result.put("events", out);
            } else if (op.equals("check")) {
                UpdateCheck c = client().check(unit, conditions(request));
                result.put("available", c.available);
                result.put("version", nul(c.version));
                result.put("installed", nul(c.installed));
                result.put("is_candidate", c.isCandidate);
                result.put("download_bytes", c.downloadBytes);
                result.put("deferred", nul(c.deferred));
                result.put("fallback", nul(c.fallback));
                result.put("error_code", nul(c.errorCode));
            } else if (op.equals("delete")) {
                result.put("deleted", client().delete(unit));
            } else if (op.equals("installed")) {
                List<Object> out = new java.util.ArrayList<Object>();
                for (InstalledUnit u : client().installedUnits()) {
                    Map<String, Object> e = new LinkedHashMap<String, Object>();
                    e.put("unit", u.unit);
                    e.put("kind", u.kind);
                    e.put("version", u.version);
                    e.put("is_candidate", u.isCandidate);
                    out.add(e);
                }
                result.put("units", out);
            } else if (op.equals("current")) {
                result = resultJson(client().current(unit));
            } else if (op.equals("status")) {
                result = statusJson(client().status(unit, true));
            } else if (op.equals("app_started")) {
                List<AppStart> reverts = client().appStarted();
                result.put("reverted", !reverts.isEmpty());
                result.put("version", reverts.isEmpty() ? Json.NULL : reverts.get(0).version);
                result.put("reason", reverts.isEmpty() ? Json.NULL : reverts.get(0).reason);
            } else if (op.equals("confirm")) {
                Object v = request.get("version");
                result.put("confirmed", client().confirm(unit, v instanceof String ? (String) v : null));
            } else if (op.equals("record_inference")) {
                Object ms = request.get("ms");
                if (!(ms instanceof Json.Num)) throw new Misuse("record_inference needs 'ms'");
                Object model = request.get("model");
                client().recordInference(model instanceof String ? (String) model : unit, ((Json.Num) ms).doubleValue());
            } else if (op.equals("record_memory")) {
                Object model = request.get("model");
                client().recordMemory(model instanceof String ? (String) model : unit, optNumber(request, "peak_mb"), optNumber(request, "steady_mb"));
            } else if (op.equals("record") || op.equals("observe")) {
                result = countMetric(op, request);
            } else if (op.equals("revert")) {
                Object reason = request.get("reason");
                result = resultJson(client().revert(unit, reason instanceof String ? (String) reason : "reverted by the app"));
            } else if (op.equals("flush")) {
                result.put("sent", (long) client().flushReports(15000));
            } else if (op.equals("quit")) {
                // answered, then the loop ends
            } else {
                throw new Misuse("unknown op '" + op + "'");
            }
            return result;
        }

        /**
         * record / observe: counted, or the programming error the app would get at the call site
         * (an undeclared metric, another kind, a value that is not a finite number), never a crash.
         */
        private Map<String, Object> countMetric(String op, Map<String, Object> request) throws Misuse {
            String metric = str(request, "metric");
            EdgeregClient c = client();
            Object success = request.get("success");
            if (op.equals("record") && !(success instanceof Boolean)) throw new Misuse("record needs 'success' (true or false)");
            double value = op.equals("observe") ? value(request.get("value")) : 0;
            Map<String, Object> result = new LinkedHashMap<String, Object>();
            try {
                result.put("counted", op.equals("record") ? c.record(unit, metric, (Boolean) success) : c.observe(unit, metric, value));
            } catch (IllegalArgumentException e) {
                result.put("counted", false);
                result.put("error", String.valueOf(e.getMessage()));
            }
            return result;
        }

        /** A JSON number, or "NaN", "Infinity", "-Infinity" (which JSON cannot carry). */
        private static double value(Object v) throws Misuse {
            if (v instanceof Json.Num) return ((Json.Num) v).doubleValue();
            if ("NaN".equals(v)) return Double.NaN;
            if ("Infinity".equals(v)) return Double.POSITIVE_INFINITY;
            if ("-Infinity".equals(v)) return Double.NEGATIVE_INFINITY;
            throw new Misuse("observe needs 'value': a number, or \"NaN\", \"Infinity\", \"-Infinity\"");
        }

        @SuppressWarnings("unchecked")
        private static Map<String, Object> vector(String op, Map<String, Object> request, String kind) throws Misuse {
            Map<String, Object> input = object(request, "vector");
            try {
                if (kind.equals("conditions")) return Vectors.conditions(input);
                if (kind.equals("selftest")) return Vectors.selfTest(input);
                if (kind.equals("health")) return Vectors.health(input);
                if (kind.equals("metrics")) return Vectors.metrics(input);
                return Vectors.tierFile(input);
            } catch (Exception e) {
                throw new Misuse(op + ": not a vector input: " + e);
            }
        }

        /** Absent, or a condition left out: the app did not say it (unknown is unmet). */
        private static DownloadPolicy.Conditions conditions(Map<String, Object> request) {
            Object c = request.get("conditions");
            Map<?, ?> cond = c instanceof Map ? (Map<?, ?>) c : new LinkedHashMap<String, Object>();
            return new DownloadPolicy.Conditions(bool(cond.get("metered")), bool(cond.get("charging")), bool(cond.get("idle")),
                    bool(cond.get("storage_low")));
        }

        private static Double optNumber(Map<String, Object> request, String key) throws Misuse {
            Object v = request.get(key);
            if (v == null || v == Json.NULL) return null;
            if (!(v instanceof Json.Num)) throw new Misuse(key + " is a number of MiB or null");
            return ((Json.Num) v).doubleValue();
        }

        private static Boolean bool(Object v) {
            return v instanceof Boolean ? (Boolean) v : null; // unknown counts as unmet
        }

        private EdgeregClient client() throws Misuse {
            if (client == null) throw new Misuse("configure first");
            return client;
        }

        private static Long time(Object v) throws Misuse {
            if (v == null || v == Json.NULL) return null;
            if (!(v instanceof String)) throw new Misuse("a time is an RFC 3339 string");
            Long t = Codec.parseLooseTime((String) v);
            if (t == null) throw new Misuse("'" + v + "' is not an RFC 3339 time");
            return t;
        }

        @SuppressWarnings("unchecked")
        private Map<String, Object> configure(Map<String, Object> r) throws Misuse {
            if (client != null) client.close(2000);
            if (runner != null) runner.close();
            runner = null;
            String registry = str(r, "registry");
            File cache = new File(str(r, "cache_dir"));
            unit = str(r, "unit");
            Map<String, Object> d = object(r, "device");
            DeviceFacts.Builder facts = DeviceFacts.builder(str(d, "device_id"))
                    .ramMb(num(d.get("ram_mb"), 0))
                    .cpuCores((int) num(d.get("cpu_cores"), 1))
                    .soc(opt(d, "soc"))
                    .os(opt(d, "os"), opt(d, "os_version"))
                    .mnnRuntime(opt(d, "mnn_runtime"))
                    .appVersion(opt(r, "app_version"));
            // Absent or null: the SDK's own default (read from the platform); a list says them.
            Object features = r.get("cpu_features");
            if (features instanceof List) {
                List<String> names = new java.util.ArrayList<String>();
                for (Object f : (List<Object>) features) {
                    if (!(f instanceof String)) throw new Misuse("cpu_features is a list of names");
                    names.add((String) f);
                }
                facts.cpuFeatures(names);
            } else if (features != null && features != Json.NULL) {
                throw new Misuse("cpu_features is a list of names or null");
            }
            Object budget = r.get("memory_budget_mb");
            if (budget instanceof Json.Num) facts.memoryBudgetMb(((Json.Num) budget).doubleValue());
            else if (budget != null && budget != Json.NULL) throw new Misuse("memory_budget_mb is a number or null");
            EdgeregClient.Builder b = EdgeregClient.builder(registry, cache).device(facts.build());
            Object keys = r.get("trusted_keys");
            if (!(keys instanceof List)) throw new Misuse("configure needs 'trusted_keys'");
            for (Object k : (List<Object>) keys) b.trustedKey((String) k);
            if (Boolean.TRUE.equals(r.get("bundle"))) b.bundle(unit);
            else b.model(unit);
            if (r.get("tier") instanceof String) b.tier((String) r.get("tier"));
            else if (r.get("tiers") instanceof List) {
                // The tiers array of a tier file (docs/protocol.md section 5).
                Map<String, Object> file = new LinkedHashMap<String, Object>();
                file.put("schema_version", 1L);
                file.put("tiers", r.get("tiers"));
                try {
                    b.tiers(Tiers.fromJson(Json.orderedString(file)));
                } catch (IllegalArgumentException e) {
                    throw new Misuse("bad tiers: " + e.getMessage());
                }
            }
            else throw new Misuse("configure needs 'tier' or 'tiers'");
            b.selfTest(Boolean.TRUE.equals(r.get("self_test")));
            if (r.get("runner") instanceof Map) {
                Object cmd = ((Map<String, Object>) r.get("runner")).get("command");
                if (!(cmd instanceof List)) throw new Misuse("runner needs 'command'");
                List<String> command = new java.util.ArrayList<String>();
                for (Object c : (List<Object>) cmd) command.add((String) c);
                // The MNN APIs the runner calls (fit rule (f)); hostrunner.py's default is the Module API.
                Object apis = ((Map<String, Object>) r.get("runner")).get("mnn_apis");
                java.util.Set<String> said = new java.util.TreeSet<String>();
                if (apis instanceof List) for (Object a : (List<Object>) apis) said.add((String) a);
                else said.add("module");
                runner = new HostRunner(command, said);
                b.runner(runner);
            }
            b.reporting(!Boolean.FALSE.equals(r.get("reporting")), opt(r, "device_class"));
            if (r.get("max_unconfirmed_starts") instanceof Json.Num) b.maxUnconfirmedStarts((int) num(r.get("max_unconfirmed_starts"), 3));
            if (r.get("policy") instanceof Map) {
                Map<String, Object> p = (Map<String, Object>) r.get("policy");
                b.policy(new DownloadPolicy(!Boolean.FALSE.equals(p.get("allow_metered")), Boolean.TRUE.equals(p.get("require_charging")),
                        Boolean.TRUE.equals(p.get("require_idle")), Boolean.TRUE.equals(p.get("require_storage_not_low")),
                        num(p.get("reserve_bytes"), 8L * 1024 * 1024)));
            }
            b.limits((int) (dbl(r.get("timeout_s"), 30) * 1000), (long) (dbl(r.get("deadline_s"), 600) * 1000), num(r.get("min_rate"), 1024));
            if (r.get("bundled") instanceof Map) {
                Map<String, Object> s = (Map<String, Object>) r.get("bundled");
                b.bundled(unit, BundledRelease.fromFiles(new File(str(s, "manifest")), new File(str(s, "blobs_dir"))));
            }
            if (r.get("source_address") instanceof String) {
                // Each simulated device leaves from its own address, through the test transport.
                try {
                    b.transport(new dev.edgereg.internal.RawHttp(java.net.InetAddress.getByName((String) r.get("source_address"))));
                } catch (java.net.UnknownHostException e) {
                    throw new Misuse("source_address is not an address: " + r.get("source_address"));
                }
            }
            fixedNow = time(r.get("now"));
            b.clock(new EdgeregClient.Clock() {
                @Override public long nowSeconds() {
                    Long n = fixedNow;
                    return n != null ? n : System.currentTimeMillis() / 1000L;
                }
            });
            try {
                client = b.build();
            } catch (IllegalArgumentException | IllegalStateException e) {
                throw new Misuse("the client refused the configuration: " + e.getMessage());
            }
            client.addListener(new ModelListener() {
                @Override public void onChange(ModelChange change) {
                    synchronized (events) {
                        events.add(change);
                    }
                }
            });
            Map<String, Object> out = new LinkedHashMap<String, Object>();
            out.put("tier", client.tier());
            out.put("tier_reason", client.tierReason());
            return out;
        }

        static Map<String, Object> resultJson(UpdateResult r) {
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            m.put("ok", r.ok());
            m.put("error_code", nul(r.errorCode));
            m.put("error", nul(r.errorMessage));
            m.put("version", nul(r.version));
            m.put("is_candidate", r.isCandidate);
            m.put("updated", r.updated);
            m.put("not_modified", r.notModified);
            m.put("runtime_fallback", r.fallback != null);
            m.put("fallback", nul(r.fallback));
            m.put("substitute", nul(r.substitute));
            m.put("deferred", nul(r.deferred));
            m.put("bundled", r.bundled);
            m.put("downloaded_bytes", r.downloadedBytes);
            Map<String, Object> members = new LinkedHashMap<String, Object>();
            for (Map.Entry<String, InstalledModel> e : r.members.entrySet()) {
                InstalledModel im = e.getValue();
                Map<String, Object> mm = new LinkedHashMap<String, Object>();
                mm.put("version", im.version);
                mm.put("variant", im.variant);
                mm.put("sha256", im.sha256);
                mm.put("path", im.file.getAbsolutePath());
                mm.put("backend", nul(im.backend));
                members.put(e.getKey(), mm);
            }
            m.put("members", members);
            return m;
        }

        static Map<String, Object> statusJson(Status s) {
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            m.put("installed", installedJson(s.installed));
            m.put("last_good", installedJson(s.lastGood));
            if (s.pending == null) {
                m.put("pending", Json.NULL);
            } else {
                Map<String, Object> p = new LinkedHashMap<String, Object>();
                p.put("version", s.pending.version);
                p.put("is_candidate", s.pending.isCandidate);
                p.put("deferred", nul(s.pending.deferred));
                p.put("total_bytes", s.pending.totalBytes);
                p.put("remaining_bytes", s.pending.remainingBytes);
                m.put("pending", p);
            }
            m.put("last_error_code", nul(s.lastErrorCode));
            List<String> sorted = new java.util.ArrayList<String>(s.refused);
            java.util.Collections.sort(sorted);
            m.put("refused", new java.util.ArrayList<Object>(sorted));
            m.put("ready", s.ready);
            return m;
        }

        static Object installedJson(Status.Installed i) {
            if (i == null) return Json.NULL;
            Map<String, Object> m = new LinkedHashMap<String, Object>();
            m.put("version", i.version);
            Map<String, Object> members = new LinkedHashMap<String, Object>();
            for (Map.Entry<String, String[]> e : i.members.entrySet()) {
                Map<String, Object> mm = new LinkedHashMap<String, Object>();
                mm.put("version", e.getValue()[0]);
                mm.put("sha256", e.getValue()[1]);
                members.put(e.getKey(), mm);
            }
            m.put("members", members);
            return m;
        }

        static Object nul(Object v) { return v == null ? Json.NULL : v; }

        void close() {
            if (background != null && client != null) {
                client.cancel(unit);
                try {
                    background.join(10000);
                } catch (InterruptedException e) {
                    // exiting anyway
                }
            }
            if (client != null) client.close(5000);
            if (runner != null) runner.close();
        }

        @SuppressWarnings("unchecked")
        static Map<String, Object> object(Map<String, Object> request, String key) throws Misuse {
            Object v = request.get(key);
            if (!(v instanceof Map)) throw new Misuse("missing object '" + key + "'");
            return (Map<String, Object>) v;
        }

        static String str(Map<String, Object> m, String key) throws Misuse {
            Object v = m.get(key);
            if (!(v instanceof String)) throw new Misuse("missing string '" + key + "'");
            return (String) v;
        }

        static String opt(Map<String, Object> m, String key) {
            Object v = m.get(key);
            return v instanceof String ? (String) v : null;
        }

        static long num(Object v, long dflt) {
            return v instanceof Json.Num && ((Json.Num) v).longValue() != null ? ((Json.Num) v).longValue() : dflt;
        }

        static double dbl(Object v, double dflt) {
            return v instanceof Json.Num ? ((Json.Num) v).doubleValue() : dflt;
        }
    }
}
