"""The constant tensors of an ONNX model and the ops that use them (to explain sizes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from edgereg.errors import BuildError


@dataclass(frozen=True)
class OnnxConstant:
    """One initializer: its shape, bytes and the op types that read it."""

    name: str
    shape: tuple[int, ...]
    nbytes: int
    used_by: tuple[str, ...]


@dataclass(frozen=True)
class OnnxConstants:
    """Initializers by name, and the op type that produces each node output."""

    constants: dict[str, OnnxConstant] = field(default_factory=dict)
    producers: dict[str, str] = field(default_factory=dict)
    #: Node output (and node name) -> the initializers the node reads (its weights).
    weights: dict[str, tuple[str, ...]] = field(default_factory=dict)


def onnx_constants(path: Path) -> OnnxConstants:
    """Read ``path``'s initializers (external data not loaded) and the ops around them.

    Raises:
        BuildError: (stage ``size``) the file is not a readable ONNX model.
    """
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise BuildError(f"{path} is not a readable ONNX model: {exc}", stage="size") from exc
    graph = model.graph
    users: dict[str, list[str]] = {}
    producers: dict[str, str] = {}
    weights: dict[str, tuple[str, ...]] = {}
    initializers = {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node.op_type)
        read = tuple(name for name in node.input if name in initializers)
        for name in (*node.output, *([node.name] if node.name else [])):
            producers.setdefault(name, node.op_type)
            if read:
                weights.setdefault(name, read)
    constants = {}
    for tensor in graph.initializer:
        shape = tuple(int(d) for d in tensor.dims)
        count = 1
        for dim in shape:
            count *= dim
        try:
            itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            itemsize = 4
        constants[tensor.name] = OnnxConstant(
            tensor.name, shape, count * itemsize, tuple(sorted(set(users.get(tensor.name, []))))
        )
    return OnnxConstants(constants, producers, weights)
