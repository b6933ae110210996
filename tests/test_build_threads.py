"""The host thread sweep's core: interleaved rounds, a bounded cost, a settled answer, its label.

The timings here are simulated on an injected clock: load that drifts while
a sweep runs, and noise of a known size, are what a real host cannot be made
to produce on demand. The end of this file runs the sweep in the benchmark's
child on real MNN (a sweep that fails, its deadline); builds with it are tested
in tests/test_build_memory.py (the host sweep is labelled, bounded and never shipped).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_models

from edgereg.build.outputs import HostBenchmark
from edgereg.build.threads import (
    LABEL,
    SweepPolicy,
    SweepRun,
    answer,
    describe,
    record,
    round_order,
    run_sweep,
    sign_interval,
)
from edgereg.toolchain import benchmark, convert


class Host:
    """A fake host: a forward pass at ``n`` threads takes ``base[n]`` seconds times the load."""

    def __init__(
        self,
        base: Mapping[int, float],
        *,
        load: Callable[[float], float] = lambda t: 1.0,
        noise: float = 0.0,
        seed: int = 7,
    ) -> None:
        self.now = 0.0
        self.base = dict(base)
        self.load = load
        self.noise = noise
        self.random = random.Random(seed)
        self.order: list[int] = []

    def clock(self) -> float:
        return self.now

    def forward(self, n: int) -> None:
        self.order.append(n)
        jitter = 1.0 + self.random.uniform(-self.noise, self.noise)
        self.now += self.base[n] * self.load(self.now) * jitter


def test_rounds_alternate_their_order_so_drift_within_a_round_cancels() -> None:
    assert [round_order((2, 1), i) for i in range(4)] == [(1, 2), (2, 1), (1, 2), (2, 1)]
    host = Host({1: 0.01, 2: 0.01})
    run_sweep(
        (1, 2),
        host.forward,
        clock=host.clock,
        budget_seconds=10.0,
        policy=SweepPolicy(warmup=0, min_rounds=4, max_rounds=4),
    )
    assert host.order == [1, 2, 2, 1, 1, 2, 2, 1]


def test_load_that_doubles_during_the_sweep_does_not_change_the_answer() -> None:
    # 2 threads are truly 30 % faster. The host's load triples over the sweep:
    # timed one count after the other, 1 thread would look faster (the flip).
    truth = {1: 0.010, 2: 0.007}

    def load(t: float) -> float:
        return 1.0 + 2.0 * min(t / 0.5, 1.0)

    sequential = Host(truth, load=load)
    p50 = {}
    for n in (1, 2):
        start = sequential.now
        for _ in range(25):
            sequential.forward(n)
        p50[n] = (sequential.now - start) / 25
    assert p50[1] < p50[2]  # the sequential way chose wrongly

    host = Host(truth, load=load, noise=0.05)
    run = run_sweep(
        (1, 2),
        host.forward,
        clock=host.clock,
        budget_seconds=10.0,
        policy=SweepPolicy(warmup=1, min_rounds=6, max_rounds=25),
    )
    assert run.answer.recommended == 2
    assert run.answer.settled
    ratio = next(r for r in run.answer.ratios if r.count == 1)
    assert ratio.median == pytest.approx(10 / 7, rel=0.08)


def test_a_clear_answer_stops_early_well_inside_the_budget() -> None:
    host = Host({1: 0.010, 2: 0.006, 3: 0.0061, 4: 0.0075}, noise=0.03)
    policy = SweepPolicy(warmup=1, min_rounds=6, max_rounds=400)
    run = run_sweep((1, 2, 3, 4), host.forward, clock=host.clock, budget_seconds=5.0, policy=policy)
    assert (run.stopped, run.answer.settled, run.answer.recommended) == ("settled", True, 2)
    assert run.rounds <= 10
    assert run.seconds < 0.1 * run.budget_seconds


def test_an_answer_that_never_settles_stops_at_the_budget() -> None:
    # 2 threads are 4 % faster, inside the 5 % band's edge with 10 % noise: no answer
    # at 95 % is possible in a few rounds, so the budget ends the sweep.
    host = Host({1: 0.010, 2: 0.0096}, noise=0.10, seed=3)
    budget = 0.3
    run = run_sweep(
        (1, 2),
        host.forward,
        clock=host.clock,
        budget_seconds=budget,
        policy=SweepPolicy(warmup=2, min_rounds=6, max_rounds=10_000),
    )
    assert run.stopped == "budget"
    assert not run.answer.settled
    assert run.seconds <= budget
    assert run.rounds > 6


def test_loads_and_warm_up_count_against_the_budget() -> None:
    host = Host({1: 0.2, 2: 0.15})
    loaded: list[int] = []

    def prepare(n: int) -> bool:
        loaded.append(n)
        if n == 1:  # the variant's own count: loaded and warm already
            return False
        host.now += 0.5  # a load
        return True

    run = run_sweep(
        (1, 2),
        host.forward,
        clock=host.clock,
        budget_seconds=0.8,
        policy=SweepPolicy(warmup=2),
        prepare=prepare,
    )
    assert loaded == [1, 2]
    assert host.order == [2, 2]  # only the loaded count warms up; then no round fits
    assert (run.stopped, run.rounds) == ("budget", 0)
    assert run.answer.recommended is None


def test_one_count_is_no_sweep() -> None:
    host = Host({4: 0.01})
    run = run_sweep((4,), host.forward, clock=host.clock, budget_seconds=1.0, policy=SweepPolicy())
    assert (run.stopped, run.rounds, host.order) == ("single", 0, [])
    line = describe(record(run, declared=4, tier_cores=None, host=2, confidence=0.95))
    assert "one count only" in line


def test_a_sweep_out_of_budget_before_its_first_round_says_so() -> None:
    host = Host({1: 0.5, 2: 0.5})
    run = run_sweep(
        (1, 2), host.forward, clock=host.clock, budget_seconds=0.6, policy=SweepPolicy()
    )
    assert (run.stopped, run.rounds) == ("budget", 0)
    line = describe(record(run, declared=1, tier_cores=None, host=2, confidence=0.95))
    assert "no rounds within its 0.60 s budget" in line
    assert "not a phone" in line


@pytest.mark.parametrize(
    ("times", "recommended", "settled"),
    [
        # 2 clearly faster than 1: settled at 2.
        ({1: [10.0] * 6, 2: [6.0] * 6}, 2, True),
        # equal: the smaller count, settled (2 is not 5 % faster).
        ({1: [10.0] * 6, 2: [10.0] * 6}, 1, True),
        # 2 is 20 % faster in most rounds but slower in two: not settled at 95 %.
        ({1: [10.0] * 6, 2: [8.0, 8.0, 8.0, 8.0, 12.0, 12.0]}, 2, False),
        # too few rounds for a 95 % interval.
        ({1: [10.0] * 5, 2: [6.0] * 5}, 2, False),
        # 3 fastest, 2 within 5 % of it: 1 is passed over because it is 6.7 % slower than
        # the fastest (only 3.2 % slower than 2, which it is not compared with).
        ({1: [6.4] * 6, 2: [6.2] * 6, 3: [6.0] * 6}, 2, True),
        # 2 is 4 % faster in every round: within the band, 1 stays, settled.
        ({1: [10.0] * 6, 2: [9.6] * 6}, 1, True),
        # ... but 10 % faster in one round of six: 2 may be more than 5 % faster than
        # the recommended 1, not excluded at 95 %: not settled.
        ({1: [10.0] * 6, 2: [9.6] * 5 + [9.0]}, 1, False),
    ],
)
def test_the_answer_is_settled_only_when_each_comparison_is_outside_the_band(
    times: dict[int, list[float]], recommended: int, settled: bool
) -> None:
    found = answer(times, sorted(times), confidence=0.95)
    assert (found.recommended, found.settled) == (recommended, settled)


def test_the_sign_interval_needs_six_values_at_95_percent() -> None:
    assert sign_interval([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) is None
    assert sign_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0], 0.95) == (1.0, 6.0)
    # 20 values: the 6th smallest and the 6th largest (P(B(20, .5) <= 5) = 2.07 %).
    assert sign_interval([float(v) for v in range(20)], 0.95) == (5.0, 14.0)
    # Past 1023 rounds (a policy of more rounds, a fast model): no float overflow.
    # 1100 values: P(B(1100, .5) <= 516) = 2.0 %, <= 517: 2.3 %.
    assert sign_interval([float(v) for v in range(1100)], 0.95) == (517.0, 582.0)


def test_the_record_says_it_is_the_build_hosts_and_reads_back() -> None:
    host = Host({1: 0.010, 2: 0.006}, noise=0.02)
    policy = SweepPolicy(warmup=1)
    run = run_sweep((1, 2), host.forward, clock=host.clock, budget_seconds=2.0, policy=policy)
    again = SweepRun.from_json(run.to_json(), confidence=policy.confidence)
    assert again.answer == run.answer
    found = record(again, declared=4, tier_cores=8, host=2, confidence=policy.confidence)
    assert (found["figures"], found["label"]) == ("host", LABEL)
    assert (found["host_best"], found["settled"], found["stopped"]) == (2, True, "settled")
    assert found["leading"] == 2
    # Every count the sweep names is named as the host's.
    assert {key for key in found if key.endswith(("best", "fastest"))} == {
        "host_best",
    }
    line = describe(found)
    assert "not a phone" in line
    assert "never shipped" in line
    assert "host's 2 cores, the tier's 8" in line


@pytest.mark.parametrize(
    "options",
    [{"share": 1.5}, {"share": -0.1}, {"confidence": 1.0}, {"min_rounds": 0}, {"warmup": -1}],
)
def test_a_policy_out_of_range_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="expected"):
        SweepPolicy(**options)  # type: ignore[arg-type]


def test_the_budget_is_a_share_of_the_build_so_far() -> None:
    assert SweepPolicy().budget_seconds(20.0) == pytest.approx(3.0)
    assert SweepPolicy(share=0.0).budget_seconds(20.0) == 0.0


# --- the sweep in the benchmark's child, on real MNN ----------------------------------


@pytest.fixture(scope="module")
def conv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """The tiny conv classifier as fp32 MNN, and one zero image for it."""
    root = tmp_path_factory.mktemp("sweep")
    tiny_models.conv_classifier(root / "conv.onnx")
    convert(root / "conv.onnx", root / "conv.mnn")
    return root / "conv.mnn", {"image": np.zeros((1, *tiny_models.CONV_SHAPE), np.float32)}


def test_a_sweep_that_fails_is_recorded_and_the_benchmark_stands(
    conv: tuple[Path, dict[str, np.ndarray]],
) -> None:
    # A policy the child refuses stands in for any failure of the sweep (MNN refusing a
    # runtime at another count, an allocation failing): the variant's own timing stands.
    path, sample = conv
    policy = {**SweepPolicy().to_json(), "share": 2.0}
    result = benchmark(
        path,
        sample,
        threads=(2,),
        warmup=1,
        iterations=3,
        sweep={"counts": [1, 2], "prior_seconds": 1.0, "policy": policy},
    )
    assert result.latency_ms[2].p50 > 0
    assert result.sweep is not None
    assert result.sweep["stopped"] == "error"
    assert "share is 2.0" in result.sweep["error"]
    run = SweepRun.from_json(result.sweep, confidence=0.95)
    found = record(run, declared=2, tier_cores=None, host=2, confidence=0.95)
    assert (found["stopped"], found["settled"], found["leading"]) == ("error", False, None)
    line = describe(found)
    assert "could not run (ValueError: share is 2.0" in line
    assert "not a phone" in line


def test_the_sweep_ends_by_half_the_childs_timeout_whatever_its_budget(
    conv: tuple[Path, dict[str, np.ndarray]],
) -> None:
    # A build of a million seconds gives a budget of 150,000 s, and this policy never
    # calls the answer settled: without the deadline the child runs into its timeout
    # and the benchmark (the variant's own timing with it) fails.
    path, sample = conv
    endless = SweepPolicy(min_rounds=10**6, max_rounds=10**6, warmup=1)
    result = benchmark(
        path,
        sample,
        threads=(1,),
        warmup=1,
        iterations=3,
        timeout=12.0,
        sweep={"counts": [1, 2], "prior_seconds": 1e6, "policy": endless.to_json()},
    )
    assert result.sweep is not None
    assert result.sweep["stopped"] == "budget"
    assert result.sweep["budget_seconds"] <= 6.0
    assert result.sweep["seconds"] <= 6.0
    assert len(result.sweep["times_ms"]["1"]) > 6


def _stored(found: Any) -> dict[str, Any]:
    """A host-benchmark.json document holding ``found`` as its sweep."""
    return {
        "figures": "host",
        "load_ms": 1.0,
        "peak_rss_mb": 40.0,
        "latency": [{"threads": 4, "p50_ms": 1.0, "p90_ms": 1.2}],
        "artifact_sha256": "a" * 64,
        "recipe_sha256": "b" * 64,
        "host_threads": found,
    }


@pytest.mark.parametrize(
    "damage",
    [
        {"ratio_to_leading": {"1": {"ratio": "1.30", "low": None, "high": None}}},
        {"ratio_to_leading": {"1": {"ratio": True, "low": None, "high": None}}},
        {"ratio_to_leading": [1.3, 1.0]},
        {"ratio_to_leading": {"1": 1.3}},
        {"counts": "1,2"},
        {"counts": [1.5, 2]},
        {"leading": "2"},
        {"seconds": "0.2"},
        {"stopped": None},
        {"figures": "phone"},
    ],
)
def test_a_stored_sweep_of_another_shape_is_dropped_not_shown_with_a_traceback(
    damage: dict[str, Any],
) -> None:
    host = Host({1: 0.010, 2: 0.006}, noise=0.02)
    run = run_sweep(
        (1, 2), host.forward, clock=host.clock, budget_seconds=2.0, policy=SweepPolicy()
    )
    found = record(run, declared=2, tier_cores=None, host=2, confidence=0.95)
    # As written, it reads back and is shown; edited, it is dropped (the report and
    # `edgereg summary` format its numbers).
    assert HostBenchmark.from_json(_stored(found)).threads == found
    assert "2 thr 1.00x" in describe(found)
    assert HostBenchmark.from_json(_stored({**found, **damage})).threads is None
    assert HostBenchmark.from_json(_stored("a sweep")).threads is None
