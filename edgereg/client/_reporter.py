"""Device reports: how each installed release runs here, sent where the manifest says.

One :class:`~edgereg.protocol.reports.Report` per installed candidate or
stable model, sent after the install and again when it is confirmed or
reverted, carrying the inference latency the app measured
(:meth:`Reporter.record_inference`). It is POSTed as canonical JSON to the
manifest's ``report_url``: a path relative to the registry root, or an
absolute http(s) URL (a separate collector for a static or CDN registry).

Nothing personal and no device id: the ``token`` is random per install of
a unit version (a bundle's members share it), kept in ``reports.json`` in
the cache directory so later reports of the same install replace earlier
ones at the receiver. Reporting never blocks or fails an update: sends run
on a background thread with a bounded timeout, a failure is logged and
retried once, later, then dropped.
``Reporter(..., enabled=False)`` sends nothing and stores nothing.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import random
import re
import secrets
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from edgereg import __version__
from edgereg.client._cache import CacheError, read_state_file, write_state_file
from edgereg.protocol.fields import MAX_MEMORY_MB, Backend
from edgereg.protocol.reports import LatencySummary, Report
from edgereg.protocol.wire import to_bytes

__all__ = [
    "DeviceFacts",
    "InstallFacts",
    "Reporter",
    "latency_summary",
    "resolve_report_url",
]

_log = logging.getLogger(__name__)

_FILE = "reports.json"
_SAMPLES_KEPT = 2048
"""Latency samples kept per model between reports (a uniform sample of all calls)."""
_TOKENS_KEPT = 8
"""Tokens kept per unit: enough to report a revert to an earlier version with its own."""
SHORT_TEXT = re.compile(r"^[A-Za-z0-9._ -]{1,32}$")
USER_AGENT = f"edgereg/{__version__}"


@dataclass(frozen=True)
class DeviceFacts:
    """Coarse facts about the device that every report carries; none identifies it.

    Attributes:
        os: ``android`` or ``ios``.
        os_version: Such as ``14`` or ``17.4``.
        device_class: The app's own coarse bucket, such as ``ram4-8c``.
        mnn_runtime: The MNN runtime version the app embeds.
        cpu_class: The coarse CPU class (``armv9``, ``armv8.2``, ``armv8``,
            ``x86_64``, ``other``; docs/protocol.md §11), never the features.
    """

    os: Literal["android", "ios"] | None = None
    os_version: str | None = None
    device_class: str | None = None
    mnn_runtime: str | None = None
    cpu_class: str | None = None

    def __post_init__(self) -> None:
        for name in ("os_version", "device_class"):
            value = getattr(self, name)
            if value is not None and not SHORT_TEXT.fullmatch(value):
                raise ValueError(
                    f"{name} {value!r}: 1 to 32 letters, digits, '.', '_', '-' or spaces"
                )


@dataclass(frozen=True)
class InstallFacts:
    """What the client knows of one installed model (a bundle member, or the unit itself).

    Attributes:
        unit: The model or bundle the manifest was for.
        model: The model.
        version: The model's version.
        unit_version: The unit's version (a bundle's; else ``version``).
        variant: The variant installed.
        tier: The device's tier.
        arm: ``candidate`` or ``stable``.
        sequence: The manifest's sequence.
        probe: The self-test: ``passed``, ``failed`` (rejected) or ``none``.
        backend: The backend chosen (None when rejected).
        backends_skipped: Backends whose outputs missed the probe.
        load_ms: Load time on the chosen backend.
        load_failed: The model did not load on any backend.
    """

    unit: str
    model: str
    version: str
    unit_version: str
    variant: str
    tier: str
    arm: Literal["candidate", "stable"]
    sequence: int
    probe: Literal["passed", "failed", "none"] = "none"
    backend: Backend | None = None
    backends_skipped: Sequence[Backend] = ()
    load_ms: float | None = None
    load_failed: bool = False


def resolve_report_url(base_url: str, report_url: str) -> str | None:
    """Where to POST: ``report_url`` as given when absolute, else against the registry root.

    Returns None when the result is not http(s) (a ``file://`` registry with
    a relative ``report_url`` has nowhere to send to).
    """
    base = base_url if base_url.endswith("/") else base_url + "/"
    url = urllib.parse.urljoin(base, report_url)
    return url if urllib.parse.urlsplit(url).scheme in ("http", "https") else None


def latency_summary(samples: Sequence[float]) -> LatencySummary | None:
    """p50, p90, p99 (nearest rank) of latency samples in milliseconds; None without any."""
    if not samples:
        return None
    ordered = sorted(samples)

    def rank(p: float) -> float:
        index = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[index], 3)

    return LatencySummary(count=len(ordered), p50_ms=rank(50), p90_ms=rank(90), p99_ms=rank(99))


@dataclass
class _Latency:
    samples: list[float] = field(default_factory=list)
    seen: int = 0


class Reporter:
    """Builds and sends a unit's reports; never raises for the network or the receiver.

    Args:
        base_url: The registry root (relative report URLs resolve against it).
        cache_dir: The client's cache directory (``reports.json`` goes there).
        device: Coarse device facts every report carries.
        enabled: False to send nothing and store nothing (the app's opt-out).
        timeout: Seconds to connect and for each read of one POST.
        background: Send on a background thread (an app never waits); False
            sends in the calling thread (a CLI that exits right after).
    """

    def __init__(
        self,
        base_url: str,
        cache_dir: Path | str,
        *,
        device: DeviceFacts | None = None,
        enabled: bool = True,
        timeout: float = 5.0,
        background: bool = True,
    ) -> None:
        if not 0 < timeout <= 60:
            raise ValueError(f"timeout must be 0 to 60 seconds, got {timeout!r}")
        self.base_url = base_url
        self.path = Path(cache_dir) / _FILE
        self.device = device or DeviceFacts()
        self.enabled = enabled
        self.timeout = timeout
        self.background = background
        self._latency: dict[str, _Latency] = {}
        # The first call recorded per model since its install (or since this process
        # started): the install's first_inference_ms, until a report carries it.
        self._first: dict[str, float] = {}
        self._first_seen: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._random = random.Random()

    # -- what the app and the client call ---------------------------------------------

    def record_inference(self, model: str, ms: float) -> None:
        """Add one real inference's latency (the app measures it); sent with the next report."""
        if not self.enabled or not (0 <= ms <= 3_600_000):
            return
        with self._lock:
            if model not in self._first_seen:
                self._first_seen.add(model)
                self._first[model] = round(float(ms), 3)
            latency = self._latency.setdefault(model, _Latency())
            latency.seen += 1
            if len(latency.samples) < _SAMPLES_KEPT:
                latency.samples.append(float(ms))
            else:
                # Reservoir sampling: every call so far equally likely to be kept.
                slot = self._random.randrange(latency.seen)
                if slot < _SAMPLES_KEPT:
                    latency.samples[slot] = float(ms)

    def installed(self, facts: InstallFacts, report_url: str | None) -> Report | None:
        """Report an install (or a rejection: ``probe="failed"``). Returns what was sent.

        A new version gets a new token; the same version keeps its own.
        ``report_url`` is the manifest's (None: the registry asks for no reports).
        """
        if not self.enabled or report_url is None:
            return None
        url = resolve_report_url(self.base_url, report_url)
        if url is None:
            _log.info("reports: %s is not an http(s) URL; not reporting", report_url)
            return None
        with self._lock:
            state = self._read()
            # One token per install of a unit version: a bundle's members share it
            # (the receiver keeps the latest report per token and model).
            tokens: dict[str, str] = state["tokens"].setdefault(facts.unit, {})
            if facts.probe != "failed":
                # A new install: its first inference is the next one recorded.
                self._first_seen.discard(facts.model)
                self._first.pop(facts.model, None)
            token = tokens.get(facts.unit_version) or secrets.token_hex(16)
            tokens.pop(facts.unit_version, None)
            tokens[facts.unit_version] = token
            for old in list(tokens)[:-_TOKENS_KEPT]:
                del tokens[old]
            report = self._build(facts, token)
            if report is None:
                return None
            # A rejected release is never installed: the report that a later
            # confirm, revert or summary re-sends stays the installed one's.
            if facts.probe != "failed":
                state["models"][_key(facts.unit, facts.model)] = {
                    "url": url,
                    "report": report.model_dump(mode="json"),
                }
            self._write(state)
        self._send(url, report)
        return report

    def confirmed(self, unit: str, model: str) -> Report | None:
        """Report again: the app confirmed the model (its first real inference succeeded)."""
        return self._again(unit, model, {"confirmed": True})

    def reverted(self, unit: str, model: str) -> Report | None:
        """Report again: the model was reverted (a crash loop)."""
        return self._again(unit, model, {"reverted": True})

    def unconfirmed(self, unit: str, model: str, starts: int) -> Report | None:
        """Report again: the app started with the model installed and not yet confirmed.

        Sent at each start that raises the count, so a crash loop is visible
        before the revert (docs/protocol.md §11).
        """
        return self._again(unit, model, {"unconfirmed_starts": max(0, min(starts, 1000))})

    def memory(
        self, unit: str, model: str, peak_mb: float | None, steady_mb: float | None
    ) -> Report | None:
        """Report again with the memory the app measured for the model (MiB; None: unknown).

        A figure outside 0 to 1048576 MiB is dropped (logged), never sent.
        """
        changes: dict[str, Any] = {}
        for key, value in (("memory_peak_mb", peak_mb), ("memory_steady_mb", steady_mb)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                _log.warning("reports: %s %r is not a number; not sent", key, value)
            elif not 0 <= value <= MAX_MEMORY_MB:
                _log.warning(
                    "reports: %s %r is outside 0 to %d MiB; not sent", key, value, MAX_MEMORY_MB
                )
            else:
                changes[key] = round(float(value), 3)
        if not changes:
            return None
        return self._again(unit, model, changes)

    def summary(self, unit: str, model: str) -> Report | None:
        """Report again with the latency recorded since the last report (for a periodic send)."""
        return self._again(unit, model, {})

    def retry_pending(self) -> None:
        """Send once more the reports whose first send failed; then forget them either way."""
        if not self.enabled:
            return
        with self._lock:
            state = self._read()
            pending = state["pending"]
            if not pending:
                return
            state["pending"] = []
            self._write(state)
        for item in pending:
            try:
                url, body = str(item["url"]), to_bytes(Report.model_validate(item["body"]))
            except (ValidationError, TypeError, KeyError) as exc:
                _log.warning("reports: a kept report is unreadable (%s); dropped", exc)
                continue
            self._dispatch(url, body, retry=False)

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` seconds for background sends to finish."""
        worker = self._worker
        if worker is None:
            return
        self._queue.put(("", b"", False))
        worker.join(timeout)
        self._worker = None

    # -- steps ---------------------------------------------------------------------------

    def _again(self, unit: str, model: str, changes: dict[str, Any]) -> Report | None:
        if not self.enabled:
            return None
        with self._lock:
            state = self._read()
            stored = state["models"].get(_key(unit, model))
            if stored is None:
                return None
            try:
                base = Report.model_validate(stored["report"])
            except (ValidationError, TypeError) as exc:
                _log.warning("reports: stored report of %s unreadable (%s); not sent", model, exc)
                return None
            # Latency is what was measured since the last report, so never carried over.
            update = {**changes, "inference": self._take_latency(model)}
            if base.first_inference_ms is None and model in self._first:
                update["first_inference_ms"] = self._first.pop(model)
            report = _versioned(base.model_copy(update=update))
            stored["report"] = report.model_dump(mode="json")
            self._write(state)
            url = str(stored["url"])
        self._send(url, report)
        return report

    def _build(self, facts: InstallFacts, token: str) -> Report | None:
        device = self.device
        try:
            return Report.versioned(
                token=token,
                unit=facts.unit,
                model=facts.model,
                version=facts.version,
                unit_version=facts.unit_version,
                variant=facts.variant,
                tier=facts.tier,
                arm=facts.arm,
                sequence=facts.sequence,
                probe=facts.probe,
                backend=facts.backend,
                backends_skipped=list(facts.backends_skipped),
                load_ms=None if facts.load_ms is None else round(facts.load_ms, 3),
                load_failed=facts.load_failed,
                inference=self._take_latency(facts.model),
                mnn_runtime=device.mnn_runtime,
                os=device.os,
                os_version=device.os_version,
                device_class=device.device_class,
                cpu_class=device.cpu_class,
            )
        except ValidationError as exc:
            _log.warning("reports: cannot build the report of %s: %s", facts.model, exc)
            return None

    def _take_latency(self, model: str) -> LatencySummary | None:
        latency = self._latency.pop(model, None)
        return None if latency is None else latency_summary(latency.samples)

    def _send(self, url: str, report: Report) -> None:
        self._dispatch(url, to_bytes(report), retry=True)

    def _dispatch(self, url: str, body: bytes, *, retry: bool) -> None:
        if not self.background:
            self._post(url, body, retry=retry)
            return
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._drain, name="edgereg-reports", daemon=True)
            self._worker.start()
        self._queue.put((url, body, retry))

    def _drain(self) -> None:
        while True:
            url, body, retry = self._queue.get()
            if not url:
                return
            self._post(url, body, retry=retry)

    def _post(self, url: str, body: bytes, *, retry: bool) -> None:
        """POST one report; on a failure worth retrying, keep it for one later try."""
        try:
            status = _http_post(url, body, self.timeout)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            _log.warning("reports: POST %s failed: %s", url, exc)
            status = None
        if status is not None and 200 <= status < 300:
            return
        if status is not None and status not in (408, 429) and status < 500:
            # The receiver refused this report; the same bytes would be refused again.
            _log.warning("reports: %s answered HTTP %d; report dropped", url, status)
            return
        if status is not None:
            _log.warning("reports: %s answered HTTP %d", url, status)
        if retry:
            self._keep_pending(url, body)
        else:
            _log.warning("reports: the retry to %s failed too; report dropped", url)

    def _keep_pending(self, url: str, body: bytes) -> None:
        document = json.loads(body)
        with self._lock:
            state = self._read()
            # The latest report of a token and model is the one that counts: keep only it.
            same = (document["token"], document["model"])
            pending = [
                p
                for p in state["pending"]
                if (p["body"].get("token"), p["body"].get("model")) != same
            ]
            pending.append({"url": url, "body": document})
            state["pending"] = pending[-16:]
            self._write(state)

    # -- file -----------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"models": {}, "tokens": {}, "pending": []}
        try:
            data = read_state_file(self.path, "reports")
        except CacheError as exc:
            _log.warning("reports: %s unreadable (%s): starting afresh", self.path, exc)
            return empty
        if data is None:
            return empty
        if not all(isinstance(data.get(key), type(value)) for key, value in empty.items()):
            _log.warning("reports: %s is not a reports file: starting afresh", self.path)
            return empty
        return data

    def _write(self, state: dict[str, Any]) -> None:
        try:
            write_state_file(self.path, state)
        except CacheError as exc:
            # Reports are best effort: a full disk must not fail the update.
            _log.warning("reports: cannot write %s: %s", self.path, exc)


def _versioned(report: Report) -> Report:
    """``report`` saying the schema version its keys need (2 once any key of 2 is set)."""
    return Report.versioned(**{k: getattr(report, k) for k in Report.model_fields})


def _key(unit: str, model: str) -> str:
    """Where a unit's model's latest report is kept (a model may be in a bundle and alone)."""
    return f"{unit}/{model}"


def _http_post(url: str, body: bytes, timeout: float) -> int:
    """POST ``body`` as JSON; returns the status. No proxies, no redirects followed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url} is not an http(s) URL")
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(
            "POST",
            target,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
        )
        response = connection.getresponse()
        response.read(4096)
        return response.status
    finally:
        connection.close()
