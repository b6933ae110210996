"""How often the thousand-device fleet walks a good candidate to stable, over many seeds.

tests/test_fleet_adversary.py's
``test_the_defaults_walk_a_good_candidate_to_stable_on_a_thousand_devices``
runs one world (seed 1: device ids, start hours, who fails, the cohort's
salt) and asserts step, step, step, promote. Its verdict is a statistical
one: another seed draws other devices into the cohort, and a step's
evidence can fall the other way. This prints, for seeds 1..N, the moves of
each rollout and the share that walk to stable, so the test's claim (one
fixed seed) rests on a measured rate; and runs seed 1 twice to show the
run is deterministic (no wall-clock, load or thread timing in the verdict:
issue 30 item 18 failed once when the cohort's salt was the registry's
random one).

Usage: .venv/bin/python benchmarks/fleet_seeds.py [--seeds 20] [--workers 2] [--http-devices 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from fleetsim import GOOD, FleetWorld, Forger

WALK = ["step", "step", "step", "promote"]


def one(args: tuple[int, int]) -> tuple[int, list[tuple[float, str]], float]:
    """(seed, its moves as (day, action), CPU seconds) of one 18-day rollout."""
    seed, http_devices = args
    started = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        world = FleetWorld(Path(tmp), 1000, GOOD, http_devices=http_devices, seed=seed)
        forger = Forger(networks=1, kind="reverted", per_period=12)
        with world.running():
            outcome = world.rollout(18, forger)
    moves = [(round(day, 2), action) for day, action, _ in outcome.actions]
    return seed, moves, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--http-devices", type=int, default=50)
    args = parser.parse_args()
    jobs = [(seed, args.http_devices) for seed in [1, *range(1, args.seeds + 1)]]
    walked, cpu, first = 0, 0.0, None
    with ProcessPoolExecutor(args.workers) as pool:
        for n, (seed, moves, seconds) in enumerate(pool.map(one, jobs)):
            cpu += seconds
            ok = [action for _, action in moves] == WALK
            if n == 0:
                first = moves
                print(f"seed 1 (first run): {moves}", flush=True)
                continue
            if seed == 1:
                same = "the same" if moves == first else f"DIFFERENT from {first}"
                print(f"seed 1 (again): {moves}: {same}", flush=True)
            walked += ok
            print(f"seed {seed}: {'walks' if ok else 'DOES NOT WALK'} {moves}", flush=True)
    print(
        f"\nsummary\n  walked to stable: {walked}/{args.seeds} seeds "
        f"({cpu / 60:.1f} CPU minutes, load average {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
