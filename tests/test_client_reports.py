"""Device reports: built, POSTed over real HTTP to a loopback collector, read by the one parser."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from loopkit import LoopRegistry, serve

from edgereg.client import Client, DeviceProfile
from edgereg.client._reporter import (
    DeviceFacts,
    InstallFacts,
    Reporter,
    latency_summary,
    resolve_report_url,
)
from edgereg.protocol.reports import Report, parse_report
from edgereg.protocol.wire import BundleEntry, to_bytes


@dataclass
class Collector:
    """A real HTTP server that keeps what it is sent and answers ``status``."""

    base: str
    received: list[tuple[str, str, bytes]] = field(default_factory=list)
    status: int = 204
    hold: threading.Event | None = None

    def reports(self) -> list[Report]:
        return [parse_report(body) for _, _, body in self.received]


@pytest.fixture
def collector() -> Iterator[Collector]:
    state = Collector("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if state.hold is not None:
                state.hold.wait(10)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.base = f"http://127.0.0.1:{server.server_address[1]}/registry/"
    try:
        yield state
    finally:
        if state.hold is not None:
            state.hold.set()
        server.shutdown()
        server.server_close()


FACTS = InstallFacts(
    unit="digits",
    model="digits",
    version="1.1.0",
    unit_version="1.1.0",
    variant="int8",
    tier="high",
    arm="candidate",
    sequence=7,
    probe="passed",
    backend="cpu",
    backends_skipped=["opencl"],
    load_ms=12.3456,
)
DEVICE = DeviceFacts(os="android", os_version="14", device_class="ram4-8c", mnn_runtime="3.6.1")


def _reporter(collector: Collector, tmp_path: Path, *, enabled: bool = True) -> Reporter:
    return Reporter(collector.base, tmp_path, device=DEVICE, background=False, enabled=enabled)


def test_an_install_is_reported_as_canonical_json_to_the_relative_url(
    collector: Collector, tmp_path: Path
) -> None:
    sent = _reporter(collector, tmp_path).installed(FACTS, "v1/reports")
    assert sent is not None
    [(path, content_type, body)] = collector.received
    assert (path, content_type) == ("/registry/v1/reports", "application/json")
    assert body == to_bytes(sent)  # canonical: what the one parser reads back
    report = parse_report(body)
    assert (report.model, report.version, report.arm, report.sequence) == (
        "digits",
        "1.1.0",
        "candidate",
        7,
    )
    assert (report.backend, report.backends_skipped, report.probe) == ("cpu", ["opencl"], "passed")
    assert (report.os, report.device_class, report.mnn_runtime) == ("android", "ram4-8c", "3.6.1")
    assert report.load_ms == 12.346
    assert not report.confirmed
    assert not report.reverted


def test_an_absolute_url_is_used_as_given(collector: Collector, tmp_path: Path) -> None:
    other = collector.base.replace("/registry/", "/collector/in")
    Reporter("file:///nowhere/registry", tmp_path, background=False).installed(FACTS, other)
    assert [path for path, _, _ in collector.received] == ["/collector/in"]
    assert resolve_report_url("file:///srv/registry", "v1/reports") is None
    assert resolve_report_url("https://cdn.example/r", "v1/reports") == (
        "https://cdn.example/r/v1/reports"
    )


def test_confirm_and_revert_are_reported_again_under_the_install_token(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    reporter.confirmed("digits", "digits")
    # A new process (the next app start) finds the same install: same token.
    _reporter(collector, tmp_path).reverted("digits", "digits")
    first, confirmed, reverted = collector.reports()
    assert first.token == confirmed.token == reverted.token
    assert (confirmed.confirmed, confirmed.reverted) == (True, False)
    assert (reverted.confirmed, reverted.reverted) == (True, True)


def test_a_confirm_after_a_rejection_re_sends_the_installed_versions_report(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    rejected = InstallFacts(
        **{**FACTS.__dict__, "version": "1.2.0", "unit_version": "1.2.0", "probe": "failed"}
    )
    reporter.installed(rejected, "v1/reports")
    # The app goes on running 1.1.0, still installed, and confirms it.
    reporter.confirmed("digits", "digits")
    installed, refused, confirmed = collector.reports()
    assert (refused.version, refused.probe, refused.confirmed) == ("1.2.0", "failed", False)
    assert (confirmed.version, confirmed.probe, confirmed.confirmed) == ("1.1.0", "passed", True)
    assert confirmed.token == installed.token != refused.token


def test_a_new_version_gets_a_new_token_and_an_old_one_keeps_its_own(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    stable = InstallFacts(**{**FACTS.__dict__, "version": "1.0.0", "unit_version": "1.0.0"})
    stable = InstallFacts(**{**stable.__dict__, "arm": "stable"})
    reporter.installed(stable, "v1/reports")
    reporter.installed(FACTS, "v1/reports")
    reporter.installed(stable, "v1/reports")  # reverted to the stable
    old, new, back = collector.reports()
    assert old.token != new.token
    assert back.token == old.token
    assert len({old.token, new.token}) == 2
    assert all(len(r.token) == 32 for r in (old, new))


def test_latency_the_app_records_is_summarised_once(collector: Collector, tmp_path: Path) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    for ms in range(1, 101):
        reporter.record_inference("digits", float(ms))
    reporter.confirmed("digits", "digits")
    reporter.summary("digits", "digits")
    _, confirmed, later = collector.reports()
    assert confirmed.inference is not None
    assert (confirmed.inference.count, confirmed.inference.p50_ms) == (100, 50.0)
    assert (confirmed.inference.p90_ms, confirmed.inference.p99_ms) == (90.0, 99.0)
    assert later.inference is None  # nothing measured since the last report
    assert latency_summary([]) is None
    one = latency_summary([7.0])
    assert one is not None
    assert (one.p50_ms, one.p99_ms) == (7.0, 7.0)


def test_opting_out_sends_and_stores_nothing(collector: Collector, tmp_path: Path) -> None:
    reporter = _reporter(collector, tmp_path, enabled=False)
    reporter.record_inference("digits", 3.0)
    assert reporter.installed(FACTS, "v1/reports") is None
    assert reporter.confirmed("digits", "digits") is None
    assert collector.received == []
    assert list(tmp_path.iterdir()) == []


def test_no_report_url_no_report(collector: Collector, tmp_path: Path) -> None:
    assert _reporter(collector, tmp_path).installed(FACTS, None) is None
    assert collector.received == []


def test_a_report_answered_with_errors_is_tried_five_times_then_dropped(
    collector: Collector, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    collector.status = 503
    reporter = _reporter(collector, tmp_path)
    assert reporter.installed(FACTS, "v1/reports") is not None  # never raises
    assert len(collector.received) == 1
    for tries in range(2, 6):
        reporter.retry_pending()  # each update check tries once more
        assert len(collector.received) == tries
    reporter.retry_pending()  # five answered tries: dropped, not sent a sixth time
    assert len(collector.received) == 5
    assert "report dropped" in caplog.text


def test_a_report_made_offline_waits_for_the_network(collector: Collector, tmp_path: Path) -> None:
    """A try the network never answered costs nothing: the report survives offline checks."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    offline = Reporter(f"http://127.0.0.1:{port}/registry/", tmp_path, background=False, timeout=1)
    offline.installed(FACTS, "v1/reports")
    for _ in range(8):  # eight update checks, all offline
        offline.retry_pending()
    [kept] = json.loads((tmp_path / "reports.json").read_text())["pending"]
    assert kept["tries"] == 0
    # Back online: the same report reaches the collector (the kept URL pointed at the
    # unreachable port; here the device's collector comes back at another one).
    kept["url"] = collector.base + "v1/reports"
    state = json.loads((tmp_path / "reports.json").read_text())
    state["pending"] = [kept]
    (tmp_path / "reports.json").write_text(json.dumps(state))
    _reporter(collector, tmp_path).retry_pending()
    [delivered] = collector.reports()
    assert (delivered.token, delivered.sequence) == (kept["body"]["token"], 7)
    assert json.loads((tmp_path / "reports.json").read_text())["pending"] == []


def test_a_retry_that_succeeds_sends_the_same_report(collector: Collector, tmp_path: Path) -> None:
    collector.status = 503
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    collector.status = 204
    reporter.retry_pending()
    first, retried = collector.received
    assert first[2] == retried[2]


def test_a_refused_report_is_not_retried(collector: Collector, tmp_path: Path) -> None:
    collector.status = 400
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    reporter.retry_pending()
    assert len(collector.received) == 1


def test_an_unreachable_collector_fails_nothing(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reporter = Reporter(f"http://127.0.0.1:{port}/", tmp_path, background=False, timeout=1.0)
    assert reporter.installed(FACTS, "v1/reports") is not None
    pending = json.loads((tmp_path / "reports.json").read_text())["pending"]
    assert [p["url"] for p in pending] == [f"http://127.0.0.1:{port}/v1/reports"]


def test_a_silent_collector_is_cut_off_by_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts the connection, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        reporter = Reporter(url, tmp_path, background=False, timeout=0.3)
        assert reporter.installed(FACTS, "v1/reports") is not None
    assert json.loads((tmp_path / "reports.json").read_text())["pending"]


def test_sending_never_blocks_the_caller(collector: Collector, tmp_path: Path) -> None:
    collector.hold = threading.Event()
    reporter = Reporter(collector.base, tmp_path, device=DEVICE)
    # The collector holds every request until released: the caller goes on regardless.
    assert reporter.installed(FACTS, "v1/reports") is not None
    assert reporter.confirmed("digits", "digits") is not None
    assert collector.received == []
    collector.hold.set()
    reporter.close(timeout=10)
    assert [r.confirmed for r in collector.reports()] == [False, True]


def test_reports_carry_nothing_that_identifies_the_device(
    collector: Collector, tmp_path: Path
) -> None:
    _reporter(collector, tmp_path).installed(FACTS, "v1/reports")
    document = json.loads(collector.received[0][2])
    assert set(document) <= set(Report.model_fields)
    assert not {"device_id", "ip", "user"} & set(document)


def test_device_facts_are_checked_when_the_app_gives_them() -> None:
    with pytest.raises(ValueError, match="device_class"):
        DeviceFacts(device_class="Pixel 8 of jane@example.com")


def test_an_unreadable_reports_file_is_started_afresh(collector: Collector, tmp_path: Path) -> None:
    (tmp_path / "reports.json").write_text("[1, 2")
    assert _reporter(collector, tmp_path).installed(FACTS, "v1/reports") is not None
    assert json.loads((tmp_path / "reports.json").read_text())["reports"]["digits/digits"]


def test_members_of_one_install_share_its_token_and_are_kept_apart_for_the_retry(
    collector: Collector, tmp_path: Path
) -> None:
    collector.status = 503
    reporter = _reporter(collector, tmp_path)
    for model in ("det", "rec"):
        facts = InstallFacts(**{**FACTS.__dict__, "unit": "ocr", "model": model})
        reporter.installed(facts, "v1/reports")
    collector.status = 204
    reporter.retry_pending()
    det, rec, det_again, rec_again = collector.reports()
    assert det.token == rec.token
    assert {det_again.model, rec_again.model} == {"det", "rec"}


# --- the client sends them: a bundle over real HTTP ------------------------------------


def test_each_member_of_a_bundle_is_reported_under_the_bundle(tmp_path: Path) -> None:
    registry = LoopRegistry(tmp_path / "registry", model="ocr")
    members = {}
    for name in ("det", "rec"):
        blob = tmp_path / f"{name}.mnn"
        blob.write_bytes(random.Random(name).randbytes(1000))
        members[name] = registry.entry(blob, None, version="1.4.0", backends=("cpu",))
    registry.publish(BundleEntry(version="2.0.0", members=members))
    with serve(registry.root) as served:
        client = Client(
            served.url,
            registry.trusted,
            tmp_path / "cache",
            bundle="ocr",
            device=DeviceProfile(device_id="d1", ram_mb=6144, cpu_cores=8),
            tier="high",
        )
        assert client.fetch().version == "2.0.0"
        client.record_inference(5.0, model="rec")
        assert client.confirm("2.0.0")
        client.close()
        reports = served.reports()
    assert [(r.model, r.confirmed) for r in reports] == [
        ("det", False),
        ("rec", False),
        ("det", True),
        ("rec", True),
    ]
    assert {(r.unit, r.unit_version, r.version, r.probe) for r in reports} == {
        ("ocr", "2.0.0", "1.4.0", "none")
    }
    assert reports[2].inference is None
    assert reports[3].inference is not None
    assert reports[0].token == reports[1].token  # one install, one token


# --- version 2: what the app measures, and where the device stands ----------------------


def test_a_report_that_uses_nothing_new_is_a_version_1_report_byte_for_byte(
    collector: Collector, tmp_path: Path
) -> None:
    _reporter(collector, tmp_path).installed(FACTS, "v1/reports")
    [(_, _, body)] = collector.received
    document = json.loads(body)
    assert document["schema_version"] == 1
    for key in ("unconfirmed_starts", "cpu_class", "memory_peak_mb", "first_inference_ms"):
        assert key not in document


def test_the_cpu_class_makes_every_report_a_version_2_report(
    collector: Collector, tmp_path: Path
) -> None:
    device = DeviceFacts(os="android", os_version="14", cpu_class="armv9")
    Reporter(collector.base, tmp_path, device=device, background=False).installed(
        FACTS, "v1/reports"
    )
    (report,) = collector.reports()
    assert (report.schema_version, report.cpu_class) == (2, "armv9")


def test_the_first_inference_of_an_install_is_reported_and_kept(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.record_inference("digits", 900.0)  # the model before this install ran it
    reporter.installed(FACTS, "v1/reports")
    for ms in (120.0, 8.0, 9.0):
        reporter.record_inference("digits", ms)
    reporter.confirmed("digits", "digits")
    reporter.record_inference("digits", 7.0)
    reporter.summary("digits", "digits")
    # The next version: its own first call.
    newer = InstallFacts(**{**FACTS.__dict__, "version": "1.2.0", "unit_version": "1.2.0"})
    reporter.installed(newer, "v1/reports")
    reporter.record_inference("digits", 95.5)
    reporter.summary("digits", "digits")
    installed, confirmed, later, new_install, new_later = collector.reports()
    assert installed.first_inference_ms is None
    assert installed.schema_version == 1
    assert (confirmed.first_inference_ms, confirmed.schema_version) == (120.0, 2)
    assert later.first_inference_ms == 120.0  # kept with the install, unlike latency
    assert new_install.first_inference_ms is None
    assert new_later.first_inference_ms == 95.5


@pytest.mark.parametrize(
    ("peak", "steady", "sent"),
    [
        (212.5, 140.0, (212.5, 140.0)),
        (212, None, (212.0, None)),
        (0, 0, (0.0, 0.0)),
        (-1.0, 140.0, (None, 140.0)),  # a figure no report can carry is dropped
        (2_000_000.0, None, None),  # nothing left to send
        (float("nan"), None, None),
    ],
)
def test_the_memory_the_app_measured_is_reported_at_once(
    collector: Collector,
    tmp_path: Path,
    peak: float,
    steady: float | None,
    sent: tuple[float | None, float | None] | None,
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    result = reporter.memory("digits", "digits", peak, steady)
    if sent is None:
        assert result is None
        assert len(collector.received) == 1
        return
    _, report = collector.reports()
    assert (report.memory_peak_mb, report.memory_steady_mb) == sent
    assert report.schema_version == 2
    reporter.confirmed("digits", "digits")
    assert collector.reports()[-1].memory_peak_mb == sent[0]  # kept in later reports


def test_memory_for_nothing_installed_is_not_sent(collector: Collector, tmp_path: Path) -> None:
    assert _reporter(collector, tmp_path).memory("digits", "digits", 100.0, 50.0) is None
    assert collector.received == []


def test_unconfirmed_starts_are_reported_and_capped(collector: Collector, tmp_path: Path) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(FACTS, "v1/reports")
    reporter.unconfirmed("digits", "digits", 1)
    reporter.unconfirmed("digits", "digits", 5000)
    _, one, many = collector.reports()
    assert (one.unconfirmed_starts, many.unconfirmed_starts) == (1, 1000)
    assert one.token == many.token


# --- through `edgereg serve`: a crash loop stored as it happens -------------------------


def _events(summary: object, *names: str) -> tuple[int, ...]:
    return tuple(summary.all.count(name) for name in names)  # type: ignore[attr-defined]


def test_a_crash_loop_is_stored_by_edgereg_serve_before_the_revert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import servekit

    from edgereg.client import _reporter as reporter_module
    from edgereg.registry import Registry
    from edgereg.reports import open_store
    from edgereg.serve._ratelimit import RateLimiter
    from edgereg.signing import Signer, TrustedKeys, generate_key
    from edgereg.storage import open_storage

    root = tmp_path / "registry"
    signer = Signer.from_pem(generate_key()[0])
    registry = Registry(open_storage(str(root)))
    staging = tmp_path / "staging"
    staging.mkdir()
    for version in ("1.0.0", "1.1.0"):
        prepared, _ = servekit._release(
            "digits", version, {"high": 4000, "low": 1000}, staging, seed=version
        )
        registry.publish(
            prepared,
            signer=signer,
            percent=None if version == "1.0.0" else 100.0,
            full=version == "1.0.0",
            actor="tests@tests",
            expires_days=30,
            report_url="v1/reports",
        )
        if version == "1.0.0":
            first = Client(
                "file://" + str(root),
                TrustedKeys([signer.public_key]),
                tmp_path / "cache",
                model="digits",
                device=DeviceProfile(device_id="d1", ram_mb=6144, cpu_cores=8),
                tier="high",
                reporting=False,
            )
            assert first.fetch().version == "1.0.0"
            assert first.confirm("1.0.0")
    # The real statuses of the real server, as the client's sender saw them.
    answers: list[tuple[int, bytes]] = []
    post = reporter_module._http_post

    def observed(url: str, body: bytes, timeout: float) -> int:
        status = post(url, body, timeout)
        answers.append((status, body))
        return status

    monkeypatch.setattr(reporter_module, "_http_post", observed)
    with (
        open_store(f"sqlite:///{tmp_path}/reports.sqlite") as store,
        servekit.serve(root, reports=store, report_limiter=RateLimiter(10_000, 10_000)) as url,
    ):
        client = Client(
            url,
            TrustedKeys([signer.public_key]),
            tmp_path / "cache",
            model="digits",
            device=DeviceProfile(device_id="d1", ram_mb=6144, cpu_cores=8),
            tier="high",
            cpu_features={"dotprod", "fp16", "i8mm"},
            max_unconfirmed_starts=3,
        )
        # Installed before app_started: this start runs it, and counts nothing yet.
        assert client.fetch().version == "1.1.0"
        assert client.app_started() is None
        assert client.app_started() is None  # the one before ended unconfirmed: 1
        client.close()
        (candidate,) = [s for s in store.summaries("digits") if s.arm == "candidate"]
        # Stored, not yet reverted; one start is not a stall (stalled_starts 2).
        assert (candidate.devices, *_events(candidate, "reverted", "stalled")) == (1, 0, 0)
        assert client.app_started() is None
        client.close()
        # The second unconfirmed start is on the server as it happens: a stall, no revert.
        (stalled,) = [s for s in store.summaries("digits") if s.arm == "candidate"]
        assert _events(stalled, "stalled", "reverted") == (1, 0)
        assert client.app_started() is not None  # the third counted start reverts
        client.close()
        (after,) = [s for s in store.summaries("digits") if s.arm == "candidate"]
    sent = [parse_report(body) for _, body in answers]
    assert [status for status, _ in answers] == [202] * 5
    assert [(r.unconfirmed_starts, r.reverted) for r in sent] == [
        (None, False),
        (1, False),
        (2, False),
        (3, False),
        (3, True),
    ]
    assert {(r.schema_version, r.cpu_class, r.version) for r in sent} == {(2, "armv9", "1.1.0")}
    assert (after.devices, *_events(after, "reverted")) == (1, 1)
    assert _events(after, "stalled") == (1,)  # the revert keeps its count: stalled still


# --- every rollout period, both arms (docs/protocol.md §11) -----------------------------


STABLE = InstallFacts(
    **{**FACTS.__dict__, "version": "1.0.0", "unit_version": "1.0.0", "arm": "stable"}
)


def test_the_installed_release_is_reported_again_at_each_new_sequence(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(STABLE, "v1/reports")
    reporter.confirmed("digits", "digits")
    reporter.record_inference("digits", 11.0)
    again = reporter.period(
        "digits", "digits", "1.0.0", arm="stable", sequence=8, report_url="v1/reports"
    )
    # The same sequence (a 304, a check right after) or an older one sends nothing.
    for sequence in (8, 7):
        assert (
            reporter.period(
                "digits",
                "digits",
                "1.0.0",
                arm="stable",
                sequence=sequence,
                report_url="v1/reports",
            )
            is None
        )
    installed, _confirmed, period = collector.reports()
    assert again == period
    assert (period.token, period.sequence, period.arm) == (installed.token, 8, "stable")
    assert period.confirmed  # kept, not reset
    assert period.inference is not None
    assert period.inference.count == 1


def test_a_rejected_release_keeps_counting_in_its_arm_with_no_latency(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(STABLE, "v1/reports")
    rejected = InstallFacts(**{**FACTS.__dict__, "probe": "failed", "backend": None})
    reporter.installed(rejected, "v1/reports")
    reporter.record_inference("digits", 9.0)  # the stable still runs: its calls
    reporter.period(
        "digits", "digits", "1.1.0", arm="candidate", sequence=9, report_url="v1/reports"
    )
    *_, refused, period = collector.reports()
    assert (period.token, period.probe, period.arm, period.sequence) == (
        refused.token,
        "failed",
        "candidate",
        9,
    )
    assert period.inference is None
    # The calls stay with the stable release that ran them.
    reporter.summary("digits", "digits")
    summary = collector.reports()[-1]
    assert (summary.version, summary.inference and summary.inference.count) == ("1.0.0", 1)


def test_a_reverted_release_is_reported_in_later_periods_without_the_fallbacks_latency(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    reporter.installed(STABLE, "v1/reports")
    reporter.confirmed("digits", "digits")
    reporter.installed(FACTS, "v1/reports")
    reporter.record_inference("digits", 50.0)  # the candidate's own call, before the revert
    reporter.reverted("digits", "digits", "1.0.0")
    for ms in (4.0, 5.0):  # the fallback runs now
        reporter.record_inference("digits", ms)
    reporter.period(
        "digits", "digits", "1.1.0", arm="candidate", sequence=8, report_url="v1/reports"
    )
    reporter.summary("digits", "digits")
    *_, revert, period, fallback = collector.reports()
    assert revert.reverted
    assert revert.inference is not None
    assert revert.inference.count == 1
    assert (period.version, period.reverted, period.sequence, period.inference) == (
        "1.1.0",
        True,
        8,
        None,
    )
    assert fallback.version == "1.0.0"
    assert fallback.inference is not None
    assert fallback.inference.count == 2


def test_a_release_never_reported_here_is_not_reported_by_the_period(
    collector: Collector, tmp_path: Path
) -> None:
    reporter = _reporter(collector, tmp_path)
    assert (
        reporter.period(
            "digits", "digits", "1.1.0", arm="candidate", sequence=3, report_url="v1/reports"
        )
        is None
    )
    assert collector.received == []


@pytest.mark.parametrize(
    ("facts", "sent"),
    [
        (DeviceFacts(mnn_runtime="v3.6.1"), {"mnn_runtime": "v3.6.1"}),
        (DeviceFacts(mnn_runtime="3.6.1-rc.2"), {"mnn_runtime": "3.6.1-rc.2"}),
        (DeviceFacts(mnn_runtime="2.4.0 (123)"), {"mnn_runtime": "2.4.0 (123)"}),
        (DeviceFacts(mnn_runtime="3." + "1" * 70), {"mnn_runtime": None}),
        (DeviceFacts(mnn_runtime="latest"), {"mnn_runtime": None}),
        (DeviceFacts(cpu_class="Not A Class"), {"cpu_class": None}),
        (DeviceFacts(os_version="17.4 (21E219)"), {"os_version": "17.4 (21E219)"}),
        (DeviceFacts(os_version="14+beta.2"), {"os_version": "14+beta.2"}),
        (DeviceFacts(os_version="14" + ".1" * 20), {"os_version": "14" + ".1" * 20}),
        (DeviceFacts(os_version="14" + ".1" * 40), {"os_version": None}),
        (DeviceFacts(os_version="14/beta"), {"os_version": None}),
    ],
    ids=[
        "leading-v",
        "pre-release",
        "build",
        "too-long",
        "not-a-version",
        "bad-cpu-class",
        "os-build",
        "os-plus-build",
        "os-42-characters",
        "os-too-long",
        "os-not-a-version",
    ],
)
def test_a_device_fact_the_report_cannot_carry_is_sent_as_null(
    collector: Collector, tmp_path: Path, facts: DeviceFacts, sent: dict[str, object]
) -> None:
    """A device always reports (§11): a fact the report's pattern refuses becomes null."""
    Reporter(collector.base, tmp_path, device=facts, background=False).installed(
        FACTS, "v1/reports"
    )
    [report] = collector.reports()
    assert {key: getattr(report, key) for key in sent} == sent


def test_a_reports_file_of_the_earlier_layout_is_read(collector: Collector, tmp_path: Path) -> None:
    reporter = _reporter(collector, tmp_path)
    sent = reporter.installed(FACTS, "v1/reports")
    assert sent is not None
    earlier = {
        "models": {
            "digits/digits": {
                "url": collector.base + "v1/reports",
                "report": sent.model_dump(mode="json"),
            }
        },
        "tokens": {"digits": {"1.1.0": sent.token}},
        "pending": [],
    }
    from edgereg.client._cache import write_state_file

    write_state_file(tmp_path / "reports.json", earlier)
    again = _reporter(collector, tmp_path).confirmed("digits", "digits")
    assert again is not None
    assert (again.token, again.confirmed) == (sent.token, True)


# --- app metrics (docs/protocol.md §3 "App metrics", §11) -------------------------------


def test_app_metrics_are_counted_per_install_and_sent_as_totals(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    from edgereg.protocol.wire import DistributionMetric, RateMetric

    registry = LoopRegistry(tmp_path / "registry", model="textrec")
    blob = tmp_path / "textrec.mnn"
    blob.write_bytes(random.Random("textrec").randbytes(1000))
    declared = {
        "accepted": RateMetric(kind="rate"),
        "confidence": DistributionMetric(kind="distribution", buckets=[0.5, 0.7, 0.9]),
    }
    entry = registry.entry(blob, None, version="1.0.0", backends=("cpu",))
    registry.publish(entry.model_copy(update={"metrics": declared}))
    now = [datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)]

    def client() -> Client:
        return Client(
            served.url,
            registry.trusted,
            tmp_path / "cache",
            model="textrec",
            device=DeviceProfile(device_id="d1", ram_mb=6144, cpu_cores=8),
            tier="high",
            clock=lambda: now[0],
        )

    with serve(registry.root) as served:
        app = client()
        # Nothing installed yet: nothing is counted, and nothing is refused either.
        app.record("anything", True)
        assert app.fetch().version == "1.0.0"
        for success in (True, True, False):
            app.record("accepted", success)
        for value in (0.4, 0.5, 0.55, 0.7, 0.95, 0.95):
            app.observe("confidence", value)
        # A name the release does not declare, or the other kind: the caller's mistake.
        with pytest.raises(ValueError, match="declares no app metric 'acceptd'"):
            app.record("acceptd", True)
        with pytest.raises(ValueError, match="is a distribution, not a rate"):
            app.record("confidence", True)
        with pytest.raises(ValueError, match="finite"):
            app.observe("confidence", float("nan"))
        assert app.confirm()
        app.close()
        # A restart: the counts of the install go on.
        app = client()
        app.record("accepted", True)
        app.fetch()  # under 12 hours since the last report: nothing more is sent
        app.close()
        sent = served.reports()
        assert len(sent) == 2
        now[0] += timedelta(hours=13)
        app.fetch()  # counts changed and the last report is 13 hours old: sent with them
        app.fetch()  # unchanged since: nothing
        app.close()
        reports = served.reports()
    installed, confirmed, later = reports
    assert installed.metrics is None  # nothing counted at the install yet
    assert confirmed.schema_version == 3
    assert confirmed.metrics is not None
    assert confirmed.metrics["accepted"].model_dump() == {"events": 3, "successes": 2}
    # 0.4 and 0.5 (an edge falls in the bucket it closes), 0.55 and 0.7, none, 0.95 twice.
    assert confirmed.metrics["confidence"].model_dump() == {"counts": [2, 2, 0, 2]}
    assert later.token == confirmed.token
    assert later.metrics is not None
    assert later.metrics["accepted"].model_dump() == {"events": 4, "successes": 3}
    assert len(to_bytes(later)) < 1024  # a report with two metrics stays small
