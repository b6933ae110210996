"""The build of one variant, stage by stage.

Each stage is a function with explicit inputs and outputs; :func:`build_variant`
chains them in a private work directory and moves the finished files into
``<out>/<model>/<variant>/`` only when every gate passed, so a failure never
leaves an artifact that looks good.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
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
from edgereg.build import memory
from edgereg.build import threads as host_threads
from edgereg.build.arm import ARM_CACHE, ArmRunner, arm_stage
from edgereg.build.contract import control_flow_subgraphs, io_contract, labels_blob
from edgereg.build.datasets import load_dataset, select_calibration
from edgereg.build.evaluate import (
    TaskEvaluator,
    benchmark_sample,
    calibration_samples,
    prove_runtime,
    reference_outputs,
)
from edgereg.build.outputs import (
    ARTIFACT,
    CLASS_RECALL_PLOT,
    CONTRACT,
    HOST_BENCHMARK,
    LABELS,
    METRICS,
    OUTPUT_FILES,
    PROBE,
    PROBE_DATA,
    PROVENANCE,
    HostBenchmark,
    ThreadLatency,
    probe_input_bytes,
    variant_dir,
    writes_probe_data,
)
from edgereg.build.probe import (
    check_client_limits,
    check_on_host,
    golden_probe,
    probe_bytes,
    select_probe_rows,
    split_probe,
)
from edgereg.build.quality import (
    DEFAULT_AGREEMENT,
    GateReport,
    OutputAgreement,
    Scored,
    agreement,
    check_gates,
    effective_budgets,
)
from edgereg.build.quantsearch import QuantSearch
from edgereg.build.sizes import explain_size
from edgereg.build.threads import SweepPolicy, sweep_counts
from edgereg.config import (
    Budgets,
    Config,
    CtcTask,
    InputSpec,
    Int8Quantization,
    PinnedFile,
    Variant,
    WeightOnlyQuantization,
    arm_classes,
)
from edgereg.errors import BuildError, ConfigError, EdgeregError, GateError
from edgereg.tasks import PrecisionClass
from edgereg.tasks.ctc_eval import read_charset
from edgereg.tasks.scoring import TaskDataError, TaskScores
from edgereg.toolchain import arm as arm_toolchain
from edgereg.toolchain.arm import arm_dir
from edgereg.toolchain.runtimes import find_runtime, runtimes_dir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchSettings:
    """How hard the host benchmark works; fewer iterations for tests."""

    #: Thread counts the host sweep compares with the declared one; None: 1 up to
    #: the tier's cores, capped by the host's.
    threads: tuple[int, ...] | None = None
    #: The host thread sweep's budget and stopping rule; None runs no sweep.
    sweep: SweepPolicy | None = field(default_factory=SweepPolicy)
    warmup: int = 5
    iterations: int = 50
    batch_size: int = 64
    #: Steady runs of the fresh-process memory measurement (after ``warmup``).
    memory_iterations: int = 10
    #: Fresh loads whose median the latency budgets judge (only when one is set).
    latency_loads: int = 5


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


def check_tools(config: Config, model_name: str, variant_name: str, *, arm: bool = True) -> None:
    """The toolchain stage: every installed tool a later stage of this variant needs.

    The old MNN runtime of ``min_mnn_runtime`` (the runtime proof), and for
    a variant verified on ARM classes the emulator and the aarch64 sysroot:
    each is only looked up (no process starts), so a missing one fails in
    well under a second instead of after convert, verify and benchmark.

    Args:
        arm: Check the emulator and sysroot (not when a test supplies its own runner).

    Raises:
        RuntimeProofError: (stage ``toolchain``) the runtime is not installed.
        ArmError: (stage ``toolchain``) QEMU or the sysroot is not installed.
    """
    needed: list[Callable[[], object]] = []
    version = config.resolve(model_name, variant_name).min_mnn_runtime
    if version != toolchain.installed_version("mnn"):
        needed.append(lambda: find_runtime(version, root=runtimes_dir()))
    if arm and arm_classes(config, model_name, variant_name):
        needed.append(arm_toolchain.qemu_path)
        needed.append(lambda: arm_toolchain.find_sysroot(config.toolchain.mnn, root=arm_dir()))
    for check in needed:
        try:
            check()
        except BuildError as exc:
            # The same error, found before the stage that needs the tool: say when.
            exc.stage = "toolchain"
            raise


def check_source(
    path: Path,
    inputs: list[InputSpec],
    output_names: list[str],
    report: toolchain.OnnxReport | None = None,
) -> dict[str, Any]:
    """Stage 2: the ONNX is valid, matches the declared I/O and MNN converts every op.

    ``report`` is :func:`edgereg.toolchain.inspect_onnx` of ``path`` when the caller has it.
    """
    report = report or toolchain.inspect_onnx(path)
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
            isinstance(dim, int) and dim != want and axis != spec.batch
            for axis, (dim, want) in enumerate(zip(tensor.shape, spec.shape, strict=False))
        ):
            raise BuildError(
                f"{path} input '{spec.name}' has shape {list(tensor.shape)}, "
                f"models.toml declares {spec.shape}",
                stage="check",
                hint="Declare the shape one sample is fed with (dynamic axes at the size the "
                "app uses); batch_axis names the axis of size 1 that is the batch, or "
                '"none".',
            )
        if tensor.dtype != spec.dtype and tensor.dtype in _INPUT_DTYPES:
            raise BuildError(
                f"{path} input '{spec.name}' is {tensor.dtype}, models.toml declares "
                f'dtype = "{spec.dtype}"',
                stage="check",
                hint=f'Set dtype = "{tensor.dtype}" for this input.',
            )
        if tensor.dtype not in _INPUT_DTYPES:
            raise BuildError(
                f"{path} input '{spec.name}' is {tensor.dtype}; MNN models take "
                f"{', '.join(_INPUT_DTYPES)} inputs",
                stage="check",
                hint="Re-export the model with a supported input type (cast inside the graph).",
            )
    declared = {spec.name for spec in inputs}
    undeclared = [name for name in graph_inputs if name not in declared]
    if undeclared:
        raise BuildError(
            f"{path} has inputs that models.toml does not declare: {', '.join(undeclared)}",
            stage="check",
            hint="Declare every graph input in [[models.<name>.inputs]] (state inputs too).",
        )
    graph_outputs = [tensor.name for tensor in report.outputs]
    for name in output_names:
        if name not in graph_outputs:
            raise BuildError(
                f"{path} has no output '{name}' (outputs: {', '.join(graph_outputs)})",
                stage="check",
            )
    batchable = [spec for spec in inputs if spec.batch is not None]
    return {
        "opsets": report.opsets,
        "op_types": report.op_types,
        "dynamic_batch": bool(batchable)
        and all(
            not isinstance(graph_inputs[spec.name].shape[spec.batch or 0], int)
            for spec in batchable
        ),
    }


_INPUT_DTYPES = ("float32", "int32", "int64", "uint8")


@contextmanager
def _timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        # A search runs some stages more than once: the stage's total counts.
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - start


def build_variant(
    config: Config,
    model_name: str,
    variant_name: str,
    out_root: Path,
    *,
    bench: BenchSettings | None = None,
    on_stage: Callable[[str], None] | None = None,
    arm_runner: ArmRunner | None = None,
) -> BuildResult:
    """Build, verify, evaluate, gate and benchmark one variant.

    A variant that fails leaves no artifact, and a ``metrics.json`` with
    ``"status": "failed"``: every stage that ran (``stages``), the failing
    stage and its message (``error``), and every number measured before it (a
    gate's failure holds them all).

    Raises:
        ConfigError: unknown model or variant.
        ToolchainError: the installed tools differ from ``[toolchain]``.
        BuildError: a stage failed; only its failure record is left.
        GateError: the variant exceeds a budget; only its metrics are left.
    """
    progress = _Progress()
    try:
        return _build_variant(
            config,
            model_name,
            variant_name,
            out_root,
            bench=bench,
            on_stage=on_stage,
            arm_runner=arm_runner,
            progress=progress,
        )
    except Exception as exc:
        if progress.stages:  # past the model and variant lookup: out_dir is the variant's
            _record_failure(
                variant_dir(out_root, model_name, variant_name),
                progress,
                exc,
                config.recipe_digest(model_name, variant_name),
            )
        raise


@dataclass
class _Progress:
    """What a build did so far: its failure record, should a stage fail."""

    #: Stages in the order they first ran.
    stages: list[str] = field(default_factory=list)
    #: The metrics.json keys measured so far (agreement, task metrics, size, memory).
    numbers: dict[str, Any] = field(default_factory=dict)
    #: The host figures, once the benchmark ran.
    host: HostBenchmark | None = None

    def ran(self, name: str) -> None:
        if name not in self.stages:
            self.stages.append(name)


def _record_failure(out_dir: Path, progress: _Progress, exc: BaseException, recipe: str) -> None:
    """Write (or complete) the failed variant's metrics.json: stages, failing stage, message.

    A gate's or the quantizer's failure has written its numbers already; it
    gains ``stages`` and ``error``. Any other failure keeps what was measured
    before it. Never raises: the original error is what the user must see.
    """
    stage = exc.stage if isinstance(exc, BuildError) else progress.stages[-1]
    if isinstance(exc, EdgeregError):
        message = exc.message
    else:  # a bug, not the user's input: still, the stages and numbers stay
        message = f"internal error: {type(exc).__name__}: {exc}"
    failure: dict[str, Any] = {"stage": stage, "message": message}
    if isinstance(exc, BuildError):
        failure.update(
            {k: v for k, v in (("tool", exc.tool), ("exit_status", exc.exit_status)) if v}
        )
    try:
        written = json.loads((out_dir / METRICS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        written = None
    if isinstance(written, dict) and written.get("status") == "failed":
        record = written
    else:
        kept = {k: v for k, v in progress.numbers.items() if k not in ("status", "failed", "hint")}
        record = {
            "status": "failed",
            **kept,
            "failed": [f"stage {stage}: {message.splitlines()[0] if message else stage}"],
            "hint": getattr(exc, "hint", None),
        }
    record.update(recipe_sha256=recipe, stages=list(progress.stages), error=failure)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / ARTIFACT).unlink(missing_ok=True)
        _write_json(out_dir / METRICS, record)
        if progress.host is not None and not (out_dir / HOST_BENCHMARK).exists():
            _write_json(out_dir / HOST_BENCHMARK, progress.host.to_json())
    except OSError as write_error:
        logger.warning("could not write the failure record %s: %s", out_dir / METRICS, write_error)


def _build_variant(
    config: Config,
    model_name: str,
    variant_name: str,
    out_root: Path,
    *,
    bench: BenchSettings | None,
    on_stage: Callable[[str], None] | None,
    arm_runner: ArmRunner | None,
    progress: _Progress,
) -> BuildResult:
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
    resolved = config.resolve(model_name, variant_name)
    inputs = list(resolved.inputs)
    output_names = [spec.name for spec in model.outputs]
    state = [(pair.input, pair.output) for pair in model.state]
    state_outputs = {pair.output for pair in model.state}
    seconds: dict[str, float] = {}

    def stage(name: str) -> Any:
        progress.ran(name)
        if on_stage is not None:
            on_stage(name)
        return _timed(seconds, name)

    out_dir = variant_dir(out_root, model_name, variant_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:
        (out_dir / name).unlink(missing_ok=True)

    with stage("toolchain"):
        toolchain.check_versions(config.toolchain.as_dict())
        check_tools(config, model_name, variant_name, arm=arm_runner is None)
    with stage("source"):
        source = resolve_pinned(config, resolved.source, stage="source", what="source")
        evaluation_path = resolve_pinned(
            config, resolved.evaluation, stage="source", what="evaluation set"
        )
        calibration_ref = resolved.calibration
        calibration_path = None
        if calibration_ref is not None:
            calibration_path = resolve_pinned(
                config, calibration_ref, stage="source", what="calibration set"
            )
        charset = _charset(config, model.task)
    with stage("check"):
        onnx_report = toolchain.inspect_onnx(source)
        graph = check_source(source, inputs, output_names, onnx_report)
        # The probe carries one sample at least: a sample no client holds stops here,
        # before any work, not at the last stage.
        if writes_probe_data(model, inputs):
            sample_bytes = probe_input_bytes(model, inputs)
            check_client_limits(
                model_bytes=0,
                probe_bytes=0,
                probe_data_bytes=sample_bytes,
                input_bytes=sample_bytes,
            )
    with stage("contract"):
        built_contract = io_contract(model_name, model, resolved, onnx_report, charset=charset)
    feeds = [
        toolchain.InputFeed(spec.name, spec.dtype, tuple(spec.shape), spec.batch) for spec in inputs
    ]
    batch_size = bench.batch_size if graph["dynamic_batch"] and not state else 1
    evaluation = load_dataset(
        evaluation_path,
        inputs,
        stage="evaluate",
        need_labels=type(model.task).NEEDS_LABELS,
        state_inputs=[pair[0] for pair in state],
    )
    evaluator = TaskEvaluator(config, model, charset, evaluation)
    precision = precision_class(variant)
    progress.numbers = {"task": model.task.kind, "precision": precision}
    declared = resolved.budgets

    def budgets() -> Budgets:
        # A custom evaluator declares its gates, and a classifier's chance level is
        # known, once the evaluator has run.
        return effective_budgets(model.task.kind, precision, declared, evaluator.derived_gates)

    with stage("reference"):
        reference = reference_outputs(
            out_root,
            source,
            resolved.source.sha256,
            evaluation,
            resolved.evaluation.sha256,
            feeds,
            output_names,
            state,
            batch_size,
        )
        evaluator.check_reference(reference.outputs)
    app_outputs = [name for name in output_names if name not in state_outputs]
    probe_rows = select_probe_rows(
        evaluation, feeds, state, {name: reference.outputs[name] for name in app_outputs}
    )
    # Per scored artifact, its outputs at the probe's rows: the "re-run" the probe's
    # tolerance is measured against (batched, unlike the probe's own run).
    rerun_at_probe: dict[Path, dict[str, Any]] = {}

    def score(artifact: Path) -> Scored:
        with stage("verify"):
            produced = toolchain.run_inference(
                artifact,
                evaluation.inputs,
                feeds=feeds,
                output_names=output_names,
                state=state,
                sequences=evaluation.sequences,
                batch_size=batch_size,
            )
            gated = {n: v for n, v in reference.outputs.items() if n not in state_outputs}
            agree = agreement(gated, {n: produced[n] for n in gated})
            rerun_at_probe[artifact.resolve()] = {
                name: produced[name][probe_rows.rows] for name in app_outputs
            }
        with stage("evaluate"):
            scores = evaluator.scores(reference.outputs, produced)
        size_bytes = artifact.stat().st_size
        gates = _gates(budgets(), size_bytes, agree, scores, None, declared)
        return Scored(agree, scores, gates, size_bytes)

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
                target_version=config.toolchain.mnn_target_version,
                # Same inputs, same bytes: the random id becomes one derived
                # from the recipe. The quantizer keeps it (KL/ADMM) or writes
                # none (EMA). The verify stage loads the artifact anyway.
                uuid_seed=recipe_digest.encode(),
                check_load=False,
            )
        calibration_info: dict[str, Any] | None = None
        quant_record: dict[str, Any] | None = None
        if isinstance(variant.quantization, Int8Quantization):
            # The schema gives every int8 variant a calibration set (resolve).
            assert calibration_ref is not None
            assert calibration_path is not None
            with stage("quantize"):
                calibration = load_dataset(
                    calibration_path,
                    inputs,
                    stage="quantize",
                    need_labels=False,
                    state_inputs=[pair[0] for pair in state],
                )
                count = variant.quantization.samples or calibration_ref.samples
                selected = select_calibration(calibration, count, balanced=calibration_ref.balanced)
                samples = calibration_samples(source, selected, feeds, output_names, state)
                float_artifact = work_dir / "float.mnn"
                artifact.rename(float_artifact)
                calibration_info = {
                    "path": calibration_ref.path,
                    "sha256": calibration_ref.sha256,
                    "samples": len(selected),
                    "balanced": calibration_ref.balanced
                    and selected.labels is not None
                    and selected.labels.ndim == 1,
                    "selected_sha256": selected.digest(),
                }
            search = QuantSearch(
                float_artifact,
                work_dir,
                quantization=variant.quantization,
                inputs=[toolchain.QuantInput(f.name, list(f.shape)) for f in feeds],
                samples=samples,
                score=score,
                on_stage=stage,
                on_progress=on_stage,
            )
            try:
                chosen = search.run()
            except BuildError as exc:
                if exc.stage != "quantize" or isinstance(exc, GateError):
                    raise  # a verify or evaluate failure of a quantized model is its own
                # A crashed quantizer is a failed variant like a failed gate: its
                # metrics.json says what was tried, so summary, report and publish
                # say "quantizer crashed" instead of "not built".
                failure = _quantizer_failure(
                    exc,
                    search,
                    model.task.kind,
                    precision,
                    recipe_digest,
                    onnx_report,
                    float_artifact,
                )
                _write_json(out_dir / METRICS, failure)
                raise BuildError(
                    exc.message,
                    stage=exc.stage,
                    tool=exc.tool,
                    exit_status=exc.exit_status,
                    output_tail=exc.output_tail,
                    hint=failure["hint"],
                ) from exc
            assert chosen.scored is not None  # run() returns a scored attempt or raises
            rerun_at_probe[artifact.resolve()] = rerun_at_probe[chosen.path.resolve()]
            os.replace(chosen.path, artifact)
            scored = chosen.scored
            quant_record = search.record(chosen)
        else:
            scored = score(artifact)
        progress.numbers = _metrics(model.task.kind, precision, scored, scored.gates, quant_record)
        with stage("contract"):
            # An LSTM's While (an If, a Loop): only MNN's Module API runs the artifact.
            # The contract says so, and an app whose runner calls the session API
            # refuses it before download (docs/protocol.md section 7, rule (f)).
            subgraphs = control_flow_subgraphs(artifact, onnx_report)
        api = "module" if subgraphs else "session"
        if subgraphs:
            module_contract = built_contract.contract.model_copy(update={"mnn_api": "module"})
            built_contract = dataclasses.replace(built_contract, contract=module_contract)
        memory_needed = _memory_budgets(config, variant, budgets())
        if subgraphs and memory_needed:
            raise BuildError(
                f"{' and '.join(memory_needed)} is set, but the memory of "
                f"{model_name}/{variant_name} cannot be measured: its control-flow subgraphs "
                f"({', '.join(subgraphs)}) run only through MNN's Module API, and the memory "
                "stage reads MNN's session accounting, which cannot run them",
                stage="memory",
                hint="Remove the memory budget for this variant, or export the model without "
                "control flow (an LSTM converted with its original RNN kernels).",
            )
        with stage("size"):
            size_record = explain_size(
                artifact, source, precision, float_artifact if quant_record else None
            )
            if size_record.get("note"):
                logger.warning("%s/%s: %s", model_name, variant_name, size_record.get("note"))
            progress.numbers["size"] = size_record
        with stage("benchmark"):
            sample = benchmark_sample(feeds, evaluation, state)
            tier_cores = config.tiers[variant.tier].min_cpu_cores
            swept = bench.threads or sweep_counts(tier_cores)
            timing = toolchain.benchmark(
                artifact,
                sample,
                input_names=[f.name for f in feeds],
                output_names=output_names,
                # The variant's own count: what the gates judge and what ships.
                threads=(variant.runtime.threads,),
                warmup=bench.warmup,
                iterations=bench.iterations,
                # Measured first in the same fresh child: no second process start.
                # Not for a Module-API artifact: a session cannot run it (said below).
                memory=None
                if subgraphs
                else toolchain.MemorySettings(
                    threads=variant.runtime.threads,
                    warmup=bench.warmup,
                    iterations=bench.memory_iterations,
                ),
                # Then, in the same child, the host sweep: its budget is a share
                # of this build's seconds so far (edgereg/build/threads.py).
                sweep=None
                if bench.sweep is None
                else {
                    "counts": sorted({*swept, variant.runtime.threads}),
                    "prior_seconds": sum(seconds.values()),
                    "policy": bench.sweep.to_json(),
                },
            )
            if subgraphs:
                memory_outcome = memory.MemoryOutcome(
                    None,
                    {f.name: [int(d) for d in np.shape(sample[f.name])] for f in feeds},
                    problem="not measured: its control-flow subgraphs "
                    f"({', '.join(subgraphs)}) run only through MNN's Module API, and the "
                    "memory stage reads MNN's session accounting, which cannot run them",
                )
            else:
                memory_outcome = memory.outcome_of(timing, sample, feeds, required_by=memory_needed)
            progress.numbers["memory"] = memory.metrics_record(memory_outcome)
            loads = None
            if memory_outcome.measurement is not None and (
                budgets().max_first_inference_ms is not None
                or budgets().max_latency_p50_ms is not None
            ):
                # One load's timing measures the machine's load as much as the model.
                loads = memory.fresh_loads(
                    artifact,
                    sample,
                    feeds,
                    memory_outcome.measurement,
                    count=bench.latency_loads,
                    warmup=bench.warmup,
                    iterations=bench.memory_iterations,
                )
        with stage("gate"):
            gates = _gates(
                budgets(),
                scored.size_bytes,
                scored.agreement,
                scored.scores,
                timing.latency_ms[variant.runtime.threads].p50
                if loads is None
                else loads.steady_p50_ms,
                declared,
                None if loads is None else loads.describe_steady(),
            )
            gates = memory.add_gates(
                gates,
                max_memory_mb=budgets().max_memory_mb,
                max_first_inference_ms=budgets().max_first_inference_ms,
                outcome=memory_outcome,
                loads=loads,
            )
        metrics = _metrics(model.task.kind, precision, scored, gates, quant_record)
        # Lets summary and report tell a failure of this recipe from an old one.
        metrics["recipe_sha256"] = recipe_digest
        metrics["memory"] = memory.metrics_record(memory_outcome)
        # The MNN API the entry tells the app to use; the probe stage runs it so.
        metrics["mnn_api"] = {"api": api, "subgraphs": subgraphs}
        metrics["size"] = size_record
        # What ships as the thread hint. The host sweep's figures are not here
        # (their timings differ on every run): host-benchmark.json holds them.
        metrics["threads"] = {
            "shipped": variant.runtime.threads,
            "from": "models.toml" if "threads" in variant.runtime.model_fields_set else "default",
            "host_sweep": f"{HOST_BENCHMARK} host_threads: {host_threads.LABEL}",
        }
        artifact_sha = sha256_file(artifact)
        host = _host_benchmark(
            timing,
            artifact_sha=artifact_sha,
            recipe_sha=recipe_digest,
            session={
                **memory.host_record(memory_outcome.measurement, bench.warmup),
                **({} if loads is None else loads.host_record()),
            },
            threads=_sweep_record(timing, bench.sweep, variant.runtime.threads, tier_cores),
        )
        # The same dict: the ARM stage adds its classes to it.
        progress.numbers, progress.host = metrics, host
        if not gates.passed:
            failed_names = {f.name for f in gates.failures}
            first = []
            if "max_memory_mb" in failed_names:
                first.append(memory.gate_hint(memory_outcome, scored.size_bytes, precision))
            if "max_size_mb" in failed_names and size_record.get("note"):
                first.append(str(size_record.get("note")))
            hint = _gate_hint(variant, gates, quant_record, [line for line in first if line])
            # The fix-it text travels with the numbers: summary and report show it.
            metrics["hint"] = hint
            _write_json(out_dir / METRICS, metrics)
            _write_json(out_dir / HOST_BENCHMARK, host.to_json())
            raise GateError(_gate_message(model_name, variant_name, gates), stage="gate", hint=hint)

        def write_failed() -> None:
            _write_json(out_dir / METRICS, metrics)
            _write_json(out_dir / HOST_BENCHMARK, host.to_json())

        with stage("arm"):
            # MNN's ARM kernels per CPU class (edgereg/build/arm.py): a class that
            # fails writes the numbers into metrics.json and raises GateError.
            arm_stage(
                config=config,
                model_name=model_name,
                variant_name=variant_name,
                artifact=artifact,
                artifact_sha=artifact_sha,
                feeds=feeds,
                output_names=output_names,
                gated_outputs=app_outputs,
                evaluation=evaluation,
                reference=reference,
                probe_rows=probe_rows.rows,
                budgets=budgets(),
                score_task=lambda subset, ref, out: TaskEvaluator(
                    config, model, charset, subset
                ).scores(ref, out),
                cache_dir=out_root / ARM_CACHE,
                metrics=metrics,
                write_failure=write_failed,
                runner=arm_runner,
            )

        with stage("runtime"):
            proof = prove_runtime(
                artifact,
                resolved.min_mnn_runtime,
                feeds,
                output_names,
                evaluation,
                reference,
                state,
                mode=variant.quantization.mode,
                root=runtimes_dir(),
            )
        with stage("probe"):
            cosine_budget = budgets().min_cosine
            probe = golden_probe(
                model_name=model_name,
                variant_name=variant_name,
                artifact=artifact,
                artifact_sha256=artifact_sha,
                evaluation=evaluation,
                selection=probe_rows,
                feeds=feeds,
                output_names=output_names,
                state=state,
                rerun=rerun_at_probe[artifact.resolve()],
                budget_min_cosine=DEFAULT_AGREEMENT[precision][0]
                if cosine_budget is None
                else cosine_budget,
                variant_max_abs_error=max(
                    (a.max_abs_error for a in scored.agreement.values()), default=0.0
                ),
            )
            tensor_data = None
            if writes_probe_data(model, inputs):
                # One sample is too large to inline: its bytes go in a blob beside it.
                probe, tensor_data = split_probe(probe)
            probe_data = probe_bytes(probe)
            check_client_limits(
                model_bytes=scored.size_bytes,
                probe_bytes=len(probe_data),
                probe_data_bytes=None if tensor_data is None else len(tensor_data),
                input_bytes=probe_input_bytes(model, inputs),
            )
            # The client's own self-test, on this host's CPU: a variant every
            # device would refuse (a state zero-filled with the wrong shape)
            # fails here, not on the fleet.
            # Through the MNN API the entry tells the app to use: MNN's session API
            # (MNN's Android Java API, most iOS code) unless the contract says module.
            verdict = check_on_host(
                artifact, probe, built_contract.contract, data=tensor_data, api=api
            )
            if not verdict.passed:
                raise BuildError(
                    f"{model_name}/{variant_name}: the reference client's self-test refuses "
                    f"this variant on the host CPU through MNN's {api} API: {verdict.failure}",
                    stage="probe",
                    hint="Every device would refuse it too. Check the contract's input shapes "
                    "in models.toml (a state input's shape with its batch axis 1, as the "
                    "build feeds it) and the model's dynamic axes."
                    + (
                        " If MNN's session API cannot shape the model (a control-flow "
                        "subgraph the build did not find), run it through the Module API."
                        if api == "session"
                        else ""
                    ),
                )
            (work_dir / PROBE).write_bytes(probe_data)
            if tensor_data is not None:
                (work_dir / PROBE_DATA).write_bytes(tensor_data)
            _write_json(work_dir / CONTRACT, built_contract.contract.model_dump(mode="json"))
            if built_contract.labels is not None:
                (work_dir / LABELS).write_bytes(labels_blob(built_contract.labels))
        installed = toolchain.installed_versions()
        provenance = {
            "edgereg": __version__,
            "model": model_name,
            "variant": variant_name,
            "tier": variant.tier,
            "source": {"path": resolved.source.path, "sha256": resolved.source.sha256, **graph},
            "calibration": calibration_info,
            "quantization": quant_record,
            "evaluation": {
                "path": resolved.evaluation.path,
                "sha256": resolved.evaluation.sha256,
                "samples": len(evaluation),
                "sequences": None
                if evaluation.sequences is None
                else len(toolchain.sequence_bounds(evaluation.sequences)),
            },
            "toolchain": installed,
            "recipe": recipe,
            "recipe_sha256": recipe_digest,
            # Paths as models.toml names them: the work directory is random and
            # absolute paths differ per checkout, which would make provenance vary.
            "converter_argv": [
                {
                    str(source.resolve()): resolved.source.path,
                    str(artifact.resolve()): ARTIFACT,
                }.get(arg, arg)
                for arg in convert_run.argv
            ],
            "mnn_uuid": convert_run.uuid,
            # Not the converter's version: the oldest runtime this artifact was
            # loaded and run with, its outputs compared with the build's.
            "min_mnn_runtime": proof.version,
            "runtime_proof": proof.as_dict(),
            "runtime": variant.runtime.hints.model_dump(),
            "artifact": {"path": ARTIFACT, "sha256": artifact_sha, "size": scored.size_bytes},
            # What the release will tell apps, by digest: the record proves what was built.
            "contract": _file_record(work_dir / CONTRACT, CONTRACT),
            "probe": _file_record(work_dir / PROBE, PROBE),
        }
        if tensor_data is not None:
            provenance["probe_data"] = _file_record(work_dir / PROBE_DATA, PROBE_DATA)
        _write_json(work_dir / METRICS, metrics)
        _write_json(work_dir / PROVENANCE, provenance)
        _write_json(work_dir / CLASS_RECALL_PLOT, _recall_rows(scored.scores, model.classes))
        _write_json(work_dir / HOST_BENCHMARK, host.to_json())
        # The artifact moves last: its presence means every other file is there.
        for name in (*OUTPUT_FILES[1:], ARTIFACT):
            if name not in (LABELS, PROBE_DATA) or (work_dir / name).exists():
                os.replace(work_dir / name, out_dir / name)
    return BuildResult(
        out_dir=out_dir, metrics=metrics, provenance=provenance, stage_seconds=seconds
    )


def precision_class(variant: Variant) -> PrecisionClass:
    """Which default budgets a variant gets: fp32, fp16, weight-only or int8."""
    if variant.quantization.mode == "int8":
        return "int8"
    if variant.quantization.mode == "weight":
        return "weight"
    return "fp16" if variant.precision == "fp16" else "fp32"


def _gates(
    budgets: Budgets,
    size_bytes: int,
    agree: dict[str, OutputAgreement],
    scores: TaskScores | None,
    latency: float | None,
    declared: Budgets | None = None,
    latency_detail: str | None = None,
) -> GateReport:
    try:
        return check_gates(
            budgets,
            size_bytes=size_bytes,
            agreement=agree,
            scores=scores,
            latency_p50_ms=latency,
            # A default on a label metric lapses without labels; one models.toml sets does not.
            required_metrics=set(declared.metrics) if declared is not None else set(),
            latency_detail=latency_detail,
        )
    except TaskDataError as exc:
        raise BuildError(str(exc), stage="evaluate") from exc


def _charset(config: Config, task: Any) -> list[str] | None:
    if not isinstance(task, CtcTask):
        return None
    path = resolve_pinned(config, task.charset, stage="source", what="charset")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(
            f"charset {path} is not readable UTF-8 text: {exc}", stage="source"
        ) from exc
    chars = read_charset(text)
    if not chars:
        raise BuildError(f"charset {path} lists no characters", stage="source")
    return chars


#: ONNX control-flow ops MNN's quantizer is known to fail on (they become
#: subgraphs whose tensors it calibrates wrongly or not at all).
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")
#: What the MNN converter calls those ops in a .mnn file.
_MNN_CONTROL = frozenset({"If", "While", "Loop"})
_SIGNAL = re.compile(r"killed by signal (\w+)")


def _quantizer_failure(
    exc: BuildError,
    search: QuantSearch,
    task: str,
    precision: str,
    recipe_digest: str,
    graph: toolchain.OnnxReport,
    float_artifact: Path,
) -> dict[str, Any]:
    """metrics.json of a variant whose quantizer failed on every method tried."""
    tried = [*search.attempts, *search.hints]
    errors = [a.error for a in tried if a.error]
    signals = sorted({m.group(1) for text in errors for m in _SIGNAL.finditer(text)})
    crashed = bool(signals) or any("crashed" in text for text in errors)
    failure = "quantizer crashed" if crashed else "quantizer failed"
    suspects = {op: graph.op_counts[op] for op in CONTROL_FLOW_OPS if op in graph.op_counts}
    hint = exc.hint or ""
    names: list[str] = []
    if suspects:
        try:
            names = [
                op.name for op in toolchain.model_ops(float_artifact) if op.type in _MNN_CONTROL
            ]
        except BuildError:
            names = []  # the hint still names the op types
        listed = ", ".join(f"{op} x{count}" for op, count in suspects.items())
        skip = (
            "skip_ops = [" + ", ".join(f'"{name}"' for name in names[:8]) + "]"
            if names
            else "skip_ops naming those layers"
        )
        hint = (
            f"The graph has control-flow ops ({listed}) that MNN's int8 quantizer is known "
            'to fail on: keep this tier on weight-only quantization (mode = "weight", which '
            f"needs no calibration), or keep those layers in float with {skip}. " + hint
        ).strip()
    return {
        "status": "failed",
        "failure": failure,
        "task": task,
        "precision": precision,
        "recipe_sha256": recipe_digest,
        "metrics": {},
        "baseline": {},
        "agreement": {},
        "quantization": {
            "method_requested": search.record_requested(),
            "signals": signals,
            "methods_tried": [a.method for a in tried],
            "attempts": [a.summary() for a in search.attempts],
            "measured_alternatives": [a.summary() for a in search.hints],
            "control_flow_ops": suspects,
            "control_flow_layers": names,
        },
        "gates": {},
        "failed": [f"{failure}: {exc.message}"],
        "hint": hint or None,
    }


def _metrics(
    task: str,
    precision: str,
    scored: Scored,
    gates: GateReport,
    quant_record: dict[str, Any] | None,
) -> dict[str, Any]:
    scores = scored.scores
    metrics: dict[str, Any] = {
        "status": "passed" if gates.passed else "failed",
        "task": task,
        "precision": precision,
        "size_mb": round(scored.size_bytes / 1e6, 6),
        "agreement": {
            name: {
                "cosine": a.cosine,
                # JSON has no infinity: identical outputs are recorded as 999 dB.
                "snr_db": min(a.snr_db, SNR_CAP_DB),
                "max_abs_error": a.max_abs_error,
                "min_sample_cosine": a.min_sample_cosine,
            }
            for name, a in scored.agreement.items()
        },
        "metrics": dict(scores.metrics) if scores else {},
        "baseline": dict(scores.baseline) if scores else {},
    }
    if scores is not None and scores.per_class:
        metrics["per_class"] = {name: dict(values) for name, values in scores.per_class.items()}
    if quant_record is not None:
        metrics["quantization"] = {
            "method": quant_record["method"],
            "skip_ops": quant_record["skip_ops"],
            "quantizer_runs": quant_record["quantizer_runs"],
        }
        if not gates.passed:
            # No provenance is written for a failure: what was tried lives here.
            metrics["quantization"]["attempts"] = quant_record["attempts"]
            metrics["quantization"]["measured_alternatives"] = quant_record["measured_alternatives"]
    # No host timings here: metrics.json is a DVC stage output and must be the
    # same bytes on every rebuild; they go to host-benchmark.json.
    metrics["gates"] = {result.name: result.passed for result in gates.results}
    metrics["failed"] = [result.describe() for result in gates.failures]
    return metrics


def _sweep_record(
    timing: Any, policy: SweepPolicy | None, declared: int, tier_cores: int | None
) -> dict[str, Any] | None:
    """host-benchmark.json's ``host_threads``: the sweep's rounds and answer (host figures)."""
    if policy is None or timing.sweep is None:
        return None
    run = host_threads.SweepRun.from_json(timing.sweep, confidence=policy.confidence)
    return host_threads.record(
        run,
        declared=declared,
        tier_cores=tier_cores,
        host=host_threads.host_cores(),
        confidence=policy.confidence,
    )


def _memory_budgets(config: Config, variant: Variant, budgets: Budgets) -> list[str]:
    """The budgets that need the variant's memory measured (a failure is then an error)."""
    needed = []
    if budgets.max_memory_mb is not None:
        needed.append("max_memory_mb")
    if budgets.max_first_inference_ms is not None:
        needed.append("max_first_inference_ms")
    if config.tiers[variant.tier].max_model_memory_mb is not None:
        needed.append(f"tiers.{variant.tier}.max_model_memory_mb")
    return needed


def _host_benchmark(
    timing: Any,
    *,
    artifact_sha: str,
    recipe_sha: str,
    session: dict[str, Any] | None = None,
    threads: dict[str, Any] | None = None,
) -> HostBenchmark:
    return HostBenchmark(
        load_ms=timing.load_ms,
        peak_rss_mb=timing.peak_rss_mb,
        latency=tuple(
            ThreadLatency(n, lat.p50, lat.p90) for n, lat in sorted(timing.latency_ms.items())
        ),
        artifact_sha256=artifact_sha,
        recipe_sha256=recipe_sha,
        session=dict(session or {}),
        threads=threads,
    )


#: What a perfect match (infinite SNR) is written as in metrics.json.
SNR_CAP_DB = 999.0


def _recall_rows(scores: TaskScores | None, names: list[str] | None) -> list[dict[str, Any]]:
    if scores is None or not scores.class_recall:
        return []
    names = names or []
    return [
        {
            "class": names[label] if label < len(names) else str(label),
            "onnx": base,
            "variant": got,
            "change": got - base,
        }
        for label, (base, got) in sorted(scores.class_recall.items())
    ]


def _gate_message(model_name: str, variant_name: str, gates: GateReport) -> str:
    lines = [f"{model_name}/{variant_name} failed its gates:"]
    lines += [f"  {failure.describe()}" for failure in gates.failures]
    return "\n".join(lines)


def _gate_hint(
    variant: Variant,
    gates: GateReport,
    quant: dict[str, Any] | None,
    first: list[str] | None = None,
) -> str:
    failed = {failure.name for failure in gates.failures}
    lines = list(first or [])
    # f1 and frame_agreement are frame_decision's: a stream, not a picture.
    frames = any(name.split(".")[0] in ("f1", "frame_agreement") for name in failed)
    baseline = any(name.endswith((".min_baseline", ".max_baseline")) for name in failed)
    if frames and (baseline or any(name.endswith(".informative") for name in failed)):
        lines.append(
            "The fp32 ONNX model's decisions on the evaluation set are useless, so its rows are "
            "probably not what the app feeds it: a streaming model that reads context in front "
            "of each chunk (Silero VAD v5 at 16 kHz: the previous chunk's last 64 samples, then "
            "512 new ones, 576 per row) runs on bare chunks without an error but never fires. "
            "Check the row size and the sample rate against the model's own usage."
        )
    elif baseline:
        lines.append(
            "The fp32 ONNX model itself scores poorly on the evaluation set, so the "
            "preprocessing probably differs from training: check mean/std, color order "
            "(RGB/BGR), layout (NCHW/NHWC) and the input dtype in models.toml."
        )
    if quant is not None:
        passing = [a for a in quant["measured_alternatives"] if a["passed"]]
        if passing:
            lines.append(
                f'Measured: method = "{passing[0]["method"]}" passes every gate on these '
                'samples; set it, or method = "auto".'
            )
        elif quant["method_requested"] == "auto":
            tried = quant["quantizer_runs"]
            bound = getattr(variant.quantization, "max_skip_ops", 0)
            searched = (
                f"; {quant['skip_search']}"
                if quant.get("skip_search")
                else f" and up to {bound} layers kept in float"
            )
            lines.append(
                f"No int8 recipe passed after {tried} quantizer runs (KL, EMA, ADMM{searched}). "
                'Keep this tier on weight-only quantization (mode = "weight"), calibrate on '
                "more representative samples, or raise max_skip_ops."
            )
        elif quant["measured_alternatives"]:
            lines.append(
                'No other feature method passed either (measured); try method = "auto", '
                "which also keeps the worst layers in float, or weight-only quantization."
            )
    if "max_size_mb" in failed:
        lines.append('Use weight-only quantization (mode = "weight") or int8 to make it smaller.')
    if not lines:
        lines.append(
            "Raise a budget in models.toml only if the measured numbers are acceptable for the app."
        )
    return "\n".join(lines)


def _file_record(path: Path, name: str) -> dict[str, Any]:
    return {"path": name, "sha256": sha256_file(path), "size": path.stat().st_size}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
