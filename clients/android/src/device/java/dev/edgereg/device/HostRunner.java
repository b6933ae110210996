package dev.edgereg.device;

import dev.edgereg.ModelRunner;
import dev.edgereg.Tensor;
import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Json;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A {@link ModelRunner} over the host runner process (docs/reference/device-program.md, "The host
 * model runner"): one JSON object per line to its stdin, one back from its stdout.
 */
final class HostRunner implements ModelRunner {
    private final List<String> command;
    private Process process;
    private OutputStream stdin;
    private BufferedReader stdout;

    /** The MNN APIs the runner process calls (its --api): the device program's configure says. */
    private final java.util.Set<String> apis;

    HostRunner(List<String> command, java.util.Set<String> apis) {
        this.command = command;
        this.apis = apis;
    }

    @Override
    public java.util.Set<String> mnnApis() {
        return apis;
    }

    private synchronized Map<String, Object> call(Map<String, Object> request) throws IOException {
        if (process == null) {
            ProcessBuilder pb = new ProcessBuilder(command);
            pb.redirectError(ProcessBuilder.Redirect.INHERIT);
            process = pb.start();
            stdin = process.getOutputStream();
            stdout = new BufferedReader(new InputStreamReader(process.getInputStream(), "UTF-8"));
        }
        stdin.write(Json.canonical(request));
        stdin.write('\n');
        stdin.flush();
        String line = stdout.readLine();
        if (line == null) throw new IOException("the host runner exited");
        try {
            @SuppressWarnings("unchecked")
            Map<String, Object> m = (Map<String, Object>) Json.parse(line);
            return m;
        } catch (Json.JsonException e) {
            throw new IOException("the host runner answered no JSON: " + e.getMessage());
        }
    }

    @Override
    public Session load(File model, String backend, int threads, String precision) throws Exception {
        Map<String, Object> req = new LinkedHashMap<String, Object>();
        req.put("op", "load");
        req.put("model", model.getAbsolutePath());
        req.put("backend", backend);
        req.put("threads", (long) threads);
        req.put("precision", precision);
        Map<String, Object> answer = call(req);
        if (answer.containsKey("error")) {
            if (Boolean.TRUE.equals(answer.get("unavailable"))) throw new BackendUnavailableException(String.valueOf(answer.get("error")));
            throw new IOException(String.valueOf(answer.get("error")));
        }
        final String session = String.valueOf(answer.get("session"));
        return new Session() {
            @Override public Map<String, Tensor> run(Map<String, Tensor> inputs, List<String> wanted) throws Exception {
                Map<String, Object> req = new LinkedHashMap<String, Object>();
                req.put("op", "run");
                req.put("session", session);
                Map<String, Object> ins = new LinkedHashMap<String, Object>();
                for (Map.Entry<String, Tensor> e : inputs.entrySet()) ins.put(e.getKey(), tensorJson(e.getValue()));
                req.put("inputs", ins);
                Map<String, Object> answer = call(req);
                if (answer.containsKey("error")) throw new IOException(String.valueOf(answer.get("error")));
                Map<String, Tensor> out = new LinkedHashMap<String, Tensor>();
                @SuppressWarnings("unchecked")
                Map<String, Object> outputs = (Map<String, Object>) answer.get("outputs");
                for (Map.Entry<String, Object> e : outputs.entrySet()) {
                    @SuppressWarnings("unchecked")
                    Map<String, Object> t = (Map<String, Object>) e.getValue();
                    @SuppressWarnings("unchecked")
                    List<Object> dims = (List<Object>) t.get("shape");
                    int[] shape = new int[dims.size()];
                    for (int i = 0; i < shape.length; i++) shape[i] = ((Json.Num) dims.get(i)).longValue().intValue();
                    byte[] data = Codec.base64Decode((String) t.get("data"));
                    if (data == null) throw new IOException("the host runner sent data that is not base64");
                    out.put(e.getKey(), new Tensor((String) t.get("dtype"), shape, data));
                }
                return out;
            }

            @Override public int[] inputShape(String name) {
                return null; // the runner protocol has no shape query: the contract's shape is used
            }

            @Override public void close() throws IOException {
                Map<String, Object> req = new LinkedHashMap<String, Object>();
                req.put("op", "close");
                req.put("session", session);
                call(req);
            }
        };
    }

    private static Map<String, Object> tensorJson(Tensor t) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("dtype", t.dtype);
        List<Object> shape = new java.util.ArrayList<Object>();
        for (int d : t.shape) shape.add((long) d);
        m.put("shape", shape);
        m.put("data", Codec.base64(t.data));
        return m;
    }

    void close() {
        if (process != null) {
            process.destroy();
            process = null;
        }
    }
}
