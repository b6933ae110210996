package dev.edgereg;

import javax.annotation.Nonnull;

/** A tensor as the self-test passes it: element type, shape, little-endian bytes in C order. */
public final class Tensor {
    /** {@code float32}, {@code float16}, {@code int8}, {@code uint8}, {@code int32}, {@code int64} or {@code bool}. */
    @Nonnull public final String dtype;
    @Nonnull public final int[] shape;
    @Nonnull public final byte[] data;

    public Tensor(@Nonnull String dtype, @Nonnull int[] shape, @Nonnull byte[] data) {
        this.dtype = dtype;
        this.shape = shape.clone();
        this.data = data;
    }

    /** A float32 tensor from floats. */
    @Nonnull
    public static Tensor ofFloats(@Nonnull int[] shape, @Nonnull float[] values) {
        java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(values.length * 4).order(java.nio.ByteOrder.LITTLE_ENDIAN);
        for (float v : values) b.putFloat(v);
        return new Tensor("float32", shape, b.array());
    }

    /** The elements as floats (any dtype), C order. */
    @Nonnull
    public float[] toFloats() {
        double[] d = dev.edgereg.internal.Probe.decode(dtype, data);
        float[] out = new float[d.length];
        for (int i = 0; i < d.length; i++) out[i] = (float) d[i];
        return out;
    }
}
