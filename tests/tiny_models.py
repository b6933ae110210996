"""Tiny, real ONNX models built with ``onnx.helper`` for fast toolchain tests.

Every builder writes one model to ``path`` and returns ``path``. Weights come
from a seeded generator, so the same call always writes the same bytes. The
models are small enough that converting, quantizing and running one takes a
fraction of a second, yet they exercise the real MNN converter, quantizer and
runtime and ONNX Runtime: a convolution stack with BatchNorm, a model with two
non-image inputs, a model with an operator the MNN converter cannot handle, and
a model with a dead layer that trips the quantizer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Opset and IR version every model here is written with: old enough for any
#: MNN converter and ONNX Runtime in use, new enough for every op we use.
OPSET = 17
IR_VERSION = 8

#: Name of the unsupported operator used by :func:`unsupported_op_model`.
UNSUPPORTED_OP = "Hardmax"

#: Input and output names, shared with the tests that feed these models.
CONV_INPUT = "image"
CONV_OUTPUT = "logits"
CONV_CLASSES = 4
CONV_SHAPE = (3, 8, 8)
CONV_CHANNELS = 16
TWO_INPUT_NAMES = ("a", "b")
TWO_INPUT_WIDTHS = (8, 4)
TWO_INPUT_OUTPUT = "y"


def _save(model: onnx.ModelProto, path: Path | str) -> Path:
    onnx.checker.check_model(model, full_check=True)
    out = Path(path)
    onnx.save(model, out)
    return out


def _batch(batch_dynamic: bool) -> str | int:
    return "N" if batch_dynamic else 1


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="edgereg-tests",
    )
    model.ir_version = IR_VERSION
    return model


def conv_classifier(path: Path | str, *, batch_dynamic: bool = True, seed: int = 0) -> Path:
    """Write a tiny image classifier.

    Conv, BatchNorm, Relu, Conv, Relu, GlobalAveragePool, Flatten, Gemm. The
    second convolution holds most of the ~11 KB of weights, enough for weight
    quantization to shrink the converted file visibly.

    Args:
        path: Where to write the ``.onnx`` file.
        batch_dynamic: Give the input and output a symbolic batch dimension
            ``N``; otherwise the batch is fixed at 1.
        seed: Seed of the weight generator.

    Returns:
        ``path`` as a :class:`~pathlib.Path`. Input ``image`` is float32
        ``(N, 3, 8, 8)``; output ``logits`` is float32 ``(N, 4)``.
    """
    rng = np.random.default_rng(seed)
    channels = CONV_CHANNELS
    in_channels = CONV_SHAPE[0]

    def tensor(name: str, array: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(array.astype(np.float32), name)

    inits = [
        tensor("conv1_w", rng.normal(0, 0.4, (channels, in_channels, 3, 3))),
        tensor("conv1_b", rng.normal(0, 0.1, channels)),
        tensor("bn_scale", rng.uniform(0.5, 1.5, channels)),
        tensor("bn_bias", rng.normal(0, 0.1, channels)),
        tensor("bn_mean", rng.normal(0, 0.1, channels)),
        tensor("bn_var", rng.uniform(0.5, 1.5, channels)),
        tensor("conv2_w", rng.normal(0, 0.15, (channels, channels, 3, 3))),
        tensor("conv2_b", rng.normal(0, 0.1, channels)),
        tensor("fc_w", rng.normal(0, 0.5, (CONV_CLASSES, channels))),
        tensor("fc_b", rng.normal(0, 0.1, CONV_CLASSES)),
    ]
    nodes = [
        helper.make_node(
            "Conv", [CONV_INPUT, "conv1_w", "conv1_b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "BatchNormalization",
            ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
            ["bn"],
            name="bn",
        ),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu1"),
        helper.make_node(
            "Conv", ["r1", "conv2_w", "conv2_b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], [CONV_OUTPUT], name="fc", transB=1),
    ]
    batch = _batch(batch_dynamic)
    graph = helper.make_graph(
        nodes,
        "conv_classifier",
        [helper.make_tensor_value_info(CONV_INPUT, TensorProto.FLOAT, [batch, *CONV_SHAPE])],
        [helper.make_tensor_value_info(CONV_OUTPUT, TensorProto.FLOAT, [batch, CONV_CLASSES])],
        inits,
    )
    return _save(_model(graph), path)


def two_input_model(path: Path | str, *, seed: int = 1) -> Path:
    """Write a model with two non-image inputs: Concat, then Gemm, then Relu.

    Args:
        path: Where to write the ``.onnx`` file.
        seed: Seed of the weight generator.

    Returns:
        ``path`` as a :class:`~pathlib.Path`. Inputs ``a`` float32 ``(N, 8)``
        and ``b`` float32 ``(N, 4)``; output ``y`` float32 ``(N, 6)``.
    """
    rng = np.random.default_rng(seed)
    width = sum(TWO_INPUT_WIDTHS)
    out = 6
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (out, width)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(0, 0.1, out).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("Concat", list(TWO_INPUT_NAMES), ["ab"], name="concat", axis=1),
        helper.make_node("Gemm", ["ab", "w", "bias"], ["fc"], name="fc", transB=1),
        helper.make_node("Relu", ["fc"], [TWO_INPUT_OUTPUT], name="relu"),
    ]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", w])
        for name, w in zip(TWO_INPUT_NAMES, TWO_INPUT_WIDTHS, strict=True)
    ]
    graph = helper.make_graph(
        nodes,
        "two_input_model",
        inputs,
        [helper.make_tensor_value_info(TWO_INPUT_OUTPUT, TensorProto.FLOAT, ["N", out])],
        inits,
    )
    return _save(_model(graph), path)


def unsupported_op_model(path: Path | str) -> Path:
    """Write a valid ONNX model that the MNN converter cannot convert.

    It applies :data:`UNSUPPORTED_OP` (``Hardmax``, a plain float operator
    that ONNX Runtime runs but MNN 3.6.1 does not list under ``--OP``) after a
    Relu.

    Args:
        path: Where to write the ``.onnx`` file.

    Returns:
        ``path``; input ``x`` float32 ``(N, 5)``, output ``y`` float32 ``(N, 5)``.
    """
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node(UNSUPPORTED_OP, ["r"], ["y"], name="hardmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "unsupported_op_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
    )
    return _save(_model(graph), path)


def dead_layer_model(path: Path | str, *, seed: int = 2) -> Path:
    """Write a model with a "dead" layer whose output is always zero.

    A Gemm with all-zero weights and bias feeds a normal Gemm. Float
    inference is fine, but the activation range of the dead layer is zero,
    which MNN 3.6.1's EMA quantizer turns into NaN outputs (0/0 scale).

    Args:
        path: Where to write the ``.onnx`` file.
        seed: Seed of the generator for the live layer's weights.

    Returns:
        ``path``; input ``x`` float32 ``(N, 8)``, output ``y`` float32 ``(N, 4)``.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(np.zeros((8, 8), np.float32), "dead_w"),
        numpy_helper.from_array(np.zeros(8, np.float32), "dead_b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 8)).astype(np.float32), "live_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "live_b"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "dead_w", "dead_b"], ["dead"], name="dead", transB=1),
        helper.make_node("Gemm", ["dead", "live_w", "live_b"], ["y"], name="live", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "dead_layer_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    return _save(_model(graph), path)


def corrupt_file(path: Path | str) -> Path:
    """Write a file named like a model that is not a valid ONNX protobuf.

    Args:
        path: Where to write the file.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    out = Path(path)
    out.write_bytes(b"\x08\x07this is not an onnx model\xff\xfe" * 4)
    return out


#: The streaming model's input, state and outputs (shaped like Silero VAD's).
STREAM_CHUNK = 8
STREAM_STATE_SHAPE = (2, 1, 4)


def streaming_model(path: Path | str, *, seed: int = 3, dynamic: bool = False) -> Path:
    """Write a recurrent model with state in and out, and an int64 scalar input.

    ``state_out = tanh(state @ U + (chunk * sr / 16000) @ W)``; ``prob =
    sigmoid(mean over the layers of state_out @ V)``. The state's first axis is
    the layer, not a batch (batch axis 1), like Silero VAD's ``[2, 1, 128]``.

    Returns:
        ``path``; inputs ``chunk`` float32 ``(1, 8)``, ``sr`` int64 ``()``,
        ``state`` float32 ``(2, 1, 4)``; outputs ``prob`` float32 ``(1, 1)`` and
        ``state_out`` float32 ``(2, 1, 4)``. ``dynamic``: the state's batch
        axis is declared dynamic (``dim_param``, as Silero VAD's ``[2, -1,
        128]``), and ``prob``'s first axis is -1 (as Paddle's exporter writes it)
        and ``state_out``'s batch axis is left unset.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.6, (STREAM_CHUNK, 4)).astype(np.float32), "W"),
        numpy_helper.from_array((rng.normal(0, 0.6, (4, 4))).astype(np.float32), "U"),
        numpy_helper.from_array(rng.normal(0, 1.5, (4, 1)).astype(np.float32), "V"),
        numpy_helper.from_array(np.array(16000.0, np.float32), "rate"),
    ]
    nodes = [
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["srf", "rate"], ["scale"]),
        helper.make_node("Mul", ["chunk", "scale"], ["scaled"]),
        helper.make_node("MatMul", ["scaled", "W"], ["drive"], name="drive"),
        helper.make_node("MatMul", ["state", "U"], ["carry"], name="carry"),
        helper.make_node("Add", ["carry", "drive"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["state_out"]),
        helper.make_node("ReduceMean", ["state_out"], ["pooled"], axes=[0], keepdims=0),
        helper.make_node("MatMul", ["pooled", "V"], ["score"], name="head"),
        helper.make_node("Sigmoid", ["score"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes,
        "streaming_model",
        [
            helper.make_tensor_value_info("chunk", TensorProto.FLOAT, [1, STREAM_CHUNK]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info(
                "state", TensorProto.FLOAT, [2, "batch", 4] if dynamic else list(STREAM_STATE_SHAPE)
            ),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, [-1 if dynamic else 1, 1]),
            helper.make_tensor_value_info(
                "state_out",
                TensorProto.FLOAT,
                [2, None, 4] if dynamic else list(STREAM_STATE_SHAPE),
            ),
        ],
        inits,
    )
    return _save(_model(graph), path)


TOKEN_LENGTH = 6
TOKEN_VOCAB = 40
EMBEDDING_WIDTH = 8


def token_embedding_model(path: Path | str, *, seed: int = 4) -> Path:
    """Write a sentence-embedding model over int64 token ids and an attention mask.

    Token embedding (Gather), masked mean pool, a projection, L2 normalisation.

    Returns:
        ``path``; inputs ``input_ids`` and ``attention_mask`` int64 ``(N, 6)``;
        output ``embedding`` float32 ``(N, 8)``.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (TOKEN_VOCAB, 16)).astype(np.float32), "table"),
        numpy_helper.from_array(
            rng.normal(0, 0.5, (16, EMBEDDING_WIDTH)).astype(np.float32), "proj"
        ),
        numpy_helper.from_array(np.array([2], np.int64), "last"),
        numpy_helper.from_array(np.array([1], np.int64), "time"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"], axis=0),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "time"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "time"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "proj"], ["projected"], name="proj"),
        helper.make_node("LpNormalization", ["projected"], ["embedding"], axis=1, p=2),
    ]
    graph = helper.make_graph(
        nodes,
        "token_embedding_model",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", TOKEN_LENGTH]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", TOKEN_LENGTH]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", EMBEDDING_WIDTH])],
        inits,
    )
    return _save(_model(graph), path)


MAP_SIZE = 8


def dense_map_model(path: Path | str, *, seed: int = 5) -> Path:
    """Write a probability-map model: two 3x3 convolutions, then a sigmoid.

    Returns:
        ``path``; input ``image`` float32 ``(N, 1, 8, 8)``, output ``prob`` float32
        ``(N, 1, 8, 8)``.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 1, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (1, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.zeros(1, np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
        helper.make_node("Sigmoid", ["c2"], ["prob"]),
    ]
    size = [MAP_SIZE, MAP_SIZE]
    graph = helper.make_graph(
        nodes,
        "dense_map_model",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, *size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 1, *size])],
        inits,
    )
    return _save(_model(graph), path)


SEG_SIZE = 16
SEG_CLASSES = 3


def segmentation_model(path: Path | str, *, seed: int = 14) -> Path:
    """Write a semantic segmenter: two 3x3 convolutions scoring 3 classes per pixel.

    Class 2 starts 1.5 lower than the others, so it is the rare (tail) class.

    Returns:
        ``path``; input ``image`` float32 ``(N, 3, 16, 16)``, output ``scores``
        float32 ``(N, 3, 16, 16)``.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(
            rng.normal(0, 0.5, (SEG_CLASSES, 8, 3, 3)).astype(np.float32), "w2"
        ),
        numpy_helper.from_array(np.array([0.0, 0.0, -1.5], np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["scores"], name="head", pads=[1] * 4),
    ]
    size = [SEG_SIZE, SEG_SIZE]
    graph = helper.make_graph(
        nodes,
        "segmentation_model",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, *size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", SEG_CLASSES, *size])],
        inits,
    )
    return _save(_model(graph), path)


CTC_STEPS = 10
CTC_FEATURES = 6
CTC_CHARSET = ("a", "b", "c")


def ctc_model(path: Path | str, *, seed: int = 6) -> Path:
    """Write a per-timestep classifier for CTC: a projection of each step's features.

    Returns:
        ``path``; input ``features`` float32 ``(N, 10, 6)``, output ``logits`` float32
        ``(N, 10, 4)`` (class 0 is the CTC blank, then the three characters).
    """
    rng = np.random.default_rng(seed)
    classes = len(CTC_CHARSET) + 1
    inits = [
        numpy_helper.from_array(
            rng.normal(0, 1.0, (CTC_FEATURES, classes)).astype(np.float32), "w"
        ),
    ]
    nodes = [helper.make_node("MatMul", ["features", "w"], ["logits"], name="proj")]
    graph = helper.make_graph(
        nodes,
        "ctc_model",
        [
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["N", CTC_STEPS, CTC_FEATURES]
            )
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CTC_STEPS, classes])],
        inits,
    )
    return _save(_model(graph), path)


#: The context-needing VAD (:func:`context_vad_model`): Silero VAD v5's shapes at
#: 16 kHz. Each step reads 64 samples of the previous chunk, then 512 new ones.
VAD_CONTEXT = 64
VAD_NEW = 512
VAD_WINDOW = VAD_CONTEXT + VAD_NEW
VAD_HIDDEN = 128
VAD_STATE_SHAPE = (2, 1, VAD_HIDDEN)


def context_vad_model(path: Path | str, *, seed: int = 7) -> Path:
    """Write a voice-activity detector shaped like Silero VAD v5, context and all.

    Inputs as Silero's ONNX declares them: ``chunk`` float32 ``["batch",
    "samples"]``, ``sr`` int64 ``[]``, ``state`` float32 ``[2, "batch", 128]``;
    outputs ``prob`` float32 ``[-1, 1]`` and ``stateN`` float32 ``[2, None,
    128]`` (the three ways real files write a dynamic axis).

    The score is the chunk's log energy pushed through a recurrent state:
    ``stateN = tanh(state @ U + log_energy * w + b)``, ``prob = sigmoid(mean(stateN)
    @ v + window)``. Like Silero's learned front end, whose weights fit one
    window, it is only meaningful at 576 samples: ``window`` is ``-0.5 * |samples
    - 576|``, so fed 512 bare samples (no context) the graph still runs and its
    probability never comes near 0.5 (the walk-through's failure, in miniature).
    A chunk whose samples have RMS above ~0.1 (at 16 kHz) reads as speech.
    """
    rng = np.random.default_rng(seed)
    hidden = VAD_HIDDEN
    drive = np.abs(rng.normal(1.0, 0.2, (1, hidden))).astype(np.float32)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.05, (hidden, hidden)).astype(np.float32), "U"),
        numpy_helper.from_array(drive, "w"),
        numpy_helper.from_array(np.full(hidden, 4.6, np.float32) * drive[0], "b"),
        numpy_helper.from_array(np.full((hidden, 1), 6.0 / hidden, np.float32), "v"),
        numpy_helper.from_array(np.array(16000.0, np.float32), "rate"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array([1], np.int64), "samples_axis"),
        numpy_helper.from_array(np.array(float(VAD_WINDOW), np.float32), "window_len"),
        numpy_helper.from_array(np.array(-0.5, np.float32), "off_window"),
    ]
    nodes = [
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["srf", "rate"], ["scale"]),
        helper.make_node("Mul", ["chunk", "scale"], ["scaled"]),
        helper.make_node("Mul", ["scaled", "scaled"], ["power"]),
        helper.make_node("ReduceMean", ["power"], ["energy"], axes=[1], keepdims=1),
        helper.make_node("Add", ["energy", "eps"], ["energy_eps"]),
        helper.make_node("Log", ["energy_eps"], ["log_energy"]),
        helper.make_node("MatMul", ["log_energy", "w"], ["driven"], name="drive"),
        helper.make_node("Add", ["driven", "b"], ["biased"]),
        helper.make_node("MatMul", ["state", "U"], ["carry"], name="carry"),
        helper.make_node("Add", ["carry", "biased"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["stateN"]),
        helper.make_node("ReduceMean", ["stateN"], ["pooled"], axes=[0], keepdims=0),
        helper.make_node("MatMul", ["pooled", "v"], ["score"], name="head"),
        helper.make_node("Shape", ["chunk"], ["chunk_shape"]),
        helper.make_node("Gather", ["chunk_shape", "samples_axis"], ["length"], axis=0),
        helper.make_node("Cast", ["length"], ["lengthf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["lengthf", "window_len"], ["off"]),
        helper.make_node("Abs", ["off"], ["off_abs"]),
        helper.make_node("Mul", ["off_abs", "off_window"], ["window"]),
        helper.make_node("Add", ["score", "window"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes,
        "context_vad_model",
        [
            helper.make_tensor_value_info("chunk", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", hidden]),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, [-1, 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, None, hidden]),
        ],
        inits,
    )
    return _save(_model(graph), path)


def vad_recordings(
    recordings: int, chunks: int, *, context: int = VAD_CONTEXT, new: int = VAD_NEW, seed: int = 8
) -> dict[str, np.ndarray]:
    """Synthetic 16 kHz recordings cut into the rows an app feeds a VAD.

    Each recording alternates silence (noise at RMS 0.01) and speech-like
    stretches (a voiced tone at RMS ~0.3) of a few chunks each. Every row is
    the last ``context`` samples of the previous chunk (zeros at a recording's
    start) followed by ``new`` new ones: Silero v5 at 16 kHz reads 64 + 512;
    ``context=0`` gives the bare chunks.

    Returns:
        ``chunk`` float32 (N, context + new), ``sr`` int64 (N,), ``sequences``
        int64 (N,), ``labels`` int64 (N,) 0/1 per chunk.
    """
    rng = np.random.default_rng(seed)
    rows, labels, sequences = [], [], []
    t = np.arange(new) / 16000.0
    for rec in range(recordings):
        previous = np.zeros(new, np.float32)
        speech = bool(rng.integers(0, 2))
        left = int(rng.integers(1, 4))
        for _ in range(chunks):
            if left == 0:
                speech, left = not speech, int(rng.integers(1, 4))
            left -= 1
            noise = rng.normal(0, 0.01, new)
            tone = 0.42 * np.sin(2 * np.pi * rng.uniform(120, 300) * t) if speech else 0.0
            samples = (noise + tone).astype(np.float32)
            rows.append(np.concatenate([previous[len(previous) - context :], samples]))
            previous = samples
            labels.append(int(speech))
            sequences.append(rec)
    count = len(rows)
    return {
        "chunk": np.stack(rows).astype(np.float32),
        "sr": np.full(count, 16000, np.int64),
        "sequences": np.asarray(sequences, np.int64),
        "labels": np.asarray(labels, np.int64),
    }


#: The text-line recogniser (:func:`ctc_recogniser_model`): per-step class
#: probabilities over a blank and a 40-character alphabet, as PaddleOCR's ends.
REC_STEPS = 24
REC_FEATURES = 16
REC_CLASSES = 41


def _rec_codes(seed: int) -> np.ndarray:
    codes = np.random.default_rng(seed).normal(0, 1, (REC_CLASSES, REC_FEATURES))
    return (codes / np.linalg.norm(codes, axis=1, keepdims=True)).astype(np.float32)


def ctc_recogniser_model(path: Path | str, *, seed: int = 10, gain: float = 6.0) -> Path:
    """Write a CTC text-line recogniser ending in a softmax per step.

    A 1-D convolution over the steps (the centre tap passes each step's
    features on as their positive and negative parts, the side taps add a
    little of the neighbours), a projection onto one code per class, and a
    softmax: ``features`` float32 ``(N, 24, 16)`` -> ``probs`` float32 ``(N, 24,
    41)`` (class 0 the blank). :func:`ctc_lines` writes features it reads.
    """
    rng = np.random.default_rng(seed)
    codes = _rec_codes(seed)
    eye = np.eye(REC_FEATURES, dtype=np.float32)
    conv = rng.normal(0, 0.03, (2 * REC_FEATURES, REC_FEATURES, 3)).astype(np.float32)
    conv[:, :, 1] = np.concatenate([eye, -eye])
    proj = gain * np.concatenate([codes.T, -codes.T])
    inits = [
        numpy_helper.from_array(conv, "conv_w"),
        numpy_helper.from_array(np.zeros(2 * REC_FEATURES, np.float32), "conv_b"),
        numpy_helper.from_array(proj.astype(np.float32), "proj"),
    ]
    nodes = [
        helper.make_node("Transpose", ["features"], ["channels"], perm=[0, 2, 1]),
        helper.make_node(
            "Conv", ["channels", "conv_w", "conv_b"], ["conv"], name="conv", pads=[1, 1]
        ),
        helper.make_node("Relu", ["conv"], ["act"]),
        helper.make_node("Transpose", ["act"], ["steps"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["steps", "proj"], ["logits"], name="proj"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    steps = ["N", REC_STEPS]
    graph = helper.make_graph(
        nodes,
        "ctc_recogniser_model",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [*steps, REC_FEATURES])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [*steps, REC_CLASSES])],
        inits,
    )
    return _save(_model(graph), path)


def ctc_lines(count: int, *, noise: float, seed: int = 11, model_seed: int = 10) -> np.ndarray:
    """Features of ``count`` text lines for :func:`ctc_recogniser_model`.

    Each step is the code of its class (the blank on about half the steps)
    plus Gaussian noise: at ``noise`` 0.1 the lines are clean and every class
    wins by a wide margin; near 0.5 they are hard, many steps are close calls.

    Returns:
        float32 ``(count, 24, 16)``.
    """
    rng = np.random.default_rng(seed)
    codes = _rec_codes(model_seed)
    classes = np.where(
        rng.random((count, REC_STEPS)) < 0.5, 0, rng.integers(1, REC_CLASSES, (count, REC_STEPS))
    )
    features = codes[classes] + rng.normal(0, noise, (count, REC_STEPS, REC_FEATURES))
    return features.astype(np.float32)


DEEP_WIDTH = 16
DEEP_SIZE = 4
DEEP_LAYERS = 12


def deep_conv_model(path: Path | str, *, seed: int = 12) -> Path:
    """Write a stack of 12 alike 1x1 convolutions with ReLU: int8 error spread over all.

    Keeping a few layers in float removes only their share of the error, so
    an agreement budget far above what int8 reaches stays out of reach.

    Returns:
        ``path``; input ``x`` float32 ``(N, 16, 4, 4)``, output ``y`` float32
        ``(N, 16, 4, 4)``.
    """
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    previous = "x"
    for layer in range(DEEP_LAYERS):
        weight = rng.normal(0, 0.5 / np.sqrt(DEEP_WIDTH), (DEEP_WIDTH, DEEP_WIDTH)) + np.eye(
            DEEP_WIDTH
        )
        inits.append(
            numpy_helper.from_array(
                weight.reshape(DEEP_WIDTH, DEEP_WIDTH, 1, 1).astype(np.float32), f"w{layer}"
            )
        )
        nodes.append(
            helper.make_node("Conv", [previous, f"w{layer}"], [f"c{layer}"], name=f"conv{layer}")
        )
        nodes.append(helper.make_node("Relu", [f"c{layer}"], [f"h{layer}"]))
        previous = f"h{layer}"
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    shape = ["N", DEEP_WIDTH, DEEP_SIZE, DEEP_SIZE]
    graph = helper.make_graph(
        nodes,
        "deep_conv_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return _save(_model(graph), path)


WIDE_INPUTS = 256
WIDE_HIDDEN = 256
#: 128 blocks of 8 channels and a tail of 2: MNN 3.6.1's i8mm int8 kernel computes
#: the tail (channels 1024 and 1025) wrong. Two wrong channels among 1026 keep the
#: whole output within int8's default gates (cosine 0.989, SNR 16.6 dB measured).
WIDE_OUTPUTS = 1026


def wide_head_model(path: Path | str, *, seed: int = 13) -> Path:
    """Write an MLP, 256 inputs -> 256 hidden (ReLU) -> 1026 outputs (Gemm, Relu, Gemm).

    Returns:
        ``path``; input ``x`` float32 ``(1, 256)``, output ``logits`` float32 ``(1, 1026)``.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1, (WIDE_INPUTS, WIDE_HIDDEN)) / np.sqrt(WIDE_INPUTS)
    b1 = rng.normal(0, 0.1, WIDE_HIDDEN)
    w2 = rng.normal(0, 1, (WIDE_HIDDEN, WIDE_OUTPUTS)) * 3 / np.sqrt(WIDE_HIDDEN)
    inits = [
        numpy_helper.from_array(array.astype(np.float32), name)
        for name, array in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", np.zeros(WIDE_OUTPUTS)))
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "wide_head_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDE_INPUTS])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, WIDE_OUTPUTS])],
        inits,
    )
    return _save(_model(graph), path)


TAGGER_STEPS = 16
TAGGER_FEATURES = 8
TAGGER_HIDDEN = 16
TAGGER_CLASSES = 6


def lstm_tagger_model(path: Path | str, *, seed: int = 14) -> Path:
    """Write a bidirectional-LSTM tagger: per step of a sequence, the logits of 6 tags.

    MNN's converter turns the LSTM into a ``While`` subgraph: the artifact runs
    through MNN's Module API, not its session API.

    Returns:
        ``path``; input ``x`` float32 ``(16, 1, 8)`` (steps, batch, features),
        output ``tags`` float32 ``(16, 1, 6)``.
    """
    rng = np.random.default_rng(seed)
    hidden, features = TAGGER_HIDDEN, TAGGER_FEATURES
    w = rng.normal(0, 0.5, (2, 4 * hidden, features)) / np.sqrt(features)
    r = rng.normal(0, 0.5, (2, 4 * hidden, hidden)) / np.sqrt(hidden)
    b = rng.normal(0, 0.1, (2, 8 * hidden))
    head = rng.normal(0, 1, (2 * hidden, TAGGER_CLASSES)) / np.sqrt(2 * hidden)
    inits = [
        numpy_helper.from_array(array.astype(np.float32), name)
        for name, array in (("W", w), ("R", r), ("B", b), ("head", head))
    ]
    inits.append(numpy_helper.from_array(np.array([TAGGER_STEPS, 1, -1], np.int64), "shape"))
    nodes = [
        # All three outputs named, as exporters write them (MNN 3.6.1's converter
        # crashes on an LSTM that names only Y).
        helper.make_node(
            "LSTM",
            ["x", "W", "R", "B"],
            ["y", "y_h", "y_c"],
            hidden_size=hidden,
            direction="bidirectional",
        ),
        # (steps, 2, 1, hidden) -> (steps, 1, 2, hidden) -> (steps, 1, 2 * hidden)
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["yt", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "head"], ["tags"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lstm_tagger_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [TAGGER_STEPS, 1, features])],
        [
            helper.make_tensor_value_info(
                "tags", TensorProto.FLOAT, [TAGGER_STEPS, 1, TAGGER_CLASSES]
            )
        ],
        inits,
    )
    return _save(_model(graph), path)


#: A segmentation-sized input: one float sample is 12 MiB, its probe 16.8 MB in base64.
LARGE_SIZE = 1024


def large_input_segmenter(path: Path | str, *, seed: int = 15) -> Path:
    """Write a two-layer segmenter over a 1x3x1024x1024 image: 2 classes at half resolution.

    Returns:
        ``path``; input ``image`` float32 ``(1, 3, 1024, 1024)``, output ``mask`` float32
        ``(1, 2, 512, 512)``.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (2, 8, 1, 1)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["mask"]),
    ]
    half = LARGE_SIZE // 2
    graph = helper.make_graph(
        nodes,
        "large_input_segmenter",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, LARGE_SIZE, LARGE_SIZE])],
        [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 2, half, half])],
        inits,
    )
    return _save(_model(graph), path)
