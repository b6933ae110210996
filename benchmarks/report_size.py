"""A device report's size on the wire, with and without app metrics (issue 26).

The Python reference client's real ``Reporter`` (edgereg/client/_reporter.py)
sends its reports to a socket on loopback that keeps every byte it receives:
the request line, the headers and the body, as they cross the network (TLS
adds its own framing on top, the same for every report). One install of a
text recognizer on a mid-range phone: installed, first inference, the app's
memory figures, latency recorded, confirmed; then the same install with five
app metrics (three rates: ``accepted``, ``cloud_fallback``, ``retried``; two
distributions of 8 buckets: ``confidence``, ``edit_distance``) counted at a
day's use through the client's own counting and sent as the confirmation's
report; a month's and a year's totals (the same draws, tallied in memory and
checked against the client's on the day) in the same report as it serializes it.

Counts of 10^9 cannot be recorded one by one: the worst cases are the report
the client would build then, serialized the way it sends (``to_bytes``), and
sized as the same request: five metrics of 8 buckets at 10^9, five of 32
buckets at 10^9, and the protocol's largest report (tests/vectors/reports/
worst-case.json: every key at its bound, 16 metrics of 32 counts).

Target: a report with 5 metrics at realistic counts under 1 KiB on the wire
(headers included). Also checked: every body is at most ``MAX_REPORT_BYTES``.

Usage: .venv/bin/python benchmarks/report_size.py
"""

from __future__ import annotations

import os
import random
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "vectors"))

from edgereg.client._reporter import DeviceFacts, InstallFacts, Reporter  # noqa: E402
from edgereg.protocol.reports import MAX_REPORT_BYTES, Report, parse_report  # noqa: E402
from edgereg.protocol.wire import to_bytes  # noqa: E402

TARGET_BYTES = 1024

RATES = {"accepted": 0.92, "cloud_fallback": 0.07, "retried": 0.03}
# Distributions of 8 buckets (7 edges): the recognizer's confidence, and the edits the
# user made to the recognized text (0, 1, 2, ... characters).
DISTRIBUTIONS = {
    "confidence": [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95],
    "edit_distance": [0, 1, 2, 3, 5, 8, 13],
}
#: Recognitions a day of use brings, by scenario.
USE = {"a day (60 events)": 60, "a month (3,000)": 3_000, "a year (100,000)": 100_000}

FACTS = InstallFacts(
    unit="textrec",
    model="textrec",
    version="1.4.0",
    unit_version="1.4.0",
    variant="int8",
    tier="mid",
    arm="candidate",
    sequence=12,
    probe="passed",
    backend="cpu",
    backends_skipped=["opencl"],
    load_ms=41.512,
)
DEVICE = DeviceFacts(
    os="android", os_version="14", device_class="ram8-8c", mnn_runtime="3.6.1", cpu_class="armv8.2"
)


class Sink:
    """A socket that answers every HTTP request 202 and keeps the bytes of each."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/registry/"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                self.requests.append((head + b"\r\n\r\n", body))
                conn.sendall(
                    b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 23\r\nConnection: close\r\n\r\n{"status": "accepted"}'
                )

    def close(self) -> None:
        self.listener.close()


def bucket(value: float, edges: list[float]) -> int:
    """The bucket a value falls in: an edge closes its bucket (docs/protocol.md §11)."""
    return next((i for i, edge in enumerate(edges) if value <= edge), len(edges))


def outcomes(events: int) -> Iterator[tuple[str, bool | None, int | None]]:
    """What the app records for ``events`` recognitions: (metric, success, bucket)."""
    rng = random.Random(events)
    for _ in range(events):
        for name, rate in RATES.items():
            yield name, rng.random() < rate, None
        confidence = min(1.0, max(0.0, rng.betavariate(8, 2)))
        edits = int(rng.expovariate(0.8))
        for name, value in (("confidence", confidence), ("edit_distance", edits)):
            yield name, None, bucket(value, DISTRIBUTIONS[name])


def tally(events: int) -> dict[str, Any]:
    """The totals a client counts for ``outcomes(events)``, as a report carries them."""
    metrics: dict[str, Any] = {name: {"events": 0, "successes": 0} for name in RATES}
    metrics.update({name: {"counts": [0] * (len(e) + 1)} for name, e in DISTRIBUTIONS.items()})
    for name, success, at in outcomes(events):
        if at is None:
            metrics[name]["events"] += 1
            metrics[name]["successes"] += int(bool(success))
        else:
            metrics[name]["counts"][at] += 1
    return metrics


def install(sink: Sink, cache: Path, events: int | None) -> tuple[bytes, bytes]:
    """One install's confirmation report as sent: (head, body). None: no app metrics."""
    reporter = Reporter(sink.base, cache, device=DEVICE, background=False)
    reporter.installed(FACTS, "v1/reports")
    rng = random.Random(0)
    for _ in range(120):
        reporter.record_inference("textrec", rng.lognormvariate(2.1, 0.35))
    reporter.memory("textrec", "textrec", 212.5, 140.25)
    for name, success, at in outcomes(events or 0):
        if at is None:
            reporter.record("textrec", "1.4.0", name, success=bool(success))
        else:
            buckets = len(DISTRIBUTIONS[name]) + 1
            reporter.observe("textrec", "1.4.0", name, bucket=at, buckets=buckets)
    reporter.confirmed("textrec", "textrec")
    head, body = sink.requests[-1]
    report = parse_report(body)
    assert report.confirmed, report
    assert (report.metrics is None) == (events is None), report
    return head, body


def as_sent(head: bytes, report_json: dict[str, Any]) -> tuple[bytes, bytes]:
    """A report the client would build, with the head it sends (Content-Length adjusted)."""
    body = to_bytes(Report.model_validate(report_json))
    lines = [
        f"Content-Length: {len(body)}".encode()
        if line.lower().startswith(b"content-length:")
        else line
        for line in head.rstrip(b"\r\n").split(b"\r\n")
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n", body


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.1f} (sizes do not depend on it)")
    sink = Sink()
    rows: list[tuple[str, int, int]] = []
    realistic: list[int] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            head, body = install(sink, Path(tmp) / "none", None)
            rows.append(("schema 2, no app metrics (install, latency, memory, confirmed)",
                          len(body), len(head) + len(body)))  # fmt: skip
            # A day's counts go through the client's own counting; the totals it sends are
            # checked against the in-memory tally that stands in for longer use (each count
            # through the client writes its state file: half a million for a year).
            day, *longer = USE.items()
            head, body = install(sink, Path(tmp) / "day", day[1])
            sent = parse_report(body).model_dump(mode="json", exclude_none=True)
            assert sent["metrics"] == tally(day[1]), (sent["metrics"], tally(day[1]))
            rows.append((f"schema 3, 5 metrics, {day[0]}", len(body), len(head) + len(body)))
            realistic.append(len(head) + len(body))
            for label, events in longer:
                head_n, body_n = as_sent(head, {**sent, "metrics": tally(events)})
                wire = len(head_n) + len(body_n)
                rows.append((f"schema 3, 5 metrics, {label}", len(body_n), wire))
                realistic.append(wire)
            last = sent
    finally:
        sink.close()
    worst8 = {
        **last,
        "metrics": {
            **{name: {"events": 10**9, "successes": 10**9} for name in RATES},
            **{name: {"counts": [10**9] * 8} for name in DISTRIBUTIONS},
        },
    }
    worst32 = {
        **worst8,
        "metrics": {
            **{name: {"events": 10**9, "successes": 10**9} for name in RATES},
            **{name: {"counts": [10**9] * 32} for name in DISTRIBUTIONS},
        },
    }
    worst32_all = {
        **worst8,
        "metrics": {f"metric_{i}": {"counts": [10**9] * 32} for i in range(5)},
    }
    from generate import WORST_REPORT  # tests/vectors/generate.py: the vector's report

    worst = [
        ("schema 3, 5 metrics (3 rates, 2 x 8 buckets), every count 10^9", worst8),
        ("schema 3, 5 metrics (3 rates, 2 x 32 buckets), every count 10^9", worst32),
        ("schema 3, 5 distributions of 32 buckets, every count 10^9", worst32_all),
        (
            "the protocol's largest (vector worst-case: 16 x 32 counts, every key at its bound)",
            WORST_REPORT,
        ),
    ]
    for label, document in worst:
        head_w, body_w = as_sent(head, document)
        rows.append((label, len(body_w), len(head_w) + len(body_w)))
    print(f"\nthe request head the Python client sends ({len(head)} bytes):")
    for line in head.rstrip(b"\r\n").split(b"\r\n"):
        print(f"  {line.decode()}")
    print("\n| report | body bytes | on the wire (head + body) |")
    print("|---|---|---|")
    for label, body_n, wire in rows:
        print(f"| {label} | {body_n:,} | {wire:,} |")
    largest = max(body_n for _, body_n, _ in rows)
    fits = largest <= MAX_REPORT_BYTES
    month = realistic[1]
    print(
        "\nsummary\n"
        f"  5 app metrics at a month's counts, on the wire: {month:,} bytes "
        f"(target < {TARGET_BYTES})  {'PASS' if month < TARGET_BYTES else 'FAIL'}\n"
        f"  5 app metrics at a year's counts, on the wire: {realistic[2]:,} bytes "
        f"(target < {TARGET_BYTES})  {'PASS' if realistic[2] < TARGET_BYTES else 'FAIL'}\n"
        f"  largest body {largest:,} bytes <= MAX_REPORT_BYTES {MAX_REPORT_BYTES:,}  "
        f"{'PASS' if fits else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
