package dev.edgereg;

import dev.edgereg.internal.Json;
import dev.edgereg.internal.Rejected;
import dev.edgereg.internal.Store;
import java.io.File;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The confirmation ledger (docs/protocol.md section 11) over health.json: per unit, the installed
 * version, whether it was confirmed, the starts that ran it and ended without a confirmation,
 * whether a start that runs it is under way, the last good version and a revert still to carry out.
 * A start counts at the next appStarted, so an app that installs before or after appStarted
 * counts alike.
 */
final class Health {
    private final Store store;
    private final int maxUnconfirmedStarts;

    Health(Store store, int maxUnconfirmedStarts) {
        this.store = store;
        this.maxUnconfirmedStarts = maxUnconfirmedStarts;
    }

    private File file() { return new File(store.root, "health.json"); }

    @SuppressWarnings("unchecked")
    private Map<String, Object> all() {
        Map<String, Object> m = store.readLenient(file());
        if (m == null || !(m.get("units") instanceof Map)) {
            m = new LinkedHashMap<String, Object>();
            m.put("units", new LinkedHashMap<String, Object>());
        }
        return m;
    }

    @SuppressWarnings("unchecked")
    private Map<String, Object> unit(Map<String, Object> all, String unit) {
        Map<String, Object> units = (Map<String, Object>) all.get("units");
        Object u = units.get(unit);
        if (!(u instanceof Map)) {
            u = new LinkedHashMap<String, Object>();
            ((Map<String, Object>) u).put("installed", Json.NULL);
            ((Map<String, Object>) u).put("confirmed", false);
            ((Map<String, Object>) u).put("starts", 0L);
            ((Map<String, Object>) u).put("running", false);
            ((Map<String, Object>) u).put("last_good", Json.NULL);
            ((Map<String, Object>) u).put("reverting", Json.NULL);
            units.put(unit, u);
        }
        return (Map<String, Object>) u;
    }

    static String str(Object v) { return v instanceof String ? (String) v : null; }

    static long num(Object v) {
        if (v instanceof Json.Num) return ((Json.Num) v).longValue();
        if (v instanceof Number) return ((Number) v).longValue();
        return 0;
    }

    /**
     * A new version was installed; {@code duringStart}: appStarted was called in this process
     * before, so this start may run it and the next start counts it unless it is confirmed.
     */
    synchronized void installed(String unit, String version, boolean duringStart) throws Rejected {
        Map<String, Object> all = all();
        Map<String, Object> h = unit(all, unit);
        if (version.equals(str(h.get("installed")))) return;
        h.put("installed", version);
        h.put("confirmed", false);
        h.put("starts", 0L);
        h.put("running", duringStart);
        h.put("reverting", Json.NULL);
        store.write(file(), all);
    }

    /**
     * A start: the start under way before it (running) ended without a confirmation and counts
     * one. Returns {version, last good or null, starts} of a revert due now (the count reached
     * maxUnconfirmedStarts), or null; this start then runs the install.
     */
    @SuppressWarnings("unchecked")
    synchronized String[] appStarted(String unit) throws Rejected {
        Map<String, Object> all = all();
        Map<String, Object> h = unit(all, unit);
        if (h.get("reverting") instanceof Map) {
            Map<String, Object> r = (Map<String, Object>) h.get("reverting");
            return new String[] {str(r.get("version")), str(r.get("to")), String.valueOf(num(r.get("starts")))};
        }
        String installed = str(h.get("installed"));
        if (installed == null || Boolean.TRUE.equals(h.get("confirmed"))) return null;
        long starts = num(h.get("starts"));
        if (Boolean.TRUE.equals(h.get("running"))) starts++;
        h.put("starts", starts);
        if (starts >= maxUnconfirmedStarts) {
            Map<String, Object> r = new LinkedHashMap<String, Object>();
            r.put("version", installed);
            r.put("to", h.get("last_good"));
            r.put("starts", starts);
            h.put("reverting", r);
            h.put("running", false);
            store.write(file(), all);
            return new String[] {installed, str(h.get("last_good")), String.valueOf(starts)};
        }
        h.put("running", true);
        store.write(file(), all);
        return null;
    }

    synchronized boolean confirm(String unit, String version) throws Rejected {
        Map<String, Object> all = all();
        Map<String, Object> h = unit(all, unit);
        String installed = str(h.get("installed"));
        if (installed == null || Boolean.TRUE.equals(h.get("confirmed")) || h.get("reverting") instanceof Map) return false;
        if (version != null && !version.equals(installed)) return false;
        h.put("confirmed", true);
        h.put("running", false);
        h.put("last_good", installed);
        store.write(file(), all);
        return true;
    }

    synchronized void reverted(String unit, String toVersion) throws Rejected {
        Map<String, Object> all = all();
        Map<String, Object> h = unit(all, unit);
        h.put("installed", toVersion == null ? Json.NULL : toVersion);
        h.put("confirmed", toVersion != null && toVersion.equals(str(h.get("last_good"))));
        h.put("starts", 0L);
        h.put("running", false);
        h.put("reverting", Json.NULL);
        store.write(file(), all);
    }

    /** The version installed and not yet confirmed and the starts counted against it, or null. */
    synchronized Object[] unconfirmed(String unit) {
        Map<String, Object> h = unit(all(), unit);
        String installed = str(h.get("installed"));
        if (installed == null || Boolean.TRUE.equals(h.get("confirmed"))) return null;
        return new Object[] {installed, num(h.get("starts"))};
    }

    /** {installed or null, confirmed, starts}: what the conformance vectors compare. */
    synchronized Object[] view(String unit) {
        Map<String, Object> h = unit(all(), unit);
        return new Object[] {str(h.get("installed")), Boolean.TRUE.equals(h.get("confirmed")), num(h.get("starts"))};
    }

    synchronized boolean isConfirmed(String unit) {
        Map<String, Object> h = unit(all(), unit);
        return Boolean.TRUE.equals(h.get("confirmed"));
    }
}
