"""Latency verdicts under load: the same bytes, built again and again, judged the same way?

Builds one example variant ``--builds`` times (default 10) with a first-call
budget (``max_first_inference_ms``) and a steady one (``max_latency_p50_ms``)
while ``--load`` busy processes compete for the cores (bounded by
``--seconds``), and counts each build's verdict two ways:

- the rule the build judges by: the median over ``latency_loads`` fresh loads
  (5) of each load's min(wall, CPU) time (edgereg.build.memory.LatencyLoads);
- the earlier rule: one fresh load's wall time (``first_inference_wall`` of the
  first load, and the thread sweep's wall p50), recomputed from the same
  measurements.

Target: the judged verdict is the same in every build (10 of 10). The budget
defaults to 2x the judged first call of an unloaded warm-up build, the kind of
margin a team sets, which a loaded machine's wall time crosses.

Usage: .venv/bin/python benchmarks/latency_verdict.py [--builds 10] [--load 2]
       [--model textdet --variant fp16] [--budget-ms X] (5-15 min on 2 busy cores)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from edgereg import config as config_mod
from edgereg.build.outputs import HOST_BENCHMARK, METRICS
from edgereg.build.variant import BenchSettings, build_variant
from edgereg.errors import GateError

ROOT = Path(__file__).resolve().parents[1]


def _busy(deadline: float) -> None:
    """Spin until the deadline: one core's worth of competing work."""
    x = 0
    while time.time() < deadline:
        x = (x * 1103515245 + 12345) % 2147483648


def _config(model: str, variant: str, first_ms: float, steady_ms: float) -> config_mod.Config:
    """The repository's models.toml with the two latency budgets on one variant."""
    path = ROOT / "models.toml"
    text = path.read_text(encoding="utf-8")
    header = f"[models.{model}.variants.{variant}]\n"
    if header not in text:
        raise SystemExit(f"models.toml has no [models.{model}.variants.{variant}]")
    budget = (
        f"budgets = {{ max_first_inference_ms = {first_ms:.3f}, "
        f"max_latency_p50_ms = {steady_ms:.3f} }}\n"
    )
    # The variant's arm classes are left out: the ARM stage says nothing about latency.
    text = text.replace(header, header + budget + "arm = []\n", 1)
    return config_mod.parse(text, file=str(path))


def _build(config: config_mod.Config, model: str, variant: str, out: Path) -> dict[str, object]:
    bench = BenchSettings(threads=(config.models[model].variants[variant].runtime.threads,))
    with contextlib.suppress(GateError):  # a failed gate still writes its numbers
        build_variant(config, model, variant, out, bench=bench)
    metrics = json.loads((out / model / variant / METRICS).read_text(encoding="utf-8"))
    host = json.loads((out / model / variant / HOST_BENCHMARK).read_text(encoding="utf-8"))
    return {"metrics": metrics, "host": host}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=10)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the builds")
    parser.add_argument("--seconds", type=float, default=1800, help="the load stops by then")
    parser.add_argument("--model", default="textdet")
    parser.add_argument("--variant", default="fp16")
    parser.add_argument("--budget-ms", type=float, default=None)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")

    with tempfile.TemporaryDirectory(prefix="latency-verdict-") as tmp:
        out = Path(tmp) / "build"
        if args.budget_ms is None:
            warm = _build(
                _config(args.model, args.variant, 1e6, 1e6), args.model, args.variant, out
            )
            host = warm["host"]
            assert isinstance(host, dict)
            first, steady = 2 * host["first_inference_judged_ms"], 2 * host["steady_judged_p50_ms"]
        else:
            first = steady = args.budget_ms
        print(f"budgets: max_first_inference_ms {first:.3f}, max_latency_p50_ms {steady:.3f}")
        config = _config(args.model, args.variant, first, steady)
        deadline = time.time() + args.seconds
        load = [
            multiprocessing.Process(target=_busy, args=(deadline,), daemon=True)
            for _ in range(args.load)
        ]
        for process in load:
            process.start()
        rows = []
        try:
            for index in range(args.builds):
                started = time.perf_counter()
                result = _build(config, args.model, args.variant, out)
                metrics, host = result["metrics"], result["host"]
                assert isinstance(metrics, dict)
                assert isinstance(host, dict)
                gates = metrics["gates"]
                threads = config.models[args.model].variants[args.variant].runtime.threads
                row = {
                    "first_judged": gates["max_first_inference_ms"],
                    "steady_judged": gates["max_latency_p50_ms"],
                    # The earlier rule, on this build's own first load and sweep.
                    "first_one_load": host["first_inference_ms"] <= first,
                    "steady_one_load": host[f"threads_{threads}"]["p50_ms"] <= steady,
                    "judged_ms": host["first_inference_judged_ms"],
                    "busy": (
                        host["first_inference_busy_min_ms"],
                        host["first_inference_busy_max_ms"],
                    ),
                    "wall": (
                        host["first_inference_wall_min_ms"],
                        host["first_inference_wall_max_ms"],
                    ),
                    "one_load_ms": host["first_inference_ms"],
                }
                rows.append(row)
                print(
                    f"build {index + 1:2d} ({time.perf_counter() - started:5.1f} s, load "
                    f"{os.getloadavg()[0]:.1f}): first call judged {row['judged_ms']:.2f} ms "
                    f"(busy {row['busy'][0]:.2f}-{row['busy'][1]:.2f}, wall "
                    f"{row['wall'][0]:.2f}-{row['wall'][1]:.2f}) -> "
                    f"{'pass' if row['first_judged'] else 'FAIL'}; one load's wall "
                    f"{row['one_load_ms']:.2f} -> {'pass' if row['first_one_load'] else 'FAIL'}"
                )
        finally:
            for process in load:
                process.terminate()

    def same(key: str) -> tuple[int, int]:
        passed = sum(bool(row[key]) for row in rows)
        return max(passed, len(rows) - passed), passed

    print("\nsummary (same verdict in how many builds; how many passed):")
    for key, what in (
        ("first_judged", "first call, median of fresh loads at min(wall, CPU) (the build's rule)"),
        ("steady_judged", "steady p50, the same way (the build's rule)"),
        ("first_one_load", "first call, one load's wall time (the earlier rule)"),
        ("steady_one_load", "steady p50, the sweep's wall time (the earlier rule)"),
    ):
        agree, passed = same(key)
        print(f"  {what}: {agree} of {len(rows)} alike, {passed} passed")
    target = all(same(key)[0] == len(rows) for key in ("first_judged", "steady_judged"))
    print(
        f"target: the judged verdict alike in {len(rows)} of {len(rows)} builds: "
        f"{'PASS' if target else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
