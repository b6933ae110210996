package dev.edgereg;

/**
 * Told how a release's download goes (docs/protocol.md section 8): {@code done} and {@code total}
 * bytes of the whole release. The total is known before the first byte, bytes kept from an
 * interrupted download count as done from the start, and the last call is (total, total). Called
 * on the thread running the update; it must return quickly and never throws into the client (an
 * exception is ignored).
 */
public interface ProgressListener {
    void onProgress(long done, long total);
}
