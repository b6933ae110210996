package dev.edgereg;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import dev.edgereg.internal.Codec;
import dev.edgereg.internal.Envelope;
import dev.edgereg.internal.Json;
import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.file.Files;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A registry served over real HTTP by com.sun.net.httpserver (tests only): manifests signed here
 * with the committed test-only key (JDK Ed25519), blobs by digest, ETag/304 and Range/206, and
 * faults to inject (cut a body, ignore Range, answer 404 or 500).
 */
final class FakeRegistry implements AutoCloseable {
    static final long NOW = Codec.parseTime("2025-06-01T12:00:00Z");
    static final String EXPIRES = "2025-07-01T12:00:00Z";

    final HttpServer server;
    final Map<String, byte[]> files = Collections.synchronizedMap(new HashMap<String, byte[]>());
    final List<String> requests = Collections.synchronizedList(new ArrayList<String>());
    /** Each request's headers, in the order of {@link #requests}. */
    final List<com.sun.net.httpserver.Headers> requestHeaders = Collections.synchronizedList(new ArrayList<com.sun.net.httpserver.Headers>());
    final List<byte[]> reports = Collections.synchronizedList(new ArrayList<byte[]>());
    final java.util.Set<String> peers = Collections.synchronizedSet(new java.util.HashSet<String>());
    /** Close the connection after this many body bytes of the next blob response (-1: off). */
    final AtomicInteger cutNextBlobAt = new AtomicInteger(-1);
    /** Answer the next blob with a complete body this many bytes shorter than it is (0: off). */
    final AtomicInteger shortenNextBlobBy = new AtomicInteger(0);
    /** Send the next blob without a Content-Length (chunked), ending cleanly after this many bytes (-1: off). */
    final AtomicInteger endNextBlobWithoutLengthAt = new AtomicInteger(-1);
    /**
     * How the next reports are answered, one entry each (then 202): a status, or 0 for no answer
     * at all (the connection closes unanswered, as when the device is offline).
     */
    final java.util.concurrent.ConcurrentLinkedQueue<Integer> postAnswers = new java.util.concurrent.ConcurrentLinkedQueue<Integer>();
    /** Answer no report at all while set (the device is offline). */
    volatile boolean postsUnanswered;
    /** Hold each report this long before answering (a slow collector). */
    volatile int postDelayMs;
    volatile boolean ignoreRange;
    /** Hold each manifest answer this long before its headers (a slow registry). */
    volatile int manifestDelayMs;
    /** Send blob bodies 1000 bytes at a time with this pause between (0: at once). */
    volatile int trickleMs;
    volatile int forceStatus;
    private final PrivateKey key;
    final String publicPem;

    FakeRegistry() throws Exception {
        File repo = TestSupport.repoRoot();
        String pem = new String(Files.readAllBytes(new File(repo, "tests/vectors/keys/test-only-registry.private.pem").toPath()), "UTF-8");
        String body = pem.replace("-----BEGIN PRIVATE KEY-----", "").replace("-----END PRIVATE KEY-----", "").replaceAll("\\s", "");
        byte[] pkcs8 = Codec.base64Decode(body);
        key = KeyFactory.getInstance("Ed25519").generatePrivate(new PKCS8EncodedKeySpec(pkcs8));
        // The public key: the last 32 bytes of the seed's key pair, via a signature round trip is
        // not possible in the JDK API, so read it from a vector's trusted_keys instead.
        Map<?, ?> vector = (Map<?, ?>) Json.parse(Files.readAllBytes(new File(repo, "tests/vectors/valid-stable.json").toPath()));
        publicPem = (String) ((List<?>) ((Map<?, ?>) vector.get("input")).get("trusted_keys")).get(0);
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", this::handle);
        server.start();
    }

    String url() {
        return "http://127.0.0.1:" + server.getAddress().getPort() + "/";
    }

    @Override public void close() {
        server.stop(0);
    }

    /** Put a blob; returns its entry (as a manifest holds it). */
    Map<String, Object> blob(byte[] data, String version, String variant, List<String> backends) {
        String sha = Codec.sha256Hex(data);
        files.put("blobs/sha256/" + sha, data);
        Map<String, Object> e = new LinkedHashMap<String, Object>();
        e.put("version", version);
        e.put("variant", variant);
        e.put("path", "blobs/sha256/" + sha);
        e.put("sha256", sha);
        e.put("size", (long) data.length);
        e.put("min_mnn_runtime", "3.6.1");
        Map<String, Object> rt = new LinkedHashMap<String, Object>();
        rt.put("threads", 4L);
        rt.put("backends", new ArrayList<Object>(backends));
        rt.put("precision", "normal");
        e.put("runtime", rt);
        return e;
    }

    static Map<String, Object> ref(Map<String, Object> entry) {
        Map<String, Object> r = new LinkedHashMap<String, Object>();
        r.put("path", entry.get("path"));
        r.put("sha256", entry.get("sha256"));
        r.put("size", entry.get("size"));
        return r;
    }

    /** Sign and publish manifests/<unit>/<tier>.json. */
    void manifest(String unit, String tier, long sequence, Object stable, Object candidate, Double percent, String reportUrl) throws Exception {
        Map<String, Object> m = new LinkedHashMap<String, Object>();
        m.put("schema_version", 1L);
        m.put("model", unit);
        m.put("tier", tier);
        m.put("sequence", sequence);
        m.put("expires", EXPIRES);
        m.put("stable", stable == null ? Json.NULL : stable);
        m.put("candidate", candidate == null ? Json.NULL : candidate);
        if (candidate != null) {
            m.put("percent", percent);
            m.put("salt", "5f3a9c0e1b2d4c6a");
        }
        m.put("paused", false);
        if (reportUrl != null) m.put("report_url", reportUrl);
        files.put("manifests/" + unit + "/" + tier + ".json", envelope(Json.canonical(m)));
    }

    byte[] envelope(byte[] payload) throws Exception {
        String type = "application/vnd.edgereg.manifest+json";
        Signature s = Signature.getInstance("Ed25519");
        s.initSign(key);
        s.update(Envelope.pae(type, payload));
        byte[] raw = dev.edgereg.internal.Ed25519.rawPublicKey(Codec.utf8(publicPem));
        Map<String, Object> sig = new LinkedHashMap<String, Object>();
        sig.put("keyid", Codec.sha256Hex(raw));
        sig.put("sig", Codec.base64(s.sign()));
        Map<String, Object> env = new LinkedHashMap<String, Object>();
        env.put("payload", Codec.base64(payload));
        env.put("payloadType", type);
        List<Object> sigs = new ArrayList<Object>();
        sigs.add(sig);
        env.put("signatures", sigs);
        return Json.canonical(env);
    }

    int count(String prefix) {
        int n = 0;
        synchronized (requests) {
            for (String r : requests) if (r.startsWith(prefix)) n++;
        }
        return n;
    }

    private void handle(HttpExchange x) throws IOException {
        String path = x.getRequestURI().getPath().substring(1);
        String range = x.getRequestHeaders().getFirst("Range");
        synchronized (requests) {
            requests.add(x.getRequestMethod() + " " + path + (range == null ? "" : " " + range));
            requestHeaders.add(x.getRequestHeaders());
        }
        peers.add(x.getRemoteAddress().getAddress().getHostAddress());
        if (x.getRequestMethod().equals("POST")) {
            byte[] body = readAll(x);
            if (postDelayMs > 0) {
                try {
                    Thread.sleep(postDelayMs);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            Integer answer = postsUnanswered ? Integer.valueOf(0) : postAnswers.poll();
            if (answer != null && answer == 0) {
                x.close(); // before any header: the connection closes with no answer
                return;
            }
            if (answer != null) {
                send(x, answer, new byte[0], null);
                return;
            }
            reports.add(body);
            send(x, 202, Codec.utf8("{\"status\":\"accepted\"}"), null);
            return;
        }
        if (manifestDelayMs > 0 && path.startsWith("manifests/")) {
            try {
                Thread.sleep(manifestDelayMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        if (forceStatus != 0) {
            send(x, forceStatus, new byte[0], null);
            return;
        }
        byte[] data = files.get(path);
        if (data == null) {
            send(x, 404, new byte[0], null);
            return;
        }
        String etag = "\"" + Codec.sha256Hex(data) + "\"";
        if (etag.equals(x.getRequestHeaders().getFirst("If-None-Match"))) {
            x.getResponseHeaders().set("ETag", etag);
            x.sendResponseHeaders(304, -1);
            x.close();
            return;
        }
        int start = 0;
        if (range != null && !ignoreRange && path.startsWith("blobs/")) {
            start = Integer.parseInt(range.substring("bytes=".length(), range.indexOf('-')));
            if (start >= data.length) {
                send(x, 416, new byte[0], null);
                return;
            }
            x.getResponseHeaders().set("Content-Range", "bytes " + start + "-" + (data.length - 1) + "/" + data.length);
        }
        byte[] body = new byte[data.length - start];
        System.arraycopy(data, start, body, 0, body.length);
        int cut = path.startsWith("blobs/") ? cutNextBlobAt.getAndSet(-1) : -1;
        int shorten = path.startsWith("blobs/") ? shortenNextBlobBy.getAndSet(0) : 0;
        int endAt = path.startsWith("blobs/") ? endNextBlobWithoutLengthAt.getAndSet(-1) : -1;
        x.getResponseHeaders().set("ETag", etag);
        if (shorten > 0 || endAt >= 0) {
            // A complete, well-formed answer that holds fewer bytes than the blob.
            int n = shorten > 0 ? body.length - shorten : Math.min(endAt, body.length);
            x.sendResponseHeaders(start > 0 ? 206 : 200, shorten > 0 ? n : 0); // 0: chunked, no Content-Length
            x.getResponseBody().write(body, 0, n);
            x.close();
            return;
        }
        x.sendResponseHeaders(start > 0 ? 206 : 200, body.length);
        OutputStream out = x.getResponseBody();
        if (cut >= 0 && cut < body.length) {
            out.write(body, 0, cut);
            out.flush();
            // An abrupt end: the client sees a connection closed early.
            try {
                x.close();
            } catch (RuntimeException e) {
                // insufficient bytes written: the connection is dropped, which is the point
            }
            return;
        }
        if (trickleMs > 0 && path.startsWith("blobs/")) {
            try {
                for (int off = 0; off < body.length; off += 1000) {
                    out.write(body, off, Math.min(1000, body.length - off));
                    out.flush();
                    Thread.sleep(trickleMs);
                }
                out.close();
            } catch (IOException | InterruptedException e) {
                // the client gave up: that is what the test wants to see
            }
            return;
        }
        out.write(body);
        out.close();
    }

    private static byte[] readAll(HttpExchange x) throws IOException {
        java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
        byte[] buf = new byte[4096];
        int n;
        while ((n = x.getRequestBody().read(buf)) > 0) b.write(buf, 0, n);
        return b.toByteArray();
    }

    private static void send(HttpExchange x, int status, byte[] body, String etag) throws IOException {
        if (etag != null) x.getResponseHeaders().set("ETag", etag);
        x.sendResponseHeaders(status, body.length == 0 ? -1 : body.length);
        if (body.length > 0) x.getResponseBody().write(body);
        x.close();
    }
}
