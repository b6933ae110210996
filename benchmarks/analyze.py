"""Canary analysis benchmark: `edgereg analyze` on 20,000 and on 1,000,000 reports.

Builds the tiny test project (a few seconds), publishes 1.0.0 as stable and
1.1.0 as a 5 % canary to a registry on disk through the library, bulk-loads
the reports into SQLite stores with the store's own ``ingest_many`` (three
tiers, 10 % of the devices in the candidate arm, log-normal latencies, a few
failures), then runs the real command line as a user would:

    edgereg analyze vision --json --registry file://... --trusted-key ... --reports sqlite:///...

Start-up (issue 18), on a store of 20,000 reports: target under 1 s (median
of 9 fresh processes). Printed with it: `edgereg --version` (the floor: the
interpreter, click and the entry point), the same analyze command run again
in one warm process (imports done, schemas built: what the command itself
costs), and the start-up share, (fresh - warm) / fresh: what a new process
pays before and around the work, most of it imports (the sum of -X
importtime's top-level modules is printed too). The children run with a
bytecode cache, as an installed package has (PYTHONDONTWRITEBYTECODE would
make every run compile edgereg's sources: printed once for comparison).
``--baseline REV`` measures the edgereg package of an older revision the
same way, alternating runs with this tree (the machine is shared), and runs
it on the large store too, alternating with this tree's runs (a revision
that reads the same store schema).

1,000,000 reports with 5 app metrics (issue 26): the project's models.toml
declares three rates and two distributions of 8 buckets on the model, with
six guardrails on them (a rate's drop, a mean, a share below an edge), and
every report that ran the model is of schema 3 carrying all five (in each
install's row since the store's schema 8; schema 7 wrote 5,000,000 metric rows
beside the million reports). Target under 5 s (median of 3 fresh processes: imports,
the verified registry read, the store's GROUP BY and the statistics). Also
printed: the peak memory of that process (its own VmHWM, imports included)
against the same command on 20,000 reports (memory must not grow with the
reports: the store aggregates, the analysis reads buckets), and how the
time splits between the store's summaries and the analysis. With
``--without-metrics`` the same reports again without app metrics (no metric
declared, schema 2 reports with every other key alike), in the same run, the
analyze runs alternating: the price of the metrics, in the bulk load (the
store's ``ingest_many``) and in `edgereg analyze`.

Usage: .venv/bin/python benchmarks/analyze.py [--reports 1000000] [--runs 3]
       [--baseline REV] [--without-metrics]

A small setting for a busy 2-core machine (about 4 minutes):
    .venv/bin/python benchmarks/analyze.py --reports 50000 --runs 1 --without-metrics
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from edgereg import config as config_module  # noqa: E402
from edgereg.analysis import analysis_periods  # noqa: E402
from edgereg.protocol.envelope import Signer, generate_key  # noqa: E402
from edgereg.protocol.reports import (  # noqa: E402
    DistributionCounts,
    LatencySummary,
    RateCounts,
    Report,
)
from edgereg.registry import Registry, prepare_release, utcnow  # noqa: E402
from edgereg.reports import open_store  # noqa: E402
from edgereg.reports.canary import rollout_analysis  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

MODEL = "vision"
TIERS = ("high", "mid", "low")
CHUNK = 50_000
TARGET_S = 5.0
SMALL = 20_000
SMALL_TARGET_S = 1.0
results: list[tuple[str, bool, str]] = []

# Five app metrics (docs/operations/canary-analysis.md "App metrics") and guardrails on
# each, the way a text recognizer's team would write them.
APP_METRICS_TOML = """
[models.vision.metrics.accepted]
kind = "rate"
description = "the user kept the answer"

[models.vision.metrics.cloud_fallback]
kind = "rate"
better = "lower"

[models.vision.metrics.retried]
kind = "rate"
better = "lower"

[models.vision.metrics.confidence]
kind = "distribution"
buckets = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
unit = "score"

[models.vision.metrics.edit_distance]
kind = "distribution"
buckets = [0, 1, 2, 3, 5, 8, 13]
better = "lower"
unit = "characters"

[rollout.guardrails.accepted]
metric = "accepted"
max_worse = 0.01

[rollout.guardrails.cloud_fallback]
metric = "cloud_fallback"
max_worse = 0.01

[rollout.guardrails.retried]
metric = "retried"
max_worse = 0.01
critical = false

[rollout.guardrails.confident]
metric = "confidence"
max_worse = 0.05
critical = false

[rollout.guardrails.unsure]
metric = "confidence"
stat = "share_below"
threshold = 0.5
max_worse = 0.02

[rollout.guardrails.edits]
metric = "edit_distance"
max_worse = 0.25
"""
PLAIN_CONFIG = "models-without-metrics.toml"
METRIC_GUARDRAILS = ("accepted", "cloud_fallback", "retried", "confident", "unsure", "edits")
RATES = {"accepted": 0.92, "cloud_fallback": 0.07, "retried": 0.03}
CONFIDENCE_EDGES = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
EDIT_EDGES = (0, 1, 2, 3, 5, 8, 13)


def report(target: str, passed: bool, measured: str) -> None:
    results.append((target, passed, measured))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}", flush=True)


def publish_rollout(project: Path, registry_root: Path, key_pem: bytes) -> Registry:
    """1.0.0 stable for everyone, then 1.1.0 as a 5 % canary."""
    import buildkit

    buildkit.write_project(project)
    plain = (project / "models.toml").read_text()
    (project / PLAIN_CONFIG).write_text(plain)  # --without-metrics: the project before
    with (project / "models.toml").open("a") as toml:
        toml.write(APP_METRICS_TOML)
    built = buildkit.Project(project)
    for variant in buildkit.VARIANTS[MODEL]:
        built.build(MODEL, variant)
    config = config_module.load(project / "models.toml")
    signer = Signer.from_pem(key_pem)
    registry = Registry(open_storage(f"file://{registry_root}"))
    for version, full in (("1.0.0", True), ("1.1.0", False)):
        prepared = prepare_release(config, MODEL, project / "build", version=version, now=utcnow())
        registry.publish(
            prepared,
            signer=signer,
            percent=None if full else 5.0,
            full=full,
            actor="bench",
            expires_days=30,
        )
    return registry


def bucket(value: float, edges: tuple[float, ...]) -> int:
    """The bucket a value falls in: an edge closes its bucket (docs/protocol.md §11)."""
    return next((i for i, edge in enumerate(edges) if value <= edge), len(edges))


def app_metrics(rng: random.Random) -> dict[str, Any]:
    """One install's totals: a few days to weeks of use, the same in both arms (A/A)."""
    events = 5 + int(rng.expovariate(1 / 30))
    metrics: dict[str, Any] = {}
    for name, rate in RATES.items():
        successes = sum(rng.random() < rate for _ in range(events))
        metrics[name] = RateCounts.model_construct(events=events, successes=successes)
    confidence = [0] * (len(CONFIDENCE_EDGES) + 1)
    edits = [0] * (len(EDIT_EDGES) + 1)
    for _ in range(events):
        confidence[bucket(rng.betavariate(8, 2), CONFIDENCE_EDGES)] += 1
        edits[bucket(int(rng.expovariate(0.8)), EDIT_EDGES)] += 1
    metrics["confidence"] = DistributionCounts.model_construct(counts=confidence)
    metrics["edit_distance"] = DistributionCounts.model_construct(counts=edits)
    return metrics


# A pool of installs' totals the reports draw from: drawing a million totals one event
# at a time would take longer than the bulk load itself.
_POOL = 4096


def reports(count: int, received: datetime, rng: random.Random, with_metrics: bool = True):  # type: ignore[no-untyped-def]
    """``count`` (report, received_at) pairs, built without validation (they are ours)."""
    pool = [app_metrics(rng) for _ in range(_POOL)] if with_metrics else []
    for index in range(count):
        candidate = index % 10 == 0
        tier = TIERS[index % 3]
        failed = rng.random() < (0.004 if candidate else 0.003)
        load = rng.lognormvariate(3.4 if tier == "high" else 3.9, 0.35)
        p50 = rng.lognormvariate(1.6 if tier == "high" else 2.2, 0.3)
        inference = LatencySummary.model_construct(
            count=50, p50_ms=p50, p90_ms=p50 * 1.6, p99_ms=p50 * 2.5
        )
        version = "1.1.0" if candidate else "1.0.0"
        # A refused release never ran: its report counts nothing (docs/protocol.md §11).
        metrics = pool[rng.randrange(_POOL)] if with_metrics and not failed else None
        peak = None if failed else rng.lognormvariate(3.0, 0.3)
        yield (
            Report.model_construct(
                # The keys of schema 2 in every report: the two stores differ in the metrics.
                schema_version=2 if metrics is None else 3,
                token=secrets.token_hex(16),
                unit=MODEL,
                model=MODEL,
                version=version,
                unit_version=version,
                variant=tier,
                tier=tier,
                arm="candidate" if candidate else "stable",
                sequence=2,
                probe="failed" if failed else "passed",
                backend=None if failed else "cpu",
                backends_skipped=[],
                load_ms=None if failed else load,
                load_failed=False,
                inference=None if failed else inference,
                confirmed=not failed,
                reverted=False,
                mnn_runtime="3.6.1",
                os="android",
                os_version="14",
                device_class="ram4-8c",
                unconfirmed_starts=0,
                cpu_class="armv8.2",
                memory_peak_mb=peak,
                memory_steady_mb=None if peak is None else peak * 0.8,
                first_inference_ms=None if failed else p50 * 3,
                metrics=metrics,
            ),
            received,
        )


class TimedStore:
    """A report store whose every call is timed (the split store / analysis)."""

    def __init__(self, store: Any) -> None:
        self.store, self.seconds, self.calls, self.arms = store, 0.0, 0, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if not callable(method):
            return method

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                found = method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1
            if name == "summaries":
                self.arms += len(found)
            return found

        return timed


def fill(store_path: Path, count: int, received: datetime, with_metrics: bool = True) -> float:
    rng = random.Random(7)
    start = time.perf_counter()
    with open_store(f"sqlite:///{store_path}") as store:
        batch = []
        for pair in reports(count, received, rng, with_metrics):
            batch.append(pair)
            if len(batch) == CHUNK:
                store.ingest_many(batch)
                batch = []
        if batch:
            store.ingest_many(batch)
        assert store.count() == count
    return time.perf_counter() - start


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child
# of this (large) process would report this process's peak as its own.
_MEASURED_MAIN = """
import atexit, sys
sys.argv = ["edgereg", *sys.argv[1:]]

# An exit handler: the console script ends the process with os._exit after its exit
# handlers (edgereg.cli.main.exit_process), so code after main() never runs.
@atexit.register
def peak_rss():
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print("peak-rss-kb", peak, file=sys.stderr)

from edgereg.cli import main
main()
"""

# The command `runs` times in one process: the first pays the imports and the
# schema builds, the rest are warm (what the command itself costs).
_WARM_MAIN = """
import contextlib, io, json, sys, time
runs, args = int(sys.argv[1]), sys.argv[2:]
from edgereg.cli import main
seconds = []
for _ in range(runs):
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
        except SystemExit as exit:
            assert exit.code in (0, 12, 13), exit.code
    seconds.append(time.perf_counter() - start)
print(json.dumps(seconds))
"""


def child_env(tree: Path, pycache: Path | None) -> dict[str, str]:
    """The environment of a child running the edgereg package in ``tree``.

    ``pycache``: cache bytecode there (an installed package has its .pyc files);
    None: compile every module on every run, as PYTHONDONTWRITEBYTECODE does.
    """
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def analyze_args(tmp: Path, store_path: Path, config: str = "models.toml") -> list[str]:
    return [
        "analyze",
        MODEL,
        "--json",
        # The project's guardrails and app metrics, as `edgereg analyze` run in it reads them.
        "--config",
        str(tmp / "project" / config),
        "--registry",
        f"file://{tmp / 'registry'}",
        "--trusted-key",
        str(tmp / "publisher.pem"),
        "--reports",
        f"sqlite:///{store_path}",
    ]


def run_analyze(
    tmp: Path, store_path: Path, runs: int, env: dict[str, str], config: str = "models.toml"
) -> tuple[list[float], list[float], float, Any]:
    """Seconds and CPU seconds of each run, the largest peak RSS in MB, the last JSON result.

    CPU time (user + system): on a loaded machine the wall time also holds the waits
    for a core.
    """
    # The command line in a fresh interpreter that reports its own peak RSS last.
    command = [sys.executable, "-c", _MEASURED_MAIN, *analyze_args(tmp, store_path, config)]
    seconds, cpu, peaks = [], [], []
    for _ in range(runs):
        before = _children_cpu()
        t = time.perf_counter()
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - t)
        cpu.append(_children_cpu() - before)
        if done.returncode not in (0, 12, 13):
            sys.exit(f"edgereg analyze failed ({done.returncode}):\n{done.stderr}")
        peaks.append(int(done.stderr.strip().splitlines()[-1].split()[-1]) / 1024)
    return seconds, cpu, max(peaks), json.loads(done.stdout)


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that ended so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh_seconds(tmp: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of `edgereg ARGS` in a new process (the console script's code).

    CPU time (user + system) is what the process did; on a shared machine the
    wall time also holds the waits for a core.
    """
    command = [sys.executable, "-c", "from edgereg.cli import main; main()", *args]
    before = _children_cpu()
    t = time.perf_counter()
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    cpu = _children_cpu() - before
    if done.returncode not in (0, 12, 13):
        sys.exit(f"edgereg {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return seconds, cpu


def warm_seconds(tmp: Path, args: list[str], env: dict[str, str], runs: int = 4) -> float:
    """The median of the warm runs of ``args`` in one process (the first, cold, is dropped)."""
    command = [sys.executable, "-c", _WARM_MAIN, str(runs), *args]
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"edgereg {' '.join(args)} failed in process:\n{done.stderr}")
    return statistics.median(json.loads(done.stdout)[1:])


def import_seconds(tmp: Path, args: list[str], env: dict[str, str]) -> float:
    """What -X importtime counts for `edgereg ARGS`: the sum of its top-level imports."""
    command = [sys.executable, "-X", "importtime", "-c", _MEASURED_MAIN, *args]
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env)
    total = 0
    for line in done.stderr.splitlines():
        fields = line.split("|")
        # "import time: self | cumulative | name"; a top-level module's name is not indented.
        top_level = len(fields) == 3 and fields[2][1:2] != " " and fields[1].strip().isdigit()
        if line.startswith("import time:") and top_level:
            total += int(fields[1])
    return total / 1e6


def startup(
    tmp: Path, store_path: Path, envs: dict[str, dict[str, str]], runs: int
) -> dict[str, dict[str, float]]:
    """Per tree: fresh `--version` and analyze (medians), warm analyze, imports, all printed.

    The trees' runs alternate, so a burst of load elsewhere skews them alike.
    """
    args = analyze_args(tmp, store_path)
    version: dict[str, list[tuple[float, float]]] = {label: [] for label in envs}
    fresh: dict[str, list[tuple[float, float]]] = {label: [] for label in envs}
    for _ in range(runs):
        for label, env in envs.items():
            version[label].append(fresh_seconds(tmp, ["--version"], env))
            fresh[label].append(fresh_seconds(tmp, args, env))
    measured = {}
    for label, env in envs.items():
        found = {
            "version": statistics.median(wall for wall, _ in version[label]),
            "version_cpu": statistics.median(cpu for _, cpu in version[label]),
            "fresh": statistics.median(wall for wall, _ in fresh[label]),
            "fresh_cpu": statistics.median(cpu for _, cpu in fresh[label]),
            "warm": warm_seconds(tmp, args, env),
            "imports": import_seconds(tmp, args, env),
        }
        start = found["fresh"] - found["warm"]
        walls = ", ".join(f"{wall:.2f}" for wall, _ in fresh[label])
        print(
            f"  {label}: `edgereg --version` {found['version']:.2f} s (CPU "
            f"{found['version_cpu']:.2f} s); `edgereg analyze --json` {found['fresh']:.2f} s "
            f"(runs {walls}; CPU {found['fresh_cpu']:.2f} s); the same command warm in one "
            f"process {found['warm']:.3f} s; start-up {start:.2f} s = "
            f"{start / found['fresh']:.0%} of it (-X importtime's top-level imports "
            f"{found['imports']:.2f} s)",
            flush=True,
        )
        measured[label] = found
    return measured


def extract_revision(revision: str, workdir: Path) -> Path:
    """The ``edgereg`` package as of a git revision, in a directory to put on PYTHONPATH."""
    target = workdir / "baseline"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "edgereg"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure start-up and the analysis with edgereg as of REV (one that reads "
        "this store schema), runs alternating",
    )
    parser.add_argument(
        "--without-metrics",
        action="store_true",
        help="also the same reports without app metrics (schema 2), runs alternating",
    )
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="edgereg-bench-analyze-") as tmp_name:
        tmp = Path(tmp_name)
        private_pem, public_pem = generate_key()
        (tmp / "publisher.pem").write_bytes(public_pem)
        registry = publish_rollout(tmp / "project", tmp / "registry", private_pem)
        state, _ = registry.read_state(MODEL)
        assert state is not None
        since, _ = analysis_periods(state)
        assert since is not None
        store_path = tmp / "reports.sqlite"
        loaded = fill(store_path, args.reports, since + timedelta(seconds=1))
        size_mb = store_path.stat().st_size / 1e6
        print(
            f"bulk insert of {args.reports:,} reports with 5 app metrics: {loaded:.1f} s "
            f"({args.reports / loaded:,.0f} reports/s); store {size_mb:.0f} MB",
            flush=True,
        )

        # In this process: where the time goes (what `edgereg analyze` runs, the store timed).
        config = config_module.load(tmp / "project" / "models.toml")
        declared = config.unit_metrics(MODEL)
        with open_store(f"sqlite:///{store_path}") as store:
            timed = TimedStore(store)
            t = time.perf_counter()
            verdict = rollout_analysis(
                timed,
                state,
                guardrails=config.rollout_policy(MODEL).guardrails,
                tiers=TIERS,
                now=registry.clock(),
                metrics=declared,
            ).verdict
            total = time.perf_counter() - t
        print(
            f"in one process: {total:.2f} s, of it the store {timed.seconds:.2f} s "
            f"({timed.calls} queries, {timed.arms} arm summaries) and the analysis "
            f"{(total - timed.seconds) * 1000:.0f} ms; {len(declared)} app metrics, "
            f"verdict {verdict}",
            flush=True,
        )

        small_path = tmp / "small.sqlite"
        fill(small_path, SMALL, since + timedelta(seconds=1))
        trees = {"this tree": ROOT}
        if args.baseline:
            trees[f"baseline {args.baseline}"] = extract_revision(args.baseline, tmp)
        envs = {
            label: child_env(tree, tmp / "pycache" / str(index))
            for index, (label, tree) in enumerate(trees.items())
        }
        for env in envs.values():
            fresh_seconds(tmp, analyze_args(tmp, small_path), env)  # writes the bytecode cache
        print(
            f"start-up, {SMALL:,} reports, median of 9 fresh processes (load average "
            f"{os.getloadavg()[0]:.1f}):",
            flush=True,
        )
        measured = startup(tmp, small_path, envs, 9)
        if args.baseline:
            before, after = measured[f"baseline {args.baseline}"], measured["this tree"]
            print(
                f"  this tree / baseline: --version {after['version'] / before['version']:.2f}x "
                f"(CPU {after['version_cpu'] / before['version_cpu']:.2f}x), analyze "
                f"{after['fresh'] / before['fresh']:.2f}x "
                f"(CPU {after['fresh_cpu'] / before['fresh_cpu']:.2f}x)",
                flush=True,
            )
        uncached = statistics.median(
            fresh_seconds(tmp, analyze_args(tmp, small_path), child_env(ROOT, None))[0]
            for _ in range(3)
        )
        print(
            f"  this tree without cached bytecode (PYTHONDONTWRITEBYTECODE=1, median of 3): "
            f"{uncached:.2f} s",
            flush=True,
        )
        small = measured["this tree"]
        report(
            f"`edgereg analyze` on {SMALL:,} stored reports in under {SMALL_TARGET_S:g} s",
            small["fresh"] < SMALL_TARGET_S,
            f"{small['fresh']:.2f} s, of it start-up {small['fresh'] - small['warm']:.2f} s "
            f"({(small['fresh'] - small['warm']) / small['fresh']:.0%}); "
            f"`edgereg --version` {small['version']:.2f} s",
        )

        env = envs["this tree"]
        plain_path = tmp / "plain.sqlite"
        if args.without_metrics:
            plain_loaded = fill(plain_path, args.reports, since + timedelta(seconds=1), False)
            print(
                f"bulk insert of {args.reports:,} reports without app metrics (schema 2): "
                f"{plain_loaded:.1f} s ({args.reports / plain_loaded:,.0f} reports/s); store "
                f"{plain_path.stat().st_size / 1e6:.0f} MB; with / without metrics "
                f"{plain_loaded / loaded:.2f}x the reports/s",
                flush=True,
            )
        print(
            f"load average {os.getloadavg()[0]:.1f} before the runs on {args.reports:,} reports",
            flush=True,
        )
        runs: list[float] = []
        cpu: list[float] = []
        plain_runs: list[float] = []
        baseline_runs: list[float] = []
        baseline_cpu: list[float] = []
        baseline_env = envs.get(f"baseline {args.baseline}")
        peak_mb = 0.0
        for _ in range(args.runs):  # alternating, so a burst of load elsewhere skews both
            seconds, used, peak, result = run_analyze(tmp, store_path, 1, env)
            runs += seconds
            cpu += used
            peak_mb = max(peak_mb, peak)
            if baseline_env is not None:
                seconds, used, _, before = run_analyze(tmp, store_path, 1, baseline_env)
                baseline_runs += seconds
                baseline_cpu += used
            if args.without_metrics:
                seconds, _, _, plain = run_analyze(tmp, plain_path, 1, env, PLAIN_CONFIG)
                plain_runs += seconds
        _, _, small_mb, _ = run_analyze(tmp, small_path, 1, env)
        devices = sum(t["candidate_devices"] + t["stable_devices"] for t in result["tiers"])
        assert devices == args.reports, devices
        judged = sorted({g["name"] for t in result["tiers"] for g in t["guardrails"]})
        on_metrics = [name for name in judged if name in METRIC_GUARDRAILS]
        assert len(on_metrics) == len(METRIC_GUARDRAILS), judged
        median = statistics.median(runs)
        print(
            f"`edgereg analyze --json` on {devices:,} reports with {len(RATES) + 2} app metrics: "
            f"median {median:.2f} s (runs {', '.join(f'{r:.2f}' for r in runs)}; load average "
            f"{os.getloadavg()[0]:.1f}); verdict {result['verdict']}; guardrails judged "
            f"{', '.join(judged)}; peak RSS {peak_mb:.0f} MB ({small_mb:.0f} MB on {SMALL:,} "
            "reports)",
            flush=True,
        )
        if baseline_env is not None:
            baseline_median = statistics.median(baseline_runs)
            cpu_median = statistics.median(cpu)
            baseline_cpu_median = statistics.median(baseline_cpu)
            print(
                f"the baseline {args.baseline} on the same {args.reports:,} reports: median "
                f"{baseline_median:.2f} s (runs {', '.join(f'{r:.2f}' for r in baseline_runs)}); "
                f"verdict {before['verdict']}; this tree / baseline "
                f"{median / baseline_median:.2f}x (CPU {cpu_median:.2f} s / "
                f"{baseline_cpu_median:.2f} s = {cpu_median / baseline_cpu_median:.2f}x)",
                flush=True,
            )
        if args.without_metrics:
            plain_median = statistics.median(plain_runs)
            print(
                f"the same {args.reports:,} without app metrics (none declared, schema 2): median "
                f"{plain_median:.2f} s (runs {', '.join(f'{r:.2f}' for r in plain_runs)}); "
                f"verdict {plain['verdict']}; with / without {median / plain_median:.2f}x",
                flush=True,
            )
        report(
            f"`edgereg analyze` on {args.reports:,} stored reports in under {TARGET_S:g} s",
            median < TARGET_S,
            f"{median:.2f} s ({median / TARGET_S:.2f}x the target)",
        )
        report(
            f"peak memory does not grow with the reports ({SMALL:,} -> {args.reports:,}: "
            "< 20 MB more)",
            peak_mb - small_mb < 20,
            f"{small_mb:.0f} -> {peak_mb:.0f} MB",
        )
    print("\nsummary")
    for target, passed, measured_text in results:
        print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured_text}")
    sys.exit(0 if all(passed for _, passed, _ in results) else 1)


if __name__ == "__main__":
    main()
