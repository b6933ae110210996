"""What the bytes of an ``.mnn`` file are: per op, read from the FlatBuffer (no MNN import).

A FlatBuffer is built back to front: the converter writes each op's weights,
parameters and name, then the op's table, one op after the other, so in the
file an op's table is followed by what it owns, up to the table of the op
written before it. The bytes from one op table to the next one up are that
op's: its constant tensor (a ``Const``), its weights (a ``Convolution``), or a
few bytes of parameters. What is left (tensor names, the graph's structure)
is the rest of the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgereg.toolchain._mnnfile import MnnFormatError, read_scalar

#: ``table Net`` field index of ``oplists``; ``table Op`` fields ``name`` and
#: ``type`` (the union ``main`` takes two slots).
_NET_OPLISTS = 3
_OP_NAME = 3
_OP_TYPE = 5

#: MNN 3.6.1's ``OpType`` values, as read back from the converter's JSON dump of
#: the example models (only those; others print as their number).
OP_TYPES: dict[int, str] = {
    7: "BinaryOp",
    9: "Cast",
    10: "Concat",
    11: "Const",
    12: "Convolution",
    13: "ConvolutionDepthwise",
    28: "Flatten",
    31: "GatherV2",
    34: "Input",
    35: "Interp",
    39: "MatMul",
    46: "Permute",
    47: "Pooling",
    66: "Rank",
    68: "Reduction",
    70: "ReLU6",
    73: "Reshape",
    80: "Shape",
    83: "Slice",
    84: "SliceTf",
    85: "Softmax",
    90: "Squeeze",
    91: "StridedSlice",
    101: "UnaryOp",
    107: "Unsqueeze",
    112: "Pooling3D",
    129: "ConvertTensor",
    603: "LayerNorm",
}
#: Op types whose bytes are weights or constant tensors.
WEIGHT_TYPES = frozenset({"Const", "Convolution", "ConvolutionDepthwise", "LayerNorm"})


@dataclass(frozen=True)
class OpBytes:
    """The bytes one op owns in the file."""

    name: str
    op_type: str
    size: int


def _u32(data: bytes, pos: int) -> int:
    return read_scalar(data, pos, "<I")


def _i32(data: bytes, pos: int) -> int:
    return read_scalar(data, pos, "<i")


def _u16(data: bytes, pos: int) -> int:
    return read_scalar(data, pos, "<H")


def _field(data: bytes, table: int, index: int) -> int | None:
    vtable = table - _i32(data, table)
    length = _u16(data, vtable)
    slot = 4 + 2 * index
    if slot + 2 > length:
        return None
    offset = _u16(data, vtable + slot)
    return None if offset == 0 else table + offset


def _string(data: bytes, pos: int) -> str:
    start = pos + _u32(data, pos)
    length = _u32(data, start)
    if start + 4 + length > len(data):
        raise MnnFormatError(f"string at {start} runs past the end of the file")
    return data[start + 4 : start + 4 + length].decode("utf-8", "replace")


def op_bytes(data: bytes) -> list[OpBytes]:
    """Every op of the main graph with the bytes it owns, largest first.

    Raises:
        MnnFormatError: the bytes are not an ``.mnn`` FlatBuffer.
    """
    ops = _op_tables(data)
    starts = sorted(table for table, _, _ in ops)
    ends = {
        start: (starts[i + 1] if i + 1 < len(starts) else len(data))
        for i, start in enumerate(starts)
    }
    sized = [OpBytes(name, kind, ends[table] - table) for table, name, kind in ops]
    return sorted(sized, key=lambda op: (-op.size, op.name))


def op_names(data: bytes) -> list[tuple[str, str]]:
    """Every op of the main graph as (name, type), in the graph's order.

    Raises:
        MnnFormatError: the bytes are not an ``.mnn`` FlatBuffer.
    """
    return [(name, kind) for _, name, kind in _op_tables(data)]


def _op_tables(data: bytes) -> list[tuple[int, str, str]]:
    """(table offset, name, type) of every op of the main graph, in the graph's order."""
    if len(data) < 8:
        raise MnnFormatError("too short for an .mnn file")
    root = _u32(data, 0)
    oplists = _field(data, root, _NET_OPLISTS)
    if oplists is None:
        return []
    vector = oplists + _u32(data, oplists)
    count = _u32(data, vector)
    if vector + 4 + 4 * count > len(data):
        raise MnnFormatError("the op list runs past the end of the file")
    ops: list[tuple[int, str, str]] = []
    for index in range(count):
        slot = vector + 4 + 4 * index
        table = slot + _u32(data, slot)
        name_at = _field(data, table, _OP_NAME)
        type_at = _field(data, table, _OP_TYPE)
        kind = 0 if type_at is None else _i32(data, type_at)
        name = "" if name_at is None else _string(data, name_at)
        ops.append((table, name, OP_TYPES.get(kind, f"type {kind}")))
    return ops
