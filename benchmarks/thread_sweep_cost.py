"""The host thread sweep's share of a build, before and after (issue 27; target <= 15 %).

Per variant, one run:

1. **after**: the variant is built as ``dvc repro`` builds it
   (``BenchSettings()``: 50 iterations at its own thread count, then the
   interleaved sweep within ``SweepPolicy.share`` of the build so far). The
   sweep's own seconds are ``host_threads.seconds`` in host-benchmark.json
   (loads, warm-up and rounds, as timed in the benchmark's child).
2. **before**: right after, on the same artifact and under the same load, the
   earlier sweep: one benchmark child timing each count in turn (1 up to the
   tier's cores capped by the host's, and the declared count; 5 warm-up passes
   and 50 timed passes each), less a child timing the declared count alone.
   The earlier build is this build with that sweep in place of the new one.

Shares are of the whole build and, stricter, of the build without its ``arm``
stage (the QEMU emulation dwarfs the rest of a quantized variant's build and
would flatter the share). The target is judged on the stricter one. Also
printed: the count each way chose on this host, and whether the new sweep
settled. Host figures: the build machine's, not a phone's.

``--repeat N`` then runs each sweep N more times on the same artifact, the
earlier one and the new one (in the benchmark's child, with the build's
budget), and prints the count each run chose: the earlier sweep's choice
flipped between runs (issue 27: 2, 1, 2), the new one's settled answers
should agree, and an unsettled one says so.

``--large`` adds the weight-only variant of the 1x3x1024x1024 segmenter
(tests/tiny_models.py), the model of the issue (54-83 % of its build before).

Usage: .venv/bin/python benchmarks/thread_sweep_cost.py [--models digits,embed] [--large]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from memory import sample_for  # benchmarks/memory.py, beside this script

from edgereg import config as config_mod
from edgereg import toolchain
from edgereg.build.outputs import ARTIFACT, HOST_BENCHMARK
from edgereg.build.threads import WITHIN, SweepPolicy, SweepRun, host_cores, sweep_counts
from edgereg.build.variant import BenchSettings, build_variant

ROOT = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.15
SETTINGS = BenchSettings()


def earlier_choice(p50_ms: Mapping[int, float], counts: Sequence[int]) -> int | None:
    """The earlier sweep's rule: the smallest count whose p50 is within 5 % of the best."""
    measured = {n: p50_ms[n] for n in counts if n in p50_ms}
    if not measured:
        return None
    best = min(measured.values())
    return min(n for n, value in measured.items() if value <= best * (1.0 + WITHIN))


def earlier_sweep(
    artifact: Path, sample: dict[str, np.ndarray], counts: Sequence[int], declared: int
) -> tuple[float, int | None]:
    """The earlier sweep's seconds (each count in turn, 50 passes), and the count it chose."""

    def timed(threads: tuple[int, ...]) -> tuple[float, toolchain.BenchmarkResult]:
        start = time.perf_counter()
        result = toolchain.benchmark(
            artifact,
            sample,
            threads=threads,
            warmup=SETTINGS.warmup,
            iterations=SETTINGS.iterations,
        )
        return time.perf_counter() - start, result

    everything, result = timed(tuple(sorted({*counts, declared})))
    alone, _ = timed((declared,))
    p50 = {n: stats.p50 for n, stats in result.latency_ms.items()}
    return max(everything - alone, 0.0), earlier_choice(p50, counts)


def new_sweep(
    artifact: Path,
    sample: dict[str, np.ndarray],
    counts: Sequence[int],
    declared: int,
    prior_seconds: float,
) -> tuple[int | None, bool]:
    """One more run of the new sweep as the build runs it: the count it chose, and if settled."""
    policy = SETTINGS.sweep or SweepPolicy()
    result = toolchain.benchmark(
        artifact,
        sample,
        threads=(declared,),
        warmup=SETTINGS.warmup,
        iterations=SETTINGS.iterations,
        sweep={
            "counts": sorted({*counts, declared}),
            "prior_seconds": prior_seconds,
            "policy": policy.to_json(),
        },
    )
    assert result.sweep is not None
    run = SweepRun.from_json(result.sweep, confidence=policy.confidence)
    return run.answer.recommended, run.answer.settled


def measure(
    config: config_mod.Config, model: str, variant: str, out: Path, repeat: int
) -> dict[str, Any]:
    spec = config.models[model].variants[variant]
    start = time.perf_counter()
    result = build_variant(config, model, variant, out, bench=SETTINGS)
    total = time.perf_counter() - start
    arm_s = result.stage_seconds.get("arm", 0.0)
    swept = json.loads((result.out_dir / HOST_BENCHMARK).read_text())["host_threads"]
    counts = sweep_counts(config.tiers[spec.tier].min_cpu_cores)
    before_s, before_choice = earlier_sweep(
        result.out_dir / ARTIFACT,
        sample_for(config, model, variant),
        counts,
        spec.runtime.threads,
    )
    after_s = float(swept["seconds"])
    total_before = total - after_s + before_s
    stages = list(result.stage_seconds)
    prior = sum(result.stage_seconds[name] for name in stages[: stages.index("benchmark")])
    again_before, again_after = [], []
    for _ in range(repeat):
        sample = sample_for(config, model, variant)
        artifact = result.out_dir / ARTIFACT
        again_before.append(earlier_sweep(artifact, sample, counts, spec.runtime.threads)[1])
        again_after.append(new_sweep(artifact, sample, counts, spec.runtime.threads, prior))
    return {
        "variant": f"{model}/{variant}",
        "build_s": total,
        "arm_s": arm_s,
        "before_s": before_s,
        "after_s": after_s,
        "budget_s": float(swept["budget_seconds"]),
        "before_share": before_s / total_before,
        "after_share": after_s / total,
        "before_share_no_arm": before_s / max(total_before - arm_s, 1e-9),
        "after_share_no_arm": after_s / max(total - arm_s, 1e-9),
        "before_choice": before_choice,
        "after_choice": swept["leading"],
        "settled": swept["settled"],
        "stopped": swept["stopped"],
        "rounds": swept["rounds"],
        "counts": swept["counts"],
        "again_before": [before_choice, *again_before],
        "again_after": [(swept["leading"], swept["settled"]), *again_after],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated example models")
    parser.add_argument("--large", action="store_true", help="add the 1024x1024 segmenter")
    parser.add_argument("--no-examples", action="store_true", help="only --large")
    parser.add_argument("--repeat", type=int, default=0, help="run each sweep N more times")
    args = parser.parse_args(argv)
    print(
        f"host: {platform.machine()}, {host_cores()} cores, load {os.getloadavg()[0]:.1f} "
        f"(host figures: the build machine's, not a phone's)"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgereg-thread-sweep-") as tmp:
        jobs: list[tuple[config_mod.Config, str, str]] = []
        if not args.no_examples:
            config = config_mod.load(ROOT / "models.toml")
            wanted = [m for m in args.models.split(",") if m] or list(config.models)
            for model in wanted:
                for variant, spec in config.models[model].variants.items():
                    # int8: the quantizer search dwarfs the rest and would flatter the share.
                    if spec.quantization.mode != "int8":
                        jobs.append((config, model, variant))
        if args.large:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from arm_cost import large_project

            jobs.append((large_project(Path(tmp) / "large"), "seg", "w8"))
        for config, model, variant in jobs:
            row = measure(config, model, variant, Path(tmp) / "out", args.repeat)
            rows.append(row)
            print(
                f"{row['variant']:16} build {row['build_s']:6.2f} s (arm {row['arm_s']:5.2f} s)  "
                f"sweep before {row['before_s']:6.2f} s, after {row['after_s']:5.2f} s "
                f"(budget {row['budget_s']:5.2f} s, {row['rounds']} rounds of {row['counts']}, "
                f"{row['stopped']})  host choice before {row['before_choice']}, "
                f"after {row['after_choice']} ({'settled' if row['settled'] else 'not settled'})"
            )
            if args.repeat:
                after = ", ".join(
                    f"{best}{'' if settled else ' (not settled)'}"
                    for best, settled in row["again_after"]
                )
                print(
                    f"{'':16} host choice of {args.repeat + 1} runs: before "
                    f"{row['again_before']}, after [{after}]"
                )
    print("\nsummary: the thread sweep's share of a build (host figures)")
    ok = True
    for r in rows:
        passed = r["after_share_no_arm"] <= TARGET_SHARE
        ok = ok and passed
        print(
            f"  {r['variant']:16} before {r['before_share'] * 100:5.1f} % "
            f"({r['before_share_no_arm'] * 100:5.1f} % without arm)  after "
            f"{r['after_share'] * 100:5.1f} % ({r['after_share_no_arm'] * 100:5.1f} % without "
            f"arm; target <= {TARGET_SHARE * 100:.0f} %): {'PASS' if passed else 'FAIL'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
