package dev.edgereg;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Json;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The device program (docs/reference/device-program.md) as a separate process, as the Python
 * harness drives it: the device facts of fit rules (d) and (e), record_memory, substitute.
 */
class DeviceProgramTest {
    @TempDir File tmp;
    FakeRegistry registry;
    Process program;
    BufferedReader out;
    OutputStream in;
    int nextId;

    @BeforeEach void start() throws Exception {
        registry = new FakeRegistry();
        String java = new File(new File(System.getProperty("java.home"), "bin"), "java").getPath();
        String classpath = where("dev/edgereg/device/DeviceMain.class") + File.pathSeparator + where("dev/edgereg/EdgeregClient.class");
        program = new ProcessBuilder(java, "-cp", classpath, "dev.edgereg.device.DeviceMain")
                .redirectError(new File(tmp, "stderr.log")).start();
        out = new BufferedReader(new InputStreamReader(program.getInputStream(), "UTF-8"));
        in = program.getOutputStream();
    }

    /** The jar or folder a class comes from (the console launcher's -cp is not java.class.path). */
    static String where(String resource) throws Exception {
        String url = DeviceProgramTest.class.getClassLoader().getResource(resource).toString();
        if (url.startsWith("jar:")) url = url.substring(4, url.indexOf("!/"));
        else url = url.substring(0, url.length() - resource.length());
        return new File(new java.net.URI(url)).getPath();
    }

    @AfterEach void stop() throws Exception {
        program.destroy();
        registry.close();
    }

    @SuppressWarnings("unchecked")
    Map<String, Object> call(String op, Map<String, Object> args) throws Exception {
        Map<String, Object> request = new LinkedHashMap<String, Object>(args);
        request.put("id", (long) ++nextId);
        request.put("op", op);
        in.write(Json.canonical(request));
        in.write('\n');
        in.flush();
        String line = out.readLine();
        assertTrue(line != null, "the program ended; stderr: " + new String(java.nio.file.Files.readAllBytes(new File(tmp, "stderr.log").toPath()), "UTF-8"));
        Map<String, Object> answer = (Map<String, Object>) Json.parse(line);
        assertEquals(String.valueOf(nextId), String.valueOf(answer.get("id")));
        return answer;
    }

    @SuppressWarnings("unchecked")
    Map<String, Object> ok(String op, Map<String, Object> args) throws Exception {
        Map<String, Object> answer = call(op, args);
        assertEquals(Boolean.TRUE, answer.get("ok"), op + ": " + answer);
        return (Map<String, Object>) answer.get("result");
    }

    static Map<String, Object> args(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    Map<String, Object> configure(Object features, Object budget) {
        Map<String, Object> device = args("device_id", "device-7", "ram_mb", 8192L, "cpu_cores", 8L, "os", "android", "os_version", "34",
                "mnn_runtime", "3.6.1");
        return args("registry", registry.url(), "trusted_keys", new ArrayList<Object>(Arrays.asList(registry.publicPem)),
                "cache_dir", new File(tmp, "cache").getPath(), "unit", "digits", "bundle", false, "device", device, "tier", "mid",
                "self_test", false, "reporting", true, "now", "2025-06-01T12:00:00Z", "cpu_features", features, "memory_budget_mb", budget);
    }

    @Test
    @SuppressWarnings("unchecked")
    void theFactsOfRulesDAndEAndRecordMemory() throws Exception {
        List<String> cpu = Arrays.asList("cpu");
        Map<String, Object> entry = registry.blob(ClientTest.bytes(3000, 1), "1.0.0", "int8", cpu);
        Map<String, Object> instead = registry.blob(ClientTest.bytes(2000, 2), "1.0.0", "int8w", cpu);
        entry.put("avoid_cpu", new ArrayList<Object>(Arrays.asList("i8mm")));
        entry.put("instead", instead);
        entry.put("peak_memory_mb", 300L);
        registry.manifest("digits", "mid", 5, entry, null, null, "v1/reports");

        assertEquals(Boolean.FALSE, call("configure", configure(new ArrayList<Object>(Arrays.asList("I8MM")), Json.NULL)).get("ok"),
                "a name no manifest could name is misuse");
        assertEquals(Boolean.FALSE, call("configure", configure(Json.NULL, 0L)).get("ok"), "a budget of 0 is misuse");

        ok("configure", configure(Json.NULL, 256L));
        Map<String, Object> over = ok("update", args());
        assertEquals("insufficient-memory", over.get("error_code"), over.toString());
        assertEquals(Json.NULL, over.get("substitute"));

        ok("configure", configure(new ArrayList<Object>(Arrays.asList("dotprod", "i8mm")), 300L));
        Map<String, Object> r = ok("update", args());
        assertEquals(Json.NULL, r.get("error_code"), r.toString());
        assertEquals("cpu-unsupported", r.get("substitute"));
        assertEquals("int8w", ((Map<String, Object>) ((Map<String, Object>) r.get("members")).get("digits")).get("variant"));
        ok("record_inference", args("ms", 15.5));
        assertEquals(Boolean.FALSE, call("record_memory", args("peak_mb", "212")).get("ok"), "not a number");
        ok("record_memory", args("peak_mb", 212.5, "steady_mb", 140L));
        ok("flush", args());
        String last = Codec.utf8(registry.reports.get(registry.reports.size() - 1));
        Map<String, Object> report = (Map<String, Object>) Json.parse(last);
        assertEquals("2", String.valueOf(report.get("schema_version")), last);
        assertEquals("212.5", String.valueOf(report.get("memory_peak_mb")), last);
        assertEquals("140.0", String.valueOf(report.get("memory_steady_mb")), last);
        assertEquals("15.5", String.valueOf(report.get("first_inference_ms")), last);
        assertEquals("armv9", report.get("cpu_class"), last);
        assertEquals("int8w", report.get("variant"), last);
        ok("quit", args());
    }
}
