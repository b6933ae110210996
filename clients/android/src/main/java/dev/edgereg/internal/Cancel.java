package dev.edgereg.internal;

import java.util.Timer;
import java.util.TimerTask;

/**
 * Cancels one update from any thread (docs/protocol.md section 8): {@link #cancel} is idempotent
 * and returns at once; the connection in progress is cut from the cancelling thread, so a stalled
 * read does not hold the update. The thread running the update is watched too: interrupting it
 * cancels the same way within a tenth of a second.
 */
public final class Cancel {
    private static final Timer WATCH = new Timer("edgereg-cancel-watch", true);

    private volatile boolean cancelled;
    private volatile Thread worker;
    private Runnable current;
    private TimerTask watching;

    /** Cancel the update: safe from any thread, any number of times. */
    public void cancel() {
        Runnable open;
        synchronized (this) {
            cancelled = true;
            open = current;
        }
        if (open != null) open.run();
    }

    public boolean isCancelled() {
        Thread w = worker;
        return cancelled || (w != null && w.isInterrupted());
    }

    /** The update runs on this thread from now on: an interrupt of it cancels. */
    public synchronized void runOn(final Thread thread) {
        worker = thread;
        if (watching != null) watching.cancel();
        watching = new TimerTask() {
            @Override public void run() {
                if (thread.isInterrupted() && !cancelled) cancel();
            }
        };
        WATCH.scheduleAtFixedRate(watching, 100, 100);
    }

    /** The update is over: stop watching its thread. */
    public synchronized void done() {
        if (watching != null) watching.cancel();
        watching = null;
        worker = null;
        current = null;
    }

    /** Run {@code abort} (which cuts a connection) when cancelled: at once, if already. */
    public void watch(Runnable abort) {
        boolean now;
        synchronized (this) {
            current = abort;
            now = isCancelled();
        }
        if (now) abort.run();
    }

    public synchronized void unwatch(Runnable abort) {
        if (current == abort) current = null;
    }

    /** Throws {@code cancelled} when the app cancelled (the update's checkpoints call it). */
    public void check() throws Rejected {
        if (isCancelled()) throw cancelled();
    }

    public static Rejected cancelled() {
        return new Rejected(Reasons.CANCELLED, "the update was cancelled by the app; nothing was installed, the download resumes next time");
    }
}
