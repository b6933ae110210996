"""The host thread sweep: which thread count is fastest on the build host, and how sure.

Phones differ in which thread count is fastest (often 2-4: past the big cores,
more threads wait on little ones), and the build host cannot know: its cores,
its load and its kernels are not a phone's. What ships to the app is the count
the variant declares (``runtime.threads``, 4 when unsaid); the sweep is a host
figure beside it, labelled so wherever it is shown, and never shipped.

How it measures, so that it says something about the model and not the
moment:

- **Interleaved rounds.** Each round runs one forward pass at every count,
  the order reversed every other round (1, 2, 2, 1, 1, 2, ...): load that
  drifts while the sweep runs (another build starting) hits every count alike
  instead of the count that happened to be timed last.
- **Paired ratios.** Each count is compared with another within the same
  rounds (the median of per-round ratios), with a distribution-free interval
  (a sign test on the order statistics): a slow outlier round moves neither.
- **A bounded cost.** The sweep gets :attr:`SweepPolicy.share` of the seconds
  the build spent before it (15 % by default), and stops as soon as the answer
  is settled: the recommended count's comparison with every other count lies
  outside the 5 % band at :attr:`SweepPolicy.confidence`. Out of budget first,
  it reports what it measured as not settled.

It depends on nothing but the standard library: the benchmark's child process
loads this file by path (like ``edgereg/toolchain/_streaming.py``), where the
``edgereg`` package is not imported.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: A count is as good as the best when its p50 is within this fraction of it.
WITHIN = 0.05
#: The sweep's upper end for a tier that does not say its core count (the catch-all).
DEFAULT_TIER_CORES = 4
#: How a sweep's record is labelled wherever it goes (host-benchmark.json, releases, reports).
LABEL = "measured on the build host, not a phone; never shipped as a runtime hint"


@dataclass(frozen=True)
class SweepPolicy:
    """How long the sweep may run and when its answer counts as settled.

    Attributes:
        share: The sweep's time budget as a fraction of the build's seconds
            before it (the stages up to and including the variant's own
            benchmark). 0.15 keeps the sweep under 15 % of the build.
        confidence: Two-sided level of the sign-test interval on each ratio.
        min_rounds: Rounds before the answer may be called settled.
        max_rounds: Rounds at most, whatever the budget.
        warmup: Untimed forward passes per count before the first round.
    """

    share: float = 0.15
    confidence: float = 0.95
    min_rounds: int = 6
    max_rounds: int = 400
    warmup: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share is {self.share}; expected 0 to 1")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence is {self.confidence}; expected 0.5 to below 1")
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds or self.warmup < 0:
            raise ValueError("expected 1 <= min_rounds <= max_rounds and warmup >= 0")

    def budget_seconds(self, build_seconds: float) -> float:
        """The sweep's budget after a build that has taken ``build_seconds`` so far."""
        return self.share * max(build_seconds, 0.0)

    def to_json(self) -> dict[str, Any]:
        """As the benchmark's child takes it (``SweepPolicy(**policy)``)."""
        return asdict(self)


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def sweep_counts(tier_cores: int | None, host: int | None = None) -> tuple[int, ...]:
    """1 up to the tier's cores (:data:`DEFAULT_TIER_CORES` when unsaid), capped by the host."""
    top = min(tier_cores or DEFAULT_TIER_CORES, host if host is not None else host_cores())
    return tuple(range(1, max(top, 1) + 1))


def round_order(counts: Sequence[int], round_index: int) -> tuple[int, ...]:
    """The order of one round: ascending in even rounds, descending in odd ones."""
    ordered = tuple(sorted(counts))
    return ordered if round_index % 2 == 0 else ordered[::-1]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def sign_interval(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """A distribution-free interval for the median of ``values`` (sign test).

    The j-th smallest and j-th largest values, with j the largest rank whose
    two tails together hold at most ``1 - confidence`` of Binomial(n, 1/2).
    None when there are too few values for that level (fewer than 6 at 95 %).
    """
    n = len(values)
    alpha = 1.0 - confidence
    # Counted in integers: 2.0**n overflows a float past 1023 values.
    whole = 2**n
    tail, term = 0, 1  # the sum of C(n, i) for i <= k, and C(n, k)
    j = 0
    for k in range(n):
        tail += term
        if 2 * tail / whole > alpha:  # int / int: exact, however large
            break
        j = k + 1
        term = term * (n - k) // (k + 1)
    if j < 1:
        return None
    ordered = sorted(values)
    return ordered[j - 1], ordered[n - j]


@dataclass(frozen=True)
class Ratio:
    """How one count's latency compares with another's over the same rounds."""

    count: int
    against: int
    median: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class SweepAnswer:
    """What the rounds so far say: the fastest and the recommended count, and whether settled."""

    fastest: int | None
    recommended: int | None
    settled: bool
    ratios: tuple[Ratio, ...]


def _ratio(times: Mapping[int, Sequence[float]], count: int, against: int, level: float) -> Ratio:
    per_round = [a / b for a, b in zip(times[count], times[against], strict=True) if b > 0]
    if not per_round:
        return Ratio(count, against, math.nan, None, None)
    interval = sign_interval(per_round, level)
    return Ratio(
        count,
        against,
        _median(per_round),
        None if interval is None else interval[0],
        None if interval is None else interval[1],
    )


def answer(
    times: Mapping[int, Sequence[float]],
    counts: Sequence[int],
    *,
    confidence: float,
    within: float = WITHIN,
) -> SweepAnswer:
    """The recommended count among ``counts``, from paired rounds, and whether it is settled.

    ``times`` holds, per count, one time per round (the same rounds for every
    count). The fastest is the count whose median per-round ratio against the
    others is lowest; the recommended is the smallest count within ``within``
    of it. Settled when, at ``confidence``, every smaller count is more than
    ``within`` slower than the fastest, and no larger count is more than
    ``within`` faster than the recommended.
    """
    chosen = [n for n in sorted(set(counts)) if times.get(n)]
    if not chosen:
        return SweepAnswer(None, None, False, ())
    reference = chosen[0]
    against_ref = {n: _ratio(times, n, reference, confidence).median for n in chosen}
    fastest = min(chosen, key=lambda n: (against_ref[n], n))
    recommended = min(
        n
        for n in chosen
        if _ratio(times, n, fastest, confidence).median <= 1.0 + within or n == fastest
    )
    settled = len(chosen) == 1 or all(
        _decided(times, m, fastest, recommended, confidence, within)
        for m in chosen
        if m != recommended
    )
    ratios = tuple(_ratio(times, n, recommended, confidence) for n in chosen)
    return SweepAnswer(fastest, recommended, settled, ratios)


def _decided(
    times: Mapping[int, Sequence[float]],
    count: int,
    fastest: int,
    recommended: int,
    confidence: float,
    within: float,
) -> bool:
    if count < recommended:  # passed over: must be clearly slower than the fastest
        low = _ratio(times, count, fastest, confidence).low
        return low is not None and low > 1.0 + within
    # more threads: must not be clearly faster than the recommended
    low = _ratio(times, count, recommended, confidence).low
    return low is not None and low > 1.0 / (1.0 + within)


@dataclass
class SweepRun:
    """The rounds of one sweep as they were run (the host-benchmark.json record's source)."""

    counts: tuple[int, ...]
    budget_seconds: float
    times_ms: dict[int, list[float]] = field(default_factory=dict)
    seconds: float = 0.0
    stopped: str = "rounds"
    answer: SweepAnswer = field(default_factory=lambda: SweepAnswer(None, None, False, ()))
    #: Why the sweep could not run (``stopped`` is ``error``): the build goes on without it.
    error: str | None = None

    @property
    def rounds(self) -> int:
        """Complete rounds run."""
        return min((len(v) for v in self.times_ms.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        """What the benchmark's child sends back (the answer is recomputed from the times)."""
        return {
            "counts": list(self.counts),
            "budget_seconds": self.budget_seconds,
            "times_ms": {str(n): list(v) for n, v in self.times_ms.items()},
            "seconds": self.seconds,
            "stopped": self.stopped,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, confidence: float) -> SweepRun:
        """Read :meth:`to_json`, and answer from its rounds at ``confidence``."""
        counts = tuple(int(n) for n in data["counts"])
        run = cls(
            counts,
            float(data["budget_seconds"]),
            {int(n): [float(t) for t in v] for n, v in dict(data["times_ms"]).items()},
            float(data["seconds"]),
            str(data["stopped"]),
            error=None if data.get("error") is None else str(data["error"]),
        )
        if run.rounds:
            rounds = run.rounds  # only complete rounds are paired
            paired = {n: v[:rounds] for n, v in run.times_ms.items()}
            run.answer = answer(paired, counts, confidence=confidence)
        return run


def run_sweep(
    counts: Sequence[int],
    forward: Callable[[int], None],
    *,
    clock: Callable[[], float],
    budget_seconds: float,
    policy: SweepPolicy,
    prepare: Callable[[int], bool] | None = None,
) -> SweepRun:
    """Run interleaved rounds of ``forward(count)`` until settled, out of budget or rounds.

    Args:
        counts: The thread counts compared.
        forward: Runs one forward pass at a count.
        clock: Seconds, monotonic (``time.perf_counter``); also times each pass.
        budget_seconds: Wall seconds the sweep may take, loads and warm-up included.
        policy: Warm-up, rounds and the confidence of the settled test.
        prepare: Loads a count's runtime before its first pass (within the budget);
            returns False when it was loaded and warm already (the variant's own
            count, just benchmarked), which then skips its warm-up.

    Returns:
        Every round's times and the answer they give. ``stopped`` says why it
        ended: ``settled``, ``budget``, ``rounds`` (``max_rounds``) or
        ``single`` (one count: nothing to compare).
    """
    ordered = tuple(sorted(set(counts)))
    run = SweepRun(ordered, budget_seconds, {n: [] for n in ordered})
    start = clock()
    if len(ordered) < 2:
        run.stopped = "single"
        return run

    def spent() -> float:
        return clock() - start

    # Loads, then warm-up passes, each begun only within the budget. The last
    # warm pass estimates a round's length (a first pass pays one-time set-up),
    # so that no round is begun that would end past the budget.
    cold = list(ordered)
    last_pass = 0.0
    for n in ordered:
        if prepare is None:
            break
        if spent() > budget_seconds:
            return _ran_out(run, spent())
        if not prepare(n):
            cold.remove(n)
    for _ in range(policy.warmup):
        for n in cold:
            if spent() > budget_seconds:
                return _ran_out(run, spent())
            began = clock()
            forward(n)
            last_pass = clock() - began
    round_seconds = last_pass * len(ordered)
    for index in range(policy.max_rounds):
        # A round that would end past the budget is not begun: the budget is a bound.
        if spent() + round_seconds > budget_seconds:
            run.stopped = "budget"
            break
        began = clock()
        for n in round_order(ordered, index):
            t0 = clock()
            forward(n)
            run.times_ms[n].append((clock() - t0) * 1000.0)
        round_seconds = clock() - began
        if index + 1 >= policy.min_rounds:
            run.answer = answer(run.times_ms, ordered, confidence=policy.confidence)
            if run.answer.settled:
                run.stopped = "settled"
                break
    run.seconds = spent()
    if run.rounds and run.stopped != "settled":
        run.answer = answer(run.times_ms, ordered, confidence=policy.confidence)
    return run


def failed_run(
    counts: Sequence[int], error: str, *, budget_seconds: float = 0.0, seconds: float = 0.0
) -> dict[str, Any]:
    """What the benchmark's child sends back when the sweep itself failed (as ``to_json``)."""
    run = SweepRun(tuple(sorted(set(counts))), budget_seconds, seconds=seconds, error=error)
    run.stopped = "error"
    return run.to_json()


def _ran_out(run: SweepRun, seconds: float) -> SweepRun:
    run.stopped, run.seconds = "budget", seconds
    return run


def record(
    run: SweepRun,
    *,
    declared: int,
    tier_cores: int | None,
    host: int,
    confidence: float,
) -> dict[str, Any]:
    """The sweep as host-benchmark.json records it under ``host_threads`` (host figures)."""
    ratios = {
        str(r.count): {
            "ratio": _finite(r.median),
            "low": _finite(r.low),
            "high": _finite(r.high),
        }
        for r in run.answer.ratios
    }
    return {
        "figures": "host",
        "label": LABEL,
        "host_cores": host,
        "tier_cores": tier_cores,
        "declared_threads": declared,
        "counts": list(run.counts),
        "rounds": run.rounds,
        "seconds": round(run.seconds, 6),
        "budget_seconds": round(run.budget_seconds, 6),
        "stopped": run.stopped,
        "error": run.error,
        "settled": run.answer.settled,
        "confidence": confidence,
        # The smallest count within 5 % of the fastest on this host: only once
        # settled. Before that, the count ahead so far (noise may yet move it).
        "host_best": run.answer.recommended if run.answer.settled else None,
        "leading": run.answer.recommended,
        # Median per-round ratio of each count's latency to the leading count's, with its interval.
        "ratio_to_leading": ratios,
        "p50_ms": {str(n): _finite(_median(v)) if v else None for n, v in run.times_ms.items()},
    }


def checked_record(found: Any) -> dict[str, Any] | None:
    """A ``host_threads`` record read back from storage, if it has :func:`record`'s shape.

    host-benchmark.json comes back from disk (DVC restores it, a person edits
    it, an older build wrote it): a record of another shape, or one not labelled
    as host figures, is None, never a traceback where it is shown.
    """
    if not isinstance(found, dict) or found.get("figures") != "host":
        return None
    counts, ratios = found.get("counts"), found.get("ratio_to_leading")
    if not isinstance(counts, list) or not all(type(n) is int for n in counts):
        return None
    if not isinstance(ratios, dict) or not all(
        isinstance(entry, dict) and all(_number(entry.get(k)) for k in ("ratio", "low", "high"))
        for entry in ratios.values()
    ):
        return None
    whole = ("leading", "host_best", "rounds", "host_cores", "tier_cores", "declared_threads")
    if not all(found.get(k) is None or type(found.get(k)) is int for k in whole):
        return None
    if not all(_number(found.get(k)) for k in ("seconds", "budget_seconds")):
        return None
    if not isinstance(found.get("stopped"), str):
        return None
    return found


def _number(value: Any) -> bool:
    """None or a number (a JSON true is not one)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 6)


def describe(found: Mapping[str, Any]) -> str:
    """One line for people: the sweep's ratios, its answer, its cost, and that it is the host's."""
    best = found.get("leading")
    ratios = found.get("ratio_to_leading") or {}
    parts = []
    for n in found.get("counts") or []:
        entry = ratios.get(str(n)) or {}
        ratio, low, high = entry.get("ratio"), entry.get("low"), entry.get("high")
        if ratio is None:
            continue
        interval = "" if low is None or high is None else f" [{low:.2f}-{high:.2f}]"
        parts.append(f"{n} thr {ratio:.2f}x{interval}")
    if found.get("stopped") == "single":
        outcome = "one count only, nothing to compare"
    elif found.get("stopped") == "error":
        outcome = f"could not run ({found.get('error')})"
    elif best is None or not parts:
        outcome = f"no rounds within its {_seconds(found.get('budget_seconds'))} budget"
    elif found.get("settled"):
        outcome = (
            f"{', '.join(parts)} of {best} thr's latency; the smallest count within "
            f"{WITHIN:.0%} of the fastest here: {best} (settled after "
            f"{found.get('rounds')} interleaved rounds)"
        )
    else:
        outcome = (
            f"{', '.join(parts)} of {best} thr's latency; not settled after "
            f"{found.get('rounds')} interleaved rounds ({best} thr leads so far)"
        )
    cores = f"counts up to the host's {found.get('host_cores')} cores"
    if found.get("tier_cores"):
        cores += f", the tier's {found.get('tier_cores')}"
    return (
        f"host thread sweep ({LABEL}): {outcome}; {cores}; "
        f"{_seconds(found.get('seconds'))} of a {_seconds(found.get('budget_seconds'))} budget"
    )


def _seconds(value: Any) -> str:
    return f"{value:.2f} s" if isinstance(value, (int, float)) else "-"
