package dev.edgereg.internal;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.security.MessageDigest;
import java.util.ArrayDeque;

/**
 * The blobs' SHA-256 on a second thread that reads each .part file behind the thread writing it:
 * the updating thread reads the network and writes the file and never waits for the digest, so
 * a slow digest (a JVM's SHA-256 runs interpreted for its first megabytes, before the JIT
 * compiles it) overlaps the rest of the download, the next blobs included, instead of holding
 * it. The bytes hashed are the bytes on disk, read back from the page cache: memory stays one
 * buffer however far behind the digest is.
 *
 * <p>The writer {@link #add}s a file, reports each write with {@link Job#wrote}, ends it with
 * {@link Job#closed}, and later {@link #await}s the job: then the job's digest holds every byte
 * and is the writer's again. Files are hashed in the order added, one at a time. {@link #close}
 * (done, or after any failure or cancel) stops the thread; a job not finished by then is left
 * unfinished and its digest unusable.
 */
public final class HashPipe {
    private static final int BUFFER = 64 * 1024;

    /** One file to hash from an offset (a resumed part's bytes are already in the digest). */
    public final class Job {
        final MessageDigest digest;
        final File file;
        final long from;
        private long written; // bytes past from that the writer has written (guarded by the pipe)
        private long hashed; // bytes past from in the digest (guarded by the pipe)
        private boolean closed;
        private boolean done;
        private IOException failed;

        Job(MessageDigest digest, File file, long from) {
            this.digest = digest;
            this.file = file;
            this.from = from;
        }

        /** {@code n} more bytes are written to the file (the write returned). */
        public void wrote(int n) {
            synchronized (HashPipe.this) {
                written += n;
                HashPipe.this.notifyAll();
            }
        }

        /** The writer is done with the file: the job ends at what it wrote. */
        public void closed() {
            synchronized (HashPipe.this) {
                closed = true;
                HashPipe.this.notifyAll();
            }
        }

        /** True once every byte written is in the digest (or the file could not be read). */
        public boolean finished() {
            synchronized (HashPipe.this) {
                return done || failed != null;
            }
        }
    }

    private final ArrayDeque<Job> jobs = new ArrayDeque<Job>();
    private Thread thread;
    private boolean stopped;

    /** Hashes {@code file} from byte {@code from} into {@code digest}, after the jobs added before. */
    public synchronized Job add(MessageDigest digest, File file, long from) {
        if (stopped) throw new IllegalStateException("hash pipe closed");
        Job job = new Job(digest, file, from);
        jobs.add(job);
        if (thread == null) {
            thread = new Thread(new Runnable() {
                @Override public void run() {
                    drain();
                }
            }, "edgereg-sha256");
            thread.setDaemon(true);
            thread.start();
        }
        notifyAll();
        return job;
    }

    /**
     * Waits at most {@code millis} for {@code job} to take every byte written to it (the caller
     * checks for a cancel between waits); true when it has, and then its digest is the caller's.
     *
     * @throws IOException the file could not be read back
     */
    public synchronized boolean await(Job job, long millis) throws IOException, InterruptedException {
        if (!job.done && job.failed == null && !stopped && millis > 0) wait(millis);
        if (job.failed != null) throw job.failed;
        if (!job.done && stopped) throw new IllegalStateException("hash pipe closed before the job finished");
        return job.done;
    }

    /** Stops the thread (every job awaited, or a failure or cancel): returns at once; idempotent. */
    public void close() {
        Thread t;
        synchronized (this) {
            stopped = true;
            t = thread;
            notifyAll();
        }
        if (t != null) t.interrupt();
    }

    private void drain() {
        byte[] buf = new byte[BUFFER];
        Job job = null;
        RandomAccessFile in = null;
        try {
            while (true) {
                int want;
                synchronized (this) {
                    while (!stopped && (jobs.isEmpty() || (jobs.peek().hashed == jobs.peek().written && !jobs.peek().closed))) wait();
                    if (stopped) return;
                    Job head = jobs.peek();
                    if (head.hashed == head.written) { // closed, and all of it hashed
                        head.done = true;
                        jobs.poll();
                        notifyAll();
                        continue;
                    }
                    want = (int) Math.min(buf.length, head.written - head.hashed);
                    if (head != job) {
                        closeQuietly(in);
                        in = null;
                        job = head;
                    }
                }
                int n;
                try {
                    if (in == null) {
                        in = new RandomAccessFile(job.file, "r");
                        in.seek(job.from + job.hashed);
                    }
                    n = in.read(buf, 0, want);
                    if (n <= 0) throw new IOException(job.file + " ended before the bytes written to it");
                } catch (IOException e) {
                    synchronized (this) {
                        job.failed = e;
                        jobs.poll();
                        notifyAll();
                    }
                    closeQuietly(in);
                    in = null;
                    job = null;
                    continue;
                }
                job.digest.update(buf, 0, n);
                synchronized (this) {
                    job.hashed += n;
                }
            }
        } catch (InterruptedException e) {
            // only close interrupts this thread
        } finally {
            closeQuietly(in);
        }
    }

    private static void closeQuietly(RandomAccessFile f) {
        if (f == null) return;
        try {
            f.close();
        } catch (IOException e) {
            // read-only: nothing lost
        }
    }
}
