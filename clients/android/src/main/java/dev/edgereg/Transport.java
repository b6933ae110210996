package dev.edgereg;

import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * How the client speaks HTTP: the seam an app with its own stack (OkHttp, Cronet) or a test plugs
 * into with {@link EdgeregClient.Builder#transport}, as OkHttp takes a socket factory. The default
 * is the platform's HttpURLConnection (OkHttp inside on Android). The client adds the protocol's
 * headers (User-Agent, If-None-Match, Range, Accept-Encoding: identity) and keeps every rule:
 * size and digest checks, the deadline and minimum rate, cancellation through {@link
 * Exchange#abort}. A transport must not transform the body (no content decoding).
 */
public interface Transport {
    /**
     * Send a GET. Redirects may be followed; a status of any kind is returned, not thrown.
     *
     * @param headers the request headers, names as given
     * @param timeoutMs connect and per-read timeout, and the most the whole response head (status
     *     line and headers) may take: a server trickling header lines under the read timeout must
     *     not hold the client (docs/protocol.md section 7)
     * @throws IOException the request did not complete (the client reports {@code transport})
     */
    @Nonnull
    Exchange get(@Nonnull String url, @Nonnull Map<String, String> headers, int timeoutMs) throws IOException;

    /** POST a small body (a report); the status code. */
    int post(@Nonnull String url, @Nonnull byte[] body, @Nonnull Map<String, String> headers, int timeoutMs) throws IOException;

    /** One response: status, headers, a body read in chunks. */
    interface Exchange extends Closeable {
        int status();

        /** A response header by its lower-case name, or null. */
        @Nullable
        String header(@Nonnull String lowerCaseName);

        /** The body (an error status's too), read as it arrives. */
        @Nonnull
        InputStream body() throws IOException;

        /** Cut the connection from another thread (a cancel): a read in progress fails at once. */
        void abort();
    }
}
