"""A variant's I/O contract: what an app needs to call it, from models.toml and the ONNX graph.

Inputs come from models.toml (the variant's own ``inputs`` when it overrides
``source``), because that is the shape the build feeds and verifies; outputs
take their dtype and shape from the variant's ONNX source, because models.toml
names outputs only. Labels travel inline while small, else as a blob the
build writes next to the contract (:data:`LABELS`).

An artifact with control-flow subgraphs (MNN's converter turns an LSTM or a
GRU into a ``While``, ONNX ``If``/``Loop`` into ``If``/``Loop``) runs only
through MNN's Module API: its contract says ``mnn_api = "module"``
(:func:`control_flow_subgraphs`), so a client whose runner calls the session
API refuses it before download (docs/protocol.md section 7, rule (f)).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from edgereg import toolchain
from edgereg.config import Model, ResolvedVariant
from edgereg.errors import BuildError
from edgereg.protocol._json import canonical_json
from edgereg.protocol.contract import (
    INLINE_LABELS_MAX_BYTES,
    BlobRef,
    InputTensor,
    IOContract,
    StateLink,
    TaskInfo,
    TensorDtype,
    TensorSpec,
)
from edgereg.toolchain import OnnxReport

__all__ = [
    "MNN_CONTROL_FLOW",
    "STAGE",
    "SUBGRAPH_ONNX_OPS",
    "BuiltContract",
    "contract_labels",
    "control_flow_subgraphs",
    "io_contract",
    "labels_blob",
]

#: Stage named in errors raised here.
STAGE = "contract"

_DTYPES = frozenset(get_args(TensorDtype))
_DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class BuiltContract:
    """A contract and its labels (written as :data:`~edgereg.build.outputs.LABELS`).

    Attributes:
        contract: The contract; it references the labels as a blob when they
            are too large to inline.
        labels: The class names or characters, or None when the model has none.
    """

    contract: IOContract
    labels: list[str] | None


#: ONNX ops MNN's converter turns into control-flow subgraphs.
SUBGRAPH_ONNX_OPS = ("GRU", "If", "LSTM", "Loop", "RNN", "Scan")
#: What they are in a ``.mnn`` file: ops that only MNN's Module API runs.
MNN_CONTROL_FLOW = frozenset({"If", "Loop", "While"})


def control_flow_subgraphs(artifact: Path, graph: OnnxReport) -> list[str]:
    """The artifact's control-flow ops (``While``, ``If``, ``Loop``) by name, in graph order.

    Read from the artifact (a child process) only when its ONNX source has an
    op that becomes one; empty when the session API runs it as well.

    Raises:
        BuildError: the converter cannot read the artifact back.
    """
    if not any(op in graph.op_counts for op in SUBGRAPH_ONNX_OPS):
        return []
    return [op.name for op in toolchain.model_ops(artifact) if op.type in MNN_CONTROL_FLOW]


def labels_blob(labels: Sequence[str]) -> bytes:
    """The labels as the blob apps fetch: the canonical JSON array of strings."""
    return canonical_json(list(labels))


def contract_labels(model: Model, charset: Sequence[str] | None) -> list[str] | None:
    """What the task lists for the app: class names, or a CTC task's characters (blank excluded)."""
    return model.task.contract_labels(model.classes, charset)


def io_contract(
    model_name: str,
    model: Model,
    variant: ResolvedVariant,
    graph: OnnxReport,
    *,
    charset: Sequence[str] | None = None,
) -> BuiltContract:
    """Compute the I/O contract of one variant.

    Args:
        model_name: Named in errors.
        model: The model's models.toml table.
        variant: The variant resolved against its model (``Config.resolve``).
        graph: :func:`edgereg.toolchain.inspect_onnx` of the variant's source.
        charset: The CTC charset's characters, in class order (ctc models).

    Raises:
        BuildError: (stage ``contract``) an output the contract names is not in
            the graph, or has a dtype no app-facing tensor can have.
    """
    where = f"{model_name}: {graph.path}"
    try:
        return _io_contract(where, model, variant, graph, charset)
    except ValidationError as exc:
        # A name or shape the wire format cannot carry (a 300-character tensor name).
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'contract'}: {error['msg']} "
            f"(found {_short(error.get('input'))})"
            for error in exc.errors()
        )
        raise BuildError(
            f"{where}: the I/O contract cannot describe this model: {problems}",
            stage=STAGE,
            hint="Rename the tensor or the dimension in the graph (names of 1 to 256 "
            "characters; a dynamic axis as a dim_param such as 'batch', or -1).",
        ) from exc


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _io_contract(
    where: str,
    model: Model,
    variant: ResolvedVariant,
    graph: OnnxReport,
    charset: Sequence[str] | None,
) -> BuiltContract:
    specs = variant.inputs
    inputs = [
        InputTensor(
            name=spec.name,
            dtype=spec.dtype,
            shape=list(spec.shape),
            batch_axis=spec.batch,
            kind=spec.kind,
            layout=spec.layout,
            color=spec.color,
            mean=spec.mean,
            std=spec.std,
        )
        for spec in specs
    ]
    graph_outputs = {tensor.name: tensor for tensor in graph.outputs}
    outputs = []
    for declared in model.outputs:
        tensor = graph_outputs.get(declared.name)
        if tensor is None:
            raise BuildError(
                f"{where} has no output '{declared.name}' (outputs: {', '.join(graph_outputs)})",
                stage=STAGE,
                hint="Fix [[models.<name>.outputs]] in models.toml, or re-export the model.",
            )
        if tensor.dtype not in _DTYPES:
            raise BuildError(
                f"{where} output '{tensor.name}' is {tensor.dtype}; an app-facing output is "
                f"one of {', '.join(sorted(_DTYPES))}",
                stage=STAGE,
                hint="Cast the output inside the graph before export (float32 for scores).",
            )
        shape: list[int | str] = [
            dim
            if isinstance(dim, int)
            # A dim_param is the app's to choose; an unnamed dynamic axis gets a name.
            else (dim if _DIM_NAME.fullmatch(dim) else f"dim{axis}")
            for axis, dim in enumerate(tensor.shape)
        ]
        outputs.append(TensorSpec(name=tensor.name, dtype=tensor.dtype, shape=shape))
    output_names = {spec.name for spec in outputs}
    state_outputs = {pair.output for pair in model.state}
    app_outputs = [spec.name for spec in model.outputs if spec.name not in state_outputs]
    task_output = model.task.output or (app_outputs[0] if app_outputs else None)
    if task_output is not None and task_output not in output_names:
        raise BuildError(
            f"{where}: task.output '{task_output}' is not an output of the graph",
            stage=STAGE,
        )
    task = TaskInfo(
        kind=model.task.kind,
        output=task_output,
        threshold=getattr(model.task, "threshold", None),
        blank=getattr(model.task, "blank", None),
    )
    labels = contract_labels(model, charset)
    inline: list[str] | None = labels
    blob_ref: BlobRef | None = None
    if labels is not None:
        encoded = labels_blob(labels)
        if len(encoded) > INLINE_LABELS_MAX_BYTES:
            inline = None
            blob_ref = BlobRef.of(hashlib.sha256(encoded).hexdigest(), len(encoded))
    contract = IOContract(
        inputs=inputs,
        outputs=outputs,
        state=[StateLink(input=pair.input, output=pair.output) for pair in model.state],
        task=task,
        labels=inline,
        labels_blob=blob_ref,
    )
    return BuiltContract(contract, labels)
