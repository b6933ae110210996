package dev.edgereg;

import dev.edgereg.internal.CpuFeatures;
import java.util.Collection;
import java.util.Collections;
import java.util.Set;
import java.util.TreeSet;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * What the device and the app say about themselves: the input of the tier rules (section 5),
 * the cohort (section 6) and the fit rule (section 7, rule 12). Immutable; build with
 * {@link #builder(String)}. On Android: {@code ActivityManager.MemoryInfo.totalMem},
 * {@code Runtime.availableProcessors()}, {@code Build.SOC_MODEL} (API 31+, else {@code Build.HARDWARE}),
 * {@code Build.VERSION.SDK_INT}.
 */
public final class DeviceFacts {
    @Nonnull public final String deviceId;
    public final long ramMb;
    public final int cpuCores;
    /** Whether the app said the core count: an unsaid one (1 for the tier rules) matches no hint rule. */
    final boolean cpuCoresSaid;
    @Nullable public final String soc;
    @Nullable public final String os;
    @Nullable public final String osVersion;
    @Nullable public final String mnnRuntime;
    @Nullable public final String appVersion;
    /**
     * The CPU features fit rule (e) reads ({@code dotprod}, {@code fp16}, {@code i8mm}, {@code bf16},
     * {@code sve2}, {@code sme}; docs/protocol.md section 7), or null: not said, rule (e) skipped.
     * Read from the platform unless the app says them.
     */
    @Nullable public final Set<String> cpuFeatures;
    /** How much memory one model (a bundle: its members together) may take, MiB; null: not said, rule (d) skipped. */
    @Nullable public final Double memoryBudgetMb;

    private DeviceFacts(Builder b) {
        this.deviceId = b.deviceId;
        this.ramMb = b.ramMb;
        this.cpuCores = b.cpuCores;
        this.cpuCoresSaid = b.cpuCoresSaid;
        this.soc = b.soc;
        this.os = b.os;
        this.osVersion = b.osVersion;
        this.mnnRuntime = b.mnnRuntime;
        this.appVersion = b.appVersion;
        Set<String> features = b.featuresSaid ? b.cpuFeatures : CpuFeatures.detect();
        this.cpuFeatures = features == null ? null : Collections.unmodifiableSet(new TreeSet<String>(features));
        this.memoryBudgetMb = b.memoryBudgetMb;
    }

    /** @param deviceId a sticky install id kept in the app's private storage (never a hardware id) */
    @Nonnull
    public static Builder builder(@Nonnull String deviceId) {
        return new Builder(deviceId);
    }

    public static final class Builder {
        private final String deviceId;
        private long ramMb;
        private int cpuCores = 1;
        private boolean cpuCoresSaid;
        private String soc;
        private String os = "android";
        private String osVersion;
        private String mnnRuntime;
        private String appVersion;
        private boolean featuresSaid;
        private Set<String> cpuFeatures;
        private Double memoryBudgetMb;

        Builder(String deviceId) {
            if (deviceId == null || deviceId.isEmpty()) throw new IllegalArgumentException("deviceId must be a non-empty sticky install id");
            this.deviceId = deviceId;
        }

        @Nonnull public Builder ramMb(long ramMb) { this.ramMb = ramMb; return this; }

        @Nonnull public Builder cpuCores(int cores) { this.cpuCores = cores; this.cpuCoresSaid = true; return this; }

        /** The SoC name ({@code Build.SOC_MODEL}); null: unknown (a tier with soc_allow does not match). */
        @Nonnull public Builder soc(@Nullable String soc) { this.soc = soc; return this; }

        /** {@code "android"} and the API level ({@code "34"}), or {@code "ios"} and its version. */
        @Nonnull public Builder os(@Nullable String os, @Nullable String version) { this.os = os; this.osVersion = version; return this; }

        /** The MNN runtime in the app, like {@code "3.6.1"}; null skips the runtime rule. */
        @Nonnull public Builder mnnRuntime(@Nullable String version) { this.mnnRuntime = version; return this; }

        /** The app's versionName, for releases with {@code requires.app}. */
        @Nonnull public Builder appVersion(@Nullable String version) { this.appVersion = version; return this; }

        /**
         * The device's CPU features, instead of reading them from the platform (the default:
         * {@code /proc/cpuinfo} on aarch64, none on x86_64). Null: not said, fit rule (e) is
         * skipped; an empty set says the CPU has none.
         *
         * @throws IllegalArgumentException a name no manifest could name (like {@code I8MM})
         */
        @Nonnull public Builder cpuFeatures(@Nullable Collection<String> features) {
            Set<String> names = null;
            if (features != null) {
                names = new TreeSet<String>();
                for (String f : features) {
                    if (f == null || !CpuFeatures.isName(f)) {
                        throw new IllegalArgumentException("cpu feature '" + f + "' is not a feature name: a lowercase letter or digit, "
                                + "then up to 31 lowercase letters, digits, '_' or '-' (like i8mm)");
                    }
                    names.add(f);
                }
            }
            this.cpuFeatures = names;
            this.featuresSaid = true;
            return this;
        }

        /**
         * How much memory one model (a bundle: all its members together) may take on this device,
         * in MiB, for fit rule (d). Not called: not said, the rule is skipped.
         *
         * @throws IllegalArgumentException not above 0 and at most 1048576
         */
        @Nonnull public Builder memoryBudgetMb(double mb) {
            if (!(mb > 0 && mb <= 1048576)) throw new IllegalArgumentException("memoryBudgetMb must be above 0 and at most 1048576 MiB, got " + mb);
            this.memoryBudgetMb = mb;
            return this;
        }

        @Nonnull public DeviceFacts build() {
            // A version that does not parse is kept: rule 12 treats it as not meeting any requirement on it.
            return new DeviceFacts(this);
        }
    }
}
