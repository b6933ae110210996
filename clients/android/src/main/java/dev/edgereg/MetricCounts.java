package dev.edgereg;

import dev.edgereg.internal.Json;
import dev.edgereg.internal.ReportCheck;
import dev.edgereg.internal.Store;
import java.io.File;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;

/**
 * The app metrics counted per install (docs/protocol.md section 11, "App metrics"), by the
 * install's report token: a rate's events and successes, a distribution's count per bucket, since
 * the install and never reset within it, and whether they changed since the install's last report
 * (the 12-hour resend). Kept in metrics.json in the cache, next to the reporter's reports.json.
 *
 * <p>Counting never touches the disk on the caller's thread: a count marks the file due and one
 * background thread per process writes it (atomically) moments later; every read and write of
 * every client's file goes through that thread, so a client created again on the same cache (an
 * app restart in one process, the device program's configure) reads what the one before it wrote.
 */
final class MetricCounts {
    /** Installs whose counts are kept at most (the least recently used go first). */
    static final int KEPT = 16;

    private static ExecutorService io;

    /** One thread for every client's metrics.json, created when first needed. */
    static synchronized ExecutorService io() {
        if (io == null) {
            io = Executors.newSingleThreadExecutor(new ThreadFactory() {
                @Override public Thread newThread(Runnable r) {
                    Thread t = new Thread(r, "edgereg-metrics");
                    t.setDaemon(true);
                    return t;
                }
            });
        }
        return io;
    }

    /** One install's counts. */
    static final class Tally {
        /** name: a rate's {events, successes}, or a distribution's count per bucket. */
        final Map<String, long[]> counts = new TreeMap<String, long[]>();
        final Map<String, Boolean> rates = new TreeMap<String, Boolean>();
        boolean changed;
    }

    private final Store store;
    private final File file;
    /** By install token, least recently used first. */
    private final Map<String, Tally> tallies = new LinkedHashMap<String, Tally>();
    private boolean saveQueued;

    MetricCounts(Store store) {
        this.store = store;
        this.file = new File(store.root, "metrics.json");
        Map<String, Object> saved;
        try {
            // Behind any write still queued by a client before this one.
            saved = io().submit(new java.util.concurrent.Callable<Map<String, Object>>() {
                @Override public Map<String, Object> call() {
                    return MetricCounts.this.store.readLenient(file);
                }
            }).get();
        } catch (Exception e) {
            if (e instanceof InterruptedException) Thread.currentThread().interrupt();
            saved = store.readLenient(file);
        }
        load(saved);
    }

    @SuppressWarnings("unchecked")
    private void load(Map<String, Object> saved) {
        if (saved == null || !(saved.get("installs") instanceof Map)) return;
        for (Map.Entry<String, Object> e : ((Map<String, Object>) saved.get("installs")).entrySet()) {
            if (!(e.getValue() instanceof Map)) continue;
            Map<String, Object> v = (Map<String, Object>) e.getValue();
            Tally t = new Tally();
            t.changed = Boolean.TRUE.equals(v.get("changed"));
            if (v.get("metrics") instanceof Map) {
                for (Map.Entry<String, Object> m : ((Map<String, Object>) v.get("metrics")).entrySet()) {
                    if (!(m.getValue() instanceof Map)) continue;
                    Map<String, Object> c = (Map<String, Object>) m.getValue();
                    Object counts = c.get("counts");
                    if (counts instanceof List) {
                        List<Object> list = (List<Object>) counts;
                        long[] n = new long[list.size()];
                        for (int i = 0; i < n.length; i++) n[i] = Health.num(list.get(i));
                        t.counts.put(m.getKey(), n);
                        t.rates.put(m.getKey(), false);
                    } else {
                        t.counts.put(m.getKey(), new long[] {Health.num(c.get("events")), Health.num(c.get("successes"))});
                        t.rates.put(m.getKey(), true);
                    }
                }
            }
            tallies.put(e.getKey(), t);
        }
    }

    private Tally tally(String token) {
        Tally t = tallies.remove(token);
        if (t == null) t = new Tally();
        tallies.put(token, t); // the most recently used
        for (Iterator<String> it = tallies.keySet().iterator(); tallies.size() > KEPT && it.hasNext();) {
            it.next();
            it.remove();
        }
        return t;
    }

    /**
     * Count one outcome for the install of {@code token}: a rate's event ({@code value} 1: it
     * succeeded), or a distribution's value in bucket {@code value}. Counts stop at 10^9 (the
     * largest a report carries), so a report is never refused for them: a rate at 10^9 events
     * counts no more events (nor successes), a bucket at 10^9 no more values.
     */
    synchronized void count(String token, AppMetric metric, int value) {
        Tally t = tally(token);
        int size = metric.isRate() ? 2 : metric.buckets.size() + 1;
        long[] n = t.counts.get(metric.name);
        if (n == null || n.length != size || t.rates.get(metric.name) != metric.isRate()) {
            n = new long[size];
            t.counts.put(metric.name, n);
            t.rates.put(metric.name, metric.isRate());
        }
        if (metric.isRate()) {
            // At 10^9 events an event counts no more, its success neither: the share stays.
            if (n[0] >= ReportCheck.MAX_COUNT) return;
            n[0]++;
            if (value == 1) n[1] = Math.min(n[0], n[1] + 1);
        } else {
            n[value] = Math.min(ReportCheck.MAX_COUNT, n[value] + 1);
        }
        t.changed = true;
        scheduleSave();
    }

    /** The install's totals as a report carries them ({@code metrics}), or null before any count. */
    synchronized Map<String, Object> totals(String token) {
        Tally t = tallies.get(token);
        return t == null || t.counts.isEmpty() ? null : metricsJson(t);
    }

    /** A report of the install was made, carrying its totals. */
    synchronized void reported(String token) {
        Tally t = tallies.get(token);
        if (t == null || !t.changed) return;
        t.changed = false;
        scheduleSave();
    }

    /** The install's counts changed since its last report. */
    synchronized boolean changed(String token) {
        Tally t = tallies.get(token);
        return t != null && t.changed;
    }

    private static Map<String, Object> metricsJson(Tally t) {
        Map<String, Object> out = new TreeMap<String, Object>();
        for (Map.Entry<String, long[]> e : t.counts.entrySet()) {
            long[] n = e.getValue();
            Map<String, Object> c = new LinkedHashMap<String, Object>();
            if (Boolean.TRUE.equals(t.rates.get(e.getKey()))) {
                c.put("events", n[0]);
                c.put("successes", n[1]);
            } else {
                List<Object> counts = new ArrayList<Object>();
                for (long x : n) counts.add(x);
                c.put("counts", counts);
            }
            out.put(e.getKey(), c);
        }
        return out;
    }

    private static Map<String, Object> json(Tally t) {
        Map<String, Object> v = new LinkedHashMap<String, Object>();
        v.put("metrics", metricsJson(t));
        v.put("changed", t.changed);
        return v;
    }

    /** Called with this locked: one write queued at a time, of the counts as they are when it runs. */
    private void scheduleSave() {
        if (saveQueued) return;
        saveQueued = true;
        try {
            io().execute(new Runnable() {
                @Override public void run() {
                    save();
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            saveQueued = false; // never into the app: the next count tries again
        }
    }

    private void save() {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        synchronized (this) {
            saveQueued = false;
            Map<String, Object> installs = new LinkedHashMap<String, Object>();
            for (Map.Entry<String, Tally> e : tallies.entrySet()) installs.put(e.getKey(), json(e.getValue()));
            m.put("installs", installs);
        }
        try {
            Store.atomicWrite(file, Json.canonical(m));
        } catch (dev.edgereg.internal.Rejected | RuntimeException e) {
            // kept in memory; the next count writes again
        }
    }

    /** Wait (bounded) until the counts made so far are on disk. */
    void awaitSaved(long timeoutMs) {
        try {
            Future<?> done = io().submit(new Runnable() {
                @Override public void run() {}
            });
            done.get(timeoutMs, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (Exception e) {
            // bounded: the write goes on in the background
        }
    }
}
