package dev.edgereg.internal;

import java.security.MessageDigest;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;

/**
 * A blob's SHA-256 on a second thread while the updating thread reads the network and writes the
 * file: the digest overlaps the transfer instead of following each read. Chunks keep their order
 * (one hashing thread, one queue); at most {@link #CHUNKS} buffers of {@code chunkBytes} are in
 * flight, so memory stays bounded when hashing is slower than the network.
 *
 * <p>Use from one thread: {@link #buffer} for an empty buffer, fill it, {@link #hash} it (the
 * buffer is not to be touched after), then {@link #finish} (waits for the digest to take every
 * chunk) or {@link #abandon} (on any failure; the digest is left unfinished and unusable).
 */
public final class HashPipe {
    /** Buffers in flight: with 64 KiB chunks, 512 KiB ahead of the digest at most. */
    static final int CHUNKS = 8;
    private static final Chunk END = new Chunk(0);

    static final class Chunk {
        final byte[] bytes;
        int length;

        Chunk(int size) {
            bytes = new byte[size];
        }
    }

    private final MessageDigest digest;
    private final BlockingQueue<Chunk> free = new ArrayBlockingQueue<Chunk>(CHUNKS);
    private final BlockingQueue<Chunk> full = new ArrayBlockingQueue<Chunk>(CHUNKS + 1);
    private final Thread thread;
    private volatile boolean abandoned;
    private volatile Throwable failed;
    private Chunk lent;

    /** Starts the hashing thread; {@code digest} (which may hold a resumed part) is its until finish. */
    public HashPipe(MessageDigest digest, int chunkBytes) {
        this.digest = digest;
        for (int i = 0; i < CHUNKS; i++) free.add(new Chunk(chunkBytes));
        thread = new Thread(new Runnable() {
            @Override public void run() {
                drain();
            }
        }, "edgereg-sha256");
        thread.setDaemon(true);
        thread.start();
    }

    private void drain() {
        try {
            while (true) {
                Chunk c = full.take();
                if (c == END) return;
                if (!abandoned) digest.update(c.bytes, 0, c.length);
                free.add(c);
            }
        } catch (InterruptedException e) {
            // only abandon interrupts this thread
        } catch (RuntimeException e) {
            failed = e;
        }
    }

    /** An empty buffer to read into; blocks while every buffer waits for the digest. */
    public byte[] buffer() throws InterruptedException {
        if (lent == null) lent = free.take();
        return lent.bytes;
    }

    /** Hands the first {@code length} bytes of the buffer {@link #buffer} gave to the digest. */
    public void hash(int length) throws InterruptedException {
        if (lent == null) throw new IllegalStateException("hash without buffer");
        lent.length = length;
        full.put(lent);
        lent = null;
    }

    /** Waits until every chunk handed over is in the digest; the digest is the caller's again. */
    public void finish() throws InterruptedException {
        full.put(END);
        thread.join();
        if (failed != null) throw new IllegalStateException("SHA-256 failed", failed);
    }

    /** Stops hashing (after a failure or a cancel): returns at once; safe to call twice. */
    public void abandon() {
        abandoned = true;
        full.offer(END);
        thread.interrupt();
    }
}
