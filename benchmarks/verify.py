"""Verification benchmark: edgereg's stages against the raw MNN / ONNX Runtime calls they make.

Measures in one run (ratios within the run; the machine is shared, 2 cores, noisy):

1. For the largest example model (by ONNX size among ``pipelines/*/model.onnx``)
   and for a generated >= 10 MB ONNX (a seeded wide MLP, written to a temporary
   directory), each stage's seconds from ``build_variant(...).stage_seconds``
   against the raw calls on the same work:

   - convert   vs a child running only ``_tools.mnnconvert(argv)`` with the argv
     edgereg ran (never ``MNN.tools``);
   - verify    vs one child that loads the module once and forwards the same
     samples batch by batch with the plain MNN API;
   - reference vs an in-process ``onnxruntime`` ``session.run`` loop over the same
     batches (same single-thread session options).

   Target: edgereg's overhead <= 10% of the stage.
2. The reference cache: every variant of one model built into a fresh out dir;
   ONNX Runtime runs once (one cache file, the later variants' reference stage
   is a cache read).
3. The ``auto`` int8 search: per example model with an int8 variant (and vad and
   embed, whose int8 fails, with an ``auto`` int8 variant added to a copy of the
   config), the quantizer runs and their seconds against one plain run.

Usage: .venv/bin/python benchmarks/verify.py [--repeat 5] [--skip-search]
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgereg import config as config_mod
from edgereg import toolchain
from edgereg._files import atomic_write, sha256_file
from edgereg.build.datasets import Dataset, load_dataset
from edgereg.build.evaluate import REFERENCE_CACHE
from edgereg.build.outputs import METRICS, PROVENANCE, variant_dir
from edgereg.build.quality import agreement
from edgereg.build.variant import BenchSettings, BuildResult, build_variant
from edgereg.config import Config, Int8Quantization
from edgereg.errors import BuildError, GateError
from edgereg.toolchain import mnn as mnn_module
from edgereg.toolchain.runtimes import RUNTIMES_DIR_ENV, runtimes_dir

ROOT = Path(__file__).resolve().parents[1]
OVERHEAD_TARGET = 0.10
# The benchmark stage is not what this script measures: keep it short.
SETTINGS = BenchSettings(threads=(1,), warmup=1, iterations=3)
WIDE_SAMPLES = 2048
WIDE_LAYERS = (512, 2048, 1024, 64)  # about 3.2M float weights, ~12.6 MB

# The raw converter call: nothing but the extension and its argv, never MNN.tools.
RAW_CONVERT = "import json, sys, _tools; _tools.mnnconvert(json.loads(sys.argv[1]))"
# A plain MNN app loop: load once, forward per batch, read every output.
RAW_FORWARD = """
import json, sys, time
start = time.perf_counter()
import numpy as np
import MNN
req = json.loads(open(sys.argv[1]).read())
expr = MNN.expr
config = {"backend": "CPU", "numThread": 1, "precision": "normal"}
runtime = MNN.nn.create_runtime_manager((config,))
module = MNN.nn.load_module_from_file(req["path"], req["inputs"], req["outputs"],
                                      runtime_manager=runtime)
specs = module.get_info()["inputs"]
with np.load(req["data"]) as data:
    arrays = [data[n] for n in req["inputs"]]
ready = time.perf_counter()
total, size = arrays[0].shape[0], req["batch"]
outputs = [[] for _ in req["outputs"]]
for first in range(0, total, size):
    feeds = []
    for array, spec in zip(arrays, specs):
        value = np.ascontiguousarray(array[first:first + size], dtype=np.float32)
        var = expr.const(value, list(value.shape), expr.NCHW)
        if spec.data_format != expr.NCHW:
            var = expr.convert(var, spec.data_format)
        feeds.append(var)
    for index, out in enumerate(module.forward(feeds)):
        if out.data_format == expr.NC4HW4:
            out = expr.convert(out, expr.NCHW)
        outputs[index].append(np.array(out.read(), copy=True))
loop = time.perf_counter() - ready
calls = max(1, -(-total // size))
t0 = time.perf_counter()
for _ in range(calls):
    module.get_info()
get_info = time.perf_counter() - t0
open(req["result"], "w").write(json.dumps(
    {"startup_load": ready - start, "loop": loop, "get_info_per_call": get_info / calls,
     "calls": calls}))
"""


# The verify stage's output comparison, timed in a child whose environment we choose.
AGREEMENT_CHILD = """
import statistics, sys, time
import numpy as np
from edgereg.build.quality import agreement
with np.load(sys.argv[1]) as data:
    reference = {name: np.array(data[name]) for name in data.files}
times = []
for _ in range(9):
    start = time.perf_counter()
    agreement(reference, reference)
    times.append(time.perf_counter() - start)
print(statistics.median(times) * 1000.0)
"""


def agreement_in_child(outputs: Path, env: dict[str, str]) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", AGREEMENT_CHILD, str(outputs)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(proc.stdout.strip().splitlines()[-1])


@dataclass
class Target:
    name: str
    measured: str
    passed: bool | None  # None: informational
    note: str = ""


@dataclass
class StageRow:
    label: str
    stage: str
    edgereg: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    note: str = ""

    def medians(self) -> tuple[float, float]:
        return statistics.median(self.edgereg), statistics.median(self.raw)

    def overhead(self) -> float:
        ours, raw = self.medians()
        return (ours - raw) / ours


def verdict(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "FAIL")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def heading(text: str) -> None:
    print(f"\n== {text} ==", flush=True)


def load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}"


# --------------------------------------------------------------------------- inputs


def largest_example(config: Config) -> str:
    """The example model whose ONNX file is the largest."""
    sizes = {
        name: config.resolve_path(model.source).stat().st_size
        for name, model in config.models.items()
        if config.resolve_path(model.source).parent.parent == ROOT / "pipelines"
    }
    return max(sizes, key=lambda name: sizes[name])


def write_wide_model(directory: Path) -> Config:
    """A seeded wide MLP (>= 10 MB of float weights) and a config that builds it."""
    rng = np.random.default_rng(8)
    nodes = []
    weights = []
    previous = "x"
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(WIDE_LAYERS)):
        scale = np.float32(1.0 / np.sqrt(fan_in))
        weight = (rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        weights += [numpy_helper.from_array(weight, f"w{index}")]
        weights += [numpy_helper.from_array(bias, f"b{index}")]
        matmul, added = f"mm{index}", f"add{index}"
        nodes.append(helper.make_node("MatMul", [previous, f"w{index}"], [matmul]))
        last = index == len(WIDE_LAYERS) - 2
        nodes.append(helper.make_node("Add", [matmul, f"b{index}"], ["y" if last else added]))
        if not last:
            nodes.append(helper.make_node("Relu", [added], [f"relu{index}"]))
            previous = f"relu{index}"
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDE_LAYERS[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDE_LAYERS[-1]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    source = directory / "wide.onnx"
    onnx.save(model, str(source))
    evaluation = directory / "evaluation.npz"
    rows = rng.standard_normal((WIDE_SAMPLES, WIDE_LAYERS[0])).astype(np.float32)
    np.savez(evaluation, x=rows)
    versions = toolchain.installed_versions()
    toml = f"""
[toolchain]
mnn = "{versions["mnn"]}"
onnx = "{versions["onnx"]}"
onnxruntime = "{versions["onnxruntime"]}"

[tiers.high]
min_cpu_cores = 8

[tiers.low]

[models.wide]
version = "1.0.0"
task = "generic"
source = {{ path = "wide.onnx", sha256 = "{sha256_file(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{sha256_file(evaluation)}" }}

[[models.wide.inputs]]
name = "x"
shape = [1, {WIDE_LAYERS[0]}]

[[models.wide.outputs]]
name = "y"

[models.wide.budgets]
max_size_mb = 20

[models.wide.variants.fp32]
tier = "high"

[models.wide.variants.w8]
tier = "low"
quantization = {{ mode = "weight", bits = 8 }}
"""
    (directory / "models.toml").write_text(toml, encoding="utf-8")
    return config_mod.load(directory / "models.toml")


def config_with_int8(directory: Path, models: Sequence[str]) -> Config:
    """A copy of models.toml (paths still resolving to the repository) with an
    ``auto`` int8 variant added to each of ``models``."""
    (directory / "pipelines").symlink_to(ROOT / "pipelines")
    text = (ROOT / "models.toml").read_text(encoding="utf-8")
    for name in models:
        text += (
            f'\n[models.{name}.variants.int8]\ntier = "mid"\n'
            'quantization = { mode = "int8", method = "auto" }\n'
        )
    (directory / "models.toml").write_text(text, encoding="utf-8")
    return config_mod.load(directory / "models.toml")


# --------------------------------------------------------------------------- raw calls


def raw_convert(argv: list[str]) -> float:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="raw-convert-") as cwd:
        proc = subprocess.run(
            [sys.executable, "-c", RAW_CONVERT, json.dumps(argv)],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
    took = time.perf_counter() - start
    text = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 or "Converted Success!" not in text:
        raise RuntimeError(f"raw conversion failed (exit {proc.returncode}):\n{text[-2000:]}")
    return took


def raw_forward(
    artifact: Path, data: Path, names: list[str], outputs: list[str], batch: int, work: Path
) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one plain MNN child over every sample, and what it timed inside."""
    request = {
        "path": str(artifact),
        "data": str(data),
        "inputs": names,
        "outputs": outputs,
        "batch": batch,
        "result": str(work / "raw-forward.json"),
    }
    (work / "raw-forward-request.json").write_text(json.dumps(request), encoding="utf-8")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RAW_FORWARD, str(work / "raw-forward-request.json")],
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"raw forward loop failed:\n{proc.stderr[-2000:]!r}")
    return took, json.loads((work / "raw-forward.json").read_text(encoding="utf-8"))


def fixed_cost(
    artifact: Path,
    rows: dict[str, np.ndarray],
    names: list[str],
    outputs: list[str],
    work: Path,
    runs: int = 5,
) -> tuple[float, float]:
    """Milliseconds of ``run_inference`` and of the raw child on one sample (median, interleaved):
    what each pays per call regardless of the data."""
    one = {name: rows[name][:1] for name in names}
    data = work / "one-sample.npz"
    np.savez(data, **one)  # type: ignore[arg-type]
    feeds = [toolchain.InputFeed.batched(name, one[name]) for name in names]
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        toolchain.run_inference(artifact, one, feeds=feeds, output_names=outputs)
        ours.append(time.perf_counter() - start)
        raw.append(raw_forward(artifact, data, names, outputs, 1, work)[0])
    return statistics.median(ours) * 1000.0, statistics.median(raw) * 1000.0


def raw_reference(
    source: Path, rows: dict[str, np.ndarray], names: list[str], batch: int
) -> tuple[float, dict[str, np.ndarray]]:
    """A plain ONNX Runtime loop, with the session options edgereg uses (1 thread)."""
    start = time.perf_counter()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(
        str(source), sess_options=options, providers=["CPUExecutionProvider"]
    )
    total = len(next(iter(rows.values())))
    collected: list[list[np.ndarray]] = [[] for _ in names]
    for first in range(0, total, batch):
        values = session.run(names, {n: a[first : first + batch] for n, a in rows.items()})
        for index, value in enumerate(values):
            collected[index].append(np.asarray(value))
    outputs = {name: np.concatenate(parts) for name, parts in zip(names, collected, strict=True)}
    return time.perf_counter() - start, outputs


# --------------------------------------------------------------------------- 1 + 2


def _median_ms(fn: Callable[[], object], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def overhead_parts(
    evaluation: Dataset, reference: dict[str, np.ndarray], result: BuildResult, work: Path
) -> dict[str, float]:
    """Milliseconds of the work edgereg's stages do beyond the raw calls, each timed alone."""
    scratch = work / "parts"
    scratch.mkdir(exist_ok=True)
    inputs, outputs = scratch / "inputs.npz", scratch / "outputs.npz"

    def load_outputs() -> None:
        with np.load(outputs) as data:
            for name in data.files:
                np.array(data[name])

    def write_cache() -> None:
        buffer = io.BytesIO()
        np.savez(buffer, **{f"out:{n}": a for n, a in reference.items()})  # type: ignore[arg-type]
        atomic_write(scratch / "cache.npz", buffer.getvalue())

    copy = scratch / "model.mnn"
    shutil.copyfile(result.out_dir / "model.mnn", copy)
    np.savez(outputs, **reference)  # type: ignore[arg-type]
    return {
        # verify: the parent writes the inputs, the worker writes the outputs, the parent
        # reads them back and compares them with the reference.
        "inputs npz write": _median_ms(lambda: np.savez(inputs, **evaluation.inputs)),  # type: ignore[arg-type]
        "outputs npz write": _median_ms(lambda: np.savez(outputs, **reference)),  # type: ignore[arg-type]
        "outputs npz read": _median_ms(load_outputs),
        "agreement": _median_ms(lambda: agreement(reference, reference)),
        # np.dot in the cosine goes to OpenBLAS, whose threads fight for the 2 busy cores.
        "agreement child": agreement_in_child(outputs, {}),
        "agreement child 1 BLAS thread": agreement_in_child(outputs, {"OPENBLAS_NUM_THREADS": "1"}),
        # reference: the cache key hashes every input row; the result is written once.
        "dataset digest": _median_ms(evaluation.digest),
        "cache write": _median_ms(write_cache),
        # convert: the deterministic id is patched by reading and rewriting the whole file.
        "uuid patch": _median_ms(lambda: mnn_module._patch_uuid(copy, b"bench", stage="convert")),
        "model bytes": float(copy.stat().st_size),
    }


@dataclass
class ModelRun:
    """What the stage comparison of one model measured."""

    rows: list[StageRow]
    reference_by_variant: dict[str, list[float]]
    cache_files: list[int]
    results: dict[str, BuildResult]
    parts: dict[str, float] = field(default_factory=dict)


def stage_comparison(
    config: Config,
    model_name: str,
    variants: Sequence[str],
    repeat: int,
    work: Path,
    *,
    later_variants: Sequence[str] | None = None,
) -> ModelRun:
    """Build the variants ``repeat`` times, each time into a fresh out dir, and time
    the raw calls on the same work.

    The first rep runs the raw calls after each build (they need its converter argv and
    artifact); later reps run them before the build, on the first rep's argv and
    artifact (the same bytes), so whatever the order favours cancels out in the median.
    ``later_variants`` (default: all) are built in the reps after the first.
    """
    model = config.models[model_name]
    source = config.resolve_path(model.source)
    output_names = [spec.name for spec in model.outputs]
    input_names = [spec.name for spec in model.inputs]
    evaluation = load_dataset(
        config.resolve_path(model.evaluation),
        model.inputs,
        stage="evaluate",
        need_labels=False,
    )
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"{model_name}-inputs.npz"
    np.savez(data, **evaluation.inputs)  # type: ignore[arg-type]
    rows: dict[tuple[str, str], StageRow] = {}
    reference_by_variant: dict[str, list[float]] = {v: [] for v in variants}
    cache_files: list[int] = []
    results: dict[str, BuildResult] = {}
    parts: dict[str, float] = {}
    batch = 1
    argvs: dict[str, list[str]] = {}

    def row(label: str, stage: str) -> StageRow:
        return rows.setdefault((label, stage), StageRow(label, stage))

    def raw_calls(variant_name: str, first: bool) -> None:
        label = f"{model_name}/{variant_name}"
        if first:
            took, reference = raw_reference(source, evaluation.inputs, output_names, batch)
            row(model_name, "reference").raw.append(took)
            if not parts:
                parts.update(overhead_parts(evaluation, reference, results[variant_name], work))
        row(label, "convert").raw.append(raw_convert(argvs[variant_name]))
        if isinstance(model.variants[variant_name].quantization, Int8Quantization):
            return  # its verify stage sums every search attempt
        artifact = results[variant_name].out_dir / "model.mnn"
        took, probe = raw_forward(artifact, data, input_names, output_names, batch, work)
        verify = row(label, "verify")
        verify.raw.append(took)
        if not verify.note:
            fixed = fixed_cost(artifact, evaluation.inputs, input_names, output_names, work)
            verify.note = (
                f"raw child: start+import+load {probe['startup_load'] * 1000:.0f} ms, "
                f"loop {probe['loop'] * 1000:.0f} ms ({probe['calls']} forwards of {batch}); "
                f"on 1 sample: run_inference {fixed[0]:.0f} ms, raw child {fixed[1]:.0f} ms"
            )

    for rep in range(repeat):
        out_root = work / f"{model_name}-out-{rep}"  # fresh: the reference is computed again
        chosen = list(variants) if rep == 0 or later_variants is None else list(later_variants)
        for variant_name in chosen:
            first = variant_name == chosen[0]
            if rep > 0:
                raw_calls(variant_name, first)
            print(f"  [{rep + 1}/{repeat}] building {model_name}/{variant_name} ...", flush=True)
            result = build_variant(config, model_name, variant_name, out_root, bench=SETTINGS)
            seconds = result.stage_seconds
            reference_by_variant[variant_name].append(seconds["reference"])
            cache_files.append(len(list((out_root / REFERENCE_CACHE).glob("*.npz"))))
            if first:
                row(model_name, "reference").edgereg.append(seconds["reference"])
            row(f"{model_name}/{variant_name}", "convert").edgereg.append(seconds["convert"])
            if not isinstance(model.variants[variant_name].quantization, Int8Quantization):
                row(f"{model_name}/{variant_name}", "verify").edgereg.append(seconds["verify"])
            if rep == 0:
                results[variant_name] = result
                batch = SETTINGS.batch_size if result.provenance["source"]["dynamic_batch"] else 1
                argv = [
                    {"model.mnn": str(work / "raw.mnn")}.get(arg, arg)
                    for arg in result.provenance["converter_argv"]
                ]
                argv[argv.index("--modelFile") + 1] = str(source)
                argvs[variant_name] = argv
                raw_calls(variant_name, first)
    return ModelRun(list(rows.values()), reference_by_variant, cache_files, results, parts)


def print_stage_rows(rows: Sequence[StageRow]) -> list[Target]:
    lines = []
    targets = []
    for row in rows:
        ours, raw = row.medians()
        overhead = row.overhead()
        passed = overhead <= OVERHEAD_TARGET
        lines.append(
            [
                row.label,
                row.stage,
                str(len(row.edgereg)),
                f"{ours * 1000:.0f}",
                f"{raw * 1000:.0f}",
                f"{(ours - raw) * 1000:+.0f}",
                f"{overhead * 100:+.1f}%",
                verdict(passed),
                row.note,
            ]
        )
        targets.append(
            Target(
                f"{row.label} {row.stage}: overhead <= {OVERHEAD_TARGET:.0%}",
                f"{overhead * 100:+.1f}% ({ours * 1000:.0f} vs {raw * 1000:.0f} ms)",
                passed,
            )
        )
    print(
        table(
            [
                "model/variant",
                "stage",
                "runs",
                "edgereg ms",
                "raw ms",
                "diff ms",
                "overhead",
                f"<={OVERHEAD_TARGET:.0%}",
                "note",
            ],
            lines,
        )
    )
    return targets


def bench_stages(config: Config, repeat: int, work: Path) -> tuple[list[Target], ModelRun]:
    name = largest_example(config)
    model = config.models[name]
    variants = list(model.variants)
    heading(
        f"1. stage seconds vs raw calls, median of {repeat} (largest example: {name}, "
        f"{config.resolve_path(model.source).stat().st_size / 1e3:.0f} KB ONNX; "
        "and a generated wide MLP)"
    )
    print(
        "raw convert   = child `_tools.mnnconvert(argv)`, the argv edgereg ran\n"
        "raw verify    = one child: import MNN, load the module once, forward per batch\n"
        "                (the samples as an .npz prepared beforehand, outputs kept in memory)\n"
        "raw reference = in-process onnxruntime session (1 thread) and a session.run loop\n"
        "edgereg       = build_variant(...).stage_seconds; every rep builds into a fresh\n"
        "                out dir, so the first variant computes the reference"
    )
    # Every variant in rep 0 (section 2 needs them all); later reps only the float ones.
    float_variants = [
        v for v in variants if not isinstance(model.variants[v].quantization, Int8Quantization)
    ]
    example = stage_comparison(
        config, name, variants, repeat, work / name, later_variants=float_variants
    )
    wide_dir = work / "wide"
    wide_dir.mkdir()
    wide = write_wide_model(wide_dir)
    size = (wide_dir / "wide.onnx").stat().st_size
    print(f"  generated wide MLP: {size / 1e6:.1f} MB ONNX, {WIDE_SAMPLES} evaluation samples")
    wide_run = stage_comparison(wide, "wide", list(wide.models["wide"].variants), repeat, wide_dir)
    targets = print_stage_rows(example.rows + wide_run.rows)
    print("\nWhere edgereg's extra time goes (each part timed alone in this process, median of 5):")
    for label, run in ((name, example), ("wide", wide_run)):
        print_parts(label, run.parts)
    return targets, example


def print_parts(label: str, parts: dict[str, float]) -> None:
    verify = ("inputs npz write", "outputs npz write", "outputs npz read", "agreement")
    reference = ("dataset digest", "cache write")
    print(
        f"  {label}: verify "
        + " + ".join(f"{k} {parts[k]:.1f}" for k in verify)
        + f" = {sum(parts[k] for k in verify):.1f} ms; reference "
        + " + ".join(f"{k} {parts[k]:.1f}" for k in reference)
        + f" = {sum(parts[k] for k in reference):.1f} ms; convert uuid patch "
        f"{parts['uuid patch']:.1f} ms (the {parts['model bytes'] / 1e6:.1f} MB file read and "
        "rewritten)"
    )
    print(
        f"    agreement() alone in a fresh child: {parts['agreement child']:.1f} ms; with "
        f"OPENBLAS_NUM_THREADS=1: {parts['agreement child 1 BLAS thread']:.1f} ms"
    )


def report_cache(model_name: str, run: ModelRun) -> list[Target]:
    heading(f"2. reference cache: every variant of {model_name} into one fresh out dir")
    variants = list(run.reference_by_variant)
    lines = []
    for index, variant in enumerate(variants):
        lines.append(
            [
                f"{model_name}/{variant}",
                f"{run.reference_by_variant[variant][0] * 1000:.1f}",
                str(run.cache_files[index]),
                "ONNX Runtime ran" if index == 0 else "cache read",
            ]
        )
    print(table(["variant (build order)", "reference ms", "cache files after", "note"], lines))
    first = run.reference_by_variant[variants[0]][0]
    later = max(run.reference_by_variant[v][0] for v in variants[1:])
    once = run.cache_files[len(variants) - 1] == 1
    return [
        Target(
            f"reference computed once for {len(variants)} variants of {model_name}",
            f"{run.cache_files[len(variants) - 1]} cache file; first {first * 1000:.0f} ms, "
            f"later at most {later * 1000:.0f} ms",
            once and later < first,
        )
    ]


# --------------------------------------------------------------------------- 3


@dataclass
class QuantCall:
    method: str
    skipped: int  # ops kept in float
    seconds: float
    ok: bool
    passed: bool | None = None  # from provenance, when the build passed

    def describe(self) -> str:
        text = self.method + (f"+{self.skipped}" if self.skipped else "")
        if not self.ok:
            return text + "!"
        return text + {True: " ok", False: "", None: ""}[self.passed]


@contextmanager
def counted_quantizer() -> Iterator[list[QuantCall]]:
    """Count and time every quantizer run a build makes (the search calls
    ``edgereg.toolchain.quantize`` through the package)."""
    calls: list[QuantCall] = []
    real = toolchain.quantize

    def timed(*args: Any, **kwargs: Any) -> toolchain.ToolRun:
        method = str(kwargs.get("method"))
        start = time.perf_counter()
        try:
            run = real(*args, **kwargs)
        except BuildError:
            took = time.perf_counter() - start
            calls.append(QuantCall(method, len(kwargs.get("skip_ops", ())), took, False))
            raise
        took = time.perf_counter() - start
        calls.append(QuantCall(method, len(kwargs.get("skip_ops", ())), took, True))
        return run

    toolchain.quantize = timed
    try:
        yield calls
    finally:
        toolchain.quantize = real


def stage_timeline(events: list[tuple[str, float]], end: float) -> dict[str, float]:
    """Seconds per stage from the times each stage started (a failed build returns none)."""
    seconds: dict[str, float] = {}
    for (name, start), (_, stop) in zip(events, [*events[1:], ("end", end)], strict=True):
        seconds[name] = seconds.get(name, 0.0) + stop - start
    return seconds


@dataclass
class SearchRun:
    label: str
    calls: list[QuantCall]
    recorded_runs: int | None
    chosen: str
    checked_s: float
    build_s: float
    outcome: str


def search_one(config: Config, model_name: str, variant_name: str, out_root: Path) -> SearchRun:
    """Build one int8 variant, counting its quantizer runs; a failed gate is an outcome."""
    variant = config.models[model_name].variants[variant_name]
    assert isinstance(variant.quantization, Int8Quantization)
    events: list[tuple[str, float]] = []
    outcome = "passed"
    recorded = None
    with counted_quantizer() as calls:
        start = time.perf_counter()
        try:
            build_variant(
                config,
                model_name,
                variant_name,
                out_root,
                bench=SETTINGS,
                on_stage=lambda name: events.append((name, time.perf_counter())),
            )
        except GateError as exc:
            outcome = "gate failed: " + exc.message.splitlines()[-1].strip()[:60]
        except BuildError as exc:
            outcome = "build error: " + exc.message.splitlines()[0][:60]
        end = time.perf_counter()
    seconds = stage_timeline(events, end)
    # A failed gate leaves its metrics (with the recipe kept) but no artifact.
    metrics_path = variant_dir(out_root, model_name, variant_name) / METRICS
    chosen = "-"
    if metrics_path.is_file():
        quant = json.loads(metrics_path.read_text(encoding="utf-8")).get("quantization") or {}
        recorded = quant.get("quantizer_runs")
        skipped = len(quant.get("skip_ops", []))
        chosen = f"{quant.get('method', '?')}" + (f"+{skipped}" if skipped else "")
    provenance_path = metrics_path.with_name(PROVENANCE)
    if provenance_path.is_file():
        record = json.loads(provenance_path.read_text(encoding="utf-8")).get("quantization") or {}
        tried = [*record.get("attempts", []), *record.get("measured_alternatives", [])]
        if len(tried) == len(calls):
            for call, attempt in zip(calls, tried, strict=True):
                call.passed = bool(attempt.get("passed"))
    return SearchRun(
        f"{model_name}/{variant_name} ({variant.quantization.method})",
        calls,
        recorded,
        chosen,
        seconds.get("verify", 0.0) + seconds.get("evaluate", 0.0),
        end - start,
        outcome,
    )


def bench_search(config: Config, extra: Config, work: Path) -> list[Target]:
    heading("3. int8 quantization search: quantizer runs and their seconds vs one plain run")
    print(
        "plain run     = the search's own first quantizer call that produced a model: the\n"
        "                variant's method, KL for `auto` (the next method when one crashes);\n"
        "                what a fixed-method build runs once\n"
        "quantize s    = every quantizer call of the build (calibration loading excluded)\n"
        "verify+eval s = the search also verifies and evaluates every quantized candidate\n"
        "[added]       = int8 auto variant added to a copy of models.toml (none in the repo)"
    )
    jobs: list[tuple[Config, str, str]] = []
    for model_name, model in config.models.items():
        for variant_name, variant in model.variants.items():
            if isinstance(variant.quantization, Int8Quantization):
                jobs.append((config, model_name, variant_name))
    for model_name, model in extra.models.items():
        for variant_name, variant in model.variants.items():
            added = variant_name not in config.models[model_name].variants
            if added and isinstance(variant.quantization, Int8Quantization):
                jobs.append((extra, model_name, variant_name))
    lines = []
    targets = []
    for source_config, model_name, variant_name in jobs:
        print(f"  building {model_name}/{variant_name} ...", flush=True)
        run = search_one(source_config, model_name, variant_name, work / "search")
        label = run.label + (" [added]" if source_config is extra else "")
        quant_s = sum(c.seconds for c in run.calls)
        # One working run: the first call that produced a model (a crash returns early).
        working = [c for c in run.calls if c.ok]
        plain = working[0].seconds if working else float("nan")
        ratio = quant_s / plain if working else float("nan")
        count = str(len(run.calls))
        if run.recorded_runs not in (None, len(run.calls)):
            count += f" (provenance says {run.recorded_runs})"
        lines.append(
            [
                label,
                count,
                ", ".join(c.describe() for c in run.calls),
                run.chosen,
                f"{quant_s:.2f}",
                f"{plain:.2f}",
                f"{ratio:.1f}x",
                f"{run.checked_s:.2f}",
                f"{run.build_s:.1f}",
                run.outcome,
            ]
        )
        targets.append(
            Target(
                f"{model_name}/{variant_name} int8 search cost",
                f"{len(run.calls)} quantizer runs, {quant_s:.1f} s = {ratio:.1f}x one run",
                None,
                "informational",
            )
        )
    print(
        table(
            [
                "variant",
                "quantizer runs",
                "runs: method+float ops (ok passed, ! crashed)",
                "kept",
                "quantize s",
                "plain run s",
                "ratio",
                "verify+eval s",
                "build s",
                "outcome",
            ],
            lines,
        )
    )
    return targets


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of section 1")
    parser.add_argument("--skip-search", action="store_true", help="skip section 3")
    args = parser.parse_args(argv)
    # Builds from a config in a temporary directory still find the installed old runtimes.
    os.environ.setdefault(RUNTIMES_DIR_ENV, str(runtimes_dir()))

    print(
        f"edgereg verification benchmark, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.machine()} with {os.cpu_count()} CPUs (shared with other sessions: noisy), "
        f"Python {platform.python_version()}, mnn {toolchain.installed_version('mnn')}, "
        f"onnxruntime {toolchain.installed_version('onnxruntime')}; "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; "
        f"load average {load_average()}"
    )
    config = config_mod.load(ROOT / "models.toml")
    targets: list[Target] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgereg-bench-verify-") as tmp:
        work = Path(tmp)
        stage_targets, example = bench_stages(config, max(1, args.repeat), work)
        targets += stage_targets
        targets += report_cache(largest_example(config), example)
        if not args.skip_search:
            copy_dir = work / "config-copy"
            copy_dir.mkdir()
            missing = [
                name
                for name in ("vad", "embed")
                if name in config.models
                and not any(
                    isinstance(v.quantization, Int8Quantization)
                    for v in config.models[name].variants.values()
                )
            ]
            extra = config_with_int8(copy_dir, missing)
            targets += bench_search(config, extra, work)
        shutil.rmtree(work, ignore_errors=True)

    heading(
        f"summary (whole run {time.perf_counter() - started:.0f} s, load average {load_average()})"
    )
    print(
        table(
            ["target", "measured", "result", "note"],
            [[t.name, t.measured, verdict(t.passed), t.note] for t in targets],
        )
    )
    return 1 if any(t.passed is False for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
