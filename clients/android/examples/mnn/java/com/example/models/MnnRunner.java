package com.example.models;

import com.taobao.android.mnn.MNNForwardType;
import com.taobao.android.mnn.MNNNetInstance;
import dev.edgereg.ModelRunner;
import dev.edgereg.Tensor;
import java.io.File;
import java.io.IOException;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The self-test's model runner over MNN's Android Java API ({@code com.taobao.android.mnn}, the
 * JNI wrapper of MNN's Android build with {@code -DMNN_BUILD_FOR_ANDROID_COMMAND=ON}, plus
 * {@code -DMNN_OPENCL=ON} / {@code -DMNN_VULKAN=ON} as the tiers need). Copy it into the app;
 * it also serves the app's own inference ({@link #load} on {@code model.backend} with
 * {@code model.threads}).
 *
 * <pre>{@code
 * EdgeregClient.builder(url, dir)...runner(new MnnRunner("cpu", "opencl"))...build();
 * }</pre>
 *
 * <p>Give it the backends the app's MNN build has. MNN's Java wrapper cannot say which backend
 * a session got, and MNN falls back to the CPU silently when a GPU backend cannot be created
 * ({@code Can't Find type=N backend}): a backend listed here that the phone lacks would pass
 * the self-test on the CPU. List a GPU backend only when the build has it (and check the
 * device, e.g. OpenCL's {@code libOpenCL.so}), or add a JNI call to
 * {@code Interpreter::getSessionInfo(session, MNN::Interpreter::BACKENDS, &type)} and throw
 * {@link ModelRunner.BackendUnavailableException} when it differs.
 *
 * <p>Precision: the Java wrapper's Config has none, so MNN's default (normal) is used.
 */
public final class MnnRunner implements ModelRunner {
    private final Set<String> backends;

    /**
     * {@code backends}: of cpu, opencl, vulkan, opengl, those this app's MNN build has; none
     * given: the CPU alone.
     */
    public MnnRunner(String... backends) {
        Set<String> known = new HashSet<String>();
        if (backends.length == 0) known.add("cpu");
        for (String b : backends) {
            if (forwardType(b) == null) throw new IllegalArgumentException("MNN on Android has no backend " + b);
            known.add(b);
        }
        if (!known.contains("cpu")) throw new IllegalArgumentException("the CPU backend is always there: list it");
        this.backends = Collections.unmodifiableSet(known);
    }

    static Integer forwardType(String backend) {
        if ("cpu".equals(backend)) return MNNForwardType.FORWARD_CPU.type;
        if ("opencl".equals(backend)) return MNNForwardType.FORWARD_OPENCL.type;
        if ("vulkan".equals(backend)) return MNNForwardType.FORWARD_VULKAN.type;
        if ("opengl".equals(backend)) return MNNForwardType.FORWARD_OPENGL.type;
        return null; // metal, coreml: not on Android
    }

    @Override
    public Session load(File model, String backend, int threads, String precision) throws Exception {
        Integer type = forwardType(backend);
        if (type == null || !backends.contains(backend)) {
            throw new ModelRunner.BackendUnavailableException("this app's MNN has no " + backend + " backend");
        }
        final MNNNetInstance net = MNNNetInstance.createFromFile(model.getAbsolutePath());
        if (net == null) throw new IOException("MNN could not load " + model);
        MNNNetInstance.Config config = new MNNNetInstance.Config();
        config.forwardType = type;
        config.numThread = threads;
        final MNNNetInstance.Session session = net.createSession(config);
        if (session == null) {
            net.release();
            throw new ModelRunner.BackendUnavailableException("MNN cannot create a " + backend + " session here");
        }
        return new MnnSession(net, session);
    }

    /** One loaded model; the self-test drives it from one thread at a time. */
    static final class MnnSession implements ModelRunner.Session {
        private final MNNNetInstance net;
        private final MNNNetInstance.Session session;
        private boolean closed;

        MnnSession(MNNNetInstance net, MNNNetInstance.Session session) {
            this.net = net;
            this.session = session;
        }

        private MNNNetInstance.Session.Tensor input(String name) {
            MNNNetInstance.Session.Tensor t = session.getInput(name);
            if (t == null) throw new IllegalArgumentException("the model has no input " + name);
            return t;
        }

        @Override
        public synchronized Map<String, Tensor> run(Map<String, Tensor> inputs, List<String> outputs) {
            if (closed) throw new IllegalStateException("session closed");
            for (Map.Entry<String, Tensor> e : inputs.entrySet()) input(e.getKey()).reshape(e.getValue().shape);
            session.reshape(); // after every input's reshape, as MNN asks
            for (Map.Entry<String, Tensor> e : inputs.entrySet()) {
                Tensor t = e.getValue();
                MNNNetInstance.Session.Tensor in = input(e.getKey());
                if (t.dtype.startsWith("int")) {
                    // MNN takes int64 graph inputs (token ids, a sample rate) as int32.
                    float[] values = t.toFloats();
                    int[] ints = new int[values.length];
                    for (int i = 0; i < values.length; i++) ints[i] = (int) values[i];
                    in.setInputIntData(ints);
                } else {
                    in.setInputFloatData(t.toFloats());
                }
            }
            session.run();
            Map<String, Tensor> result = new LinkedHashMap<String, Tensor>();
            for (String name : outputs) {
                MNNNetInstance.Session.Tensor out = session.getOutput(name);
                if (out == null) throw new IllegalArgumentException("the model has no output " + name);
                // C order in the model's own layout (NCHW): the probe compares element by element.
                result.put(name, Tensor.ofFloats(out.getDimensions(), out.getFloatData()));
            }
            return result;
        }

        @Override
        public synchronized int[] inputShape(String name) {
            MNNNetInstance.Session.Tensor t = closed ? null : session.getInput(name);
            return t == null ? null : t.getDimensions();
        }

        @Override
        public synchronized void close() {
            if (closed) return;
            closed = true;
            session.release();
            net.release();
        }
    }
}
