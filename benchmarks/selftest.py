"""Self-test benchmark: the on-device probe's cost against one plain inference, on this host.

For each example model (pipelines/*/model.onnx, converted to fp32 MNN here),
a golden probe is made from real MNN CPU outputs (4 cases; the streaming VAD
one case of 8 steps, state fed back), then measured in one process:

- one plain inference: the median of warm ``forward`` calls through the same
  in-process MNN session the self-test uses;
- the probe: the median ``probe_ms`` of :class:`SelfTest` runs on the CPU
  backend (every case run and checked with the real ``check_probe``);
- the load: the median ``load_ms`` (runtime created, model loaded);
- of the probe time, the part spent in ``check_probe`` (pure Python, shared
  with ports' reference) rather than in the forwards.

Prints per model the probe / inference ratio and the ratio of the whole
self-test (load + probe) to an app's first use without one (load + one
inference). These are host figures (x86); a phone's ratios differ.

Usage: .venv/bin/python benchmarks/selftest.py [--repeat 5] [--cases 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from probekit import entry_for, make_probe, probe_blob  # noqa: E402

from edgereg import toolchain  # noqa: E402
from edgereg.client._selftest import MnnRunner, SelfTest, _run_cases  # noqa: E402
from edgereg.config import RuntimeHints  # noqa: E402
from edgereg.protocol.probe import check_probe  # noqa: E402
from edgereg.toolchain import InputFeed  # noqa: E402

STATEFUL = {"vad": [("state", "state_out")]}
_ONNX_DTYPES = {1: "float32", 7: "int64"}


def _feeds(model: onnx.ModelProto) -> list[InputFeed]:
    feeds = []
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.dim_value else 1 for d in tensor.shape.dim]
        batch = 0 if dims and tensor.shape.dim[0].dim_param else None
        if value.name == "chunk":
            batch = 0
        feeds.append(InputFeed(value.name, _ONNX_DTYPES[tensor.elem_type], tuple(dims), batch))
    return feeds


def _rows(feeds: list[InputFeed], count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    rows = {}
    for feed in feeds:
        row_shape = feed.shape[1:] if feed.batch_axis == 0 else feed.shape
        if feed.dtype == "int64":
            value = 16000 if feed.name == "sr" else 1
            rows[feed.name] = np.full((count, *row_shape), value, np.int64)
        else:
            rows[feed.name] = rng.normal(0, 1, (count, *row_shape)).astype(np.float32)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="self-test runs per model")
    parser.add_argument("--cases", type=int, default=4, help="probe cases (stateless models)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs (host figures, x86)")
    rng = np.random.default_rng(0)
    runtime = RuntimeHints(threads=1, backends=["cpu"])
    runner = MnnRunner()
    rows_out = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for source in sorted((ROOT / "pipelines").glob("*/model.onnx")):
            name = source.parent.name
            graph = onnx.load(source)
            if any(v.type.tensor_type.elem_type not in _ONNX_DTYPES for v in graph.graph.input):
                continue
            if name == "embed":
                continue  # token ids need a real tokenizer's ids; the cost is the same kind
            artifact = root / f"{name}.mnn"
            toolchain.convert(source, artifact)
            feeds = _feeds(graph)
            state = STATEFUL.get(name, [])
            state_inputs = {pair[0] for pair in state}
            steps = 8 if state else 1
            count = steps if state else args.cases
            rows = _rows([f for f in feeds if f.name not in state_inputs], count, rng)
            outputs = [o.name for o in graph.graph.output if o.name not in {p[1] for p in state}]
            probe = make_probe(
                artifact,
                rows,
                feeds=feeds,
                outputs=outputs,
                model=name,
                state=state,
                steps_per_case=steps,
            )
            entry = entry_for(artifact, probe=probe_blob(probe)[1])

            # One plain inference, warm, through the same session kind.
            first = probe.cases[0].steps[0]
            session = runner.load(
                artifact,
                "cpu",
                runtime,
                [t.name for t in first.inputs] + [p[0] for p in state],
                outputs + [p[1] for p in state],
            )
            shapes = session.input_shapes()
            feed = {f.name: f.sample(rows[f.name], 0) for f in feeds if f.name in rows}
            for state_input, _ in state:
                feed[state_input] = np.zeros(shapes[state_input], np.float32)
            for _ in range(5):
                session.run(feed)
            times = []
            for _ in range(50):
                started = time.perf_counter()
                session.run(feed)
                times.append((time.perf_counter() - started) * 1000)
            inference_ms = statistics.median(times)

            probe_times, load_times = [], []
            for index in range(args.repeat):
                result = SelfTest(root / f"cache-{name}-{index}").run(name, artifact, entry, probe)
                probe_times.append(result.probe_ms)
                load_times.append(result.load_ms)
            probe_ms = statistics.median(probe_times)
            load_ms = statistics.median(load_times)
            # Where the probe time goes: the forwards, or the (pure Python) check.
            check_times = []
            for _ in range(args.repeat):
                computed = _run_cases(session, probe)
                started = time.perf_counter()
                check_probe(probe, computed)
                check_times.append((time.perf_counter() - started) * 1000)
            check_ms = statistics.median(check_times)
            forwards = sum(len(c.steps) for c in probe.cases)
            rows_out.append((name, forwards, inference_ms, probe_ms, check_ms, load_ms))

    print()
    print(
        f"{'model':<8} {'forwards':>8} {'inference ms':>13} {'probe ms':>9} {'of it check':>12} "
        f"{'load ms':>8} "
        f"{'probe/inference':>16} {'(load+probe)/(load+inference)':>30}"
    )
    for name, forwards, inference_ms, probe_ms, check_ms, load_ms in rows_out:
        print(
            f"{name:<8} {forwards:>8} {inference_ms:>13.3f} {probe_ms:>9.3f} {check_ms:>12.3f} "
            f"{load_ms:>8.2f} "
            f"{probe_ms / inference_ms:>15.1f}x "
            f"{(load_ms + probe_ms) / (load_ms + inference_ms):>29.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
