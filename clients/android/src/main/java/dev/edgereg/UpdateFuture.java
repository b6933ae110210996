package dev.edgereg;

import dev.edgereg.internal.Cancel;
import java.util.concurrent.CompletableFuture;

/**
 * An update running on an Executor ({@link EdgeregClient#updateAsync}). {@link #cancel} cancels
 * the update itself, not only the future: within a second the download stops, its part is kept
 * for a later resume, and nothing is installed. From Kotlin coroutines,
 * {@code kotlinx-coroutines-jdk8}'s {@code future.await()} cancels it with the coroutine.
 */
public final class UpdateFuture extends CompletableFuture<UpdateResult> {
    private final Cancel token;

    UpdateFuture(Cancel token) {
        this.token = token;
    }

    /** Cancel the update (idempotent; from any thread). */
    @Override
    public boolean cancel(boolean mayInterruptIfRunning) {
        token.cancel();
        return super.cancel(mayInterruptIfRunning);
    }
}
