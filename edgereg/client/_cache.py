"""The client's cache directory: blobs, state files, the install pointer, eviction.

Layout (one client at a time per directory)::

    blobs/<sha256>              verified blobs (artifacts, probes, labels), written
                                once (os.replace from .part)
    blobs/<sha256>.part         an interrupted download, resumed with Range
    state/<unit>/sequence.json  highest sequence seen (rollback protection)
    state/<unit>/<tier>.json    last accepted manifest bytes and its ETag
    state/<unit>/_status.json   the pending release (downloading or deferred), last error
    state/<unit>/_bad.json      versions refused for good on this device
    installed.json              models: model -> blob, version, variant, hints, contract;
                                bundles: bundle -> version and every member; each with
                                ``previous``, the last good set
    health.json                 starts since each install (:mod:`._health`)
    reports.json                the last report of each model, unsent ones (:mod:`._reporter`)
    selftest.json               backends that failed each version's probe (:mod:`._selftest`)

A unit is a model or a bundle. A bundle's pointer names every member, so a
set switches in one rename: a crash leaves the old set or the new one.

Every state file is read by :func:`read_state_file` (one size cap per kind,
one error type) and written by :func:`write_state_file`: a temporary file in
the same directory renamed into place, so a crash or a full disk never leaves
half a file where a reader looks. A blob is only ever renamed into ``blobs/``
after its size and sha256 matched the signed manifest.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from edgereg._files import atomic_write
from edgereg.client._installed import UnitKind, _Installed
from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.errors import EdgeregError, ExitCode
from edgereg.protocol.patterns import SHA256

__all__ = [
    "MAX_STATE_BYTES",
    "CacheError",
    "NoSpace",
    "StateFile",
    "cache_error",
    "fsync_dir",
    "read_state_file",
    "unlink",
    "write_all",
    "write_state_file",
]

_log = logging.getLogger(__name__)

StateFile = Literal[
    "tier", "sequence", "status", "bad", "installed", "health", "reports", "selftest"
]
"""The kinds of state file the client keeps (the layout above)."""

MAX_STATE_BYTES: dict[StateFile, int] = {
    # A base64 manifest (64 KiB by default; the limit is configurable) and its ETag.
    "tier": 1024 * 1024,
    "sequence": 4 * 1024,
    "status": 1024 * 1024,
    "bad": 1024 * 1024,
    "installed": 1024 * 1024,
    "health": 1024 * 1024,
    # Up to 16 unsent reports plus the last report of every model.
    "reports": 4 * 1024 * 1024,
    "selftest": 1024 * 1024,
}
"""Each kind of state file is refused past this size: a real one is a few KiB."""


class CacheError(EdgeregError):
    """The client's cache directory cannot be read or written (disk full, permissions).

    Attributes:
        errno: The operating system's error number, if there was one.
    """

    exit_code = ExitCode.CACHE

    def __init__(self, message: str, *, errno: int | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.errno = errno


class NoSpace(CacheError):
    """The free space cannot hold the download plus the reserve; nothing was downloaded.

    Attributes:
        needed: Bytes the download needs (the bytes still to fetch plus the reserve).
        free: Bytes free where the cache lives.
    """

    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(
            message,
            errno=errno.ENOSPC,
            hint="Free some storage; the installed model stays in use.",
        )
        self.needed = needed
        self.free = free


_DIGEST_NAME = re.compile(rf"^({SHA256})(\.part)?$")
_SECTIONS: dict[UnitKind, str] = {"model": "models", "bundle": "bundles"}


@dataclass
class _TierState:
    envelope: bytes | None = None
    etag: str | None = None
    highest_sequence: int | None = None
    """Read from caches written before the sequence was kept per model."""


class _Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def part(self, sha256: str) -> Path:
        return self.root / "blobs" / f"{sha256}.part"

    def _state_file(self, model: str, tier: str) -> Path:
        return self.root / "state" / model / f"{tier}.json"

    def _sequence_file(self, model: str) -> Path:
        return self.root / "state" / model / "sequence.json"

    def status_file(self, unit: str) -> Path:
        # A leading "_" keeps these apart from <tier>.json: a tier name starts with a letter.
        return self.root / "state" / unit / "_status.json"

    def _bad_file(self, unit: str) -> Path:
        return self.root / "state" / unit / "_bad.json"

    def read_state(self, model: str, tier: str) -> _TierState:
        path = self._state_file(model, tier)
        data = self._read_json(path, "tier", strict=True)
        if data is None:
            return _TierState()
        envelope = data.get("envelope")
        sequence = data.get("highest_sequence")
        etag = data.get("etag")
        try:
            decoded = (
                base64.b64decode(envelope, validate=True) if isinstance(envelope, str) else None
            )
        except ValueError as exc:
            raise _corrupt(path, "its envelope is not base64") from exc
        if sequence is not None and (type(sequence) is not int or sequence < 1):
            raise _corrupt(path, f"highest_sequence is {sequence!r}")
        return _TierState(
            envelope=decoded,
            etag=etag if isinstance(etag, str) else None,
            highest_sequence=sequence,
        )

    def write_state(self, model: str, tier: str, state: _TierState) -> None:
        data = {
            "envelope": base64.b64encode(state.envelope).decode() if state.envelope else None,
            "etag": state.etag,
            "highest_sequence": state.highest_sequence,
        }
        self._write_json(self._state_file(model, tier), data)

    def read_sequence(self, model: str) -> int | None:
        """The highest manifest sequence accepted for ``model``, whatever the tier.

        One per model, not per tier: every tier's manifest of a model carries
        the same sequence, so a device whose tier changed must not accept an
        older manifest of its new tier. Caches written before this kept it
        per tier; the highest of those counts too.

        Raises:
            CacheError: a file holding it is unreadable or corrupt. Refused,
                not reset: a reset would accept a replayed old manifest.
        """
        path = self._sequence_file(model)
        data = self._read_json(path, "sequence", strict=True)
        found: list[int] = []
        if data is not None:
            sequence = data.get("highest_sequence")
            if type(sequence) is not int or sequence < 1:
                raise _corrupt(path, f"highest_sequence is {sequence!r}")
            found.append(sequence)
        tiers = self.root / "state" / model
        with contextlib.suppress(OSError):
            for tier_file in sorted(tiers.glob("*.json")):
                if tier_file.stem != "sequence" and not tier_file.stem.startswith("_"):
                    legacy = self.read_state(model, tier_file.stem).highest_sequence
                    if legacy is not None:
                        found.append(legacy)
        return max(found) if found else None

    def write_sequence(self, model: str, sequence: int) -> None:
        self._write_json(self._sequence_file(model), {"highest_sequence": sequence})

    # -- the install pointer --------------------------------------------------------

    def read_record(self, kind: UnitKind, unit: str) -> _Installed | None:
        """The unit's pointer as written, whether or not its blobs are still there."""
        data = self._read_json(self.root / "installed.json", "installed")
        section = (data or {}).get(_SECTIONS[kind], {})
        entry = section.get(unit) if isinstance(section, dict) else None
        if not isinstance(entry, dict):
            return None
        try:
            return _Installed.from_json(kind, unit, entry)
        except (KeyError, TypeError, ValueError, ValidationError):
            _log.warning("the install record of %s in installed.json is damaged; ignoring it", unit)
            return None

    def read_installed(self, kind: UnitKind, unit: str) -> _Installed | None:
        installed = self.read_record(kind, unit)
        # Only complete, verified blobs are ever renamed into blobs/; a missing
        # one (the app cleared its cache) means nothing is installed.
        if installed is None or not all(self.blob(d).is_file() for d in installed.blobs):
            return None
        return installed

    def unit_names(self, kind: UnitKind) -> list[str]:
        """The names of the installed.json entries of one kind (models or bundles)."""
        data = self._read_json(self.root / "installed.json", "installed") or {}
        units = data.get(_SECTIONS[kind])
        return sorted(str(name) for name in units) if isinstance(units, dict) else []

    def write_installed(self, kind: UnitKind, unit: str, installed: _Installed | None) -> None:
        """Switch the unit's pointer (every member at once: one atomic rename)."""
        path = self.root / "installed.json"
        data = self._read_json(path, "installed") or {}
        out: dict[str, Any] = {"schema_version": 1}
        for section in _SECTIONS.values():
            value = data.get(section)
            if isinstance(value, dict) and (value or section == "models"):
                out[section] = dict(value)
            elif section == "models":
                out[section] = {}
        units = out.setdefault(_SECTIONS[kind], {})
        if installed is None:
            units.pop(unit, None)
        else:
            units[unit] = installed.to_json()
        self._write_json(path, out)

    def has_blob(self, sha256: str, size: int) -> bool:
        try:
            return self.blob(sha256).stat().st_size == size
        except OSError:
            return False

    # -- status and bad releases ---------------------------------------------------

    def read_status(self, unit: str) -> dict[str, Any]:
        return self._read_json(self.status_file(unit), "status") or {}

    def write_status(self, unit: str, status: dict[str, Any]) -> None:
        if self.read_status(unit) != status:
            self._write_json(self.status_file(unit), status)

    def read_bad(self, unit: str) -> dict[str, str]:
        """Versions of ``unit`` refused for good on this device -> why."""
        data = self._read_json(self._bad_file(unit), "bad") or {}
        releases = data.get("releases")
        if not isinstance(releases, dict):
            return {}
        return {str(k): str(v) for k, v in releases.items()}

    def mark_bad(self, unit: str, version: str, why: str) -> None:
        releases = self.read_bad(unit)
        releases[version] = why
        self._write_json(self._bad_file(unit), {"releases": releases})

    # -- eviction ---------------------------------------------------------------------

    def referenced(self) -> set[str]:
        """Digests some unit needs: installed, its last good set, or a pending download."""
        keep: set[str] = set()
        data = self._read_json(self.root / "installed.json", "installed") or {}
        for kind, section in _SECTIONS.items():
            units = data.get(section)
            if not isinstance(units, dict):
                continue
            for unit in units:
                record = self.read_record(kind, str(unit))
                while record is not None:
                    keep |= record.blobs
                    record = record.previous
        with contextlib.suppress(OSError):
            for status_file in (self.root / "state").glob("*/_status.json"):
                pending = self.read_status(status_file.parent.name).get("pending")
                if isinstance(pending, dict):
                    blobs = pending.get("blobs")
                    if isinstance(blobs, list):
                        keep |= {
                            b["sha256"]
                            for b in blobs
                            if isinstance(b, dict) and isinstance(b.get("sha256"), str)
                        }
        return keep

    def evict(self) -> int:
        """Delete blobs and partial downloads nothing references; returns the bytes freed."""
        keep = self.referenced()
        freed = 0
        try:
            names = list((self.root / "blobs").iterdir())
        except FileNotFoundError:
            return 0
        except OSError as exc:
            _log.warning("cannot list %s (%s); nothing evicted", self.root / "blobs", exc)
            return 0
        for path in names:
            found = _DIGEST_NAME.fullmatch(path.name)
            if found is None or found.group(1) in keep:
                continue
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError as exc:
                _log.warning("cannot evict %s: %s", path, exc)
                continue
            freed += size
            _log.info("evicted %s (%d bytes): no installed or pending release uses it", path, size)
        if freed:
            _log.info("evicted %d bytes of blobs no installed or pending release uses", freed)
        return freed

    def _read_json(
        self, path: Path, kind: StateFile, *, strict: bool = False
    ) -> dict[str, Any] | None:
        """A JSON object from the cache, None when the file does not exist.

        With ``strict`` an unreadable or corrupt file raises :class:`CacheError`
        (rollback protection lives there); otherwise it counts as absent and
        is rewritten (the install pointer: the blobs it names are verified).
        """
        try:
            return read_state_file(path, kind)
        except CacheError as exc:
            if strict:
                if exc.errno is not None:
                    raise
                raise _refusing(exc, path) from exc
            _log.warning("%s; treating it as absent", exc.message)
            return None

    def _write_json(self, path: Path, value: Any) -> None:
        write_state_file(path, value)


# --- one reader and one writer for every state file ---------------------------------


def read_state_file(path: Path, kind: StateFile) -> dict[str, Any] | None:
    """A state file's JSON object, or None when the file does not exist.

    Each caller decides what a damaged file means: the rollback state refuses
    to update, the rest start afresh (and log it).

    Raises:
        CacheError: the file cannot be read (``errno`` set), is larger than
            ``MAX_STATE_BYTES[kind]`` or is not a JSON object (``errno`` None).
    """
    limit = MAX_STATE_BYTES[kind]
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise cache_error(f"cannot read {path}", exc) from exc
    if len(data) > limit:
        raise _damaged(path, f"larger than the {limit} bytes a {kind} file may be")
    try:
        value = strict_json_loads(data)
    except (ValueError, RecursionError) as exc:
        raise _damaged(path, f"it is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise _damaged(path, "it is not a JSON object")
    return value


def write_state_file(path: Path, value: Any) -> None:
    """Write a state file whole or not at all, creating its directory; durable once it returns.

    Raises:
        CacheError: the write failed (disk full, permissions); the old file is untouched.
    """
    data = json.dumps(value, indent=1, sort_keys=True).encode() + b"\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    except OSError as exc:
        raise cache_error(f"cannot write {path}", exc) from exc
    fsync_dir(path.parent)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (``os.write`` may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    # Possible on POSIX; not possible (nor needed) everywhere.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def unlink(path: Path) -> None:
    """Delete a file that may already be gone."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _damaged(path: Path, why: str) -> CacheError:
    return CacheError(
        f"the client state {path} is corrupt ({why})", hint=f"Delete {path} to start over."
    )


def _refusing(exc: CacheError, path: Path) -> CacheError:
    return CacheError(
        f"{exc.message}; refusing to update, because starting over would drop rollback "
        "protection (an old, replayed manifest would be accepted)",
        hint=f"The installed model stays in use. If the disk was at fault, delete {path} "
        "to start over.",
    )


def _corrupt(path: Path, why: str) -> CacheError:
    return _refusing(_damaged(path, why), path)


def cache_error(what: str, exc: OSError) -> CacheError:
    """The :class:`CacheError` of a failed read or write, with a hint when the disk is full."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return CacheError(
        f"{what}: {exc.strerror or exc}",
        errno=exc.errno,
        hint="Free some storage; the installed model stays in use." if full else None,
    )
