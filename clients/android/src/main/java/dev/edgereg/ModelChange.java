package dev.edgereg;

import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/** A change of what is installed for a unit, as a {@link ModelListener} hears it. */
public final class ModelChange {
    /** A newer (or the first) release was installed. */
    public static final String INSTALLED = "installed";
    /** An update installed a lower version: the server took a release back. */
    public static final String ROLLED_BACK = "rolled-back";
    /** The app, or a crash loop, reverted the release. */
    public static final String REVERTED = "reverted";
    /** The app deleted the unit. */
    public static final String DELETED = "deleted";

    @Nonnull public final String unit;
    @Nonnull public final String kind;
    /** What is installed now, or null. */
    @Nullable public final String version;
    /** What was installed before, or null. */
    @Nullable public final String previous;

    ModelChange(String unit, String kind, String version, String previous) {
        this.unit = unit;
        this.kind = kind;
        this.version = version;
        this.previous = previous;
    }

    @Override public String toString() {
        return unit + " " + kind + " " + previous + " -> " + version;
    }
}
