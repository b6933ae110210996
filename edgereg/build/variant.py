"""The build of one variant, stage by stage.

Each stage is a function with explicit inputs and outputs; :func:`build_variant`
chains them in a private work directory and moves the finished files into
``<out>/<model>/<variant>/`` only when every gate passed, so a failure never
leaves an artifact that looks good.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgereg import __version__, toolchain
from edgereg._files import sha256_file
from edgereg.build.datasets import Dataset, load_dataset, select_calibration
from edgereg.build.outputs import (
    ARTIFACT,
    CLASS_RECALL_PLOT,
    LATENCY_PLOT,
    METRICS,
    OUTPUT_FILES,
    PROVENANCE,
    variant_dir,
)
from edgereg.build.quality import (
    Agreement,
    Classification,
    GateReport,
    agreement,
    check_gates,
    classify,
    recall_drops,
)
from edgereg.config import Config, InputSpec, Int8Quantization, PinnedFile, WeightOnlyQuantization
from edgereg.errors import BuildError, ConfigError, GateError

#: Below this cosine similarity (float vs int8) a layer is named in the gate hint.
LAYER_COSINE_SUSPECT = 0.999


@dataclass(frozen=True)
class BenchSettings:
    """How hard the host benchmark works; fewer iterations for tests."""

    threads: tuple[int, ...] = (1, 2, 4)
    warmup: int = 5
    iterations: int = 50
    batch_size: int = 64


@dataclass
class BuildResult:
    """What a finished build wrote and measured."""

    out_dir: Path
    metrics: dict[str, Any]
    provenance: dict[str, Any]
    stage_seconds: dict[str, float] = field(default_factory=dict)


def resolve_pinned(config: Config, ref: PinnedFile, *, stage: str, what: str) -> Path:
    """Stage 1: find a pinned file and check its sha256."""
    path = config.resolve_path(ref)
    if not path.is_file():
        raise BuildError(
            f"{what} {path} not found",
            stage=stage,
            hint=f"Check the path in {config.path} (relative to that file).",
        )
    actual = sha256_file(path)
    if actual != ref.sha256:
        raise BuildError(
            f"{what} {path} has sha256 {actual}, but {config.path} pins {ref.sha256}",
            stage=stage,
            hint="If the file changed on purpose, update the sha256 pin; otherwise restore it.",
        )
    return path


def check_source(path: Path, inputs: list[InputSpec], output_names: list[str]) -> dict[str, Any]:
    """Stage 2: the ONNX is valid, matches the declared I/O and MNN converts every op."""
    report = toolchain.inspect_onnx(path)
    missing = toolchain.unsupported_ops(report)
    if missing:
        raise BuildError(
            f"{path} uses operators the MNN converter cannot convert: {', '.join(missing)}",
            stage="check",
            hint="Replace them in the model before export, or pin an MNN version that "
            "supports them.",
        )
    graph_inputs = {tensor.name: tensor for tensor in report.inputs}
    for spec in inputs:
        tensor = graph_inputs.get(spec.name)
        if tensor is None:
            raise BuildError(
                f"{path} has no input '{spec.name}' (inputs: {', '.join(graph_inputs)})",
                stage="check",
                hint="Fix the input names in models.toml.",
            )
        if len(tensor.shape) != len(spec.shape) or any(
            isinstance(dim, int) and dim != want
            for dim, want in zip(tensor.shape[1:], spec.shape[1:], strict=False)
        ):
            raise BuildError(
                f"{path} input '{spec.name}' has shape {list(tensor.shape)}, "
                f"models.toml declares {spec.shape}",
                stage="check",
            )
    graph_outputs = [tensor.name for tensor in report.outputs]
    for name in output_names:
        if name not in graph_outputs:
            raise BuildError(
                f"{path} has no output '{name}' (outputs: {', '.join(graph_outputs)})",
                stage="check",
            )
    return {
        "opsets": report.opsets,
        "op_types": report.op_types,
        "dynamic_batch": all(not isinstance(t.shape[0], int) for t in report.inputs),
    }


@contextmanager
def _timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = time.perf_counter() - start


def build_variant(
    config: Config,
    model_name: str,
    variant_name: str,
    out_root: Path,
    *,
    bench: BenchSettings | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build, verify, evaluate, gate and benchmark one variant.

    Raises:
        ConfigError: unknown model or variant.
        ToolchainError: the installed tools differ from ``[toolchain]``.
        BuildError: a stage failed; nothing is left in the output directory.
        GateError: the variant exceeds a budget; nothing is left either.
    """
    bench = bench or BenchSettings()
    model = config.models.get(model_name)
    if model is None:
        raise ConfigError(
            f"no model '{model_name}'; models: {', '.join(config.models)}", file=str(config.path)
        )
    variant = model.variants.get(variant_name)
    if variant is None:
        raise ConfigError(
            f"model '{model_name}' has no variant '{variant_name}'; variants: "
            f"{', '.join(model.variants)}",
            file=str(config.path),
        )
    recipe = config.recipe(model_name, variant_name)
    recipe_digest = config.recipe_digest(model_name, variant_name)
    inputs = variant.inputs or model.inputs
    input_names = [spec.name for spec in inputs]
    output_names = [spec.name for spec in model.outputs]
    classification = model.task == "classification"
    seconds: dict[str, float] = {}

    def stage(name: str) -> Any:
        if on_stage is not None:
            on_stage(name)
        return _timed(seconds, name)

    out_dir = variant_dir(out_root, model_name, variant_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:
        (out_dir / name).unlink(missing_ok=True)

    with stage("toolchain"):
        toolchain.check_versions(config.toolchain.as_dict())
    with stage("source"):
        source_ref = variant.source or model.source
        source = resolve_pinned(config, source_ref, stage="source", what="source")
        evaluation_ref = variant.evaluation or model.evaluation
        evaluation_path = resolve_pinned(
            config, evaluation_ref, stage="source", what="evaluation set"
        )
        calibration_ref = variant.calibration or model.calibration
        calibration_path = None
        if isinstance(variant.quantization, Int8Quantization):
            assert calibration_ref is not None  # enforced by the schema
            calibration_path = resolve_pinned(
                config, calibration_ref, stage="source", what="calibration set"
            )
    with stage("check"):
        graph = check_source(source, inputs, output_names)

    with tempfile.TemporaryDirectory(prefix=f".{variant_name}.", dir=out_dir.parent) as work:
        work_dir = Path(work)
        artifact = work_dir / ARTIFACT
        with stage("convert"):
            weight = variant.quantization
            convert_run = toolchain.convert(
                source,
                artifact,
                fp16=variant.precision == "fp16",
                weight_quant_bits=weight.bits
                if isinstance(weight, WeightOnlyQuantization)
                else None,
                weight_quant_block=weight.block
                if isinstance(weight, WeightOnlyQuantization)
                else None,
                weight_quant_asymmetric=(
                    weight.asymmetric if isinstance(weight, WeightOnlyQuantization) else True
                ),
                transformer_fuse=variant.converter.transformer_fuse,
                optimize_prefer=variant.converter.optimize_prefer,
                # Same inputs, same bytes: the random id becomes one derived
                # from the recipe. The quantizer keeps it (KL/ADMM) or writes
                # none (EMA). The verify stage loads the artifact anyway.
                uuid_seed=recipe_digest.encode(),
                check_load=False,
            )
        calibration_info: dict[str, Any] | None = None
        quantize_run: toolchain.ToolRun | None = None
        batch_size = bench.batch_size if graph["dynamic_batch"] else 1
        evaluation = load_dataset(
            evaluation_path, inputs, stage="evaluate", need_labels=classification
        )
        if isinstance(variant.quantization, Int8Quantization):
            assert calibration_ref is not None
            assert calibration_path is not None
            with stage("quantize"):
                calibration = load_dataset(
                    calibration_path, inputs, stage="quantize", need_labels=False
                )
                count = variant.quantization.samples or calibration_ref.samples
                selected = select_calibration(calibration, count, balanced=calibration_ref.balanced)
                float_artifact = work_dir / "float.mnn"
                artifact.rename(float_artifact)
                quantize_run = toolchain.quantize(
                    float_artifact,
                    artifact,
                    inputs=[toolchain.QuantInput(spec.name, list(spec.shape)) for spec in inputs],
                    samples=_samples(selected),
                    method=variant.quantization.method,
                    weight_method=variant.quantization.weight_method,
                    skip_ops=variant.quantization.skip_ops,
                )
                calibration_info = {
                    "path": calibration_ref.path,
                    "sha256": calibration_ref.sha256,
                    "samples": len(selected),
                    "balanced": calibration_ref.balanced and calibration.labels is not None,
                    "selected_sha256": selected.digest(),
                }
        mnn_uuid = convert_run.uuid

        with stage("verify"):
            reference = toolchain.run_onnx(
                source, evaluation.inputs, batch_size=batch_size, output_names=output_names
            )
            produced = toolchain.run_inference(
                artifact,
                evaluation.inputs,
                input_names=input_names,
                output_names=output_names,
                batch_size=batch_size,
            )
            agree = agreement(reference, produced, classification=classification)
        baseline = result = None
        with stage("evaluate"):
            if classification:
                assert evaluation.labels is not None
                logits = reference[output_names[0]]
                num_classes = int(logits.reshape(len(logits), -1).shape[1])
                baseline = classify(logits, evaluation.labels, num_classes)
                result = classify(produced[output_names[0]], evaluation.labels, num_classes)
        with stage("benchmark"):
            sample = {name: array[:1] for name, array in evaluation.inputs.items()}
            threads = tuple(sorted({*bench.threads, variant.runtime.threads}))
            timing = toolchain.benchmark(
                artifact,
                sample,
                input_names=input_names,
                output_names=output_names,
                threads=threads,
                warmup=bench.warmup,
                iterations=bench.iterations,
            )
        size_bytes = artifact.stat().st_size
        budgets = model.budgets.merged(variant.budgets)
        with stage("gate"):
            gates = check_gates(
                budgets,
                size_bytes=size_bytes,
                agreement=agree,
                gate_abs_error=variant.precision == "fp32" and variant.quantization.mode == "none",
                baseline=baseline,
                variant=result,
                latency_p50_ms=timing.latency_ms[variant.runtime.threads].p50,
                class_names=model.classes,
            )
        if not gates.passed:
            raise GateError(
                _gate_message(model_name, variant_name, gates),
                stage="gate",
                hint=_gate_hint(variant.quantization, gates, quantize_run),
            )

        artifact_sha = sha256_file(artifact)
        installed = toolchain.installed_versions()
        metrics = _metrics(model.classes, size_bytes, agree, baseline, result, timing, gates)
        provenance = {
            "edgereg": __version__,
            "model": model_name,
            "variant": variant_name,
            "tier": variant.tier,
            "source": {"path": source_ref.path, "sha256": source_ref.sha256, **graph},
            "calibration": calibration_info,
            "evaluation": {
                "path": evaluation_ref.path,
                "sha256": evaluation_ref.sha256,
                "samples": len(evaluation),
            },
            "toolchain": installed,
            "recipe": recipe,
            "recipe_sha256": recipe_digest,
            # Paths as models.toml names them: the work directory is random and
            # absolute paths differ per checkout, which would make provenance vary.
            "converter_argv": [
                {str(source.resolve()): source_ref.path, str(artifact.resolve()): ARTIFACT}.get(
                    arg, arg
                )
                for arg in convert_run.argv
            ],
            "mnn_uuid": mnn_uuid,
            # A newer runtime loads older models, not the reverse; the model
            # records the converter's version, which the toolchain check pinned.
            "min_mnn_runtime": installed["mnn"],
            "runtime": variant.runtime.model_dump(),
            "artifact": {"path": ARTIFACT, "sha256": artifact_sha, "size": size_bytes},
        }
        _write_json(work_dir / METRICS, metrics)
        _write_json(work_dir / PROVENANCE, provenance)
        _write_json(work_dir / CLASS_RECALL_PLOT, _recall_rows(baseline, result, model.classes))
        _write_json(
            work_dir / LATENCY_PLOT,
            [
                {"threads": n, "p50_ms": lat.p50, "p90_ms": lat.p90}
                for n, lat in sorted(timing.latency_ms.items())
            ],
        )
        # The artifact moves last: its presence means every other file is there.
        for name in (*OUTPUT_FILES[1:], ARTIFACT):
            os.replace(work_dir / name, out_dir / name)
    return BuildResult(
        out_dir=out_dir, metrics=metrics, provenance=provenance, stage_seconds=seconds
    )


def _samples(dataset: Dataset) -> list[dict[str, np.ndarray]]:
    return [
        {name: array[index : index + 1] for name, array in dataset.inputs.items()}
        for index in range(len(dataset))
    ]


def _metrics(
    class_names: list[str] | None,
    size_bytes: int,
    agree: Agreement,
    baseline: Classification | None,
    result: Classification | None,
    timing: Any,
    gates: GateReport,
) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "size_mb": round(size_bytes / 1e6, 6),
        "verify": {
            "max_abs_error": agree.max_abs_error,
            "min_cosine": agree.min_cosine,
            "mean_cosine": agree.mean_cosine,
        },
    }
    if agree.top1_agreement is not None:
        metrics["verify"]["top1_agreement"] = agree.top1_agreement
    if baseline is not None and result is not None:
        drops = recall_drops(baseline, result)
        worst_label = max(drops, key=lambda label: drops[label])
        metrics["accuracy"] = {
            "onnx": baseline.accuracy,
            "variant": result.accuracy,
            "change": result.accuracy - baseline.accuracy,
        }
        names = class_names or []
        metrics["class_recall"] = {
            "worst_change": -drops[worst_label] + 0.0,
            "worst_class": names[worst_label] if worst_label < len(names) else str(worst_label),
        }
    metrics["benchmark"] = {
        "load_ms": timing.load_ms,
        "peak_rss_mb": timing.peak_rss_mb,
        **{
            f"threads_{n}": {"p50_ms": lat.p50, "p90_ms": lat.p90}
            for n, lat in sorted(timing.latency_ms.items())
        },
    }
    metrics["gates"] = {result.name: result.passed for result in gates.results}
    return metrics


def _recall_rows(
    baseline: Classification | None, result: Classification | None, names: list[str] | None
) -> list[dict[str, Any]]:
    if baseline is None or result is None:
        return []
    names = names or []
    return [
        {
            "class": names[label] if label < len(names) else str(label),
            "onnx": recall,
            "variant": result.class_recall.get(label, 0.0),
            "change": result.class_recall.get(label, 0.0) - recall,
        }
        for label, recall in sorted(baseline.class_recall.items())
    ]


def _gate_message(model_name: str, variant_name: str, gates: GateReport) -> str:
    lines = [f"{model_name}/{variant_name} exceeds its budgets:"]
    for failure in gates.failures:
        detail = f" ({failure.detail})" if failure.detail else ""
        numbers = f"measured {failure.measured:.6g}, budget {failure.budget:.6g}"
        lines.append(f"  {failure.name}: {numbers}{detail}")
    return "\n".join(lines)


def _gate_hint(quantization: Any, gates: GateReport, quantize_run: toolchain.ToolRun | None) -> str:
    failed = {failure.name for failure in gates.failures}
    if isinstance(quantization, Int8Quantization) and failed & {
        "max_accuracy_drop",
        "max_class_recall_drop",
    }:
        lines = ["Int8 quantization lost accuracy."]
        measured = [
            layer
            for layer in (quantize_run.layer_errors if quantize_run else [])
            if layer.cosine == layer.cosine  # NaN: MNN could not measure the layer
        ]
        worst = [layer for layer in measured if layer.cosine < LAYER_COSINE_SUSPECT][:3]
        if worst:
            lines.append("Layers with the largest quantization error (cosine similarity):")
            lines += [f"  {layer.op}: {layer.cosine:.4f}" for layer in worst]
            names = ", ".join(f'"{layer.op}"' for layer in worst[:2])
            lines.append(f"Keep them in float: skip_ops = [{names}].")
        elif measured:
            # MNN measures layer error on the calibration samples themselves.
            lines.append(
                f"Every layer keeps a cosine similarity of at least {LAYER_COSINE_SUSPECT} on "
                "the calibration samples, yet accuracy dropped: the calibration set probably "
                "does not look like the evaluation data. Calibrate on more samples drawn "
                "like production data, covering every class (samples, balanced = true)."
            )
        other = "EMA" if quantization.method != "EMA" else "KL"
        lines.append(f'Or try method = "{other}".')
        return "\n".join(lines)
    if "max_size_mb" in failed:
        return 'Use weight-only quantization (mode = "weight") or int8 to make it smaller.'
    if "max_abs_error" in failed:
        return "The float conversion drifts from ONNX Runtime; check converter options."
    return "Raise the budget in models.toml only if the measured numbers are acceptable."


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def remove_outputs(out_dir: Path) -> None:
    """Delete a variant's outputs (used before a rebuild)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
