"""Rollout steps and percentages as typed: the publisher's side of cohorts.

Tier resolution, cohort membership and the entry a device runs are part of
the protocol (:mod:`edgereg.protocol.rules`, :mod:`edgereg.protocol.fields`)
and re-exported here, so imports outside the package keep working (edgereg
itself imports them from the protocol: ruff's banned-api rule). No I/O here and no
clock: the current time is always an argument.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from datetime import datetime, timedelta

from edgereg.protocol.fields import (
    BUCKETS,
    PERCENT_RULE,
    PercentError,
    basis_points,
    check_percent,
)
from edgereg.protocol.rules import (
    DeviceProfile,
    NoTierError,
    choose_entry,
    cohort_bucket,
    in_cohort,
    resolve_tier,
    soc_matches,
    tier_matches,
)

__all__ = [
    "BUCKETS",
    "PERCENT_RULE",
    "DeviceProfile",
    "NoTierError",
    "PercentError",
    "basis_points",
    "check_percent",
    "check_soak",
    "choose_entry",
    "cohort_bucket",
    "in_cohort",
    "next_step",
    "parse_percent",
    "resolve_tier",
    "soc_matches",
    "tier_matches",
]


_PERCENT_TEXT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%?\s*$")


def parse_percent(text: str, *, option: str = "--canary") -> float:
    """Parse a percentage as typed on the command line: ``5%``, ``5``, ``12.5%``.

    Args:
        text: What the user typed.
        option: The option name to put in the error message.

    Raises:
        PercentError: e.g. "--canary must be a percentage greater than 0 and at
            most 100, like 5%; got 'abc'".
    """
    match = _PERCENT_TEXT.match(text)
    problem = f"{option} must be {PERCENT_RULE}; got {text!r}"
    if match is None:
        raise PercentError(problem)
    value = float(match.group(1))
    if not 0 < value <= 100:
        raise PercentError(problem)
    try:
        basis_points(value)
    except PercentError as exc:
        raise PercentError(
            f"{option} must be {PERCENT_RULE}, with at most two decimals; got {text!r}"
        ) from exc
    return value


# --- rollout steps ----------------------------------------------------------


def next_step(steps: Sequence[float], current_percent: float) -> float | None:
    """Return the first step above the current percent, or None after the last step.

    Args:
        steps: The policy's percentages, strictly increasing (e.g. 5, 25, 50, 100).
        current_percent: Where the rollout is now; it may lie between steps
            after a manual ``rollout --to``.

    Raises:
        ValueError: the steps are empty, not strictly increasing, or not valid percents.
    """
    if not steps:
        raise ValueError("a rollout policy needs at least one step")
    points = [basis_points(check_percent(step)) for step in steps]
    if any(b <= a for a, b in itertools.pairwise(points)):
        raise ValueError(f"rollout steps must be strictly increasing, got {list(steps)}")
    current = basis_points(current_percent)
    for step, point in zip(steps, points, strict=True):
        if point > current:
            return float(step)
    return None


def check_soak(last_change_at: datetime, now: datetime, min_soak: timedelta) -> timedelta | None:
    """Return how much soak time is left before the next step, or None if it has passed.

    Raises:
        ValueError: a time without a timezone (comparing those is ambiguous).
    """
    if last_change_at.tzinfo is None or now.tzinfo is None:
        raise ValueError("check_soak needs timezone-aware times")
    remaining = last_change_at + min_soak - now
    return remaining if remaining > timedelta(0) else None
