"""Peak memory of the segmentation example, per variant, against an independent measurement.

The build measures a variant's peak inside its own child process: it resets the
kernel's high-water mark (``/proc/self/clear_refs``) once numpy, MNN and the
inputs are loaded, and reads ``VmHWM`` after load, the first call and the
steady runs (edgereg/toolchain/_memory_worker.py). This script measures the
same thing another way, from outside: a plain process imports numpy and
MNN, reads the inputs and says "ready"; the parent reads its resident size,
tells it to load the model through MNN's session API and run it three times,
and samples its ``/proc/PID/status`` every 0.2 ms until it says "done". The
growth over the "ready" size, the largest of ``--repeat`` runs (sampling can
only miss a peak, never add one). A peak from the difference of two processes'
``ru_maxrss`` does not work here: importing MNN peaks higher (75 MB) than the
process holds afterwards with the model loaded.

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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg.build.datasets import load_dataset
from edgereg.build.outputs import ARTIFACT, BUILT, HOST_BENCHMARK, METRICS, read_outputs
from edgereg.build.variant import BenchSettings, build_variant

ROOT = Path(__file__).resolve().parents[1]
MODEL = "segment"
TARGET = 0.10

#: A plain process: imports and inputs, then (on "go") load + three session runs.
PLAIN = """
import gc
import sys
import numpy as np
import MNN

data = dict(np.load(sys.argv[1]))
gc.collect()
print("ready", flush=True)
sys.stdin.readline()
net = MNN.Interpreter(sys.argv[2])
session = net.createSession({"numThread": int(sys.argv[3])})
inputs = net.getSessionInputAll(session)
for name, value in data.items():
    net.resizeTensor(inputs[name], tuple(value.shape))
net.resizeSession(session)
caffe = MNN.Tensor_DimensionType_Caffe
for _ in range(3):
    # The build's workload: one host tensor at a time, released before the next.
    for name, value in data.items():
        host = MNN.Tensor(tuple(value.shape), MNN.Halide_Type_Float, value, caffe)
        inputs[name].copyFrom(host)
        del host
    net.runSession(session)
    for out in net.getSessionOutputAll(session).values():
        host = MNN.Tensor(out, caffe)
        out.copyToHostTensor(host)
        del host
print("done", flush=True)
sys.stdin.readline()
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def sampled_mb(argv: list[str], cwd: str) -> float:
    """The child's resident growth from "ready" to "done", sampled from outside, MiB.

    The parent reads the child's /proc/PID/status every 0.2 ms while the model
    loads and runs: nothing of the build's measurement (no VmHWM, no reset of
    it, no code in the measured process).
    """
    process = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None
    assert process.stdout is not None
    for line in process.stdout:  # `import MNN` prints a line of its own first
        if line.strip() == "ready":
            break
    else:
        raise SystemExit(f"{' '.join(argv)} did not start")
    baseline = _rss_kib(process.pid)
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_kib(process.pid))
            time.sleep(0.0002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    process.stdin.write("go\n")
    process.stdin.flush()
    finished = process.stdout.readline().strip()
    done.set()
    sampler.join()
    peak = max(peak, _rss_kib(process.pid))
    process.stdin.close()
    process.wait()
    if finished != "done":
        raise SystemExit(f"{' '.join(argv)} failed")
    return (peak - baseline) / 1024.0


def independent_mb(
    artifact: Path, sample: dict[str, np.ndarray], threads: int, repeat: int
) -> float:
    """The largest of ``repeat`` sampled runs (sampling can only miss a peak), MiB."""
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "plain.py"
        script.write_text(PLAIN, encoding="utf-8")
        inputs = Path(scratch) / "inputs.npz"
        np.savez(inputs, **sample)  # type: ignore[arg-type]
        argv = [sys.executable, str(script), str(inputs), str(artifact), str(threads)]
        return max(sampled_mb(argv, scratch) for _ in range(repeat))


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
