"""Health confirmation and local revert: a model that crash-loops the app is put back.

The app confirms a model after its first real inference succeeds
(:meth:`HealthLedger.confirm`, like CodePush's ``notifyAppReady``) and calls
:meth:`HealthLedger.app_started` once at every start. A start counts against an
install when it ran with the install unconfirmed and ended without a
confirmation (counted at the next start), whichever order the app calls
``app_started`` and installs in. A model installed and not confirmed over
``max_unconfirmed_starts`` such starts (declared by the app, default 3) is a
crash loop: at the next start the ledger answers with a :class:`Revert` to the
last confirmed version, and marks the unconfirmed one bad on this device so it
is never installed again (docs/protocol.md §11).

The rule is pure (:func:`on_install`, :func:`on_start`, :func:`on_confirm` over
:class:`UnitHealth`); the ledger is its thin shell over ``health.json`` in
the cache directory, written atomically.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgereg.client._cache import CacheError, read_state_file, write_state_file

__all__ = [
    "DEFAULT_MAX_UNCONFIRMED_STARTS",
    "HealthLedger",
    "Revert",
    "UnitHealth",
    "on_confirm",
    "on_install",
    "on_reverted",
    "on_start",
]

_log = logging.getLogger(__name__)

DEFAULT_MAX_UNCONFIRMED_STARTS = 3
_FILE = "health.json"
_BAD_KEPT = 32
"""Bad versions remembered per unit (versions only grow, so old ones do not come back)."""


@dataclass(frozen=True)
class Revert:
    """The decision to put a unit back to its last good version.

    Attributes:
        unit: The model or bundle.
        version: The unconfirmed version, now marked bad.
        to_version: The last confirmed version, or None when there is none
            (the app falls back to what it ships, or to no model).
        starts: Starts that ran the install and ended without a confirmation.
    """

    unit: str
    version: str
    to_version: str | None
    starts: int

    @property
    def reason(self) -> str:
        """One line for logs and reports."""
        return f"{self.unit} {self.version} not confirmed after {self.starts} app starts"


@dataclass(frozen=True)
class UnitHealth:
    """What the ledger knows of one unit.

    Attributes:
        installed: The version installed now (None before the first).
        confirmed: Whether ``installed`` was confirmed.
        starts: App starts that ran ``installed`` unconfirmed and ended (the
            report's ``unconfirmed_starts``).
        running: A start that may run ``installed`` is under way and has not
            confirmed it: the app called ``app_started`` with it installed, or
            installed it after calling ``app_started`` in this process. The
            next start counts it (it ended without a confirmation).
        last_good: The latest confirmed version.
        reverting: A revert decided but not yet carried out (said again at
            every start until :func:`on_reverted`).
        bad: Versions marked bad on this device -> why.
    """

    installed: str | None = None
    confirmed: bool = False
    starts: int = 0
    running: bool = False
    last_good: str | None = None
    reverting: Revert | None = None
    bad: dict[str, str] = field(default_factory=dict)


def on_install(health: UnitHealth, version: str, *, during_start: bool = False) -> UnitHealth:
    """A new version was installed: it waits for a confirmation, its starts count from zero.

    ``during_start``: the app already called ``app_started`` in this process (an
    app start under way, which may run the new version): when it ends without a
    confirmation, the next start counts it. An install before ``app_started`` (or
    in a process that never calls it, a background worker) starts no count: the
    next ``app_started`` is the first start that runs it.
    """
    if version == health.installed:
        return health
    return dataclasses.replace(
        health, installed=version, confirmed=False, starts=0, running=during_start
    )


def on_start(
    health: UnitHealth, unit: str, max_unconfirmed_starts: int
) -> tuple[UnitHealth, Revert | None]:
    """The app started. Returns the new health and a revert to carry out, if one is due.

    The start under way before this one (``running``) ended without a
    confirmation: it counts one. A revert is due when the installed version was
    not confirmed over ``max_unconfirmed_starts`` such starts: this start must
    not load it. Otherwise this start runs it, and the next start counts it
    unless it is confirmed first.
    """
    if health.reverting is not None:
        return health, health.reverting
    if health.installed is None or health.confirmed:
        return health, None
    starts = health.starts + 1 if health.running else health.starts
    if starts >= max_unconfirmed_starts:
        revert = Revert(unit, health.installed, health.last_good, starts)
        bad = {**health.bad, health.installed: revert.reason}
        for old in list(bad)[:-_BAD_KEPT]:
            del bad[old]
        return dataclasses.replace(
            health, starts=starts, running=False, reverting=revert, bad=bad
        ), revert
    return dataclasses.replace(health, starts=starts, running=True), None


def on_confirm(health: UnitHealth, version: str | None = None) -> tuple[UnitHealth, bool]:
    """The app's first real inference succeeded. Returns the new health and whether it changed.

    ``version``, when given, must be the installed one: a confirmation of the
    model loaded before an update arrived does not vouch for the update.
    """
    if health.installed is None or health.confirmed or health.reverting is not None:
        return health, False
    if version is not None and version != health.installed:
        return health, False
    return dataclasses.replace(
        health, confirmed=True, running=False, last_good=health.installed
    ), True


def on_reverted(health: UnitHealth, to_version: str | None = None) -> UnitHealth:
    """The client switched back to ``to_version`` (None: to nothing installed).

    Whether the revert was the ledger's or the app's own (``Client.revert``),
    the version left is confirmed only when it is the last good one; any other
    starts its count again.
    """
    bad = dict(health.bad)
    if health.reverting is None and health.installed is not None and not health.confirmed:
        # The app reverted on its own: the version it left is bad too.
        bad[health.installed] = f"{health.installed} reverted by the app"
    return dataclasses.replace(
        health,
        installed=to_version,
        confirmed=to_version is not None and to_version == health.last_good,
        starts=0,
        running=False,
        reverting=None,
        bad=bad,
    )


class HealthLedger:
    """The health rule over ``health.json`` in the client's cache directory.

    Args:
        cache_dir: The client's cache directory.
        max_unconfirmed_starts: App starts a new model gets to be confirmed
            before it is reverted (at least 1).
    """

    def __init__(
        self, cache_dir: Path | str, *, max_unconfirmed_starts: int = DEFAULT_MAX_UNCONFIRMED_STARTS
    ) -> None:
        if (
            isinstance(max_unconfirmed_starts, bool)
            or not isinstance(max_unconfirmed_starts, int)
            or max_unconfirmed_starts < 1
        ):
            raise ValueError(
                "max_unconfirmed_starts must be a whole number >= 1, "
                f"got {max_unconfirmed_starts!r}"
            )
        self.path = Path(cache_dir) / _FILE
        self.max_unconfirmed_starts = max_unconfirmed_starts

    def health(self, unit: str) -> UnitHealth:
        """What is known of ``unit`` (all defaults when nothing is)."""
        return self._read().get(unit, UnitHealth())

    def installed(self, unit: str, version: str, *, during_start: bool = False) -> None:
        """Record that ``version`` of ``unit`` was just installed (after its self-test).

        ``during_start``: the app called ``app_started`` in this process before
        (:func:`on_install`).
        """
        self._update(unit, lambda h: on_install(h, version, during_start=during_start))

    def app_started(self, unit: str) -> Revert | None:
        """Count the start before, if it ran the unconfirmed install; returns the revert due.

        Call once per start, before loading the model. Until :meth:`reverted`
        is called, every start returns the same revert.
        """
        decided: list[Revert | None] = [None]

        def step(health: UnitHealth) -> UnitHealth:
            new, decided[0] = on_start(health, unit, self.max_unconfirmed_starts)
            return new

        self._update(unit, step)
        if decided[0] is not None:
            _log.warning(
                "crash loop: %s; reverting to %s",
                decided[0].reason,
                decided[0].to_version or "no model",
            )
        return decided[0]

    def confirm(self, unit: str, version: str | None = None) -> bool:
        """The app's first real inference with the installed model succeeded.

        Returns:
            True when this confirmed a model that was waiting for it.
        """
        changed: list[bool] = [False]

        def step(health: UnitHealth) -> UnitHealth:
            new, changed[0] = on_confirm(health, version)
            return new

        self._update(unit, step)
        return changed[0]

    def reverted(self, unit: str, to_version: str | None) -> None:
        """The client switched ``unit`` back to ``to_version`` (a revert, asked for or not)."""
        self._update(unit, lambda h: on_reverted(h, to_version))

    def is_bad(self, unit: str, version: str) -> bool:
        """Whether ``version`` was marked bad on this device (never install it again)."""
        return version in self.health(unit).bad

    # -- file ------------------------------------------------------------------------

    def _update(self, unit: str, step: Callable[[UnitHealth], UnitHealth]) -> None:
        units = self._read()
        before = units.get(unit, UnitHealth())
        after = step(before)
        if after != before:
            units[unit] = after
            self._write(units)

    def _read(self) -> dict[str, UnitHealth]:
        try:
            raw = read_state_file(self.path, "health")
            if raw is None:
                return {}
            return {name: _from_json(value) for name, value in raw["units"].items()}
        except (CacheError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Losing the counters only gives a new model a few more starts.
            _log.warning("health ledger %s unreadable (%s): starting afresh", self.path, exc)
            return {}

    def _write(self, units: dict[str, UnitHealth]) -> None:
        body = {"schema_version": 1, "units": {n: _to_json(h) for n, h in sorted(units.items())}}
        try:
            write_state_file(self.path, body)
        except CacheError as exc:
            # A full disk must not fail the install it records; the cost is that
            # this install's starts go uncounted (no automatic revert for it).
            _log.warning("health ledger %s cannot be written: %s", self.path, exc)


def _to_json(health: UnitHealth) -> dict[str, Any]:
    return dataclasses.asdict(health)


def _from_json(value: dict[str, Any]) -> UnitHealth:
    reverting = value.get("reverting")
    return UnitHealth(
        installed=_optional_str(value.get("installed")),
        # Only a JSON true is true: bool("false") is True, and a flag read wrong would
        # confirm an install or count a start nobody ran.
        confirmed=value.get("confirmed") is True,
        starts=int(value.get("starts", 0)),
        # A ledger written before this key counted each start as it began: its count
        # already holds the start under way, so the next start adds nothing.
        running=value.get("running") is True,
        last_good=_optional_str(value.get("last_good")),
        reverting=None
        if reverting is None
        else Revert(
            unit=str(reverting["unit"]),
            version=str(reverting["version"]),
            to_version=_optional_str(reverting.get("to_version")),
            starts=int(reverting["starts"]),
        ),
        bad={str(k): str(v) for k, v in dict(value.get("bad", {})).items()},
    )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)
