package dev.edgereg;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.CpuFeatures;
import dev.edgereg.internal.Json;
import dev.edgereg.internal.ReportCheck;
import java.io.File;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Fit rules (d) memory and (e) CPU through the whole client (the instead installed, the memory
 * budget), the device facts they read, and reports of schema version 2 over real HTTP.
 */
class FitAndReportsV2Test {
    @TempDir File tmp;
    FakeRegistry registry;
    static final List<String> CPU = Arrays.asList("cpu");

    @BeforeEach void start() throws Exception { registry = new FakeRegistry(); }

    @AfterEach void stop() { registry.close(); }

    DeviceFacts.Builder facts() {
        return DeviceFacts.builder("device-42").ramMb(8192).cpuCores(8).os("android", "34").mnnRuntime("3.6.1").appVersion("2.4.0");
    }

    EdgeregClient.Builder builder(File cache, DeviceFacts device) {
        return EdgeregClient.builder(registry.url(), cache)
                .trustedKey(registry.publicPem)
                .device(device)
                .tier("mid").model("digits").selfTest(false).reporting(false, null)
                .clock(() -> FakeRegistry.NOW);
    }

    static Set<String> set(String... names) { return new TreeSet<String>(Arrays.asList(names)); }

    /** Stable 1.0.0 (int8) avoids i8mm; its instead is int8w. Returns {int8 bytes, int8w bytes}. */
    byte[][] publishAvoidingI8mm(String reportUrl) throws Exception {
        byte[] int8 = ClientTest.bytes(4000, 1);
        byte[] int8w = ClientTest.bytes(3000, 2);
        Map<String, Object> entry = registry.blob(int8, "1.0.0", "int8", CPU);
        Map<String, Object> instead = registry.blob(int8w, "1.0.0", "int8w", CPU);
        instead.put("peak_memory_mb", 90L);
        entry.put("avoid_cpu", new ArrayList<Object>(Arrays.asList("i8mm")));
        entry.put("instead", instead);
        entry.put("peak_memory_mb", 120.5);
        registry.manifest("digits", "mid", 5, entry, null, null, reportUrl);
        return new byte[][] {int8, int8w};
    }

    @Test
    void aDeviceWithAnAvoidedFeatureInstallsTheInsteadAndOthersTheEntry() throws Exception {
        byte[][] blobs = publishAvoidingI8mm(null);
        EdgeregClient armv9 = builder(new File(tmp, "armv9"), facts().cpuFeatures(set("dotprod", "fp16", "i8mm")).build()).build();
        UpdateResult r = armv9.update("digits");
        assertTrue(r.ok(), r.toString());
        assertEquals("cpu-unsupported", r.substitute);
        assertNull(r.fallback);
        assertEquals("1.0.0", r.version);
        assertEquals("int8w", r.model().variant);
        assertArrayEquals(blobs[1], Files.readAllBytes(r.model().file.toPath()));
        assertEquals(0, registry.count("GET blobs/sha256/" + Codec.sha256Hex(blobs[0])), "the avoided variant is never downloaded");
        assertEquals("int8w", armv9.current("digits").model().variant, "current() returns the instead installed");
        assertTrue(armv9.update("digits").ok(), "the same decision again installs nothing new");
        assertEquals(1, registry.count("GET blobs/"));

        for (Set<String> features : Arrays.asList(set("dotprod"), Collections.<String>emptySet(), null)) {
            File cache = new File(tmp, "other-" + features);
            UpdateResult o = builder(cache, facts().cpuFeatures(features).build()).build().update("digits");
            assertTrue(o.ok(), o.toString());
            assertNull(o.substitute, String.valueOf(features));
            assertEquals("int8", o.model().variant, String.valueOf(features));
            assertArrayEquals(blobs[0], Files.readAllBytes(o.model().file.toPath()));
        }
    }

    @Test
    void theEntrysOwnMemoryComesBeforeItsInstead() throws Exception {
        publishAvoidingI8mm(null);
        UpdateResult r = builder(tmp, facts().cpuFeatures(set("i8mm")).memoryBudgetMb(64).build()).build().update("digits");
        assertEquals("insufficient-memory", r.errorCode, "the entry's own (d) comes first: " + r);
        r = builder(new File(tmp, "b"), facts().cpuFeatures(set("i8mm")).memoryBudgetMb(100).build()).build().update("digits");
        assertEquals("insufficient-memory", r.errorCode, "the entry (120.5) is over 100 though its instead (90) is not: " + r);
        r = builder(new File(tmp, "c"), facts().cpuFeatures(set("i8mm")).memoryBudgetMb(120.5).build()).build().update("digits");
        assertEquals("int8w", r.model().variant, r.toString());
    }

    @Test
    void aReleaseOverTheMemoryBudgetKeepsTheLastGood() throws Exception {
        Map<String, Object> v1 = registry.blob(ClientTest.bytes(1000, 1), "1.0.0", "int8", CPU);
        v1.put("peak_memory_mb", 256L);
        registry.manifest("digits", "mid", 5, v1, null, null, null);
        EdgeregClient client = builder(tmp, facts().memoryBudgetMb(256).build()).build();
        assertEquals("1.0.0", client.update("digits").version, "equal to the budget fits");
        Map<String, Object> v2 = registry.blob(ClientTest.bytes(1000, 2), "1.1.0", "int8", CPU);
        v2.put("peak_memory_mb", 256.5);
        registry.manifest("digits", "mid", 6, v2, null, null, null);
        UpdateResult r = client.update("digits");
        assertEquals("insufficient-memory", r.errorCode, r.toString());
        assertEquals("1.0.0", r.version, "the last good stays");
        assertEquals("insufficient-memory", client.status("digits").lastErrorCode);
        assertEquals("1.1.0", builder(new File(tmp, "unsaid"), facts().build()).build().update("digits").version,
                "without a budget rule (d) is skipped");
    }

    @Test
    void theDeviceFactsRefuseWhatNoManifestCouldName() {
        assertThrows(IllegalArgumentException.class, () -> facts().cpuFeatures(set("I8MM")));
        assertThrows(IllegalArgumentException.class, () -> facts().cpuFeatures(set("")));
        assertThrows(IllegalArgumentException.class, () -> facts().memoryBudgetMb(0));
        assertThrows(IllegalArgumentException.class, () -> facts().memoryBudgetMb(1048577));
        assertThrows(IllegalArgumentException.class, () -> facts().memoryBudgetMb(Double.NaN));
        assertEquals(Double.valueOf(1048576), facts().memoryBudgetMb(1048576).build().memoryBudgetMb);
        assertNull(facts().build().memoryBudgetMb, "not said");
        assertNull(facts().cpuFeatures(null).build().cpuFeatures, "said to be not said");
        assertEquals(set("i8mm"), facts().cpuFeatures(set("i8mm")).build().cpuFeatures);
        assertEquals(CpuFeatures.detect(), facts().build().cpuFeatures, "the default reads the platform");
    }

    @Test
    void cpuFeaturesAreReadFromProcCpuinfoOnAarch64Only() throws Exception {
        String pixel = "processor\t: 0\nBogoMIPS\t: 38.40\n"
                + "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n"
                + "CPU implementer\t: 0x41\n\nprocessor\t: 7\n"
                + "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop "
                + "sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp flagm2 frint i8mm bf16 sve2 bti\n";
        assertEquals(set("bf16", "dotprod", "fp16", "i8mm", "sve2"), CpuFeatures.fromCpuinfo(pixel), "every core's line, united");
        File cpuinfo = new File(tmp, "cpuinfo");
        Files.write(cpuinfo.toPath(), Codec.utf8("Features\t: fp asimd asimdhp\n"));
        assertEquals(set("fp16"), CpuFeatures.detect("aarch64", cpuinfo));
        assertEquals(Collections.emptySet(), CpuFeatures.detect("aarch64", writeFile("Features\t: fp asimd\n")), "said: none of them");
        assertNull(CpuFeatures.detect("aarch64", new File(tmp, "absent")), "unreadable: not said, never empty");
        assertNull(CpuFeatures.detect("aarch64", writeFile("processor\t: 0\n")), "no Features line: not said");
        assertEquals(Collections.emptySet(), CpuFeatures.detect("amd64", new File(tmp, "absent")), "x86_64: the empty set");
        assertEquals(Collections.emptySet(), CpuFeatures.detect("x86_64", cpuinfo));
        assertNull(CpuFeatures.detect("riscv64", cpuinfo));
        assertNull(CpuFeatures.detect("arm", cpuinfo), "32-bit ARM: not said");
    }

    File writeFile(String text) throws Exception {
        File f = File.createTempFile("cpuinfo", "", tmp);
        Files.write(f.toPath(), Codec.utf8(text));
        return f;
    }

    @Test
    void theCpuClassIsCoarse() {
        assertNull(CpuFeatures.cpuClass(null, "aarch64"));
        assertEquals("armv9", CpuFeatures.cpuClass(set("i8mm"), "aarch64"));
        assertEquals("armv9", CpuFeatures.cpuClass(set("sve2", "dotprod"), "aarch64"));
        assertEquals("armv8.2", CpuFeatures.cpuClass(set("dotprod"), "aarch64"));
        assertEquals("armv8.2", CpuFeatures.cpuClass(set("fp16", "bf16"), "aarch64"));
        assertEquals("armv8", CpuFeatures.cpuClass(set(), "aarch64"));
        assertEquals("armv8", CpuFeatures.cpuClass(set("bf16"), "amd64"), "an ARM feature is an ARM CPU's");
        assertEquals("armv8", CpuFeatures.cpuClass(set("sme"), "aarch64"));
        assertEquals("x86_64", CpuFeatures.cpuClass(set(), "amd64"));
        assertEquals("x86_64", CpuFeatures.cpuClass(set("avx512"), "x86_64"), "a feature of no class changes nothing");
        assertEquals("other", CpuFeatures.cpuClass(set(), "riscv64"));
    }

    List<String> reports() {
        List<String> out = new ArrayList<String>();
        for (byte[] b : registry.reports) out.add(Codec.utf8(b));
        for (String b : out) assertNull(ReportCheck.check(Codec.utf8(b)), "a valid report: " + b);
        return out;
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> json(String body) throws Exception {
        return (Map<String, Object>) Json.parse(body);
    }

    @Test
    void withoutAnyVersion2KeyAReportIsByteForByteVersion1() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(ClientTest.bytes(1000, 1), "1.0.0", "int8", CPU), null, null, "v1/reports");
        EdgeregClient client = builder(tmp, facts().cpuFeatures(null).build()).reporting(true, "ram8-8c").build();
        assertTrue(client.update("digits").ok());
        assertTrue(client.confirm("digits", "1.0.0"));
        client.flushReports(5000);
        List<String> bodies = reports();
        assertEquals(2, bodies.size(), bodies.toString());
        String expected = "{\"arm\":\"stable\",\"backend\":null,\"backends_skipped\":[],\"confirmed\":false,\"device_class\":\"ram8-8c\","
                + "\"inference\":null,\"load_failed\":false,\"load_ms\":null,\"mnn_runtime\":\"3.6.1\",\"model\":\"digits\",\"os\":\"android\","
                + "\"os_version\":\"34\",\"probe\":\"none\",\"reverted\":false,\"schema_version\":1,\"sequence\":5,\"tier\":\"mid\",\"token\":\""
                + json(bodies.get(0)).get("token") + "\",\"unit\":\"digits\",\"unit_version\":\"1.0.0\",\"variant\":\"int8\",\"version\":\"1.0.0\"}";
        assertEquals(expected, bodies.get(0), "the version 1 report of earlier releases");
        assertEquals(expected.replace("\"confirmed\":false", "\"confirmed\":true"), bodies.get(1));
    }

    @Test
    void version2ReportsCarryTheCpuClassStartsMemoryAndTheFirstInference() throws Exception {
        publishAvoidingI8mm("v1/reports");
        EdgeregClient client = builder(tmp, facts().cpuFeatures(set("dotprod", "fp16", "i8mm")).build())
                .reporting(true, null).maxUnconfirmedStarts(3).build();
        UpdateResult r = client.update("digits");
        assertEquals("int8w", r.model().variant);
        client.recordInference("digits", 12.5); // the install's first real call
        assertTrue(client.appStarted().isEmpty()); // installed before it: this start runs it
        assertTrue(client.appStarted().isEmpty()); // it ended unconfirmed: 1
        client.recordInference("digits", 4.0);
        assertTrue(client.appStarted().isEmpty()); // 2
        client.recordMemory("digits", 212.5, 140.0);
        client.recordMemory("digits", -1.0, null); // dropped: nothing to send
        assertTrue(client.confirm("digits", "1.0.0"));
        assertTrue(client.appStarted().isEmpty(), "a confirmed install counts no start");
        client.flushReports(5000);
        List<String> bodies = reports();
        assertEquals(5, bodies.size(), bodies.toString());
        Map<String, Object> installed = json(bodies.get(0));
        assertEquals("2", String.valueOf(installed.get("schema_version")));
        assertEquals("armv9", installed.get("cpu_class"));
        assertEquals("int8w", installed.get("variant"), "the variant installed");
        assertFalse(installed.containsKey("unconfirmed_starts"), "unset keys stay off the wire");
        assertFalse(installed.containsKey("first_inference_ms"));
        Map<String, Object> start1 = json(bodies.get(1));
        assertEquals("1", String.valueOf(start1.get("unconfirmed_starts")));
        assertEquals("12.5", String.valueOf(start1.get("first_inference_ms")));
        assertEquals("1", String.valueOf(((Map<?, ?>) start1.get("inference")).get("count")));
        Map<String, Object> start2 = json(bodies.get(2));
        assertEquals("2", String.valueOf(start2.get("unconfirmed_starts")));
        assertEquals("12.5", String.valueOf(start2.get("first_inference_ms")), "kept for the install's later reports");
        Map<String, Object> memory = json(bodies.get(3));
        assertEquals("212.5", String.valueOf(memory.get("memory_peak_mb")));
        assertEquals("140.0", String.valueOf(memory.get("memory_steady_mb")));
        Map<String, Object> confirmed = json(bodies.get(4));
        assertEquals(Boolean.TRUE, confirmed.get("confirmed"));
        assertEquals("212.5", String.valueOf(confirmed.get("memory_peak_mb")), "memory stays in the install's reports");
        assertEquals(installed.get("token"), confirmed.get("token"));

        // A new install starts again: its first inference is the next call, its starts from zero.
        Map<String, Object> v2 = registry.blob(ClientTest.bytes(1000, 7), "1.1.0", "int8", CPU);
        registry.manifest("digits", "mid", 6, v2, null, null, "v1/reports");
        assertEquals("1.1.0", client.update("digits").version);
        client.recordInference("digits", 30.0);
        assertTrue(client.appStarted().isEmpty());
        client.flushReports(5000);
        bodies = reports();
        Map<String, Object> next = json(bodies.get(bodies.size() - 1));
        assertEquals("1.1.0", next.get("version"));
        assertEquals("30.0", String.valueOf(next.get("first_inference_ms")));
        assertEquals("1", String.valueOf(next.get("unconfirmed_starts")));
        assertFalse(next.containsKey("memory_peak_mb"), "memory was the old install's");
        assertEquals("armv9", next.get("cpu_class"));
    }
}
