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
 * Device reports (docs/protocol.md section 11), sent on one background thread with a 5 s timeout,
 * one at a time in the order they were made; never a reason to fail, delay or retry an update.
 *
 * <p>The reports the client made are kept per (unit, model, unit version) in reports.json in the
 * cache: the installed release's, which a confirmation, a start, a memory figure or a periodic
 * send reports again (also from another process), and those of releases refused here (rejected
 * by the self-test, or reverted), which each later rollout period reports again with
 * {@code inference} null. A report not delivered (no answer, 408, 429, 5xx) is kept too and sent
 * again at each update check until it is delivered, a newer report of the same (token, model)
 * replaces it, or {@link #TRIES} tries were answered with 408, 429 or 5xx (a try with no answer
 * does not count); at most {@link #UNDELIVERED} wait, the oldest go first; any other 4xx is a
 * refusal, dropped at once.
 */
final class Reporter {
    static final int TIMEOUT_MS = 5000;
    /** Reports waiting for delivery at most; the oldest go first. */
    static final int UNDELIVERED = 16;
    /** Tries answered with 408, 429 or 5xx after which an undelivered report is dropped. */
    static final int TRIES = 5;
    private static final SecureRandom RANDOM = new SecureRandom();

    private final boolean enabled;
    private final String registry;
    private final DeviceFacts device;
    private final String deviceClass;
    /** The coarse CPU class (docs/protocol.md section 11), never the features; null when they were not said. */
    private final String cpuClass;
    private final ExecutorService executor;
    /** The reports made, per unit/model/unit version, least recently made first. */
    private final Map<String, Made> made = new LinkedHashMap<String, Made>();
    /** unit/model: the key in {@link #made} of the installed release's report. */
    private final Map<String, String> installedKeys = new LinkedHashMap<String, String>();
    /** Reports not delivered yet, oldest first. */
    private final List<Undelivered> undelivered = new ArrayList<Undelivered>();
    /** Serials of the sends queued on the executor and not finished. */
    private final java.util.Set<Long> inFlight = new java.util.HashSet<Long>();
    /** token/model: the serial of the newest report made in this process. */
    private final Map<String, Long> newest = new java.util.HashMap<String, Long>();
    private long serial;
    private final Map<String, List<Double>> latency = new LinkedHashMap<String, List<Double>>();
    private final AtomicInteger sent = new AtomicInteger();
    private final AtomicInteger produced = new AtomicInteger();

    private final Transport transport;
    /** The app metrics counted per install (null when reporting is off: nothing is counted). */
    private final MetricCounts counts;
    private final EdgeregClient.Clock clock;

    /** Reports kept per unit/model/unit version (those of installed releases are never dropped). */
    static final int KEPT = 64;
    private final dev.edgereg.internal.Store store;

    /** A report made, kept to be made again: where it goes and whether its release was refused here. */
    static final class Made {
        String url;
        final Map<String, Object> report;
        boolean refused;
        /** When it was last made (the client's clock, epoch seconds; 0: before this was kept). */
        long madeAt;

        Made(String url, Map<String, Object> report, boolean refused) {
            this.url = url;
            this.report = report;
            this.refused = refused;
        }
    }

    /** One report's bytes on their way; identity equality: the same send, tried again. */
    static final class Undelivered {
        final String url;
        final byte[] body;
        final String identity;
        final long serial;
        int tries;
        /** In {@link #undelivered}: a try failed before. */
        boolean kept;

        Undelivered(String url, byte[] body, String identity, long serial, int tries) {
            this.url = url;
            this.body = body;
            this.identity = identity;
            this.serial = serial;
            this.tries = tries;
        }
    }

    Reporter(boolean enabled, String registry, DeviceFacts device, String deviceClass, String cpuClass, Transport transport,
            dev.edgereg.internal.Store store, EdgeregClient.Clock clock) {
        this.clock = clock;
        this.counts = enabled ? new MetricCounts(store) : null;
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

    static String key(String unit, String model, String unitVersion) { return unit + "/" + model + "/" + unitVersion; }

    @SuppressWarnings("unchecked")
    private synchronized void load() {
        Map<String, Object> m = store.readLenient(file());
        if (m == null) return;
        if (m.get("reports") instanceof Map) {
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("reports")).entrySet()) {
                if (!(e.getValue() instanceof Map)) continue;
                Map<String, Object> v = (Map<String, Object>) e.getValue();
                if (v.get("url") instanceof String && v.get("report") instanceof Map) {
                    Made r = new Made((String) v.get("url"), (Map<String, Object>) v.get("report"), Boolean.TRUE.equals(v.get("refused")));
                    r.madeAt = Health.num(v.get("made_at"));
                    made.put(e.getKey(), r);
                }
            }
        }
        if (m.get("installed") instanceof Map) {
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("installed")).entrySet()) {
                if (e.getValue() instanceof String && made.containsKey(e.getValue())) installedKeys.put(e.getKey(), (String) e.getValue());
            }
        }
        if (m.get("latest") instanceof Map) {
            // Written by an SDK before 0.3: the installed releases' reports, per unit/model.
            for (Map.Entry<String, Object> e : ((Map<String, Object>) m.get("latest")).entrySet()) {
                if (!(e.getValue() instanceof Map)) continue;
                Map<String, Object> v = (Map<String, Object>) e.getValue();
                if (!(v.get("url") instanceof String && v.get("report") instanceof Map)) continue;
                Map<String, Object> r = (Map<String, Object>) v.get("report");
                String key = key(String.valueOf(r.get("unit")), String.valueOf(r.get("model")), String.valueOf(r.get("unit_version")));
                made.put(key, new Made((String) v.get("url"), r, false));
                installedKeys.put(e.getKey(), key);
            }
        }
        Object waiting = m.containsKey("undelivered") ? m.get("undelivered") : m.get("retry");
        if (waiting instanceof List) {
            for (Object o : (List<Object>) waiting) {
                if (!(o instanceof Map)) continue;
                Map<String, Object> r = (Map<String, Object>) o;
                byte[] body = r.get("body") instanceof String ? Codec.base64Decode((String) r.get("body")) : null;
                if (!(r.get("url") instanceof String) || body == null) continue;
                Undelivered u = new Undelivered((String) r.get("url"), body, identity(body), ++serial, (int) Health.num(r.get("tries")));
                u.kept = true;
                undelivered.add(u);
            }
        }
    }

    /** Called with this locked. Best effort: a report is never a reason to fail anything. */
    private void save() {
        for (java.util.Iterator<Map.Entry<String, Made>> it = made.entrySet().iterator(); made.size() > KEPT && it.hasNext();) {
            if (!installedKeys.containsValue(it.next().getKey())) it.remove();
        }
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        Map<String, Object> reports = new LinkedHashMap<String, Object>();
        for (Map.Entry<String, Made> e : made.entrySet()) {
            Map<String, Object> v = new LinkedHashMap<String, Object>();
            v.put("url", e.getValue().url);
            v.put("report", e.getValue().report);
            v.put("refused", e.getValue().refused);
            v.put("made_at", e.getValue().madeAt);
            reports.put(e.getKey(), v);
        }
        m.put("reports", reports);
        m.put("installed", new LinkedHashMap<String, Object>(installedKeys));
        List<Object> r = new ArrayList<Object>();
        for (Undelivered u : undelivered) {
            Map<String, Object> v = new LinkedHashMap<String, Object>();
            v.put("url", u.url);
            v.put("body", Codec.base64(u.body));
            v.put("tries", (long) u.tries);
            r.add(v);
        }
        m.put("undelivered", r);
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

    /** The installed release's report of a unit's model, or null. Called with this locked. */
    private Made installedReport(String unit, String model) {
        String key = installedKeys.get(unit + "/" + model);
        return key == null ? null : made.get(key);
    }

    /** Kept as the most recently made (the last to be dropped). Called with this locked. */
    private void touch(String key) {
        Made m = made.remove(key);
        if (m != null) made.put(key, m);
    }

    /**
     * A member's first report after an install, or after a rejection ({@code installed} false).
     * An install's report becomes the one a confirmation, a start or a periodic send reports
     * again; a rejection's is kept for the later rollout periods, with {@code inference} null
     * (the calls ran on the release still installed).
     */
    synchronized void installed(String reportUrl, Map<String, Object> report, boolean installed) {
        if (!enabled || reportUrl == null) return;
        String unit = (String) report.get("unit");
        String model = (String) report.get("model");
        String key = key(unit, model, (String) report.get("unit_version"));
        if (installed) {
            // A new install: its first inference is the next one recorded.
            firstSeen.remove(model);
            first.remove(model);
            report.put("inference", takeLatency(model));
            installedKeys.put(unit + "/" + model, key);
        } else {
            report.put("inference", Json.NULL);
        }
        made.remove(key);
        made.put(key, new Made(resolve(reportUrl), report, !installed));
        send(key);
        save();
    }

    /** Report again with a flag set (confirmed) and the latency measured since the last report. */
    synchronized void flag(String unit, String model, String flag) {
        if (!enabled) return;
        Made m = installedReport(unit, model);
        if (m == null) return;
        m.report.put(flag, true);
        m.report.put("inference", takeLatency(model));
        send(installedKeys.get(unit + "/" + model));
        save();
    }

    /**
     * Report again: the installed release of a unit's model was reverted ({@code to}: the unit
     * version now installed, or null). The revert's report carries the calls recorded since the
     * last report (they ran on it); its later reports carry none: the calls after the switch run
     * on the release it went back to, whose report (when one is kept) takes them.
     */
    synchronized void reverted(String unit, String model, String to) {
        if (!enabled) return;
        String key = installedKeys.remove(unit + "/" + model);
        Made m = key == null ? null : made.get(key);
        if (m == null) return;
        m.report.put("reverted", true);
        m.report.put("inference", takeLatency(model));
        send(key);
        m.refused = true;
        first.remove(model);
        String back = to == null ? null : key(unit, model, to);
        if (back != null && made.containsKey(back) && !made.get(back).refused) installedKeys.put(unit + "/" + model, back);
        save();
    }

    /**
     * The report of a new rollout period (docs/protocol.md section 11): {@code unitVersion} is the
     * release the manifest of {@code sequence} gives this device, before the client's own
     * refusals. When this device made a report of it at a lower sequence, and that release is
     * installed or was refused here, the report goes again with the new sequence and arm; a
     * refused one with {@code inference} null. Returns whether one was made.
     */
    synchronized boolean period(String reportUrl, String unit, String model, String unitVersion, boolean candidate, long sequence) {
        if (!enabled || reportUrl == null) return false;
        String key = key(unit, model, unitVersion);
        Made m = made.get(key);
        if (m == null) return false;
        boolean installed = key.equals(installedKeys.get(unit + "/" + model));
        // Neither installed nor refused (a download deferred, an install under way): the
        // install sends its own report.
        if (!installed && !m.refused) return false;
        if (Health.num(m.report.get("sequence")) >= sequence) return false;
        m.url = resolve(reportUrl);
        m.report.put("sequence", sequence);
        m.report.put("arm", candidate ? "candidate" : "stable");
        m.report.put("inference", m.refused ? Json.NULL : takeLatency(model));
        touch(key);
        send(key);
        save();
        return true;
    }

    /**
     * Report again: the app started with the model installed and not yet confirmed, for the
     * {@code starts}-th time; sent at each start that raises the count, so a crash loop shows
     * before the revert (docs/protocol.md section 11).
     */
    synchronized void unconfirmed(String unit, String model, long starts) {
        if (!enabled) return;
        Made m = installedReport(unit, model);
        if (m == null) return;
        m.report.put("unconfirmed_starts", Math.max(0, Math.min(1000, starts)));
        m.report.put("inference", takeLatency(model));
        send(installedKeys.get(unit + "/" + model));
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
        for (String key : new ArrayList<String>(installedKeys.values())) {
            Made m = made.get(key);
            if (m == null || !model.equals(m.report.get("model"))) continue;
            m.report.putAll(changes);
            m.report.put("inference", takeLatency(model));
            send(key);
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

    /**
     * Count one outcome of an app metric for the install of {@code token} (docs/protocol.md
     * section 11): {@code value} is 1 or 0 for a rate (succeeded or not), the bucket for a
     * distribution. Returns false when nothing was counted (reporting off, no install token).
     */
    boolean count(String token, AppMetric metric, int value) {
        if (!enabled || token == null) return false;
        counts.count(token, metric, value);
        return true;
    }

    /** An install's counts go again with its reports when they changed and its last report is this old (seconds). */
    static final long METRICS_RESEND_S = 12 * 3600;

    /**
     * Whether the install of {@code token} has counts its last report lacks, and that report was
     * made 12 hours ago or more (docs/protocol.md section 11): at most twice a day.
     */
    synchronized boolean metricsDue(String token) {
        if (!enabled || token == null || !counts.changed(token)) return false;
        long last = -1;
        for (Made m : made.values()) {
            if (!m.refused && token.equals(m.report.get("token"))) last = Math.max(last, m.madeAt);
        }
        return last >= 0 && clock.nowSeconds() - last >= METRICS_RESEND_S;
    }

    /** Report again with the latency recorded since the last report (a periodic send). */
    synchronized void summary(String unit, String model) {
        if (!enabled) return;
        Made m = installedReport(unit, model);
        if (m == null) return;
        m.report.put("inference", takeLatency(model));
        send(installedKeys.get(unit + "/" + model));
        save();
    }

    /** Nearest rank, rounded to the microsecond as the reference does. */
    static double pct(double[] sorted, int p) {
        int i = (int) Math.ceil(p * (double) sorted.length / 100.0) - 1;
        return Math.round(sorted[Math.max(0, Math.min(sorted.length - 1, i))] * 1000.0) / 1000.0;
    }

    /**
     * Hand the report kept under {@code key} to the sender, as it is now. A newer report of the
     * same (token, model) replaces one still waiting for delivery. Called with this locked.
     */
    private void send(String key) {
        Made m = made.get(key);
        Map<String, Object> report = m.report;
        Object model = report.get("model");
        if (!m.refused && !report.containsKey("first_inference_ms") && first.containsKey(model)) report.put("first_inference_ms", first.remove(model));
        if (!m.refused) {
            // The install's app metrics so far; a refused release's report keeps those it had.
            String token = (String) report.get("token");
            Map<String, Object> totals = counts.totals(token);
            if (totals != null) report.put("metrics", totals);
            counts.reported(token);
        }
        m.madeAt = clock.nowSeconds();
        byte[] body;
        try {
            versioned(report);
            body = Json.canonical(new LinkedHashMap<String, Object>(report));
        } catch (RuntimeException e) {
            return; // never into the app
        }
        produced.incrementAndGet();
        String id = report.get("token") + "/" + model;
        long s = ++serial;
        newest.put(id, s);
        for (java.util.Iterator<Undelivered> it = undelivered.iterator(); it.hasNext();) {
            if (id.equals(it.next().identity)) it.remove();
        }
        enqueue(new Undelivered(m.url, body, id, s, 0));
    }

    /** Queue one try on the sender thread (in the order made). Called with this locked. */
    private void enqueue(final Undelivered u) {
        inFlight.add(u.serial);
        try {
            executor.execute(new Runnable() {
                @Override public void run() {
                    attempt(u);
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            // Closed: kept for the next update check (of the next process, from reports.json).
            inFlight.remove(u.serial);
            keep(u);
            save();
        }
    }

    /** The status of one POST, or -1 when nothing answered (no connection, a timeout). */
    int post(String url, byte[] body) {
        return Http.post(url, body, TIMEOUT_MS, transport);
    }

    /** One try of one report, on the sender thread; never throws. */
    private void attempt(Undelivered u) {
        synchronized (this) {
            // Replaced by a newer report of the same install and model, or dropped, while queued.
            if (u.kept && !undelivered.contains(u)) {
                inFlight.remove(u.serial);
                return;
            }
        }
        int status;
        try {
            status = post(u.url, u.body);
        } catch (RuntimeException e) {
            status = -1;
        }
        synchronized (this) {
            inFlight.remove(u.serial);
            if (status >= 200 && status < 300) {
                sent.incrementAndGet();
                if (undelivered.remove(u)) save();
                return;
            }
            boolean answered = status >= 0;
            boolean again = !answered || status == 408 || status == 429 || status >= 500;
            if (answered && again) u.tries++;
            Long newer = newest.get(u.identity);
            if (!again || u.tries >= TRIES || (newer != null && newer > u.serial)) {
                // A refusal (any other 4xx) is refused again; so many 5xx: the receiver is not coming back.
                if (undelivered.remove(u)) save();
                return;
            }
            keep(u);
            save();
        }
    }

    /** Keep a report for the next update check: at most {@link #UNDELIVERED}, the oldest dropped. Called with this locked. */
    private void keep(Undelivered u) {
        if (!u.kept) {
            u.kept = true;
            undelivered.add(u);
        }
        while (undelivered.size() > UNDELIVERED) undelivered.remove(0);
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

    /** Send again, in order, every report not delivered yet (at each update check). */
    synchronized void retryPending() {
        if (!enabled) return;
        for (Undelivered u : new ArrayList<Undelivered>(undelivered)) {
            if (!inFlight.contains(u.serial)) enqueue(u);
        }
    }

    /** Wait (bounded) for reports in flight; returns how many reports were made (handed to the sender) since the last call. */
    int flush(long timeoutMs) {
        if (!enabled) return 0;
        final Object done = new Object();
        final boolean[] finished = {false};
        try {
            executor.execute(new Runnable() {
                @Override public void run() {
                    synchronized (done) {
                        finished[0] = true;
                        done.notifyAll();
                    }
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            finished[0] = true; // closed: nothing is in flight any more
        }
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
        counts.awaitSaved(Math.max(1, until - System.currentTimeMillis()));
        sent.set(0);
        return produced.getAndSet(0);
    }

    void close(long timeoutMs) {
        if (!enabled) return;
        counts.awaitSaved(timeoutMs);
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
        // A fact the report's pattern refuses is sent as null, never a reason to skip the report.
        r.put("mnn_runtime", device.mnnRuntime != null && dev.edgereg.internal.Versions.isVersion(device.mnnRuntime) ? device.mnnRuntime : Json.NULL);
        r.put("os", "android".equals(device.os) || "ios".equals(device.os) ? device.os : Json.NULL);
        // The OS version: the short text, or any version of §7's grammar (one grammar); else null.
        r.put("os_version", device.osVersion != null && (device.osVersion.matches("[A-Za-z0-9._ -]{1,32}") || dev.edgereg.internal.Versions.isVersion(device.osVersion)) ? device.osVersion : Json.NULL);
        r.put("device_class", deviceClass != null && deviceClass.matches("[A-Za-z0-9._ -]{1,32}") ? deviceClass : Json.NULL);
        if (cpuClass != null) r.put("cpu_class", cpuClass);
        return versioned(r);
    }

    /**
     * The schema version a report's keys need: 3 once it carries app metrics, else 2 once it sets
     * a key of version 2, else 1, so a report that uses nothing new is byte for byte a version 1
     * report (docs/protocol.md section 12). A newer key is left off while unset, never sent as null.
     */
    static Map<String, Object> versioned(Map<String, Object> r) {
        boolean v2 = false;
        for (String k : dev.edgereg.internal.ReportCheck.V2_KEYS) {
            if (r.get(k) == Json.NULL) r.remove(k);
            v2 |= r.containsKey(k);
        }
        if (r.get("metrics") == Json.NULL) r.remove("metrics");
        r.put("schema_version", r.containsKey("metrics") ? 3L : v2 ? 2L : 1L);
        return r;
    }
}
