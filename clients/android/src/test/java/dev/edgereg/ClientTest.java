package dev.edgereg;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Json;
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The client's whole flow against a registry served over real HTTP (in-process). */
class ClientTest {
    @TempDir File tmp;
    FakeRegistry registry;
    static final List<String> CPU = Arrays.asList("cpu");

    @BeforeEach void start() throws Exception { registry = new FakeRegistry(); }

    @AfterEach void stop() { registry.close(); }

    static byte[] bytes(int n, int seed) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) b[i] = (byte) (i * 31 + seed);
        return b;
    }

    EdgeregClient.Builder builder(File cache) {
        return EdgeregClient.builder(registry.url(), cache)
                .trustedKey(registry.publicPem)
                .device(DeviceFacts.builder("device-42").ramMb(8192).cpuCores(8).os("android", "34").mnnRuntime("3.6.1").appVersion("2.4.0").build())
                .tier("mid").model("digits").selfTest(false).reporting(false, null)
                .clock(() -> FakeRegistry.NOW);
    }

    @Test
    void installsThenRevalidatesWith304() throws Exception {
        byte[] model = bytes(300000, 1);
        registry.manifest("digits", "mid", 5, registry.blob(model, "1.0.0", "int8", CPU), null, null, null);
        EdgeregClient client = builder(tmp).build();
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertTrue(r.updated);
        assertEquals("1.0.0", r.version);
        assertEquals(300000, r.downloadedBytes);
        assertArrayEquals(model, Files.readAllBytes(r.model().file.toPath()));
        UpdateResult again = client.update("digits");
        assertTrue(again.ok());
        assertTrue(again.notModified);
        assertFalse(again.updated);
        assertEquals(1, registry.count("GET blobs/"), "the blob is fetched once");
        Status s = client.status("digits");
        assertTrue(s.ready);
        assertEquals("1.0.0", s.installed.version);
        assertEquals("1.0.0", client.current("digits").version);
        assertFalse(new File(tmp, "reports.json").exists(), "reporting off stores nothing");
        assertFalse(new String(Files.readAllBytes(new File(tmp, "installed.json").toPath()), "UTF-8").contains("token"), "and no token");
    }

    /** One runtime_hints rule {match, runtime, percent, salt} (docs/protocol.md section 3). */
    static Map<String, Object> hintRule(Map<String, Object> match, long threads, List<Object> backends, double percent) {
        Map<String, Object> rt = new java.util.LinkedHashMap<String, Object>();
        rt.put("threads", threads);
        rt.put("backends", backends);
        Map<String, Object> rule = new java.util.LinkedHashMap<String, Object>();
        rule.put("match", match);
        rule.put("runtime", rt);
        rule.put("percent", percent);
        rule.put("salt", "0d15ea5e");
        return rule;
    }

    /**
     * Section 11, "Runtime hints": the first rule matching this device's cores (8) gives its
     * threads and backends, the declared precision stays, and the model says which rule; a rule
     * changed in a manifest with no new blob reaches the installed release without a download.
     */
    @Test
    void theFirstMatchingHintRuleGivesTheRuntimeAndAChangeNeedsNoDownload() throws Exception {
        byte[] model = bytes(4000, 2);
        Map<String, Object> entry = registry.blob(model, "1.0.0", "int8", CPU);
        Map<String, Object> eight = new java.util.LinkedHashMap<String, Object>();
        eight.put("cores", 8L);
        Map<String, Object> gpu = new java.util.LinkedHashMap<String, Object>();
        gpu.put("gpu", "adreno"); // a key this client does not know: never matches
        entry.put("runtime_hints", new java.util.ArrayList<Object>(java.util.Arrays.asList(
                hintRule(gpu, 1L, new java.util.ArrayList<Object>(CPU), 100.0),
                hintRule(eight, 2L, new java.util.ArrayList<Object>(CPU), 100.0))));
        registry.manifest("digits", "mid", 5, entry, null, null, null);
        EdgeregClient client = builder(tmp).build();
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertEquals(2, r.model().threads);
        assertEquals(Integer.valueOf(1), r.model().runtimeRule);
        assertEquals("normal", r.model().precision);
        assertEquals(2, client.current("digits").model().threads, "kept with the install");

        entry.remove("runtime_hints"); // the rule removed (a rollback), the sequence advanced
        registry.manifest("digits", "mid", 6, entry, null, null, null);
        UpdateResult after = client.update("digits");
        assertTrue(after.ok(), after.toString());
        assertEquals(4, after.model().threads);
        assertNull(after.model().runtimeRule);
        assertEquals(4, client.current("digits").model().threads);
        assertEquals(1, registry.count("GET blobs/"), "a hint never changes the blob");
    }

    /** A core count the app never said is unknown to the hint match: a rule for one core does not match it. */
    @Test
    void anUnsaidCoreCountMatchesNoHintRule() throws Exception {
        Map<String, Object> entry = registry.blob(bytes(4000, 3), "1.0.0", "int8", CPU);
        Map<String, Object> one = new java.util.LinkedHashMap<String, Object>();
        one.put("cores", 1L);
        entry.put("runtime_hints", new java.util.ArrayList<Object>(java.util.Arrays.asList(
                hintRule(one, 1L, new java.util.ArrayList<Object>(CPU), 100.0))));
        registry.manifest("digits", "mid", 5, entry, null, null, null);
        EdgeregClient client = EdgeregClient.builder(registry.url(), tmp)
                .trustedKey(registry.publicPem)
                .device(DeviceFacts.builder("device-42").ramMb(8192).mnnRuntime("3.6.1").build())
                .tier("mid").model("digits").selfTest(false).reporting(false, null)
                .clock(() -> FakeRegistry.NOW).build();
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertNull(r.model().runtimeRule);
        assertEquals(4, r.model().threads, "the declared runtime");
    }

    /**
     * The unchanged check stays under 400 bytes (issue 17): a short User-Agent and Accept, no
     * Pragma/Cache-Control, Accept-Encoding on blobs only. An app-wide ResponseCache is never
     * consulted: the client revalidates itself.
     */
    @Test
    void requestsCarryShortHeadersAndNoCacheAnswersForTheRegistry() throws Exception {
        byte[] model = bytes(5000, 3);
        registry.manifest("digits", "mid", 5, registry.blob(model, "1.0.0", "int8", CPU), null, null, null);
        EdgeregClient client = builder(tmp).build();
        assertTrue(client.update("digits").ok());
        assertTrue(client.update("digits").notModified);
        assertEquals(3, registry.requests.size(), registry.requests.toString());
        for (int i = 0; i < registry.requests.size(); i++) {
            String request = registry.requests.get(i);
            com.sun.net.httpserver.Headers h = registry.requestHeaders.get(i);
            assertEquals("edgereg-android/" + EdgeregClient.SDK_VERSION, h.getFirst("User-Agent"), request);
            assertEquals("*/*", h.getFirst("Accept"), request);
            assertNull(h.getFirst("Pragma"), request);
            assertNull(h.getFirst("Cache-Control"), request);
            assertEquals(request.startsWith("GET blobs/") ? "identity" : null, h.getFirst("Accept-Encoding"), request);
        }
        assertNotNull(registry.requestHeaders.get(2).getFirst("If-None-Match"), "the check is conditional");

        final java.util.concurrent.atomic.AtomicInteger consulted = new java.util.concurrent.atomic.AtomicInteger();
        java.net.ResponseCache.setDefault(new java.net.ResponseCache() {
            @Override public java.net.CacheResponse get(java.net.URI uri, String method, Map<String, List<String>> headers) {
                consulted.incrementAndGet();
                return null;
            }

            @Override public java.net.CacheRequest put(java.net.URI uri, java.net.URLConnection conn) {
                consulted.incrementAndGet();
                return null;
            }
        });
        try {
            assertTrue(client.update("digits").notModified);
        } finally {
            java.net.ResponseCache.setDefault(null);
        }
        assertEquals(0, consulted.get(), "an app's ResponseCache is bypassed");
    }

    @Test
    void updateAsyncRunsOnTheGivenExecutor() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        EdgeregClient client = builder(tmp).build();
        java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newSingleThreadExecutor(r -> new Thread(r, "worker-x"));
        final java.util.concurrent.CountDownLatch done = new java.util.concurrent.CountDownLatch(1);
        final Object[] seen = new Object[2];
        client.updateAsync("digits", null, pool, result -> {
            seen[0] = result;
            seen[1] = Thread.currentThread().getName();
            done.countDown();
        });
        assertTrue(done.await(10, java.util.concurrent.TimeUnit.SECONDS));
        assertEquals("1.0.0", ((UpdateResult) seen[0]).version);
        assertEquals("worker-x", seen[1]);
        pool.shutdown();
    }

    @Test
    void aTamperedBlobKeepsTheLastGood() throws Exception {
        Map<String, Object> good = registry.blob(bytes(5000, 1), "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, good, null, null, null);
        EdgeregClient client = builder(tmp).build();
        assertTrue(client.update("digits").ok());
        Map<String, Object> next = registry.blob(bytes(6000, 2), "1.1.0", "int8", CPU);
        registry.files.put((String) next.get("path"), bytes(6000, 3)); // same size, other bytes
        registry.manifest("digits", "mid", 6, next, null, null, null);
        UpdateResult r = client.update("digits");
        assertEquals("bad-blob", r.errorCode);
        assertEquals("1.0.0", r.version, "the last good stays");
        assertFalse(client.store.part((String) next.get("sha256")).exists(), "a bad digest deletes the .part");
        assertEquals("bad-blob", client.status("digits").lastErrorCode);
    }

    /** The hashing thread (HashPipe) ends with the update that started it: none is left behind. */
    static void assertNoHashingThreadLeft() throws InterruptedException {
        long until = System.currentTimeMillis() + 5000;
        while (true) {
            boolean alive = false;
            for (Thread t : Thread.getAllStackTraces().keySet()) alive |= t.isAlive() && t.getName().equals("edgereg-sha256");
            if (!alive) return;
            assertTrue(System.currentTimeMillis() < until, "an edgereg-sha256 thread outlived its update");
            Thread.sleep(20);
        }
    }

    @Test
    void aPartChangedUnderTheDownloadIsNeverInstalled() throws Exception {
        byte[] model = bytes(300000, 4);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        final EdgeregClient client = builder(tmp).build();
        final File part = client.store.part((String) e.get("sha256"));
        // After the last byte is written (the digest follows those bytes only), the part grows.
        UpdateResult r = client.updateAsync("digits", null, Runnable::run, (done, total) -> {
            if (done < total) return;
            try (java.io.RandomAccessFile f = new java.io.RandomAccessFile(part, "rw")) {
                f.seek(f.length());
                f.write(new byte[10]);
            } catch (java.io.IOException x) {
                throw new AssertionError(x);
            }
        }).get();
        assertEquals("cache", r.errorCode, r.toString());
        assertTrue(r.errorMessage.contains("changed under the download"), r.errorMessage);
        assertNull(r.version, "nothing installed");
        assertFalse(client.store.blob((String) e.get("sha256")).exists(), "the grown part is not a blob");
        assertFalse(part.exists(), "and is not resumed from");
        assertNoHashingThreadLeft();
        UpdateResult again = client.update("digits");
        assertTrue(again.ok(), again.toString());
        assertArrayEquals(model, Files.readAllBytes(again.model().file.toPath()));
        assertTrue(client.status("digits").ready);
        assertNoHashingThreadLeft();
    }

    @Test
    void anInterruptedDownloadResumesWithRange() throws Exception {
        byte[] model = bytes(200000, 7);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        EdgeregClient client = builder(tmp).build();
        registry.cutNextBlobAt.set(70000);
        UpdateResult first = client.update("digits");
        assertEquals("transport", first.errorCode, first.toString());
        assertNull(first.version);
        File part = client.store.part((String) e.get("sha256"));
        assertTrue(part.length() > 0 && part.length() < 200000, "the .part stays: " + part.length());
        long had = part.length();
        UpdateResult second = client.update("digits");
        assertTrue(second.ok(), second.toString());
        assertEquals(200000 - had, second.downloadedBytes);
        assertTrue(registry.requests.contains("GET " + e.get("path") + " bytes=" + had + "-"), registry.requests.toString());
        assertArrayEquals(model, Files.readAllBytes(second.model().file.toPath()));
    }

    @Test
    void aShortContentLengthIsABadBlobRefusedBeforeReading() throws Exception {
        byte[] model = bytes(200000, 9);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        EdgeregClient client = builder(tmp).build();
        registry.shortenNextBlobBy.set(1);
        UpdateResult r = client.update("digits");
        // Rule 14: a complete answer of another length; asking again would bring it again.
        assertEquals("bad-blob", r.errorCode, r.toString());
        assertTrue(r.errorMessage.contains("refused before reading"), r.errorMessage);
        File part = client.store.part((String) e.get("sha256"));
        assertFalse(part.exists() && part.length() > 0, "nothing of the short answer is kept");
        UpdateResult again = client.update("digits");
        assertTrue(again.ok(), again.toString());
        assertArrayEquals(model, Files.readAllBytes(again.model().file.toPath()));
    }

    @Test
    void aBodyEndingShortWithoutContentLengthIsABadBlob() throws Exception {
        byte[] model = bytes(200000, 10);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        EdgeregClient client = builder(tmp).build();
        registry.endNextBlobWithoutLengthAt.set(60000);
        UpdateResult r = client.update("digits");
        assertEquals("bad-blob", r.errorCode, r.toString());
        assertFalse(client.store.part((String) e.get("sha256")).exists(), "a short blob is not resumed");
        // The same cut with a Content-Length is a connection cut: transport, and the .part stays.
        registry.cutNextBlobAt.set(60000);
        UpdateResult cut = client.update("digits");
        assertEquals("transport", cut.errorCode, cut.toString());
        assertTrue(client.store.part((String) e.get("sha256")).length() > 0, "the .part stays for a resume");
    }

    @Test
    void aServerIgnoringRangeStartsOver() throws Exception {
        byte[] model = bytes(200000, 8);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        EdgeregClient client = builder(tmp).build();
        registry.cutNextBlobAt.set(50000);
        assertEquals("transport", client.update("digits").errorCode);
        registry.ignoreRange = true;
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertArrayEquals(model, Files.readAllBytes(r.model().file.toPath()));
    }

    @Test
    void theWholeUpdateHasADeadlineEvenWhenBytesKeepComing() throws Exception {
        Map<String, Object> e = registry.blob(bytes(100000, 5), "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        registry.trickleMs = 150; // about 6.7 KB/s: above the minimum rate, far below the deadline
        EdgeregClient client = builder(tmp).limits(2000, 1500, 1).build();
        long started = System.currentTimeMillis();
        UpdateResult r = client.update("digits");
        long took = System.currentTimeMillis() - started;
        assertEquals("transport", r.errorCode, r.toString());
        assertTrue(r.errorMessage.contains("deadline"), r.errorMessage);
        assertTrue(took < 5000, "gave up after " + took + " ms");
        assertTrue(client.store.part((String) e.get("sha256")).length() > 0, "the .part stays for a resume");
    }

    /** A server that sends a status line, then one header line every 300 ms (each within the read timeout). */
    static java.net.ServerSocket trickleHeaders(final List<java.net.Socket> held) throws Exception {
        final java.net.ServerSocket server = new java.net.ServerSocket(0, 50, java.net.InetAddress.getByName("127.0.0.1"));
        Thread t = new Thread(new Runnable() {
            @Override public void run() {
                while (!server.isClosed()) {
                    try {
                        final java.net.Socket s = server.accept();
                        held.add(s);
                        new Thread(new Runnable() {
                            @Override public void run() {
                                try {
                                    s.getOutputStream().write(Codec.utf8("HTTP/1.1 200 OK\r\n"));
                                    for (int i = 0; i < 40; i++) { // 12 s: past any deadline of the test
                                        Thread.sleep(300);
                                        s.getOutputStream().write(Codec.utf8("X-Slow-" + i + ": a\r\n"));
                                    }
                                } catch (Exception e) {
                                    // the client gave up: that is the point
                                }
                            }
                        }).start();
                    } catch (java.io.IOException e) {
                        return;
                    }
                }
            }
        });
        t.setDaemon(true);
        t.start();
        return server;
    }

    /** Issue #30: headers trickled in under the read timeout held the fetch for 41 s or more. */
    @Test
    void responseHeadersHaveAnOverallDeadlineOnBothTransports() throws Exception {
        List<java.net.Socket> held = java.util.Collections.synchronizedList(new ArrayList<java.net.Socket>());
        java.net.ServerSocket server = trickleHeaders(held);
        try {
            String url = "http://127.0.0.1:" + server.getLocalPort() + "/";
            for (boolean raw : new boolean[] {false, true}) {
                EdgeregClient.Builder b = EdgeregClient.builder(url, new File(tmp, raw ? "raw" : "platform"))
                        .trustedKey(registry.publicPem)
                        .device(DeviceFacts.builder("device-42").ramMb(8192).cpuCores(8).os("android", "34").mnnRuntime("3.6.1").build())
                        .tier("mid").model("digits").selfTest(false).reporting(false, null)
                        .clock(() -> FakeRegistry.NOW)
                        .limits(1000, 60000, 1);
                if (raw) b.transport(new dev.edgereg.internal.RawHttp(java.net.InetAddress.getByName("127.0.0.1")));
                EdgeregClient client = b.build();
                long started = System.currentTimeMillis();
                UpdateResult r = client.update("digits");
                long took = System.currentTimeMillis() - started;
                assertEquals("transport", r.errorCode, r.toString());
                assertTrue(r.errorMessage.contains("headers did not arrive within 1000 ms"), r.errorMessage);
                assertTrue(took < 4000, (raw ? "raw" : "platform") + " gave up after " + took + " ms");
            }
        } finally {
            server.close();
            for (java.net.Socket s : held) s.close();
        }
    }

    @Test
    void aCancelledFutureStopsTheDownloadWithinASecondAndTheNextUpdateResumes() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        EdgeregClient client = builder(tmp).build();
        assertTrue(client.update("digits").ok());
        Map<String, Object> big = registry.blob(bytes(60000, 2), "1.1.0", "int8", CPU);
        registry.manifest("digits", "mid", 6, big, null, null, null);
        registry.trickleMs = 100; // 6 s for the new blob
        final List<long[]> seen = java.util.Collections.synchronizedList(new ArrayList<long[]>());
        java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newSingleThreadExecutor();
        UpdateFuture future = client.updateAsync("digits", null, pool, (done, total) -> seen.add(new long[] {done, total}));
        long until = System.currentTimeMillis() + 10000;
        while (seen.size() < 5 && System.currentTimeMillis() < until) Thread.sleep(20);
        assertEquals(0, seen.get(0)[0], "the first report comes before the first byte");
        assertEquals(60000, seen.get(0)[1], "with the total");
        long asked = System.nanoTime();
        assertTrue(future.cancel(true));
        future.cancel(true); // twice: nothing more happens
        assertTrue(future.isCancelled());
        // The update itself stops (not only the future): it records its error when it returns.
        while (!"cancelled".equals(client.status("digits", false).lastErrorCode) && System.nanoTime() - asked < 10_000_000_000L) Thread.sleep(10);
        long tookMs = (System.nanoTime() - asked) / 1000000;
        pool.shutdown();
        assertTrue(pool.awaitTermination(5, java.util.concurrent.TimeUnit.SECONDS));
        assertTrue(tookMs < 1000, "the cancelled update held on for " + tookMs + " ms");
        Status between = client.status("digits");
        assertEquals("1.0.0", between.installed.version, "nothing installed");
        assertTrue(between.pending.remainingBytes < 60000, "the part is kept: " + between.pending.remainingBytes + " bytes to go");
        assertNoHashingThreadLeft();
        registry.trickleMs = 0;
        UpdateResult after = client.update("digits");
        assertEquals("1.1.0", after.version, "the next update resumed and finished");
        assertTrue(after.downloadedBytes < 60000, "resumed from the part kept: " + after.downloadedBytes);
    }

    @Test
    void anInterruptedUpdateReturnsCancelledWithinASecondAndInstallsNothing() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        final EdgeregClient client = builder(tmp).build();
        assertTrue(client.update("digits").ok());
        Map<String, Object> big = registry.blob(bytes(60000, 2), "1.1.0", "int8", CPU);
        registry.manifest("digits", "mid", 6, big, null, null, null);
        registry.trickleMs = 100;
        final UpdateResult[] done = new UpdateResult[1];
        final long[] returned = new long[1];
        Thread worker = new Thread(() -> {
            done[0] = client.update("digits");
            returned[0] = System.nanoTime();
        });
        worker.start();
        long until = System.currentTimeMillis() + 10000;
        File part = client.store.part((String) big.get("sha256"));
        while ((!part.isFile() || part.length() < 5000) && System.currentTimeMillis() < until) Thread.sleep(20);
        long asked = System.nanoTime();
        worker.interrupt();
        worker.join(10000);
        long tookMs = (returned[0] - asked) / 1000000;
        assertTrue(tookMs < 1000, "returned " + tookMs + " ms after the interrupt");
        assertEquals("cancelled", done[0].errorCode, done[0].toString());
        assertEquals("1.0.0", done[0].version, "nothing installed");
        assertEquals("1.0.0", client.current("digits").version);
        assertTrue(part.length() > 0, "the part stays for a resume");
        assertEquals("1.1.0", client.status("digits").pending.version);
        assertNoHashingThreadLeft();
        // cancel() with nothing running does nothing.
        client.cancel("digits");
        client.cancel("digits");
    }

    @Test
    void aCancelWhileTheManifestIsFetchedIsCancelledNotATransportError() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        registry.manifestDelayMs = 1500;
        final EdgeregClient client = builder(tmp).build();
        for (boolean interrupt : new boolean[] {false, true}) {
            registry.requests.clear();
            final UpdateResult[] done = new UpdateResult[1];
            Thread worker = new Thread(() -> done[0] = client.update("digits"));
            worker.start();
            long until = System.currentTimeMillis() + 10000;
            while (registry.requests.isEmpty() && System.currentTimeMillis() < until) Thread.sleep(10);
            Thread.sleep(100); // the request is out, its answer held
            if (interrupt) worker.interrupt(); // a cancelled Worker
            else client.cancel("digits");
            worker.join(10000);
            // The connection the cancel cut is the cancel, not the network's failure (retried as one).
            assertEquals("cancelled", done[0].errorCode, done[0].toString());
            assertEquals("cancelled", client.status("digits").lastErrorCode);
        }
        registry.manifestDelayMs = 0;
        assertTrue(client.update("digits").ok());
    }

    @Test
    void checkListenersDeleteAndTheInstalledList() throws Exception {
        Map<String, Object> v1 = registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, v1, null, null, null);
        EdgeregClient client = builder(tmp).policy(DownloadPolicy.defaults().wifiOnly()).build();
        final List<String> heard = new ArrayList<String>();
        client.addListener(change -> heard.add(change.toString()));
        UpdateCheck first = client.check("digits", null);
        assertTrue(first.available);
        assertEquals("1.0.0", first.version);
        assertEquals(1000, first.downloadBytes);
        assertEquals("metered", first.deferred, "the network was not said");
        assertTrue(client.update("digits", new DownloadPolicy.Conditions(false, null)).updated);
        assertFalse(client.check("digits", null).available, "up to date");
        Map<String, Object> v2 = registry.blob(bytes(2000, 2), "1.1.0", "int8", CPU);
        registry.manifest("digits", "mid", 6, v2, null, null, null);
        assertTrue(client.update("digits", new DownloadPolicy.Conditions(false, null)).updated);
        registry.manifest("digits", "mid", 7, v1, null, null, null); // the server rolls 1.1.0 back
        assertEquals("1.0.0", client.update("digits", new DownloadPolicy.Conditions(false, null)).version);
        assertEquals(1, client.installedUnits().size());
        assertEquals("1.0.0", client.installedUnits().get(0).version);
        assertTrue(client.delete("digits"));
        assertFalse(client.delete("digits"), "twice: nothing more");
        assertTrue(client.installedUnits().isEmpty());
        assertNull(client.current("digits").version);
        assertEquals(Arrays.asList("digits installed null -> 1.0.0", "digits installed 1.0.0 -> 1.1.0", "digits rolled-back 1.1.0 -> 1.0.0",
                "digits deleted 1.0.0 -> null"), heard);
        client.addListener(change -> {
            throw new IllegalStateException("an app bug");
        });
        assertTrue(client.update("digits", new DownloadPolicy.Conditions(false, null)).updated, "a throwing listener breaks nothing");
    }

    @Test
    void currentAndStatusDoNotWaitForADownloadInProgress() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        final EdgeregClient client = builder(tmp).build();
        assertTrue(client.update("digits").ok());
        registry.manifest("digits", "mid", 6, registry.blob(bytes(30000, 2), "1.1.0", "int8", CPU), null, null, null);
        registry.trickleMs = 100; // 3 s for the new blob
        final UpdateResult[] done = new UpdateResult[1];
        Thread worker = new Thread(() -> done[0] = client.update("digits"));
        worker.start();
        Thread.sleep(500);
        long started = System.currentTimeMillis();
        assertEquals("1.0.0", client.current("digits").version);
        assertEquals("1.0.0", client.status("digits").installed.version);
        assertTrue(System.currentTimeMillis() - started < 1000, "reads do not wait for the download");
        worker.join();
        assertEquals("1.1.0", done[0].version);
    }

    @Test
    void aBundleInstallsAsOneSet() throws Exception {
        Map<String, Object> det = registry.blob(bytes(3000, 1), "1.0.0", "det-int8", CPU);
        Map<String, Object> rec = registry.blob(bytes(4000, 2), "2.0.0", "rec-int8", CPU);
        Map<String, Object> members = new LinkedHashMap<String, Object>();
        members.put("det", det);
        members.put("rec", rec);
        Map<String, Object> bundle = new LinkedHashMap<String, Object>();
        bundle.put("version", "1.0.0");
        bundle.put("members", members);
        registry.manifest("ocr", "mid", 3, bundle, null, null, null);
        registry.files.remove(rec.get("path")); // one member missing on the server
        EdgeregClient client = EdgeregClient.builder(registry.url(), tmp).trustedKey(registry.publicPem)
                .device(DeviceFacts.builder("d").mnnRuntime("3.6.1").build()).tier("mid").bundle("ocr").selfTest(false)
                .reporting(false, null).clock(() -> FakeRegistry.NOW).build();
        UpdateResult r = client.update("ocr");
        assertEquals("transport", r.errorCode);
        assertNull(client.current("ocr").version, "a partly downloaded set never becomes active");
        registry.files.put((String) rec.get("path"), bytes(4000, 2));
        UpdateResult ok = client.update("ocr");
        assertTrue(ok.ok(), ok.toString());
        assertEquals("1.0.0", ok.version);
        assertEquals(Arrays.asList("det", "rec"), new ArrayList<String>(ok.members.keySet()));
        assertEquals("2.0.0", ok.members.get("rec").version);
    }

    @Test
    void noSpaceDownloadsNothingAndConditionsDefer() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        EdgeregClient full = builder(new File(tmp, "a")).policy(new DownloadPolicy(true, false, Long.MAX_VALUE / 4)).build();
        assertEquals("no-space", full.update("digits").errorCode);
        assertEquals(0, registry.count("GET blobs/"));
        EdgeregClient wifiOnly = builder(new File(tmp, "b")).policy(new DownloadPolicy(false, true, 0)).build();
        UpdateResult r = wifiOnly.update("digits", new DownloadPolicy.Conditions(true, true));
        assertTrue(r.ok());
        assertEquals("metered", r.deferred);
        assertEquals("not-charging", wifiOnly.update("digits", new DownloadPolicy.Conditions(false, null)).deferred);
        assertEquals(0, registry.count("GET blobs/"), "no blob byte while deferred");
        Status s = wifiOnly.status("digits");
        assertNotNull(s.pending);
        assertEquals(1000, s.pending.remainingBytes);
        // The shortest form says nothing: unknown is unmet, so Wi-Fi only still waits.
        assertEquals("metered", wifiOnly.update("digits").deferred);
        assertEquals("metered", wifiOnly.update().deferred);
        assertEquals(0, registry.count("GET blobs/"), "no blob byte while the network is unknown");
        assertTrue(wifiOnly.update("digits", new DownloadPolicy.Conditions(false, true)).updated);
        assertNull(wifiOnly.status("digits").pending);
    }

    @Test
    void idleAndStorageConditionsDeferUntilSaidMet() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        DownloadPolicy overnight = DownloadPolicy.defaults().whileIdle().whileStorageNotLow();
        EdgeregClient client = builder(new File(tmp, "c")).policy(overnight).build();
        assertEquals("not-idle", client.update("digits").deferred);
        assertEquals("not-idle", client.update("digits", new DownloadPolicy.Conditions(null, null, false, false)).deferred);
        assertEquals("storage-low", client.update("digits", new DownloadPolicy.Conditions(null, null, true, null)).deferred);
        assertEquals("storage-low", client.update("digits", new DownloadPolicy.Conditions(null, null, true, true)).deferred);
        assertEquals(0, registry.count("GET blobs/"));
        assertTrue(client.update("digits", new DownloadPolicy.Conditions(null, null, true, false)).updated);
    }

    @Test
    void rollbackNotFoundAndEviction() throws Exception {
        Map<String, Object> v1 = registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, v1, null, null, null);
        EdgeregClient client = builder(tmp).build();
        assertTrue(client.update("digits").ok());
        Map<String, Object> v2 = registry.blob(bytes(1000, 2), "1.1.0", "int8", CPU);
        registry.manifest("digits", "mid", 6, v2, null, null, null);
        assertEquals("1.1.0", client.update("digits").version);
        Map<String, Object> v3 = registry.blob(bytes(1000, 3), "1.2.0", "int8", CPU);
        registry.manifest("digits", "mid", 7, v3, null, null, null);
        assertEquals("1.2.0", client.update("digits").version);
        assertFalse(client.store.blob((String) v1.get("sha256")).exists(), "neither installed nor last good: evicted");
        assertTrue(client.store.blob((String) v2.get("sha256")).exists(), "the last good stays on disk");
        registry.manifest("digits", "mid", 4, v1, null, null, null);
        UpdateResult r = client.update("digits");
        assertEquals("rollback", r.errorCode);
        assertEquals("1.2.0", r.version);
        registry.files.clear();
        assertEquals("not-found", client.update("digits").errorCode);
        UpdateResult back = client.revert("digits", "crashes");
        assertEquals("1.1.0", back.version, "revert needs no network");
        assertTrue(client.status("digits").refused.contains("1.2.0"));
    }

    // --- self-test ---------------------------------------------------------------------

    static byte[] floats(float... v) {
        ByteBuffer b = ByteBuffer.allocate(v.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        for (float f : v) b.putFloat(f);
        return b.array();
    }

    Map<String, Object> withProbe(Map<String, Object> entry) {
        Map<String, Object> tensorIn = new LinkedHashMap<String, Object>();
        tensorIn.put("name", "x");
        tensorIn.put("dtype", "float32");
        tensorIn.put("shape", new ArrayList<Object>(Arrays.asList(2L)));
        tensorIn.put("data", Codec.base64(floats(1, 1)));
        Map<String, Object> tensorOut = new LinkedHashMap<String, Object>(tensorIn);
        tensorOut.put("name", "y");
        tensorOut.put("data", Codec.base64(floats(1, 2)));
        Map<String, Object> step = new LinkedHashMap<String, Object>();
        step.put("inputs", new ArrayList<Object>(Arrays.asList(tensorIn)));
        step.put("expected", new ArrayList<Object>(Arrays.asList(tensorOut)));
        Map<String, Object> kase = new LinkedHashMap<String, Object>();
        kase.put("steps", new ArrayList<Object>(Arrays.asList(step)));
        Map<String, Object> probe = new LinkedHashMap<String, Object>();
        probe.put("schema_version", 1L);
        probe.put("model", "digits");
        probe.put("variant", "int8");
        probe.put("artifact_sha256", entry.get("sha256"));
        probe.put("cases", new ArrayList<Object>(Arrays.asList(kase)));
        Map<String, Object> tol = new LinkedHashMap<String, Object>();
        tol.put("min_cosine", 0.999);
        tol.put("max_abs_error", 0.01);
        probe.put("tolerance", tol);
        byte[] blob = Json.canonical(probe);
        registry.files.put("blobs/sha256/" + Codec.sha256Hex(blob), blob);
        Map<String, Object> ref = new LinkedHashMap<String, Object>();
        ref.put("path", "blobs/sha256/" + Codec.sha256Hex(blob));
        ref.put("sha256", Codec.sha256Hex(blob));
        ref.put("size", (long) blob.length);
        entry.put("probe", ref);
        return entry;
    }

    /** opencl miscomputes, vulkan does not exist here, cpu is right (unless told otherwise). */
    static final class FakeRunner implements ModelRunner {
        final List<String> loads = new ArrayList<String>();
        volatile boolean cpuFaulty;
        /** No MNN library in the app: no backend at all, CPU included. */
        volatile boolean nothing;

        @Override public Session load(File model, final String backend, int threads, String precision) throws Exception {
            loads.add(backend);
            if (nothing) throw new BackendUnavailableException("libMNN.so is not in this app");
            if (backend.equals("vulkan")) throw new BackendUnavailableException("no Vulkan driver");
            final boolean faulty = backend.equals("opencl") || cpuFaulty;
            return new Session() {
                @Override public Map<String, Tensor> run(Map<String, Tensor> inputs, List<String> wanted) {
                    assertEquals(Arrays.asList("y"), wanted);
                    Map<String, Tensor> out = new LinkedHashMap<String, Tensor>();
                    out.put("y", Tensor.ofFloats(new int[] {2}, faulty ? new float[] {2, 1} : new float[] {1, 2}));
                    return out;
                }

                @Override public int[] inputShape(String name) { return null; }

                @Override public void close() {}
            };
        }
    }

    @Test
    void theSelfTestPicksTheFirstPassingBackendAndRemembersFailures() throws Exception {
        Map<String, Object> e = withProbe(registry.blob(bytes(1000, 1), "1.0.0", "int8", Arrays.asList("opencl", "vulkan", "cpu")));
        registry.manifest("digits", "mid", 5, e, null, null, null);
        FakeRunner runner = new FakeRunner();
        EdgeregClient client = builder(tmp).selfTest(true).runner(runner).build();
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertEquals("cpu", r.model().backend);
        assertNotNull(r.model().probeFile);
        assertEquals(Arrays.asList("opencl", "vulkan", "cpu"), runner.loads);
        Map<?, ?> memory = (Map<?, ?>) Json.parse(Files.readAllBytes(new File(tmp, "selftest.json").toPath()));
        assertTrue(memory.toString().contains("opencl"), memory.toString());
        assertFalse(memory.toString().contains("vulkan"), "an unavailable backend is recorded nowhere");
    }

    @Test
    void aModelFailingEveryBackendIsRefusedForGood() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, null);
        FakeRunner runner = new FakeRunner();
        EdgeregClient client = builder(tmp).selfTest(true).runner(runner).build();
        assertTrue(client.update("digits").ok());
        Map<String, Object> e = withProbe(registry.blob(bytes(1000, 2), "1.1.0", "int8", Arrays.asList("opencl", "cpu")));
        registry.manifest("digits", "mid", 6, e, null, null, null);
        runner.cpuFaulty = true;
        UpdateResult r = client.update("digits");
        assertEquals("probe-failed", r.errorCode, r.toString());
        assertEquals("1.0.0", r.version);
        assertTrue(client.status("digits").refused.contains("1.1.0"));
        int blobs = registry.count("GET blobs/");
        runner.cpuFaulty = false;
        UpdateResult again = client.update("digits");
        assertEquals("bad-release", again.errorCode);
        assertEquals(blobs, registry.count("GET blobs/"), "never downloaded again");
    }

    @Test
    void aClientWithTheSelfTestAndNoRunnerRefusesToBeBuilt() {
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> builder(tmp).selfTest(true).build());
        assertTrue(e.getMessage().contains("no model runner"), e.getMessage());
        assertNotNull(builder(tmp).selfTest(false).build(), "without the self-test no runner is needed");
    }

    @Test
    void aProbeThatDidNotRunIsNoFailureNothingIsMarkedOrReportedAndTheNextUpdateInstalls() throws Exception {
        Map<String, Object> e = withProbe(registry.blob(bytes(1000, 1), "1.0.0", "int8", Arrays.asList("opencl", "cpu")));
        registry.manifest("digits", "mid", 5, e, null, null, "v1/reports");
        FakeRunner runner = new FakeRunner();
        runner.nothing = true;
        EdgeregClient client = builder(tmp).selfTest(true).runner(runner).reporting(true, null).build();
        UpdateResult r = client.update("digits");
        assertEquals("probe-not-run", r.errorCode, r.toString());
        assertNull(r.version);
        Status s = client.status("digits");
        assertTrue(s.refused.isEmpty(), "never marked bad");
        assertNotNull(s.pending, "still pending");
        client.flushReports(5000);
        assertEquals(0, registry.reports.size(), "never reported as a probe failure");
        runner.nothing = false;
        UpdateResult fixed = client.update("digits");
        assertTrue(fixed.ok(), fixed.toString());
        assertEquals("cpu", fixed.model().backend);
        client.flushReports(5000);
        assertEquals(1, registry.reports.size());
        assertTrue(Codec.utf8(registry.reports.get(0)).contains("\"probe\":\"passed\""));
    }

    @Test
    void aRejectionIsReportedButAConfirmationFlagsTheInstalledVersionsReport() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, "v1/reports");
        FakeRunner runner = new FakeRunner();
        EdgeregClient client = builder(tmp).selfTest(true).runner(runner).reporting(true, null).build();
        assertTrue(client.update("digits").ok());
        Map<String, Object> e = withProbe(registry.blob(bytes(1000, 2), "1.1.0", "int8", Arrays.asList("opencl", "cpu")));
        registry.manifest("digits", "mid", 6, e, null, null, "v1/reports");
        runner.cpuFaulty = true;
        assertEquals("probe-failed", client.update("digits").errorCode);
        assertTrue(client.confirm("digits", null));
        client.flushReports(5000);
        assertEquals(3, registry.reports.size());
        String rejected = Codec.utf8(registry.reports.get(1));
        assertTrue(rejected.contains("\"probe\":\"failed\"") && rejected.contains("\"version\":\"1.1.0\""), rejected);
        assertTrue(rejected.contains("\"backends_skipped\":[\"opencl\",\"cpu\"]"), rejected);
        String confirmed = Codec.utf8(registry.reports.get(2));
        assertTrue(confirmed.contains("\"confirmed\":true") && confirmed.contains("\"version\":\"1.0.0\""), confirmed);
    }

    @Test
    void unconfirmedInstallsAreRevertedAfterMaxStartsAndReportsFlow() throws Exception {
        Map<String, Object> v1 = registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, v1, null, null, "v1/reports");
        EdgeregClient client = builder(tmp).reporting(true, "ram8-8c").maxUnconfirmedStarts(2).build();
        assertTrue(client.update("digits").ok());
        assertTrue(client.appStarted().isEmpty());
        client.recordInference("digits", 12.5);
        assertTrue(client.confirm("digits", "1.0.0"));
        Map<String, Object> v2 = registry.blob(bytes(1000, 2), "1.1.0", "int8", CPU);
        registry.manifest("digits", "mid", 6, v2, null, null, "v1/reports");
        assertEquals("1.1.0", client.update("digits").version);
        assertFalse(client.confirm("digits", "1.0.0"), "confirming the old version does not count");
        // Installed after appStarted: this start runs 1.1.0 (and crashes); the next start counts
        // it (1), and the one after counts the second crash (2) and reverts.
        assertTrue(client.appStarted().isEmpty());
        List<AppStart> reverts = client.appStarted();
        assertEquals(1, reverts.size());
        assertEquals("1.1.0", reverts.get(0).version);
        assertEquals("1.0.0", reverts.get(0).nowVersion);
        assertEquals("1.0.0", client.current("digits").version);
        assertTrue(client.status("digits").refused.contains("1.1.0"));
        assertEquals("bad-release", client.update("digits").errorCode);
        client.flushReports(5000);
        List<String> bodies = new ArrayList<String>();
        for (byte[] b : registry.reports) bodies.add(Codec.utf8(b));
        assertTrue(bodies.size() >= 4, bodies.toString());
        for (String b : bodies) assertTrue(dev.edgereg.internal.ReportCheck.check(Codec.utf8(b)) == null, "a valid report: " + b);
        assertTrue(bodies.toString().contains("\"confirmed\":true"));
        assertTrue(bodies.toString().contains("\"inference\":{\"count\":1,\"p50_ms\":12.5,\"p90_ms\":12.5,\"p99_ms\":12.5}"),
                "the latency goes with the next report: " + bodies);
        assertTrue(bodies.toString().contains("\"reverted\":true"));
        assertTrue(registry.count("POST v1/reports") >= 4);
    }

    @Test
    void aTransportOfTheAppsCarriesEveryRequestAndResumesToo() throws Exception {
        byte[] model = bytes(150000, 4);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, "v1/reports");
        EdgeregClient client = builder(tmp).transport(new dev.edgereg.internal.RawHttp(java.net.InetAddress.getByName("127.0.0.9"))).reporting(true, null).build();
        registry.cutNextBlobAt.set(40000);
        assertEquals("transport", client.update("digits").errorCode);
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertTrue(r.notModified, "If-None-Match over the raw socket too");
        assertArrayEquals(model, Files.readAllBytes(r.model().file.toPath()));
        client.flushReports(5000);
        assertEquals(1, registry.count("POST v1/reports"));
        assertEquals(java.util.Collections.singleton("127.0.0.9"), registry.peers);
    }

    @Test
    void aConfirmationInAnotherProcessResendsTheInstallsReport() throws Exception {
        registry.manifest("digits", "mid", 5, registry.blob(bytes(1000, 1), "1.0.0", "int8", CPU), null, null, "v1/reports");
        EdgeregClient worker = builder(tmp).reporting(true, "ram8-8c").build();
        assertTrue(worker.update("digits").ok());
        worker.close(5000);
        EdgeregClient app = builder(tmp).reporting(true, "ram8-8c").build(); // a new process, the same cache
        assertTrue(app.confirm("digits", "1.0.0"));
        app.flushReports(5000);
        assertEquals(2, registry.reports.size());
        String first = Codec.utf8(registry.reports.get(0));
        String second = Codec.utf8(registry.reports.get(1));
        assertTrue(second.contains("\"confirmed\":true"), second);
        assertEquals(first.replace("\"confirmed\":false", "\"confirmed\":true"), second, "the same report, one flag set");
    }

    @Test
    void aShippedReleaseInstallsOfflineDespiteItsExpiry() throws Exception {
        byte[] model = bytes(2000, 9);
        Map<String, Object> e = registry.blob(model, "1.0.0", "int8", CPU);
        registry.manifest("digits", "mid", 5, e, null, null, null);
        File shipped = new File(tmp, "shipped");
        File blobs = new File(shipped, "blobs");
        blobs.mkdirs();
        Files.write(new File(shipped, "manifest.json").toPath(), registry.files.get("manifests/digits/mid.json"));
        Files.write(new File(blobs, (String) e.get("sha256")).toPath(), model);
        registry.close();
        EdgeregClient client = builder(new File(tmp, "cache"))
                .bundled("digits", BundledRelease.fromFiles(new File(shipped, "manifest.json"), blobs))
                .clock(() -> Codec.parseTime("2030-01-01T00:00:00Z")).build();
        UpdateResult now = client.current("digits");
        assertEquals("1.0.0", now.version, now.toString());
        assertTrue(now.bundled);
        UpdateResult offline = client.update("digits");
        assertEquals("transport", offline.errorCode);
        assertEquals("1.0.0", offline.version, "offline, the installed model stays");
    }

    /** The registry's current manifest and these blobs, as an app ships them (a folder). */
    BundledRelease ship(File dir, byte[]... blobs) throws Exception {
        File blobDir = new File(dir, "blobs");
        blobDir.mkdirs();
        Files.write(new File(dir, "manifest.json").toPath(), registry.files.get("manifests/digits/mid.json"));
        for (byte[] b : blobs) Files.write(new File(blobDir, Codec.sha256Hex(b)).toPath(), b);
        return BundledRelease.fromFiles(new File(dir, "manifest.json"), blobDir);
    }

    @Test
    void aShippedSequenceOfTwoToThe53MinusOneNeverMakesAnOnlineManifestARollback() throws Exception {
        byte[] shippedModel = bytes(2000, 9);
        registry.manifest("digits", "mid", 9007199254740991L, registry.blob(shippedModel, "1.0.0", "int8", CPU), null, null, null);
        BundledRelease shipped = ship(new File(tmp, "shipped"), shippedModel);
        byte[] online = bytes(3000, 4);
        registry.manifest("digits", "mid", 5, registry.blob(online, "1.1.0", "int8", CPU), null, null, null);
        File cache = new File(tmp, "cache");
        EdgeregClient client = builder(cache).bundled("digits", shipped).build();
        UpdateResult first = client.current("digits");
        assertEquals("1.0.0", first.version, first.toString());
        assertTrue(first.bundled);
        assertTrue(registry.requests.isEmpty(), "installed without network: " + registry.requests);
        assertNull(client.store.readSequence("digits"), "a shipped manifest stores no highest sequence");
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertTrue(r.updated, r.toString());
        assertEquals("1.1.0", r.version);
        assertFalse(r.bundled);
        assertArrayEquals(online, Files.readAllBytes(r.model().file.toPath()));
        assertEquals(Long.valueOf(5), client.store.readSequence("digits"));
        // The next start with the same app: the shipped copy (above 5) stays out.
        EdgeregClient next = builder(cache).bundled("digits", shipped).build();
        UpdateResult again = next.current("digits");
        assertEquals("1.1.0", again.version, again.toString());
        assertFalse(again.bundled);
    }

    @Test
    void afterAnOnlineAcceptanceAHigherShippedCopyIsNotInstalled() throws Exception {
        byte[] online = bytes(3000, 4);
        registry.manifest("digits", "mid", 5, registry.blob(online, "1.0.0", "int8", CPU), null, null, null);
        File cache = new File(tmp, "cache");
        assertTrue(builder(cache).build().update("digits").ok());
        byte[] shippedModel = bytes(2000, 9);
        registry.manifest("digits", "mid", 9, registry.blob(shippedModel, "2.0.0", "int8", CPU), null, null, null);
        BundledRelease shipped = ship(new File(tmp, "shipped"), shippedModel); // an app update ships sequence 9
        registry.manifest("digits", "mid", 5, registry.blob(online, "1.0.0", "int8", CPU), null, null, null);
        int before = registry.requests.size();
        EdgeregClient client = builder(cache).bundled("digits", shipped).build();
        UpdateResult now = client.current("digits");
        assertEquals("1.0.0", now.version, now.toString());
        assertFalse(now.bundled);
        assertFalse(client.store.hasBlob(Codec.sha256Hex(shippedModel), shippedModel.length), "no shipped blob copied");
        assertEquals(before, registry.requests.size(), "current() uses no network");
        UpdateResult r = client.update("digits");
        assertTrue(r.ok(), r.toString());
        assertEquals("1.0.0", r.version, "the online release stays");
        assertEquals(Long.valueOf(5), client.store.readSequence("digits"));
    }

    @Test
    void beforeAnyOnlineAcceptanceAHigherShippedCopyReplacesAnEarlierOne() throws Exception {
        byte[] v1 = bytes(2000, 9);
        registry.manifest("digits", "mid", 3, registry.blob(v1, "1.0.0", "int8", CPU), null, null, null);
        BundledRelease first = ship(new File(tmp, "app1"), v1);
        byte[] v2 = bytes(2500, 8);
        registry.manifest("digits", "mid", 4, registry.blob(v2, "1.1.0", "int8", CPU), null, null, null);
        BundledRelease second = ship(new File(tmp, "app2"), v2);
        registry.close();
        File cache = new File(tmp, "cache");
        assertEquals("1.0.0", builder(cache).bundled("digits", first).build().current("digits").version);
        UpdateResult updated = builder(cache).bundled("digits", second).build().current("digits");
        assertEquals("1.1.0", updated.version, updated.toString());
        assertTrue(updated.bundled);
        assertEquals("1.1.0", builder(cache).bundled("digits", first).build().current("digits").version, "never below what is installed");
        assertNull(builder(cache).build().store.readSequence("digits"), "shipped copies store no highest sequence");
    }
}
