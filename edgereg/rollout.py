"""Tier resolution, cohort membership and rollout steps: pure and shared.

The registry, ``edgereg serve`` and the client SDK all decide with these
functions, so they agree bit for bit; a Kotlin or Swift port must reproduce
:func:`cohort_bucket`, :func:`in_cohort` and :func:`resolve_tier` exactly
(the golden vectors in tests/test_rollout.py are the check). No I/O here and no
clock: the current time is always an argument.

Cohort rule (DESIGN.md)::

    bucket = int(sha256(utf8(salt + ":" + device_id)).hexdigest()[:8], 16) % 10000
    in cohort  <=>  bucket < basis_points(percent)

``basis_points(percent)`` is the percent times 100 as an exact integer
(5 -> 500, 12.5 -> 1250, 99.99 -> 9999); percents have at most two decimals.
Comparing the bucket with the float ``percent * 100`` instead would differ
when the float product lands just above an integer (``1.1 * 100`` is
110.00000000000001, which would admit bucket 110), so ports must compare
integers. A bucket below a threshold stays below any higher threshold, so
raising the percent never removes a device from the cohort, as long as the
salt stays the same: the publisher keeps one salt for a candidate's whole
rollout and picks a new one for the next candidate.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from edgereg.config import TierRules
from edgereg.errors import EdgeregError

if TYPE_CHECKING:
    from edgereg.wire import Manifest, ManifestEntry

__all__ = [
    "BUCKETS",
    "PERCENT_RULE",
    "DeviceProfile",
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

BUCKETS = 10_000
"""Cohort buckets: one per 0.01 percent."""

PERCENT_RULE = "a percentage greater than 0 and at most 100, like 5%"


class PercentError(EdgeregError, ValueError):
    """A percentage outside (0, 100] or finer than 0.01.

    Also a ValueError, so pydantic validators can use :func:`check_percent`.
    """

    exit_code = 2


# --- percentages ------------------------------------------------------------


def basis_points(percent: float) -> int:
    """Return ``percent`` in hundredths of a percent, as an exact integer.

    Accepts 0 to 100 inclusive (0 admits no device, 100 every device).

    Raises:
        PercentError: not a finite number in [0, 100], or more than two decimals.
    """
    if isinstance(percent, bool) or not isinstance(percent, (int, float)):
        raise PercentError(f"percent must be a number, got {percent!r}")
    if not math.isfinite(percent) or not 0 <= percent <= 100:
        raise PercentError(f"percent must be between 0 and 100, got {percent!r}")
    scaled = percent * 100
    points = round(scaled)
    # percent * 100 is inexact in binary (0.29 * 100 = 28.999999999999996);
    # anything farther than this from an integer had a third decimal.
    if abs(scaled - points) > 1e-6:
        raise PercentError(
            f"percent {percent!r} has more than two decimals; rollouts move in steps of 0.01%"
        )
    return points


def check_percent(percent: float) -> float:
    """Validate a rollout percent: greater than 0, at most 100, at most two decimals.

    Returns:
        The percent as a float, unchanged in value.

    Raises:
        PercentError: (also a ValueError) when the rule is broken.
    """
    points = basis_points(percent)
    if points == 0:
        raise PercentError(f"percent must be greater than 0, got {percent!r}")
    return float(percent)


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
    except PercentError:
        raise PercentError(
            f"{option} must be {PERCENT_RULE}, with at most two decimals; got {text!r}"
        ) from None
    return value


# --- cohorts ----------------------------------------------------------------


def cohort_bucket(device_id: str, salt: str) -> int:
    """Return the device's bucket in [0, 10000) for a rollout salt."""
    digest = hashlib.sha256((salt + ":" + device_id).encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % BUCKETS


def in_cohort(device_id: str, salt: str, percent: float) -> bool:
    """True when the device is in the candidate cohort at this percent.

    Raises:
        PercentError: ``percent`` is outside [0, 100] or has more than two decimals.
    """
    return cohort_bucket(device_id, salt) < basis_points(percent)


def choose_entry(manifest: Manifest, device_id: str) -> tuple[ManifestEntry, bool] | None:
    """Pick what a device should run: the candidate inside the cohort, else stable.

    A paused rollout serves stable to everyone. Without a stable entry (the
    first release of a model, published as a canary) devices outside the
    cohort get nothing yet.

    Returns:
        (entry, True when it is the candidate), or None when the device gets no model.
    """
    candidate = manifest.candidate
    if (
        candidate is not None
        and not manifest.paused
        and manifest.salt is not None
        and manifest.percent is not None
        and in_cohort(device_id, manifest.salt, manifest.percent)
    ):
        return candidate, True
    if manifest.stable is not None:
        return manifest.stable, False
    return None


# --- tiers ------------------------------------------------------------------


class DeviceProfile(BaseModel):
    """What a device reports about itself; the input of tier and cohort choice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: str = Field(min_length=1)
    ram_mb: int = Field(ge=0)
    cpu_cores: int = Field(ge=1)
    soc: str | None = None
    os: Literal["android", "ios"] | None = None
    os_version: str | None = None
    abi: str | None = None
    mnn_runtime: str | None = Field(
        default=None, description="Version of the MNN runtime in the app, like 3.6.1."
    )


def soc_matches(pattern: str, soc: str) -> bool:
    """Match a SoC name against a ``soc_allow`` pattern.

    Case-insensitive; ``*`` matches any run of characters (also none) and
    ``?`` exactly one. Unlike fnmatch, ``[`` and ``]`` are literal, so the
    rule is the same in every language.
    """
    regex = "".join(
        ".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern.lower()
    )
    return re.fullmatch(regex, soc.lower(), flags=re.DOTALL) is not None


def tier_matches(rules: TierRules, device: DeviceProfile) -> bool:
    """True when the device meets every rule the tier sets (unset rules always hold)."""
    if rules.min_ram_mb is not None and device.ram_mb < rules.min_ram_mb:
        return False
    if rules.min_cpu_cores is not None and device.cpu_cores < rules.min_cpu_cores:
        return False
    if rules.soc_allow is not None and (
        device.soc is None or not any(soc_matches(p, device.soc) for p in rules.soc_allow)
    ):
        return False
    return rules.os is None or (device.os is not None and device.os in rules.os)


def resolve_tier(tiers: Mapping[str, TierRules], device: DeviceProfile) -> str:
    """Return the first tier, best first, whose every rule the device meets.

    With a valid models.toml the last tier is a catch-all, so every device
    gets exactly one tier.

    Raises:
        EdgeregError: no tier matches (the tiers have no catch-all).
    """
    for name, rules in tiers.items():
        if tier_matches(rules, device):
            return name
    raise EdgeregError(
        f"device {device.device_id!r} matches none of the tiers "
        f"{', '.join(tiers) or '(none given)'}",
        hint="The last tier must be a catch-all with no rules; check [tiers] in models.toml.",
    )


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
