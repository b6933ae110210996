package dev.edgereg;

import javax.annotation.Nonnull;

/**
 * Hears each change of what is installed (installed, rolled back by the server, reverted,
 * deleted), on the thread that made it. An exception it throws is ignored by the client.
 */
public interface ModelListener {
    void onChange(@Nonnull ModelChange change);
}
