"""Golden probe benchmark: probe sizes, tolerances, and a host self-test against one inference.

For each built variant of the repository's models.toml (run ``dvc repro``
first; nothing is rebuilt), reads ``build/<model>/<variant>/probe.json`` and
``contract.json`` and measures:

1. the probe blob's size (target: < 1 MB) and its cases x steps;
2. its tolerance (``min_cosine``, ``max_abs_error``) next to the variant's
   measured agreement with the fp32 ONNX model;
3. running the probe on the host's MNN CPU backend and checking it
   (``edgereg.build.probe.check_on_host``, one child process: start, load,
   every step) against one plain single-sample inference of the same
   artifact (``toolchain.run_inference``, also one child process): the
   ratio is what a self-test costs on the host (target: every check passes;
   the ratio is reported).

Usage: .venv/bin/python benchmarks/probe.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg import toolchain
from edgereg.build.outputs import ARTIFACT, CONTRACT, METRICS, PROBE, variant_dir
from edgereg.build.probe import PROBE_MAX_BYTES, check_on_host
from edgereg.protocol.contract import IOContract
from edgereg.protocol.probe import GoldenProbe
from edgereg.protocol.wire import from_bytes

ROOT = Path(__file__).resolve().parents[1]


def _median_seconds(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = config_mod.load(ROOT / "models.toml")
    print(f"golden probe benchmark, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()}")
    header = (
        f"{'variant':<16} {'bytes':>8} {'cases':>7} {'min_cos':>8} {'max_abs':>8} "
        f"{'gate_cos':>9} {'check s':>8} {'infer s':>8} {'ratio':>6} result"
    )
    print(header)
    failures = 0
    ratios = []
    for model_name, model in config.models.items():
        for variant_name in model.variants:
            out = variant_dir(ROOT / "build", model_name, variant_name)
            label = f"{model_name}/{variant_name}"
            if not (out / PROBE).is_file():
                print(f"{label:<16} not built (run dvc repro)")
                failures += 1
                continue
            data = (out / PROBE).read_bytes()
            probe = from_bytes(GoldenProbe, data)
            contract = IOContract.model_validate(json.loads((out / CONTRACT).read_text()))
            metrics = json.loads((out / METRICS).read_text())
            worst_cosine = min(entry["cosine"] for entry in metrics["agreement"].values())
            shape = f"{len(probe.cases)}x{len(probe.cases[0].steps)}"
            result = check_on_host(out / ARTIFACT, probe, contract)
            check_s = _median_seconds(
                functools.partial(check_on_host, out / ARTIFACT, probe, contract), args.repeat
            )
            step = probe.cases[0].steps[0]
            by_name = {spec.name: spec for spec in contract.inputs}
            rows = {}
            for tensor in step.inputs:
                spec = by_name[tensor.name]
                value = np.asarray(tensor.values(), dtype=spec.dtype).reshape(tensor.shape)
                # A dataset row is the tensor without its batch axis; one row here.
                row = value if spec.batch_axis is None else np.take(value, 0, spec.batch_axis)
                rows[tensor.name] = row[None]
            feeds = [
                toolchain.InputFeed(s.name, s.dtype, tuple(int(d) for d in s.shape), s.batch_axis)
                for s in contract.inputs
            ]
            state = [(a, b) for a, b in probe.state]
            infer_s = _median_seconds(
                functools.partial(
                    toolchain.run_inference,
                    out / ARTIFACT,
                    rows,
                    feeds=feeds,
                    output_names=[o.name for o in contract.outputs],
                    state=state,
                    sequences=np.zeros(1, np.int64) if state else None,
                ),
                args.repeat,
            )
            ratio = check_s / infer_s
            ratios.append(ratio)
            ok = result.passed and len(data) < PROBE_MAX_BYTES
            failures += not ok
            print(
                f"{label:<16} {len(data):>8} {shape:>7} {probe.tolerance.min_cosine:>8.6f} "
                f"{probe.tolerance.max_abs_error:>8.3g} {worst_cosine:>9.6f} {check_s:>8.3f} "
                f"{infer_s:>8.3f} {ratio:>6.2f} {'PASS' if ok else 'FAIL: ' + str(result.failure)}"
            )
    if ratios:
        print(
            f"host self-test / one inference (both one child process): median "
            f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}"
        )
    print(f"summary: {'PASS' if not failures else f'FAIL ({failures})'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
