package dev.edgereg;

import dev.edgereg.internal.Json;
import dev.edgereg.internal.Probe;
import dev.edgereg.internal.Rejected;
import java.io.File;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The golden-probe self-test of one model (docs/protocol.md section 11, rules 15 to 19) through
 * the app's {@link ModelRunner}: each hinted backend in order, CPU last; a failing backend is
 * remembered per model version in selftest.json and never tried again.
 */
final class SelfTest {
    static final class Outcome {
        String backend;
        final List<String> skipped = new ArrayList<String>();
        final List<String> unavailable = new ArrayList<String>();
        Double loadMs;
        String why;
        /** Every backend tried in this run failed to load (no output was ever judged). */
        boolean loadFailed;
        /** The CPU could not be created: the probe did not run, no verdict (rule 20). */
        boolean notRun;
    }

    /**
     * The verdict of a self-test's trials in the entry's backend order (docs/protocol.md section
     * 11, rules 15 to 20): each {@code {backend, kind}} with kind {@code passed}, {@code loaded}
     * (no probe), {@code failed}, {@code load-failed}, {@code unavailable} or {@code remembered}.
     * Returns {verdict ("install", "reject", "not-run"), chosen backend or null}.
     */
    static String[] judge(List<String[]> trials) {
        for (String[] t : trials) {
            if (t[1].equals("passed") || t[1].equals("loaded")) return new String[] {"install", t[0]};
        }
        String cpu = null;
        for (String[] t : trials) if (t[0].equals("cpu")) cpu = t[1];
        if (cpu == null || cpu.equals("unavailable")) return new String[] {"not-run", null};
        return new String[] {"reject", null};
    }

    private final EdgeregClient client;
    private final String model;
    private final dev.edgereg.internal.Wire.Entry entry;
    private final File artifact;
    private final Probe probe;

    SelfTest(EdgeregClient client, String model, dev.edgereg.internal.Wire.Entry entry, File artifact, Probe probe) {
        this.client = client;
        this.model = model;
        this.entry = entry;
        this.artifact = artifact;
        this.probe = probe;
    }

    private File file() { return new File(client.store.root, "selftest.json"); }

    @SuppressWarnings("unchecked")
    private Map<String, Object> memory(Map<String, Object> all) {
        Object byModel = all.get(model);
        if (!(byModel instanceof Map)) all.put(model, byModel = new LinkedHashMap<String, Object>());
        Object rec = ((Map<String, Object>) byModel).get(entry.version);
        if (!(rec instanceof Map) || !entry.blob.sha256.equals(((Map<String, Object>) rec).get("sha256"))) {
            rec = new LinkedHashMap<String, Object>();
            ((Map<String, Object>) rec).put("sha256", entry.blob.sha256);
            ((Map<String, Object>) rec).put("failed", new LinkedHashMap<String, Object>());
            ((Map<String, Object>) rec).put("rejected", Json.NULL);
            ((Map<String, Object>) byModel).put(entry.version, rec);
        }
        return (Map<String, Object>) rec;
    }

    /** Serialized across units: selftest.json is one file, and one model on the GPU at a time is kinder to a phone. */
    Outcome run() throws Rejected {
        synchronized (client.store) {
            return runLocked();
        }
    }

    @SuppressWarnings("unchecked")
    private Outcome runLocked() throws Rejected {
        Map<String, Object> all = client.store.readLenient(file());
        if (all == null) all = new LinkedHashMap<String, Object>();
        Map<String, Object> rec = memory(all);
        Outcome out = new Outcome();
        if (rec.get("rejected") instanceof String) {
            out.why = "rejected before on this device: " + rec.get("rejected");
            return out;
        }
        Map<String, Object> failed = (Map<String, Object>) rec.get("failed");
        boolean changed = false;
        List<String> tried = new ArrayList<String>();
        List<String[]> trials = new ArrayList<String[]>();
        StringBuilder why = new StringBuilder();
        for (String backend : entry.backends) {
            if (failed.containsKey(backend)) {
                out.skipped.add(backend);
                trials.add(new String[] {backend, "remembered"});
                why.append(why.length() > 0 ? "; " : "").append(backend).append(": ").append(failed.get(backend));
                continue;
            }
            String[] trial = attempt(backend, out);
            if (trial[0].equals("passed")) {
                out.backend = backend;
                trials.add(new String[] {backend, "passed"});
                break;
            }
            if (trial[0].equals("unavailable")) {
                out.unavailable.add(backend);
                trials.add(new String[] {backend, "unavailable"});
                why.append(why.length() > 0 ? "; " : "").append(backend).append(": unavailable (").append(trial[1]).append(")");
                continue;
            }
            failed.put(backend, trial[1]);
            tried.add(trial[1]);
            trials.add(new String[] {backend, trial[1].startsWith("does not load") ? "load-failed" : "failed"});
            out.skipped.add(backend);
            changed = true;
            why.append(why.length() > 0 ? "; " : "").append(backend).append(": ").append(trial[1]);
        }
        if (out.backend == null && judge(trials)[0].equals("not-run")) {
            // The runner cannot create the CPU: no verdict on the model (rule 20). Nothing is
            // marked bad; the backends that did fail stay remembered.
            out.notRun = true;
            out.why = why.toString();
            if (changed) client.store.write(file(), all);
            return out;
        }
        if (out.backend == null) {
            boolean allLoad = !tried.isEmpty();
            for (String t : tried) allLoad &= t.startsWith("does not load");
            out.loadFailed = allLoad;
            out.why = why.length() == 0 ? "no backend" : why.toString();
            rec.put("rejected", out.why);
            changed = true;
        }
        if (changed) client.store.write(file(), all);
        return out;
    }

    /** {outcome, detail}: passed, unavailable or failed. */
    private String[] attempt(String backend, Outcome out) {
        ModelRunner runner = client.runner;
        if (runner == null) return new String[] {"unavailable", "the app gave no model runner"};
        long started = System.nanoTime();
        ModelRunner.Session session;
        try {
            session = runner.load(artifact, backend, entry.threads, entry.precision);
        } catch (ModelRunner.BackendUnavailableException e) {
            return new String[] {"unavailable", String.valueOf(e.getMessage())};
        } catch (Throwable e) {
            return new String[] {"failed", "does not load: " + e};
        }
        double loadMs = (System.nanoTime() - started) / 1e6;
        try {
            if (probe == null) {
                out.loadMs = loadMs;
                return new String[] {"passed", null};
            }
            String failure;
            try {
                failure = runCases(session);
            } catch (Throwable e) {
                return new String[] {"failed", "does not run: " + e};
            }
            if (failure != null) return new String[] {"failed", failure};
            out.loadMs = loadMs;
            return new String[] {"passed", null};
        } finally {
            try {
                session.close();
            } catch (Throwable e) {
                // a session that cannot close changes no verdict
            }
        }
    }

    private String runCases(ModelRunner.Session session) throws Exception {
        int caseIndex = 0;
        for (List<Probe.Step> steps : probe.cases) {
            caseIndex++;
            Map<String, Tensor> state = new LinkedHashMap<String, Tensor>();
            for (String[] pair : probe.state) state.put(pair[0], zeros(session, pair[0]));
            int stepIndex = 0;
            for (Probe.Step step : steps) {
                stepIndex++;
                Map<String, Tensor> feeds = new LinkedHashMap<String, Tensor>();
                for (Probe.T t : step.inputs) feeds.put(t.name, new Tensor(t.dtype, t.shape, t.data));
                feeds.putAll(state);
                List<String> wanted = new ArrayList<String>();
                for (Probe.T t : step.expected) wanted.add(t.name);
                for (String[] pair : probe.state) if (!wanted.contains(pair[1])) wanted.add(pair[1]);
                Map<String, Tensor> outputs = session.run(feeds, wanted);
                for (String[] pair : probe.state) {
                    Tensor next = outputs.get(pair[1]);
                    if (next == null) return "missing-output: the model returned no state output '" + pair[1] + "'";
                    state.put(pair[0], next);
                }
                for (Probe.T want : step.expected) {
                    Tensor got = outputs.get(want.name);
                    String where = "case " + caseIndex + " step " + stepIndex + " output " + want.name;
                    String[] failure = got == null ? probe.check(where, null, null, null, want) : probe.check(where, got.dtype, got.shape, got.data, want);
                    if (failure != null) return failure[0] + ": " + failure[1];
                }
            }
        }
        return null;
    }

    /**
     * Zeros for a state input: dtype and shape from the entry's contract (a named axis as 1), or
     * the shape the runtime reports (a dynamic axis, -1 or 0, as 1) when there is no contract.
     */
    @SuppressWarnings("unchecked")
    private Tensor zeros(ModelRunner.Session session, String name) {
        int[] shape = null;
        String dtype = "float32";
        if (entry.contract != null) {
            for (Object o : (List<Object>) entry.contract.get("inputs")) {
                Map<String, Object> spec = (Map<String, Object>) o;
                if (!name.equals(spec.get("name"))) continue;
                dtype = (String) spec.get("dtype");
                List<Object> dims = (List<Object>) spec.get("shape");
                shape = new int[dims.size()];
                for (int i = 0; i < shape.length; i++) {
                    Object d = dims.get(i);
                    shape[i] = d instanceof Json.Num ? ((Json.Num) d).longValue().intValue() : 1;
                }
            }
        }
        if (shape == null) {
            int[] declared = session.inputShape(name);
            if (declared != null) {
                shape = declared.clone();
                for (int i = 0; i < shape.length; i++) if (shape[i] <= 0) shape[i] = 1;
            }
        }
        if (shape == null) throw new IllegalStateException("the model has no state input '" + name + "'");
        long count = 1;
        for (int d : shape) count *= d;
        int item = dtype.equals("int64") ? 8 : dtype.equals("float16") ? 2 : dtype.equals("int8") || dtype.equals("uint8") || dtype.equals("bool") ? 1 : 4;
        return new Tensor(dtype, shape, new byte[(int) (count * item)]);
    }
}
