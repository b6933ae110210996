"""Rollout state transitions: pure functions from one signed state to the next.

Every transition takes the current state and the time, returns the new state
with its sequence raised by one and a history event appended, or raises a
:class:`RolloutError` that says why the move is not allowed and what to do.
The publisher wraps them with storage and signing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import semver

from edgereg.errors import EdgeregError, ExitCode
from edgereg.protocol.fields import basis_points
from edgereg.protocol.wire import Action, HistoryEvent, RolloutState
from edgereg.rollout import check_soak, next_step

if TYPE_CHECKING:
    from edgereg.config import RolloutPolicy

#: History is kept in the signed state; beyond this many events the oldest go.
HISTORY_LIMIT = 200


#: The state fields of a rollout in progress, cleared when it ends (promote, rollback).
_NO_ROLLOUT: dict[str, object] = {
    "candidate": None,
    "percent": None,
    "salt": None,
    "paused": False,
    "full": False,
}


class RolloutError(EdgeregError):
    """A rollout command is not allowed in the current state."""

    exit_code = ExitCode.ROLLOUT_REFUSED


def _advance(
    state: RolloutState | None,
    model: str,
    *,
    now: datetime,
    expires: datetime,
    actor: str,
    action: Action,
    forced: bool = False,
    note: str | None = None,
    end_rollout: bool = False,
    **changes: object,
) -> RolloutState:
    if state is None:
        base = RolloutState(model=model, sequence=1, expires=expires)
        sequence = 1
        before = base.snapshot()
        fields = base.model_dump()
    else:
        sequence = state.sequence + 1
        before = state.snapshot()
        fields = state.model_dump()
    if end_rollout:
        fields.update(_NO_ROLLOUT)
    fields.update(changes)
    fields.update(sequence=sequence, expires=expires)
    draft = RolloutState.model_validate({**fields, "history": []})
    event = HistoryEvent(
        sequence=sequence,
        at=now,
        actor=actor,
        action=action,
        before=before,
        after=draft.snapshot(),
        forced=forced,
        note=note,
    )
    history = [*(state.history if state else []), event][-HISTORY_LIMIT:]
    return draft.model_copy(update={"history": history})


def check_new_version(state: RolloutState | None, version: str) -> None:
    """A new release must be newer than both the stable and the candidate."""
    if state is None:
        return
    new = semver.Version.parse(version)
    for role, current in (("stable", state.stable), ("candidate", state.candidate)):
        if current is not None and new <= semver.Version.parse(current):
            raise RolloutError(
                f"version {version} is not greater than the {role} version {current}",
                hint="Bump `version` in models.toml (or pass --version) to a higher semver.",
            )


def check_publish(
    state: RolloutState | None, model: str, version: str, *, percent: float | None, full: bool
) -> None:
    """Refuse a publish before anything is written (see :func:`publish` for the rules).

    Raises:
        RolloutError: the version is not new, neither or both of percent and
            full, or a candidate with no stable under it would be replaced.
    """
    check_new_version(state, version)
    if full == (percent is not None):
        raise RolloutError("choose exactly one of --canary PERCENT and --full")
    if state is not None and state.candidate is not None and state.stable is None:
        assert state.percent is not None
        raise RolloutError(
            f"{model} {state.candidate} is a candidate at {state.percent:g}% with no stable "
            f"release; publishing {version} would replace it, and the devices that run "
            f"{state.candidate} now would get no model unless they fall in the new cohort",
            hint=f"Make it stable first (edgereg promote {model}; a canary needs "
            f"`edgereg rollout {model} --next` or --force), or withdraw it "
            f"(edgereg rollback {model}), then publish again.",
        )


def publish(
    state: RolloutState | None,
    model: str,
    version: str,
    *,
    percent: float | None,
    full: bool,
    salt: str,
    now: datetime,
    expires: datetime,
    actor: str,
) -> RolloutState:
    """Start the rollout of a new release: a canary at ``percent``, or everyone with ``full``.

    Rules (docs/release.md, "What devices get"):

    - The first release of a model published ``full`` (no stable yet) becomes
      the stable release for every device at once.
    - Otherwise a ``full`` release goes to 100 % of devices as candidate and
      may be promoted at once; a canary must be rolled out before it is promoted.
    - A candidate in flight is replaced by the newer release only when there is
      a stable release: the devices of the old cohort go back to stable, which
      they had before. Without a stable the old candidate is all those devices
      have, so the publish is refused until it is promoted or rolled back.
    """
    check_publish(state, model, version, percent=percent, full=full)
    if full and (state is None or state.stable is None):
        return _advance(
            state,
            model,
            now=now,
            expires=expires,
            actor=actor,
            action="publish",
            note="first release, published --full: stable for every device",
            end_rollout=True,
            stable=version,
        )
    note = None
    if state is not None and state.candidate is not None:
        note = (
            f"replaces candidate {state.candidate} at {state.percent:g}%; its cohort goes "
            f"back to stable {state.stable}"
        )
    return _advance(
        state,
        model,
        now=now,
        expires=expires,
        actor=actor,
        action="publish",
        note=note,
        candidate=version,
        percent=100.0 if full else percent,
        salt=salt,
        paused=False,
        full=full,
    )


def _require_candidate(state: RolloutState | None, model: str, command: str) -> RolloutState:
    if state is None:
        raise RolloutError(
            f"model '{model}' has no release in this registry",
            hint=f"Publish one first: edgereg publish {model} --canary 5%",
        )
    if state.candidate is None:
        raise RolloutError(
            f"model '{model}' has no rollout in progress (stable is "
            f"{state.stable or 'none: the model is withdrawn'}); nothing to {command}",
            hint=f"Publish a new version first: edgereg publish {model} --canary 5%",
        )
    return state


def set_percent(
    state: RolloutState | None,
    model: str,
    percent: float | None,
    *,
    policy: RolloutPolicy,
    now: datetime,
    expires: datetime,
    actor: str,
    force: bool = False,
) -> RolloutState:
    """Move the candidate to ``percent``, or to the policy's next step when None.

    Raising the percent before the soak time has passed is refused unless
    ``force``; a forced move is marked in the history.
    """
    current = _require_candidate(state, model, "roll out")
    assert current.percent is not None
    if current.paused:
        raise RolloutError(
            f"the rollout of {model} {current.candidate} is paused",
            hint=f"Resume it first: edgereg resume {model}",
        )
    if percent is None:
        percent = next_step(policy.steps, current.percent)
        if percent is None:
            raise RolloutError(
                f"{model} {current.candidate} is already at {current.percent:g}%, the last "
                "step of the rollout policy",
                hint=f"Make it stable for everyone: edgereg promote {model}",
            )
    if basis_points(percent) == basis_points(current.percent):
        raise RolloutError(f"{model} {current.candidate} is already at {percent:g}%")
    forced = False
    if percent > current.percent:
        since = current.last_change_at()
        remaining = (
            check_soak(since, now, timedelta(hours=policy.min_soak_hours)) if since else None
        )
        if remaining is not None:
            if not force:
                raise RolloutError(
                    f"{model} {current.candidate} has been at {current.percent:g}% for less "
                    f"than the minimum soak time of {policy.min_soak_hours:g} h; "
                    f"{_duration(remaining)} left",
                    hint="Wait, or pass --force (recorded in the history).",
                )
            forced = True
    return _advance(
        current,
        model,
        now=now,
        expires=expires,
        actor=actor,
        action="rollout",
        forced=forced,
        percent=percent,
    )


def promote(
    state: RolloutState | None,
    model: str,
    *,
    now: datetime,
    expires: datetime,
    actor: str,
    force: bool = False,
) -> RolloutState:
    """Make the candidate stable for every device.

    Only a candidate that was rolled out beyond its canary (or published
    ``--full``) may be promoted; ``force`` overrides and is recorded.
    """
    current = _require_candidate(state, model, "promote")
    rolled_out = False
    # Only rollouts since this candidate was (last) published count: a version
    # dropped by a rollback and published again starts over as a canary.
    for event in reversed(current.history):
        if event.action == "publish" and event.after.candidate == current.candidate:
            break
        if event.action == "rollout" and event.after.candidate == current.candidate:
            rolled_out = True
            break
    forced = False
    if not (rolled_out or current.full):
        if not force:
            raise RolloutError(
                f"{model} {current.candidate} is still a {current.percent:g}% canary and has "
                "never been rolled out further",
                hint=f"Roll it out first (edgereg rollout {model} --next), or pass --force.",
            )
        forced = True
    return _advance(
        current,
        model,
        now=now,
        expires=expires,
        actor=actor,
        action="promote",
        forced=forced,
        stable=current.candidate,
        end_rollout=True,
    )


def rollback(
    state: RolloutState | None,
    model: str,
    *,
    to_version: str | None,
    published: set[str],
    now: datetime,
    expires: datetime,
    actor: str,
) -> RolloutState:
    """Drop the candidate, or with ``to_version`` restore an older stable release.

    Dropping a candidate that has no stable release under it withdraws the
    model: every tier's manifest then offers no entry (signed), so devices stop
    installing the dropped version.

    Args:
        published: versions with a release record in the registry.
    """
    if to_version is None:
        current = _require_candidate(state, model, "roll back")
        note = f"dropped candidate {current.candidate}"
        if current.stable is None:
            note += "; no stable release: the model is withdrawn from every tier"
        return _advance(
            current,
            model,
            now=now,
            expires=expires,
            actor=actor,
            action="rollback",
            note=note,
            end_rollout=True,
        )
    if state is None:
        raise RolloutError(f"model '{model}' has no release in this registry")
    if to_version not in published:
        listed = ", ".join(sorted(published, key=semver.Version.parse)) or "none"
        raise RolloutError(f"{model} {to_version} was never published here (published: {listed})")
    if to_version == state.stable and state.candidate is None:
        raise RolloutError(f"{model} {to_version} is already the stable release")
    # Going forward is not a rollback: it would make a version stable for every
    # device without the canary and rollout that promote requires.
    if state.stable is None or semver.Version.parse(to_version) > semver.Version.parse(
        state.stable
    ):
        raise RolloutError(
            f"{model} {to_version} is not older than the stable release "
            f"({state.stable or 'none yet'}); --to-version only goes back",
            hint=f"To move forward, roll the candidate out and promote it (edgereg promote "
            f"{model}), or publish a new version.",
        )
    return _advance(
        state,
        model,
        now=now,
        expires=expires,
        actor=actor,
        action="rollback",
        note=f"stable {state.stable} -> {to_version}",
        stable=to_version,
        end_rollout=True,
    )


def pause(
    state: RolloutState | None, model: str, *, now: datetime, expires: datetime, actor: str
) -> RolloutState:
    """Stop handing out the candidate: every device gets stable until resumed."""
    current = _require_candidate(state, model, "pause")
    if current.paused:
        raise RolloutError(f"the rollout of {model} {current.candidate} is already paused")
    return _advance(
        current, model, now=now, expires=expires, actor=actor, action="pause", paused=True
    )


def resume(
    state: RolloutState | None, model: str, *, now: datetime, expires: datetime, actor: str
) -> RolloutState:
    """Hand the candidate out again at its percent."""
    current = _require_candidate(state, model, "resume")
    if not current.paused:
        raise RolloutError(f"the rollout of {model} {current.candidate} is not paused")
    return _advance(
        current, model, now=now, expires=expires, actor=actor, action="resume", paused=False
    )


def resign(
    state: RolloutState | None, model: str, *, now: datetime, expires: datetime, actor: str
) -> RolloutState:
    """Renew the expiry (and the signatures) without changing what apps get."""
    if state is None:
        raise RolloutError(f"model '{model}' has no release in this registry")
    return _advance(state, model, now=now, expires=expires, actor=actor, action="resign")


def _duration(delta: timedelta) -> str:
    minutes = max(1, int(delta.total_seconds() // 60))
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"
