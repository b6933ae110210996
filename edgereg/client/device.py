"""The Python reference's device program: one device, driven by JSON lines on stdin/stdout.

``python -m edgereg.client.device`` reads one JSON request per line and
answers each with one JSON line (docs/reference/device-program.md). The same
tests and the fleet simulator drive the JVM and Swift clients through their
own device programs, so every op here goes through the public
:mod:`edgereg.client` facade only, as an app would.

Stdout carries the answers and nothing else: file descriptor 1 is pointed at
stderr at start (MNN and any stray print write there), and the answers go to
a private copy of the original stdout.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import TypeAdapter

from edgereg import __version__
from edgereg.client import (
    BackendUnavailableError,
    BlobCheck,
    BundledRelease,
    CancelToken,
    Client,
    Conditions,
    DownloadPolicy,
    FetchResult,
    ModelChange,
    Rejected,
    Reporter,
    SelfTest,
    Status,
    TrustedKeys,
    UpdateCheck,
    decide,
    installed_units,
)
from edgereg.client._health import Revert, UnitHealth, on_confirm, on_install, on_reverted, on_start
from edgereg.client._metrics import bucket_of, count_event, count_value, refusal
from edgereg.client._selftest import TrialKind, judge_trials
from edgereg.protocol import strict_json_loads
from edgereg.protocol.contract import MAX_LABELS_BYTES, BlobRef, parse_labels
from edgereg.protocol.decision import AppFacts, Decision
from edgereg.protocol.errors import EdgeregError
from edgereg.protocol.fields import (
    RuntimeHints,
    TierRules,
    is_version,
    parse_range,
    satisfies,
)
from edgereg.protocol.hints import HintFacts
from edgereg.protocol.probe import MAX_PROBE_DATA_BYTES, GoldenProbe, ProbeTensor, check_probe
from edgereg.protocol.reasons import Malformed
from edgereg.protocol.reports import ReportError, parse_report
from edgereg.protocol.rules import (
    DeviceProfile,
    NoTierError,
    choose_runtime,
    cohort_bucket,
    explain_tier,
    in_cohort,
    parse_tier_file,
    resolve_tier,
)
from edgereg.protocol.wire import (
    BundleEntry,
    DistributionMetric,
    ManifestEntry,
    MetricDeclaration,
    WireError,
    from_bytes,
)

__all__ = ["HostModelRunner", "main"]

_log = logging.getLogger("edgereg.client.device")

_NUMPY_DTYPES: Mapping[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "int8": "i1",
    "uint8": "u1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "?",
}


class UsageError(Exception):
    """The harness misused the program (unknown op, missing argument): ``ok: false``."""


#: What ``observe`` takes for the values JSON cannot carry.
_NOT_FINITE = ("NaN", "Infinity", "-Infinity")


# --- the model runner: a host process that runs real MNN -----------------------------


class _HostSession:
    def __init__(self, runner: HostModelRunner, session: str, shapes: Mapping[str, Any]) -> None:
        self._runner = runner
        self._session = session
        self._shapes = {
            str(name): tuple(int(d) for d in shape)
            for name, shape in shapes.items()
            if isinstance(shape, list)
        }

    def input_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self._shapes

    def run(self, feeds: Mapping[str, Any]) -> Mapping[str, Any]:
        import numpy as np

        inputs = {}
        for name, array in feeds.items():
            value = np.asarray(array)
            dtype = value.dtype.name if value.dtype.name in _NUMPY_DTYPES else "float32"
            data = np.ascontiguousarray(value, dtype=_NUMPY_DTYPES[dtype]).tobytes()
            inputs[name] = {
                "dtype": dtype,
                "shape": list(value.shape),
                "data": base64.b64encode(data).decode("ascii"),
            }
        answer = self._runner.ask({"op": "run", "session": self._session, "inputs": inputs})
        if "error" in answer:
            raise RuntimeError(f"the model runner failed the run: {answer['error']}")
        outputs: dict[str, Any] = {}
        for name, tensor in dict(answer.get("outputs") or {}).items():
            raw = base64.b64decode(tensor["data"])
            layout = np.dtype(_NUMPY_DTYPES[tensor["dtype"]])
            outputs[str(name)] = np.frombuffer(raw, dtype=layout).reshape(tensor["shape"])
        return outputs


class HostModelRunner:
    """A :class:`~edgereg.client.BackendRunner` over a runner process speaking JSON lines.

    The app's model runner, played in tests by ``tests/hostrunner.py`` on this
    machine's real MNN. One process, started at the first load and kept.

    Args:
        command: The runner's command line.
        mnn_apis: The MNN APIs it calls (fit rule (f)): ``tests/hostrunner.py`` calls
            the Module API, or the session API with ``--api session``.
    """

    def __init__(self, command: Sequence[str], mnn_apis: Sequence[str] = ("module",)) -> None:
        self.command = list(command)
        self.mnn_apis = tuple(mnn_apis)
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._open: list[str] = []

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and read its answer; a dead or garbled runner is a RuntimeError."""
        with self._lock:
            process = self._start()
            assert process.stdin is not None
            assert process.stdout is not None
            try:
                process.stdin.write(json.dumps(request).encode() + b"\n")
                process.stdin.flush()
                line = process.stdout.readline()
            except OSError as exc:
                raise RuntimeError(f"the model runner is gone: {exc}") from exc
            if not line:
                raise RuntimeError(f"the model runner exited ({process.poll()})")
            try:
                answer = json.loads(line)
            except ValueError as exc:
                raise RuntimeError(f"the model runner answered {line[:80]!r}") from exc
            if not isinstance(answer, dict):
                raise RuntimeError(f"the model runner answered {line[:80]!r}")
            return answer

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr
            )
        return self._process

    def load(
        self,
        artifact: Path,
        backend: str,
        runtime: RuntimeHints,
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> _HostSession:
        """Load ``artifact`` on ``backend`` in the runner process.

        Raises:
            BackendUnavailableError: the runner says this device has no such backend.
            RuntimeError: the runner could not load it.
        """
        # The self-test tries backends one after another: the previous session is done.
        while self._open:
            self.ask({"op": "close", "session": self._open.pop()})
        answer = self.ask(
            {
                "op": "load",
                "model": str(artifact),
                "backend": backend,
                "threads": runtime.threads,
                "precision": runtime.precision,
            }
        )
        if answer.get("unavailable"):
            raise BackendUnavailableError(str(answer.get("error", f"no {backend} here")))
        if "error" in answer or not isinstance(answer.get("session"), str):
            raise RuntimeError(f"the model runner could not load it: {answer.get('error')}")
        self._open.append(answer["session"])
        return _HostSession(self, answer["session"], dict(answer.get("input_shapes") or {}))

    def close(self) -> None:
        """Stop the runner process."""
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        self._open.clear()


# --- requests -------------------------------------------------------------------------


def _arg(request: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in request:
        raise UsageError(f"missing argument {name!r}")
    value = request[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise UsageError(f"argument {name!r} has the wrong type: {value!r}")
    return value


def _opt(request: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if request.get(name) is None:
        return None
    return _arg(request, name, kind)


def _number(request: Mapping[str, Any], name: str, default: int) -> Any:
    value = _opt(request, name, (int, float))
    return default if value is None else value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"not an RFC 3339 time: {text!r}") from exc
    if when.tzinfo is None:
        raise UsageError(f"an RFC 3339 time needs its offset: {text!r}")
    return when


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UsageError(f"not base64: {exc}") from exc


def _entry_json(entry: ManifestEntry) -> dict[str, Any]:
    found: dict[str, Any] = {
        "version": entry.version,
        "variant": entry.variant,
        "sha256": entry.sha256,
        "size": entry.size,
    }
    if entry.metrics is not None:
        found["metrics"] = _metrics_json(entry.metrics)
    return found


def _metrics_json(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The declared app metrics as the wire says them (docs/protocol.md §3)."""
    return {name: m.model_dump(mode="json", by_alias=True) for name, m in sorted(metrics.items())}


def _decide_vector(vector: Mapping[str, Any]) -> Decision:
    """A decision vector's ``input`` decided (raises :class:`Rejected` as the client would)."""
    device = vector["device"]
    return decide(
        _b64(vector["manifest"]),
        trusted=TrustedKeys.from_pems(vector["trusted_keys"]),
        model=vector["model"],
        tier=vector["tier"],
        device_id=device["device_id"],
        app_mnn_runtime=device.get("mnn_runtime"),
        highest_seen_sequence=vector.get("highest_seen_sequence"),
        now=_time(vector["now"]),
        app=AppFacts(
            app_version=device.get("app_version"),
            os=device.get("os"),
            os_version=device.get("os_version"),
            cpu_features=(
                None if device.get("cpu_features") is None else frozenset(device["cpu_features"])
            ),
            memory_budget_mb=device.get("memory_budget_mb"),
            mnn_apis=(None if device.get("mnn_apis") is None else frozenset(device["mnn_apis"])),
        ),
        bundle=bool(vector.get("bundle", False)),
    )


def decide_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A conformance vector's ``input`` decided, in the shape of its ``expected``."""
    try:
        decision = _decide_vector(vector)
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    entry = decision.entry
    chosen: dict[str, Any] | None
    if entry is None:
        chosen = None
    elif isinstance(entry, BundleEntry):
        members = {name: _entry_json(m) for name, m in sorted(entry.members.items())}
        chosen = {"version": entry.version, "members": members}
        if entry.metrics is not None:
            chosen["metrics"] = _metrics_json(entry.metrics)
    else:
        chosen = _entry_json(entry)
    return {
        "accept": True,
        "entry": chosen,
        "is_candidate": decision.is_candidate,
        "runtime_fallback": decision.runtime_fallback,
        "fallback": decision.fallback,
        "substitute": decision.substitute,
        "sequence": decision.sequence,
    }


def check_hints_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A hints vector's ``input``: the decision, then the runtime the device uses (§11).

    ``device`` also holds the hint facts (``cpu_class``, ``cores``, ``soc``; left
    out: the device does not know it).
    """
    try:
        decision = _decide_vector(vector)
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    entry = decision.entry
    if not isinstance(entry, ManifestEntry):
        # Nothing for this device (hints vectors ask for a model, never a bundle).
        nothing = ("entry", "runtime_trials", "runtime", "rule", "matched")
        return {"accept": True, **dict.fromkeys(nothing)}
    device = vector["device"]
    facts = HintFacts(
        cpu_class=device.get("cpu_class"), cores=device.get("cores"), soc=device.get("soc")
    )
    choice = choose_runtime(entry, facts, device["device_id"])
    trials = entry.runtime_trials
    return {
        "accept": True,
        "entry": _entry_json(entry),
        "runtime_trials": None if trials is None else trials.model_dump(mode="json"),
        "runtime": choice.runtime.model_dump(mode="json"),
        "rule": choice.rule,
        "matched": choice.matched,
    }


def check_blob_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A blob vector's ``input`` (rules 13-14) fed to the client's blob check."""
    ref = BlobRef.of(vector["entry"]["sha256"], vector["entry"]["size"])
    check = BlobCheck(ref)
    length = vector.get("content_length")
    body = _b64(vector["body"])
    try:
        check.expect(length)
        check.update(body)
        if length is not None and len(body) < length:
            # The body ended before the bytes it announced: a cut connection (§8, rule 14).
            return {"accept": False, "reason": "transport"}
        check.finish()
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    return {"accept": True}


def check_probe_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A probe vector's ``input`` (docs/protocol.md §9): parse the probe, check the outputs.

    ``probe_data`` is the entry's data blob (its declared size and its bytes as
    downloaded and verified): the probe's offsets read from it (§11).
    """
    blob = vector.get("probe_data")
    try:
        probe = from_bytes(GoldenProbe, _b64(vector["probe"]))
        if probe.artifact_sha256 != vector["artifact_sha256"]:
            raise ValueError("the probe is another artifact's")
        if blob is not None and blob["size"] > MAX_PROBE_DATA_BYTES:
            raise ValueError(f"a probe data blob of {blob['size']} bytes is declared")
        probe = probe.resolved(_b64(blob["data"]) if blob is not None else None)
    except (WireError, ValueError):
        return {"pass": False, "reason": "malformed"}
    computed = [
        [{t["name"]: ProbeTensor.model_validate(t, strict=True) for t in step} for step in case]
        for case in vector["computed"]
    ]
    result = check_probe(probe, computed)
    return {"pass": result.passed, "reason": result.code}


def check_version_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A version vector's ``input``: a bad range is reported before a bad version (§7)."""
    try:
        parse_range(vector["range"])
    except ValueError:
        return {"result": "invalid-range"}
    if not is_version(vector["version"]):
        return {"result": "invalid-version"}
    return {"result": "match" if satisfies(vector["version"], vector["range"]) else "no-match"}


def check_report_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A report vector's ``input``: the receiver's verdict on the body (§12)."""
    try:
        parse_report(_b64(vector["body"]))
    except ReportError as exc:
        return {"accept": False, "reason": exc.code, "field": exc.field}
    return {"accept": True}


def check_labels_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A labels vector's ``input``: the declared size, rules 13-14, then the labels (§8)."""
    ref = vector["entry"]
    body = _b64(vector["body"])
    try:
        if ref["size"] > MAX_LABELS_BYTES:
            raise Malformed(f"labels blob of {ref['size']} bytes, more than {MAX_LABELS_BYTES}")
        check = BlobCheck(BlobRef.of(ref["sha256"], ref["size"]))
        check.update(body)
        check.finish()
        labels = parse_labels(body)
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    return {"accept": True, "labels": labels}


def check_conditions_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A conditions vector's ``input``: why the policy defers a download, if it does (§8).

    A condition left out of ``conditions`` (or null) is one the app did not say.
    """
    said = vector["conditions"]
    conditions = Conditions(
        metered=said.get("metered"),
        charging=said.get("charging"),
        idle=said.get("idle"),
        storage_low=said.get("storage_low"),
    )
    policy = DownloadPolicy(**vector["policy"])
    return {"deferred": policy.unmet(conditions)}


_TRIAL_KINDS = ("passed", "failed", "load-failed", "unavailable")


def check_selftest_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A self-test vector's ``input``: each backend's outcome if tried, and the verdict (§11).

    Backends are tried in ``backends`` order up to the first that passes;
    one in ``remembered`` is skipped untried.
    """
    remembered = vector["remembered"]
    outcomes = vector["trials"]
    has_probe = vector["probe"]
    trials: list[tuple[str, TrialKind]] = []
    for backend in vector["backends"]:
        if backend in remembered:
            trials.append((backend, "remembered"))
            continue
        kind = outcomes[backend]
        if kind not in _TRIAL_KINDS:
            raise ValueError(f"not a trial outcome: {kind!r}")
        if kind == "passed" and not has_probe:
            kind = "loaded"
        trials.append((backend, kind))
        if kind in ("passed", "loaded"):
            break
    verdict = judge_trials(trials, probe=has_probe)
    return {
        "verdict": verdict.verdict,
        "backend": verdict.backend,
        "tried": [backend for backend, kind in trials if kind != "remembered"],
        "mark_bad": verdict.mark_bad,
        "report": verdict.report,
    }


_HEALTH_STEPS = ("launch", "app_started", "install", "confirm")


def check_health_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A health vector's ``input``: the confirmation ledger over a sequence of steps (§11).

    ``launch`` is a new process (a new client over the same cache), ``install``
    a new version installed by it, ``app_started`` the app's call (a revert it
    decides is carried out at once), ``confirm`` the app's confirmation. After
    each step: the ledger's installed version, whether it is confirmed, its
    count of unconfirmed starts, the revert that step decided, and the
    ``unconfirmed_starts`` that step reported (null: none).
    """
    max_starts = vector["max_unconfirmed_starts"]
    health, started, out = UnitHealth(), False, []
    for step in vector["steps"]:
        do = step["do"]
        if do not in _HEALTH_STEPS:
            raise ValueError(f"not a health step: {do!r}")
        revert: Revert | None = None
        reported: int | None = None
        if do == "launch":
            started = False
        elif do == "install":
            health = on_install(health, step["version"], during_start=started)
        elif do == "confirm":
            health, _ = on_confirm(health, step.get("version"))
        else:
            started = True
            before = health.starts
            health, revert = on_start(health, "unit", max_starts)
            if health.installed is not None and not health.confirmed and health.starts > before:
                reported = health.starts
            if revert is not None:
                health = on_reverted(health, revert.to_version)
        out.append(
            {
                "installed": health.installed,
                "confirmed": health.confirmed,
                "unconfirmed_starts": health.starts,
                "revert": None
                if revert is None
                else {"version": revert.version, "to_version": revert.to_version},
                "reported": reported,
            }
        )
    return {"steps": out}


_METRIC_DECLARATION: TypeAdapter[Any] = TypeAdapter(MetricDeclaration)


def check_metrics_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics vector's ``input``: app metric calls counted into an install's totals (§11).

    ``declared`` is what the installed release's entry declares (§3), ``counts``
    the install's totals before the calls (as a report carries them), ``calls``
    the app's calls in order: ``{"record": name, "success": bool}`` or
    ``{"observe": name, "value": number | "NaN" | "Infinity" | "-Infinity"}``.
    Per call: ``counted`` or why it is refused; then the ``metrics`` the next
    report carries (null: none counted).
    """
    declared = {
        name: _METRIC_DECLARATION.validate_python(decl) for name, decl in vector["declared"].items()
    }
    totals: dict[str, Any] = {name: dict(m) for name, m in vector["counts"].items()}
    outcomes: list[str] = []
    for call in vector["calls"]:
        if "record" in call:
            name, why = call["record"], refusal(declared, call["record"], "rate")
            if why is None:
                totals[name] = count_event(totals.get(name), call["success"])
        else:
            name, value = call["observe"], call["value"]
            value = float(value) if value in _NOT_FINITE else value
            why = refusal(declared, name, "distribution", value)
            if why is None:
                metric = declared[name]
                assert isinstance(metric, DistributionMetric)
                bucket = bucket_of(metric.buckets, value)
                totals[name] = count_value(totals.get(name), bucket, len(metric.buckets) + 1)
        outcomes.append(why or "counted")
    return {"calls": outcomes, "metrics": dict(sorted(totals.items())) or None}


def check_tier_file_vector(vector: Mapping[str, Any]) -> dict[str, Any]:
    """A tier-file vector's ``input``: read the file, then resolve the device's tier (§5)."""
    try:
        tiers = parse_tier_file(_b64(vector["file"]))
    except Malformed:
        return {"accept": False}
    device = DeviceProfile.model_validate({"device_id": "d", **vector["device"]})
    return {
        "accept": True,
        "order": [name for name, _ in tiers],
        "tier": resolve_tier(tiers, device),
    }


def resolve_tier_case(request: Mapping[str, Any]) -> dict[str, Any]:
    """One case of tests/vectors/rules/tiers.json: its tiers (an array) and its device."""
    tiers = [(t["name"], TierRules.model_validate(t["rules"])) for t in request["tiers"]]
    device = DeviceProfile.model_validate({"device_id": "d", **request["device"]})
    try:
        return {"tier": resolve_tier(tiers, device)}
    except NoTierError:
        return {"tier": None}


def cohort_case(request: Mapping[str, Any]) -> dict[str, Any]:
    """One case of tests/vectors/rules/cohorts.json: the bucket and the cohort at each percent."""
    salt, device_id = request["salt"], request["device_id"]
    return {
        "bucket": cohort_bucket(device_id, salt),
        "in_cohort": {p: in_cohort(device_id, salt, float(p)) for p in request["percents"]},
    }


def check_json(data: bytes) -> bool:
    """Whether the protocol's strict JSON parser takes these bytes."""
    try:
        strict_json_loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def _result(result: FetchResult | None) -> dict[str, Any]:
    if result is None:
        return {
            "ok": True,
            "error_code": None,
            "error": None,
            "version": None,
            "is_candidate": False,
            "updated": False,
            "not_modified": False,
            "runtime_fallback": False,
            "fallback": None,
            "substitute": None,
            "deferred": None,
            "bundled": False,
            "downloaded_bytes": 0,
            "members": {},
        }
    return {
        "ok": result.error_code is None,
        "error_code": result.error_code,
        "error": result.error,
        "version": result.version,
        "is_candidate": result.is_candidate,
        "updated": result.updated,
        "not_modified": result.not_modified,
        "runtime_fallback": result.runtime_fallback,
        "fallback": result.fallback,
        "substitute": result.substitute,
        "deferred": result.deferred,
        "bundled": result.bundled,
        "downloaded_bytes": result.downloaded_bytes,
        "members": {
            name: {
                "version": m.version,
                "variant": m.variant,
                "sha256": m.sha256,
                "path": str(m.path),
                "backend": m.backend,
            }
            for name, m in sorted(result.members.items())
        },
    }


def _unit_json(record: Mapping[str, Any] | None, kind: str, name: str) -> dict[str, Any] | None:
    """An ``installed.json`` record (docs/protocol.md §8) as ``{version, members}``."""
    if not isinstance(record, Mapping):
        return None
    if kind == "model":
        members = {name: record}
        version = record.get("version")
    else:
        members = dict(record.get("members") or {})
        version = record.get("version")
    return {
        "version": version,
        "members": {
            str(n): {"version": m.get("version"), "sha256": m.get("sha256")}
            for n, m in sorted(members.items())
            if isinstance(m, Mapping)
        },
    }


def _status(client: Client, status: Status) -> dict[str, Any]:
    try:
        pointers = json.loads((Path(client.cache.root) / "installed.json").read_bytes())
    except (OSError, ValueError):
        pointers = {}
    table = "bundles" if client.is_bundle else "models"
    record = (pointers.get(table) or {}).get(client.unit) if isinstance(pointers, dict) else None
    installed = None
    if status.version is not None:
        installed = {
            "version": status.version,
            "members": {
                n: {"version": m.version, "sha256": m.sha256}
                for n, m in sorted(status.members.items())
            },
        }
    previous = record.get("previous") if isinstance(record, Mapping) else None
    pending = status.pending
    return {
        "installed": installed,
        "last_good": _unit_json(previous, client.kind, client.unit),
        "pending": None
        if pending is None
        else {
            "version": pending.version,
            "is_candidate": pending.is_candidate,
            "deferred": pending.deferred,
            "total_bytes": pending.total_bytes,
            "remaining_bytes": pending.remaining_bytes,
        },
        "last_error_code": None if status.last_error is None else status.last_error.code,
        "refused": sorted(status.bad_releases),
        "ready": status.ready,
    }


class _CountingReporter:
    """Counts the reports the client hands to its reporter (what ``flush`` says it sent)."""

    def __init__(self, reporter: Reporter) -> None:
        self.count = 0
        for name in ("installed", "confirmed", "reverted", "summary", "unconfirmed", "memory"):
            setattr(reporter, name, self._counted(getattr(reporter, name)))

    def _counted(self, send: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            report = send(*args, **kwargs)
            if report is not None:
                self.count += 1
            return report

        return counted


def _bind_sockets(address: str | None) -> None:
    """Make every HTTP connection of this process leave from ``address`` (one device each)."""
    plain: type[http.client.HTTPConnection] = _PLAIN_HTTP

    if address is None:
        http.client.HTTPConnection = plain  # type: ignore[misc]
        return

    class Bound(plain):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("source_address", (address, 0))
            super().__init__(*args, **kwargs)

    http.client.HTTPConnection = Bound  # type: ignore[misc]


_PLAIN_HTTP = http.client.HTTPConnection


def _conditions(raw: Mapping[str, Any] | None) -> Conditions:
    """Absent, or a condition left out: the app did not say it (unknown is unmet, §8)."""
    said = raw or {}
    return Conditions(
        metered=said.get("metered"),
        charging=said.get("charging"),
        idle=said.get("idle"),
        storage_low=said.get("storage_low"),
    )


def _check_json(check: UpdateCheck) -> dict[str, Any]:
    return {
        "available": check.available,
        "version": check.version,
        "installed": check.installed,
        "is_candidate": check.is_candidate,
        "download_bytes": check.download_bytes,
        "deferred": check.deferred,
        "fallback": check.fallback,
        "error_code": check.error_code,
    }


class _Background:
    """One update running on its own thread (``start_update``), cancellable, with its progress."""

    def __init__(self, client: Client, conditions: Conditions) -> None:
        self.cancel = CancelToken()
        self.progress: list[list[int]] = []
        self.result: FetchResult | None = None
        self.thread = threading.Thread(target=self._run, args=(client, conditions), daemon=True)
        self.thread.start()

    def _run(self, client: Client, conditions: Conditions) -> None:
        self.result = client.fetch(
            conditions,
            cancel=self.cancel,
            progress=lambda done, total: self.progress.append([done, total]),
        )


class Device:
    """One device: the client configured last, its clock, its runner."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.now: datetime | None = None
        self.runner: HostModelRunner | None = None
        self.reports: _CountingReporter | None = None
        self.background: _Background | None = None
        self.events: list[ModelChange] = []

    def clock(self) -> datetime:
        return self.now if self.now is not None else datetime.now().astimezone()

    def need(self) -> Client:
        if self.client is None:
            raise UsageError("configure the device first")
        return self.client

    def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise UsageError(f"unknown op {op!r}")
        result: dict[str, Any] = handler(request)
        return result

    # -- ops --------------------------------------------------------------------------

    def op_hello(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"client": "python", "sdk_version": __version__}

    def op_decide(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(decide_vector, _arg(request, "vector", dict))

    def op_check_blob(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_blob_vector, _arg(request, "vector", dict))

    def op_check_probe(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_probe_vector, _arg(request, "vector", dict))

    def op_check_version(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_version_vector, _arg(request, "vector", dict))

    def op_check_report(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_report_vector, _arg(request, "vector", dict))

    def op_check_labels(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_labels_vector, _arg(request, "vector", dict))

    def op_check_hints(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_hints_vector, _arg(request, "vector", dict))

    def op_check_conditions(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_conditions_vector, _arg(request, "vector", dict))

    def op_check_selftest(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_selftest_vector, _arg(request, "vector", dict))

    def op_check_health(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_health_vector, _arg(request, "vector", dict))

    def op_check_metrics(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_metrics_vector, _arg(request, "vector", dict))

    def op_check_tiers(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(check_tier_file_vector, _arg(request, "vector", dict))

    def op_resolve_tier(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(resolve_tier_case, request)

    def op_cohort(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _vector(cohort_case, request)

    def op_check_json(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"valid": check_json(_b64(_arg(request, "data", str)))}

    def op_configure(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.close()
        registry = _arg(request, "registry", str)
        pems = _arg(request, "trusted_keys", list)
        cache_dir = Path(_arg(request, "cache_dir", str))
        unit = _arg(request, "unit", str)
        bundle = bool(_opt(request, "bundle", bool))
        raw_device = _arg(request, "device", dict)
        tier = _opt(request, "tier", str)
        raw_tiers = _opt(request, "tiers", list)
        policy_args = _opt(request, "policy", dict) or {}
        runner_args = _opt(request, "runner", dict)
        bundled_args = _opt(request, "bundled", dict)
        now = _opt(request, "now", str)
        # Absent or null: the SDK's own default (read from the platform); a list says them.
        raw_features = _opt(request, "cpu_features", list)
        cpu_features: list[str] | Literal["detect"] = (
            "detect" if raw_features is None else [str(f) for f in raw_features]
        )
        memory_budget_mb = _opt(request, "memory_budget_mb", (int, float))
        try:
            known = {k: v for k, v in raw_device.items() if v is not None}
            device = DeviceProfile.model_validate({"ram_mb": 0, "cpu_cores": 1, **known})
            trusted = TrustedKeys.from_pems([str(p).encode() for p in pems])
            # An array of {"name", "rules"}, best first: a tier file's "tiers" (§5).
            tiers = (
                None
                if raw_tiers is None
                else [(t["name"], TierRules.model_validate(t["rules"])) for t in raw_tiers]
            )
            policy = DownloadPolicy(**policy_args)
            bundled = None
            if bundled_args is not None:
                bundled = BundledRelease(
                    manifest=Path(bundled_args["manifest"]).read_bytes(),
                    blobs_dir=Path(bundled_args["blobs_dir"]),
                )
        except (ValueError, TypeError, KeyError, OSError, EdgeregError) as exc:
            raise UsageError(f"bad configuration: {exc}") from exc
        self.now = None if now is None else _time(now)
        self_test: bool | SelfTest = False
        if request.get("self_test"):
            if runner_args is None:
                # As an app without a runner: the client refuses to be built (§11), since
                # every probe would "fail" and mark good releases bad.
                raise UsageError(
                    "the client refused the configuration: the self-test is on and there "
                    "is no model runner"
                )
            apis = _opt(runner_args, "mnn_apis", list)
            self.runner = HostModelRunner(
                [str(a) for a in _arg(runner_args, "command", list)],
                ("module",) if apis is None else [str(a) for a in apis],
            )
            self_test = SelfTest(cache_dir, runner=self.runner)
        _bind_sockets(_opt(request, "source_address", str))
        try:
            client = Client(
                registry,
                trusted,
                cache_dir,
                model=None if bundle else unit,
                bundle=unit if bundle else None,
                device=device,
                tier=tier,
                tiers=tiers,
                app_version=_opt(request, "app_version", str),
                policy=policy,
                bundled=bundled,
                self_test=self_test,
                reporting=request.get("reporting", True) is not False,
                device_class=_opt(request, "device_class", str),
                cpu_features=cpu_features,
                memory_budget_mb=memory_budget_mb,
                max_unconfirmed_starts=_number(request, "max_unconfirmed_starts", 3),
                timeout=float(_number(request, "timeout_s", 30)),
                deadline=float(_number(request, "deadline_s", 600)),
                min_rate=int(_number(request, "min_rate", 1024)),
                clock=self.clock,
            )
        except (ValueError, TypeError, EdgeregError) as exc:
            raise UsageError(f"the client refused the configuration: {exc}") from exc
        self.client = client
        self.reports = _CountingReporter(client.reporter)
        client.add_listener(self.events.append)
        if tier is not None:
            why = "given by the app"
        else:
            assert tiers is not None
            why = "; ".join(explain_tier(tiers, device))
        return {"tier": client.tier, "tier_reason": why}

    def op_set_clock(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.now = _time(_arg(request, "now", str))
        return {}

    def op_update(self, request: Mapping[str, Any]) -> dict[str, Any]:
        client = self.need()
        return _result(client.fetch(_conditions(_opt(request, "conditions", dict))))

    def op_start_update(self, request: Mapping[str, Any]) -> dict[str, Any]:
        client = self.need()
        if self.background is not None and self.background.thread.is_alive():
            raise UsageError("an update is already running: wait_update first")
        self.background = _Background(client, _conditions(_opt(request, "conditions", dict)))
        return {}

    def op_cancel(self, request: Mapping[str, Any]) -> dict[str, Any]:
        if self.background is not None:
            self.background.cancel.cancel()
        return {}

    def op_wait_update(self, request: Mapping[str, Any]) -> dict[str, Any]:
        background = self.background
        if background is None:
            raise UsageError("no update was started")
        background.thread.join()
        self.background = None
        return {**_result(background.result), "progress": background.progress}

    def op_events(self, request: Mapping[str, Any]) -> dict[str, Any]:
        events, self.events[:] = list(self.events), []
        return {
            "events": [
                {"unit": e.unit, "kind": e.kind, "version": e.version, "previous": e.previous}
                for e in events
            ]
        }

    def op_check(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _check_json(self.need().check(_conditions(_opt(request, "conditions", dict))))

    def op_delete(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"deleted": self.need().delete()}

    def op_installed(self, request: Mapping[str, Any]) -> dict[str, Any]:
        units = installed_units(self.need().cache.root)
        return {
            "units": [
                {
                    "unit": u.unit,
                    "kind": u.kind,
                    "version": u.version,
                    "is_candidate": u.is_candidate,
                }
                for u in units
            ]
        }

    def op_current(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _result(self.need().current())

    def op_status(self, request: Mapping[str, Any]) -> dict[str, Any]:
        client = self.need()
        return _status(client, client.status())

    def op_app_started(self, request: Mapping[str, Any]) -> dict[str, Any]:
        revert = self.need().app_started()
        if revert is None:
            return {"reverted": False, "version": None, "reason": None}
        return {"reverted": True, "version": revert.version, "reason": revert.reason}

    def op_confirm(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"confirmed": self.need().confirm(_opt(request, "version", str))}

    def op_record_inference(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.need().record_inference(
            float(_arg(request, "ms", (int, float))), _opt(request, "model", str)
        )
        return {}

    def op_record(self, request: Mapping[str, Any]) -> dict[str, Any]:
        success = _arg(request, "success", bool)
        try:
            counted = self.need().record(_arg(request, "metric", str), success)
        except ValueError as exc:
            return {"counted": False, "error": str(exc)}
        return {"counted": counted}

    def op_observe(self, request: Mapping[str, Any]) -> dict[str, Any]:
        value = _arg(request, "value", (int, float, str))
        if isinstance(value, str):
            # JSON has no NaN or infinity: the program takes their names (device-program.md).
            if value not in _NOT_FINITE:
                raise UsageError(
                    f"argument 'value' must be a number or one of {', '.join(_NOT_FINITE)}"
                )
            value = float(value)
        try:
            counted = self.need().observe(_arg(request, "metric", str), float(value))
        except ValueError as exc:
            return {"counted": False, "error": str(exc)}
        return {"counted": counted}

    def op_record_memory(self, request: Mapping[str, Any]) -> dict[str, Any]:
        peak = _opt(request, "peak_mb", (int, float))
        steady = _opt(request, "steady_mb", (int, float))
        self.need().record_memory(
            None if peak is None else float(peak),
            None if steady is None else float(steady),
            _opt(request, "model", str),
        )
        return {}

    def op_revert(self, request: Mapping[str, Any]) -> dict[str, Any]:
        client = self.need()
        reason = _opt(request, "reason", str) or "reverted by the app"
        return _result(client.revert(reason))

    def op_flush(self, request: Mapping[str, Any]) -> dict[str, Any]:
        client = self.need()
        client.reporter.retry_pending()
        client.close()
        sent = 0
        if self.reports is not None:
            sent, self.reports.count = self.reports.count, 0
        return {"sent": sent}

    def op_quit(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        if self.background is not None:
            self.background.cancel.cancel()
            self.background.thread.join(timeout=10)
            self.background = None
        if self.client is not None:
            self.client.close()
        if self.runner is not None:
            self.runner.close()
        self.client = self.runner = self.reports = None


def _vector(
    run: Callable[[Mapping[str, Any]], dict[str, Any]], vector: Mapping[str, Any]
) -> dict[str, Any]:
    try:
        return run(vector)
    except UsageError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"not a vector input: {exc!r}") from exc


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    while True:
        line = stream.readline()
        if not line:
            return
        if line.strip():
            yield line


def main(argv: Sequence[str] | None = None) -> int:
    """Serve requests from stdin until ``quit`` or end of input; return the exit status."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="device %(levelname)s %(name)s: %(message)s"
    )
    # Answers go to a private copy of stdout; fd 1 becomes stderr, so nothing
    # else (MNN's C++ prints, a stray print) can corrupt the JSON lines.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    device = Device()
    try:
        for line in _lines(sys.stdin.buffer):
            answer, done = _answer(device, line)
            out.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
            if done:
                break
    finally:
        device.close()
        out.close()
    return 0


def _answer(device: Device, line: bytes) -> tuple[dict[str, Any], bool]:
    request_id: Any = None
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise UsageError("a request is a JSON object")
        request_id = request.get("id")
        result = device.handle(request)
        return {"id": request_id, "ok": True, "result": result}, request.get("op") == "quit"
    except UsageError as exc:
        message = str(exc)
    except ValueError as exc:
        message = f"not a JSON request: {exc}"
    except Exception as exc:  # the program never dies on a request; the harness sees why
        _log.exception("op failed")
        message = f"{type(exc).__name__}: {exc}"
    return {"id": request_id, "ok": False, "error": {"message": message}}, False


if __name__ == "__main__":
    sys.exit(main())
