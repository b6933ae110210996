package dev.edgereg;

import dev.edgereg.internal.Json;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/** How to call a model (docs/protocol.md section 3.2): inputs, outputs, state pairs, task. */
public final class ModelContract {
    private final Map<String, Object> json;

    ModelContract(Map<String, Object> json) {
        this.json = json;
    }

    /** One tensor of the contract. */
    public static final class TensorSpec {
        @Nonnull public final String name;
        @Nonnull public final String dtype;
        /** Sizes per axis: an Integer/Long, or a String naming a dynamic axis. */
        @Nonnull public final List<Object> shape;
        /** Inputs only: {@code tensor} or {@code image}, layout, color, mean and std (null: unset). */
        @Nullable public final String kind;
        @Nullable public final String layout;
        @Nullable public final String color;
        @Nullable public final List<Double> mean;
        @Nullable public final List<Double> std;

        @SuppressWarnings("unchecked")
        TensorSpec(Map<String, Object> t) {
            name = (String) t.get("name");
            dtype = (String) t.get("dtype");
            List<Object> dims = new ArrayList<Object>();
            for (Object d : (List<Object>) t.get("shape")) dims.add(d instanceof Json.Num ? (Object) ((Json.Num) d).longValue() : d);
            shape = Collections.unmodifiableList(dims);
            kind = t.containsKey("kind") ? (String) t.get("kind") : (t.containsKey("layout") || t.containsKey("batch_axis") ? "tensor" : null);
            layout = (String) t.get("layout");
            color = (String) t.get("color");
            mean = numbers(t.get("mean"));
            std = numbers(t.get("std"));
        }

        private static List<Double> numbers(Object v) {
            if (!(v instanceof List)) return null;
            List<Double> out = new ArrayList<Double>();
            for (Object o : (List<?>) v) out.add(o instanceof Json.Num ? ((Json.Num) o).doubleValue() : ((Number) o).doubleValue());
            return Collections.unmodifiableList(out);
        }
    }

    @Nonnull @SuppressWarnings("unchecked")
    public List<TensorSpec> inputs() { return specs((List<Object>) json.get("inputs")); }

    @Nonnull @SuppressWarnings("unchecked")
    public List<TensorSpec> outputs() { return specs((List<Object>) json.get("outputs")); }

    /** State pairs {input, output}: feed output of one step to input of the next (zeros first). */
    @Nonnull @SuppressWarnings("unchecked")
    public List<String[]> state() {
        List<String[]> out = new ArrayList<String[]>();
        Object s = json.get("state");
        if (s instanceof List) {
            for (Object o : (List<Object>) s) {
                Map<String, Object> m = (Map<String, Object>) o;
                out.add(new String[] {(String) m.get("input"), (String) m.get("output")});
            }
        }
        return out;
    }

    /** {@code classification}, {@code dense_map}, {@code ctc}, {@code embedding}, ... */
    @Nonnull @SuppressWarnings("unchecked")
    public String taskKind() { return (String) ((Map<String, Object>) json.get("task")).get("kind"); }

    /** The output the task reads, or null. */
    @Nullable @SuppressWarnings("unchecked")
    public String taskOutput() { return (String) ((Map<String, Object>) json.get("task")).get("output"); }

    /** The contract as canonical JSON (every key this client knows). */
    @Nonnull
    public String toJson() { return Json.canonicalString(json); }

    @SuppressWarnings("unchecked")
    private static List<TensorSpec> specs(List<Object> l) {
        List<TensorSpec> out = new ArrayList<TensorSpec>();
        for (Object o : l) out.add(new TensorSpec((Map<String, Object>) o));
        return Collections.unmodifiableList(out);
    }
}
