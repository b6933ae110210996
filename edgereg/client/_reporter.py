"""Device reports: how each installed release runs here, sent where the manifest says.

One :class:`~edgereg.protocol.reports.Report` per installed candidate or
stable model, sent after the install (or the self-test's rejection), again
when it is confirmed or reverted, and again in every later rollout period
for the release the manifest gives the device (:meth:`Reporter.period`:
refused releases too, so a device counts in its arm whether the release
works on it or not), carrying the inference latency the app measured
(:meth:`Reporter.record_inference`) with the release that ran the calls.
It is POSTed as canonical JSON to the manifest's ``report_url``: a path
relative to the registry root, or an absolute http(s) URL (a separate
collector for a static or CDN registry). docs/protocol.md §11 has the rules.

Nothing personal and no device id: the ``token`` is random per install of
a unit version (a bundle's members share it), kept in ``reports.json`` in
the cache directory with the latest report of each version, so later
reports of the same install merge into one row at the receiver. Reporting
never blocks or fails an update: sends run on a background thread with a
bounded timeout; a report not delivered is kept and sent again at later
update checks (five answered tries; a try the network never answered does
not count), then dropped. ``Reporter(..., enabled=False)`` sends nothing and
stores nothing.
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import queue
import random
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import TypeAdapter, ValidationError

from edgereg import __version__
from edgereg.client._cache import CacheError, read_state_file, write_state_file
from edgereg.client._metrics import count_event, count_value
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
"""Tokens (and reports) kept per unit: enough to report a revert to an earlier version
with its own, and a refused version in the periods after."""
_PENDING_KEPT = 16
"""Undelivered reports kept for the next update checks (the oldest go first)."""
_ANSWERED_TRIES = 5
"""Tries answered with 408, 429 or 5xx after which an undelivered report is dropped."""
METRICS_EVERY = timedelta(hours=12)
"""App metrics counted since an install's last report go with a report this long after it."""
SHORT_TEXT = re.compile(r"^[A-Za-z0-9._ -]{1,32}$")
USER_AGENT = f"edgereg/{__version__}"


@dataclass(frozen=True)
class DeviceFacts:
    """Coarse facts about the device that every report carries; none identifies it.

    Attributes:
        os: ``android`` or ``ios``.
        os_version: Such as ``14`` or ``17.4 (21E219)``: any version of §7's grammar
            (a report sends one longer than 64 characters as null).
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
        # The app's own bucket is a programming error; the OS's version is what it is.
        if self.device_class is not None and not SHORT_TEXT.fullmatch(self.device_class):
            raise ValueError(
                f"device_class {self.device_class!r}: 1 to 32 letters, digits, '.', '_', '-' "
                "or spaces"
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
        clock: The current time (when app metrics are due; the client's clock).
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
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if not 0 < timeout <= 60:
            raise ValueError(f"timeout must be 0 to 60 seconds, got {timeout!r}")
        self.base_url = base_url
        self.path = Path(cache_dir) / _FILE
        self.device = device or DeviceFacts()
        self.enabled = enabled
        self.timeout = timeout
        self.background = background
        self.now = clock or (lambda: datetime.now(timezone.utc))
        self._latency: dict[str, _Latency] = {}
        # The first call recorded per model since its install (or since this process
        # started): the install's first_inference_ms, until a report carries it.
        self._first: dict[str, float] = {}
        self._first_seen: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, bytes, int]] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._random = random.Random()

    # -- what the app and the client call ---------------------------------------------

    def record_inference(self, model: str, ms: float) -> None:
        """Add one real inference's latency (the app measures it); sent with the next report.

        The calls belong to the release installed now: they go with its next
        report, never with a refused release's.
        """
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
        A rejection is kept too: :meth:`period` sends it again while the
        manifest still gives the device that release.
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
            # (the receiver keeps one row per token and model).
            tokens: dict[str, str] = state["tokens"].setdefault(facts.unit, {})
            rejected = facts.probe == "failed"
            if not rejected:
                # A new install: its first inference is the next one recorded.
                self._first_seen.discard(facts.model)
                self._first.pop(facts.model, None)
            token = tokens.get(facts.unit_version) or secrets.token_hex(16)
            tokens.pop(facts.unit_version, None)
            tokens[facts.unit_version] = token
            for old in list(tokens)[:-_TOKENS_KEPT]:
                del tokens[old]
            # A rejected release never ran: the calls recorded so far are the
            # installed release's, and stay for its next report.
            report = self._build(
                facts,
                token,
                with_latency=not rejected,
                metrics=None
                if rejected
                else self._metrics_of(state, facts.unit, facts.unit_version),
            )
            if report is None:
                return None
            key = _key(facts.unit, facts.model)
            _store(state, key, facts.unit_version, url, report)
            if not rejected:
                state["installed"][key] = facts.unit_version
            self._write(state)
        self._send(url, report)
        return report

    def confirmed(self, unit: str, model: str) -> Report | None:
        """Report again: the app confirmed the model (its first real inference succeeded)."""
        return self._again(unit, model, {"confirmed": True})

    def reverted(self, unit: str, model: str, to_unit_version: str | None = None) -> Report | None:
        """Report again: the installed model was reverted (a crash loop, or the app's call).

        The reverted release's report is kept for :meth:`period` (its arm still
        counts the device, as a revert); ``to_unit_version`` is the release the
        client went back to, whose report (when one is kept) gets the calls
        recorded from now on.
        """
        sent = self._again(unit, model, {"reverted": True})
        if not self.enabled:
            return sent
        with self._lock:
            state = self._read()
            key = _key(unit, model)
            kept = state["reports"].get(key, {})
            if to_unit_version is not None and to_unit_version in kept:
                state["installed"][key] = to_unit_version
            else:
                state["installed"].pop(key, None)
            self._write(state)
            # Calls made before the switch ran the reverted release; they went with its report.
            self._latency.pop(model, None)
        return sent

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

    def period(
        self,
        unit: str,
        model: str,
        unit_version: str,
        *,
        arm: Literal["candidate", "stable"],
        sequence: int,
        report_url: str | None,
    ) -> Report | None:
        """A manifest with a new ``sequence`` gives the device ``unit_version``: report it again.

        Every rollout period hears from every device in its arm
        (docs/protocol.md §11): the installed release's report with the calls
        recorded since the last one, or a refused release's report (rejected
        by its self-test, or reverted) as it was, ``inference`` null. Nothing
        when the device holds no report of that release, or its report
        already carries this sequence (or a later one).

        Returns:
            The report sent, or None.
        """
        if not self.enabled or report_url is None:
            return None
        url = resolve_report_url(self.base_url, report_url)
        if url is None:
            return None
        with self._lock:
            state = self._read()
            key = _key(unit, model)
            stored = state["reports"].get(key, {}).get(unit_version)
            if stored is None:
                return None
            base = _stored_report(stored, model)
            if base is None or base.sequence >= sequence:
                return None
            running = (
                state["installed"].get(key) == unit_version
                and base.probe != "failed"
                and not base.reverted
            )
            update: dict[str, Any] = {"sequence": sequence, "arm": arm, "inference": None}
            if running:
                update.update(self._latency_update(model, base))
                counted = self._metrics_of(state, unit, unit_version)
                if counted is not None:
                    update["metrics"] = counted
            report = _versioned(base.model_copy(update=update))
            _store(state, key, unit_version, url, report)
            self._write(state)
        self._send(url, report)
        return report

    def record(self, unit: str, unit_version: str, name: str, *, success: bool) -> None:
        """Count one event of a rate metric of the install of ``unit_version``."""
        self._count(unit, unit_version, name, lambda m: count_event(m, success))

    def observe(
        self, unit: str, unit_version: str, name: str, *, bucket: int, buckets: int
    ) -> None:
        """Count one value of a distribution metric in ``bucket`` (of ``buckets``)."""
        self._count(unit, unit_version, name, lambda m: count_value(m, bucket, buckets))

    def metrics_due(self, unit: str, unit_version: str, now: datetime) -> bool:
        """Whether the install's metrics changed since its last report, 12 hours or more ago."""
        if not self.enabled:
            return False
        with self._lock:
            kept = self._read()["metrics"].get(unit, {}).get(unit_version)
        if not kept or not kept.get("changed"):
            return False
        sent = kept.get("sent_at")
        return sent is None or now - datetime.fromisoformat(str(sent)) >= METRICS_EVERY

    def _count(
        self,
        unit: str,
        unit_version: str,
        name: str,
        step: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        if not self.enabled:
            return
        with self._lock:
            state = self._read()
            kept = state["metrics"].setdefault(unit, {}).setdefault(unit_version, {})
            counts = kept.setdefault("counts", {})
            counts[name] = step(dict(counts.get(name, {})))
            kept["changed"] = True
            for old in list(state["metrics"][unit])[:-_TOKENS_KEPT]:
                del state["metrics"][unit][old]
            self._write(state)

    def _metrics_of(
        self, state: dict[str, Any], unit: str, unit_version: str
    ) -> dict[str, Any] | None:
        """The install's metric totals for its next report (None: none counted).

        Notes the report's time, counts or not: the 12 hours before counts are sent
        again run from the install's last report (docs/protocol.md §11).
        """
        installs = state["metrics"].setdefault(unit, {})
        kept = installs.setdefault(unit_version, {})
        kept["sent_at"] = self.now().isoformat()
        for old in list(installs)[:-_TOKENS_KEPT]:
            del installs[old]
        if not kept.get("counts"):
            return None
        kept["changed"] = False
        return dict(kept["counts"])

    def retry_pending(self) -> None:
        """Send again the reports not delivered yet (each update check calls this)."""
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
                tries = int(item.get("tries", 0))
            except (ValidationError, TypeError, KeyError, ValueError) as exc:
                _log.warning("reports: a kept report is unreadable (%s); dropped", exc)
                continue
            self._dispatch(url, body, tries=tries)

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` seconds for background sends to finish."""
        worker = self._worker
        if worker is None:
            return
        self._queue.put(("", b"", 0))
        worker.join(timeout)
        self._worker = None

    # -- steps ---------------------------------------------------------------------------

    def _again(self, unit: str, model: str, changes: dict[str, Any]) -> Report | None:
        """Send the installed release's report again, with ``changes`` and the latest calls."""
        if not self.enabled:
            return None
        with self._lock:
            state = self._read()
            key = _key(unit, model)
            version = state["installed"].get(key)
            stored = None if version is None else state["reports"].get(key, {}).get(version)
            if stored is None:
                return None
            base = _stored_report(stored, model)
            if base is None:
                return None
            # Latency is what was measured since the last report, so never carried over.
            update = {**changes, "inference": None, **self._latency_update(model, base)}
            counted = self._metrics_of(state, unit, version)
            if counted is not None:
                update["metrics"] = counted
            report = _versioned(base.model_copy(update=update))
            _store(state, key, version, str(stored["url"]), report)
            self._write(state)
            url = str(stored["url"])
        self._send(url, report)
        return report

    def _latency_update(self, model: str, base: Report) -> dict[str, Any]:
        """The calls recorded since the last report, and the install's first one if unsent."""
        update: dict[str, Any] = {"inference": self._take_latency(model)}
        if base.first_inference_ms is None and model in self._first:
            update["first_inference_ms"] = self._first.pop(model)
        return update

    def _build(
        self,
        facts: InstallFacts,
        token: str,
        *,
        with_latency: bool,
        metrics: dict[str, Any] | None = None,
    ) -> Report | None:
        device = self.device
        fields: dict[str, Any] = {
            "token": token,
            "unit": facts.unit,
            "model": facts.model,
            "version": facts.version,
            "unit_version": facts.unit_version,
            "variant": facts.variant,
            "tier": facts.tier,
            "arm": facts.arm,
            "sequence": facts.sequence,
            "probe": facts.probe,
            "backend": facts.backend,
            "backends_skipped": list(facts.backends_skipped),
            "load_ms": None if facts.load_ms is None else round(facts.load_ms, 3),
            "load_failed": facts.load_failed,
            "inference": self._take_latency(facts.model) if with_latency else None,
            "metrics": metrics,
        }
        # A device fact the report cannot carry is sent as null: the report always goes.
        for name, value in (
            ("mnn_runtime", device.mnn_runtime),
            ("os", device.os),
            ("os_version", device.os_version),
            ("device_class", device.device_class),
            ("cpu_class", device.cpu_class),
        ):
            fields[name] = value if value is None or _fits(name, value) else None
        try:
            return Report.versioned(**fields)
        except ValidationError as exc:
            _log.warning("reports: cannot build the report of %s: %s", facts.model, exc)
            return None

    def _take_latency(self, model: str) -> LatencySummary | None:
        latency = self._latency.pop(model, None)
        return None if latency is None else latency_summary(latency.samples)

    def _send(self, url: str, report: Report) -> None:
        self._dispatch(url, to_bytes(report), tries=0)

    def _dispatch(self, url: str, body: bytes, *, tries: int) -> None:
        if not self.background:
            self._post(url, body, tries=tries)
            return
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._drain, name="edgereg-reports", daemon=True)
            self._worker.start()
        self._queue.put((url, body, tries))

    def _drain(self) -> None:
        while True:
            url, body, tries = self._queue.get()
            if not url:
                return
            self._post(url, body, tries=tries)

    def _post(self, url: str, body: bytes, *, tries: int) -> None:
        """POST one report; keep it for the next update check when it was not delivered."""
        try:
            status: int | None = _http_post(url, body, self.timeout)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            _log.warning("reports: POST %s failed: %s", url, exc)
            status = None
        if status is not None and 200 <= status < 300:
            return
        if status is not None and status not in (408, 429) and status < 500:
            # The receiver refused this report; the same bytes would be refused again.
            _log.warning("reports: %s answered HTTP %d; report dropped", url, status)
            return
        # No answer (offline) costs no try: a report made offline waits for the network.
        answered = tries + (1 if status is not None else 0)
        if answered >= _ANSWERED_TRIES:
            _log.warning(
                "reports: %s answered HTTP %s %d times; report dropped", url, status, answered
            )
            return
        if status is not None:
            _log.warning("reports: %s answered HTTP %d; kept for the next check", url, status)
        self._keep_pending(url, body, answered)

    def _keep_pending(self, url: str, body: bytes, tries: int) -> None:
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
            pending.append({"url": url, "body": document, "tries": tries})
            state["pending"] = pending[-_PENDING_KEPT:]
            self._write(state)

    # -- file -----------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        empty: dict[str, Any] = {
            "reports": {},
            "installed": {},
            "tokens": {},
            "pending": [],
            "metrics": {},
        }
        try:
            data = read_state_file(self.path, "reports")
        except CacheError as exc:
            _log.warning("reports: %s unreadable (%s): starting afresh", self.path, exc)
            return empty
        if data is None:
            return empty
        if isinstance(data.get("models"), dict) and "reports" not in data:
            data = _from_one_per_model(data)
        data.setdefault("metrics", {})
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


def _store(state: dict[str, Any], key: str, unit_version: str, url: str, report: Report) -> None:
    """Keep ``report`` as the latest of ``unit_version`` (the newest versions kept per model)."""
    kept: dict[str, Any] = state["reports"].setdefault(key, {})
    kept.pop(unit_version, None)
    kept[unit_version] = {"url": url, "report": report.model_dump(mode="json")}
    for old in list(kept)[:-_TOKENS_KEPT]:
        del kept[old]


def _stored_report(stored: dict[str, Any], model: str) -> Report | None:
    try:
        return Report.model_validate(stored["report"])
    except (ValidationError, TypeError, KeyError) as exc:
        _log.warning("reports: stored report of %s unreadable (%s); not sent", model, exc)
        return None


def _from_one_per_model(data: dict[str, Any]) -> dict[str, Any]:
    """A reports.json of the earlier layout (one report per model) in this one."""
    reports: dict[str, Any] = {}
    installed: dict[str, str] = {}
    for key, stored in data["models"].items():
        try:
            version = str(stored["report"]["unit_version"])
        except (TypeError, KeyError):
            continue
        reports[key] = {version: stored}
        if not stored["report"].get("reverted"):
            installed[key] = version
    pending = [
        {**p, "tries": 0} for p in data.get("pending", []) if isinstance(p, dict) and "body" in p
    ]
    return {
        "reports": reports,
        "installed": installed,
        "tokens": data.get("tokens", {}),
        "pending": pending,
    }


def _fits(name: str, value: str) -> bool:
    """Whether a device fact passes the report's own rule for its key."""
    try:
        _field_adapter(name).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


@functools.cache
def _field_adapter(name: str) -> TypeAdapter[Any]:
    info = Report.model_fields[name]
    assert info.annotation is not None
    if not info.metadata:
        return TypeAdapter(info.annotation)
    return TypeAdapter(Annotated.__class_getitem__((info.annotation, *info.metadata)))  # type: ignore[attr-defined]


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
