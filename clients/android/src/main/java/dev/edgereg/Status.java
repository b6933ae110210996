package dev.edgereg;

import java.util.Collections;
import java.util.List;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/** One unit on this device, from the cache only: installed, last good, pending, last error, ready. */
public final class Status {
    /** A set of models installed as one: its version and each member's version and digest. */
    public static final class Installed {
        @Nonnull public final String version;
        public final boolean isCandidate;
        public final boolean bundled;
        /** member name to {version, sha256} */
        @Nonnull public final Map<String, String[]> members;

        Installed(String version, boolean isCandidate, boolean bundled, Map<String, String[]> members) {
            this.version = version;
            this.isCandidate = isCandidate;
            this.bundled = bundled;
            this.members = Collections.unmodifiableMap(members);
        }
    }

    /** A verified release whose download has not finished, or waits for conditions. */
    public static final class Pending {
        @Nonnull public final String version;
        public final boolean isCandidate;
        /** Bytes of the blobs missing when it became pending. */
        public final long totalBytes;
        /** Of those, what is not downloaded yet (a .part counts for what it holds). */
        public final long remainingBytes;
        @Nullable public final String deferred;
        @Nonnull public final String since;

        Pending(String version, boolean isCandidate, long totalBytes, long remainingBytes, String deferred, String since) {
            this.version = version;
            this.isCandidate = isCandidate;
            this.totalBytes = totalBytes;
            this.remainingBytes = remainingBytes;
            this.deferred = deferred;
            this.since = since;
        }
    }

    @Nonnull public final String unit;
    @Nullable public final Installed installed;
    @Nullable public final Installed lastGood;
    @Nullable public final Pending pending;
    @Nullable public final String lastErrorCode;
    @Nullable public final String lastErrorMessage;
    @Nullable public final String lastErrorAt;
    /** Versions refused for good on this device (failed probe, reverted). */
    @Nonnull public final List<String> refused;
    /** Every installed blob is present with its declared digest. */
    public final boolean ready;

    Status(String unit, Installed installed, Installed lastGood, Pending pending, String lastErrorCode, String lastErrorMessage,
            String lastErrorAt, List<String> refused, boolean ready) {
        this.unit = unit;
        this.installed = installed;
        this.lastGood = lastGood;
        this.pending = pending;
        this.lastErrorCode = lastErrorCode;
        this.lastErrorMessage = lastErrorMessage;
        this.lastErrorAt = lastErrorAt;
        this.refused = Collections.unmodifiableList(refused);
        this.ready = ready;
    }
}
