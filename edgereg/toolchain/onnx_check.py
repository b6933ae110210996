"""Checking an ONNX model before conversion: validity, shapes, operators.

The operator pre-check compares the model's operator types with the list the
MNN converter prints for ``-f ONNX --OP``, so an unsupported operator is
reported by name before a conversion that would print ``Converted Failed!``.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from edgereg.errors import BuildError
from edgereg.toolchain._process import run_worker, scratch_dir, tail

#: Stage named in errors raised here.
STAGE = "check"

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output.

    Attributes:
        name: Tensor name.
        shape: One entry per dimension: an int for a fixed size, a string (the
            symbolic name, or ``"?"`` when unnamed, -1, or 0) for a dynamic one.
        dtype: numpy dtype name, such as ``"float32"``.
    """

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def batch_dynamic(self) -> bool:
        """Whether the first dimension is dynamic."""
        return bool(self.shape) and isinstance(self.shape[0], str)


@dataclass(frozen=True)
class OnnxReport:
    """What :func:`inspect_onnx` found in a model.

    Attributes:
        path: The model file.
        ir_version: ONNX IR version.
        opset: Version of the default (``ai.onnx``) operator set.
        opsets: Every imported operator set, domain to version (the default
            domain is ``""``).
        op_counts: Operator type to number of nodes, sorted by type; nodes in
            subgraphs (``If``, ``Loop``) count too.
        inputs: Graph inputs, initializers excluded.
        outputs: Graph outputs.
    """

    path: Path
    ir_version: int
    opset: int
    opsets: dict[str, int]
    op_counts: dict[str, int]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: The model's ``metadata_props`` (class names, preprocessing notes, ...).
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def op_types(self) -> list[str]:
        """Sorted operator types used by the model."""
        return list(self.op_counts)

    @property
    def input_names(self) -> list[str]:
        """Names of the graph inputs, in graph order."""
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """Names of the graph outputs, in graph order."""
        return [t.name for t in self.outputs]

    @property
    def batch_dynamic(self) -> bool:
        """Whether every input has a dynamic first dimension."""
        return bool(self.inputs) and all(t.batch_dynamic for t in self.inputs)


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        # Exporters write a dynamic axis three ways: a dim_param name, -1
        # (Paddle's), or nothing at all (or dim_value 0); every one is dynamic.
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or "?")
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    except KeyError:
        dtype = helper.tensor_dtype_to_string(tensor.elem_type)
    return TensorSpec(name=value.name, shape=tuple(dims), dtype=dtype)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes(sub)


def inspect_onnx(path: Path | str) -> OnnxReport:
    """Validate an ONNX model fully and describe it.

    Args:
        path: The ``.onnx`` file (external data next to it is found).

    Returns:
        The model's versions, operator counts and input/output signatures.

    Raises:
        BuildError: (stage ``check``) The file is missing, is not an ONNX
            protobuf, or fails ``onnx.checker`` with shape inference.
    """
    model_path = Path(path)
    if not model_path.is_file():
        raise BuildError(f"{model_path} does not exist", stage=STAGE, tool="onnx")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise BuildError(
            f"{model_path} is not a valid ONNX model: it cannot be parsed ({exc})",
            stage=STAGE,
            tool="onnx",
            hint="re-export the model, and check the file is not a Git LFS or DVC pointer",
        ) from exc
    try:
        # By path, so models with external data are checked too.
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:
        raise BuildError(
            f"{model_path} is not a valid ONNX model: onnx.checker rejects it",
            stage=STAGE,
            tool="onnx.checker",
            output_tail=tail(str(exc)),
            hint="re-export the model with a supported opset and check it with onnx.checker",
        ) from exc
    opsets = {imp.domain: int(imp.version) for imp in model.opset_import}
    default_opset = opsets.get("", opsets.get("ai.onnx", 0))
    counts = Counter(node.op_type for node in _nodes(model.graph))
    initializers = {init.name for init in model.graph.initializer}
    return OnnxReport(
        path=model_path,
        ir_version=int(model.ir_version),
        opset=default_opset,
        opsets=dict(sorted(opsets.items())),
        op_counts=dict(sorted(counts.items())),
        inputs=tuple(_spec(v) for v in model.graph.input if v.name not in initializers),
        outputs=tuple(_spec(v) for v in model.graph.output),
        metadata={prop.key: prop.value for prop in model.metadata_props},
    )


_HEADER = re.compile(r"^Dump ONNX support Ops\s*$")
_TOTAL = re.compile(r"^Total:\s*(\d+)\s*$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_op_listing(output: str) -> frozenset[str]:
    """Parse the output of ``mnnconvert -f ONNX --OP``.

    The listing is a header line, one operator per line, and ``Total: N``;
    other chatter (the CPU feature line) may come before it.

    Args:
        output: Everything the converter printed.

    Returns:
        The operator names.

    Raises:
        ValueError: No listing was found, or it does not hold ``N`` names.
    """
    lines = [line.strip() for line in output.splitlines()]
    try:
        start = next(i for i, line in enumerate(lines) if _HEADER.fullmatch(line)) + 1
    except StopIteration as exc:
        raise ValueError("no 'Dump ONNX support Ops' header in the converter output") from exc
    ops: set[str] = set()
    for line in lines[start:]:
        total = _TOTAL.fullmatch(line)
        if total:
            if int(total.group(1)) != len(ops):
                raise ValueError(f"listing says Total: {total.group(1)} but holds {len(ops)} ops")
            return frozenset(ops)
        if _OP_NAME.fullmatch(line):
            ops.add(line)
    raise ValueError("the operator listing has no 'Total:' line")


@functools.cache
def supported_onnx_ops(timeout: float = 120.0) -> frozenset[str]:
    """Return the ONNX operator types the installed MNN converter handles.

    Runs the converter once per process (the result is cached).

    Args:
        timeout: Seconds before the listing child is killed.

    Returns:
        Operator type names, such as ``"Conv"``.

    Raises:
        BuildError: (stage ``check``) The converter could not be run or its
            listing could not be read.
    """
    with scratch_dir() as scratch:
        run = run_worker(
            "op_list", {}, scratch=scratch, stage=STAGE, tool="mnnconvert", timeout=timeout
        )
    try:
        return parse_op_listing(run.output)
    except ValueError as exc:
        raise BuildError(
            f"cannot read the converter's operator list: {exc}",
            stage=STAGE,
            tool="mnnconvert",
            exit_status=run.exit_status,
            output_tail=tail(run.output),
        ) from exc


def unsupported_ops(report: OnnxReport, supported: frozenset[str] | None = None) -> list[str]:
    """Return the model's operator types the MNN converter does not handle.

    Args:
        report: From :func:`inspect_onnx`.
        supported: The converter's operator list; defaults to
            :func:`supported_onnx_ops`.

    Returns:
        Sorted operator types; empty when every operator is supported.
    """
    known = supported_onnx_ops() if supported is None else supported
    return [op for op in report.op_types if op not in known]
