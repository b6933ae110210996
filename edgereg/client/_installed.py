"""What is installed, what is pending, what went wrong: the records of installed.json and status.

A unit is what the client installs as one: a model, or a bundle (models that
ship together). ``installed.json`` holds one pointer per unit; a bundle's
pointer names every member, so switching a set is one atomic rename.

The public dataclasses here are what apps read (:class:`InstalledModel`,
:class:`Status`); the private ones are the cache's JSON records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import TypeAdapter

from edgereg.protocol.contract import IOContract
from edgereg.protocol.fields import RuntimeHints
from edgereg.protocol.rules import HintChoice
from edgereg.protocol.wire import DistributionMetric, ManifestEntry, Metrics, RateMetric

_METRICS: TypeAdapter[dict[str, RateMetric | DistributionMetric]] = TypeAdapter(Metrics)

__all__ = [
    "InstallCheck",
    "InstalledModel",
    "LastError",
    "MemberFiles",
    "Pending",
    "Status",
]

UnitKind = Literal["model", "bundle"]


class MemberFiles(NamedTuple):
    """One member of a release about to be installed, its blobs verified on disk."""

    entry: ManifestEntry
    artifact: Path
    probe: Path | None
    probe_data: Path | None = None


InstallCheck = Callable[[str, str, Mapping[str, MemberFiles]], Mapping[str, str] | None]
"""``(unit, version, {member: MemberFiles}) -> {member: backend} | None``.

Called after every blob of a new release is verified and before the switch;
returns the backend per member (None: no choice made) or raises a
:class:`~edgereg.protocol.reasons.Rejected` subclass (``permanent = True``
marks the release bad on this device).
"""


@dataclass(frozen=True)
class InstalledModel:
    """One installed, verified model: what the app loads and how it calls it.

    Attributes:
        name: The model's name (a bundle member's name).
        path: The verified artifact.
        version: The model's own version.
        variant: The variant built for this tier.
        sha256: The artifact's digest.
        runtime: The runtime settings to use (threads, backend order,
            precision): the entry's declared ``runtime``, or a hint rule's
            threads and backends where one chose this device (docs/protocol.md §11).
        min_mnn_runtime: The oldest MNN runtime that loads it.
        contract: How to call it (inputs, outputs, state, task), when the
            release carries one.
        labels: Its class labels or characters (inline, or the verified labels
            blob), when the contract has them.
        probe_path: Its verified golden probe, when the release has one and an
            install check (the self-test) fetched it; None otherwise.
        backend: The backend the install check chose, None when there was no check.
        runtime_rule: The index in the entry's ``runtime_hints`` of the rule whose
            runtime ``runtime`` is; None when it is the declared one.
    """

    name: str
    path: Path
    version: str
    variant: str
    sha256: str
    runtime: RuntimeHints
    min_mnn_runtime: str
    contract: IOContract | None = None
    labels: list[str] | None = None
    probe_path: Path | None = None
    backend: str | None = None
    runtime_rule: int | None = None


@dataclass(frozen=True)
class Pending:
    """A verified release not installed yet.

    Attributes:
        version: The release's (the unit's) version.
        is_candidate: It is the rollout's candidate.
        total_bytes: Bytes of the blobs still missing when it became pending.
        remaining_bytes: Of those, what is not downloaded yet.
        deferred: Why downloading waits (``metered``, ``not-charging``), or
            None when a download started and did not finish.
        since: When it became pending (RFC 3339 UTC).
    """

    version: str
    is_candidate: bool
    total_bytes: int
    remaining_bytes: int
    deferred: str | None
    since: str


@dataclass(frozen=True)
class LastError:
    """The last fetch's failure: a stable code, the message, and when (RFC 3339 UTC)."""

    code: str
    message: str
    at: str


@dataclass(frozen=True)
class Status:
    """One unit on this device: installed, pending, last error, and whether it can be loaded.

    Attributes:
        unit: The model or bundle name.
        kind: ``model`` or ``bundle``.
        tier: The tier of what is installed (the client's when nothing is).
        version: The installed version (the bundle's for a bundle), or None.
        is_candidate: What is installed is a rollout's candidate.
        bundled: What is installed came from the release shipped in the app.
        members: The installed models by name (one, the model itself, for a model).
        previous: The version kept as the last good set to revert to, or None.
        pending: A verified release still downloading or deferred, or None.
        last_error: The last fetch's failure, None after a success.
        bad_releases: Versions this device refused for good, with why.
        ready: Something is installed and every one of its blobs is present
            with its declared digest.
    """

    unit: str
    kind: UnitKind
    tier: str
    version: str | None
    is_candidate: bool
    bundled: bool
    members: Mapping[str, InstalledModel]
    previous: str | None
    pending: Pending | None
    last_error: LastError | None
    bad_releases: Mapping[str, str]
    ready: bool


# --- the cache's records --------------------------------------------------------------


@dataclass(frozen=True)
class _Member:
    sha256: str
    version: str
    variant: str
    min_mnn_runtime: str
    runtime: RuntimeHints
    size: int | None = None
    contract: IOContract | None = None
    probe_sha256: str | None = None
    backend: str | None = None
    # The runtime hint rules chose for this device (§11), from the last manifest verified:
    # None while the declared runtime applies.
    hint: HintChoice | None = None

    @property
    def use_runtime(self) -> RuntimeHints:
        """The runtime the app should use: a hint rule's, else the declared one."""
        return self.runtime if self.hint is None else self.hint.runtime

    @property
    def labels_sha256(self) -> str | None:
        blob = self.contract.labels_blob if self.contract is not None else None
        return None if blob is None else blob.sha256

    def blobs(self) -> list[str]:
        """Every blob digest this member needs on disk."""
        found = [self.sha256]
        found += [d for d in (self.probe_sha256, self.labels_sha256) if d is not None]
        return found

    @classmethod
    def of(
        cls, entry: ManifestEntry, backend: str | None = None, hint: HintChoice | None = None
    ) -> _Member:
        return cls(
            sha256=entry.sha256,
            version=entry.version,
            variant=entry.variant,
            min_mnn_runtime=entry.min_mnn_runtime,
            runtime=entry.runtime,
            size=entry.size,
            contract=entry.contract,
            probe_sha256=entry.probe.sha256 if entry.probe is not None else None,
            backend=backend,
            hint=hint if hint is not None and hint.matched is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        # The keys of the first release stay as they were, so an older client
        # reading this cache still finds its model.
        data: dict[str, Any] = {
            "sha256": self.sha256,
            "version": self.version,
            "variant": self.variant,
            "min_mnn_runtime": self.min_mnn_runtime,
            "runtime": self.runtime.model_dump(mode="json"),
        }
        if self.size is not None:
            data["size"] = self.size
        if self.contract is not None:
            data["contract"] = self.contract.model_dump(mode="json", exclude_none=True)
        if self.probe_sha256 is not None:
            data["probe_sha256"] = self.probe_sha256
        if self.backend is not None:
            data["backend"] = self.backend
        if self.hint is not None:
            data["hint"] = {
                "runtime": self.hint.runtime.model_dump(mode="json"),
                "rule": self.hint.rule,
                "matched": self.hint.matched,
            }
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Member:
        size = data.get("size")
        probe = data.get("probe_sha256")
        backend = data.get("backend")
        contract = data.get("contract")
        return cls(
            sha256=str(data["sha256"]),
            version=str(data["version"]),
            variant=str(data["variant"]),
            min_mnn_runtime=str(data["min_mnn_runtime"]),
            runtime=RuntimeHints.model_validate(data["runtime"]),
            size=size if type(size) is int else None,
            contract=None if contract is None else IOContract.model_validate(contract),
            probe_sha256=probe if isinstance(probe, str) else None,
            backend=backend if isinstance(backend, str) else None,
            hint=_hint_of(data.get("hint")),
        )


def _hint_of(data: object) -> HintChoice | None:
    """A member's stored hint choice; anything unreadable is no hint (the declared runtime)."""
    if not isinstance(data, dict):
        return None
    rule, matched = data.get("rule"), data.get("matched")
    try:
        runtime = RuntimeHints.model_validate(data.get("runtime"))
    except ValueError:
        return None
    return HintChoice(
        runtime,
        rule=rule if type(rule) is int else None,
        matched=matched if type(matched) is int else None,
    )


@dataclass(frozen=True)
class _Installed:
    """One unit's install pointer: its version and every member, and the last good set."""

    kind: UnitKind
    version: str
    tier: str
    is_candidate: bool
    sequence: int
    members: dict[str, _Member]
    bundled: bool = False
    previous: _Installed | None = field(default=None, compare=False)
    # The app metrics the release declares (docs/protocol.md §3): what record/observe take.
    metrics: Mapping[str, RateMetric | DistributionMetric] | None = None

    @property
    def blobs(self) -> set[str]:
        return {digest for member in self.members.values() for digest in member.blobs()}

    def same_release(self, other: _Installed | None) -> bool:
        """The same version with the same blobs (metadata such as the role may differ)."""
        if other is None or other.version != self.version:
            return False
        mine = {name: m.sha256 for name, m in self.members.items()}
        return mine == {name: m.sha256 for name, m in other.members.items()}

    def without_previous(self) -> _Installed:
        return replace(self, previous=None)

    def to_json(self) -> dict[str, Any]:
        data = self._own_json()
        if self.previous is not None:
            data["previous"] = self.previous._own_json()
        return data

    def _own_json(self) -> dict[str, Any]:
        common: dict[str, Any] = {
            "tier": self.tier,
            "is_candidate": self.is_candidate,
            "sequence": self.sequence,
        }
        if self.bundled:
            common["bundled"] = True
        if self.metrics is not None:
            common["metrics"] = {
                name: m.model_dump(mode="json", by_alias=True)
                for name, m in sorted(self.metrics.items())
            }
        if self.kind == "model":
            (member,) = self.members.values()
            return {**member.to_json(), **common}
        return {
            **common,
            "version": self.version,
            "members": {name: m.to_json() for name, m in sorted(self.members.items())},
        }

    @classmethod
    def from_json(cls, kind: UnitKind, name: str, data: Mapping[str, Any]) -> _Installed:
        """Raises KeyError, TypeError, ValueError or ValidationError for a damaged record."""
        previous = data.get("previous")
        if kind == "model":
            members = {name: _Member.from_json(data)}
            version = members[name].version
        else:
            raw = data["members"]
            if not isinstance(raw, dict) or not raw:
                raise ValueError("a bundle record needs members")
            members = {str(k): _Member.from_json(v) for k, v in raw.items()}
            version = str(data["version"])
        return cls(
            kind=kind,
            version=version,
            tier=str(data["tier"]),
            is_candidate=bool(data["is_candidate"]),
            sequence=int(data["sequence"]),
            members=members,
            bundled=data.get("bundled") is True,
            previous=None
            if not isinstance(previous, dict)
            else cls.from_json(kind, name, previous),
            metrics=_METRICS.validate_python(data["metrics"]) if "metrics" in data else None,
        )
