package dev.edgereg;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Http;
import dev.edgereg.internal.Json;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Device reports (docs/protocol.md section 11): sent on one background thread with a 5 s timeout,
 * one more try for a network error, 408, 429 or 5xx, then dropped; a 4xx is dropped at once.
 * Never a reason to fail, delay or retry an update. The latest report per (token, model) is
 * kept in reports.json in the cache (with the reports waiting for their one more try), so a
 * confirmation in the app process resends what a background install reported, flag set.
 */
final class Reporter {
    static final int TIMEOUT_MS = 5000;
    private static final SecureRandom RANDOM = new SecureRandom();

    private final boolean enabled;
    private final String registry;
    private final DeviceFacts device;
    private final String deviceClass;
    /** The coarse CPU class (docs/protocol.md section 11), never the features; null when they were not said. */
    private final String cpuClass;
    private final ExecutorService executor;
    private final Map<String, Map<String, Object>> latest = new LinkedHashMap<String, Map<String, Object>>();
    private final Map<String, String> urls = new LinkedHashMap<String, String>();
    private final List<Object[]> retry = new ArrayList<Object[]>();
    private final Map<String, List<Double>> latency = new LinkedHashMap<String, List<Double>>();
    private final AtomicInteger sent = new AtomicInteger();
    private final AtomicInteger produced = new AtomicInteger();

    private final Transport transport;

    static final int KEPT = 64;
    private final dev.edgereg.internal.Store store;

    Reporter(boolean enabled, String registry, DeviceFacts device, String deviceClass, String cpuClass, Transport transport,
            dev.edgereg.internal.Store store) {
        this.cpuClass = cpuClass;
        this.transport = transport;
        this.store = store;
        this.enabled = enabled;
        this.registry = registry.endsWith("/") ? registry : registry + "/";
        this.device = device;
        this.deviceClass = deviceClass;
        this.executor = enabled ? Executors.newSingleThreadExecutor(new ThreadFactory() {
            @Override public Thread newThread(Runnable r) {
                Thread t = new Thread(r, "edgereg-reports");
                t.setDaemon(true);
                return t;
            }
        }) : null;
        if (enabled) load();
    }

    private java.io.File file() { return new java.io.File(store.root, "reports.json"); }

    @SuppressWarnings("unchecked")
    private synchronized void load() {
        Map<String, Object> m = store.readLenient(file());
        if (m == null) return;
        if (m.get("latest") instanceof Map) {
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("latest")).entrySet()) {
                if (!(e.getValue() instanceof Map)) continue;
                Map<String, Object> v = (Map<String, Object>) e.getValue();
                if (v.get("url") instanceof String && v.get("report") instanceof Map) {
                    urls.put(e.getKey(), (String) v.get("url"));
                    latest.put(e.getKey(), (Map<String, Object>) v.get("report"));
                }
            }
        }
        if (m.get("retry") instanceof List) {
            for (Object o : (List<Object>) m.get("retry")) {
                if (!(o instanceof Map)) continue;
                Map<String, Object> r = (Map<String, Object>) o;
                byte[] body = r.get("body") instanceof String ? Codec.base64Decode((String) r.get("body")) : null;
                if (r.get("url") instanceof String && body != null) retry.add(new Object[] {r.get("url"), body});
            }
        }
    }

    /** Called with this locked. Best effort: a report is never a reason to fail anything. */
    private void save() {
        while (latest.size() > KEPT) {
            String oldest = latest.keySet().iterator().next();
            latest.remove(oldest);
            urls.remove(oldest);
        }
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        Map<String, Object> l = new LinkedHashMap<String, Object>();
        for (Map.Entry<String, Map<String, Object>> e : latest.entrySet()) {
            Map<String, Object> v = new LinkedHashMap<String, Object>();
            v.put("url", urls.get(e.getKey()));
            v.put("report", e.getValue());
            l.put(e.getKey(), v);
        }
        m.put("latest", l);
        List<Object> r = new ArrayList<Object>();
        for (Object[] x : retry) {
            Map<String, Object> v = new LinkedHashMap<String, Object>();
            v.put("url", x[0]);
            v.put("body", Codec.base64((byte[]) x[1]));
            r.add(v);
        }
        m.put("retry", r);
        try {
            store.write(file(), m);
        } catch (dev.edgereg.internal.Rejected | RuntimeException e) {
            // the report stays in memory; the disk copy is best effort
        }
    }

    boolean enabled() { return enabled; }

    static String newToken() {
        byte[] b = new byte[16];
        RANDOM.nextBytes(b);
        return Codec.hex(b);
    }

    String resolve(String reportUrl) {
        if (reportUrl.startsWith("http://") || reportUrl.startsWith("https://")) return reportUrl;
        return registry + reportUrl;
    }

    /**
     * A member's first report after an install, or after a rejection ({@code installed} false).
     * Only an install's report becomes the latest that a confirmation or a revert resends: the
     * reference client also stores the rejection's, so confirming the model still installed
     * would flag the rejected version's report.
     */
    synchronized void installed(String reportUrl, Map<String, Object> report, boolean installed) {
        if (!enabled || reportUrl == null) return;
        String model = (String) report.get("model");
        String url = resolve(reportUrl);
        if (!installed) {
            versioned(report);
            final byte[] body = Json.canonical(report);
            produced.incrementAndGet();
            final String to = url;
            executor.execute(new Runnable() {
                @Override public void run() {
                    deliver(to, body, true);
                }
            });
            return;
        }
        String key = report.get("unit") + "/" + model;
        // A new install: its first inference is the next one recorded.
        firstSeen.remove(model);
        first.remove(model);
        report.put("inference", takeLatency(model));
        latest.remove(key);
        latest.put(key, report);
        urls.put(key, url);
        send(key);
        save();
    }

    /** Report again with a flag set (confirmed, reverted) and the latency measured since the last report. */
    synchronized void flag(String unit, String model, String flag) {
        if (!enabled) return;
        String key = unit + "/" + model;
        Map<String, Object> r = latest.get(key);
        if (r == null) return;
        r.put(flag, true);
        r.put("inference", takeLatency(model));
        send(key);
        save();
    }

    /**
     * Report again: the app started with the model installed and not yet confirmed, for the
     * {@code starts}-th time; sent at each start that raises the count, so a crash loop shows
     * before the revert (docs/protocol.md section 11).
     */
    synchronized void unconfirmed(String unit, String model, long starts) {
        if (!enabled) return;
        String key = unit + "/" + model;
        Map<String, Object> r = latest.get(key);
        if (r == null) return;
        r.put("unconfirmed_starts", Math.max(0, Math.min(1000, starts)));
        r.put("inference", takeLatency(model));
        send(key);
        save();
    }

    /**
     * Report again with the memory the app measured for {@code model} (MiB; null: not measured),
     * kept in the later reports of the install. A figure outside 0 to 1048576 or not finite is
     * dropped, never sent. Returns how many installs' reports took it.
     */
    synchronized int memory(String model, Double peakMb, Double steadyMb) {
        if (!enabled) return 0;
        Map<String, Object> changes = new LinkedHashMap<String, Object>();
        if (peakMb != null && peakMb >= 0 && peakMb <= dev.edgereg.internal.Wire.MAX_MEMORY_MB) changes.put("memory_peak_mb", round3(peakMb));
        if (steadyMb != null && steadyMb >= 0 && steadyMb <= dev.edgereg.internal.Wire.MAX_MEMORY_MB) changes.put("memory_steady_mb", round3(steadyMb));
        if (changes.isEmpty()) return 0;
        int n = 0;
        for (Map.Entry<String, Map<String, Object>> e : new ArrayList<Map.Entry<String, Map<String, Object>>>(latest.entrySet())) {
            if (!model.equals(e.getValue().get("model"))) continue;
            e.getValue().putAll(changes);
            e.getValue().put("inference", takeLatency(model));
            send(e.getKey());
            n++;
        }
        if (n > 0) save();
        return n;
    }

    static double round3(double v) {
        return Math.round(v * 1000.0) / 1000.0;
    }

    private static final int SAMPLES_KEPT = 2048;
    private final java.util.Random random = new java.util.Random();
    private final Map<String, long[]> seen = new LinkedHashMap<String, long[]>();
    /**
     * The first call recorded per model since its install (or since this process started), until
     * a report carries it as first_inference_ms; and the models whose first call was seen.
     */
    private final Map<String, Double> first = new LinkedHashMap<String, Double>();
    private final java.util.Set<String> firstSeen = new java.util.HashSet<String>();

    synchronized void recordInference(String model, double ms) {
        if (!enabled || Double.isNaN(ms) || ms < 0 || ms > 3600000) return;
        if (firstSeen.add(model)) first.put(model, round3(ms));
        List<Double> l = latency.get(model);
        if (l == null) latency.put(model, l = new ArrayList<Double>());
        long[] n = seen.get(model);
        if (n == null) seen.put(model, n = new long[1]);
        n[0]++;
        if (l.size() < SAMPLES_KEPT) {
            l.add(ms);
        } else {
            // Reservoir sampling: every call so far equally likely to be kept.
            long slot = (long) (random.nextDouble() * n[0]);
            if (slot < SAMPLES_KEPT) l.set((int) slot, ms);
        }
    }

    /** The latency measured since the last report of {@code model} (and forget it), or JSON null. */
    private Object takeLatency(String model) {
        List<Double> l = latency.remove(model);
        seen.remove(model);
        if (l == null || l.isEmpty()) return Json.NULL;
        double[] v = new double[l.size()];
        for (int i = 0; i < v.length; i++) v[i] = l.get(i);
        Arrays.sort(v);
        Map<String, Object> inf = new LinkedHashMap<String, Object>();
        inf.put("count", (long) v.length);
        inf.put("p50_ms", pct(v, 50));
        inf.put("p90_ms", pct(v, 90));
        inf.put("p99_ms", pct(v, 99));
        return inf;
    }

    /** Report again with the latency recorded since the last report (a periodic send). */
    synchronized void summary(String unit, String model) {
        if (!enabled) return;
        String key = unit + "/" + model;
        Map<String, Object> r = latest.get(key);
        if (r == null) return;
        r.put("inference", takeLatency(model));
        send(key);
        save();
    }

    /** Nearest rank, rounded to the microsecond as the reference does. */
    static double pct(double[] sorted, int p) {
        int i = (int) Math.ceil(p * (double) sorted.length / 100.0) - 1;
        return Math.round(sorted[Math.max(0, Math.min(sorted.length - 1, i))] * 1000.0) / 1000.0;
    }

    private void send(final String key) {
        produced.incrementAndGet();
        Map<String, Object> report = latest.get(key);
        Object model = report.get("model");
        if (!report.containsKey("first_inference_ms") && first.containsKey(model)) report.put("first_inference_ms", first.remove(model));
        versioned(report);
        final byte[] body = Json.canonical(new LinkedHashMap<String, Object>(report));
        final String url = urls.get(key);
        executor.execute(new Runnable() {
            @Override public void run() {
                deliver(url, body, true);
            }
        });
    }

    private void deliver(String url, byte[] body, boolean keepOnFailure) {
        int status = Http.post(url, body, TIMEOUT_MS, transport);
        if (status >= 200 && status < 300) {
            sent.incrementAndGet();
        } else if (keepOnFailure && (status == -1 || status == 408 || status == 429 || status >= 500)) {
            synchronized (this) {
                // The latest report of a token and model is the one that counts: keep only it.
                String id = identity(body);
                for (java.util.Iterator<Object[]> it = retry.iterator(); it.hasNext();) {
                    if (id.equals(identity((byte[]) it.next()[1]))) it.remove();
                }
                retry.add(new Object[] {url, body});
                while (retry.size() > 16) retry.remove(0);
                save();
            }
        }
    }

    @SuppressWarnings("unchecked")
    private static String identity(byte[] body) {
        try {
            Map<String, Object> m = (Map<String, Object>) Json.parse(body);
            return m.get("token") + "/" + m.get("model");
        } catch (Json.JsonException | RuntimeException e) {
            return "";
        }
    }

    /** Give the reports that failed once their one more try (at the next update). */
    synchronized void retryPending() {
        if (!enabled || retry.isEmpty()) return;
        final List<Object[]> again = new ArrayList<Object[]>(retry);
        retry.clear();
        save();
        executor.execute(new Runnable() {
            @Override public void run() {
                for (Object[] r : again) deliver((String) r[0], (byte[]) r[1], false);
            }
        });
    }

    /** Wait (bounded) for reports in flight; returns how many reports were made (handed to the sender) since the last call. */
    int flush(long timeoutMs) {
        if (!enabled) return 0;
        final Object done = new Object();
        final boolean[] finished = {false};
        executor.execute(new Runnable() {
            @Override public void run() {
                synchronized (done) {
                    finished[0] = true;
                    done.notifyAll();
                }
            }
        });
        long until = System.currentTimeMillis() + timeoutMs;
        synchronized (done) {
            while (!finished[0] && System.currentTimeMillis() < until) {
                try {
                    done.wait(Math.max(1, until - System.currentTimeMillis()));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
        }
        sent.set(0);
        return produced.getAndSet(0);
    }

    void close(long timeoutMs) {
        if (!enabled) return;
        executor.shutdown();
        try {
            executor.awaitTermination(timeoutMs, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** The report of one member (docs/protocol.md section 11; the schema of edgereg/protocol/reports.py). */
    Map<String, Object> report(String token, String unit, String model, String version, String unitVersion, String variant,
            String tier, boolean candidate, long sequence, String probe, String backend, List<String> skipped, Double loadMs,
            boolean loadFailed) {
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("schema_version", 1L);
        r.put("token", token);
        r.put("unit", unit);
        r.put("model", model);
        r.put("version", version);
        r.put("unit_version", unitVersion);
        r.put("variant", variant);
        r.put("tier", tier);
        r.put("arm", candidate ? "candidate" : "stable");
        r.put("sequence", sequence);
        r.put("probe", probe);
        r.put("backend", backend == null ? Json.NULL : backend);
        r.put("backends_skipped", new ArrayList<Object>(skipped.subList(0, Math.min(8, skipped.size()))));
        r.put("load_ms", loadMs == null ? Json.NULL : (Object) Math.max(0.0, Math.min(3600000.0, loadMs)));
        r.put("load_failed", loadFailed);
        r.put("inference", Json.NULL);
        r.put("confirmed", false);
        r.put("reverted", false);
        r.put("mnn_runtime", device.mnnRuntime == null ? Json.NULL : device.mnnRuntime);
        r.put("os", "android".equals(device.os) || "ios".equals(device.os) ? device.os : Json.NULL);
        r.put("os_version", device.osVersion != null && device.osVersion.matches("[A-Za-z0-9._ -]{1,32}") ? device.osVersion : Json.NULL);
        r.put("device_class", deviceClass != null && deviceClass.matches("[A-Za-z0-9._ -]{1,32}") ? deviceClass : Json.NULL);
        if (cpuClass != null) r.put("cpu_class", cpuClass);
        return versioned(r);
    }

    /**
     * The schema version a report's keys need: 2 once it sets a key of version 2, else 1, so a
     * report that uses nothing new is byte for byte a version 1 report (docs/protocol.md section 12).
     * A version 2 key is left off while unset, never sent as null.
     */
    static Map<String, Object> versioned(Map<String, Object> r) {
        boolean v2 = false;
        for (String k : dev.edgereg.internal.ReportCheck.V2_KEYS) {
            if (r.get(k) == Json.NULL) r.remove(k);
            v2 |= r.containsKey(k);
        }
        r.put("schema_version", v2 ? 2L : 1L);
        return r;
    }
}
