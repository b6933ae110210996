"""Peak memory of the segmentation example, per variant, against an independent measurement.

The build measures a variant's peak inside its own child process: it resets the
kernel's high-water mark (``/proc/self/clear_refs``) once numpy, MNN and the
inputs are loaded, and reads ``VmHWM`` after load, the first call and the
steady runs (edgereg/toolchain/_memory_worker.py). This script measures the
same thing another way, from outside: it starts two plain processes per
variant, both importing numpy and MNN and reading the inputs, one of them then
loading the model through MNN's session API and running it three times, and
takes the difference of their peak resident sizes as the parent's ``wait4``
reports them (``ru_maxrss``: no /proc reading, no reset). Median of
``--repeat`` pairs.

Also prints MNN's own accounting and the largest tensors (int8 at 1 byte a
value), so the per-precision effect on activations shows beside the peaks.

Target: the build's peak within 10 % of the independent one for every variant.

Usage: .venv/bin/python benchmarks/segment_memory.py [--build-dir build] [--repeat 3]
       (builds the variants into a temporary directory unless --build-dir holds them)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg.build.datasets import load_dataset
from edgereg.build.outputs import ARTIFACT, BUILT, HOST_BENCHMARK, METRICS, read_outputs
from edgereg.build.variant import BenchSettings, build_variant

ROOT = Path(__file__).resolve().parents[1]
MODEL = "segment"
TARGET = 0.10

#: A plain process: imports, inputs, and (with a model) load + three session runs.
PLAIN = """
import sys
import numpy as np
import MNN

data = dict(np.load(sys.argv[1]))
if len(sys.argv) > 2:
    net = MNN.Interpreter(sys.argv[2])
    session = net.createSession({"numThread": int(sys.argv[3])})
    inputs = net.getSessionInputAll(session)
    for name, value in data.items():
        net.resizeTensor(inputs[name], tuple(value.shape))
    net.resizeSession(session)
    caffe = MNN.Tensor_DimensionType_Caffe
    for _ in range(3):
        for name, value in data.items():
            host = MNN.Tensor(tuple(value.shape), MNN.Halide_Type_Float, value, caffe)
            inputs[name].copyFrom(host)
        net.runSession(session)
        for out in net.getSessionOutputAll(session).values():
            out.copyToHostTensor(MNN.Tensor(out, caffe))
"""


def peak_kib(argv: list[str], cwd: str) -> int:
    """The child's peak resident size, KiB, as the kernel reports it to its parent."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {process.returncode}")
    return int(usage.ru_maxrss)


def independent_mb(
    artifact: Path, sample: dict[str, np.ndarray], threads: int, repeat: int
) -> float:
    """Median over ``repeat`` pairs of (with the model) - (without), MiB."""
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "plain.py"
        script.write_text(PLAIN, encoding="utf-8")
        inputs = Path(scratch) / "inputs.npz"
        np.savez(inputs, **sample)  # type: ignore[arg-type]
        base = [sys.executable, str(script), str(inputs)]
        diffs = []
        for _ in range(repeat):
            without = peak_kib(base, scratch)
            with_model = peak_kib([*base, str(artifact), str(threads)], scratch)
            diffs.append((with_model - without) / 1024.0)
    return float(statistics.median(diffs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = config_mod.load(ROOT / "models.toml")
    model = config.models[MODEL]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="segment-memory-") as tmp:
        out = args.build_dir or Path(tmp)
        for name, variant in model.variants.items():
            if read_outputs(config, MODEL, name, out).status != BUILT:
                print(f"building {MODEL}/{name} ...", flush=True)
                build_variant(config, MODEL, name, out, bench=BenchSettings(threads=(1,)))
            folder = out / MODEL / name
            metrics = json.loads((folder / METRICS).read_text(encoding="utf-8"))
            host = json.loads((folder / HOST_BENCHMARK).read_text(encoding="utf-8"))
            resolved = config.resolve(MODEL, name)
            evaluation = load_dataset(
                config.resolve_path(resolved.evaluation),
                list(resolved.inputs),
                stage="evaluate",
                need_labels=False,
            )
            sample = {
                spec.name: evaluation.inputs[spec.name][:1].astype(np.float32)
                for spec in resolved.inputs
            }
            plain = independent_mb(folder / ARTIFACT, sample, variant.runtime.threads, args.repeat)
            built = float(host["memory_peak_mb"])
            memory = metrics["memory"]
            rows.append((name, built, plain))
            top = ", ".join(
                f"{t['op']} {t['dtype']} {t['shape']} {t['mb']:.1f} MB"
                for t in memory["largest_tensors"][:2]
            )
            print(
                f"{MODEL}/{name:6} {'x'.join(map(str, sample['image'].shape))}: build peak "
                f"{built:6.1f} MB, independent {plain:6.1f} MB ({(built / plain - 1) * 100:+5.1f} "
                f"%), MNN accounts {memory['runtime_mb']:.1f} MB; largest: {top}"
            )
    print("\nsummary")
    ok = True
    for name, built, plain in rows:
        close = abs(built - plain) <= TARGET * plain
        ok = ok and close
        print(
            f"  {MODEL}/{name}: build peak {built:.1f} MB vs independent {plain:.1f} MB "
            f"(target within {TARGET * 100:.0f} %): {'PASS' if close else 'FAIL'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
