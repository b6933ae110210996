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
same way, alternating runs with this tree (the machine is shared).

1,000,000 reports: target under 5 s (median of 3 fresh processes: imports,
the verified registry read, the store's GROUP BY and the statistics). Also
printed: the peak memory of that process (its own VmHWM, imports included)
against the same command on 20,000 reports (memory must not grow with the
reports: the store aggregates, the analysis reads buckets), and how the
time splits between the store's summaries and the analysis.

Usage: .venv/bin/python benchmarks/analyze.py [--reports 1000000] [--baseline REV]
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
from edgereg.analysis import analysis_periods, analyze  # noqa: E402
from edgereg.protocol.envelope import Signer, generate_key  # noqa: E402
from edgereg.protocol.reports import LatencySummary, Report  # noqa: E402
from edgereg.registry import Registry, prepare_release, utcnow  # noqa: E402
from edgereg.reports import open_store  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

MODEL = "vision"
TIERS = ("high", "mid", "low")
CHUNK = 50_000
TARGET_S = 5.0
SMALL = 20_000
SMALL_TARGET_S = 1.0
results: list[tuple[str, bool, str]] = []


def report(target: str, passed: bool, measured: str) -> None:
    results.append((target, passed, measured))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}", flush=True)


def publish_rollout(project: Path, registry_root: Path, key_pem: bytes) -> Registry:
    """1.0.0 stable for everyone, then 1.1.0 as a 5 % canary."""
    import buildkit

    buildkit.write_project(project)
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


def reports(count: int, received: datetime, rng: random.Random):  # type: ignore[no-untyped-def]
    """``count`` (report, received_at) pairs, built without validation (they are ours)."""
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
        yield (
            Report.model_construct(
                schema_version=1,
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
            ),
            received,
        )


def fill(store_path: Path, count: int, received: datetime) -> float:
    rng = random.Random(7)
    start = time.perf_counter()
    with open_store(f"sqlite:///{store_path}") as store:
        batch = []
        for pair in reports(count, received, rng):
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
import sys
sys.argv = ["edgereg", *sys.argv[1:]]
try:
    from edgereg.cli import main
    main()
finally:
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print("peak-rss-kb", peak, file=sys.stderr)
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


def analyze_args(tmp: Path, store_path: Path) -> list[str]:
    return [
        "analyze",
        MODEL,
        "--json",
        "--registry",
        f"file://{tmp / 'registry'}",
        "--trusted-key",
        str(tmp / "publisher.pem"),
        "--reports",
        f"sqlite:///{store_path}",
    ]


def run_analyze(
    tmp: Path, store_path: Path, runs: int, env: dict[str, str]
) -> tuple[list[float], float, Any]:
    """Seconds of each run, the largest peak RSS in MB, and the last JSON result."""
    # The command line in a fresh interpreter that reports its own peak RSS last.
    command = [sys.executable, "-c", _MEASURED_MAIN, *analyze_args(tmp, store_path)]
    seconds, peaks = [], []
    for _ in range(runs):
        t = time.perf_counter()
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - t)
        if done.returncode not in (0, 12, 13):
            sys.exit(f"edgereg analyze failed ({done.returncode}):\n{done.stderr}")
        peaks.append(int(done.stderr.strip().splitlines()[-1].split()[-1]) / 1024)
    return seconds, max(peaks), json.loads(done.stdout)


def fresh_seconds(tmp: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of `edgereg ARGS` in a new process (the console script's code).

    CPU time (user + system) is what the process did; on a shared machine the
    wall time also holds the waits for a core.
    """
    command = [sys.executable, "-c", "from edgereg.cli import main; main()", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 12, 13):
        sys.exit(f"edgereg {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
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
        "--baseline", metavar="REV", help="also measure start-up with edgereg as of REV"
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
            f"bulk insert of {args.reports:,} reports: {loaded:.1f} s "
            f"({args.reports / loaded:,.0f} reports/s); store {size_mb:.0f} MB",
            flush=True,
        )

        # In this process: where the time goes.
        with open_store(f"sqlite:///{store_path}") as store:
            t = time.perf_counter()
            summaries = store.summaries(MODEL, since)
            read = time.perf_counter() - t
        t = time.perf_counter()
        verdict = analyze(
            summaries,
            unit=MODEL,
            candidate="1.1.0",
            stable="1.0.0",
            since=since,
            guardrails=config_module.Guardrails(),
            tiers=TIERS,
        ).verdict
        computed = time.perf_counter() - t
        buckets = sum(len(s.load_ms) + len(s.inference_p50_ms) for s in summaries)
        print(
            f"store summaries {read:.2f} s ({len(summaries)} arm summaries, {buckets} buckets); "
            f"analysis {computed * 1000:.0f} ms; verdict {verdict}",
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
        runs, peak_mb, result = run_analyze(tmp, store_path, args.runs, env)
        _, small_mb, _ = run_analyze(tmp, small_path, 1, env)
        devices = sum(t["candidate_devices"] + t["stable_devices"] for t in result["tiers"])
        assert devices == args.reports, devices
        median = statistics.median(runs)
        print(
            f"`edgereg analyze --json` on {devices:,} reports: median {median:.2f} s "
            f"(runs {', '.join(f'{r:.2f}' for r in runs)}); verdict {result['verdict']}; "
            f"peak RSS {peak_mb:.0f} MB ({small_mb:.0f} MB on {SMALL:,} reports)",
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
