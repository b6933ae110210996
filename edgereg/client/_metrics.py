"""App metrics on the device: the bucket of a value and one count added (docs/protocol.md §11).

Pure rules, shared by the client (:meth:`~edgereg.client.Client.record`,
:meth:`~edgereg.client.Client.observe`), its reporter and the conformance runner of
tests/vectors/metrics/: a call is refused (:func:`refusal`) or counted into the
install's totals as a report carries them (:func:`count_event`, :func:`count_value`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from edgereg.protocol.reports import MAX_COUNT
from edgereg.protocol.wire import DistributionMetric, RateMetric

__all__ = ["bucket_of", "count_event", "count_value", "refusal"]

Refusal = Literal["undeclared", "other-kind", "not-finite"]


def bucket_of(edges: Sequence[float], value: float) -> int:
    """The bucket ``value`` falls in, 0 to len(edges).

    A value equal to an edge is in the bucket that edge closes (``(e1, e2]``); -0.0
    equals 0.0.
    """
    return bisect.bisect_left(edges, float(value))


def refusal(
    declared: Mapping[str, RateMetric | DistributionMetric] | None,
    name: str,
    kind: Literal["rate", "distribution"],
    value: object = None,
) -> Refusal | None:
    """Why a call is a programming error of the app, or None.

    Checked in this order: a distribution's value that is not a finite number, a name
    the installed release does not declare (names compare exactly), a metric of the
    other kind.
    """
    if kind == "distribution" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    ):
        return "not-finite"
    metric = (declared or {}).get(name)
    if metric is None:
        return "undeclared"
    if metric.metric != kind:
        return "other-kind"
    return None


def count_event(counts: Mapping[str, Any] | None, success: bool) -> dict[str, int]:
    """A rate's totals with one more event.

    At 10^9 events (the most a report carries) an event counts no more, its success
    neither: the share stays what it was.
    """
    events = int((counts or {}).get("events", 0))
    successes = int((counts or {}).get("successes", 0))
    if events >= MAX_COUNT:
        return {"events": events, "successes": successes}
    return {"events": events + 1, "successes": successes + int(success)}


def count_value(
    counts: Mapping[str, Any] | None, bucket: int, buckets: int
) -> dict[str, list[int]]:
    """A distribution's totals with one more value in ``bucket`` (of ``buckets``).

    A bucket at 10^9 counts no more; the others go on.
    """
    kept = [int(c) for c in (counts or {}).get("counts", [])]
    kept = (kept + [0] * buckets)[:buckets]
    kept[bucket] = min(kept[bucket] + 1, MAX_COUNT)
    return {"counts": kept}
