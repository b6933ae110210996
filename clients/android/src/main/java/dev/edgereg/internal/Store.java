package dev.edgereg.internal;

import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The cache directory (docs/protocol.md section 8), with java.io only (no java.nio.file on API
 * 24): every write is a temporary file in the same directory, fsynced, renamed over the target.
 *
 * <pre>
 * blobs/&lt;sha256&gt;              verified blobs (artifacts, probes, labels)
 * blobs/&lt;sha256&gt;.part         an interrupted download
 * state/&lt;unit&gt;/sequence.json  highest sequence accepted for the unit (any tier)
 * state/&lt;unit&gt;/&lt;tier&gt;.json    last accepted manifest bytes (base64) and its ETag
 * state/&lt;unit&gt;/_status.json   pending release and last error
 * state/&lt;unit&gt;/_bad.json      versions refused for good on this device, with why
 * installed.json              "models"/"bundles": unit -&gt; the installed set and "previous"
 * health.json                 confirmation ledger per unit (section 11)
 * selftest.json               failing backends per model version (section 11)
 * reports.json                reports waiting for one more try
 * </pre>
 */
public final class Store {
    public final File root;

    public Store(File root) {
        this.root = root;
    }

    public File blob(String sha256) { return new File(root, "blobs/" + sha256); }

    public File part(String sha256) { return new File(root, "blobs/" + sha256 + ".part"); }

    File unitDir(String unit) { return new File(root, "state/" + unit); }

    public boolean hasBlob(String sha256, long size) {
        File f = blob(sha256);
        return f.isFile() && f.length() == size;
    }

    // --- JSON files -------------------------------------------------------------------

    /** A JSON object file, or null when absent; a file that does not parse is a cache error. */
    @SuppressWarnings("unchecked")
    public Map<String, Object> read(File f) throws Rejected {
        if (!f.exists()) return null;
        try {
            Object v = Json.parse(readAll(f, 16 * 1024 * 1024));
            if (!(v instanceof Map)) throw new Rejected(Reasons.CACHE, f + " is not a JSON object; delete it to start over");
            return (Map<String, Object>) v;
        } catch (IOException e) {
            throw new Rejected(Reasons.CACHE, "cannot read " + f + ": " + e.getMessage(), e);
        } catch (Json.JsonException e) {
            throw new Rejected(Reasons.CACHE, f + " is damaged (" + e.getMessage() + "); delete it to start over");
        }
    }

    /** Like {@link #read} but a damaged file counts as absent (for records that only inform). */
    public Map<String, Object> readLenient(File f) {
        try {
            return read(f);
        } catch (Rejected e) {
            return null;
        }
    }

    public void write(File f, Object json) throws Rejected {
        atomicWrite(f, Json.canonical(json));
    }

    public static void atomicWrite(File f, byte[] data) throws Rejected {
        File dir = f.getParentFile();
        if (!dir.isDirectory() && !dir.mkdirs() && !dir.isDirectory()) throw new Rejected(Reasons.CACHE, "cannot create " + dir);
        File tmp = new File(dir, "." + f.getName() + ".tmp");
        try {
            FileOutputStream out = new FileOutputStream(tmp);
            try {
                out.write(data);
                out.flush();
                out.getFD().sync();
            } finally {
                out.close();
            }
            if (!tmp.renameTo(f)) throw new IOException("cannot rename " + tmp + " to " + f);
        } catch (IOException e) {
            tmp.delete();
            throw new Rejected(Reasons.CACHE, "cannot write " + f + ": " + e.getMessage(), e);
        }
    }

    public static byte[] readAll(File f, long limit) throws IOException {
        long n = f.length();
        if (n > limit) throw new IOException(f + " is " + n + " bytes, more than " + limit);
        InputStream in = new FileInputStream(f);
        try {
            java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream((int) n);
            byte[] buf = new byte[65536];
            int r;
            while ((r = in.read(buf)) > 0) {
                out.write(buf, 0, r);
                if (out.size() > limit) throw new IOException(f + " grew past " + limit + " bytes");
            }
            return out.toByteArray();
        } finally {
            in.close();
        }
    }

    // --- sequence, tier state, status, bad ----------------------------------------------

    public Long readSequence(String unit) throws Rejected {
        Map<String, Object> m = read(new File(unitDir(unit), "sequence.json"));
        if (m == null) return null;
        Object s = m.get("sequence");
        if (!(s instanceof Json.Num) || ((Json.Num) s).longValue() == null) {
            // Never "nothing seen": that would accept a replayed old manifest.
            throw new Rejected(Reasons.CACHE, new File(unitDir(unit), "sequence.json") + " is damaged; refusing to update");
        }
        return ((Json.Num) s).longValue();
    }

    public void writeSequence(String unit, long sequence) throws Rejected {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("sequence", sequence);
        write(new File(unitDir(unit), "sequence.json"), m);
    }

    /** [manifest bytes, etag] of the last accepted manifest for this tier, or null. */
    public Object[] readTierState(String unit, String tier) {
        Map<String, Object> m = readLenient(new File(unitDir(unit), tier + ".json"));
        if (m == null || !(m.get("envelope") instanceof String)) return null;
        byte[] env = Codec.base64Decode((String) m.get("envelope"));
        if (env == null) return null;
        return new Object[] {env, m.get("etag") instanceof String ? m.get("etag") : null};
    }

    public void writeTierState(String unit, String tier, byte[] envelope, String etag) throws Rejected {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("envelope", Codec.base64(envelope));
        m.put("etag", etag == null ? Json.NULL : etag);
        write(new File(unitDir(unit), tier + ".json"), m);
    }

    public Map<String, Object> readStatus(String unit) {
        Map<String, Object> m = readLenient(new File(unitDir(unit), "_status.json"));
        return m == null ? new LinkedHashMap<String, Object>() : m;
    }

    public void writeStatus(String unit, Map<String, Object> status) throws Rejected {
        write(new File(unitDir(unit), "_status.json"), status);
    }

    public Map<String, Object> readBad(String unit) {
        Map<String, Object> m = readLenient(new File(unitDir(unit), "_bad.json"));
        return m == null ? new LinkedHashMap<String, Object>() : m;
    }

    public void markBad(String unit, String version, String why) throws Rejected {
        Map<String, Object> m = readBad(unit);
        m.put(version, why);
        write(new File(unitDir(unit), "_bad.json"), m);
    }

    // --- installed.json ----------------------------------------------------------------

    File installedFile() { return new File(root, "installed.json"); }

    @SuppressWarnings("unchecked")
    public Map<String, Object> readInstalled(String kind, String unit) throws Rejected {
        Map<String, Object> all = read(installedFile());
        if (all == null) return null;
        Object byKind = all.get(kind);
        if (!(byKind instanceof Map)) return null;
        Object rec = ((Map<String, Object>) byKind).get(unit);
        return rec instanceof Map ? (Map<String, Object>) rec : null;
    }

    /** Grows with every write of installed.json by this store: what a reader caches by. */
    private volatile long generation;

    public long generation() { return generation; }

    @SuppressWarnings("unchecked")
    public synchronized void writeInstalled(String kind, String unit, Map<String, Object> record) throws Rejected {
        generation++;
        Map<String, Object> all = read(installedFile());
        if (all == null) all = new LinkedHashMap<String, Object>();
        Object byKind = all.get(kind);
        Map<String, Object> units = byKind instanceof Map ? (Map<String, Object>) byKind : new LinkedHashMap<String, Object>();
        if (record == null) units.remove(unit);
        else units.put(unit, record);
        all.put(kind, units);
        write(installedFile(), all);
    }

    /** Every digest an installed set, its previous set, or a pending download references. */
    @SuppressWarnings("unchecked")
    Set<String> referenced() throws Rejected {
        Set<String> out = new HashSet<String>();
        Map<String, Object> all = read(installedFile());
        if (all != null) {
            for (Object byKind : all.values()) {
                if (!(byKind instanceof Map)) continue;
                for (Object rec : ((Map<String, Object>) byKind).values()) {
                    if (!(rec instanceof Map)) continue;
                    collect((Map<String, Object>) rec, out);
                    Object prev = ((Map<String, Object>) rec).get("previous");
                    if (prev instanceof Map) collect((Map<String, Object>) prev, out);
                }
            }
        }
        File state = new File(root, "state");
        File[] units = state.listFiles();
        if (units != null) {
            for (File u : units) {
                Map<String, Object> st = readLenient(new File(u, "_status.json"));
                if (st == null || !(st.get("pending") instanceof Map)) continue;
                Object blobs = ((Map<String, Object>) st.get("pending")).get("blobs");
                if (blobs instanceof List) {
                    for (Object b : (List<Object>) blobs) {
                        if (b instanceof Map && ((Map<String, Object>) b).get("sha256") instanceof String) {
                            out.add((String) ((Map<String, Object>) b).get("sha256"));
                        }
                    }
                }
            }
        }
        return out;
    }

    @SuppressWarnings("unchecked")
    static void collect(Map<String, Object> record, Set<String> out) {
        Object members = record.get("members");
        if (!(members instanceof Map)) return;
        for (Object m : ((Map<String, Object>) members).values()) {
            if (!(m instanceof Map)) continue;
            Map<String, Object> member = (Map<String, Object>) m;
            for (String key : new String[] {"sha256", "probe_sha256", "labels_sha256"}) {
                if (member.get(key) instanceof String) out.add((String) member.get(key));
            }
        }
    }

    /** Delete every blob and .part nothing references; returns how many. */
    public synchronized int evict() throws Rejected {
        Set<String> keep = referenced();
        File[] files = new File(root, "blobs").listFiles();
        int n = 0;
        if (files == null) return 0;
        for (File f : files) {
            String name = f.getName();
            String digest = name.endsWith(".part") ? name.substring(0, name.length() - 5) : name;
            if (!keep.contains(digest) && f.delete()) n++;
        }
        return n;
    }

    public long usableSpace() {
        root.mkdirs();
        return root.getUsableSpace();
    }
}
