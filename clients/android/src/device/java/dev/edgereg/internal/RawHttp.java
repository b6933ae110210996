package dev.edgereg.internal;

import java.io.ByteArrayOutputStream;
import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.URL;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/**
 * A {@link dev.edgereg.Transport} of HTTP/1.1 over a socket bound to a chosen local address:
 * HttpURLConnection cannot bind one, and a fleet simulation gives each device its own loopback
 * source. Plain http:// only; one request per connection, closed by the client once the body is
 * read (a POST asks {@code Connection: close}); Content-Length, chunked or read-to-close bodies.
 * Test and device code, never in the library jar.
 */
public final class RawHttp implements dev.edgereg.Transport {
    private final InetAddress source;

    public RawHttp(InetAddress source) {
        this.source = source;
    }

    @Override
    public Exchange get(String u, Map<String, String> headers, int timeoutMs) throws IOException {
        URL url = new URL(u);
        if (!"http".equals(url.getProtocol())) throw new IOException(u + ": this transport speaks plain http:// only");
        final Socket s = connect(url, timeoutMs, source);
        try {
            // One request per connection, closed here once the body is read, so no
            // "Connection: close" (nor the server's echo of it: 38 bytes of an unchanged check).
            StringBuilder req = new StringBuilder();
            req.append("GET ").append(target(url)).append(" HTTP/1.1\r\nHost: ").append(host(url)).append("\r\n");
            for (Map.Entry<String, String> h : headers.entrySet()) req.append(h.getKey()).append(": ").append(h.getValue()).append("\r\n");
            req.append("\r\n");
            OutputStream out = s.getOutputStream();
            out.write(Codec.utf8(req.toString()));
            out.flush();
            InputStream in = new java.io.BufferedInputStream(s.getInputStream());
            final Map<String, String> got = new LinkedHashMap<String, String>();
            // The whole head within the timeout, as Transport's contract asks: a server that
            // trickles header lines under the read timeout is cut off.
            Http.HeadersDeadline guard = new Http.HeadersDeadline(new Runnable() {
                @Override public void run() {
                    try {
                        s.close();
                    } catch (IOException e) {
                        // already closed
                    }
                }
            }, timeoutMs);
            final int status;
            try {
                status = readHead(in, got);
            } catch (IOException e) {
                if (guard.fired()) throw new IOException(guard.message(), e);
                throw e;
            } finally {
                guard.cancel();
            }
            final InputStream body = body(in, got, status);
            return new Exchange() {
                @Override public int status() { return status; }

                @Override public String header(String name) { return got.get(name); }

                @Override public InputStream body() { return body; }

                @Override public void abort() {
                    try {
                        s.close();
                    } catch (IOException e) {
                        // already gone
                    }
                }

                @Override public void close() throws IOException { s.close(); }
            };
        } catch (IOException e) {
            s.close();
            throw e;
        }
    }

    @Override
    public int post(String u, byte[] body, Map<String, String> headers, int timeoutMs) throws IOException {
        URL url = new URL(u);
        Socket s = connect(url, timeoutMs, source);
        try {
            StringBuilder head = new StringBuilder();
            head.append("POST ").append(target(url)).append(" HTTP/1.1\r\nHost: ").append(host(url)).append("\r\n");
            for (Map.Entry<String, String> h : headers.entrySet()) head.append(h.getKey()).append(": ").append(h.getValue()).append("\r\n");
            head.append("Content-Length: ").append(body.length).append("\r\nConnection: close\r\n\r\n");
            OutputStream out = s.getOutputStream();
            out.write(Codec.utf8(head.toString()));
            out.write(body);
            out.flush();
            InputStream in = new java.io.BufferedInputStream(s.getInputStream());
            return readHead(in, new LinkedHashMap<String, String>());
        } finally {
            s.close();
        }
    }

    static Socket connect(URL url, int timeoutMs, InetAddress source) throws IOException {
        Socket s = new Socket();
        try {
            s.bind(new InetSocketAddress(source, 0));
            int port = url.getPort() < 0 ? 80 : url.getPort();
            s.connect(new InetSocketAddress(url.getHost(), port), timeoutMs);
            s.setSoTimeout(timeoutMs);
            return s;
        } catch (IOException e) {
            s.close();
            throw e;
        }
    }

    static String target(URL url) {
        String path = url.getPath();
        if (path == null || path.isEmpty()) path = "/";
        return url.getQuery() == null ? path : path + "?" + url.getQuery();
    }

    static String host(URL url) {
        return url.getHost() + (url.getPort() < 0 ? "" : ":" + url.getPort());
    }

    /** Status line and headers (names lower-cased); the status code. */
    static int readHead(InputStream in, Map<String, String> headers) throws IOException {
        String status = line(in);
        if (status == null || !status.startsWith("HTTP/1.")) throw new IOException("not an HTTP response: " + status);
        String[] parts = status.split(" ", 3);
        int code;
        try {
            code = Integer.parseInt(parts[1]);
        } catch (RuntimeException e) {
            throw new IOException("bad status line: " + status);
        }
        while (true) {
            String h = line(in);
            if (h == null) throw new IOException("connection closed in the headers");
            if (h.isEmpty()) break;
            int colon = h.indexOf(':');
            if (colon > 0) headers.put(h.substring(0, colon).trim().toLowerCase(Locale.ROOT), h.substring(colon + 1).trim());
        }
        if (code == 100) {
            headers.clear();
            return readHead(in, headers);
        }
        return code;
    }

    static String line(InputStream in) throws IOException {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        int c;
        while ((c = in.read()) >= 0) {
            if (c == '\n') break;
            if (b.size() > 16384) throw new IOException("header line too long");
            b.write(c);
        }
        if (c < 0 && b.size() == 0) return null;
        String s = new String(b.toByteArray(), "ISO-8859-1");
        return s.endsWith("\r") ? s.substring(0, s.length() - 1) : s;
    }

    static InputStream body(final InputStream in, Map<String, String> headers, int status) {
        if (status == 304 || status == 204 || (status >= 100 && status < 200)) return new java.io.ByteArrayInputStream(new byte[0]);
        String te = headers.get("transfer-encoding");
        if (te != null && te.toLowerCase(Locale.ROOT).contains("chunked")) return new Chunked(in);
        Long length = Http.parseLength(headers.get("content-length"));
        if (length == null) return in;
        final long[] left = {length};
        return new FilterInputStream(in) {
            @Override public int read() throws IOException {
                byte[] one = new byte[1];
                int n = read(one, 0, 1);
                return n < 0 ? -1 : one[0] & 0xff;
            }

            @Override public int read(byte[] b, int off, int len) throws IOException {
                if (left[0] <= 0) return -1;
                int n = super.read(b, off, (int) Math.min(len, left[0]));
                if (n > 0) left[0] -= n;
                return n;
            }
        };
    }

    static final class Chunked extends InputStream {
        private final InputStream in;
        private long left;
        private boolean done;

        Chunked(InputStream in) {
            this.in = in;
        }

        @Override public int read() throws IOException {
            byte[] one = new byte[1];
            int n = read(one, 0, 1);
            return n < 0 ? -1 : one[0] & 0xff;
        }

        @Override public int read(byte[] b, int off, int len) throws IOException {
            if (done) return -1;
            if (left == 0) {
                String size = line(in);
                if (size == null) throw new IOException("connection closed inside a chunked body");
                int semi = size.indexOf(';');
                left = Long.parseLong((semi >= 0 ? size.substring(0, semi) : size).trim(), 16);
                if (left == 0) {
                    done = true;
                    return -1;
                }
            }
            int n = in.read(b, off, (int) Math.min(len, left));
            if (n < 0) throw new IOException("connection closed inside a chunk");
            left -= n;
            if (left == 0) line(in);
            return n;
        }
    }
}
