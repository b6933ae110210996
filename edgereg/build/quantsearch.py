"""Finding an int8 recipe that passes the gates: fixed methods, ``auto``, measured hints.

:class:`QuantSearch` runs the quantizer and scores each attempt with the
build's own verify and evaluate stages (passed in as ``score``), so an
attempt is judged exactly as the shipped artifact will be.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgereg import toolchain
from edgereg.build.quality import Scored
from edgereg.config import Int8Quantization
from edgereg.errors import BuildError


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
    the worst layers of the best attempt in float, one more at a time, up to
    ``max_skip_ops``. The same inputs give the same attempts in the same
    order, so the same recipe and the same bytes.

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
    ) -> None:
        self._float = float_artifact
        self._work = work_dir
        self._quant = quantization
        self._inputs = inputs
        self._samples = samples
        self._score = score
        self._stage = on_stage
        self.attempts: list[QuantAttempt] = []
        self.hints: list[QuantAttempt] = []
        self.skip_search_note: str | None = None

    def _attempt(self, method: str, skip_ops: tuple[str, ...]) -> QuantAttempt:
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
        counts: list[int] = []
        count = 1
        while count < min(self._quant.max_skip_ops, len(ranked)):
            counts.append(count)
            count *= 2
        counts.append(min(self._quant.max_skip_ops, len(ranked)))
        for count in dict.fromkeys(counts):
            skip = (*base.skip_ops, *ranked[:count])
            attempt = self._attempt(base.method, skip)
            self.attempts.append(attempt)
            if attempt.passed:
                return attempt
            best = self._best([best, attempt]) or best
        return best

    def _ranked_ops(self, base: QuantAttempt) -> list[str]:
        worst: dict[str, float] = {}
        ops = [op.name for op in toolchain.model_ops(self._float)]
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


def attempt_outcome(attempt: QuantAttempt) -> str:
    """What an attempt came to, in one line: its error, or its first failed gates."""
    if attempt.scored is None:
        return f"fails: {attempt.error}"
    if attempt.passed:
        return "passes every gate"
    return "; ".join(g.describe() for g in attempt.scored.gates.failures[:2])
