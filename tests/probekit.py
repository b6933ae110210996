"""Golden probes for tests and benchmarks, made as the build makes them: real MNN CPU outputs.

The expected outputs come from :func:`edgereg.toolchain.run_inference` (the
build's own inference, MNN CPU in a child process), never from the
self-test code under test, so a probe check that passes is not circular.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgereg import toolchain
from edgereg.config import RuntimeHints
from edgereg.protocol.contract import BlobRef
from edgereg.protocol.fields import Backend
from edgereg.protocol.layout import blob_path
from edgereg.protocol.probe import GoldenProbe, ProbeCase, ProbeStep, ProbeTensor, ProbeTolerance
from edgereg.protocol.wire import ManifestEntry, to_bytes
from edgereg.toolchain import InputFeed

_DTYPES = {
    "float32": "<f4",
    "float16": "<f2",
    "int8": "i1",
    "uint8": "u1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "?",
}

#: The tolerance the tests give their probes: far looser than float rounding
#: between runs, far tighter than a perturbed (miscomputing) backend.
TOLERANCE = ProbeTolerance(min_cosine=0.999, max_abs_error=1e-3)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensor(name: str, array: np.ndarray, dtype: str) -> ProbeTensor:
    """A probe tensor of ``array`` as ``dtype`` (little-endian, C order)."""
    value = np.ascontiguousarray(np.asarray(array).astype(_DTYPES[dtype]))
    return ProbeTensor(
        name=name,
        dtype=dtype,  # type: ignore[arg-type]
        shape=[int(d) for d in value.shape],
        data=base64.b64encode(value.tobytes()).decode("ascii"),
    )


def make_probe(
    artifact: Path,
    rows: dict[str, np.ndarray],
    *,
    feeds: Sequence[InputFeed],
    outputs: Sequence[str],
    model: str = "m",
    variant: str = "fp32",
    state: Sequence[tuple[str, str]] = (),
    steps_per_case: int = 1,
    tolerance: ProbeTolerance = TOLERANCE,
) -> GoldenProbe:
    """The probe of ``artifact`` over ``rows`` (state inputs excluded), expected by MNN CPU.

    Args:
        artifact: The ``.mnn`` file.
        rows: Input name -> ``(N, ...)`` rows; every ``steps_per_case`` rows make one case.
        feeds: Every model input (state inputs too), as the build feeds them.
        outputs: The app-facing outputs the probe checks.
        state: ``(input, output)`` pairs, fed back within a case.
        steps_per_case: Steps per case (1 for a stateless model).
    """
    count = len(next(iter(rows.values())))
    assert count % steps_per_case == 0
    state_inputs = {pair[0] for pair in state}
    wanted = list(outputs) + [pair[1] for pair in state if pair[1] not in outputs]
    sequences = np.repeat(np.arange(count // steps_per_case), steps_per_case).astype(np.int64)
    computed = toolchain.run_inference(
        artifact,
        rows,
        feeds=feeds,
        output_names=wanted,
        state=list(state),
        sequences=sequences if state else None,
    )
    cases = []
    for case in range(count // steps_per_case):
        steps = []
        for index in range(case * steps_per_case, (case + 1) * steps_per_case):
            inputs = [
                tensor(feed.name, feed.sample(rows[feed.name], index), feed.dtype)
                for feed in feeds
                if feed.name not in state_inputs
            ]
            expected = [tensor(name, computed[name][index], "float32") for name in outputs]
            steps.append(ProbeStep(inputs=inputs, expected=expected))
        cases.append(ProbeCase(steps=steps))
    return GoldenProbe(
        model=model,
        variant=variant,
        artifact_sha256=sha256_file(artifact),
        state=list(state),
        cases=cases,
        tolerance=tolerance,
    )


def probe_blob(probe: GoldenProbe) -> tuple[bytes, BlobRef]:
    """The probe's blob bytes and the reference a manifest entry carries."""
    data = to_bytes(probe)
    return data, BlobRef.of(hashlib.sha256(data).hexdigest(), len(data))


def entry_for(
    artifact: Path,
    *,
    version: str = "1.0.0",
    variant: str = "fp32",
    backends: Sequence[Backend] = ("cpu",),
    probe: BlobRef | None = None,
) -> ManifestEntry:
    """A manifest entry for ``artifact`` as a registry would publish it."""
    digest = sha256_file(artifact)
    return ManifestEntry(
        version=version,
        variant=variant,
        path=blob_path(digest),
        sha256=digest,
        size=artifact.stat().st_size,
        min_mnn_runtime="3.6.1",
        runtime=RuntimeHints(threads=1, backends=list(backends)),
        probe=probe,
    )
