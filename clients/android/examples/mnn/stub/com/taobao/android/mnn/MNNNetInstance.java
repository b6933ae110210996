package com.taobao.android.mnn;

/**
 * COMPILE-ONLY STUB of MNN's Android Java wrapper (see MNNForwardType): the public signatures of
 * com.taobao.android.mnn.MNNNetInstance and its inner Session and Tensor classes, every body
 * refusing to run. On a device the app links MNN's own class, a JNI wrapper over
 * MNN::Interpreter (createFromFile, createSession, resizeTensor, runSession, getSessionOutput).
 */
public class MNNNetInstance {
    private static UnsupportedOperationException stub() {
        return new UnsupportedOperationException("compile-only stub of MNN's Android wrapper: link MNN's own classes");
    }

    public static MNNNetInstance createFromFile(String fileName) {
        throw stub();
    }

    public static MNNNetInstance createFromBuffer(byte[] buffer) {
        throw stub();
    }

    public static class Config {
        public int forwardType = MNNForwardType.FORWARD_CPU.type;
        public int numThread = 4;
        public String[] saveTensors = null;
        public String[] outputTensors = null;
    }

    public class Session {
        public class Tensor {
            public void reshape(int[] dims) {
                throw stub();
            }

            public void setInputIntData(int[] data) {
                throw stub();
            }

            public void setInputFloatData(float[] data) {
                throw stub();
            }

            public int[] getDimensions() {
                throw stub();
            }

            public float[] getFloatData() {
                throw stub();
            }

            public int[] getIntData() {
                throw stub();
            }

            public byte[] getUINT8Data() {
                throw stub();
            }
        }

        public void reshape() {
            throw stub();
        }

        public void run() {
            throw stub();
        }

        public Tensor[] runWithCallback(String[] names) {
            throw stub();
        }

        public Tensor getInput(String name) {
            throw stub();
        }

        public Tensor getOutput(String name) {
            throw stub();
        }

        public void release() {
            throw stub();
        }
    }

    public Session createSession(Config config) {
        throw stub();
    }

    public void release() {
        throw stub();
    }
}
