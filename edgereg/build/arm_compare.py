"""One artifact, one behaviour: each ARM class's outputs against the host's, per output channel.

The ARM stage gates each class against the fp32 ONNX reference with the
precision's loose budgets (an int8 variant may be a few percent off fp32).
That cannot see a kernel that gets a few channels wrong on one CPU class
while staying within those budgets: MNN 3.6.1's i8mm int8 kernel computes
the output channels past the last multiple of 8 wrong, and on a net whose
tail channels are small the whole output still has cosine 0.99 against fp32.
What the same artifact computes on the same inputs elsewhere is the sharper
witness: two correct kernels differ only by the order they add in.

So the build also runs the artifact on the host, through the same probe
script as the emulated classes (one forward per row, the same precision
hint), and compares every output of every run, state outputs included, per
output channel (:func:`channel_axis`):

- two runs agree on an output when no element differs by more than the
  tolerance of float re-association, :data:`REASSOCIATION_RTOL` of the
  output's largest magnitude: fp32 arithmetic ``2^-10`` (the examples
  differ by at most 4e-5 between x86 and ARM: a GRU's state), fp16 arithmetic
  ``2^-6`` (a class with fp16 under ``precision = "low"``: measured 2.2e-3),
  the looser of the two runs';
- the reference is the fp32 run that agrees with the most others, the host
  first on a tie (an fp16 run agrees with more, and would pass an fp32 run as
  far off as fp16 rounding). MNN's x86 and ARM int8 kernels round differently: on the
  examples' int8 variants every ARM class computes the same bits and the
  host differs (a dense map by up to 0.69 at one pixel), so the classes'
  consensus is then the reference and the host's difference is recorded;
- a class that does not agree with the reference differs, named with the
  outputs and channels beyond the tolerance (the build ships around it or
  fails: :func:`edgereg.build.arm.arm_stage`).

A lone class has only the host to agree with: the host is its reference.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgereg._files import atomic_write
from edgereg.errors import BuildError
from edgereg.protocol._json import canonical_json
from edgereg.toolchain._process import run_probe, scratch_dir, tail

__all__ = [
    "HOST",
    "REASSOCIATION_RTOL",
    "Comparison",
    "OutputDiff",
    "channel_axis",
    "compare",
    "compare_outputs",
    "run_on_host",
]

logger = logging.getLogger(__name__)

#: What the host's run is called among the classes.
HOST = "host"
#: Relative tolerance of float re-association, by the arithmetic a run computes in.
REASSOCIATION_RTOL = {"fp32": 2.0**-10, "fp16": 2.0**-6}
#: Channels named per output in messages and metrics.json (the rest are counted).
_NAMED_CHANNELS = 16


def channel_axis(rank: int) -> int | None:
    """The channel axis of one forward's output tensor of this rank.

    Axis 1 of an image-like tensor (rank 4 or more, NCHW as MNN returns it);
    the last axis otherwise (``[1, C]`` logits, ``[T, 1, C]`` and ``[1, T, C]``
    sequences, a ``[layers, 1, hidden]`` state); a scalar is one channel.
    """
    if rank == 0:
        return None
    return 1 if rank >= 4 else rank - 1


@dataclass(frozen=True)
class OutputDiff:
    """Where one run differs from its reference on one output.

    Attributes:
        channels: The channels (:func:`channel_axis`) with an element beyond the tolerance.
        max_abs_diff: The largest element difference on the output.
        tolerance: The tolerance it was held to.
    """

    channels: tuple[int, ...]
    max_abs_diff: float
    tolerance: float

    def describe(self, name: str) -> str:
        """``logits channels 8, 9: 9.91 off (tolerance 0.0118)``."""
        shown = ", ".join(str(c) for c in self.channels[:_NAMED_CHANNELS])
        more = len(self.channels) - _NAMED_CHANNELS
        if more > 0:
            shown += f" and {more} more"
        word = "channel" if len(self.channels) == 1 else "channels"
        off = f"{self.max_abs_diff:.3g} off (tolerance {self.tolerance:.3g})"
        return f"{name} {word} {shown}: {off}"

    def to_json(self) -> dict[str, Any]:
        """Its record in metrics.json."""
        return {
            "channels": list(self.channels),
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance,
        }


def compare_outputs(got: np.ndarray, reference: np.ndarray, *, rtol: float) -> OutputDiff | None:
    """Compare one output of two runs (``(rows, *tensor shape)`` each); None when they agree."""
    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        return OutputDiff((), float("inf"), 0.0)
    finite = np.isfinite(a) & np.isfinite(b)
    scale = float(np.max(np.abs(b[finite]), initial=0.0))
    tolerance = rtol * scale
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
    # A NaN on one side only, or an infinity that differs, is beyond any tolerance.
    diff = np.where(finite, diff, np.where(np.isnan(a) & np.isnan(b), 0.0, np.inf))
    if not diff.size or float(np.max(diff)) <= tolerance:
        return None
    axis = channel_axis(a.ndim - 1)
    if axis is None:
        channels: tuple[int, ...] = (0,)
    else:
        per_channel = np.moveaxis(diff, axis + 1, 0).reshape(diff.shape[axis + 1], -1).max(axis=1)
        channels = tuple(int(c) for c in np.flatnonzero(per_channel > tolerance))
    return OutputDiff(channels, float(np.max(diff)), tolerance)


@dataclass(frozen=True)
class Comparison:
    """The runs of one artifact compared.

    Attributes:
        reference: The run the others are held to (``host`` or a class).
        differs: Per class that does not agree with the reference: output -> where.
        host_differs: When a class consensus is the reference: where the host differs from it.
    """

    reference: str
    differs: dict[str, dict[str, OutputDiff]]
    host_differs: dict[str, OutputDiff]

    def to_json(self) -> dict[str, Any]:
        """The ``same_artifact`` record of metrics.json's ``arm``."""
        return {
            "reference": self.reference,
            "host_differs": {n: d.to_json() for n, d in self.host_differs.items()},
        }


def compare(
    runs: Mapping[str, Mapping[str, np.ndarray]],
    arithmetic: Mapping[str, str],
    output_names: Sequence[str],
) -> Comparison:
    """Compare every run with every other and hold each class to the reference.

    Args:
        runs: ``host`` and each class that ran -> output name -> ``(rows, ...)``.
        arithmetic: Each run's arithmetic, ``fp32`` or ``fp16``.
        output_names: The outputs compared (every output, state outputs too).
    """
    names = [HOST, *(n for n in runs if n != HOST)]

    def diffs(a: str, b: str) -> dict[str, OutputDiff]:
        rtol = max(REASSOCIATION_RTOL[arithmetic[a]], REASSOCIATION_RTOL[arithmetic[b]])
        found = {}
        for output in output_names:
            diff = compare_outputs(runs[a][output], runs[b][output], rtol=rtol)
            if diff is not None:
                found[output] = diff
        return found

    agree = {a: sum(1 for b in names if b != a and not diffs(a, b)) for a in names}
    # The reference computes in fp32 (the host always does): an fp16 run agrees with
    # more, and would pass an fp32 run that is as far off as fp16 rounding.
    # The host first on a tie: a lone class, or two camps of one, is held to the host.
    exact = [n for n in names if arithmetic[n] == "fp32"]
    reference = max(exact, key=lambda n: (agree[n], n == HOST))
    differs = {n: d for n in names if n not in (HOST, reference) if (d := diffs(n, reference))}
    host_differs = diffs(HOST, reference) if reference != HOST else {}
    return Comparison(reference, differs, host_differs)


def _cache_key(artifact_sha: str, mnn_version: str, precision: str, inputs_digest: str) -> str:
    return hashlib.sha256(
        canonical_json(
            {
                "artifact": artifact_sha,
                "class": HOST,
                "mnn": mnn_version,
                "precision": precision,
                "inputs": inputs_digest,
            }
        )
    ).hexdigest()


def run_on_host(
    artifact: Path,
    inputs: Mapping[str, np.ndarray],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    precision: str,
    artifact_sha: str,
    inputs_digest: str,
    mnn_version: str,
    cache_dir: Path,
    timeout: float = 900.0,
) -> dict[str, np.ndarray]:
    """The artifact on the host's MNN, through the emulated classes' own probe script.

    One forward per row with whole tensors, the same precision hint, so a
    difference from a class is the kernels', not the harness's. Cached like
    the classes' runs (by artifact digest, MNN version, precision and inputs).

    Raises:
        BuildError: (stage ``arm verify``) MNN failed on the host.
    """
    path = cache_dir / f"{_cache_key(artifact_sha, mnn_version, precision, inputs_digest)}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as data:
                return {n: np.array(data[f"out:{n}"]) for n in output_names}
        except (OSError, KeyError, ValueError) as exc:
            logger.info("host run cache %s unreadable (%s); running it again", path, exc)
    arrays = {}
    for name in input_names:
        array = np.asarray(inputs[name])
        # As the emulated runs get them (edgereg.toolchain.arm.run_on_class).
        dtype = np.int32 if array.dtype.kind in "iub" else np.float32
        arrays[name] = np.ascontiguousarray(array, dtype=dtype)

    def failed(failure: Any) -> BuildError:
        return BuildError(
            f"the host's MNN stopped on the artifact ({failure.kind}): {failure.error}",
            stage="arm verify",
            tool="MNN (host)",
            exit_status=failure.exit_status,
            output_tail=failure.output_tail,
        )

    with scratch_dir() as scratch:
        np.savez(scratch / "inputs.npz", **arrays)  # type: ignore[arg-type]
        run = run_probe(
            [sys.executable],
            {
                "op": "run",
                "model": str(Path(artifact).resolve()),
                "inputs": str(scratch / "inputs.npz"),
                "output": str(scratch / "outputs.npz"),
                "input_names": list(input_names),
                "output_names": list(output_names),
                "whole": True,
                "precision": precision,
            },
            scratch=scratch,
            timeout=timeout,
            error=failed,
        )
        if not run.result.get("ok"):
            raise BuildError(
                f"the host's MNN fails on the artifact: {run.result.get('error')}",
                stage="arm verify",
                tool="MNN (host)",
                exit_status=run.exit_status,
                output_tail=tail(run.output + "\n" + str(run.result.get("traceback", ""))),
            )
        with np.load(scratch / "outputs.npz") as data:
            outputs = {name: np.array(data[name]) for name in output_names}
    buffer = io.BytesIO()
    np.savez(
        buffer,
        meta=np.frombuffer(json.dumps({"class": HOST}).encode(), dtype=np.uint8),
        **{f"out:{n}": a for n, a in outputs.items()},  # type: ignore[arg-type]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())
    return outputs
