"""The golden probe: a few inputs, the outputs a correct device computes, and how close is close.

The build stores one probe per variant (a blob, referenced by digest from the
release record and every manifest entry). After a download, the client runs
the model on each hinted backend and calls :func:`check_probe` with what it
computed; a backend whose outputs miss the tolerance is skipped. A GPU driver
that miscomputes is caught on the device it landed on, before the model is
installed.

The format is plain JSON (canonical, like every edgereg document), so a port
needs no numpy: tensors are base64 of their little-endian bytes, inline, or,
when they are too large for a JSON document (a 1x3x1024x1024 float input is
16.8 MB in base64, over :data:`MAX_PROBE_BYTES`), the raw bytes of a second
blob beside the model, the entry's ``probe_data``: such a tensor names its
``offset`` there instead of its ``data``, and the probe names that blob's
digest (``data_sha256``). :meth:`GoldenProbe.resolved` reads them back.

- ``cases``: each case is one or more ``steps`` fed in order. A stateless
  model has one step per case. A model with state pairs is fed its own state
  back: at a case's first step every state input is zeros, at the next step
  it is what the state output returned (exactly as the build evaluates it).
- ``expected``: per step, the outputs the variant computed on the build host
  (MNN, CPU backend): what a correct backend reproduces up to float rounding.
- ``tolerance``: derived from the variant's measured agreement. A device
  output passes when its cosine similarity with the expected output is at
  least ``min_cosine`` and its largest absolute difference at most
  ``max_abs_error``; both are looser than the host's own differences
  between backends and runs, and far tighter than what a miscomputing
  kernel produces.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import BeforeValidator, Field, StringConstraints, model_validator

from edgereg.protocol.contract import TensorDtype
from edgereg.protocol.fields import MAX_PROBE_DATA_BYTES, MAX_SAFE_INTEGER, SchemaVersion
from edgereg.protocol.patterns import NAME_PATTERN, SHA256_PATTERN
from edgereg.protocol.wire import WireModel

__all__ = [
    "MAX_PROBE_BYTES",
    "MAX_PROBE_DATA_BYTES",
    "PAYLOAD_TYPE_PROBE",
    "PROBE_FAILURES",
    "GoldenProbe",
    "ProbeCase",
    "ProbeOutput",
    "ProbeResult",
    "ProbeStep",
    "ProbeTensor",
    "ProbeTolerance",
    "check_probe",
    "cosine_similarity",
    "decode_tensor",
]

PAYLOAD_TYPE_PROBE = "application/vnd.edgereg.probe+json"

MAX_PROBE_BYTES = 16 * 1024 * 1024
"""The largest probe document a client parses (every signed document's limit)."""


def _is_none(value: object) -> bool:
    return value is None


_ITEM = {
    "float32": ("f", 4),
    "float16": ("e", 2),
    "int8": ("b", 1),
    "uint8": ("B", 1),
    "int32": ("i", 4),
    "int64": ("q", 8),
    "bool": ("?", 1),
}


class ProbeTensor(WireModel):
    """One tensor: its name, dtype, shape and little-endian bytes, inline or in the data blob."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    dtype: TensorDtype
    shape: list[Annotated[int, Field(ge=0, strict=True)]]
    data: str | None = Field(
        default=None,
        description="base64 of the little-endian element bytes, C order; or absent with offset.",
        exclude_if=_is_none,
    )
    offset: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER, strict=True)] | None = Field(
        default=None,
        description="Where the element bytes start in the probe data blob (instead of data).",
        exclude_if=_is_none,
    )

    @property
    def nbytes(self) -> int:
        """The element bytes of this tensor: product(shape) x element size."""
        return math.prod(self.shape) * _ITEM[self.dtype][1]

    @model_validator(mode="after")
    def _size_matches(self) -> ProbeTensor:
        if (self.data is None) == (self.offset is None):
            raise ValueError(f"tensor {self.name}: exactly one of data and offset")
        if self.data is None:
            return self
        expected = self.nbytes
        try:
            raw = base64.b64decode(self.data, validate=True)
        except ValueError as exc:
            raise ValueError(f"tensor {self.name}: data is not base64") from exc
        if base64.b64encode(raw).decode("ascii") != self.data:
            # One spelling per tensor, as for the envelope's payload.
            raise ValueError(f"tensor {self.name}: data is not canonical padded base64")
        if len(raw) != expected:
            raise ValueError(
                f"tensor {self.name}: {len(raw)} bytes for shape {self.shape} of "
                f"{self.dtype}, expected {expected}"
            )
        return self

    def values(self) -> list[float]:
        """The elements, flat, as Python numbers (C order).

        Raises:
            ValueError: the tensor is in the data blob (see :meth:`GoldenProbe.resolved`).
        """
        if self.data is None:
            raise ValueError(f"tensor {self.name} is in the probe data blob: resolve the probe")
        return decode_tensor(self.dtype, base64.b64decode(self.data))


def decode_tensor(dtype: str, raw: bytes) -> list[float]:
    """Little-endian element bytes as a flat list of numbers."""
    code, size = _ITEM[dtype]
    if dtype == "bool":
        return [1.0 if byte else 0.0 for byte in raw]  # any nonzero byte is true
    return [float(v) for v in struct.unpack(f"<{len(raw) // size}{code}", raw)]


class ProbeStep(WireModel):
    """One step of a case: the inputs fed (state inputs excluded) and the outputs expected."""

    inputs: list[ProbeTensor] = Field(min_length=1)
    expected: list[ProbeTensor] = Field(
        min_length=1, description="The app-facing outputs (state outputs are checked through them)."
    )

    @model_validator(mode="after")
    def _names_once(self) -> ProbeStep:
        for role, tensors in (("inputs", self.inputs), ("expected", self.expected)):
            names = [tensor.name for tensor in tensors]
            if len(set(names)) != len(names):
                raise ValueError(f"{role} names a tensor twice")
        return self


class ProbeCase(WireModel):
    """One sample (stateless) or one short stream (state fed back, zeros first)."""

    steps: list[ProbeStep] = Field(min_length=1)


class ProbeTolerance(WireModel):
    """How far a correct device's outputs may be from the expected ones."""

    min_cosine: float = Field(ge=-1, le=1, allow_inf_nan=False)
    max_abs_error: float = Field(ge=0, allow_inf_nan=False)


def _pair_from_json(value: object) -> object:
    # JSON has no tuples: a pair arrives as a list, which strict parsing refuses.
    return tuple(value) if isinstance(value, list) else value


StatePairOnWire = Annotated[tuple[str, str], BeforeValidator(_pair_from_json)]


class GoldenProbe(WireModel):
    """The probe of one variant (a blob: canonical JSON of this document)."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_PROBE
    kind: ClassVar[str] = "golden probe"
    # A blob verified by the digest in a signed manifest: a newer build may add keys
    # (ignored); a change an older client must not ignore raises schema_version.
    ignores_unknown_keys: ClassVar[bool] = True

    schema_version: SchemaVersion = 1
    model: Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
    variant: Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
    artifact_sha256: Annotated[str, StringConstraints(pattern=SHA256_PATTERN)] = Field(
        description="The artifact this probe was computed for."
    )
    state: list[StatePairOnWire] = Field(
        default_factory=list, description="(state input, state output) pairs, fed back per step."
    )
    cases: list[ProbeCase] = Field(min_length=1)
    tolerance: ProbeTolerance
    data_sha256: Annotated[str, StringConstraints(pattern=SHA256_PATTERN)] | None = Field(
        default=None,
        description="The probe data blob (the entry's probe_data) its offsets point into.",
        exclude_if=_is_none,
    )

    def tensors(self) -> list[ProbeTensor]:
        """Every tensor, in document order (case, step, inputs then expected)."""
        return [
            tensor
            for case in self.cases
            for step in case.steps
            for tensor in (*step.inputs, *step.expected)
        ]

    @model_validator(mode="after")
    def _offsets_need_data(self) -> GoldenProbe:
        if self.data_sha256 is None and any(t.offset is not None for t in self.tensors()):
            raise ValueError("a tensor names an offset, but the probe names no data_sha256")
        return self

    def resolved(self, data: bytes | None) -> GoldenProbe:
        """This probe with every tensor of the data blob inline (docs/protocol.md section 11).

        Args:
            data: The entry's ``probe_data`` blob, verified against the entry's
                size and sha256 (rules 13-14); None when the entry has none.

        Raises:
            ValueError: the probe names a data blob the entry does not, or
                another one; the entry names one the probe does not; or a
                tensor's bytes lie beyond the blob's end.
        """
        if data is None:
            if self.data_sha256 is not None:
                raise ValueError("the probe names a data blob (data_sha256), the entry none")
            return self
        if self.data_sha256 is None:
            raise ValueError("the entry names a probe data blob, the probe does not")
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.data_sha256:
            raise ValueError(
                f"the probe's data_sha256 is {self.data_sha256[:12]}, the entry's probe_data "
                f"is {digest[:12]}"
            )

        def inline(tensor: ProbeTensor) -> ProbeTensor:
            if tensor.offset is None:
                return tensor
            end = tensor.offset + tensor.nbytes
            if end > len(data):
                raise ValueError(
                    f"tensor {tensor.name}: bytes {tensor.offset} to {end} lie beyond the "
                    f"{len(data)}-byte probe data blob"
                )
            raw = data[tensor.offset : end]
            return ProbeTensor(
                name=tensor.name,
                dtype=tensor.dtype,
                shape=tensor.shape,
                data=base64.b64encode(raw).decode("ascii"),
            )

        cases = [
            ProbeCase(
                steps=[
                    ProbeStep(
                        inputs=[inline(t) for t in step.inputs],
                        expected=[inline(t) for t in step.expected],
                    )
                    for step in case.steps
                ]
            )
            for case in self.cases
        ]
        return self.model_copy(update={"cases": cases, "data_sha256": None})


PROBE_FAILURES = (
    "count-mismatch",
    "missing-output",
    "shape-mismatch",
    "not-finite",
    "cosine",
    "abs-error",
)
"""Why an output misses the probe, in the order they are checked (docs/protocol.md §11)."""


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`check_probe` found.

    Attributes:
        passed: Every output of every step is within the tolerance.
        worst_cosine: The lowest cosine similarity seen.
        worst_abs_error: The largest absolute difference seen.
        failure: Where it failed first ("case 2 step 1 output probs: cosine 0.41 < 0.999"),
            or None.
        code: The kind of that failure (one of :data:`PROBE_FAILURES`), or None.
    """

    passed: bool
    worst_cosine: float
    worst_abs_error: float
    failure: str | None = None
    code: str | None = None

    reason: ClassVar[str] = "probe-mismatch"


@dataclass(frozen=True)
class ProbeOutput:
    """An output a backend computed: its shape and its elements, flat, in C order."""

    shape: tuple[int, ...]
    values: Sequence[float]


Computed = Sequence[float] | ProbeOutput | ProbeTensor
"""One computed output: a tensor with its shape, or bare elements (then only their count is
compared with the expected shape)."""


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """dot(a, b) / (|a| |b|) in double precision; two all-zero vectors are 1, one is 0."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        # Zero against zero is a perfect match (a mask with nothing in it); zero
        # against anything else has no direction in common.
        return 1.0 if na == nb else 0.0
    return dot / (na * nb)


def _shape_and_values(got: Computed) -> tuple[tuple[int, ...] | None, Sequence[float]]:
    if isinstance(got, ProbeTensor):
        return tuple(got.shape), got.values()
    if isinstance(got, ProbeOutput):
        return tuple(got.shape), got.values
    return None, got


def check_probe(
    probe: GoldenProbe, computed: Sequence[Sequence[Mapping[str, Computed]]]
) -> ProbeResult:
    """Compare what a device computed with the probe's expected outputs.

    The first output that misses decides, in probe order (case, step, expected
    output) and, per output, in the order of :data:`PROBE_FAILURES`: absent,
    another shape (or element count), a NaN or infinity in the expected or the
    computed values, cosine below ``min_cosine``, largest absolute difference
    above ``max_abs_error``.

    Args:
        probe: The verified probe.
        computed: Per case, per step, output name -> what the device computed,
            for at least every expected output (extra outputs are ignored).

    Returns:
        The verdict.
    """
    worst_cosine, worst_error = 1.0, 0.0
    # The first failure decides; after a tolerance miss the scan goes on only to
    # report the worst cosine and error over every output (what the build logs).
    first: tuple[str, str] | None = None

    def fail(code: str, message: str) -> ProbeResult:
        if first is not None:
            code, message = first
        if code in ("cosine", "abs-error"):
            return ProbeResult(False, worst_cosine, worst_error, message, code)
        return ProbeResult(False, -1.0, math.inf, message, code)

    if len(computed) != len(probe.cases):
        return fail(
            "count-mismatch", f"{len(computed)} cases computed, {len(probe.cases)} in probe"
        )
    tolerance = probe.tolerance
    for case_index, (case, case_out) in enumerate(zip(probe.cases, computed, strict=True), 1):
        if len(case_out) != len(case.steps):
            return fail(
                "count-mismatch",
                f"case {case_index}: {len(case_out)} steps computed, {len(case.steps)} in probe",
            )
        for step_index, (step, outputs) in enumerate(zip(case.steps, case_out, strict=True), 1):
            for tensor in step.expected:
                where = f"case {case_index} step {step_index} output {tensor.name}"
                got = outputs.get(tensor.name)
                if got is None:
                    return fail("missing-output", f"{where}: missing")
                shape, values = _shape_and_values(got)
                want = tensor.values()
                if (shape is not None and list(shape) != list(tensor.shape)) or len(values) != len(
                    want
                ):
                    shown = list(shape) if shape is not None else f"{len(values)} elements"
                    return fail(
                        "shape-mismatch", f"{where}: shape {shown}, expected {tensor.shape}"
                    )
                if not all(math.isfinite(v) for v in want):
                    return fail("not-finite", f"{where}: the expected values hold NaN or infinity")
                if not all(math.isfinite(v) for v in values):
                    return fail("not-finite", f"{where}: NaN or infinity computed")
                cosine = cosine_similarity(values, want)
                error = max((abs(x - y) for x, y in zip(values, want, strict=True)), default=0.0)
                worst_cosine = min(worst_cosine, cosine)
                worst_error = max(worst_error, error)
                if first is None and cosine < tolerance.min_cosine:
                    first = ("cosine", f"{where}: cosine {cosine:.6f} < {tolerance.min_cosine:.6f}")
                elif first is None and error > tolerance.max_abs_error:
                    first = (
                        "abs-error",
                        f"{where}: abs error {error:.6g} > {tolerance.max_abs_error:.6g}",
                    )
    if first is not None:
        return fail(*first)
    return ProbeResult(True, worst_cosine, worst_error)
