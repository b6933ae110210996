package dev.edgereg;

import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/** A revert {@link EdgeregClient#appStarted()} carried out: load {@code current()} again. */
public final class AppStart {
    @Nonnull public final String unit;
    /** The unconfirmed version, now marked bad on this device. */
    @Nonnull public final String version;
    /** What is installed now (the last good), or null. */
    @Nullable public final String nowVersion;
    @Nonnull public final String reason;

    AppStart(String unit, String version, String nowVersion, String reason) {
        this.unit = unit;
        this.version = version;
        this.nowVersion = nowVersion;
        this.reason = reason;
    }
}
