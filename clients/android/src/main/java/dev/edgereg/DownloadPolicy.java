package dev.edgereg;

import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * When blobs may be downloaded, and how much room to leave (docs/protocol.md section 8).
 *
 * <pre>{@code
 * DownloadPolicy wifiWhileCharging = DownloadPolicy.defaults().wifiOnly().whileCharging();
 * }</pre>
 *
 * <p>A condition the app does not say is unknown, and an unknown condition counts as unmet: with
 * {@code wifiOnly()}, {@code update("digits")} (no conditions) defers instead of downloading on
 * cellular. Pass what the platform says ({@code ConnectivityManager}, {@code BatteryManager},
 * {@code PowerManager}) as {@link Conditions}.
 */
public final class DownloadPolicy {
    public final boolean allowMetered;
    public final boolean requireCharging;
    public final boolean requireIdle;
    public final boolean requireStorageNotLow;
    public final long reserveBytes;

    public DownloadPolicy(boolean allowMetered, boolean requireCharging, long reserveBytes) {
        this(allowMetered, requireCharging, false, false, reserveBytes);
    }

    public DownloadPolicy(boolean allowMetered, boolean requireCharging, boolean requireIdle, boolean requireStorageNotLow, long reserveBytes) {
        if (reserveBytes < 0) throw new IllegalArgumentException("reserveBytes must be >= 0");
        this.allowMetered = allowMetered;
        this.requireCharging = requireCharging;
        this.requireIdle = requireIdle;
        this.requireStorageNotLow = requireStorageNotLow;
        this.reserveBytes = reserveBytes;
    }

    /** Nothing required (metered allowed, no charging, idle or storage condition), 8 MiB kept free. */
    @Nonnull
    public static DownloadPolicy defaults() {
        return new DownloadPolicy(true, false, false, false, 8L * 1024 * 1024);
    }

    /** This policy, downloading only on an unmetered network (Wi-Fi). */
    @Nonnull public DownloadPolicy wifiOnly() { return new DownloadPolicy(false, requireCharging, requireIdle, requireStorageNotLow, reserveBytes); }

    /** This policy, downloading only while charging. */
    @Nonnull public DownloadPolicy whileCharging() { return new DownloadPolicy(allowMetered, true, requireIdle, requireStorageNotLow, reserveBytes); }

    /** This policy, downloading only while the device is idle. */
    @Nonnull public DownloadPolicy whileIdle() { return new DownloadPolicy(allowMetered, requireCharging, true, requireStorageNotLow, reserveBytes); }

    /** This policy, downloading only while storage is not low. */
    @Nonnull public DownloadPolicy whileStorageNotLow() { return new DownloadPolicy(allowMetered, requireCharging, requireIdle, true, reserveBytes); }

    /** This policy, keeping {@code bytes} free after a download. */
    @Nonnull public DownloadPolicy reserve(long bytes) { return new DownloadPolicy(allowMetered, requireCharging, requireIdle, requireStorageNotLow, bytes); }

    /** The device's state now; a null field is unknown, and unknown counts as unmet. */
    public static final class Conditions {
        @Nullable public final Boolean metered;
        @Nullable public final Boolean charging;
        @Nullable public final Boolean idle;
        @Nullable public final Boolean storageLow;

        public Conditions(@Nullable Boolean metered, @Nullable Boolean charging) {
            this(metered, charging, null, null);
        }

        public Conditions(@Nullable Boolean metered, @Nullable Boolean charging, @Nullable Boolean idle, @Nullable Boolean storageLow) {
            this.metered = metered;
            this.charging = charging;
            this.idle = idle;
            this.storageLow = storageLow;
        }

        /** Nothing said: every condition a policy requires is unmet. */
        @Nonnull
        public static Conditions unknown() {
            return new Conditions(null, null, null, null);
        }
    }

    /**
     * Why a download waits, or null when it may go: the first unmet condition in the protocol's
     * order, {@code metered}, {@code not-charging}, {@code not-idle}, {@code storage-low}.
     */
    @Nullable
    public String unmet(@Nonnull Conditions c) {
        if (!allowMetered && !Boolean.FALSE.equals(c.metered)) return "metered";
        if (requireCharging && !Boolean.TRUE.equals(c.charging)) return "not-charging";
        if (requireIdle && !Boolean.TRUE.equals(c.idle)) return "not-idle";
        if (requireStorageNotLow && !Boolean.FALSE.equals(c.storageLow)) return "storage-low";
        return null;
    }
}
