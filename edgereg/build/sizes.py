"""What an artifact's bytes are, and what to do when one tensor holds most of them.

A model "compressed to 30 MB" that stays at 80 MB usually holds one tensor the
compression never touched: MNN's weight-only quantization quantizes
convolution and matmul weights, not a ``Gather``'s embedding table. The size
stage lists the largest ops of the ``.mnn`` by the bytes they own
(:func:`edgereg.toolchain.mnnsize.op_bytes`), weights against everything
else, maps them to the ONNX source's tensors and ops, and when one holds more
than :data:`DOMINANT` of the file, says so with the hint the precision allows.
The numbers are the file's bytes: the same on every build (metrics.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgereg.errors import BuildError
from edgereg.toolchain._mnnfile import MnnFormatError
from edgereg.toolchain.mnnsize import WEIGHT_TYPES, OpBytes, op_bytes, op_names
from edgereg.toolchain.onnx_constants import OnnxConstants, onnx_constants

#: One tensor over this share of the file is named, with a hint.
DOMINANT = 1 / 3
#: Ops listed in metrics.json.
LISTED = 8
#: The converter's suffix on a MatMul it turned into a convolution.
_MATMUL_SUFFIX = "__matmul_converted"


def explain_size(
    artifact: Path, source: Path, precision: str, float_artifact: Path | None = None
) -> dict[str, Any]:
    """The ``size`` entry of metrics.json for ``artifact`` built from ``source``.

    Args:
        precision: The variant's precision class (fp32, fp16, weight, int8).
        float_artifact: For int8, the converted model before quantization: the
            quantizer renames layers (``ConvInt87``) but keeps the graph's
            order, so each renamed op is matched to its float op by position,
            and through it to the ONNX node and initializers.

    Raises:
        BuildError: (stage ``size``) the artifact or the source cannot be read.
    """
    data = artifact.read_bytes()
    try:
        ops = op_bytes(data)
        renamed = _float_names(data, float_artifact)
    except MnnFormatError as exc:
        raise BuildError(f"{artifact} is not a readable .mnn file: {exc}", stage="size") from exc
    onnx = onnx_constants(source)
    total = len(data)
    weights = sum(op.size for op in ops if op.op_type in WEIGHT_TYPES)
    largest = [_row(op, total, onnx, renamed.get(op.name)) for op in ops[:LISTED]]
    explained: dict[str, Any] = {
        "artifact_bytes": total,
        "weights_bytes": weights,
        "other_bytes": total - weights,
        "largest": largest,
    }
    # Only when there is one: `dvc metrics show` leaves nulls out.
    if largest and largest[0]["share"] > DOMINANT:
        top = largest[0]
        explained["dominant"] = top["op"]
        explained["note"] = _note(top, precision)
    return explained


def _float_names(data: bytes, float_artifact: Path | None) -> dict[str, str]:
    """Quantized op name -> the float model's name of the same op, where they differ."""
    if float_artifact is None:
        return {}
    quantized = op_names(data)
    original = op_names(float_artifact.read_bytes())
    if [kind for _, kind in quantized] != [kind for _, kind in original]:
        return {}  # not the same graph order: no guessing
    return {q: f for (q, _), (f, _) in zip(quantized, original, strict=True) if q != f}


def _row(
    op: OpBytes, total: int, onnx: OnnxConstants, float_name: str | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "op": op.name,
        "type": op.op_type,
        "bytes": op.size,
        "share": round(op.size / total, 4) if total else 0.0,
        "weights": op.op_type in WEIGHT_TYPES,
    }
    if float_name is not None:
        row["float_op"] = float_name  # the quantizer's new name hides the ONNX one
    name = float_name or op.name
    constant = onnx.constants.get(name)
    if constant is not None:
        if "Gather" in constant.used_by:
            row["kind"] = "embedding table"
        row["onnx"] = {
            "initializer": constant.name,
            "shape": list(constant.shape),
            "bytes": constant.nbytes,
            "used_by": list(constant.used_by),
        }
    else:
        node = name.removesuffix(_MATMUL_SUFFIX)
        producer = onnx.producers.get(node)
        if producer is not None:
            row["onnx"] = {"op_type": producer}
            # The initializers the op's bytes come from (a Conv's weight and bias).
            named = [onnx.constants[name] for name in onnx.weights.get(node, ())]
            if named:
                row["onnx"]["initializers"] = [
                    {"name": c.name, "shape": list(c.shape), "bytes": c.nbytes} for c in named
                ]
    return row


def _note(top: dict[str, Any], precision: str) -> str:
    share = f"{top['share'] * 100:.0f} %"
    onnx = top.get("onnx") or {}
    used_by = onnx.get("used_by") or []
    table = "Gather" in used_by
    shape = onnx.get("shape")
    initializers = onnx.get("initializers") or []
    if table:
        what = f"the embedding table '{top['op']}' {shape}"
    elif initializers:
        # The ONNX tensor the bytes come from, which a renamed int8 layer no longer shows.
        weight = initializers[0]
        what = (
            f"'{top['op']}' ({top['type']}: ONNX initializer '{weight['name']}' {weight['shape']})"
        )
    else:
        what = f"'{top['op']}' ({top['type']})"
    head = f"{what} holds {share} of the artifact ({top['bytes']} of its bytes)"
    if table:
        rows = f" (it has {shape[0]} rows)" if shape else ""
        if precision in ("fp32", "weight"):
            fix = (
                "MNN's weight-only quantization quantizes convolution and matmul weights, "
                'not this table: precision = "fp16" halves it, or prune the vocabulary'
                f"{rows} to the tokens the app uses"
            )
        else:
            fix = f"prune the vocabulary{rows} to the tokens the app uses"
    elif precision in ("fp32", "fp16"):
        fix = 'weight-only quantization (mode = "weight", bits = 8) stores it in a quarter'
    elif precision == "weight":
        fix = "fewer bits (bits = 4) or a smaller layer (a classifier head over fewer classes)"
    else:
        fix = "a smaller layer (a classifier head over fewer classes, a narrower projection)"
    return f"{head}: {fix}."
