package dev.edgereg;

import javax.annotation.Nonnull;

/** When blobs may be downloaded, and how much room to leave (docs/protocol.md section 8). */
public final class DownloadPolicy {
    public final boolean allowMetered;
    public final boolean requireCharging;
    public final long reserveBytes;

    public DownloadPolicy(boolean allowMetered, boolean requireCharging, long reserveBytes) {
        if (reserveBytes < 0) throw new IllegalArgumentException("reserveBytes must be >= 0");
        this.allowMetered = allowMetered;
        this.requireCharging = requireCharging;
        this.reserveBytes = reserveBytes;
    }

    /** Metered allowed, charging not required, 8 MiB kept free. */
    @Nonnull
    public static DownloadPolicy defaults() {
        return new DownloadPolicy(true, false, 8L * 1024 * 1024);
    }

    /** The network and power state now; null fields are unknown, and unknown counts as unmet. */
    public static final class Conditions {
        @javax.annotation.Nullable public final Boolean metered;
        @javax.annotation.Nullable public final Boolean charging;

        public Conditions(@javax.annotation.Nullable Boolean metered, @javax.annotation.Nullable Boolean charging) {
            this.metered = metered;
            this.charging = charging;
        }

        /** Unmetered and charging: nothing holds a download back. */
        @Nonnull
        public static Conditions ideal() {
            return new Conditions(false, true);
        }
    }

    /** Why a download waits ({@code metered}, {@code not-charging}), or null when it may go. */
    @javax.annotation.Nullable
    String unmet(Conditions c) {
        if (!allowMetered && (c.metered == null || c.metered)) return "metered";
        if (requireCharging && (c.charging == null || !c.charging)) return "not-charging";
        return null;
    }
}
