"""Whether what a tier serves fits its memory ceiling (``max_model_memory_mb``).

A tier serves one variant of each model (its own, or a lower tier's when it
has none: :meth:`Config.tier_variants`); a bundle's members load together, so
their peaks add up. The peak is the one the build measured
(:mod:`edgereg.build.memory`): the host's peak resident memory when this
checkout measured the artifact, else MNN's own accounting from metrics.json
(which DVC restores with the artifact). Light on purpose (no numpy, no MNN):
``edgereg validate`` and ``edgereg publish`` call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgereg.build.outputs import BUILT, FAILED, STALE, BuildOutputs, read_outputs
from edgereg.config import Config


@dataclass(frozen=True)
class MeasuredPeak:
    """A variant's measured peak memory and which measurement it is."""

    model: str
    variant: str
    mb: float
    source: str  # "host peak" or "MNN accounting"


def measured_peak(outputs: BuildOutputs, model: str, variant: str) -> MeasuredPeak | None:
    """The peak memory a variant's build measured, or None when it has none."""
    if outputs.status not in (BUILT, STALE, FAILED):
        return None
    host = outputs.host_benchmark
    peak = None if host is None else host.figure("memory_peak_mb")
    if peak is not None and peak > 0:
        return MeasuredPeak(model, variant, float(peak), "host peak")
    memory = outputs.metrics.get("memory")
    if isinstance(memory, dict) and memory.get("measured") is True:
        runtime = memory.get("runtime_mb")
        if isinstance(runtime, (int, float)) and not isinstance(runtime, bool) and runtime > 0:
            return MeasuredPeak(model, variant, float(runtime), "MNN accounting")
    return None


def unit_models(config: Config, unit: str) -> list[str]:
    """The models a publishable unit loads together: a bundle's members, or the model."""
    bundle = config.bundles.get(unit)
    return list(bundle.models) if bundle is not None else [unit]


def ceiling_problems(
    config: Config, unit: str, out_root: Path, *, require_measured: bool
) -> list[str]:
    """What breaks a tier's ``max_model_memory_mb`` when ``unit`` ships; empty when it fits.

    Args:
        unit: A model or a bundle.
        require_measured: A variant without a measured peak is a problem
            (publish); otherwise that tier is not checked (validate, before a build).
    """
    models = unit_models(config, unit)
    problems = []
    for tier, rules in config.tiers.items():
        ceiling = rules.max_model_memory_mb
        if ceiling is None:
            continue
        peaks: list[MeasuredPeak] = []
        missing: list[str] = []
        for model in models:
            variant, _ = config.tier_variants(model)[tier]
            outputs = read_outputs(config, model, variant, out_root)
            peak = measured_peak(outputs, model, variant)
            if peak is None:
                missing.append(f"{model}/{variant}")
            else:
                peaks.append(peak)
        if missing:
            if require_measured:
                problems.append(
                    f"tier {tier}: max_model_memory_mb {ceiling:g} MB, but "
                    f"{', '.join(missing)} has no measured memory: rebuild it (`dvc repro`, or "
                    "`edgereg build MODEL VARIANT`)"
                )
            continue
        total = sum(peak.mb for peak in peaks)
        if total <= ceiling:
            continue
        if len(peaks) == 1:
            (peak,) = peaks
            line = (
                f"tier {tier}: {peak.model}/{peak.variant} peak memory {peak.mb:.1f} MB "
                f"({peak.source}) > the tier's max_model_memory_mb {ceiling:g} MB"
            )
            line += _smallest(config, peak.model, out_root, ceiling)
        else:
            parts = " + ".join(f"{p.model}/{p.variant} {p.mb:.1f} MB" for p in peaks)
            line = (
                f"tier {tier}: bundle {unit}'s members load together: {parts} = {total:.1f} MB "
                f"> the tier's max_model_memory_mb {ceiling:g} MB"
            )
        problems.append(line)
    return problems


def _smallest(config: Config, model: str, out_root: Path, ceiling: float) -> str:
    """When no variant of ``model`` fits ``ceiling``, say which comes closest."""
    peaks = [
        peak
        for name in config.models[model].variants
        if (peak := measured_peak(read_outputs(config, model, name, out_root), model, name))
        is not None
    ]
    if not peaks or any(peak.mb <= ceiling for peak in peaks):
        return ""
    best = min(peaks, key=lambda peak: peak.mb)
    return (
        f"; no variant of {model} fits it (smallest measured peak: {best.variant} "
        f"{best.mb:.1f} MB): give the tier a smaller variant, or raise the ceiling"
    )


def ceiling_lines(config: Config, out_root: Path) -> list[str]:
    """Per tier with a ceiling and model it refuses a variant of: what it serves, what it refuses.

    What ``edgereg summary`` prints under its table, so a tier's ceiling shows
    doing its job: ``tier low (max_model_memory_mb 40): segment serves small
    (12.3 MB host peak); refuses fp16 58.1 MB, int8 44.0 MB``. Only variants
    with a measured peak are named.
    """
    lines = []
    for tier, rules in config.tiers.items():
        ceiling = rules.max_model_memory_mb
        if ceiling is None:
            continue
        for model in config.models:
            served, _ = config.tier_variants(model)[tier]
            peaks = {
                name: peak
                for name in config.models[model].variants
                if (peak := measured_peak(read_outputs(config, model, name, out_root), model, name))
                is not None
            }
            over = [f"{name} {peak.mb:.1f} MB" for name, peak in peaks.items() if peak.mb > ceiling]
            if not over:
                continue  # nothing refused: the ceiling changes nothing for this model
            own = peaks.get(served)
            line = f"tier {tier} (max_model_memory_mb {ceiling:g}): {model} serves {served}"
            line += (
                " (not measured)"
                if own is None
                else f" ({own.mb:.1f} MB {own.source}{', OVER' if own.mb > ceiling else ''})"
            )
            if over:
                line += f"; refuses {', '.join(over)}"
            lines.append(line)
    return lines


def every_unit(config: Config) -> list[str]:
    """Every publishable unit: models that ship alone, then bundles."""
    alone = [name for name in config.models if config.bundle_of(name) is None]
    return [*alone, *config.bundles]
