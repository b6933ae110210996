package dev.edgereg;

import java.util.Collections;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * What an update (or {@code current}) left installed, and why nothing new was, if so. Never
 * thrown: {@link #errorCode} is a reason code of docs/protocol.md section 7 or a client code
 * ({@code transport}, {@code not-found}, {@code cache}, {@code no-space}, {@code bad-release},
 * {@code probe-failed}, {@code untrusted}), and {@link #members} is still the last good install.
 */
public final class UpdateResult {
    @Nonnull public final String unit;
    @Nullable public final String tier;
    /** The unit's version (a bundle's own), or null when nothing is installed. */
    @Nullable public final String version;
    public final boolean isCandidate;
    /** A new release was installed by this call. */
    public final boolean updated;
    /** The server answered 304 (the manifest was verified again anyway). */
    public final boolean notModified;
    /** Why the candidate was passed over for stable ({@code runtime-too-old}, {@code app-incompatible}, {@code os-incompatible}, {@code insufficient-memory}, {@code cpu-unsupported}, {@code bad-release}), or null. */
    @Nullable public final String fallback;
    /**
     * {@code cpu-unsupported} when this update chose an entry's {@code instead}: the variant the
     * release names for devices with a CPU feature the entry avoids ({@link InstalledModel#variant}
     * is the one installed); else null.
     */
    @Nullable public final String substitute;
    /** Why the download waits ({@code metered}, {@code not-charging}), or null. */
    @Nullable public final String deferred;
    /** The installed release is the one shipped in the app. */
    public final boolean bundled;
    public final long downloadedBytes;
    @Nullable public final String errorCode;
    @Nullable public final String errorMessage;
    /** Every installed model by name (one for a model, every member for a bundle). */
    @Nonnull public final Map<String, InstalledModel> members;

    UpdateResult(String unit, String tier, String version, boolean isCandidate, boolean updated, boolean notModified,
            String fallback, String substitute, String deferred, boolean bundled, long downloadedBytes, String errorCode, String errorMessage,
            Map<String, InstalledModel> members) {
        this.unit = unit;
        this.tier = tier;
        this.version = version;
        this.isCandidate = isCandidate;
        this.updated = updated;
        this.notModified = notModified;
        this.fallback = fallback;
        this.substitute = substitute;
        this.deferred = deferred;
        this.bundled = bundled;
        this.downloadedBytes = downloadedBytes;
        this.errorCode = errorCode;
        this.errorMessage = errorMessage;
        this.members = Collections.unmodifiableMap(members);
    }

    /** True when nothing failed (a deferred download is not a failure). */
    public boolean ok() {
        return errorCode == null;
    }

    /** The installed model of a model unit (the first member of a bundle), or null. */
    @Nullable
    public InstalledModel model() {
        return members.isEmpty() ? null : members.values().iterator().next();
    }

    UpdateResult withError(String code, String message) {
        return new UpdateResult(unit, tier, version, isCandidate, false, notModified, fallback, substitute, deferred, bundled, downloadedBytes,
                code, message, members);
    }

    @Override public String toString() {
        return unit + " " + (version == null ? "(nothing installed)" : version) + (errorCode == null ? "" : " [" + errorCode + ": " + errorMessage + "]");
    }
}
