package dev.edgereg;

import java.io.File;
import java.util.Map;
import javax.annotation.Nonnull;
import javax.annotation.Nullable;

/**
 * The app's MNN, as the self-test uses it (docs/protocol.md section 11): load a model on one
 * backend, run it. Implemented by the app with MNN's Android API (see docs/guides/android.md).
 * Called on the thread that runs {@link EdgeregClient#update}, never on the main thread by the SDK.
 */
public interface ModelRunner {
    /**
     * Load {@code model} on {@code backend} ({@code cpu}, {@code opencl}, {@code vulkan},
     * {@code opengl}, {@code nnapi}, ...).
     *
     * @throws BackendUnavailableException the device has no such backend (no GPU driver): skipped,
     *     not counted as failing. MNN falls back to the CPU silently, so an adapter must check
     *     the backend it actually got.
     * @throws Exception the model does not load there: the backend counts as failing
     */
    @Nonnull
    Session load(@Nonnull File model, @Nonnull String backend, int threads, @Nonnull String precision) throws Exception;

    /**
     * The MNN APIs this runner calls: {@code session} ({@code MNNNetInstance.createSession} /
     * {@code runSession}, MNN's Android Java API) and/or {@code module} ({@code
     * MNN::Express::Module::load} through JNI). A model whose entry says it needs the Module API
     * (an LSTM's While subgraph: the session API fails on it) is refused before download by a
     * client whose runner does not say {@code module} (docs/protocol.md section 7, fit rule (f)).
     * The default is the session API, the one MNN's Android Java API offers.
     */
    @Nonnull
    default java.util.Set<String> mnnApis() {
        return java.util.Collections.singleton("session");
    }

    /** One loaded model. */
    interface Session extends java.io.Closeable {
        /**
         * Run once: inputs by tensor name; return at least the outputs named in {@code outputs}
         * (the probe's expected outputs and the state outputs), by name, in the model's own
         * layout (convert MNN's NC4HW4 GPU outputs first).
         */
        @Nonnull
        Map<String, Tensor> run(@Nonnull Map<String, Tensor> inputs, @Nonnull java.util.List<String> outputs) throws Exception;

        /** The shape of an input (for the zero state of recurrent models), or null: the contract's is used. */
        @Nullable
        int[] inputShape(@Nonnull String name);
    }

    /** The backend does not exist on this device. */
    final class BackendUnavailableException extends Exception {
        private static final long serialVersionUID = 1L;

        public BackendUnavailableException(@Nonnull String message) {
            super(message);
        }
    }
}
