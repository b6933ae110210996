"""Request counters and the Prometheus text exposition (format 0.0.4), by hand.

The only state a server keeps: counters per route (a fixed set of names, so
a client cannot grow the label space), method (GET, HEAD or other) and
status code, bytes written, and a latency histogram per route.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

#: Upper bounds (seconds) of the latency histogram buckets.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Histogram:
    __slots__ = ("counts", "sum", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last is +Inf only
        self.sum = 0.0
        self.total = 0


class Metrics:
    """Thread-safe request metrics of one server process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._bytes: dict[str, int] = defaultdict(int)
        self._latency: dict[str, _Histogram] = defaultdict(_Histogram)
        self._in_flight = 0
        self._refused: dict[str, int] = defaultdict(int)

    def refused(self, reason: str) -> None:
        """A report was refused for ``reason`` (a fixed set of codes)."""
        with self._lock:
            self._refused[reason] += 1

    def refusals(self, reason: str | None = None) -> int:
        """Reports refused so far, for one reason or all."""
        with self._lock:
            return sum(n for r, n in self._refused.items() if reason is None or r == reason)

    def started(self) -> None:
        """A request began."""
        with self._lock:
            self._in_flight += 1

    def observe(self, route: str, method: str, status: int, sent: int, seconds: float) -> None:
        """Record one answered request.

        Args:
            route: The route name (from a fixed set).
            method: The request method; anything but GET and HEAD counts as "other".
            status: The status code sent; 0 when none was (nothing is counted).
            sent: Bytes written to the connection (status line, headers, body).
            seconds: From the request line read to the last byte written.
        """
        method = method if method in ("GET", "HEAD") else "other"
        index = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            if status == 0:  # the client went away before a request was read whole
                return
            self._requests[(route, method, status)] += 1
            self._bytes[route] += sent
            histogram = self._latency[route]
            histogram.counts[index] += 1
            histogram.sum += seconds
            histogram.total += 1

    def requests(self, route: str | None = None, status: int | None = None) -> int:
        """Requests counted so far, optionally for one route and/or status code."""
        with self._lock:
            return sum(
                n
                for (r, _, s), n in self._requests.items()
                if (route is None or r == route) and (status is None or s == status)
            )

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        with self._lock:
            requests = sorted(self._requests.items())
            sent = sorted(self._bytes.items())
            latency = sorted(
                (route, list(h.counts), h.sum, h.total) for route, h in self._latency.items()
            )
            in_flight = self._in_flight
            refused = sorted(self._refused.items())
        lines = [
            "# HELP edgereg_http_requests_total HTTP requests answered, by route, method "
            "and status code.",
            "# TYPE edgereg_http_requests_total counter",
        ]
        for (route, method, status), count in requests:
            lines.append(
                f'edgereg_http_requests_total{{route="{route}",method="{method}",'
                f'code="{status}"}} {count}'
            )
        lines += [
            "# HELP edgereg_http_sent_bytes_total Bytes written to clients (headers and "
            "bodies), by route.",
            "# TYPE edgereg_http_sent_bytes_total counter",
        ]
        lines += [f'edgereg_http_sent_bytes_total{{route="{r}"}} {n}' for r, n in sent]
        lines += [
            "# HELP edgereg_http_request_duration_seconds Time from the request line to "
            "the last byte of the answer, by route.",
            "# TYPE edgereg_http_request_duration_seconds histogram",
        ]
        for route, counts, total_seconds, total in latency:
            cumulative = 0
            for bound, count in zip(LATENCY_BUCKETS, counts, strict=False):
                cumulative += count
                lines.append(
                    f'edgereg_http_request_duration_seconds_bucket{{route="{route}",'
                    f'le="{bound:g}"}} {cumulative}'
                )
            lines.append(
                f'edgereg_http_request_duration_seconds_bucket{{route="{route}",le="+Inf"}} {total}'
            )
            lines.append(
                f'edgereg_http_request_duration_seconds_sum{{route="{route}"}} {total_seconds!r}'
            )
            lines.append(f'edgereg_http_request_duration_seconds_count{{route="{route}"}} {total}')
        lines += [
            "# HELP edgereg_http_requests_in_flight Requests being answered right now.",
            "# TYPE edgereg_http_requests_in_flight gauge",
            f"edgereg_http_requests_in_flight {in_flight}",
            "# HELP edgereg_reports_refused_total Device reports refused before the store, by "
            "reason (docs/operations/report-threats.md).",
            "# TYPE edgereg_reports_refused_total counter",
        ]
        lines += [f'edgereg_reports_refused_total{{reason="{r}"}} {n}' for r, n in refused]
        return "\n".join(lines) + "\n"
