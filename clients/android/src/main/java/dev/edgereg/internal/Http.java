package dev.edgereg.internal;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.ResponseCache;
import java.net.URL;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * GET with If-None-Match and Range over HttpURLConnection (on Android: OkHttp inside), bounded
 * three ways (docs/protocol.md section 7): a timeout for the headers and each read, a deadline
 * for the whole fetch, and a minimum rate over each timeout window, so a server that trickles
 * one byte a second never holds the device. Every failure is a {@code transport} Rejected.
 */
public final class Http {
    /** Sent on every request, on both transports. */
    public static final String USER_AGENT = "edgereg-android/" + dev.edgereg.EdgeregClient.SDK_VERSION;
    private static final Pattern CONTENT_RANGE = Pattern.compile("bytes (\\d+)-\\d+/(?:\\d+|\\*)");

    public final String base;
    public final int timeoutMs;
    public final long deadlineMs;
    public final long minRate;
    private long deadlineAt = Long.MAX_VALUE;

    /** The app's transport ({@code Builder.transport}), or null for HttpURLConnection. */
    public final dev.edgereg.Transport transport;

    public Http(String baseUrl, int timeoutMs, long deadlineMs, long minRate) {
        this(baseUrl, timeoutMs, deadlineMs, minRate, null);
    }

    public Http(String baseUrl, int timeoutMs, long deadlineMs, long minRate, dev.edgereg.Transport transport) {
        this.transport = transport;
        this.base = baseUrl.endsWith("/") ? baseUrl : baseUrl + "/";
        this.timeoutMs = timeoutMs;
        this.deadlineMs = deadlineMs;
        this.minRate = minRate;
    }

    /** Cancels the update this transport serves: every connection it opens is cut on cancel. */
    public Cancel cancel;

    /**
     * The time a response's headers may take in all: the timeout, or what is left of the
     * deadline when less. A read timeout bounds each read only, so a server that sends a
     * header byte every few seconds would otherwise hold the fetch for ever.
     */
    long headersBudgetMs() {
        long left = deadlineAt == Long.MAX_VALUE ? Long.MAX_VALUE : deadlineAt - System.currentTimeMillis();
        return Math.max(1, Math.min(timeoutMs, left));
    }

    /**
     * Closes a connection whose response headers have not all arrived in time (from a
     * timer thread: closing the socket ends the blocked read). {@link #cancel} once they
     * have; {@link #fired} tells an IOException caused by it from any other. A {@link
     * dev.edgereg.Transport} keeps the same bound itself (its contract says so).
     */
    public static final class HeadersDeadline {
        private static final ScheduledExecutorService TIMER = Executors.newSingleThreadScheduledExecutor(new ThreadFactory() {
            @Override public Thread newThread(Runnable r) {
                Thread t = new Thread(r, "edgereg-headers-deadline");
                t.setDaemon(true);
                return t;
            }
        });
        private final AtomicBoolean fired = new AtomicBoolean();
        private final ScheduledFuture<?> task;
        public final long ms;

        public HeadersDeadline(final Runnable close, long ms) {
            this.ms = ms;
            this.task = TIMER.schedule(new Runnable() {
                @Override public void run() {
                    fired.set(true);
                    close.run();
                }
            }, ms, TimeUnit.MILLISECONDS);
        }

        public void cancel() {
            task.cancel(false);
        }

        public boolean fired() {
            return fired.get();
        }

        /** What to say of it. */
        public String message() {
            return "the response's headers did not arrive within " + ms + " ms";
        }

        Rejected rejected(String url) {
            return new Rejected(Reasons.TRANSPORT, url + ": " + message());
        }
    }

    /** Start the whole-fetch clock (one update: a manifest and its blobs). */
    public void startDeadline() {
        deadlineAt = System.currentTimeMillis() + deadlineMs;
    }

    public String url(String path) {
        return base + path;
    }

    public final class Response {
        public final int status;
        public final String etag;
        public final Long length;
        public final Long rangeStart;
        public final String url;
        private final HttpURLConnection conn;
        private final dev.edgereg.Transport.Exchange exchange;
        private InputStream body;
        private long windowStart = System.currentTimeMillis();
        private long windowBytes;

        Response(HttpURLConnection conn, String url) throws IOException {
            this.conn = conn;
            this.exchange = null;
            this.url = url;
            this.status = conn.getResponseCode();
            this.etag = conn.getHeaderField("ETag");
            this.length = parseLength(conn.getHeaderField("Content-Length"));
            this.rangeStart = parseRange(conn.getHeaderField("Content-Range"));
        }

        Response(dev.edgereg.Transport.Exchange exchange, String url) throws IOException {
            this.conn = null;
            this.exchange = exchange;
            this.url = url;
            this.status = exchange.status();
            this.etag = exchange.header("etag");
            this.length = parseLength(exchange.header("content-length"));
            this.rangeStart = parseRange(exchange.header("content-range"));
        }

        /** Up to len bytes, -1 at the end; bounded by the deadline and the minimum rate. */
        public int read(byte[] buf, int off, int len) throws Rejected {
            try {
                if (body == null && conn != null) body = status >= 400 ? conn.getErrorStream() : conn.getInputStream();
                if (body == null && exchange != null) body = exchange.body();
                if (body == null) return -1;
                long now = System.currentTimeMillis();
                if (now > deadlineAt) throw new Rejected(Reasons.TRANSPORT, url + ": the fetch took longer than its deadline of " + deadlineMs / 1000 + " s; it resumes next time");
                if (now - windowStart >= timeoutMs) {
                    double seconds = (now - windowStart) / 1000.0;
                    if (windowBytes / seconds < minRate) {
                        throw new Rejected(Reasons.TRANSPORT, url + ": " + windowBytes + " bytes in " + seconds + " s, slower than " + minRate + " bytes/s; it resumes next time");
                    }
                    windowStart = now;
                    windowBytes = 0;
                }
                int n = body.read(buf, off, len);
                if (n > 0) windowBytes += n;
                return n;
            } catch (IOException e) {
                throw new Rejected(Reasons.TRANSPORT, url + ": " + describe(e), e);
            }
        }

        /**
         * Cut the connection now, from any thread: a read in progress fails at once. Not for a
         * body the JDK's own HttpURLConnection is reading (a plain JVM, not Android): its
         * disconnect() hands a kept-alive body to a cleaner thread that drains it (up to 512 KB,
         * however slowly it trickles) holding the stream's lock, which the reader needs too, and
         * leaves the socket open. There the reader stops at its next chunk (cancel is
         * checked after every read) or at the read timeout of a stalled server. On Android the
         * connection is OkHttp's, whose disconnect() cancels the call at once.
         */
        public void abort() {
            if (conn != null && !(body != null && conn.getClass().getName().startsWith("sun.net.www."))) conn.disconnect();
            if (exchange != null) exchange.abort();
        }

        public void close() {
            try {
                if (body != null) body.close();
            } catch (IOException e) {
                // closing a failed stream: nothing to keep
            }
            if (conn != null) conn.disconnect();
            if (exchange != null) {
                try {
                    exchange.close();
                } catch (IOException e) {
                    // already gone
                }
            }
        }
    }

    static Long parseLength(String cl) {
        if (cl == null) return null;
        try {
            return Long.parseLong(cl.trim());
        } catch (NumberFormatException e) {
            return null;
        }
    }

    static Long parseRange(String cr) {
        if (cr == null) return null;
        Matcher m = CONTENT_RANGE.matcher(cr.trim());
        return m.matches() ? Long.valueOf(Long.parseLong(m.group(1))) : null;
    }

    /** GET a blob: {@code start > 0} sends a Range; the body is asked for without a content coding. */
    public Response get(String path, String etag, long start) throws Rejected {
        return get(path, etag, start, false);
    }

    /** GET a manifest: {@code etag} sends If-None-Match. */
    public Response getManifest(String path, String etag) throws Rejected {
        return get(path, etag, 0, true);
    }

    private Response get(String path, String etag, long start, boolean manifest) throws Rejected {
        String u = url(path);
        if (System.currentTimeMillis() > deadlineAt) throw new Rejected(Reasons.TRANSPORT, u + ": the fetch took longer than its deadline");
        if (transport != null) {
            // The same request headers as below, through the app's transport.
            Map<String, String> headers = new java.util.LinkedHashMap<String, String>();
            headers.put("User-Agent", USER_AGENT);
            headers.put("Accept", "*/*");
            if (!manifest) headers.put("Accept-Encoding", "identity");
            if (etag != null) headers.put("If-None-Match", etag);
            if (start > 0) headers.put("Range", "bytes=" + start + "-");
            try {
                return new Response(transport.get(u, headers, timeoutMs), u);
            } catch (IOException e) {
                throw new Rejected(Reasons.TRANSPORT, u + ": " + describe(e), e);
            } catch (RuntimeException e) {
                throw new Rejected(Reasons.TRANSPORT, u + ": the transport failed: " + e, e);
            }
        }
        try {
            HttpURLConnection c = (HttpURLConnection) new URL(u).openConnection();
            c.setConnectTimeout(timeoutMs);
            c.setReadTimeout(timeoutMs);
            c.setInstanceFollowRedirects(true);
            // The client does its own revalidation (ETag, If-None-Match) and every manifest is
            // checked by signature and sequence, so only an in-process cache could hand back a
            // stale answer: one exists only where the app installed a ResponseCache (Android's
            // HttpResponseCache), and then it is bypassed. Without one, setUseCaches(false)
            // would only add Pragma and Cache-Control to every request (43 bytes of the
            // unchanged check; the reference client sends neither).
            if (responseCacheInstalled()) c.setUseCaches(false);
            // Short, explicit defaults: HttpURLConnection's own are "Java/<version>" and a
            // 52-character Accept list.
            c.setRequestProperty("User-Agent", USER_AGENT);
            c.setRequestProperty("Accept", "*/*");
            // A blob is hashed and counted as served and resumed by byte Range: no content
            // coding (OkHttp on Android would otherwise ask for gzip). A manifest is read
            // whole and verified by signature, so its request carries only what the
            // reference client sends: HttpURLConnection never asks for a coding itself.
            if (!manifest) c.setRequestProperty("Accept-Encoding", "identity");
            if (etag != null) c.setRequestProperty("If-None-Match", etag);
            if (start > 0) c.setRequestProperty("Range", "bytes=" + start + "-");
            final HttpURLConnection open = c;
            Runnable abort = new Runnable() {
                @Override public void run() {
                    open.disconnect();
                }
            };
            // Watched before the headers: a cancel cuts a server that never answers too.
            if (cancel != null) cancel.watch(abort);
            HeadersDeadline guard = new HeadersDeadline(abort, headersBudgetMs());
            Response response;
            try {
                response = new Response(c, u);
            } catch (IOException e) {
                if (guard.fired()) throw guard.rejected(u);
                throw e;
            } finally {
                guard.cancel();
                if (cancel != null) cancel.unwatch(abort);
            }
            if (guard.fired()) {
                // HttpURLConnection may keep a status line it read before the close and
                // answer with it: the headers still did not arrive in time.
                response.close();
                throw guard.rejected(u);
            }
            return response;
        } catch (IOException e) {
            throw new Rejected(Reasons.TRANSPORT, u + ": " + describe(e), e);
        } catch (ClassCastException e) {
            throw new Rejected(Reasons.TRANSPORT, u + " is not an http(s) URL");
        }
    }

    /** Whether an app-wide ResponseCache exists; true when a SecurityManager will not say. */
    static boolean responseCacheInstalled() {
        try {
            return ResponseCache.getDefault() != null;
        } catch (SecurityException e) {
            return true;
        }
    }

    /** POST a JSON body; returns the status, or -1 when the request did not complete. */
    public static int post(String url, byte[] body, int timeoutMs) {
        return post(url, body, timeoutMs, null);
    }

    /** POST a JSON body through {@code transport} (null: HttpURLConnection); the status, or -1. */
    public static int post(String url, byte[] body, int timeoutMs, dev.edgereg.Transport transport) {
        if (transport != null) {
            Map<String, String> headers = new java.util.LinkedHashMap<String, String>();
            headers.put("Content-Type", "application/json");
            headers.put("User-Agent", USER_AGENT);
            try {
                return transport.post(url, body, headers, timeoutMs);
            } catch (IOException e) {
                return -1;
            } catch (RuntimeException e) {
                return -1;
            }
        }
        HttpURLConnection c = null;
        try {
            c = (HttpURLConnection) new URL(url).openConnection();
            c.setConnectTimeout(timeoutMs);
            c.setReadTimeout(timeoutMs);
            c.setDoOutput(true);
            c.setRequestMethod("POST");
            c.setRequestProperty("Content-Type", "application/json");
            c.setFixedLengthStreamingMode(body.length);
            OutputStream out = c.getOutputStream();
            out.write(body);
            out.close();
            int status = c.getResponseCode();
            InputStream in = status >= 400 ? c.getErrorStream() : c.getInputStream();
            if (in != null) {
                byte[] buf = new byte[1024];
                while (in.read(buf) > 0) {
                    // drain so the connection can be reused
                }
                in.close();
            }
            return status;
        } catch (IOException e) {
            return -1;
        } catch (RuntimeException e) {
            return -1;
        } finally {
            if (c != null) c.disconnect();
        }
    }

    static String describe(IOException e) {
        String m = e.getMessage();
        return e.getClass().getSimpleName() + (m == null ? "" : ": " + m);
    }
}
