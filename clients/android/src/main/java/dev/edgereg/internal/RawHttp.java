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
 * HTTP/1.1 over a socket bound to a chosen local address: HttpURLConnection cannot bind one, and
 * a fleet simulation gives each device its own loopback source. Plain http:// only; one request
 * per connection, closed by the client once the body is read (a POST asks {@code Connection: close});
 * Content-Length, chunked or read-to-close bodies.
 */
final class RawHttp {
    private RawHttp() {}

    /** The response's headers did not all arrive within their budget (the socket was closed). */
    static final class HeadersLate extends IOException {
        private static final long serialVersionUID = 1L;
        final transient Http.HeadersDeadline guard;

        HeadersLate(Http.HeadersDeadline guard) {
            super("the response's headers did not arrive within " + guard.ms + " ms");
            this.guard = guard;
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

    static Http.Response get(Http http, String u, String etag, long start, boolean manifest) throws IOException {
        URL url = new URL(u);
        Socket s = connect(url, http.timeoutMs, http.source);
        try {
            // One request per connection, closed here once the body is read, so no
            // "Connection: close" (nor the server's echo of it: 38 bytes of an unchanged
            // check). The headers are Http.get's, less Accept: absent, it means any type.
            StringBuilder req = new StringBuilder();
            req.append("GET ").append(target(url)).append(" HTTP/1.1\r\nHost: ").append(host(url))
                    .append("\r\nUser-Agent: ").append(Http.USER_AGENT).append("\r\n");
            if (!manifest) req.append("Accept-Encoding: identity\r\n");
            if (etag != null) req.append("If-None-Match: ").append(etag).append("\r\n");
            if (start > 0) req.append("Range: bytes=").append(start).append("-\r\n");
            req.append("\r\n");
            OutputStream out = s.getOutputStream();
            out.write(Codec.utf8(req.toString()));
            out.flush();
            InputStream in = new java.io.BufferedInputStream(s.getInputStream());
            Map<String, String> headers = new LinkedHashMap<String, String>();
            final Socket open = s;
            Http.HeadersDeadline guard = new Http.HeadersDeadline(new Runnable() {
                @Override public void run() {
                    try {
                        open.close();
                    } catch (IOException e) {
                        // already closed
                    }
                }
            }, http.headersBudgetMs());
            int status;
            try {
                status = readHead(in, headers);
            } catch (IOException e) {
                if (guard.fired()) throw new HeadersLate(guard);
                throw e;
            } finally {
                guard.cancel();
            }
            InputStream body = body(in, headers, status);
            return http.new Response(s, u, status, headers, body);
        } catch (IOException e) {
            s.close();
            throw e;
        }
    }

    static int post(String u, byte[] body, int timeoutMs, InetAddress source) throws IOException {
        URL url = new URL(u);
        Socket s = connect(url, timeoutMs, source);
        try {
            String head = "POST " + target(url) + " HTTP/1.1\r\nHost: " + host(url) + "\r\nContent-Type: application/json\r\nContent-Length: "
                    + body.length + "\r\nConnection: close\r\nUser-Agent: " + Http.USER_AGENT + "\r\n\r\n";
            OutputStream out = s.getOutputStream();
            out.write(Codec.utf8(head));
            out.write(body);
            out.flush();
            InputStream in = new java.io.BufferedInputStream(s.getInputStream());
            return readHead(in, new LinkedHashMap<String, String>());
        } finally {
            s.close();
        }
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
