package dev.edgereg;

import javax.annotation.Nonnull;

/** One model or bundle installed in this client's cache ({@link EdgeregClient#installedUnits}). */
public final class InstalledUnit {
    @Nonnull public final String unit;
    /** {@code model} or {@code bundle}. */
    @Nonnull public final String kind;
    @Nonnull public final String version;
    public final boolean isCandidate;

    InstalledUnit(String unit, String kind, String version, boolean isCandidate) {
        this.unit = unit;
        this.kind = kind;
        this.version = version;
        this.isCandidate = isCandidate;
    }
}
