"""How often the step to 100 % without proof takes a good and a +3 point crash loop (issue 33).

Monte Carlo of the one decision that leaves a candidate at full exposure at
1,000 to 20,000 devices: the step from 50 % to 100 % after ``max_soak_hours``,
which needs the pool's revert estimate within its limit (1 point) and no harm
shown (docs/operations/canary-analysis.md, "Stepping without proof"). The
fleet is tests/worldsim.py's at that step, drawn afresh per replicate: a
cohort per device, 15 % behind max(2, N // 250) carrier NATs (the rest a /24
each), 1 % of each release refused by its probe or load, crash loops on 2 %
of stable installs and on 2 % (good) or 5 % (+3 pt) of candidate installs,
independent; every crash loop old enough has reverted. The stable arm is the
cohorts at or above 50 %; the candidate's aged arm at the first look the rule
allows is its oldest share ``f`` of networks (f = 1/2 on main: at 72 h the
cohorts of the 5 and 25 % steps, half of a 50 % arm, are old enough on their
own), and at later looks every share up to the whole arm. The real
:func:`edgereg.analysis._evidence.rate_evidence` reads each: its ``estimate``
(the three tolerated networks most against the candidate set aside) and its
``harmless``. A candidate reaches 100 % when some look allows the step.

Prints, per fleet size, the share of fleets in which a good candidate and a
+3 point crash loop reach 100 %, for the rule on main (f = 1/2) and for the
estimate read only once a larger share of the arm is old enough.

Usage: .venv/bin/python benchmarks/step_power.py [--fleets 3000] [--sizes 1000,2000,20000]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edgereg.analysis._evidence import RateArm, rate_evidence

#: Shares of the candidate's networks old enough at the first look that may step.
SHARES = (0.5, 0.75, 0.9, 1.0)
LIMIT = 0.01


def _arm(mask: np.ndarray, events: np.ndarray, net: np.ndarray) -> RateArm:
    """An arm as the store tallies it: each network once, by its devices' share of the event."""
    _, inverse = np.unique(net[mask], return_inverse=True)
    per_network = np.bincount(inverse)
    shares = np.bincount(inverse, weights=events[mask].astype(float)) / per_network
    return RateArm(
        float(shares.sum()), len(per_network), float(events[mask].sum()), int(mask.sum())
    )


def reached(devices: int, crash: float, fleets: int, seed: int) -> dict[float, float]:
    """Per first-look share, the fraction of ``fleets`` whose candidate steps to 100 %."""
    rng = np.random.default_rng(seed)
    hits = dict.fromkeys(SHARES, 0)
    for _ in range(fleets):
        cohort = rng.random(devices)
        nats = max(2, devices // 250)
        behind = rng.random(devices) < 0.15
        net = np.where(behind, rng.integers(0, nats, devices), nats + np.arange(devices))
        stable_reverted = (rng.random(devices) >= 0.00998) & (rng.random(devices) < 0.02)
        reverted = (rng.random(devices) >= 0.00998) & (rng.random(devices) < crash)
        stable = _arm(cohort >= 0.5, stable_reverted, net)
        steps = {}
        for share in SHARES:
            evidence = rate_evidence(
                _arm(cohort < 0.5 * share, reverted, net),
                stable,
                margin=LIMIT,
                alpha=0.05,
                k=3,
                intervals=False,
            )
            steps[share] = evidence.harmless and evidence.estimate <= LIMIT
        for share in SHARES:
            hits[share] += any(ok for later, ok in steps.items() if later >= share)
    return {share: count / fleets for share, count in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", type=int, default=3000)
    parser.add_argument("--sizes", default="1000,2000,20000")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    header = " | ".join(f"f = {share:g}: good, +3 pt" for share in SHARES)
    print(f"| devices | fleets | {header} |")
    print("|---" * (2 + len(SHARES)) + "|")
    for devices in (int(n) for n in args.sizes.split(",")):
        fleets = args.fleets if devices <= 2000 else max(100, args.fleets // 10)
        good = reached(devices, 0.02, fleets, seed=7)
        bad = reached(devices, 0.05, fleets, seed=7)
        cells = " | ".join(
            f"{100 * good[share]:.1f} %, {100 * bad[share]:.1f} %" for share in SHARES
        )
        print(f"| {devices:,} | {fleets:,} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
