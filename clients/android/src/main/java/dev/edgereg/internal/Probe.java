package dev.edgereg.internal;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** The golden probe (docs/protocol.md section 11): parse it, and judge computed outputs. */
public final class Probe {
    /** The largest probe data blob a client holds (an entry declaring more is refused before download). */
    public static final long MAX_DATA_BYTES = 128L * 1024 * 1024;

    public static final class T {
        public final String name;
        public final String dtype;
        public final int[] shape;
        public byte[] data;
        /** Where the bytes start in the probe data blob (data is then null until resolved), or -1. */
        final long offset;

        T(String name, String dtype, int[] shape, byte[] data, long offset) {
            this.name = name;
            this.dtype = dtype;
            this.shape = shape;
            this.data = data;
            this.offset = offset;
        }
    }

    public static final class Step {
        public final List<T> inputs = new ArrayList<T>();
        public final List<T> expected = new ArrayList<T>();
    }

    public final List<List<Step>> cases = new ArrayList<List<Step>>();
    public final List<String[]> state = new ArrayList<String[]>();
    public double minCosine;
    public double maxAbsError;

    private Probe() {}

    static int itemSize(String dtype) {
        if (dtype.equals("float32") || dtype.equals("int32")) return 4;
        if (dtype.equals("float16")) return 2;
        if (dtype.equals("int64")) return 8;
        if (dtype.equals("int8") || dtype.equals("uint8") || dtype.equals("bool")) return 1;
        return -1;
    }

    /** Parse a verified probe blob of an entry without probe_data; its artifact_sha256 must be the entry's. */
    public static Probe parse(byte[] data, String artifactSha256) throws Rejected {
        return parse(data, artifactSha256, null, null);
    }

    /**
     * Parse a verified probe blob; its artifact_sha256 must be the entry's, its data_sha256 the entry's
     * probe_data (null: none), whose verified bytes {@code tensorData} the tensors' offsets read.
     */
    public static Probe parse(byte[] data, String artifactSha256, String dataSha256, byte[] tensorData) throws Rejected {
        try {
            Map<String, Object> m = Wire.object(Json.parse(data), "probe");
            Object sv = m.get("schema_version");
            if (!(sv instanceof Json.Num && "1".equals(sv.toString()))) throw Wire.bad("probe.schema_version", "must be the integer 1");
            // Informational (compared with nothing) but required names (docs/protocol.md section 11).
            for (String key : new String[] {"model", "variant"}) {
                Wire.matching(Wire.required(m, key, "probe." + key), Wire.NAME, "probe." + key, "is not a name");
            }
            String artifact = Wire.string(Wire.required(m, "artifact_sha256", "probe.artifact_sha256"), "probe.artifact_sha256");
            if (!artifact.equals(artifactSha256)) {
                throw new Rejected(Reasons.MALFORMED, "the probe is for artifact " + artifact.substring(0, Math.min(12, artifact.length()))
                        + ", not " + artifactSha256.substring(0, 12));
            }
            Probe p = new Probe();
            if (m.containsKey("state")) {
                for (Object pair : Wire.array(m.get("state"), "probe.state")) {
                    List<Object> l = Wire.array(pair, "probe.state");
                    if (l.size() != 2) throw Wire.bad("probe.state", "each pair is [input, output]");
                    p.state.add(new String[] {Wire.string(l.get(0), "probe.state"), Wire.string(l.get(1), "probe.state")});
                }
            }
            List<Object> cases = Wire.array(Wire.required(m, "cases", "probe.cases"), "probe.cases");
            if (cases.isEmpty()) throw Wire.bad("probe.cases", "needs at least one case");
            for (Object c : cases) {
                List<Object> steps = Wire.array(Wire.required(Wire.object(c, "probe.cases"), "steps", "probe.steps"), "probe.steps");
                if (steps.isEmpty()) throw Wire.bad("probe.steps", "needs at least one step");
                List<Step> out = new ArrayList<Step>();
                for (Object s : steps) {
                    Map<String, Object> step = Wire.object(s, "probe.step");
                    Step st = new Step();
                    for (Object t : Wire.array(Wire.required(step, "inputs", "probe.inputs"), "probe.inputs")) st.inputs.add(tensor(t));
                    for (Object t : Wire.array(Wire.required(step, "expected", "probe.expected"), "probe.expected")) st.expected.add(tensor(t));
                    if (st.inputs.isEmpty() || st.expected.isEmpty()) throw Wire.bad("probe.step", "needs inputs and expected outputs");
                    unique(st.inputs);
                    unique(st.expected);
                    out.add(st);
                }
                p.cases.add(out);
            }
            Object named = m.get("data_sha256");
            String dataSha = named == null || named == Json.NULL ? null : Wire.string(named, "probe.data_sha256");
            if (dataSha == null ? dataSha256 != null : !dataSha.equals(dataSha256)) {
                throw Wire.bad("probe.data_sha256", dataSha == null ? "the entry names a probe data blob, the probe does not"
                        : "names data blob " + dataSha + ", the entry " + (dataSha256 == null ? "none" : dataSha256));
            }
            for (List<Step> steps : p.cases) {
                for (Step st : steps) {
                    for (List<T> tensors : java.util.Arrays.asList(st.inputs, st.expected)) {
                        for (T t : tensors) {
                            if (t.offset < 0) continue;
                            if (dataSha == null) throw Wire.bad("probe tensor " + t.name, "names an offset, but the probe names no data_sha256");
                            long end = t.offset + count(t.shape) * itemSize(t.dtype);
                            if (end > tensorData.length) throw Wire.bad("probe tensor " + t.name, "bytes " + t.offset + " to " + end + " lie beyond the " + tensorData.length + "-byte probe data blob");
                            t.data = java.util.Arrays.copyOfRange(tensorData, (int) t.offset, (int) end);
                        }
                    }
                }
            }
            Map<String, Object> tol = Wire.object(Wire.required(m, "tolerance", "probe.tolerance"), "probe.tolerance");
            p.minCosine = number(Wire.required(tol, "min_cosine", "probe.tolerance.min_cosine"));
            p.maxAbsError = number(Wire.required(tol, "max_abs_error", "probe.tolerance.max_abs_error"));
            if (p.minCosine < -1 || p.minCosine > 1) throw Wire.bad("probe.tolerance.min_cosine", "must be between -1 and 1");
            if (p.maxAbsError < 0) throw Wire.bad("probe.tolerance.max_abs_error", "must be >= 0");
            return p;
        } catch (Json.JsonException e) {
            throw new Rejected(Reasons.MALFORMED, "the probe is not JSON: " + e.getMessage());
        }
    }

    private static void unique(List<T> tensors) throws Rejected {
        java.util.Set<String> names = new java.util.HashSet<String>();
        for (T t : tensors) if (!names.add(t.name)) throw Wire.bad("probe tensor " + t.name, "named twice in one step");
    }

    private static double number(Object v) throws Rejected {
        if (!(v instanceof Json.Num)) throw Wire.bad("probe.tolerance", "must be numbers");
        return ((Json.Num) v).doubleValue();
    }

    private static T tensor(Object v) throws Rejected {
        Map<String, Object> m = Wire.object(v, "probe tensor");
        String name = Wire.string(Wire.required(m, "name", "probe tensor name"), "probe tensor name");
        int chars = name.codePointCount(0, name.length());
        if (chars < 1 || chars > 256) throw Wire.bad("probe tensor name", "has 1 to 256 characters");
        String dtype = Wire.string(Wire.required(m, "dtype", "probe tensor dtype"), "probe tensor dtype");
        if (itemSize(dtype) < 0) throw Wire.bad("probe tensor " + name, "unknown dtype " + dtype);
        List<Object> dims = Wire.array(Wire.required(m, "shape", "probe tensor shape"), "probe tensor shape");
        int[] shape = new int[dims.size()];
        long count = 1;
        for (int i = 0; i < shape.length; i++) {
            shape[i] = (int) Wire.integer(dims.get(i), "probe tensor shape", 0, Integer.MAX_VALUE);
            count *= shape[i];
        }
        Object text = m.get("data");
        Object at = m.get("offset");
        boolean inline = text != null && text != Json.NULL;
        boolean offset = at != null && at != Json.NULL;
        if (inline == offset) throw Wire.bad("probe tensor " + name, "has exactly one of data and offset");
        if (offset) return new T(name, dtype, shape, null, Wire.integer(at, "probe tensor offset", 0, Wire.MAX_SAFE_INTEGER));
        byte[] data = Codec.base64Decode(Wire.string(text, "probe tensor data"));
        if (data == null) throw Wire.bad("probe tensor " + name, "data is not base64");
        if (data.length != count * itemSize(dtype)) throw Wire.bad("probe tensor " + name, data.length + " bytes for its shape");
        return new T(name, dtype, shape, data, -1);
    }

    private static long count(int[] shape) {
        long n = 1;
        for (int d : shape) n *= d;
        return n;
    }

    /** Little-endian elements as doubles. */
    public static double[] decode(String dtype, byte[] raw) {
        int size = itemSize(dtype);
        if (size < 0) throw new IllegalArgumentException("unknown dtype " + dtype);
        ByteBuffer b = ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
        double[] out = new double[raw.length / size];
        for (int i = 0; i < out.length; i++) {
            if (dtype.equals("float32")) out[i] = b.getFloat();
            else if (dtype.equals("float16")) out[i] = half(b.getShort());
            else if (dtype.equals("int32")) out[i] = b.getInt();
            else if (dtype.equals("int64")) out[i] = b.getLong();
            else if (dtype.equals("int8")) out[i] = b.get();
            else if (dtype.equals("uint8")) out[i] = b.get() & 0xff;
            else out[i] = b.get() != 0 ? 1 : 0;
        }
        return out;
    }

    static double half(short h) {
        int s = (h >> 15) & 1;
        int e = (h >> 10) & 0x1f;
        int f = h & 0x3ff;
        double v;
        if (e == 0) v = f / 1024.0 * Math.pow(2, -14);
        else if (e == 31) v = f == 0 ? Double.POSITIVE_INFINITY : Double.NaN;
        else v = (1 + f / 1024.0) * Math.pow(2, e - 15);
        return s == 1 ? -v : v;
    }

    /** null when the output passes, else {code, why}: missing-output, shape-mismatch, not-finite, cosine, abs-error. */
    public String[] check(String where, String gotDtype, int[] gotShape, byte[] gotData, T want) {
        if (gotData == null) return new String[] {"missing-output", where + ": missing"};
        if (!java.util.Arrays.equals(gotShape, want.shape)) {
            return new String[] {"shape-mismatch", where + ": shape " + java.util.Arrays.toString(gotShape) + ", expected " + java.util.Arrays.toString(want.shape)};
        }
        double[] got;
        try {
            got = decode(gotDtype, gotData);
        } catch (IllegalArgumentException e) {
            return new String[] {"count-mismatch", where + ": " + e.getMessage()};
        }
        double[] exp = decode(want.dtype, want.data);
        if (got.length != exp.length) return new String[] {"shape-mismatch", where + ": " + got.length + " elements, expected " + exp.length};
        for (double v : exp) if (Double.isNaN(v) || Double.isInfinite(v)) return new String[] {"not-finite", where + ": the expected values are not finite"};
        String why = judge(where, got, exp);
        if (why == null) return null;
        return new String[] {why.contains("cosine") ? "cosine" : why.contains("abs error") ? "abs-error" : "not-finite", why};
    }

    /** null when the output passes, else why it does not. */
    public String judge(String where, double[] got, double[] want) {
        if (got == null || got.length != want.length) return where + ": missing or wrong size";
        double dot = 0;
        double na = 0;
        double nb = 0;
        double err = 0;
        for (int i = 0; i < got.length; i++) {
            if (Double.isNaN(got[i]) || Double.isInfinite(got[i])) return where + ": not finite";
            dot += got[i] * want[i];
            na += got[i] * got[i];
            nb += want[i] * want[i];
            err = Math.max(err, Math.abs(got[i] - want[i]));
        }
        na = Math.sqrt(na);
        nb = Math.sqrt(nb);
        double cosine = (na == 0 || nb == 0) ? (na == nb ? 1.0 : 0.0) : dot / (na * nb);
        if (cosine < minCosine) return String.format("%s: cosine %.6f < %.6f", where, cosine, minCosine);
        if (err > maxAbsError) return String.format("%s: abs error %.6g > %.6g", where, err, maxAbsError);
        return null;
    }
}
