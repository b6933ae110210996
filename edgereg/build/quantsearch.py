"""Finding an int8 recipe that passes the gates: fixed methods, ``auto``, measured hints.

:class:`QuantSearch` runs the quantizer and scores each attempt with the
build's own verify and evaluate stages (passed in as ``score``), so an
attempt is judged exactly as the shipped artifact will be.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgereg import toolchain
from edgereg.build.quality import GateResult, Scored
from edgereg.config import Int8Quantization
from edgereg.errors import BuildError

logger = logging.getLogger(__name__)

#: MNN op types the int8 quantizer quantizes (their weights and features).
WEIGHTED_OPS = frozenset(
    {"Convolution", "ConvolutionDepthwise", "Deconvolution", "DeconvolutionDepthwise"}
)


@dataclass(frozen=True)
class QuantAttempt:
    """One quantizer run of a search: its recipe and what came of it."""

    method: str
    skip_ops: tuple[str, ...]
    path: Path
    scored: Scored | None
    error: str | None = None
    layer_errors: tuple[toolchain.LayerError, ...] = ()

    @property
    def passed(self) -> bool:
        """True when the quantizer produced a model that passes every gate so far."""
        return self.scored is not None and self.scored.gates.passed

    def summary(self) -> dict[str, Any]:
        """What provenance records of the attempt."""
        failed = [] if self.scored is None else [g.describe() for g in self.scored.gates.failures]
        return {
            "method": self.method,
            "skip_ops": list(self.skip_ops),
            "passed": self.passed,
            "failed_gates": failed,
            "error": self.error,
        }


class QuantSearch:
    """Find an int8 recipe that passes the gates, deterministically.

    A fixed method is run once. ``method = "auto"`` runs KL, EMA and ADMM
    (in that order) and keeps the best that passes; when none passes it keeps
    the worst layers of the best attempt in float, 1, 2, 4, ... of them, up to
    ``max_skip_ops``. The same inputs give the same attempts in the same
    order, so the same recipe and the same bytes. The layer search stops
    early when keeping the worst layer in float shows that the rest cannot
    close the gap (:func:`out_of_reach`), and every run reports how long the
    rest of the search may take (``on_progress``).

    A fixed method that fails is followed by the other methods, run only to
    measure what the hint would gain: a hint is printed only when measured.
    """

    def __init__(
        self,
        float_artifact: Path,
        work_dir: Path,
        *,
        quantization: Int8Quantization,
        inputs: list[toolchain.QuantInput],
        samples: list[dict[str, np.ndarray]],
        score: Callable[[Path], Scored],
        on_stage: Callable[[str], Any],
        on_progress: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._float = float_artifact
        self._work = work_dir
        self._quant = quantization
        self._inputs = inputs
        self._samples = samples
        self._score = score
        self._stage = on_stage
        self._progress = on_progress
        self._clock = clock
        self._durations: list[float] = []
        self._planned = 0
        self._op_types: dict[str, str] = {}
        self.attempts: list[QuantAttempt] = []
        self.hints: list[QuantAttempt] = []
        self.skip_search_note: str | None = None

    def _attempt(self, method: str, skip_ops: tuple[str, ...]) -> QuantAttempt:
        started = self._clock()
        try:
            return self._run_attempt(method, skip_ops)
        finally:
            self._durations.append(self._clock() - started)
            self._report(method, skip_ops)

    def _report(self, method: str, skip_ops: tuple[str, ...]) -> None:
        """Say how far the search is and how long the rest may take (at most)."""
        done = len(self._durations)
        left = max(self._planned - done, 0)
        kept = f", {_layers(len(skip_ops))} in float" if skip_ops else ""
        line = (
            f"int8 {self._quant.method}: run {done} of at most {max(self._planned, done)} "
            f"({method}{kept}) took {self._durations[-1]:.0f} s"
        )
        if left:
            estimate = left * sum(self._durations) / done
            line += f"; at most {left} more, about {_duration(estimate)} left"
        logger.info(line)
        if self._progress is not None:
            self._progress(line)

    def _run_attempt(self, method: str, skip_ops: tuple[str, ...]) -> QuantAttempt:
        path = self._work / f"int8-{len(self.attempts) + len(self.hints):02d}.mnn"
        try:
            with self._stage("quantize"):
                run = toolchain.quantize(
                    self._float,
                    path,
                    inputs=self._inputs,
                    samples=self._samples,
                    method=method,
                    weight_method=self._quant.weight_method,
                    skip_ops=skip_ops,
                )
        except BuildError as exc:
            return QuantAttempt(method, skip_ops, path, None, error=exc.message)
        used = run.config.get("feature_quantize_method_used", method)
        scored = self._score(path)
        return QuantAttempt(used, skip_ops, path, scored, layer_errors=run.layer_errors)

    def run(self) -> QuantAttempt:
        """Run the search and return the attempt to ship.

        Raises:
            BuildError: the quantizer failed on every method tried.
            GateError: no attempt passed (raised by the caller's gate stage
                with the best attempt's numbers; here the best is returned).
        """
        requested = self._quant.method
        methods = list(toolchain.FEATURE_METHODS_AUTO) if requested == "auto" else [requested]
        skip = tuple(self._quant.skip_ops)
        # The most runs the search may take: the methods, then the layer search
        # (auto) or the other methods measured for the hint (a fixed method).
        self._planned = len(methods) + (
            len(_skip_counts(self._quant.max_skip_ops, self._quant.max_skip_ops))
            if requested == "auto"
            else len(toolchain.FEATURE_METHODS_AUTO) - 1
        )
        for method in methods:
            self.attempts.append(self._attempt(method, skip))
        best = self._best(self.attempts)
        if requested == "auto" and (best is None or not best.passed):
            searched = self._skip_search()
            best = self._best([a for a in (best, searched) if a is not None])
        if requested != "auto" and (best is None or not best.passed):
            # Measure what another method would give before suggesting it.
            for method in toolchain.FEATURE_METHODS_AUTO:
                if method != requested:
                    self.hints.append(self._attempt(method, skip))
        if best is None:
            tried = self.attempts + self.hints
            errors = "; ".join(f"{a.method}: {a.error}" for a in tried if a.error)
            working = [a for a in self.hints if a.scored is not None]
            hint = (
                f'method = "{working[0].method}" quantizes (measured: '
                f'{attempt_outcome(working[0])}); or use method = "auto"'
                if working
                else "Every feature method failed: keep this tier on weight-only quantization "
                '(mode = "weight"), or keep the failing layers in float with skip_ops.'
            )
            which = "every method" if requested == "auto" else f"method {requested}"
            raise BuildError(
                f"the int8 quantizer failed with {which}: {errors}",
                stage="quantize",
                tool="mnnquant",
                hint=hint,
            )
        return best

    def _skip_search(self) -> QuantAttempt | None:
        """Keep the worst-measured layers in float: 1, 2, 4, ... up to ``max_skip_ops``.

        Only KL and ADMM honour ``skip_quant_op_names`` (MNN's EMA path ignores
        it, measured), and only they report per-layer error, so the search
        starts from the best of those. Layers are MNN op names, read from the
        float model, ranked by the lowest cosine the quantizer measured on
        their output.
        """
        bases = [a for a in self.attempts if a.scored is not None and a.method in ("KL", "ADMM")]
        base = self._best(bases)
        if base is None or not base.layer_errors or self._quant.max_skip_ops == 0:
            self.skip_search_note = (
                "no layer search: KL and ADMM produced no model with per-layer error "
                "(EMA ignores skip lists)"
                if base is None or not base.layer_errors
                else "no layer search: max_skip_ops = 0"
            )
            return None
        ranked = self._ranked_ops(base)
        best: QuantAttempt = base
        counts = _skip_counts(self._quant.max_skip_ops, len(ranked))
        self._planned = len(self.attempts) + len(counts)
        for count in counts:
            skip = (*base.skip_ops, *ranked[:count])
            attempt = self._attempt(base.method, skip)
            self.attempts.append(attempt)
            if attempt.passed:
                return attempt
            best = self._best([best, attempt]) or best
            # Only layers with weights are quantized: a shape op or an activation
            # kept in float (the ranking reads error where it shows) is no evidence.
            weighted = sum(1 for op in ranked[:count] if self._op_types.get(op) in WEIGHTED_OPS)
            if count < counts[-1] and weighted and attempt.scored and base.scored:
                why = out_of_reach(base.scored, attempt.scored, weighted, counts[-1] - count)
                if why is not None:
                    self.skip_search_note = (
                        f"layer search stopped at {count} of up to {counts[-1]} layers kept in "
                        f"float: {why}"
                    )
                    self._planned = len(self.attempts)
                    line = f"int8 auto: stopped after {len(self.attempts)} runs: {why}"
                    logger.info(line)
                    if self._progress is not None:
                        self._progress(line)
                    return best
        return best

    def _ranked_ops(self, base: QuantAttempt) -> list[str]:
        worst: dict[str, float] = {}
        found = toolchain.model_ops(self._float)
        self._op_types = {op.name: op.type for op in found}
        ops = [op.name for op in found]
        for layer in base.layer_errors:
            if layer.cosine != layer.cosine:  # NaN: not measured
                continue
            # MNN names ops after their output tensor; splits of it are "<op>_raster_N".
            op = next(
                (
                    name
                    for name in (layer.op, layer.tensor, layer.tensor.split("_raster_")[0])
                    if name in ops
                ),
                None,
            )
            if op is not None and op not in base.skip_ops:
                worst[op] = min(worst.get(op, 1.0), layer.cosine)
        order = {name: index for index, name in enumerate(ops)}
        return sorted(worst, key=lambda name: (worst[name], order[name]))

    @staticmethod
    def _best(attempts: list[QuantAttempt]) -> QuantAttempt | None:
        scored = [a for a in attempts if a.scored is not None]
        if not scored:
            return None
        # Passing first, then fewest failed gates, then the highest worst-output SNR;
        # ties keep the earlier attempt (the fixed method order).
        return max(
            scored,
            key=lambda a: (
                a.passed,
                -len(a.scored.gates.failures) if a.scored else 0,
                min((g.snr_db for g in a.scored.agreement.values()), default=0.0)
                if a.scored
                else 0.0,
            ),
        )

    def record_requested(self) -> str:
        """The method models.toml asks for (``auto`` or one method)."""
        return self._quant.method

    def record(self, chosen: QuantAttempt) -> dict[str, Any]:
        """The recipe chosen and every attempt, for provenance and metrics."""
        return {
            "method_requested": self._quant.method,
            "method": chosen.method,
            "skip_ops": list(chosen.skip_ops),
            "quantizer_runs": len(self.attempts) + len(self.hints),
            "attempts": [a.summary() for a in self.attempts],
            "measured_alternatives": [a.summary() for a in self.hints],
            "skip_search": self.skip_search_note,
        }


def _skip_counts(max_skip_ops: int, available: int) -> list[int]:
    """How many layers each run of the layer search keeps in float: 1, 2, 4, ..., the most."""
    most = min(max_skip_ops, available)
    counts: list[int] = []
    count = 1
    while count < most:
        counts.append(count)
        count *= 2
    if most > 0:
        counts.append(most)
    return list(dict.fromkeys(counts))


def _error_share(gate: GateResult) -> tuple[float, float] | None:
    """A failed agreement gate as (the error's share of the output, the share allowed).

    The noise-to-signal energy for ``min_snr_db``, ``1 - cosine`` for
    ``min_cosine``: shares that keeping a layer in float takes away from (its
    own error no longer adds to the output's). Task metrics have no such model.
    """
    if gate.name.startswith("min_snr_db["):
        return 10 ** (-gate.measured / 10), 10 ** (-gate.budget / 10)
    if gate.name.startswith("min_cosine["):
        return 1.0 - gate.measured, 1.0 - gate.budget
    return None


def out_of_reach(base: Scored, now: Scored, weighted: int, more_layers: int) -> str | None:
    """Why keeping ``more_layers`` more layers in float cannot pass, or None when it may.

    ``now`` kept ``weighted`` layers with weights in float and removed some of
    ``base``'s error. Layers are kept worst first, so the rest should each
    remove less; the bound lets each of them remove twice the average so far.
    When even that leaves an agreement gate failing, the search is over.
    """
    before = {g.name: g for g in base.gates.failures}
    for gate in now.gates.failures:
        share_allowed = _error_share(gate)
        earlier = before.get(gate.name)
        if share_allowed is None or earlier is None:
            continue
        then = _error_share(earlier)
        assert then is not None
        share, allowed = share_allowed
        removed = then[0] - share
        if share - 2 * max(removed, 0.0) / weighted * more_layers > allowed:
            kept = f"{_layers(weighted)} with weights in float"
            gained = (
                f"{kept} moved {gate.name} from {earlier.measured:.4g} to {gate.measured:.4g}"
                if removed > 0
                else f"{kept} did not improve {gate.name} ({earlier.measured:.4g} -> "
                f"{gate.measured:.4g})"
            )
            return (
                f"{gained}; even if each of the {more_layers} next layers did twice as much, "
                f"it would not reach {gate.budget:g}"
            )
    return None


def _layers(count: int) -> str:
    return f"{count} layer{'s' if count != 1 else ''}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def attempt_outcome(attempt: QuantAttempt) -> str:
    """What an attempt came to, in one line: its error, or its first failed gates."""
    if attempt.scored is None:
        return f"fails: {attempt.error}"
    if attempt.passed:
        return "passes every gate"
    return "; ".join(g.describe() for g in attempt.scored.gates.failures[:2])
