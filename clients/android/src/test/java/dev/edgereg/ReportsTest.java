package dev.edgereg;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.edgereg.internal.Json;
import dev.edgereg.internal.ReportCheck;
import dev.edgereg.internal.Rules;
import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The reports of docs/protocol.md section 11 against a collector over real HTTP: every rollout
 * period for both arms (refused releases too), the latency of the model that ran, reports kept
 * until delivered, device facts that never stop a report, one at a time in order from any thread.
 */
class ReportsTest {
    @TempDir File tmp;
    FakeRegistry registry;
    static final List<String> CPU = Arrays.asList("cpu");
    static final String SALT = "5f3a9c0e1b2d4c6a"; // FakeRegistry's

    @BeforeEach void start() throws Exception { registry = new FakeRegistry(); }

    @AfterEach void stop() { registry.close(); }

    /** A device id inside (or outside) the cohort at {@code percent}. */
    static String device(boolean inside, double percent) {
        for (int n = 0;; n++) {
            String id = "device-" + n;
            if ((Rules.cohortBucket(id, SALT) < Math.round(percent * 100)) == inside) return id;
        }
    }

    EdgeregClient.Builder builder(String deviceId) {
        return EdgeregClient.builder(registry.url(), tmp)
                .trustedKey(registry.publicPem)
                .device(DeviceFacts.builder(deviceId).ramMb(8192).cpuCores(8).os("android", "34").mnnRuntime("3.6.1").appVersion("2.4.0").build())
                .tier("mid").model("digits").selfTest(false).reporting(true, "ram8-8c")
                .clock(() -> FakeRegistry.NOW);
    }

    Map<String, Object> entry(String version) {
        return registry.blob(ClientTest.bytes(1000, version.hashCode()), version, "int8", CPU);
    }

    Map<String, Object> probed(String version) {
        ClientTest helper = new ClientTest();
        helper.registry = registry;
        return helper.withProbe(registry.blob(ClientTest.bytes(1000, version.hashCode()), version, "int8", Arrays.asList("opencl", "cpu")));
    }

    /** The reports the collector accepted, in arrival order, each checked against the schema. */
    @SuppressWarnings("unchecked")
    List<Map<String, Object>> delivered() throws Exception {
        List<Map<String, Object>> out = new ArrayList<Map<String, Object>>();
        synchronized (registry.reports) {
            for (byte[] b : registry.reports) {
                assertNull(ReportCheck.check(b), "a valid report: " + new String(b, "UTF-8"));
                out.add((Map<String, Object>) Json.parse(b));
            }
        }
        return out;
    }

    static Object count(Map<String, Object> report) {
        Object inf = report.get("inference");
        return inf instanceof Map ? ((Map<?, ?>) inf).get("count").toString() : null;
    }

    @Test
    void theStableArmReportsAgainOnceInEachNewSequenceWithTheLatencySinceItsLastReport() throws Exception {
        String outside = device(false, 50);
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        EdgeregClient client = builder(outside).build();
        assertTrue(client.update("digits").ok());
        assertTrue(client.confirm("digits", "1.0.0"));
        client.recordInference("digits", 12.5);
        assertTrue(client.update("digits").notModified);
        registry.manifest("digits", "mid", 6, entry("1.0.0"), entry("1.1.0"), 50.0, "v1/reports");
        assertEquals("1.0.0", client.update("digits").version);
        assertTrue(client.update("digits").notModified, "a 304 sends none");
        registry.manifest("digits", "mid", 7, entry("1.0.0"), entry("1.1.0"), 50.0, "v1/reports");
        assertTrue(client.update("digits").ok());
        client.update("digits"); // the same sequence again: none
        client.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(4, r.size(), r.toString()); // install, confirm, sequence 6, sequence 7
        assertEquals(Arrays.asList("5", "5", "6", "7"), Arrays.asList(r.get(0).get("sequence").toString(), r.get(1).get("sequence").toString(),
                r.get(2).get("sequence").toString(), r.get(3).get("sequence").toString()));
        for (Map<String, Object> x : r) {
            assertEquals("stable", x.get("arm"));
            assertEquals(r.get(0).get("token"), x.get("token"), "one install, one token");
        }
        assertEquals(Boolean.TRUE, r.get(2).get("confirmed"), "kept, not reset");
        assertEquals("1", count(r.get(2)), "the latency recorded since the last report");
        assertNull(count(r.get(3)), "none since");
    }

    @Test
    void aCandidateDeviceReportsAgainInItsArmAndNothingForAReleaseNotInstalledYet() throws Exception {
        String inside = device(true, 50);
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        EdgeregClient client = builder(inside).policy(new DownloadPolicy(false, false, 0)).build();
        DownloadPolicy.Conditions wifi = new DownloadPolicy.Conditions(false, true);
        assertTrue(client.update("digits", wifi).ok());
        registry.manifest("digits", "mid", 6, entry("1.0.0"), entry("1.1.0"), 50.0, "v1/reports");
        // Metered: the candidate's download is deferred; what the manifest gives is not installed.
        UpdateResult deferred = client.update("digits", new DownloadPolicy.Conditions(true, true));
        assertEquals("metered", deferred.deferred);
        assertEquals("1.1.0", client.update("digits", wifi).version);
        registry.manifest("digits", "mid", 7, entry("1.0.0"), entry("1.1.0"), 60.0, "v1/reports");
        assertTrue(client.update("digits", wifi).ok());
        client.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(3, r.size(), r.toString()); // 1.0.0's install; 1.1.0's install at 6, again at 7
        assertEquals("1.1.0", r.get(1).get("version"));
        assertEquals("6", r.get(1).get("sequence").toString());
        assertEquals("candidate", r.get(2).get("arm"));
        assertEquals("7", r.get(2).get("sequence").toString());
        assertEquals(r.get(1).get("token"), r.get(2).get("token"));
    }

    @Test
    void aRejectedCandidateIsReportedInEachPeriodUnderItsOwnTokenWithoutLatency() throws Exception {
        String inside = device(true, 50);
        registry.manifest("digits", "mid", 5, probed("1.0.0"), null, null, "v1/reports");
        ClientTest.FakeRunner runner = new ClientTest.FakeRunner();
        EdgeregClient client = builder(inside).selfTest(true).runner(runner).build();
        assertTrue(client.update("digits").ok());
        runner.cpuFaulty = true;
        Map<String, Object> candidate = probed("1.1.0");
        registry.manifest("digits", "mid", 6, probed("1.0.0"), candidate, 50.0, "v1/reports");
        assertEquals("probe-failed", client.update("digits").errorCode);
        client.recordInference("digits", 7.0); // 1.0.0 runs these calls
        registry.manifest("digits", "mid", 7, probed("1.0.0"), candidate, 60.0, "v1/reports");
        UpdateResult r7 = client.update("digits");
        assertEquals("bad-release", r7.fallback, r7.toString());
        assertEquals("1.0.0", r7.version);
        assertTrue(client.confirm("digits", "1.0.0"));
        client.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(4, r.size(), r.toString()); // 1.0.0's install, the rejection at 6 and at 7, 1.0.0's confirmation
        Map<String, Object> rejected = r.get(1);
        Map<String, Object> again = r.get(2);
        assertEquals(Arrays.asList("1.1.0", "failed", "candidate", "6"),
                Arrays.asList(rejected.get("version"), rejected.get("probe"), rejected.get("arm"), rejected.get("sequence").toString()));
        assertEquals(Arrays.asList("1.1.0", "failed", "candidate", "7"),
                Arrays.asList(again.get("version"), again.get("probe"), again.get("arm"), again.get("sequence").toString()));
        assertEquals(rejected.get("token"), again.get("token"), "the refusal's own token");
        assertEquals(Json.NULL, again.get("inference"), "a refused release ran nothing here");
        assertEquals(Arrays.asList("1.0.0", "1"), Arrays.asList(r.get(3).get("version"), count(r.get(3))),
                "the calls went to the release that ran them");
        assertEquals(r.get(0).get("token"), r.get(3).get("token"));
    }

    @Test
    void aRevertedCandidateIsReportedInEachPeriodWithNoneOfTheFallbacksLatency() throws Exception {
        String inside = device(true, 50);
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        EdgeregClient client = builder(inside).maxUnconfirmedStarts(1).build();
        assertTrue(client.update("digits").ok());
        assertTrue(client.confirm("digits", "1.0.0"));
        Map<String, Object> candidate = entry("1.1.0");
        registry.manifest("digits", "mid", 6, entry("1.0.0"), candidate, 50.0, "v1/reports");
        assertEquals("1.1.0", client.update("digits").version);
        client.recordInference("digits", 30.0); // 1.1.0 ran before appStarted: that start runs it
        assertTrue(client.appStarted().isEmpty());
        client.recordInference("digits", 31.0); // 1.1.0 again, then the app crashed
        // The next start counts the one that crashed (1, reported with both calls), then reverts.
        assertEquals(1, client.appStarted().size(), "reverted");
        client.recordInference("digits", 9.0); // the fallback, 1.0.0
        registry.manifest("digits", "mid", 7, entry("1.0.0"), candidate, 60.0, "v1/reports");
        assertEquals("1.0.0", client.update("digits").version);
        client.reportLatency();
        client.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        List<String> seen = new ArrayList<String>();
        for (Map<String, Object> x : r) seen.add(x.get("version") + "@" + x.get("sequence") + (Boolean.TRUE.equals(x.get("reverted")) ? " reverted" : "") + " " + count(x));
        // 1.0.0: install, confirm; 1.1.0: install, a start, the revert, then at 7 with none of the
        // fallback's calls; 1.0.0's latency.
        assertEquals(Arrays.asList("1.0.0@5 null", "1.0.0@5 null", "1.1.0@6 null", "1.1.0@6 2", "1.1.0@6 reverted null",
                "1.1.0@7 reverted null", "1.0.0@5 1"), seen);
        assertEquals("candidate", r.get(5).get("arm"));
        assertEquals(r.get(2).get("token"), r.get(5).get("token"));
        assertEquals(r.get(0).get("token"), r.get(6).get("token"), "the fallback's latency under the fallback's token");
        assertEquals("9.0", String.valueOf(((Map<?, ?>) r.get(6).get("inference")).get("p50_ms")));
    }

    @Test
    void aReportMadeOfflineWaitsForTheNetworkAcrossARestart() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        registry.postsUnanswered = true; // offline
        EdgeregClient client = builder("device-1").build();
        assertTrue(client.update("digits").ok());
        for (int i = 0; i < 3; i++) {
            client.update("digits");
            client.flushReports(5000);
        }
        client.close(5000);
        EdgeregClient restarted = builder("device-1").build();
        for (int i = 0; i < 4; i++) {
            restarted.update("digits");
            restarted.flushReports(5000);
        }
        assertTrue(registry.count("POST v1/reports") >= 6, "tried at the update checks: more than five tries, none answered");
        assertTrue(delivered().isEmpty());
        registry.postsUnanswered = false;
        restarted.update("digits"); // the network is back
        restarted.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(1, r.size(), "a try with no answer does not count: " + r);
        assertEquals("1.0.0", r.get(0).get("version"));
        int posts = registry.count("POST v1/reports");
        restarted.update("digits");
        restarted.flushReports(5000);
        assertEquals(posts, registry.count("POST v1/reports"), "delivered: never sent again");
    }

    @Test
    void fiveAnswered5xxDropAReportAndAnyOther4xxAtOnce() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        registry.postAnswers.addAll(Arrays.asList(503, 429, 0, 408, 500, 502)); // one unanswered: 5 counted in 6
        EdgeregClient client = builder("device-1").build();
        assertTrue(client.update("digits").ok());
        for (int i = 0; i < 8; i++) {
            client.flushReports(5000);
            client.update("digits");
        }
        client.flushReports(5000);
        assertEquals(6, registry.count("POST v1/reports"), "dropped after the fifth answered failure");
        assertTrue(delivered().isEmpty());
        registry.postAnswers.add(400);
        assertTrue(client.confirm("digits", null));
        for (int i = 0; i < 3; i++) {
            client.flushReports(5000);
            client.update("digits");
        }
        assertEquals(7, registry.count("POST v1/reports"), "a 400 is refused again: dropped at once");
        assertTrue(delivered().isEmpty());
    }

    @Test
    void aNewerReportOfTheSameInstallReplacesOneNotDelivered() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        registry.postAnswers.addAll(Arrays.asList(503, 503));
        EdgeregClient client = builder("device-1").build();
        assertTrue(client.update("digits").ok());
        client.flushReports(5000);
        assertTrue(client.confirm("digits", "1.0.0"));
        for (int i = 0; i < 3; i++) {
            client.flushReports(5000);
            client.update("digits");
        }
        client.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(1, r.size(), "the install's report, replaced, is not sent again: " + r);
        assertEquals(Boolean.TRUE, r.get(0).get("confirmed"));
    }

    @Test
    void atMostSixteenWaitTheOldestDropped() throws Exception {
        registry.postsUnanswered = true; // offline: tries do not count
        EdgeregClient client = builder("device-1").build();
        for (int i = 0; i < 17; i++) {
            registry.manifest("digits", "mid", 5 + i, entry("1.0." + i), null, null, "v1/reports");
            assertEquals("1.0." + i, client.update("digits").version);
            client.flushReports(5000);
        }
        registry.postsUnanswered = false;
        client.update("digits");
        client.flushReports(5000);
        List<String> versions = new ArrayList<String>();
        for (Map<String, Object> x : delivered()) versions.add((String) x.get("version"));
        List<String> expected = new ArrayList<String>();
        for (int i = 1; i < 17; i++) expected.add("1.0." + i);
        java.util.Collections.sort(versions);
        java.util.Collections.sort(expected);
        assertEquals(expected, versions, "1.0.0's report, the oldest, was dropped for the sixteen newer");
    }

    @Test
    void aFactThePatternRefusesIsSentAsNullNeverASkippedReport() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        String longClass = new String(new char[33]).replace('\0', 'r');
        String[][] cases = {
            {"14 (Upside Down Cake, a long build name)", "ram/8", "3.6.1 (1234)"},
            {"14\n", longClass, "v3.7.0-beta.1"},
            {"17.2", "ram8-8c", "3.6.1+local.5"},
            {"17.4 (21E219)", "ram8-8c", "3.6.1"},
        };
        for (int i = 0; i < cases.length; i++) {
            File cache = new File(tmp, "facts-" + i);
            EdgeregClient client = EdgeregClient.builder(registry.url(), cache).trustedKey(registry.publicPem)
                    .device(DeviceFacts.builder("d" + i).ramMb(8192).cpuCores(8).os("android", cases[i][0]).mnnRuntime(cases[i][2]).build())
                    .tier("mid").model("digits").selfTest(false).reporting(true, cases[i][1]).clock(() -> FakeRegistry.NOW).build();
            UpdateResult installed = client.update("digits");
            assertTrue(installed.ok(), i + ": " + installed);
            client.flushReports(5000);
        }
        List<Map<String, Object>> r = delivered();
        assertEquals(4, r.size(), "every report sent");
        assertEquals(Arrays.asList(Json.NULL, Json.NULL, "3.6.1 (1234)"), Arrays.asList(r.get(0).get("os_version"), r.get(0).get("device_class"), r.get(0).get("mnn_runtime")));
        assertEquals(Arrays.asList(Json.NULL, Json.NULL, "v3.7.0-beta.1"), Arrays.asList(r.get(1).get("os_version"), r.get(1).get("device_class"), r.get(1).get("mnn_runtime")));
        assertEquals(Arrays.asList("17.2", "ram8-8c", "3.6.1+local.5"), Arrays.asList(r.get(2).get("os_version"), r.get(2).get("device_class"), r.get(2).get("mnn_runtime")));
        // A version of §7's grammar with its build: one grammar, sent as it is.
        assertEquals("17.4 (21E219)", r.get(3).get("os_version"));
    }

    @Test
    void reportsFromManyThreadsGoOneAtATimeInTheOrderMade() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        EdgeregClient client = builder("device-1").build();
        assertTrue(client.update("digits").ok());
        client.flushReports(5000);
        registry.postDelayMs = 20; // each report still in flight when the next is made
        final EdgeregClient c = client;
        final AtomicReference<Throwable> failure = new AtomicReference<Throwable>();
        final CountDownLatch go = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<Thread>();
        for (int t = 0; t < 4; t++) {
            Thread th = new Thread(() -> {
                try {
                    go.await();
                    for (int i = 0; i < 20; i++) {
                        c.recordInference("digits", i);
                        c.reportLatency();
                    }
                } catch (Throwable e) {
                    failure.set(e);
                }
            });
            threads.add(th);
            th.start();
        }
        go.countDown();
        for (int i = 1; i <= 10; i++) client.recordMemory("digits", (double) i, null); // from this thread, in order
        for (Thread th : threads) th.join();
        assertNull(failure.get());
        client.flushReports(30000);
        List<Double> peaks = new ArrayList<Double>();
        for (Map<String, Object> x : delivered()) {
            Object peak = x.get("memory_peak_mb");
            if (peak != null && (peaks.isEmpty() || !peaks.get(peaks.size() - 1).equals(Double.valueOf(peak.toString())))) {
                peaks.add(Double.valueOf(peak.toString()));
            }
        }
        assertEquals(Arrays.asList(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0), peaks, "arrived in the order made");
        assertEquals(1 + 10 + 80, delivered().size());
    }

    @Test
    void aReportAfterCloseIsKeptForTheNextProcessNeverAnException() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        EdgeregClient client = builder("device-1").build();
        assertTrue(client.update("digits").ok());
        client.close(5000);
        assertTrue(client.confirm("digits", "1.0.0"));
        client.reportLatency();
        client.flushReports(100);
        assertEquals(1, delivered().size());
        EdgeregClient next = builder("device-1").build();
        next.update("digits");
        next.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(2, r.size(), r.toString());
        assertEquals(Boolean.TRUE, r.get(1).get("confirmed"));
    }

    @Test
    @SuppressWarnings("unchecked")
    void aReportsFileOfTheEarlierSdkStillConfirmsUnderTheInstallsToken() throws Exception {
        registry.manifest("digits", "mid", 5, entry("1.0.0"), null, null, "v1/reports");
        registry.postAnswers.add(503);
        EdgeregClient client = builder("device-1").build();
        assertTrue(client.update("digits").ok());
        client.close(5000); // the try is over: kept
        // As SDK 0.2 wrote it: the latest report per unit/model, and one waiting for a retry.
        File file = new File(tmp, "reports.json");
        Map<String, Object> now = (Map<String, Object>) Json.parse(java.nio.file.Files.readAllBytes(file.toPath()));
        Map<String, Object> made = (Map<String, Object>) ((Map<String, Object>) now.get("reports")).get("digits/digits/1.0.0");
        Map<String, Object> latest = new java.util.LinkedHashMap<String, Object>();
        latest.put("digits/digits", made);
        Map<String, Object> old = new java.util.LinkedHashMap<String, Object>();
        old.put("latest", latest);
        old.put("retry", now.get("undelivered"));
        java.nio.file.Files.write(file.toPath(), Json.canonical(old));
        EdgeregClient upgraded = builder("device-1").build();
        upgraded.update("digits");
        upgraded.flushReports(5000);
        assertTrue(upgraded.confirm("digits", "1.0.0"));
        upgraded.flushReports(5000);
        List<Map<String, Object>> r = delivered();
        assertEquals(2, r.size(), r.toString());
        assertEquals(Boolean.FALSE, r.get(0).get("confirmed"), "the waiting one, sent at the update check");
        assertEquals(Boolean.TRUE, r.get(1).get("confirmed"));
        assertEquals(r.get(0).get("token"), r.get(1).get("token"));
    }
}
