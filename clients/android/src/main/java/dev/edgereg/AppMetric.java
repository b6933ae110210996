package dev.edgereg;

import dev.edgereg.internal.Json;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import javax.annotation.Nonnull;

/**
 * An app metric the installed release declares (docs/protocol.md section 3, "App metrics"): what
 * the app counts about how well the model does its job. A {@code rate} counts events and those
 * that succeeded ({@link EdgeregClient#record}); a {@code distribution} counts values in fixed
 * buckets ({@link EdgeregClient#observe}). Only counts leave the device, never a value.
 */
public final class AppMetric {
    public static final String RATE = "rate";
    public static final String DISTRIBUTION = "distribution";

    @Nonnull public final String name;
    /** {@link #RATE} or {@link #DISTRIBUTION}. */
    @Nonnull public final String kind;
    /**
     * A distribution's bucket edges e1 &lt; ... &lt; eK: K + 1 buckets, (-inf, e1], (e1, e2], ...,
     * (eK, +inf). Empty for a rate.
     */
    @Nonnull public final List<Double> buckets;
    private final double[] edges;

    AppMetric(String name, String kind, double[] edges) {
        this.name = name;
        this.kind = kind;
        this.edges = edges.clone();
        List<Double> list = new ArrayList<Double>();
        for (double e : edges) list.add(e);
        this.buckets = Collections.unmodifiableList(list);
    }

    public boolean isRate() { return RATE.equals(kind); }

    /**
     * The bucket {@code value} falls in, 0 to K: the first whose edge is at least the value (a
     * value equal to an edge falls in the bucket that edge closes), K above the last edge.
     */
    public int bucket(double value) {
        int lo = 0;
        int hi = edges.length;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (edges[mid] < value) lo = mid + 1;
            else hi = mid;
        }
        return lo;
    }

    /**
     * Why a call is a programming error of the app (docs/protocol.md section 11), or null, in
     * this order: a distribution's value that is not finite ({@code not-finite}), a name the
     * installed release does not declare ({@code undeclared}; names compare exactly), a metric of
     * the other kind ({@code other-kind}).
     */
    static String refusal(Map<String, AppMetric> declared, String name, boolean rate, double value) {
        if (!rate && (Double.isNaN(value) || Double.isInfinite(value))) return "not-finite";
        AppMetric m = declared.get(name);
        if (m == null) return "undeclared";
        if (m.isRate() != rate) return "other-kind";
        return null;
    }

    @Override public String toString() {
        return name + " (" + kind + (isRate() ? "" : " " + buckets) + ")";
    }

    /** The declarations an install record keeps ({@code {name: {"kind", "buckets"}}}); what does not read is left out. */
    @SuppressWarnings("unchecked")
    static Map<String, AppMetric> fromJson(Object v) {
        Map<String, AppMetric> out = new TreeMap<String, AppMetric>();
        if (!(v instanceof Map)) return Collections.unmodifiableMap(out);
        for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
            if (!(e.getValue() instanceof Map)) continue;
            Map<String, Object> d = (Map<String, Object>) e.getValue();
            if (RATE.equals(d.get("kind"))) {
                out.put(e.getKey(), new AppMetric(e.getKey(), RATE, new double[0]));
            } else if (DISTRIBUTION.equals(d.get("kind")) && d.get("buckets") instanceof List) {
                List<Object> list = (List<Object>) d.get("buckets");
                double[] edges = new double[list.size()];
                boolean ok = !list.isEmpty();
                for (int i = 0; ok && i < edges.length; i++) {
                    Object x = list.get(i);
                    ok = x instanceof Json.Num || x instanceof Double;
                    if (ok) edges[i] = x instanceof Json.Num ? ((Json.Num) x).doubleValue() : (Double) x;
                }
                if (ok) out.put(e.getKey(), new AppMetric(e.getKey(), DISTRIBUTION, edges));
            }
        }
        return Collections.unmodifiableMap(out);
    }
}
