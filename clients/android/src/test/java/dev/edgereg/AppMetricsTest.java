package dev.edgereg;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.edgereg.internal.Json;
import dev.edgereg.internal.ReportCheck;
import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * App metrics (docs/protocol.md section 3, "App metrics"; section 11) through the whole client
 * over real HTTP: the installed release's declarations, counts per install kept across restarts
 * and sent as totals with every report (schema 3), the 12-hour resend, and misuse refused at the
 * call site.
 */
class AppMetricsTest {
    @TempDir File tmp;
    FakeRegistry registry;
    final AtomicLong now = new AtomicLong(FakeRegistry.NOW);
    static final List<String> CPU = Arrays.asList("cpu");

    @BeforeEach void start() throws Exception { registry = new FakeRegistry(); }

    /** Every client a test builds, closed after it (the counts' file is written in the background). */
    final List<EdgeregClient> clients = new ArrayList<EdgeregClient>();

    @AfterEach void stop() {
        for (EdgeregClient c : clients) c.close(5000);
        registry.close();
    }

    EdgeregClient built(EdgeregClient.Builder b) {
        EdgeregClient c = b.build();
        clients.add(c);
        return c;
    }

    EdgeregClient.Builder builder(File cache) {
        return EdgeregClient.builder(registry.url(), cache)
                .trustedKey(registry.publicPem)
                .device(DeviceFacts.builder("device-42").ramMb(8192).cpuCores(8).os("android", "34").mnnRuntime("3.6.1").build())
                .tier("mid").model("digits").selfTest(false).reporting(true, null)
                .clock(() -> now.get());
    }

    static Map<String, Object> declarations() {
        Map<String, Object> rate = new LinkedHashMap<String, Object>();
        rate.put("kind", "rate");
        rate.put("better", "higher"); // an unknown key: ignored
        Map<String, Object> dist = new LinkedHashMap<String, Object>();
        dist.put("kind", "distribution");
        dist.put("buckets", new ArrayList<Object>(Arrays.asList(0.5, 0.7, 0.9)));
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("accepted", rate);
        m.put("confidence", dist);
        return m;
    }

    Map<String, Object> entry(String version, boolean metrics) {
        Map<String, Object> e = registry.blob(ClientTest.bytes(1000, version.hashCode()), version, "int8", CPU);
        if (metrics) e.put("metrics", declarations());
        return e;
    }

    @SuppressWarnings("unchecked")
    List<Map<String, Object>> delivered(EdgeregClient client) throws Exception {
        client.flushReports(10000);
        List<Map<String, Object>> out = new ArrayList<Map<String, Object>>();
        synchronized (registry.reports) {
            for (byte[] b : registry.reports) {
                assertNull(ReportCheck.check(b), "a valid report: " + new String(b, "UTF-8"));
                out.add((Map<String, Object>) Json.parse(b));
            }
        }
        return out;
    }

    static String metrics(Map<String, Object> report) {
        return report.containsKey("metrics") ? Json.canonicalString(report.get("metrics")) : null;
    }

    static Map<String, Object> last(List<Map<String, Object>> reports) { return reports.get(reports.size() - 1); }

    @Test
    void theCountsGoAsTotalsWithEveryReportOfTheInstallInSchemaVersion3() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0", true), null, null, "v1/reports");
        EdgeregClient client = built(builder(tmp));
        assertFalse(client.record("accepted", true), "nothing installed: nothing counted, no error");
        assertFalse(client.observe("anything", 0.3), "nothing installed: not even the name is checked");
        assertTrue(client.metrics("digits").isEmpty());
        assertTrue(client.update("digits").ok());
        assertEquals(new TreeSet<String>(Arrays.asList("accepted", "confidence")), client.metrics("digits").keySet());
        assertEquals(Arrays.asList(0.5, 0.7, 0.9), client.metrics("digits").get("confidence").buckets);
        assertFalse("3".equals(last(delivered(client)).get("schema_version").toString()), "no count yet: no version 3 report");
        assertNull(metrics(last(delivered(client))));

        assertTrue(client.record("accepted", true));
        assertTrue(client.record("accepted", false));
        assertTrue(client.record("digits", "accepted", true));
        // (-inf, 0.5], (0.5, 0.7], (0.7, 0.9], (0.9, +inf): an edge falls in the bucket it closes.
        for (double v : new double[] {-3, 0.5, 0.50001, 0.7, 0.9, 0.95, 1e300}) assertTrue(client.observe("confidence", v));
        assertTrue(client.confirm("digits", "1.0.0"));
        Map<String, Object> confirmed = last(delivered(client));
        assertEquals("3", confirmed.get("schema_version").toString());
        assertEquals("{\"accepted\":{\"events\":3,\"successes\":2},\"confidence\":{\"counts\":[2,2,1,2]}}", metrics(confirmed));

        client.recordMemory("digits", 200.0, 150.0); // any later report carries the totals so far
        client.record("accepted", true);
        client.recordMemory("digits", 201.0, 150.0);
        assertEquals("{\"accepted\":{\"events\":4,\"successes\":3},\"confidence\":{\"counts\":[2,2,1,2]}}", metrics(last(delivered(client))));
    }

    @Test
    void misuseIsRefusedAtTheCallSiteAndNothingIsCounted() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0", true), null, null, "v1/reports");
        EdgeregClient client = built(builder(tmp));
        client.update("digits");
        IllegalArgumentException undeclared = assertThrows(IllegalArgumentException.class, () -> client.record("digits", "retried", true));
        assertTrue(undeclared.getMessage().contains("declares no app metric 'retried'"), undeclared.getMessage());
        IllegalArgumentException kind = assertThrows(IllegalArgumentException.class, () -> client.observe("accepted", 0.5));
        assertTrue(kind.getMessage().contains("is a rate: use record()"), kind.getMessage());
        assertThrows(IllegalArgumentException.class, () -> client.record("confidence", true));
        assertThrows(IllegalArgumentException.class, () -> client.observe("confidence", Double.NaN));
        assertThrows(IllegalArgumentException.class, () -> client.observe("confidence", Double.POSITIVE_INFINITY));
        assertThrows(IllegalArgumentException.class, () -> client.record("nomodel", "accepted", true), "an unknown unit");
        assertTrue(client.confirm("digits", "1.0.0"));
        assertNull(metrics(last(delivered(client))), "nothing was counted");
    }

    @Test
    void theCountsSurviveARestartAndANewInstallStartsAtZero() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0", true), null, null, "v1/reports");
        EdgeregClient first = built(builder(tmp));
        first.update("digits");
        first.record("accepted", true);
        first.observe("confidence", 0.6);
        first.close(5000);

        EdgeregClient again = built(builder(tmp)); // the app starts again
        again.record("accepted", false);
        assertTrue(again.confirm("digits", "1.0.0"));
        assertEquals("{\"accepted\":{\"events\":2,\"successes\":1},\"confidence\":{\"counts\":[0,1,0,0]}}", metrics(last(delivered(again))));

        registry.manifest("digits", "mid", 6, entry("1.1.0", true), null, null, "v1/reports");
        assertEquals("1.1.0", again.update("digits").version);
        Map<String, Object> installed = last(delivered(again));
        assertEquals("1.1.0", installed.get("version"));
        assertNull(metrics(installed), "a new install counts from zero");
        again.record("accepted", true);
        assertTrue(again.confirm("digits", "1.1.0"));
        assertEquals("{\"accepted\":{\"events\":1,\"successes\":1}}", metrics(last(delivered(again))));
    }

    @Test
    void countsThatChangedGoAgainAtTheFirstUpdateCheckTwelveHoursAfterTheLastReport() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0", true), null, null, "v1/reports");
        EdgeregClient client = built(builder(tmp));
        client.update("digits");
        int made = delivered(client).size();
        client.record("accepted", true);
        now.addAndGet(12 * 3600 - 1);
        assertTrue(client.update("digits").notModified);
        assertEquals(made, delivered(client).size(), "not 12 hours yet");
        now.addAndGet(1);
        assertTrue(client.update("digits").notModified);
        List<Map<String, Object>> reports = delivered(client);
        assertEquals(made + 1, reports.size(), "12 hours after the last report, with new counts");
        assertEquals("{\"accepted\":{\"events\":1,\"successes\":1}}", metrics(last(reports)));
        now.addAndGet(13 * 3600);
        client.update("digits");
        assertEquals(made + 1, delivered(client).size(), "nothing new counted: nothing sent");
    }

    @Test
    void aReleaseWithoutMetricsTakesNoneAndReportingOffCountsNothing() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0", false), null, null, "v1/reports");
        EdgeregClient client = built(builder(tmp));
        client.update("digits");
        assertThrows(IllegalArgumentException.class, () -> client.record("accepted", true));
        registry.manifest("digits", "mid", 6, entry("1.0.0", true), null, null, "v1/reports");
        EdgeregClient off = built(builder(new File(tmp, "off")).reporting(false, null));
        off.update("digits");
        assertFalse(off.record("accepted", true), "reporting off: nothing counted");
        assertThrows(IllegalArgumentException.class, () -> off.record("retried", true), "still a programming error");
    }

    @Test
    void aDeviceOnTheEntrysInsteadCountsTheEntrysMetrics() throws Exception {
        Map<String, Object> e = entry("1.0.0", true);
        e.put("avoid_cpu", new ArrayList<Object>(Arrays.asList("i8mm")));
        e.put("instead", registry.blob(ClientTest.bytes(900, 7), "1.0.0", "int8w", CPU));
        registry.manifest("digits", "mid", 5, e, null, null, "v1/reports");
        EdgeregClient client = built(builder(tmp).device(DeviceFacts.builder("d").mnnRuntime("3.6.1")
                .cpuFeatures(new TreeSet<String>(Arrays.asList("i8mm"))).build()));
        assertEquals("int8w", client.update("digits").model().variant);
        assertTrue(client.record("accepted", true));
    }

    @Test
    void eachMembersReportOfABundleCarriesTheUnitsCounts() throws Exception {
        Map<String, Object> members = new LinkedHashMap<String, Object>();
        members.put("det", registry.blob(ClientTest.bytes(800, 1), "2.0.0", "det-int8", CPU));
        members.put("rec", registry.blob(ClientTest.bytes(800, 2), "4.1.0", "rec-int8", CPU));
        Map<String, Object> bundle = new LinkedHashMap<String, Object>();
        bundle.put("version", "1.0.0");
        bundle.put("members", members);
        bundle.put("metrics", declarations());
        registry.manifest("ocr", "mid", 5, bundle, null, null, "v1/reports");
        EdgeregClient client = built(EdgeregClient.builder(registry.url(), tmp).trustedKey(registry.publicPem)
                .device(DeviceFacts.builder("d").mnnRuntime("3.6.1").build()).tier("mid").bundle("ocr").selfTest(false)
                .clock(() -> now.get()));
        UpdateResult installed = client.update("ocr");
        assertTrue(installed.ok(), installed.toString());
        client.record("accepted", false);
        client.observe("confidence", 0.95);
        assertTrue(client.confirm("ocr", "1.0.0"));
        List<Map<String, Object>> reports = delivered(client);
        List<Map<String, Object>> confirmed = reports.subList(reports.size() - 2, reports.size());
        for (Map<String, Object> r : confirmed) {
            assertEquals(Boolean.TRUE, r.get("confirmed"));
            assertEquals("{\"accepted\":{\"events\":1,\"successes\":0},\"confidence\":{\"counts\":[0,0,0,1]}}", metrics(r), r.get("model") + "");
        }
    }

    @Test
    void countsFromManyThreadsAreExact() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0", true), null, null, "v1/reports");
        final EdgeregClient client = built(builder(tmp));
        client.update("digits");
        final CountDownLatch go = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<Thread>();
        for (int t = 0; t < 8; t++) {
            final int seed = t;
            Thread th = new Thread(() -> {
                try {
                    go.await();
                } catch (InterruptedException e) {
                    return;
                }
                for (int i = 0; i < 500; i++) {
                    client.record("accepted", (i + seed) % 2 == 0);
                    client.observe("confidence", (i % 4) * 0.2 + 0.45); // 0.45, 0.65, 0.85, 1.05: one per bucket
                }
            });
            threads.add(th);
            th.start();
        }
        go.countDown();
        for (Thread th : threads) th.join();
        assertTrue(client.confirm("digits", "1.0.0"));
        assertEquals("{\"accepted\":{\"events\":4000,\"successes\":2000},\"confidence\":{\"counts\":[1000,1000,1000,1000]}}",
                metrics(last(delivered(client))));
    }
}
