package com.taobao.android.mnn;

/**
 * COMPILE-ONLY STUB of MNN's Android Java wrapper (MNN's project/android demo,
 * com.taobao.android.mnn): the same names and signatures, so the runner in ../java compiles
 * here, where there is no Android SDK and no MNN Android build. Never packed, never run: the
 * app links MNN's own classes and libMNN.so.
 */
public enum MNNForwardType {
    FORWARD_CPU(0),
    FORWARD_OPENCL(3),
    FORWARD_AUTO(4),
    FORWARD_OPENGL(6),
    FORWARD_VULKAN(7);

    public int type;

    MNNForwardType(int t) {
        type = t;
    }
}
