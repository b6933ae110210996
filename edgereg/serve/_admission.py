"""The server's shell around :func:`edgereg.reports.admission.admit`: what was served, cached.

Reading and verifying a rollout state per report would cost more than storing
the report, so the index keeps each unit's :class:`ServedUnit` for ``ttl``
seconds, and the list of units too (so a flood of made-up unit names costs a
set lookup, not a storage read). A report naming a sequence newer than the
cached state refreshes that unit early, so a device that just fetched a new
manifest is not refused for the server's stale cache: at most once a second
per unit, one read for every report waiting on it (a report arriving less
than a second after the last read waits for the next, shared). A sequence
more than :data:`NEAR_FUTURE` above a state read less than a second ago
cannot have been issued since (that many signed state writes in a second):
it is refused from the cache, so a flood of made-up sequences costs neither
a read nor a wait each (issue #30: each cost a read, a listing and a second
of a thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edgereg.errors import EdgeregError, StorageError
from edgereg.protocol.envelope import TrustedKeys
from edgereg.protocol.reports import Report
from edgereg.protocol.wire import RolloutState
from edgereg.registry import Registry
from edgereg.reports.admission import ReleaseFacts, ServedUnit, admit
from edgereg.storage import NotFound, Storage

log = logging.getLogger(__name__)

#: Seconds a unit's served index is reused.
DEFAULT_TTL = 10.0
#: Seconds between early refreshes of one unit (a report with a newer sequence).
EARLY_REFRESH = 1.0
#: How far above a state read less than EARLY_REFRESH ago a report's sequence may be
#: and still be worth a refresh: each sequence is one signed state write.
NEAR_FUTURE = 8


class ServedIndex:
    """What the registry served, per unit, cached.

    Args:
        storage: The registry.
        trusted: The pinned publisher keys (None: the registry's own keys/).
        ttl: Seconds a read is reused.
        monotonic: The clock, in seconds; injected for tests.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        trusted: Callable[[], TrustedKeys] | None = None,
        ttl: float = DEFAULT_TTL,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._pinned = Registry(storage, trusted=trusted) if trusted is not None else None
        # Without pinned keys, what the server serves is what its storage holds: the
        # registry's own keys/ at least show the state was not damaged.
        self._own = Registry(storage)
        self._said = False
        self._ttl = ttl
        self._clock = monotonic
        self._sleep = sleep
        self._lock = threading.Lock()
        self._units: tuple[float, frozenset[str]] | None = None
        # unit -> (when read, what it served, the how-many-th read of the unit)
        self._served: dict[str, tuple[float, ServedUnit | None, int]] = {}
        # One refresh of a unit at a time; reports arriving meanwhile wait for it and
        # take its result. Units are those the registry lists: a bounded set.
        self._reading: dict[str, threading.Lock] = {}
        self.reads = 0  # state reads since the start (tests, benchmarks)
        self._release_facts: dict[tuple[str, str], ReleaseFacts] = {}

    def check(self, report: Report) -> str | None:
        """None to admit the report, else the reason code it is refused for.

        Raises:
            StorageError: the registry cannot be read (the caller answers 503).
        """
        served = self._unit(report.unit, report.sequence)
        return admit(report, served)

    def _unit(self, unit: str, sequence: int) -> ServedUnit | None:
        now = self._clock()
        # Read without the lock: each is replaced whole, never changed in place (the
        # lock, taken by every report, was one more wait among the request threads).
        listed = self._units
        cached = self._served.get(unit)
        if listed is None or now - listed[0] > self._ttl:
            listed = (now, frozenset(self._own.models()))
            with self._lock:
                self._units = listed
        if unit not in listed[1]:
            return None
        if cached is not None and self._usable(cached, sequence, now):
            return cached[1]
        seen = cached[2] if cached is not None else 0
        with self._lock:
            reading = self._reading.setdefault(unit, threading.Lock())
        with reading:
            with self._lock:
                cached = self._served.get(unit)
            if cached is not None and cached[2] > seen:
                return cached[1]  # read while this report waited: its answer is this one's
            now = self._clock()
            if cached is not None and self._usable(cached, sequence, now):
                return cached[1]
            if cached is not None and now - cached[0] < EARLY_REFRESH:
                # A sequence just above a read less than a second old: a device that
                # fetched a manifest written since. Wait for the read the second allows;
                # every report arriving meanwhile queues on the lock and takes it.
                self._sleep(EARLY_REFRESH - (now - cached[0]))
                now = self._clock()
            served = self._read(unit)
            with self._lock:
                self.reads += 1
                self._served[unit] = (now, served, self.reads)
        return served

    def _usable(
        self, cached: tuple[float, ServedUnit | None, int], sequence: int, now: float
    ) -> bool:
        """Whether the cached read answers a report naming ``sequence`` at ``now``.

        Within the TTL it does, unless the report names a newer sequence: then
        only when the read is less than :data:`EARLY_REFRESH` old and the
        sequence more than :data:`NEAR_FUTURE` above it (never issued since:
        refused from the cache, at no cost).
        """
        at, served, _ = cached
        age = now - at
        if age > self._ttl:
            return False
        if served is None or sequence <= served.sequence:
            return True
        return age < EARLY_REFRESH and sequence > served.sequence + NEAR_FUTURE

    def _reader(self) -> Registry:
        if self._pinned is not None:
            try:
                if self._pinned.trusted_keys():
                    return self._pinned
            except EdgeregError:
                pass
            if not self._said:
                self._said = True
                log.warning(
                    "no publisher key is pinned: reports are checked against rollout states "
                    "verified with the registry's own keys/ only"
                )
        return self._own

    def _read(self, unit: str) -> ServedUnit | None:
        reader = self._reader()
        try:
            state, _ = reader.read_state(unit)
        except StorageError:
            raise
        except EdgeregError as exc:
            # A state that does not verify serves nothing a report could describe.
            log.warning("reports for %s are refused: its state does not verify: %s", unit, exc)
            return None
        if state is None:
            return None
        return ServedUnit.from_state(
            state, reader.manifest_tiers(unit), self._releases(reader, unit, state)
        )

    def _releases(
        self, reader: Registry, unit: str, state: RolloutState
    ) -> dict[str, ReleaseFacts]:
        """What each version the state names holds (release records never change: kept)."""
        versions = {v for v in (state.stable, state.candidate) if v}
        versions.update(
            v for event in state.history for v in (event.after.stable, event.after.candidate) if v
        )
        found: dict[str, ReleaseFacts] = {}
        for version in sorted(versions):
            key = (unit, version)
            with self._lock:
                facts = self._release_facts.get(key)
            if facts is None:
                try:
                    facts = ReleaseFacts.of(reader.read_release(unit, version))
                except NotFound:
                    continue  # a registry written by hand, with manifests and no records
                except StorageError:
                    raise
                except EdgeregError as exc:
                    # Checked by its arm's version only: a record that does not verify
                    # serves nothing a finer check could rest on.
                    log.warning(
                        "release %s %s is not read for report checks: %s", unit, version, exc
                    )
                    continue
                with self._lock:
                    self._release_facts[key] = facts
            found[version] = facts
        return found
