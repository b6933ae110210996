"""Memory benchmark: what the memory measurement, the size explanation and the thread sweep cost.

For every example model in models.toml, builds its variants (int8 ones only with
``--all``: their quantizer search dwarfs everything else and would flatter the
share) into a temporary directory with the default benchmark settings, and
reads ``BuildResult.stage_seconds``:

- the memory measurement: the MNN session the benchmark's child runs first, at
  the declared shape (peak and steady RSS, MNN's accounting, first and steady
  latency): its own seconds (``memory_seconds`` in host-benchmark.json);
- ``size``: the .mnn's bytes per op and the ONNX mapping;
- the host thread sweep: its own seconds (``host_threads.seconds`` in
  host-benchmark.json; benchmarks/thread_sweep_cost.py compares it with the
  earlier sweep).

Target: memory + size + sweep <= 15 % of the variant's build. Also prints each
variant's measured peak and MNN's accounting next to an independent plain MNN
process reading its own VmHWM (agreement within 15 %).

Usage: .venv/bin/python benchmarks/memory.py [--all] [--models digits,embed]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg.build.outputs import ARTIFACT, HOST_BENCHMARK, METRICS
from edgereg.build.variant import BenchSettings, build_variant

ROOT = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.15

#: A plain MNN process: load, three inferences at the shapes in an .npz, own peak.
INDEPENDENT = """
import sys, numpy as np
import MNN

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0

data = dict(np.load(sys.argv[2]))
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
net = MNN.Interpreter(sys.argv[1])
session = net.createSession({"numThread": int(sys.argv[3])})
inputs = net.getSessionInputAll(session)
for name, value in data.items():
    net.resizeTensor(inputs[name], tuple(value.shape))
net.resizeSession(session)
caffe = MNN.Tensor_DimensionType_Caffe
for _ in range(3):
    for name, value in data.items():
        kind = inputs[name].getDataType()
        dtype = np.int32 if kind == MNN.Halide_Type_Int else np.float32
        host = MNN.Tensor(tuple(value.shape), kind, value.astype(dtype), caffe)
        inputs[name].copyFrom(host)
    net.runSession(session)
    for out in net.getSessionOutputAll(session).values():
        out.copyToHostTensor(MNN.Tensor(out, caffe))
print("PEAK", status("VmHWM") - base)
"""


def sample_for(config: config_mod.Config, model: str, variant: str) -> dict[str, np.ndarray]:
    """Zeros at the variant's declared shapes (what the timing needs, not the values)."""
    resolved = config.resolve(model, variant)
    return {spec.name: np.zeros(spec.shape, dtype=spec.dtype) for spec in resolved.inputs}


def independent_peak(artifact: Path, sample: dict[str, np.ndarray], threads: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "plain.py"
        script.write_text(INDEPENDENT, encoding="utf-8")
        inputs = Path(scratch) / "inputs.npz"
        np.savez(inputs, **sample)  # type: ignore[arg-type]
        run = subprocess.run(
            [sys.executable, str(script), str(artifact), str(inputs), str(threads)],
            capture_output=True,
            text=True,
            check=True,
            cwd=scratch,
        )
    return float(next(x for x in run.stdout.splitlines() if x.startswith("PEAK")).split()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="Build int8 variants too.")
    parser.add_argument("--models", default="", help="Comma-separated models (default: all).")
    args = parser.parse_args()
    config = config_mod.load(ROOT / "models.toml")
    wanted = [m for m in args.models.split(",") if m] or list(config.models)
    print(f"host: {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    settings = BenchSettings()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgereg-memory-bench-") as tmp:
        out = Path(tmp)
        for model in wanted:
            for variant, spec in config.models[model].variants.items():
                if spec.quantization.mode == "int8" and not args.all:
                    continue
                start = time.perf_counter()
                result = build_variant(config, model, variant, out, bench=settings)
                total = time.perf_counter() - start
                seconds = result.stage_seconds
                artifact = result.out_dir / ARTIFACT
                sample = sample_for(config, model, variant)
                threads = spec.runtime.threads
                host = json.loads((result.out_dir / HOST_BENCHMARK).read_text())
                swept = host.get("host_threads") or {}
                memory_s = float(host.get("memory_seconds", 0.0))
                size_s = seconds.get("size", 0.0)
                sweep = float(swept.get("seconds", 0.0))
                metrics = json.loads((result.out_dir / METRICS).read_text())
                plain = independent_peak(artifact, sample, threads)
                rows.append(
                    {
                        "variant": f"{model}/{variant}",
                        "build_s": total,
                        "memory_s": memory_s,
                        "size_s": size_s,
                        "sweep_s": sweep,
                        "share": (memory_s + size_s + sweep) / total,
                        "peak_mb": host.get("memory_peak_mb"),
                        "runtime_mb": metrics["memory"].get("runtime_mb"),
                        "plain_mb": plain,
                        "threads": swept.get("counts", []),
                        "recommended": swept.get("leading"),
                        "largest": (metrics["size"]["largest"] or [{}])[0].get("op"),
                        "largest_share": (metrics["size"]["largest"] or [{}])[0].get("share"),
                    }
                )
                r = rows[-1]
                print(
                    f"{r['variant']:16} build {total:6.2f} s  memory {memory_s:5.2f} s  "
                    f"size {size_s:5.3f} s  sweep {sweep:5.2f} s ({r['threads']})  "
                    f"share {r['share'] * 100:5.1f} %  peak {r['peak_mb']} MB "
                    f"(MNN {r['runtime_mb']} MB, plain process {plain:.2f} MB)  "
                    f"host's best count {r['recommended']}  largest {r['largest']} "
                    f"{(r['largest_share'] or 0) * 100:.0f} %"
                )
    print("\nsummary (host figures)")
    ok = True
    for r in rows:
        passed = r["share"] <= TARGET_SHARE
        close = r["peak_mb"] is not None and abs(r["peak_mb"] - r["plain_mb"]) <= 0.15 * max(
            r["plain_mb"], 1e-9
        )
        ok = ok and passed
        print(
            f"  {r['variant']:16} memory+size+sweep {r['share'] * 100:5.1f} % of the build "
            f"(target <= {TARGET_SHARE * 100:.0f} %): {'PASS' if passed else 'FAIL'}; "
            f"peak vs plain MNN process {r['peak_mb']} vs {r['plain_mb']:.2f} MB: "
            f"{'within 15 %' if close else 'differs by more than 15 %'}"
        )
    print(
        "Stages that pay it: 'benchmark' (its child measures memory first, then runs the "
        "host thread sweep), 'size' (reads the .mnn and the ONNX)."
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
