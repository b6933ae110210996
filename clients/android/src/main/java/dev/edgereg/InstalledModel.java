package dev.edgereg;

import java.io.File;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/** One installed, verified model: what the app loads and how it calls it. */
public final class InstalledModel {
    /** The model's name (a bundle member's name). */
    @Nonnull public final String name;
    /** The verified {@code .mnn} file. */
    @Nonnull public final File file;
    @Nonnull public final String version;
    @Nonnull public final String variant;
    @Nonnull public final String sha256;
    /**
     * The threads, backends in order (cpu last) and precision to run it with: the entry's
     * declared {@code runtime}, or the threads and backends of the {@code runtime_hints} rule
     * this device uses ({@link #runtimeRule}, docs/protocol.md section 11, "Runtime hints").
     */
    public final int threads;
    @Nonnull public final List<String> backends;
    @Nonnull public final String precision;
    @Nonnull public final String minMnnRuntime;
    /** How to call it (inputs, outputs, state, task), or null when the release has none. */
    @Nullable public final ModelContract contract;
    /** Class labels or characters (inline, or the verified labels blob), or null. */
    @Nullable public final List<String> labels;
    /** The verified golden probe, or null. */
    @Nullable public final File probeFile;
    /** The backend the self-test chose, or null when there was no self-test. */
    @Nullable public final String backend;
    /**
     * The index of the entry's {@code runtime_hints} rule whose threads and backends these are,
     * or null: the declared runtime (no rule matched this device, or it is outside the rule's percent).
     */
    @Nullable public final Integer runtimeRule;

    InstalledModel(String name, File file, String version, String variant, String sha256, int threads, List<String> backends,
            String precision, String minMnnRuntime, ModelContract contract, List<String> labels, File probeFile, String backend,
            Integer runtimeRule) {
        this.name = name;
        this.file = file;
        this.version = version;
        this.variant = variant;
        this.sha256 = sha256;
        this.threads = threads;
        this.backends = Collections.unmodifiableList(backends);
        this.precision = precision;
        this.minMnnRuntime = minMnnRuntime;
        this.contract = contract;
        this.labels = labels == null ? null : Collections.unmodifiableList(labels);
        this.probeFile = probeFile;
        this.backend = backend;
        this.runtimeRule = runtimeRule;
    }

    @Override public String toString() {
        return name + " " + version + " (" + variant + ", " + (backend == null ? "no self-test" : backend) + ")";
    }

    static Map<String, InstalledModel> none() {
        return Collections.emptyMap();
    }
}
