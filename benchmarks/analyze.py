"""Canary analysis benchmark: `edgereg analyze` on a store of 1,000,000 reports.

Builds the tiny test project (a few seconds), publishes 1.0.0 as stable and
1.1.0 as a 5 % canary to a registry on disk through the library, bulk-loads
the reports into a SQLite store with the store's own ``ingest_many`` (three
tiers, 10 % of the devices in the candidate arm, log-normal latencies, a few
failures), then runs the real command line as a user would:

    edgereg analyze vision --json --registry file://... --trusted-key ... --reports sqlite:///...

Target: under 5 s (median of 3 runs, each a fresh process: imports, the
verified registry read, the store's GROUP BY and the statistics). Also
printed: the peak memory of that process (its own VmHWM, imports
included) against the same command on a store of 10,000 reports (memory
must not grow with the reports: the store aggregates, the analysis reads
buckets), and how the time splits between the store's summaries and the
analysis.

Usage: .venv/bin/python benchmarks/analyze.py [--reports 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
SMALL = 10_000
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


def run_analyze(tmp: Path, store_path: Path, runs: int) -> tuple[list[float], float, Any]:
    """Seconds of each run, the largest peak RSS in MB, and the last JSON result."""
    # The command line in a fresh interpreter that reports its own peak RSS last.
    command = [
        sys.executable,
        "-c",
        _MEASURED_MAIN,
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
    seconds, peaks = [], []
    for _ in range(runs):
        t = time.perf_counter()
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True)
        seconds.append(time.perf_counter() - t)
        if done.returncode not in (0, 12, 13):
            sys.exit(f"edgereg analyze failed ({done.returncode}):\n{done.stderr}")
        peaks.append(int(done.stderr.strip().splitlines()[-1].split()[-1]) / 1024)
    return seconds, max(peaks), json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
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
        runs, peak_mb, result = run_analyze(tmp, store_path, args.runs)
        _, small_mb, _ = run_analyze(tmp, small_path, 1)
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
    for target, passed, measured in results:
        print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}")
    sys.exit(0 if all(passed for _, passed, _ in results) else 1)


if __name__ == "__main__":
    main()
