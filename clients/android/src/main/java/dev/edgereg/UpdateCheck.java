package dev.edgereg;

import javax.annotation.Nullable;

/** What {@link EdgeregClient#check} found: whether an update would install, without downloading it. */
public final class UpdateCheck {
    /** A release other than the installed one would install now. */
    public final boolean available;
    /** The release this device would install (the installed one when up to date), or null. */
    @Nullable public final String version;
    /** The version installed now, or null. */
    @Nullable public final String installed;
    public final boolean isCandidate;
    /** Bytes an update would still download (0 when they are on the device). */
    public final long downloadBytes;
    /** Why an update would wait (an unmet condition: metered, not-charging, not-idle, storage-low), or null. */
    @Nullable public final String deferred;
    /** Why the candidate was passed over, or null. */
    @Nullable public final String fallback;
    /** Why nothing can be installed (a reason code), or null. */
    @Nullable public final String errorCode;
    @Nullable public final String errorMessage;

    UpdateCheck(boolean available, String version, String installed, boolean isCandidate, long downloadBytes, String deferred,
            String fallback, String errorCode, String errorMessage) {
        this.available = available;
        this.version = version;
        this.installed = installed;
        this.isCandidate = isCandidate;
        this.downloadBytes = downloadBytes;
        this.deferred = deferred;
        this.fallback = fallback;
        this.errorCode = errorCode;
        this.errorMessage = errorMessage;
    }
}
