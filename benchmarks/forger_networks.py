"""How many /24 networks a forger needs, in whole rollouts, through either arm.

benchmarks/report_checks.py answers it for one step once every device
reported; this runs whole automatic rollouts in the world of
tests/worldsim.py (the one benchmarks/canary.py runs: three tiers, NATs,
daily starts, the default policy and guardrails, --auto every 30 minutes, 21
days at most) with a forger holding ``k`` /24s of its own, each posting in
every rollout period, and prints how each rollout ended. The attacks
(docs/operations/report-threats.md):

- ``fail``: candidate-arm failures against a good candidate (a forced rollback);
- ``stable-fail``: stable-arm failures for a bad one (crash loops +3 points),
  to mask its harm (issue 30 item 1);
- ``pass``: healthy candidate installs for the same bad one, to dilute it.

``0`` networks is the same rollout without a forger, the baseline each attack
is read against (a rollout a forger leaves at 5 % for 21 days was stopped
at its start).

Usage: .venv/bin/python benchmarks/forger_networks.py [--devices 2000] [--seeds 1] [--first-seed 0]
       [--networks 0,3,10,30] [--attacks fail,stable-fail,pass] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from worldsim import GOOD, Forger, Release, World, rollout

#: attack -> (the candidate, what the forger wants, as benchmarks/canary.py's CRASH3)
ATTACKS = {
    "fail": (GOOD, "rolled back"),
    "stable-fail": (Release(crash_loop=0.05), "promoted or left at 100 %"),
    "pass": (Release(crash_loop=0.05), "promoted or left at 100 %"),
}


def one(job: tuple[str, int, int, int]) -> tuple[str, int, int, str, float, float]:
    attack, networks, devices, seed = job
    candidate, _ = ATTACKS[attack]
    started = time.process_time()
    forger = Forger(attack, networks=networks, reports=max(10, networks)) if networks else None  # type: ignore[arg-type]
    outcome = rollout(World(candidate, devices, forger=forger), seed)
    return attack, networks, seed, outcome.result, outcome.days, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--networks", default="0,3,10,30")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    jobs = [
        (attack, int(k), args.devices, seed)
        for attack in args.attacks.split(",")
        for k in args.networks.split(",")
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    print(f"{args.devices:,} devices, default policy, 21 days at most")
    print("| attack | the forger wants | /24s | seed | outcome | days |")
    print("|---|---|---|---|---|---|")
    cpu = 0.0
    with ProcessPoolExecutor(args.workers) as pool:
        for attack, k, seed, result, days, seconds in pool.map(one, jobs):
            cpu += seconds
            print(
                f"| {attack} | {ATTACKS[attack][1]} | {k} | {seed} | {result} | {days:.1f} |",
                flush=True,
            )
    print(f"({cpu / 60:.1f} CPU minutes, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
