"""The report store: the same behaviour on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import re
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pgkit import PostgresServer, free_port, postgres_server, postgres_url  # noqa: F401 (fixtures)

from edgereg.protocol.reports import RateCounts, Report
from edgereg.reports import (
    SCHEMA_VERSION,
    ArmSummary,
    ReportStore,
    ReportStoreError,
    StoreURLError,
    open_store,
)
from edgereg.reports.store import ARMS_PER_STATEMENT, COLUMNS, SCHEMA, report_row
from edgereg.reports.summary import Statistic, latency_bucket

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def report(n: int, **fields: Any) -> Report:
    """A valid report of install ``n`` (a candidate of digits on the high tier)."""
    data: dict[str, Any] = {
        "token": f"{n:032x}",
        "unit": "digits",
        "model": "digits",
        "version": "1.1.0",
        "unit_version": "1.1.0",
        "variant": "int8",
        "tier": "high",
        "arm": "candidate",
        "sequence": 7,
        "probe": "passed",
        "backend": "cpu",
        "load_ms": 20.0,
        "inference": {"count": 50, "p50_ms": 3.0, "p90_ms": 4.0, "p99_ms": 6.0},
        "confirmed": True,
    }
    data.update(fields)
    return Report.model_validate(data)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/reports.sqlite"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[ReportStore]:
    with open_store(store_url) as opened:
        yield opened


def by_arm(summaries: list[ArmSummary]) -> dict[tuple[str, str, str], ArmSummary]:
    return {(s.tier, s.arm, s.version): s for s in summaries}


def ev(summary: ArmSummary, *events: str, aged: bool = False) -> tuple[int, ...]:
    """Devices with each event (of the aged installs with ``aged``)."""
    tally = summary.aged_or_all if aged else summary.all
    return tuple(tally.count(event) for event in events)


def nets(summary: ArmSummary, *events: str, aged: bool = False) -> tuple[float, ...]:
    """Networks with each event, each by its devices' share."""
    tally = summary.aged_or_all if aged else summary.all
    return tuple(round(tally.network_count(event), 6) for event in events)


def hist(summary: ArmSummary, kind: str) -> dict[int, int]:
    return dict(summary.histogram(kind).devices)


def test_summaries_group_by_tier_arm_and_version(store: ReportStore) -> None:
    store.ingest_many(
        [
            (report(1, load_ms=10.0), T0),
            (report(2, load_ms=10.0, probe="failed", backend=None, confirmed=False), T0),
            (report(3, load_ms=40.0, reverted=True, confirmed=False), T0),
            (report(4, arm="stable", version="1.0.0", unit_version="1.0.0"), T0),
            (report(5, tier="low", load_failed=True, load_ms=None, inference=None), T0),
            (report(6, unit="sensor", model="sensor"), T0),
        ]
    )
    arms = by_arm(store.summaries("digits"))
    assert set(arms) == {
        ("high", "candidate", "1.1.0"),
        ("high", "stable", "1.0.0"),
        ("low", "candidate", "1.1.0"),
    }
    candidate = arms[("high", "candidate", "1.1.0")]
    assert (candidate.devices, *ev(candidate, "probe_failed", "reverted")) == (3, 1, 1)
    assert ev(candidate, "confirmed", "load_failed") == (1, 0)
    assert hist(candidate, "load_ms") == {latency_bucket(10.0): 2, latency_bucket(40.0): 1}
    assert hist(candidate, "inference_ms") == {latency_bucket(3.0): 3}
    low = arms[("low", "candidate", "1.1.0")]
    assert (low.devices, *ev(low, "load_failed")) == (1, 1)
    assert (hist(low, "load_ms"), hist(low, "inference_ms")) == ({}, {})
    assert store.summaries("nothing") == []


def test_latest_report_of_an_install_wins_and_replays_change_nothing(store: ReportStore) -> None:
    store.ingest(report(1, confirmed=False), T0)
    store.ingest(report(1, confirmed=True, load_ms=80.0), T0 + timedelta(minutes=5))
    for _ in range(3):  # a replay of the first report, arriving late
        store.ingest(report(1, confirmed=False), T0 + timedelta(minutes=1))
    (summary,) = store.summaries("digits")
    assert (summary.devices, *ev(summary, "confirmed")) == (1, 1)
    assert hist(summary, "load_ms") == {latency_bucket(80.0): 1}
    assert store.count() == 1


def test_since_counts_installs_heard_from_since(store: ReportStore) -> None:
    store.ingest(report(1), T0)
    store.ingest(report(2), T0 + timedelta(hours=2))
    (summary,) = store.summaries("digits", since=T0 + timedelta(hours=1))
    assert summary.devices == 1


def test_bundle_members_fold_into_one_device(store: ReportStore) -> None:
    def member(model: str, **fields: Any) -> Report:
        return report(9, unit="ocr", model=model, unit_version="2.0.0", **fields)

    store.ingest_many(
        [
            (member("det", load_ms=5.0), T0),
            (member("rec", load_ms=50.0, probe="failed", confirmed=False), T0),
            (report(10, unit="ocr", model="det", unit_version="2.0.0"), T0),
        ]
    )
    (summary,) = store.summaries("ocr")
    assert (summary.devices, *ev(summary, "probe_failed", "confirmed")) == (2, 1, 1)
    (rec,) = store.summaries("ocr", model="rec")
    assert (rec.devices, hist(rec, "load_ms")) == (1, {latency_bucket(50.0): 1})


def test_prune_deletes_installs_not_heard_from(store: ReportStore) -> None:
    store.ingest(report(1), T0)
    store.ingest(report(2), T0 + timedelta(days=10))
    assert store.prune(T0 + timedelta(days=1)) == 1
    assert store.count() == 1
    assert store.prune(T0 + timedelta(days=1)) == 0


def test_concurrent_ingest_from_server_threads(store: ReportStore) -> None:
    def worker(base: int) -> None:
        for n in range(base, base + 50):
            store.ingest(report(n), T0)

    threads = [threading.Thread(target=worker, args=(i * 1000,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.count() == 400


def test_schema_version_is_recorded_and_a_newer_one_refused(store_url: str) -> None:
    with open_store(store_url) as store:
        store.check()
        with store._connection() as conn:
            cur = conn.cursor()
            cur.execute("SELECT value FROM reports_meta WHERE key = 'schema'")
            assert cur.fetchone()[0] == str(SCHEMA_VERSION)
            cur.execute("UPDATE reports_meta SET value = '99' WHERE key = 'schema'")
            conn.commit()
    with open_store(store_url) as store, pytest.raises(ReportStoreError) as caught:
        store.summaries("digits")
    assert "schema 99" in caught.value.message
    assert "newer edgereg" in caught.value.message
    assert not caught.value.retryable


def test_naive_times_are_refused(store: ReportStore) -> None:
    with pytest.raises(ValueError, match="time zone"):
        store.ingest(report(1), datetime(2026, 1, 1))  # naive: the point of the test


# -- SQLite specifics ----------------------------------------------------------------


def test_sqlite_file_is_created_on_first_use_in_wal_mode(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    store = open_store("sqlite:///reports/r.sqlite", base_dir=tmp_path / "project")
    with pytest.raises(ReportStoreError, match="does not exist") as caught:
        store.check()
    assert "Create it" in (caught.value.hint or "")
    (tmp_path / "project" / "reports").mkdir()
    store.check()
    path = tmp_path / "project" / "reports" / "r.sqlite"
    assert path.is_file()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "reports.sqlite"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ReportStoreError, match="not an SQLite database"):
        open_store(f"sqlite:///{path}").check()
    assert path.read_bytes() == b"not a database at all" * 100


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("reports.sqlite", "is not a store URL"),
        ("sqlite://reports.sqlite", "names no file"),
        ("sqlite:///", "names no file"),
        ("mysql://u:secret@db/x", "unsupported report store scheme 'mysql'"),
        ("postgresql://u:secret@db:notaport/x", "is not a PostgreSQL URL"),
        ("postgresql://u:secret@db/x?bogus=1", "is not a PostgreSQL URL"),
    ],
)
def test_bad_urls_are_refused_without_showing_a_password(url: str, expected: str) -> None:
    with pytest.raises(StoreURLError) as caught:
        open_store(url)
    assert expected in caught.value.message
    assert "secret" not in caught.value.diagnostics()
    assert caught.value.exit_code == 2


# -- PostgreSQL specifics ------------------------------------------------------------


def test_postgres_unreachable_is_a_clear_retryable_error() -> None:
    url = f"postgresql://edgereg:secret@127.0.0.1:{free_port()}/x"
    with pytest.raises(ReportStoreError) as caught:
        open_store(url).summaries("digits")
    error = caught.value
    assert "does not answer" in error.message
    assert error.retryable
    assert "secret" not in error.diagnostics()
    assert "***" in error.url


def test_postgres_store_recovers_after_a_restart(tmp_path: Path) -> None:
    with PostgresServer() as server:
        url = server.create_database()
        with open_store(url) as store:
            store.ingest(report(1), T0)
            server.stop()
            with pytest.raises(ReportStoreError, match="does not answer"):
                store.ingest(report(2), T0)
            server.start()
            store.ingest(report(3), T0)
            assert store.count() == 2


# -- group commit (what `edgereg serve` puts in front of the store) ------------------


def test_group_commit_shares_transactions_between_threads(store: ReportStore) -> None:
    from edgereg.reports.batch import GroupCommit

    front = GroupCommit(store)

    def worker(base: int) -> None:
        for n in range(base, base + 40):
            front.ingest(report(n), T0)

    threads = [threading.Thread(target=worker, args=(i * 1000,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.count() == 400
    assert front.batched == 400
    assert front.batches < 400
    front.close()


def test_group_commit_hands_a_failure_to_its_caller(tmp_path: Path) -> None:
    from edgereg.reports.batch import GroupCommit

    front = GroupCommit(open_store(f"sqlite:///{tmp_path}/missing/r.sqlite"))
    with pytest.raises(ReportStoreError, match="does not exist"):
        front.ingest(report(1), T0)
    (tmp_path / "missing").mkdir()
    front.ingest(report(2), T0)  # the writer outlived the failed batch
    assert front.store.count() == 1
    front.close()


def test_group_commit_asks_its_store_every_summary_question(store: ReportStore) -> None:
    """What the analysis asks `edgereg serve`'s front: a CPU class, a pool, a bundle."""
    from edgereg.reports.batch import GroupCommit

    front = GroupCommit(store)
    installs = (("high", "armv9"), ("low", "armv9"), ("high", "armv8.2"))
    for n, (tier, cpu_class) in enumerate(installs):
        front.ingest(counted(n, {"accepted": (4, n)}, tier=tier, cpu_class=cpu_class), T0)
    assert [s.devices for s in front.summaries("digits", cpu_class="armv9")] == [1, 1]
    for asked in (
        {"cpu_class": "armv9", "statistics": ASKED},
        {"pooled": True, "stalled_starts": 3},
        {"with_pool": True, "statistics": ASKED, "aged_before": T0},
        {"bundle": False, "since_sequence": 7},
    ):
        assert front.summaries("digits", **asked) == store.summaries("digits", **asked)


def test_distinct_source_networks_are_counted_per_arm_and_outcome(store: ReportStore) -> None:
    store.ingest_many(
        [
            (report(1, reverted=True, confirmed=False), T0, "198.51.100.0/24"),
            (report(2, reverted=True, confirmed=False), T0, "198.51.100.0/24"),
            (report(3), T0, "203.0.113.0/24"),
            (report(4), T0, "2001:db8:1::/48"),
            (report(5, probe="failed", backend=None), T0, None),  # source unknown
            (report(6, arm="stable", version="1.0.0", unit_version="1.0.0"), T0, None),
        ]
    )
    found = by_arm(store.summaries("digits"))
    candidate = found[("high", "candidate", "1.1.0")]
    # Three known networks, and the device whose network is unknown as one of its own.
    assert (candidate.devices, candidate.networks) == (5, 4)
    # The /24 of two reverting devices is one network whose devices all reverted.
    assert (ev(candidate, "reverted"), nets(candidate, "reverted")) == ((2,), (1.0,))
    assert (ev(candidate, "probe_failed"), nets(candidate, "probe_failed")) == ((1,), (1.0,))
    assert found[("high", "stable", "1.0.0")].networks == 1


def test_a_network_counts_once_by_the_share_of_its_devices(store: ReportStore) -> None:
    """A forger's hundred tokens from one /24 weigh what one device does, in either arm."""
    forged = [
        (report(100 + n, reverted=True, confirmed=False), T0, "198.51.100.0/24") for n in range(100)
    ]
    genuine = [(report(n), T0, f"10.0.{n}.0/24") for n in range(9)]
    # A carrier NAT: four devices, one of which reverted.
    nat = [
        (report(200 + n, reverted=n == 0, confirmed=n != 0), T0, "100.64.0.0/24") for n in range(4)
    ]
    stable = [
        (
            report(300 + n, arm="stable", version="1.0.0", unit_version="1.0.0", reverted=True),
            T0,
            "192.0.2.0/24",
        )
        for n in range(50)
    ]
    store.ingest_many(forged + genuine + nat + stable)
    found = by_arm(store.summaries("digits"))
    candidate = found[("high", "candidate", "1.1.0")]
    assert (candidate.devices, candidate.networks) == (113, 11)
    assert ev(candidate, "reverted") == (101,)
    assert nets(candidate, "reverted") == (1.25,)
    # Latencies too: each network once, at its fastest and at its slowest device.
    histogram = candidate.histogram("load_ms")
    assert sum(histogram.devices.values()) == 113
    assert sum(histogram.low.values()) == sum(histogram.high.values()) == 11
    stable_arm = found[("high", "stable", "1.0.0")]
    assert (stable_arm.networks, nets(stable_arm, "reverted")) == (1, (1.0,))


def test_bundle_installs_count_their_source_once(store: ReportStore) -> None:
    rows = []
    for n, source in ((1, "198.51.100.0/24"), (2, "198.51.100.0/24"), (3, "192.0.2.0/24")):
        for member in ("det", "rec"):
            rows.append((report(n, unit="ocr", model=member, reverted=n == 3), T0, source))
    store.ingest_many(rows)
    (summary,) = store.summaries("ocr")
    assert (summary.devices, summary.networks, nets(summary, "reverted")) == (3, 2, (1.0,))
    # Per tier and pooled at once: the same two summaries as asked apart.
    (pooled,) = store.summaries("ocr", pooled=True)
    assert pooled.tier == "*"
    assert store.summaries("ocr", with_pool=True) == [summary, pooled]


#: Schema 8 keeps an install's app metrics in its row; the stores before it have neither column.
SCHEMA_8_COLUMNS = ("metrics", "metric_events")
OLD_TABLE = re.sub(r"    metric(s|_events) [A-Z]+,\n", "", SCHEMA[0])
OLD_COLUMNS = COLUMNS[: -len(SCHEMA_8_COLUMNS)]


def old_row(*args: Any) -> tuple[Any, ...]:
    """A report's row as a store of schema 7 or older held it."""
    return report_row(*args)[: len(OLD_COLUMNS)]


def test_a_schema_1_store_is_migrated_and_its_rows_have_no_source(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    with sqlite3.connect(path) as conn:
        # Schema 1 as shipped: the table without `source` (nor schema 3's keys), its index
        # without it.
        table = OLD_TABLE.replace("    source TEXT,\n", "")
        for column in SCHEMA_3_COLUMNS:
            table = re.sub(rf"    {column} [A-Z ]+,\n", "", table)
        conn.execute(table)
        conn.execute(
            "CREATE INDEX reports_devices ON reports (unit, tier, arm, unit_version, probe, "
            "load_failed, reverted, confirmed, model, received_at)"
        )
        conn.execute("CREATE TABLE reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO reports_meta VALUES ('schema', '1')")
        columns = [row[1] for row in conn.execute("PRAGMA table_info(reports)")]
        assert "source" not in columns
        row = {c: v for c, v in zip(OLD_COLUMNS, old_row(report(1), T0), strict=True)}
        del row["source"]
        for column in SCHEMA_3_COLUMNS:
            del row[column]
        conn.execute(
            f"INSERT INTO reports ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    with open_store(f"sqlite:///{path}") as store:
        store.ingest(report(2), T0, "198.51.100.0/24")
        (summary,) = store.summaries("digits")
        # The row of schema 1 has no source: a network of its own.
        assert (summary.devices, summary.networks) == (2, 2)
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM reports_meta WHERE key = 'schema'").fetchone()
    assert version == str(SCHEMA_VERSION) == "8"


SCHEMA_3_COLUMNS = (
    "unconfirmed_starts",
    "cpu_class",
    "memory_peak_mb",
    "memory_peak_bucket",
    "memory_steady_mb",
    "first_inference_ms",
)


def test_a_schema_2_store_is_migrated_to_keep_report_schema_2s_keys(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    with sqlite3.connect(path) as conn:
        table = OLD_TABLE
        for column in SCHEMA_3_COLUMNS:
            table = re.sub(rf"    {column} [A-Z ]+,\n", "", table)
        conn.execute(table)
        conn.execute("CREATE TABLE reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO reports_meta VALUES ('schema', '2')")
        row = {c: v for c, v in zip(OLD_COLUMNS, old_row(report(1), T0), strict=True)}
        for column in SCHEMA_3_COLUMNS:
            del row[column]
        conn.execute(
            f"INSERT INTO reports ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    with open_store(f"sqlite:///{path}") as store:
        store.ingest(report(2, schema_version=2, unconfirmed_starts=1, cpu_class="armv9"), T0)
        (summary,) = store.summaries("digits")
        assert summary.devices == 2
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM reports_meta WHERE key = 'schema'").fetchone()
        kept = conn.execute(
            "SELECT unconfirmed_starts, cpu_class FROM reports ORDER BY token"
        ).fetchall()
    assert version == "8"
    assert kept == [(None, None), (1, "armv9")]


# Report fields of one install, and whether it is stalled at stalled_starts 1, 2 and 3.
STALLS = {
    "schema-1-unconfirmed": ({"confirmed": False}, (False, False, False)),
    "no-start-yet": ({"confirmed": False, "unconfirmed_starts": 0}, (False, False, False)),
    "one-start": ({"confirmed": False, "unconfirmed_starts": 1}, (True, False, False)),
    "two-starts": ({"confirmed": False, "unconfirmed_starts": 2}, (True, True, False)),
    "confirmed-at-the-fifth": ({"unconfirmed_starts": 5}, (False, False, False)),
    # A crash loop's revert keeps its count: it was stalled first, and stays counted.
    "reverted-after-three": (
        {"confirmed": False, "reverted": True, "unconfirmed_starts": 3},
        (True, True, True),
    ),
    # A revert without a count (schema 1, a forger) is the revert guardrail's alone.
    "reverted-schema-1": ({"confirmed": False, "reverted": True}, (False, False, False)),
}


@pytest.mark.parametrize("threshold", [1, 2, 3])
def test_stalled_installs_are_counted_at_the_declared_starts(
    store: ReportStore, threshold: int
) -> None:
    rows = []
    for n, (fields, _) in enumerate(STALLS.values()):
        extra = {"schema_version": 2} if "unconfirmed_starts" in fields else {}
        rows.append(
            (report(n, unit=f"u{n}", model=f"u{n}", **fields, **extra), T0, f"10.{n}.0.0/24")
        )
    store.ingest_many(rows)
    for n, (name, (fields, expected)) in enumerate(STALLS.items()):
        (summary,) = store.summaries(f"u{n}", aged_before=T0, stalled_starts=threshold)
        stalled = int(expected[threshold - 1])
        assert (ev(summary, "stalled"), nets(summary, "stalled")) == ((stalled,), (stalled,)), name
        assert ev(summary, "stalled", aged=True) == (stalled,), name
        # The revert guardrail counts reverts only.
        assert ev(summary, "reverted") == (int(bool(fields.get("reverted"))),), name


def test_the_default_threshold_is_the_guardrails(store: ReportStore) -> None:
    from edgereg.config import UnconfirmedGuardrail

    store.ingest(report(1, confirmed=False, schema_version=2, unconfirmed_starts=2), T0)
    (summary,) = store.summaries("digits")
    assert UnconfirmedGuardrail().stalled_starts == 2
    assert ev(summary, "stalled", "first_start") == (1, 1)


def test_a_stall_counts_as_aged_by_its_installs_first_report(store: ReportStore) -> None:
    stalled = {"confirmed": False, "schema_version": 2}
    store.ingest_many(
        [
            (report(1, confirmed=False), T0, "198.51.100.0/24"),
            (report(2, **stalled, unconfirmed_starts=2), T0 + timedelta(hours=80), "192.0.2.0/24"),
            (report(3), T0, "203.0.113.0/24"),
        ]
    )
    # Installed before the cut, stalled after it: an aged install that stalled.
    store.ingest(
        report(1, **stalled, unconfirmed_starts=2), T0 + timedelta(hours=50), "198.51.100.0/24"
    )
    (summary,) = store.summaries("digits", aged_before=T0 + timedelta(hours=1))
    assert (summary.devices, *ev(summary, "stalled"), *nets(summary, "stalled")) == (3, 2, 2.0)
    assert summary.aged is not None
    assert (summary.aged.devices, *ev(summary, "stalled", aged=True)) == (2, 1)
    assert ev(summary, "reverted") == (0,)


def test_a_bundle_install_stalls_once(store: ReportStore) -> None:
    stalled = {"confirmed": False, "schema_version": 2, "unconfirmed_starts": 2}
    store.ingest_many(
        [(report(1, unit="ocr", model=m, **stalled), T0, "192.0.2.0/24") for m in ("det", "rec")]
        + [(report(2, unit="ocr", model=m), T0, "198.51.100.0/24") for m in ("det", "rec")]
    )
    (summary,) = store.summaries("ocr", stalled_starts=2)
    assert (summary.devices, *ev(summary, "stalled"), *nets(summary, "stalled")) == (2, 1, 1.0)
    (member,) = store.summaries("ocr", model="rec", stalled_starts=3)
    assert ev(member, "stalled") == (0,)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_a_threshold_that_is_not_a_count_is_refused(store: ReportStore, bad: object) -> None:
    with pytest.raises(ValueError, match="stalled_starts must be"):
        store.summaries("digits", stalled_starts=bad)  # type: ignore[arg-type]


def test_a_bundles_members_are_listed(store: ReportStore) -> None:
    store.ingest_many(
        [(report(n, unit="ocr", model=member), T0) for n in (1, 2) for member in ("rec", "det")]
        + [(report(3), T0)]
    )
    assert store.members("ocr") == ["det", "rec"]
    assert store.members("digits") == []


def test_installs_old_enough_to_have_reverted_are_counted(store: ReportStore) -> None:
    store.ingest_many(
        [
            (report(1, reverted=True, confirmed=False), T0, "198.51.100.0/24"),
            (report(2), T0, "198.51.100.0/24"),
            (report(4, reverted=True, confirmed=False), T0, "198.51.100.0/24"),
            (report(3, reverted=True, confirmed=False), T0 + timedelta(hours=80), "192.0.2.0/24"),
        ]
    )
    (summary,) = store.summaries("digits", aged_before=T0 + timedelta(hours=1))
    assert (summary.devices, *ev(summary, "reverted")) == (4, 3)
    # Two networks: 198.51.100.0/24, three devices of which two reverted, and the young one.
    assert nets(summary, "reverted") == (round(2 / 3 + 1, 6),)
    assert summary.aged is not None
    assert (summary.aged.devices, summary.aged.networks) == (3, 1)
    assert (ev(summary, "reverted", aged=True), nets(summary, "reverted", aged=True)) == (
        (2,),
        (round(2 / 3, 6),),
    )
    (plain,) = store.summaries("digits")
    assert plain.aged is None


def test_peak_memory_is_kept_as_a_histogram(store: ReportStore) -> None:
    from edgereg.reports.summary import latency_bucket

    store.ingest_many(
        [
            (report(1, schema_version=2, memory_peak_mb=120.0), T0),
            (report(2, schema_version=2, memory_peak_mb=120.5), T0),
            (report(3, schema_version=2, memory_peak_mb=300.0), T0),
            (report(4), T0),
        ]
    )
    (summary,) = store.summaries("digits")
    assert hist(summary, "memory_peak_mb") == {latency_bucket(120.0): 2, latency_bucket(300.0): 1}
    assert sum(hist(summary, "load_ms").values()) == 4


def test_reports_are_split_by_cpu_class(store: ReportStore) -> None:
    store.ingest_many(
        [
            (report(1, schema_version=2, cpu_class="armv9"), T0),
            (report(2, schema_version=2, cpu_class="armv9", probe="failed", backend=None), T0),
            (report(3, schema_version=2, cpu_class="armv8.2"), T0),
            (report(4), T0),
        ]
    )
    assert store.cpu_classes("digits") == ["armv8.2", "armv9"]
    (armv9,) = store.summaries("digits", cpu_class="armv9")
    assert (armv9.devices, *ev(armv9, "probe_failed")) == (2, 1)
    (everyone,) = store.summaries("digits")
    assert everyone.devices == 4


def test_a_period_is_the_installs_that_reported_at_its_sequence_or_later(
    store: ReportStore,
) -> None:
    store.ingest_many(
        [
            (report(1, sequence=7), T0),
            (report(2, sequence=8), T0),
            # Reported in the period before, then again in this one (docs/protocol.md §11).
            (report(3, sequence=7), T0),
            (report(3, sequence=9), T0 + timedelta(hours=1)),
        ]
    )
    (summary,) = store.summaries("digits", since_sequence=8)
    assert summary.devices == 2
    (everything,) = store.summaries("digits")
    assert everything.devices == 3


def test_a_load_failure_is_not_also_a_probe_failure(store: ReportStore) -> None:
    store.ingest_many(
        [
            (report(1, probe="failed", backend=None, load_failed=True, confirmed=False), T0),
            (report(2, probe="failed", backend=None, confirmed=False), T0),
        ]
    )
    (summary,) = store.summaries("digits")
    assert ev(summary, "probe_failed", "load_failed") == (1, 1)


SKEWED = timedelta(minutes=15)


def test_reports_merge_whatever_order_they_arrive_in(store: ReportStore) -> None:
    """Two servers whose clocks disagree lose no report's fact (docs/protocol.md §12)."""
    stamp_install = T0 + SKEWED  # received by a server 15 minutes ahead
    stamp_confirm = T0 + timedelta(minutes=5)  # later, by a server whose clock is right
    store.ingest(report(1, confirmed=False, inference=None, load_ms=30.0), stamp_install)
    store.ingest(report(1, confirmed=True, load_ms=30.0), stamp_confirm)
    # A revert carries the count of unconfirmed starts; an older retry comes after it.
    store.ingest(
        report(2, schema_version=2, confirmed=False, reverted=True, unconfirmed_starts=3), T0
    )
    store.ingest(
        report(2, schema_version=2, confirmed=False, unconfirmed_starts=1),
        T0 + timedelta(hours=1),
    )
    # The next period's report (a higher sequence) takes the row forward, keeping its facts.
    store.ingest(report(2, schema_version=2, sequence=8, confirmed=False, inference=None), T0)
    (summary,) = store.summaries("digits")
    assert ev(summary, "confirmed", "reverted", "stalled") == (1, 1, 1)
    assert sum(hist(summary, "inference_ms").values()) == 2  # the latest known of each
    (later,) = store.summaries("digits", since_sequence=8)
    assert (later.devices, *ev(later, "reverted")) == (1, 1)


def test_the_stores_clock_is_the_servers_latest_mark_or_newest_report(
    store: ReportStore,
) -> None:
    assert store.clock("digits") is None
    store.ingest(report(1), T0)
    store.ingest(report(2), T0 + timedelta(hours=3))
    store.ingest(report(3, unit="sensor", model="sensor"), T0 + timedelta(hours=9))
    assert store.clock("digits") == T0 + timedelta(hours=3)
    # A quiet day: no report arrives, the server marks its clock every minute.
    store.mark_clock(T0 + timedelta(hours=30))
    assert store.clock("digits") == T0 + timedelta(hours=30)
    # Several servers: the latest mark stands, an older one changes nothing.
    store.mark_clock(T0 + timedelta(hours=29))
    assert store.clock("digits") == T0 + timedelta(hours=30)


def test_a_schema_3_store_is_migrated_to_count_networks(tmp_path: Path) -> None:
    from edgereg.reports.store import MIGRATIONS

    path = tmp_path / "v3.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(OLD_TABLE)
        for statement in MIGRATIONS[2][-2:]:  # schema 3's indexes, as shipped
            conn.execute(statement)
        conn.execute("CREATE TABLE reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO reports_meta VALUES ('schema', '3')")
        conn.execute(
            f"INSERT INTO reports ({', '.join(OLD_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(OLD_COLUMNS))})",
            old_row(report(1, reverted=True, confirmed=False), T0, "192.0.2.0/24"),
        )
    with open_store(f"sqlite:///{path}") as store:
        store.ingest(report(2), T0, "192.0.2.0/24")
        (summary,) = store.summaries("digits")
        assert (summary.devices, summary.networks, *nets(summary, "reverted")) == (2, 1, 0.5)
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM reports_meta WHERE key = 'schema'").fetchone()
        indexes = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
    assert version == "8"
    assert {"reports_summary", "reports_clock", "reports_received"} <= indexes
    assert not {"reports_devices", "reports_load", "reports_inference"} & indexes


# --- app metrics (report schema 3) ---------------------------------------------------


def counted(n: int, metrics: dict[str, tuple[int, ...]], **fields: Any) -> Report:
    """A report of schema 3 with app metrics: a rate's (events, successes), else counts."""
    version = "1.1.0" if fields.get("arm", "candidate") == "candidate" else "1.0.0"
    return report(
        n,
        **{"version": version, "unit_version": version, **fields},
        schema_version=3,
        metrics={
            name: {"events": v[0], "successes": v[1]} if name == "accepted" else {"counts": list(v)}
            for name, v in metrics.items()
        },
    )


SUCCESS = Statistic("accepted", 2, (0.0, 1.0))
#: confidence's mean (buckets valued 0.5, 0.6, 0.8, 0.9) and its share at or below 0.5.
MEAN = Statistic("confidence", 4, (0.5, 0.6, 0.8, 0.9))
LOW = Statistic("confidence", 4, (1.0, 0.0, 0.0, 0.0))
ASKED = {"accepted": SUCCESS, "mean": MEAN, "low": LOW}


def test_app_metrics_are_tallied_per_device_and_network(store: ReportStore) -> None:
    store.ingest_many(
        [
            (counted(1, {"accepted": (10, 9), "confidence": (0, 1, 1, 2)}), T0, "192.0.2.0/24"),
            (counted(2, {"accepted": (2, 0)}), T0, "192.0.2.0/24"),  # the same network
            (counted(3, {"accepted": (0, 0)}), T0, "198.51.100.0/24"),  # counted nothing yet
            (counted(4, {"accepted": (4, 1)}), T0, None),  # its own network
            (counted(5, {"accepted": (5, 5)}, arm="stable"), T0, "203.0.113.0/24"),
            (counted(6, {"accepted": (1, 1)}, tier="low"), T0, "192.0.2.0/24"),
        ]
    )
    found = by_arm(store.summaries("digits", statistics=ASKED))
    candidate = found[("high", "candidate", "1.1.0")]
    accepted = candidate.metric("accepted")
    assert (accepted.devices, accepted.networks) == (3, 2)
    # Devices 0.9, 0 and 0.25; networks (0.9 + 0) / 2 and 0.25.
    assert accepted.total == pytest.approx(1.15)
    assert accepted.network_total == pytest.approx(0.7)
    assert accepted.network_squares == pytest.approx(0.45**2 + 0.25**2)
    mean, low = candidate.metric("mean"), candidate.metric("low")
    assert (mean.devices, mean.total) == (1, pytest.approx((0.6 + 0.8 + 2 * 0.9) / 4))
    assert low.total == 0.0
    assert found[("high", "stable", "1.0.0")].metric("accepted").total == 1.0
    # Pooled: each network once, whatever tiers its devices are in.
    pooled = by_arm(store.summaries("digits", statistics=ASKED, pooled=True))
    everyone = pooled[("*", "candidate", "1.1.0")].metric("accepted")
    assert (everyone.devices, everyone.networks) == (4, 2)
    assert everyone.network_total == pytest.approx(1.9 / 3 + 0.25)
    # Not asked: not tallied.
    assert store.summaries("digits")[0].metrics == {}


def test_app_metrics_merge_whatever_order_they_arrive_in(store: ReportStore) -> None:
    """Totals since the install only grow: each count keeps its highest, in any order."""
    store.ingest(counted(1, {"accepted": (10, 9)}), T0 + timedelta(hours=2), "192.0.2.0/24")
    store.ingest(counted(1, {"accepted": (4, 4)}), T0, "192.0.2.0/24")  # an older retry, late
    # A bundle's members each carry the unit's metrics under the install's one token.
    store.ingest_many(
        [
            (counted(2, {"accepted": (3, 1)}, model="rec", unit="digits"), T0, None),
            (counted(2, {"accepted": (3, 1)}, model="det", unit="digits"), T0, None),
            (counted(2, {"accepted": (6, 2)}, model="det", unit="digits"), T0, None),
        ]
    )
    (summary,) = store.summaries("digits", statistics=ASKED)
    assert summary.metric("accepted").devices == 2
    assert summary.metric("accepted").total == pytest.approx(0.9 + 2 / 6)


def test_app_metrics_follow_the_period_and_the_declared_buckets(store: ReportStore) -> None:
    store.ingest(counted(1, {"accepted": (2, 1)}, sequence=7), T0)
    store.ingest(counted(2, {"accepted": (2, 2)}, sequence=8), T0)
    # Another release declared confidence with two buckets: another metric.
    store.ingest(counted(3, {"confidence": (1, 1)}, sequence=8), T0)
    (later,) = store.summaries("digits", since_sequence=8, statistics=ASKED)
    assert later.metric("accepted").total == 1.0
    assert later.metric("mean").devices == 0
    two = Statistic("confidence", 2, (0.0, 1.0))
    (other,) = store.summaries("digits", statistics={"two": two})
    assert other.metric("two").total == 0.5
    with pytest.raises(ValueError, match="the unit's"):
        store.summaries("digits", model="digits", statistics=ASKED)
    with pytest.raises(ValueError, match="2 to 32"):
        Statistic("confidence", 33, (0.0,) * 33)


def test_prune_deletes_the_metrics_of_installs_not_heard_from(store: ReportStore) -> None:
    store.ingest(counted(1, {"accepted": (2, 1)}), T0)
    store.ingest(counted(2, {"accepted": (2, 2)}), T0 + timedelta(days=40))
    assert store.prune(T0 + timedelta(days=30)) == 1
    (summary,) = store.summaries("digits", statistics=ASKED)
    assert summary.metric("accepted").devices == 1


def test_a_schema_4_store_is_migrated_to_keep_app_metrics(tmp_path: Path) -> None:
    from edgereg.reports.store import _SCHEMA_4_INDEXES

    path = tmp_path / "v4.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(OLD_TABLE)
        for statement in _SCHEMA_4_INDEXES:
            conn.execute(statement)
        conn.execute("CREATE TABLE reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO reports_meta VALUES ('schema', '4')")
        conn.execute(
            f"INSERT INTO reports ({', '.join(OLD_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(OLD_COLUMNS))})",
            old_row(report(1), T0, "192.0.2.0/24"),
        )
    with open_store(f"sqlite:///{path}") as store:
        store.ingest(counted(2, {"accepted": (4, 3)}), T0, "198.51.100.0/24")
        (summary,) = store.summaries("digits", statistics=ASKED)
        assert (summary.devices, summary.metric("accepted").devices) == (2, 1)
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM reports_meta WHERE key = 'schema'").fetchone()
    assert version == "8"


def _raw_connection(url: str) -> Any:
    """A plain DB-API connection to the store at ``url`` (SQLite or PostgreSQL), its placeholder."""
    if url.startswith("sqlite:///"):
        return sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None), "?"
    import psycopg

    return psycopg.connect(url, autocommit=True), "%s"


def _write_old_store(
    url: str,
    version: int,
    statements: tuple[str, ...],
    rows: tuple[tuple[Any, ...], ...] = (),
    metrics: tuple[tuple[Any, ...], ...] = (),
) -> None:
    """A store as an older edgereg left it: its tables and indexes, its schema, its rows."""
    from edgereg.reports._metrics import METRIC_COLUMNS

    conn, p = _raw_connection(url)
    with contextlib.closing(conn):
        for statement in statements:
            conn.execute(statement)
        conn.execute("CREATE TABLE reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(f"INSERT INTO reports_meta VALUES ('schema', '{version}')")
        for table, columns, values in (
            *(("reports", OLD_COLUMNS, row) for row in rows),
            *(("report_metrics", METRIC_COLUMNS, row) for row in metrics),
        ):
            conn.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) "
                f"VALUES ({', '.join([p] * len(columns))})",
                values,
            )


def _schema_and_indexes(url: str) -> tuple[str, dict[str, str]]:
    """The schema a store records, and the definition of each index of its tables, by name."""
    conn, p = _raw_connection(url)
    with contextlib.closing(conn):
        (version,) = conn.execute("SELECT value FROM reports_meta WHERE key = 'schema'").fetchone()
        if p == "?":
            listed = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        else:
            listed = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'report%'"
        return version, {row[0]: " ".join(row[1].split()) for row in conn.execute(listed)}


def test_a_schema_5_store_is_migrated_to_one_summary_index(store_url: str) -> None:
    from edgereg.reports._metrics import _SCHEMA_5_METRIC_INDEXES, METRIC_SCHEMA
    from edgereg.reports.store import _SCHEMA_4_INDEXES

    _write_old_store(
        store_url,
        5,
        (OLD_TABLE, *_SCHEMA_4_INDEXES, *METRIC_SCHEMA, *_SCHEMA_5_METRIC_INDEXES),
        rows=(old_row(report(1, load_ms=10.0), T0, "192.0.2.0/24"),),
    )
    with open_store(store_url) as store:
        store.ingest(report(2, load_ms=10.0), T0, "198.51.100.0/24")
        (summary,) = store.summaries("digits")
        assert (summary.devices, summary.networks) == (2, 2)
        assert hist(summary, "load_ms") == {latency_bucket(10.0): 2}
    version, indexes = _schema_and_indexes(store_url)
    assert version == "8"
    assert {"reports_summary", "reports_clock", "reports_received"} <= set(indexes)
    dropped = {"reports_devices", "reports_load", "reports_inference", "reports_memory"}
    assert not dropped & set(indexes)


def test_a_schema_6_store_is_migrated_to_read_arms_network_by_network(store_url: str) -> None:
    from edgereg.reports._metrics import _SCHEMA_5_METRIC_INDEXES, METRIC_SCHEMA
    from edgereg.reports.store import _SCHEMA_6_SUMMARY_INDEX, INDEXES

    old = counted(1, {"accepted": (4, 3)}, load_ms=10.0)
    _write_old_store(
        store_url,
        6,
        (
            OLD_TABLE,
            _SCHEMA_6_SUMMARY_INDEX,
            *INDEXES[1:],
            *METRIC_SCHEMA,
            *_SCHEMA_5_METRIC_INDEXES,
        ),
        rows=(old_row(old, T0, "192.0.2.0/24"),),
        metrics=tuple(metric_rows(old, int(T0.timestamp() * 1000), "192.0.2.0/24")),
    )
    with open_store(store_url) as store:
        store.ingest_many(
            [
                (counted(2, {"accepted": (2, 1)}, load_ms=10.0), T0, "192.0.2.0/24"),
                (counted(3, {"accepted": (1, 1)}, load_ms=10.0), T0, None),
            ]
        )
        for pooled in (False, True):
            (summary,) = store.summaries("digits", statistics=ASKED, pooled=pooled)
            assert (summary.devices, summary.networks) == (3, 2)
            assert summary.histogram("load_ms").low == {latency_bucket(10.0): 2}
            accepted = summary.metric("accepted")
            assert (accepted.devices, accepted.networks) == (3, 2)
            assert accepted.network_total == pytest.approx((0.75 + 0.5) / 2 + 1.0)
    version, indexes = _schema_and_indexes(store_url)
    assert version == "8"
    # The network after the arm and the version, then the tier.
    assert re.search(
        r"arm, unit_version, \(?COALESCE\(source, token\)\)?, tier", indexes["reports_summary"]
    )
    assert {"reports_clock", "reports_received"} <= set(indexes)
    assert not {"report_metrics_arms", "report_metrics_received"} & set(indexes)


def metric_rows(report: Report, received: int, source: str | None) -> list[tuple[Any, ...]]:
    """The ``report_metrics`` rows of schemas 5 to 7: one per install and metric, as written."""
    from edgereg.reports._metrics import BUCKET_COLUMNS

    rows = []
    for name, counts in (report.metrics or {}).items():
        if isinstance(counts, RateCounts):
            buckets = [counts.events - counts.successes, counts.successes]
        else:
            buckets = list(counts.counts)
        padded = buckets + [0] * (len(BUCKET_COLUMNS) - len(buckets))
        rows.append(
            (
                report.token,
                name,
                report.unit,
                report.tier,
                report.arm,
                report.unit_version,
                report.sequence,
                report.cpu_class,
                source,
                received,
                len(buckets),
                *padded,
            )
        )
    return rows


def test_a_schema_7_store_is_migrated_to_keep_app_metrics_in_the_installs_row(
    store_url: str,
) -> None:
    """Every install's metric rows become its row's column (a bundle's members alike)."""
    from edgereg.reports._metrics import METRIC_INDEXES, METRIC_SCHEMA, MIGRATION_CHUNK
    from edgereg.reports.store import INDEXES

    received = int(T0.timestamp() * 1000)
    sent = [
        (counted(n, {"accepted": (n % 7 + 4, n % 5), "confidence": (n % 3, 1, 0, n % 2)}), source)
        for n, source in zip(
            range(1, MIGRATION_CHUNK + 40), itertools.cycle(("192.0.2.0/24", None, "2001:db8::/48"))
        )
    ]
    bundle = [
        counted(9001, {"accepted": (6, 2)}, model=member, unit="kit") for member in ("det", "rec")
    ]
    _write_old_store(
        store_url,
        7,
        (OLD_TABLE, *INDEXES, *METRIC_SCHEMA, *METRIC_INDEXES),
        rows=(
            *(old_row(r, T0, source) for r, source in sent),
            old_row(report(9000), T0, None),  # no metrics
            *(old_row(r, T0, None) for r in bundle),
        ),
        metrics=(
            *(m for r, source in sent for m in metric_rows(r, received, source)),
            *metric_rows(bundle[0], received, None),
        ),
    )
    with open_store(store_url) as store:
        migrated = {
            pooled: store.summaries("digits", statistics=ASKED, pooled=pooled)
            for pooled in (False, True)
        }
        (kit,) = store.summaries("kit", statistics=ASKED, bundle=True)
        assert kit.metric("accepted").devices == 1
        assert kit.metric("accepted").total == pytest.approx(2 / 6)
    version, _ = _schema_and_indexes(store_url)
    assert version == "8"
    # The same reports stored again by this edgereg: the same summaries.
    conn, _ = _raw_connection(store_url)
    with contextlib.closing(conn):
        conn.execute("DELETE FROM reports")
    with open_store(store_url) as store:
        store.ingest_many([(r, T0, source) for r, source in sent] + [(report(9000), T0, None)])
        for pooled, summaries in migrated.items():
            _same_summaries(store.summaries("digits", statistics=ASKED, pooled=pooled), summaries)


# --- what the analysis's queries read (issue 32) --------------------------------------


class _Recording:
    """A connection (or cursor) that records every statement run through it."""

    def __init__(self, inner: Any, seen: list[tuple[str, Any]]) -> None:
        self._inner = inner
        self._seen = seen

    def cursor(self, **options: Any) -> _Recording:
        # A server-side cursor (a streamed read, PostgreSQL) is named in ``options``.
        return _Recording(self._inner.cursor(**options), self._seen)

    def execute(self, sql: str, params: Any = ()) -> Any:
        self._seen.append((sql, params))
        return self._inner.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            setattr(self._inner, name, value)

    def __enter__(self) -> _Recording:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._inner)


def _recorded(store: ReportStore, work: Any) -> list[tuple[str, Any]]:
    """The statements ``work`` ran on ``store``'s connections."""
    import contextlib

    seen: list[tuple[str, Any]] = []
    opened = store._connection

    @contextlib.contextmanager
    def recording() -> Iterator[Any]:
        with opened() as conn:
            yield _Recording(conn, seen)

    store._connection = recording  # type: ignore[method-assign]
    try:
        work()
    finally:
        del store._connection
    return seen


def _analysis_queries(store: ReportStore) -> list[tuple[str, Any]]:
    """Every query a store answers for `edgereg analyze` and the status page, in each shape."""
    store.ingest_many(
        [
            (
                report(n, cpu_class="armv9", schema_version=2, load_ms=10.0 + n),
                T0,
                f"192.0.{n}.0/24",
            )
            for n in range(1, 6)
        ]
        + [(report(n, arm="stable", version="1.0.0", unit_version="1.0.0"), T0) for n in (6, 7)]
        + [(counted(n, {"accepted": (4, 3)}), T0) for n in (8, 9)]
        + [(report(n, unit="ocr", model=m), T0) for n in (10, 11) for m in ("det", "rec")]
        # A store holds other units' reports too (the planner's statistics see them).
        + [
            (counted(n, {"accepted": (4, 3)}, unit=f"u{n % 6}", model=f"u{n % 6}"), T0)
            for n in range(20, 50)
        ]
    )

    def work() -> None:
        later = T0 - timedelta(hours=1)
        for unit in ("digits", "ocr"):
            store.summaries(unit)
            store.summaries(unit, bundle=unit == "ocr", aged_before=T0, statistics=ASKED)
            store.summaries(unit, since_sequence=7, pooled=True, bundle=unit == "ocr")
            store.summaries(unit, since=later, bundle=unit == "ocr")
            store.summaries(unit, cpu_class="armv9", statistics=ASKED)
            # Per tier and pooled at once (the analysis's call).
            store.summaries(
                unit, since_sequence=7, aged_before=T0, statistics=ASKED, with_pool=True
            )
            store.members(unit)
            store.clock(unit)
            store.cpu_classes(unit)
        store.summaries("ocr", model="det", since_sequence=7)
        store.prune(T0 - timedelta(days=30))

    return _recorded(store, work)


def test_no_analysis_query_scans_a_table_sqlite(tmp_path: Path) -> None:
    """Every predicate is served by an index; a summary reads only its covering index."""
    with open_store(f"sqlite:///{tmp_path}/reports.sqlite") as store:
        queries = _analysis_queries(store)
        assert len(queries) > 20
        conn = sqlite3.connect(tmp_path / "reports.sqlite")
        conn.execute("ANALYZE")  # as a store that has run a while: the planner knows its sizes
        for sql, params in queries:
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            where = f"{sql[:120]}...: {plan}"
            assert not [
                step for step in plan if re.match(r"SCAN (reports|report_metrics)\b", step)
            ], where
            for step in plan if not sql.startswith("DELETE") else ():
                if step.startswith("SEARCH reports "):
                    # A --since period may read the rows of its time range (reports_clock);
                    # the app metrics read their column from each row an index finds (a
                    # model's in the summary index's order: no sort, below; a bundle's
                    # sorted by install); every other summary reads the index alone.
                    if re.search(r"metrics(, metric_events, token)? FROM reports", sql):
                        assert "USING INDEX" in step, where
                        continue
                    assert "COVERING INDEX" in step or "reports_clock" in step, where
            if sql.startswith(
                "SELECT tier, arm, unit_version, COALESCE(source, token), metrics FROM"
            ):
                assert not [step for step in plan if "TEMP B-TREE" in step], where
        conn.close()


def test_no_analysis_query_scans_a_table_postgresql(request: pytest.FixtureRequest) -> None:
    """With sequential scans off, PostgreSQL still finds an index for every query."""
    import psycopg

    url = str(request.getfixturevalue("postgres_url"))
    with open_store(url) as store:
        queries = _analysis_queries(store)
    with psycopg.connect(url) as conn:
        conn.execute("ANALYZE")
        conn.execute("SET enable_seqscan = off")
        for sql, params in queries:
            plan = [row[0] for row in conn.execute(f"EXPLAIN {sql}", params).fetchall()]
            scans = [
                line for line in plan if re.search(r"Seq Scan on (reports|report_metrics)\b", line)
            ]
            assert not scans, f"{sql[:120]}...: {plan}"


def test_the_registry_says_a_model_is_no_bundle_and_its_rows_are_not_searched(
    store: ReportStore,
) -> None:
    store.ingest_many(
        [(report(n), T0) for n in (1, 2)]
        + [(report(n, unit="ocr", model=m), T0) for n in (3, 4) for m in ("det", "rec")]
    )
    members = re.compile(r"model [<>] |WITH RECURSIVE")
    asked = _recorded(store, lambda: store.summaries("digits"))
    assert [sql for sql, _ in asked if members.search(sql)]
    told = _recorded(store, lambda: store.summaries("digits", bundle=False))
    assert not [sql for sql, _ in told if members.search(sql)]
    assert store.summaries("digits", bundle=False) == store.summaries("digits")
    assert store.summaries("ocr", bundle=True) == store.summaries("ocr")
    (bundle,) = store.summaries("ocr", bundle=True)
    assert bundle.devices == 2  # an install once, whatever its members


# --- every summary, against one computed from the reports in Python (issue 32) ----------

#: Each store event of one report, as the built-in guardrails' ``when`` counts it.
ORACLE_EVENTS = {
    "probe_failed": lambda r, k: r.probe == "failed" and not r.load_failed,
    "load_failed": lambda r, k: r.load_failed,
    "reverted": lambda r, k: r.reverted,
    "stalled": lambda r, k: (
        not r.confirmed and r.unconfirmed_starts is not None and r.unconfirmed_starts >= k
    ),
    "first_start": lambda r, k: r.unconfirmed_starts is not None and r.unconfirmed_starts >= 1,
    "fell_back": lambda r, k: r.backend is not None and bool(r.backends_skipped),
    "confirmed": lambda r, k: r.confirmed,
}


def _oracle_values(r: Report) -> dict[str, int | None]:
    """Each histogram kind's bucket of one report (None: it has no value)."""
    p50 = None if r.inference is None else r.inference.p50_ms
    values = {"load_ms": r.load_ms, "inference_ms": p50, "memory_peak_mb": r.memory_peak_mb}
    return {k: None if v is None else latency_bucket(v) for k, v in values.items()}


def _oracle(
    sent: list[tuple[Report, datetime, str | None]],
    *,
    pooled: bool = False,
    since_sequence: int | None = None,
    cpu_class: str | None = None,
    aged_before: datetime | None = None,
    stalled_starts: int = 2,
    statistics: dict[str, Statistic] | None = None,
) -> list[ArmSummary]:
    """What summaries() must say of reports of distinct plain-model installs, counted in Python."""
    from collections import Counter, defaultdict

    from edgereg.reports.summary import EVENTS, HISTOGRAMS, Histogram, MetricTally, Tally

    assert set(ORACLE_EVENTS) == set(EVENTS), "a new store event needs its line in ORACLE_EVENTS"
    arms: dict[tuple[str, str, str], list[tuple[Report, datetime, str]]] = defaultdict(list)
    for r, at, source in sent:
        if since_sequence is not None and r.sequence < since_sequence:
            continue
        if cpu_class is not None and r.cpu_class != cpu_class:
            continue
        arms[("*" if pooled else r.tier, r.arm, r.unit_version)].append((r, at, source or r.token))

    def tally(rows: list[tuple[Report, datetime, str]]) -> Tally:
        by_net: dict[str, list[Report]] = defaultdict(list)
        for r, _, net in rows:
            by_net[net].append(r)
        events = {
            e: sum(bool(f(r, stalled_starts)) for r, _, _ in rows) for e, f in ORACLE_EVENTS.items()
        }
        shares = {
            e: sum(
                sum(bool(f(r, stalled_starts)) for r in members) / len(members)
                for members in by_net.values()
            )
            for e, f in ORACLE_EVENTS.items()
        }
        return Tally(len(rows), len(by_net), events, shares)

    found = []
    for (tier, arm, version), rows in sorted(arms.items()):
        aged = None
        if aged_before is not None:
            aged = tally([row for row in rows if row[1] <= aged_before])
        histograms = {}
        for kind in HISTOGRAMS:
            valued = [(net, _oracle_values(r)[kind]) for r, _, net in rows]
            valued = [(net, b) for net, b in valued if b is not None]
            if not valued:
                continue
            lows: dict[str, int] = {}
            highs: dict[str, int] = {}
            for net, b in valued:
                lows[net] = min(b, lows.get(net, b))
                highs[net] = max(b, highs.get(net, b))
            histograms[kind] = Histogram(
                dict(sorted(Counter(b for _, b in valued).items())),
                dict(sorted(Counter(lows.values()).items())),
                dict(sorted(Counter(highs.values()).items())),
            )
        metrics = {}
        for name, statistic in sorted((statistics or {}).items()):
            per_net: dict[str, list[float]] = defaultdict(list)
            for r, _, net in rows:
                counts = (r.metrics or {}).get(statistic.metric)
                if counts is None:
                    continue
                buckets = (
                    [counts.events - counts.successes, counts.successes]
                    if hasattr(counts, "events")
                    else list(counts.counts)
                )
                value = statistic.of(buckets) if len(buckets) == statistic.buckets else None
                if value is not None:
                    per_net[net].append(value)
            if per_net:
                means = [sum(v) / len(v) for v in per_net.values()]
                metrics[name] = MetricTally(
                    sum(len(v) for v in per_net.values()),
                    len(per_net),
                    sum(sum(v) for v in per_net.values()),
                    sum(means),
                    sum(m * m for m in means),
                )
        found.append(
            ArmSummary(
                unit="digits",
                tier=tier,
                arm=arm,  # type: ignore[arg-type]
                version=version,
                all=tally(rows),
                aged=aged,
                histograms=histograms,
                metrics=metrics,
            )
        )
    return found


def _same_summaries(got: list[ArmSummary], expected: list[ArmSummary]) -> None:
    """Equal, counts exactly and the sums of shares and statistics to 1e-9."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, float):
            return pytest.approx(value, rel=1e-9, abs=1e-9)
        return value

    assert [plain(s) for s in got] == [plain(s) for s in expected]


def test_every_summary_is_the_reports_counted_network_by_network(store: ReportStore) -> None:
    """Many networks (NATs across tiers and arms, lone devices, unknown sources), every shape."""
    rng = random.Random(32)
    networks = [f"10.{n}.0.0/24" for n in range(40)] + [f"2001:db8:{n:x}::/48" for n in range(8)]
    sent: list[tuple[Report, datetime, str | None]] = []
    for n in range(400):
        arm = rng.choice(("candidate", "stable", "stable"))
        version = "1.1.0" if arm == "candidate" else "1.0.0"
        failed = rng.random() < 0.08
        starts = rng.choice((None, 0, 0, 1, 2, 3))
        confirmed = not failed and rng.random() < 0.85
        fields: dict[str, Any] = {
            "tier": rng.choice(("high", "mid", "low")),
            "arm": arm,
            "version": version,
            "unit_version": version,
            "sequence": rng.choice((6, 7, 8)),
            "probe": "failed" if failed else "passed",
            "backend": None if failed else rng.choice(("cpu", "opencl")),
            "backends_skipped": [] if failed or rng.random() < 0.8 else ["vulkan"],
            "load_ms": None if failed else rng.lognormvariate(3.0, 0.6),
            "load_failed": failed and rng.random() < 0.5,
            "inference": None
            if failed or rng.random() < 0.1
            else {
                "count": 9,
                "p50_ms": (p := rng.lognormvariate(1.5, 0.5)),
                "p90_ms": p * 2,
                "p99_ms": p * 3,
            },
            "confirmed": confirmed,
            "reverted": not confirmed and rng.random() < 0.4,
            "schema_version": 3,
            "unconfirmed_starts": starts,
            "cpu_class": rng.choice(("armv8.2", "armv9")),
            "memory_peak_mb": None if failed or rng.random() < 0.3 else rng.uniform(20, 90),
        }
        if not failed and rng.random() < 0.8:
            fields["metrics"] = {
                "accepted": {
                    "events": (e := rng.randrange(0, 12)),
                    "successes": rng.randrange(0, e + 1),
                },
                "confidence": {
                    "counts": [rng.randrange(0, 4) for _ in range(rng.choice((4, 4, 3)))]
                },
            }
        source = rng.choice(networks) if rng.random() < 0.85 else None
        at = T0 - timedelta(hours=rng.randrange(0, 48))
        sent.append((report(n, **fields), at, source))
    store.ingest_many(sent)
    aged = T0 - timedelta(hours=12)
    shapes: list[dict[str, Any]] = [
        {},
        {"pooled": True},
        {"aged_before": aged, "statistics": ASKED},
        {"aged_before": aged, "statistics": ASKED, "pooled": True, "stalled_starts": 3},
        {"since_sequence": 7, "statistics": ASKED},
        {"since_sequence": 8, "pooled": True, "aged_before": aged},
        {"cpu_class": "armv9", "statistics": ASKED, "aged_before": aged},
    ]
    for shape in shapes:
        for bundle in (None, False):
            got = store.summaries("digits", bundle=bundle, **shape)
            _same_summaries(got, _oracle(sent, **shape))
            if not shape.get("pooled"):
                # Per tier and pooled in one snapshot, each metric read once for both.
                both = store.summaries("digits", bundle=bundle, with_pool=True, **shape)
                pool = _oracle(sent, **shape, pooled=True)
                _same_summaries(both, _oracle(sent, **shape) + pool)
                assert {s.tier for s in pool} == {"*"}
    assert sum(s.networks for s in store.summaries("digits")) > 100


def test_many_arms_are_summed_a_few_per_statement(store: ReportStore) -> None:
    """More arms than one statement sums (every version a store kept, no period asked)."""
    rng = random.Random(33)
    sent: list[tuple[Report, datetime, str | None]] = []
    for n in range(240):
        arm = rng.choice(("candidate", "stable"))
        version = f"1.{rng.randrange(20)}.0"
        fields: dict[str, Any] = {
            "tier": rng.choice(("high", "low")),
            "arm": arm,
            "version": version,
            "unit_version": version,
            "load_ms": rng.lognormvariate(3.0, 0.6),
            "reverted": rng.random() < 0.2,
            "schema_version": 3,
            "metrics": {"accepted": {"events": 4, "successes": rng.randrange(0, 5)}},
        }
        sent.append((report(n, **fields), T0, rng.choice((None, "10.0.0.0/24", "10.0.1.0/24"))))
    store.ingest_many(sent)
    for pooled in (False, True):
        got = store.summaries("digits", pooled=pooled, statistics=ASKED)
        assert len(got) > ARMS_PER_STATEMENT
        _same_summaries(got, _oracle(sent, pooled=pooled, statistics=ASKED))
    both = store.summaries("digits", statistics=ASKED, with_pool=True)
    expected = _oracle(sent, statistics=ASKED) + _oracle(sent, pooled=True, statistics=ASKED)
    _same_summaries(both, expected)
