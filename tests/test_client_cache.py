"""The client's state files and its codes: one reader, one table of codes, logged recoveries."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgereg.client import CacheError, HealthLedger, NoSpace, Reporter
from edgereg.client._cache import MAX_STATE_BYTES, StateFile, _Cache, read_state_file
from edgereg.client._fetcher import ManifestNotFound
from edgereg.client._results import BadRelease, error_code
from edgereg.client._selftest import _Memory
from edgereg.protocol.errors import EdgeregError, TransportError, TrustError
from edgereg.protocol.reasons import CLIENT_REASONS, REASONS, ProbeFailed

DOCS = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


# --- one reader ---------------------------------------------------------------------------


def test_an_absent_state_file_reads_as_none(tmp_path: Path) -> None:
    assert read_state_file(tmp_path / "installed.json", "installed") is None


@pytest.mark.parametrize("kind", sorted(MAX_STATE_BYTES))
def test_a_state_file_at_its_cap_is_read_and_one_byte_more_is_refused(
    tmp_path: Path, kind: StateFile
) -> None:
    path = tmp_path / "state.json"
    limit = MAX_STATE_BYTES[kind]
    filler = limit - len('{"x": ""}')
    path.write_text('{"x": "' + "a" * filler + '"}')
    assert path.stat().st_size == limit
    assert read_state_file(path, kind) == {"x": "a" * filler}
    path.write_text('{"x": "' + "a" * (filler + 1) + '"}')
    with pytest.raises(CacheError, match=f"larger than the {limit} bytes") as caught:
        read_state_file(path, kind)
    assert caught.value.errno is None


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b'{"a": 1', "not JSON"),
        (b'{"a": 1, "a": 2}', "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
    ids=["array", "truncated", "duplicate-key", "not-utf8"],
)
def test_a_damaged_state_file_is_one_cache_error(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "health.json"
    path.write_bytes(content)
    with pytest.raises(CacheError, match=why):
        read_state_file(path, "health")


def test_an_unreadable_state_file_is_a_cache_error_with_its_errno(tmp_path: Path) -> None:
    (tmp_path / "installed.json").mkdir()  # reading a directory fails like a bad disk
    with pytest.raises(CacheError, match="cannot read") as caught:
        read_state_file(tmp_path / "installed.json", "installed")
    assert caught.value.errno is not None


def _health(cache: Path) -> object:
    return HealthLedger(cache)._read()


def _reports(cache: Path) -> object:
    return Reporter("http://127.0.0.1:9/", cache, background=False)._read()


def _selftest(cache: Path) -> object:
    return _Memory(cache).read()


def _installed(cache: Path) -> object:
    return _Cache(cache).read_record("model", "digits")


READERS: list[tuple[str, StateFile, Callable[[Path], object], object]] = [
    ("health.json", "health", _health, {}),
    (
        "reports.json",
        "reports",
        _reports,
        {"reports": {}, "installed": {}, "tokens": {}, "pending": [], "metrics": {}},
    ),
    ("selftest.json", "selftest", _selftest, {}),
    ("installed.json", "installed", _installed, None),
]


@pytest.mark.parametrize(("name", "kind", "read", "afresh"), READERS, ids=[r[0] for r in READERS])
def test_every_reader_starts_afresh_past_its_cap_and_logs_it(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    name: str,
    kind: StateFile,
    read: Callable[[Path], object],
    afresh: object,
) -> None:
    (tmp_path / name).write_text('{"x": "' + "a" * MAX_STATE_BYTES[kind] + '"}')
    with caplog.at_level(logging.WARNING, logger="edgereg.client"):
        assert read(tmp_path) == afresh
    assert f"larger than the {MAX_STATE_BYTES[kind]} bytes" in caplog.text
    assert str(tmp_path / name) in caplog.text


def test_the_rollback_state_past_its_cap_refuses_instead_of_starting_afresh(
    tmp_path: Path,
) -> None:
    sequence = tmp_path / "state" / "digits" / "sequence.json"
    sequence.parent.mkdir(parents=True)
    sequence.write_text(json.dumps({"highest_sequence": 7, "pad": "a" * 5000}))
    with pytest.raises(CacheError, match="rollback protection"):
        _Cache(tmp_path).read_sequence("digits")


def test_an_evicted_blob_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blob = tmp_path / "blobs" / ("ab" * 32)
    blob.parent.mkdir()
    blob.write_bytes(b"12345")
    with caplog.at_level(logging.INFO, logger="edgereg.client"):
        assert _Cache(tmp_path).evict() == 5
    assert not blob.exists()
    assert f"evicted {blob} (5 bytes)" in caplog.text


# --- the codes ----------------------------------------------------------------------------

FAILURES: list[EdgeregError] = [
    TransportError("down"),
    ManifestNotFound("404", status=404, retryable=False),
    TrustError("no key"),
    CacheError("disk"),
    NoSpace("full", needed=2, free=1),
    BadRelease("refused before"),
    *(reason("refused") for reason in REASONS),
]


@pytest.mark.parametrize("exc", FAILURES, ids=lambda e: type(e).__name__)
def test_every_code_a_fetch_reports_is_in_the_protocols_tables(exc: EdgeregError) -> None:
    codes = {r.code for r in CLIENT_REASONS} | {r.reason for r in REASONS}
    assert error_code(exc) in codes


def test_the_client_codes_are_told_apart() -> None:
    assert [error_code(e) for e in FAILURES[:6]] == [
        "transport",
        "not-found",
        "untrusted",
        "cache",
        "no-space",
        "bad-release",
    ]
    assert error_code(ProbeFailed("wrong outputs")) == "probe-failed"


def test_the_client_codes_are_not_reason_codes_and_are_unique() -> None:
    client = [r.code for r in CLIENT_REASONS]
    assert len(set(client)) == len(client)
    assert not set(client) & {r.reason for r in REASONS}


def _docs_rows() -> dict[str, list[str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## 10. The reference client") : text.index("## 11.")]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        found = re.fullmatch(r"\| `([a-z-]+)` \| (.*) \|", line)
        if found:
            rows[found.group(1)] = [cell.strip() for cell in found.group(2).split(" | ")]
    return rows


@pytest.mark.parametrize("reason", CLIENT_REASONS, ids=lambda r: r.code)
def test_docs_protocol_lists_each_client_code_as_the_table_says(reason: Any) -> None:
    row = _docs_rows().get(reason.code)
    assert row == [reason.when, reason.app_does, "yes" if reason.retry else "no"]


def test_docs_protocol_lists_no_client_code_the_table_lacks() -> None:
    assert set(_docs_rows()) == {r.code for r in CLIENT_REASONS}
