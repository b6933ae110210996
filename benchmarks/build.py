"""Build benchmark: stage times, convert overhead, evaluation batching, no-op `dvc repro`.

Measures in one run, on the example models of the repository's models.toml:

1. every stage's seconds of ``build_variant`` for each example variant (built
   into a temporary directory, nothing in the repository is touched);
2. the convert stage against the raw converter call on the same model with the
   same flags, both in a child process (target: ratio <= 1.2);
3. inference over 1,000 evaluation samples in batches against one by one, for
   MNN (``toolchain.run_inference``) and ONNX Runtime (``toolchain.run_onnx``)
   (target: batched <= 0.2x one-by-one);
4. a no-op ``dvc repro`` of the whole example set in the repository
   (target: < 3 s).

Usage: .venv/bin/python benchmarks/build.py [--quick] [--skip-dvc]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgereg import config as config_mod
from edgereg import toolchain
from edgereg.build.datasets import load_dataset
from edgereg.build.variant import BenchSettings, build_variant
from edgereg.config import Config, Variant, WeightOnlyQuantization

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"

CONVERT_TARGET = 1.2
BATCH_TARGET = 0.2
DVC_TARGET_S = 3.0
EVAL_SAMPLES = 1000
NUMBER = re.compile(r"^[-+]?[0-9][0-9.]*$")
STAGES = (
    "toolchain",
    "source",
    "check",
    "contract",
    "convert",
    "quantize",
    "deterministic",
    "verify",
    "evaluate",
    "benchmark",
    "gate",
    "runtime",
    "probe",
)

# The raw converter call: nothing but the extension and its argv, never MNN.tools.
RAW_CONVERT = "import json, sys, _tools; _tools.mnnconvert(json.loads(sys.argv[1]))"
# The worker's own per-batch loop, timed after start-up, imports and model load.
FORWARD_LOOP = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import _worker
req = json.loads(open(sys.argv[2]).read())
names = req["input_names"]
module = _worker._module(req["path"], names, req["output_names"], 1)
with np.load(req["inputs"]) as data:
    arrays = [data[n] for n in names]
total = arrays[0].shape[0]
result = {}
for size in req["sizes"]:
    _worker._forward(module, [a[:size] for a in arrays])  # warm-up (resize)
    times = []
    for _ in range(req["runs"]):
        start = time.perf_counter()
        for first in range(0, total, size):
            _worker._forward(module, [a[first:first + size] for a in arrays])
        times.append(time.perf_counter() - start)
    result[str(size)] = sorted(times)[len(times) // 2]
open(req["result"], "w").write(json.dumps(result))
"""
# The raw call plus the load check edgereg's worker performs after converting.
RAW_CONVERT_LOAD = (
    "import json, sys, _tools; argv = json.loads(sys.argv[1]); _tools.mnnconvert(argv)\n"
    "import MNN\n"
    "m = MNN.nn.load_module_from_file(argv[argv.index('--MNNModel') + 1], [], [])\n"
    "assert m is not None"
)


@dataclass
class Target:
    name: str
    measured: str
    passed: bool | None  # None: informational
    note: str = ""


def median_time(fn: Callable[[], object], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def verdict(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "FAIL")


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, align_numbers: bool = True
) -> str:
    """Plain-text table; numeric cells right-aligned unless ``align_numbers`` is false."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def cell(text: str, width: int) -> str:
        return text.rjust(width) if align_numbers and NUMBER.match(text) else text.ljust(width)

    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(cell(c, w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def heading(text: str) -> None:
    print(f"\n== {text} ==", flush=True)


def convert_kwargs(variant: Variant) -> dict[str, Any]:
    """The converter options build_variant passes for this variant."""
    weight = variant.quantization
    bits = block = None
    asymmetric = True
    if isinstance(weight, WeightOnlyQuantization):
        bits, block, asymmetric = weight.bits, weight.block, weight.asymmetric
    return {
        "fp16": variant.precision == "fp16",
        "weight_quant_bits": bits,
        "weight_quant_block": block,
        "weight_quant_asymmetric": asymmetric,
        "transformer_fuse": variant.converter.transformer_fuse,
        "optimize_prefer": variant.converter.optimize_prefer,
    }


# --------------------------------------------------------------------------- 1


def bench_builds(config: Config, out_root: Path, settings: BenchSettings) -> dict[str, Path]:
    heading("1. build_variant stage seconds (temporary out dir)")
    print(
        f"BenchSettings(threads={settings.threads}, warmup={settings.warmup}, "
        f"iterations={settings.iterations}, batch_size={settings.batch_size}); "
        "the variant's own runtime thread count is always added to the benchmark."
    )
    rows = []
    artifacts: dict[str, Path] = {}
    for model_name, model in config.models.items():
        for variant_name in model.variants:
            label = f"{model_name}/{variant_name}"
            print(f"  building {label} ...", flush=True)
            start = time.perf_counter()
            result = build_variant(config, model_name, variant_name, out_root, bench=settings)
            wall = time.perf_counter() - start
            artifacts[label] = result.out_dir / "model.mnn"
            seconds = result.stage_seconds
            rows.append(
                [
                    label,
                    *(f"{seconds[s]:.3f}" if s in seconds else "-" for s in STAGES),
                    f"{sum(seconds.values()):.3f}",
                    f"{wall:.3f}",
                ]
            )
    print(table(["variant", *STAGES, "sum", "wall"], rows))
    print("(wall includes loading the evaluation set, outside any stage)")
    return artifacts


# --------------------------------------------------------------------------- 2


def _raw_child(code: str, argv: list[str], out: Path) -> None:
    """Run the converter in a child process in a fresh cwd; require its output."""
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="raw-convert-") as cwd:
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(argv)],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
    text = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 or "Converted Success!" not in text or not out.is_file():
        raise RuntimeError(f"raw conversion failed (exit {proc.returncode}):\n{text[-2000:]}")


def _bare_child() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def bench_convert(config: Config, work: Path, runs: int) -> list[Target]:
    heading(f"2. convert stage vs raw converter call (median of {runs}, all in child processes)")
    print(
        "raw       = child `import _tools; _tools.mnnconvert(argv)` in a fresh temp cwd\n"
        "raw+load  = raw, then `import MNN; MNN.nn.load_module_from_file(out)` in the same child\n"
        "edgereg   = toolchain.convert(...) as build_variant calls it (scratch dir, worker\n"
        "            child, success checks, deterministic id, atomic move); the load check\n"
        "            happens in the verify stage, which loads the artifact anyway.\n"
        "argv      = the argv edgereg ran, with only the output path changed."
    )
    bare, _ = median_time(_bare_child, runs)
    print(f"bare interpreter start (`python -c pass`): {bare * 1000:.1f} ms")
    # One measurement per distinct (source, converter options), naming its variants.
    groups: dict[tuple[Path, str], list[str]] = {}
    for model_name, model in config.models.items():
        for variant_name, variant in model.variants.items():
            source = config.resolve_path(config.resolve(model_name, variant_name).source)
            options = json.dumps(convert_kwargs(variant), sort_keys=True)
            groups.setdefault((source, options), []).append(f"{model_name}/{variant_name}")
    rows = []
    ratios = []
    load_ratios = []
    for (source, options), labels in groups.items():
        kwargs = json.loads(options)
        # Exactly as build_variant calls it: the deterministic id is set in the
        # same step, and the load check is left to the verify stage.
        kwargs.update(uuid_seed=b"benchmark", check_load=False)
        ours = work / "edgereg.mnn"
        raw_out = work / "raw.mnn"
        first = toolchain.convert(source, ours, **kwargs)  # warm-up, and the exact argv
        argv = list(first.argv)
        argv[argv.index("--MNNModel") + 1] = str(raw_out)
        raw_t: list[float] = []
        load_t: list[float] = []
        ours_t: list[float] = []
        child_t: list[float] = []
        for _ in range(runs):  # interleaved so drift hits all three alike
            start = time.perf_counter()
            _raw_child(RAW_CONVERT, argv, raw_out)
            raw_t.append(time.perf_counter() - start)
            start = time.perf_counter()
            _raw_child(RAW_CONVERT_LOAD, argv, raw_out)
            load_t.append(time.perf_counter() - start)
            start = time.perf_counter()
            run = toolchain.convert(source, ours, **kwargs)
            ours_t.append(time.perf_counter() - start)
            child_t.append(run.duration)
        raw_m, load_m = statistics.median(raw_t), statistics.median(load_t)
        ours_m, child_m = statistics.median(ours_t), statistics.median(child_t)
        ratio, load_ratio = ours_m / raw_m, ours_m / load_m
        ratios.append(ratio)
        load_ratios.append(load_ratio)
        flags = " ".join(argv[argv.index("--bizCode") + 2 :]) or "(none)"
        rows.append(
            [
                f"{source.parent.name}: {', '.join(labels)}",
                flags,
                f"{raw_m * 1000:.1f}",
                f"{load_m * 1000:.1f}",
                f"{(load_m - raw_m) * 1000:.1f}",
                f"{ours_m * 1000:.1f}",
                f"{child_m * 1000:.1f}",
                f"{ratio:.2f}",
                verdict(ratio <= CONVERT_TARGET),
                f"{load_ratio:.2f}",
            ]
        )
    print(
        table(
            [
                "model: variants",
                "flags",
                "raw ms",
                "raw+load ms",
                "load part ms",
                "edgereg ms",
                "its child ms",
                "edgereg/raw",
                f"<={CONVERT_TARGET}",
                "edgereg/raw+load",
            ],
            rows,
        )
    )
    return [
        Target(
            f"convert stage / raw converter call (<= {CONVERT_TARGET})",
            f"max {max(ratios):.2f}",
            max(ratios) <= CONVERT_TARGET,
            "fixed worker start-up, ~20 ms",
        ),
        Target(
            "convert stage / (raw call + same load check)",
            f"max {max(load_ratios):.2f}",
            None,
            "informational: equal work on both sides",
        ),
    ]


# --------------------------------------------------------------------------- 3


def _forward_loop(
    artifact: Path,
    inputs: dict[str, np.ndarray],
    names: list[str],
    outs: list[str],
    sizes: Sequence[int],
    runs: int,
    work: Path,
) -> dict[int, float]:
    """Median seconds of the worker's forward loop per batch size, inside one child."""
    _savez(work / "inputs.npz", inputs)
    request = {
        "path": str(artifact),
        "inputs": str(work / "inputs.npz"),
        "input_names": names,
        "output_names": outs,
        "sizes": list(sizes),
        "runs": runs,
        "result": str(work / "loop.json"),
    }
    (work / "loop-request.json").write_text(json.dumps(request), encoding="utf-8")
    worker_dir = Path(toolchain.__file__).parent  # holds _worker.py, run as a script
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            FORWARD_LOOP,
            str(worker_dir),
            str(work / "loop-request.json"),
        ],
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"forward loop failed:\n{proc.stdout[-2000:]!r}\n{proc.stderr[-2000:]!r}"
        )
    raw = json.loads((work / "loop.json").read_text(encoding="utf-8"))
    return {int(size): float(seconds) for size, seconds in raw.items()}


def _savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays)  # type: ignore[arg-type]


def bench_batching(
    config: Config, artifact: Path, batch: int, runs: int, work: Path
) -> list[Target]:
    heading(
        f"3. evaluation batching: {EVAL_SAMPLES} samples, batch 1 vs {batch} "
        f"(median of {runs}, 1 thread)"
    )
    model = config.models["digits"]
    source = config.resolve_path(model.source)
    evaluation = load_dataset(
        config.resolve_path(model.evaluation), model.inputs, stage="evaluate", need_labels=False
    )
    index = np.arange(EVAL_SAMPLES) % len(evaluation)
    inputs = {name: np.ascontiguousarray(a[index]) for name, a in evaluation.inputs.items()}
    one = {name: a[:1] for name, a in inputs.items()}
    names = [spec.name for spec in model.inputs]
    outs = [spec.name for spec in model.outputs]
    print(
        f"digits fp32 artifact from step 1; evaluation set ({len(evaluation)} samples) tiled to "
        f"{EVAL_SAMPLES}.\n"
        "fixed = the same call on 1 sample (MNN: child start, imports, model load, npz I/O; "
        "ORT: session creation)."
    )

    def mnn(data: dict[str, np.ndarray], size: int) -> Callable[[], object]:
        feeds = [toolchain.InputFeed.batched(name, data[name]) for name in names]
        return lambda: toolchain.run_inference(
            artifact, data, feeds=feeds, output_names=outs, batch_size=size
        )

    def ort(data: dict[str, np.ndarray], size: int) -> Callable[[], object]:
        return lambda: toolchain.run_onnx(source, data, batch_size=size, output_names=outs).outputs

    # Same answers either way, or the comparison means nothing.
    for run in (mnn, ort):
        single = run(inputs, 1)()
        batched = run(inputs, batch)()
        assert isinstance(single, dict)
        assert isinstance(batched, dict)
        for name in outs:
            if not np.allclose(single[name], batched[name], atol=1e-4):
                diff = float(np.abs(single[name] - batched[name]).max())
                print(f"  WARNING: {name} differs between batch 1 and {batch} by {diff:.3g}")

    rows: list[list[str]] = []
    ratios: dict[str, float | None] = {}

    def row(label: str, key: str, one_by_one: float, batched: float, *, gated: bool = True) -> None:
        if one_by_one <= 0 or batched <= 0:
            # A difference of two noisy medians came out negative: no ratio.
            ratios[key] = None
            rows.append([label, f"{one_by_one * 1000:.0f}", f"{batched * 1000:.0f}", "n/a", "-"])
            return
        ratio = batched / one_by_one
        ratios[key] = ratio
        rows.append(
            [
                label,
                f"{one_by_one * 1000:.0f}",
                f"{batched * 1000:.0f}",
                f"{ratio:.3f}",
                verdict(ratio <= BATCH_TARGET) if gated else "-",
            ]
        )

    for label, run in (("MNN run_inference", mnn), ("ORT run_onnx", ort)):
        calls = {"fixed": run(one, 1), "one": run(inputs, 1), "batched": run(inputs, batch)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(runs):  # round-robin, so load from other work hits all three alike
            for name, call in calls.items():
                times[name].append(median_time(call, 1)[0])
        fixed, t1, tb = (statistics.median(times[name]) for name in calls)
        row(f"{label}, end to end", f"{label} e2e", t1, tb)
        row(f"{label}, net of fixed {fixed * 1000:.0f} ms", f"{label} net", t1 - fixed, tb - fixed)
        if run is mnn:
            loop = _forward_loop(artifact, inputs, names, outs, (1, batch), max(runs, 3), work)
            row("MNN worker forward loop only (in child)", "MNN loop", loop[1], loop[batch])
            row(
                f"MNN one run_inference call per sample (= {EVAL_SAMPLES} x fixed, extrapolated)",
                "MNN per-call",
                EVAL_SAMPLES * fixed,
                tb,
                gated=False,
            )
    print(
        table(["runner", "one-by-one ms", f"batch {batch} ms", "ratio", f"<={BATCH_TARGET}"], rows)
    )

    def shown(key: str, spec: str = ".3f") -> str:
        value = ratios[key]
        return "n/a" if value is None else format(value, spec)

    def passed(key: str) -> bool | None:
        value = ratios[key]
        return None if value is None else value <= BATCH_TARGET

    return [
        Target(
            f"MNN evaluation, batch {batch} / batch 1, {EVAL_SAMPLES} samples (<= {BATCH_TARGET})",
            shown("MNN run_inference e2e"),
            passed("MNN run_inference e2e"),
            "run_inference end to end",
        ),
        Target(
            "  same, child startup excluded",
            f"{shown('MNN loop')} (net of fixed: {shown('MNN run_inference net')})",
            passed("MNN loop"),
            "worker forward loop in one child",
        ),
        Target(
            f"ORT reference, batch {batch} / batch 1 (<= {BATCH_TARGET})",
            f"{shown('ORT run_onnx e2e')} (net of fixed: {shown('ORT run_onnx net')})",
            passed("ORT run_onnx e2e"),
            "run_onnx, 1 intra-op thread",
        ),
        Target(
            "MNN one batched child vs one child per sample",
            shown("MNN per-call", ".4f"),
            None,
            "informational, extrapolated",
        ),
    ]


# --------------------------------------------------------------------------- 4


def _dvc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["dvc", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _dvc_failed(proc: subprocess.CompletedProcess[str], what: str) -> Target:
    print(proc.stdout[-2000:], proc.stderr[-2000:])
    name = f"no-op dvc repro (< {DVC_TARGET_S:g} s)"
    if "lock" in proc.stderr.lower():
        # One repo-wide lock: another dvc process (a build, a test) is running.
        return Target(name, "not measured", None, "repo lock held by another dvc process; rerun")
    return Target(name, what, False)


def bench_dvc(runs: int) -> list[Target]:
    heading(f"4. no-op `dvc repro` in {ROOT} (median of {runs})")
    if shutil.which("dvc") is None:
        print("dvc not found on PATH; skipped")
        return [Target(f"no-op dvc repro (< {DVC_TARGET_S:g} s)", "not run", None, "no dvc")]
    status = _dvc("status", "--json")
    try:
        current = status.returncode == 0 and json.loads(status.stdout or "null") == {}
    except json.JSONDecodeError:
        current = False
    if not current:
        print(
            f"build outputs are NOT current (dvc status --json: {status.stdout.strip()[:300]!r}); "
            "running `dvc repro` first ...",
            flush=True,
        )
        start = time.perf_counter()
        first = _dvc("repro")
        took = time.perf_counter() - start
        print(f"  dvc repro (real build): {took:.1f} s, exit {first.returncode}")
        if first.returncode != 0:
            return [_dvc_failed(first, "build failed")]
    else:
        print("build outputs are current (`dvc status --json` is {})")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = _dvc("repro")
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            return [_dvc_failed(proc, "dvc repro failed")]
        if "Running stage" in proc.stdout:
            print("  WARNING: a stage ran; this was not a no-op")
    status_s, _ = median_time(lambda: _dvc("status", "--json"), runs)
    median = statistics.median(times)
    print(
        f"no-op dvc repro: median {median:.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)}); "
        f"`dvc status --json` alone: {status_s:.2f} s"
    )
    return [
        Target(
            f"no-op dvc repro, whole example set (< {DVC_TARGET_S:g} s)",
            f"{median:.2f} s",
            median < DVC_TARGET_S,
        )
    ]


# --------------------------------------------------------------------------- main


def _load() -> str:
    """1-minute load average: above the CPU count, other work skews every timing."""
    return f"{os.getloadavg()[0]:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--skip-dvc", action="store_true", help="skip the no-op dvc repro")
    args = parser.parse_args(argv)

    # Subprocesses (dvc and the `edgereg` its stages call) come from the venv.
    if VENV_BIN.is_dir():
        os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["DVC_NO_ANALYTICS"] = "1"

    convert_runs = 5 if args.quick else 9
    eval_runs = 1 if args.quick else 5
    dvc_runs = 1 if args.quick else 3
    settings = (
        BenchSettings(threads=(1,), warmup=2, iterations=5)
        if args.quick
        else BenchSettings(threads=(1, 2), warmup=3, iterations=20)
    )

    print(
        f"edgereg build benchmark, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.machine()} with {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"mnn {toolchain.installed_version('mnn')}, "
        f"onnxruntime {toolchain.installed_version('onnxruntime')}"
        f"{' (--quick)' if args.quick else ''}; load average {_load()}"
    )
    config = config_mod.load(ROOT / "models.toml")
    targets: list[Target] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgereg-bench-") as tmp:
        work = Path(tmp)
        artifacts = bench_builds(config, work / "build", settings)
        targets += bench_convert(config, work, convert_runs)
        targets += bench_batching(
            config, artifacts["digits/fp32"], settings.batch_size, eval_runs, work
        )
    if args.skip_dvc:
        targets.append(Target(f"no-op dvc repro (< {DVC_TARGET_S:g} s)", "skipped", None))
    else:
        targets += bench_dvc(dvc_runs)

    heading(f"summary (whole run {time.perf_counter() - started:.0f} s, load average {_load()})")
    print(
        table(
            ["target", "measured", "result", "note"],
            [[t.name, t.measured, verdict(t.passed), t.note] for t in targets],
            align_numbers=False,
        )
    )
    return 1 if any(t.passed is False for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
