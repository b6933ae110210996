"""The automatic rollout rule: what `edgereg rollout --auto` does, given the state and the analysis.

Pure: the state, the canary analysis and the time in, one :class:`AutoDecision`
out; :func:`apply` turns it into the next signed state through the ordinary
transitions (so every rule of a manual move holds) and marks the history event
automatic, with the analysis as its evidence.

The rules, first match wins:

1. no rollout in progress (no candidate), or it is paused: nothing to do. A
   pause is a person's call, or an earlier automatic halt; only a person resumes;
2. a critical guardrail fails: roll back (``rollback_on_critical``) or pause, at
   once, whatever the soak time. A first release (no stable release under the
   candidate) is judged by the guardrails' absolute limits alone, so it too
   halts when it crash-loops or fails its probe on most devices;
3. no stable release under the candidate: otherwise wait; nothing to compare
   latencies with, so a person promotes it;
4. the soak time at this step has not passed: wait;
5. every guardrail passes: the next step of the policy, or promote after the last;
6. ``max_soak_hours`` at this step have passed (and the policy does not
   ``require_proof``), no guardrail fails, and every one not proven was
   observed (``min_networks`` per arm beyond the tolerated ones, most of the
   arm past the revert window) with no harm shown whichever tolerated
   networks are set aside, and each unproven estimate is within its limit
   (a harm too small for the evidence to show at this size is not a harm too
   large to see: a ten-fold slowdown on 13 devices shows nothing an anytime-valid
   test can fail on, and its estimate says so): the next step, or promote after
   the last. The history names what was unproven
   and the largest harm its evidence leaves open. A tier too small to be
   judged alone counts through the pool of every tier (its fails still halt).
   A fleet too small to prove its limits moves as Argo Rollouts and Flagger
   do, after a soak without harm; a harm the evidence shows still fails at
   rule 2 first;
7. otherwise wait, saying what is missing.

:func:`run_auto` is the whole workflow on a registry: read the verified state,
analyse when the rules need it, decide, and sign the move; `edgereg rollout
--auto` prints its :class:`AutoResult`, and the fleet simulator calls it with
its own clock.

Each outcome but the moves is a no-op, and every move ends in a state where the
rule says wait (new step: soak time restarts) or nothing (paused, promoted,
rolled back), so running it twice in a row changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from edgereg.config import RolloutPolicy
from edgereg.protocol.wire import RolloutState
from edgereg.registry._transitions import RolloutError, pause, promote, rollback, set_percent
from edgereg.rollout import check_soak, next_step

if TYPE_CHECKING:
    # Annotations only: the analysis (and numpy) loads with the caller that runs
    # one, not with every registry command (start-up: benchmarks/analyze.py).
    from edgereg.analysis import Analysis, TierAnalysis
    from edgereg.protocol.envelope import Signer
    from edgereg.registry._registry import Registry

AutoAction = Literal["nothing", "wait", "step", "promote", "pause", "rollback"]

#: The actions that change the state.
MOVES: frozenset[str] = frozenset({"step", "promote", "pause", "rollback"})


@dataclass(frozen=True)
class AutoDecision:
    """What an automatic rollout does now, and why.

    Attributes:
        action: nothing / wait (no change), or step / promote / pause / rollback.
        reason: One line for people and for the history note.
        percent: The new percent of a step.
    """

    action: AutoAction
    reason: str
    percent: float | None = None

    @property
    def changes_state(self) -> bool:
        """Whether the decision writes a new state."""
        return self.action in MOVES


def precheck(state: RolloutState | None, model: str) -> AutoDecision | None:
    """A decision that needs no analysis (rule 1), or None when the reports decide."""
    if state is None:
        return AutoDecision("nothing", f"{model} has no release in this registry")
    if state.candidate is None:
        return AutoDecision(
            "nothing",
            f"no rollout in progress: stable is {state.stable or 'none (withdrawn)'}",
        )
    if state.paused:
        return AutoDecision(
            "nothing",
            f"the rollout of {state.candidate} is paused; automatic rollouts never resume "
            f"(edgereg resume {model}, or edgereg rollback {model})",
        )
    return None


def decide(
    state: RolloutState | None,
    model: str,
    analysis: Analysis | None,
    *,
    policy: RolloutPolicy,
    now: datetime,
) -> AutoDecision:
    """What `edgereg rollout --auto` does now (the module docstring lists the rules).

    Args:
        state: The verified rollout state.
        model: The unit.
        analysis: The canary analysis of the state's candidate; None only when
            :func:`precheck` decides without one.
        policy: The unit's rollout policy (steps, soak time, guardrails).
        now: The current time.

    Raises:
        ValueError: no analysis although the state needs one, or one of other versions.
    """
    early = precheck(state, model)
    if early is not None:
        return early
    assert state is not None
    assert state.percent is not None
    if analysis is None:
        raise ValueError("the rollout state needs a canary analysis to decide")
    if (analysis.candidate, analysis.stable) != (state.candidate, state.stable):
        raise ValueError(
            f"the analysis compares {analysis.candidate} with {analysis.stable}, the state "
            f"{state.candidate} with {state.stable}"
        )
    failed = _failed(analysis, critical=True)
    if analysis.verdict == "fail":
        if policy.guardrails.rollback_on_critical:
            return AutoDecision("rollback", f"critical guardrail failed: {failed}")
        return AutoDecision("pause", f"critical guardrail failed: {failed}")
    if state.stable is None:
        return AutoDecision(
            "wait",
            f"{state.candidate} is a first release: judged by the absolute limits only "
            "(none is failing); promote or roll it back by hand",
        )
    since = state.last_change_at()
    remaining = check_soak(since, now, timedelta(hours=policy.min_soak_hours)) if since else None
    if remaining is not None:
        return AutoDecision(
            "wait",
            f"soaking at {state.percent:g}%: {_duration(remaining)} of the minimum "
            f"{policy.min_soak_hours:g} h left",
        )
    target = next_step(policy.steps, state.percent)
    if analysis.verdict == "pass":
        if target is None:
            return AutoDecision("promote", f"every guardrail passes at {state.percent:g}%")
        return AutoDecision(
            "step", f"every guardrail passes at {state.percent:g}%: on to {target:g}%", target
        )
    unclear = _unclear(analysis)
    if policy.require_proof:
        return AutoDecision("wait", f"not every guardrail passes yet: {unclear}")
    left = (
        check_soak(since, now, timedelta(hours=policy.max_soak_hours))
        if since is not None
        else None
    )
    harmful = _not_harmless(analysis)
    if left is not None or harmful:
        why = (
            f"after {policy.max_soak_hours:g} h ({_duration(left)} left) it goes on if no "
            "guardrail fails and each saw enough networks"
            if left is not None
            else f"past {policy.max_soak_hours:g} h, but {harmful}"
        )
        return AutoDecision("wait", f"not every guardrail passes yet: {unclear}; {why}")
    soaked = f" in {_duration(now - since)}" if since is not None else ""
    unproven = f"no harm{soaked} at {state.percent:g}%, unproven: {_unproven(analysis)}"
    over = _estimated_over(analysis)
    if over:
        move = "promotes" if target is None else f"goes to {target:g}%"
        return AutoDecision(
            "wait",
            f"not every guardrail passes yet: {unclear}; unproven, a rollout {move} only "
            f"when each estimate is within its limit, and {over} (promote or roll back "
            "by hand)",
        )
    if target is None:
        return AutoDecision("promote", unproven)
    return AutoDecision("step", f"{unproven}: on to {target:g}%", target)


def apply(
    decision: AutoDecision,
    state: RolloutState | None,
    model: str,
    *,
    analysis: Analysis | None,
    policy: RolloutPolicy,
    now: datetime,
    expires: datetime,
    actor: str,
    expected_sequence: int | None,
) -> RolloutState:
    """The next state of a decision that changes it, marked automatic with its evidence.

    Args:
        expected_sequence: The sequence of the state that was analysed; a
            different one means someone moved the rollout meanwhile.

    Raises:
        RolloutError: the state changed since the analysis, or the move is not
            allowed (the transition's own rules).
    """
    if not decision.changes_state:
        raise ValueError(f"{decision.action!r} does not change the state")
    if state is None or state.sequence != expected_sequence:
        raise RolloutError(
            f"the rollout state of {model} changed while the reports were analysed "
            f"(sequence {state.sequence if state else 'none'}, analysed {expected_sequence})",
            hint="Run `edgereg rollout --auto` again: it decides on the new state.",
        )
    if decision.action == "step":
        new = set_percent(
            state, model, decision.percent, policy=policy, now=now, expires=expires, actor=actor
        )
    elif decision.action == "promote":
        new = promote(state, model, now=now, expires=expires, actor=actor)
    elif decision.action == "pause":
        new = pause(state, model, now=now, expires=expires, actor=actor)
    else:
        new = rollback(
            state, model, to_version=None, published=set(), now=now, expires=expires, actor=actor
        )
    event = new.history[-1]
    note = f"automatic: {decision.reason}"
    if event.note:
        note = f"{note}; {event.note}"
    evidence = analysis.evidence() if analysis is not None else None
    marked = event.model_copy(update={"automatic": True, "evidence": evidence, "note": note})
    return new.model_copy(update={"history": [*new.history[:-1], marked]})


@dataclass(frozen=True)
class AutoResult:
    """What :func:`run_auto` did.

    Attributes:
        model: The unit (a model or a bundle).
        decision: The rule's decision and its reason.
        state: The rollout state now: the new one after a move, else the one read.
        analysis: The canary analysis the decision rests on; None when the
            rules decided without one (nothing in progress, paused, no stable).
    """

    model: str
    decision: AutoDecision
    state: RolloutState
    analysis: Analysis | None

    @property
    def halted(self) -> bool:
        """A critical guardrail failed and the rollout was paused or rolled back."""
        return self.decision.action in ("pause", "rollback")


def run_auto(
    registry: Registry,
    model: str,
    *,
    policy: RolloutPolicy,
    analyse: Callable[[RolloutState, datetime], Analysis],
    now: datetime,
    signers: Callable[[], Signer | Sequence[Signer]],
    actor: str,
    expires_days: int,
) -> AutoResult:
    """One automatic rollout step: analyse, then step, promote, halt or wait.

    Safe to repeat (the module docstring says why); never prints.

    Args:
        registry: The registry, verifying against the pinned publisher keys.
        model: The unit whose rollout to move.
        policy: Its rollout policy (steps, soak time, guardrails).
        analyse: The canary analysis of a state with a candidate and a stable
            at ``now``; called only when the rules need the reports (usually
            :func:`edgereg.reports.canary.rollout_analysis` over a report store).
        now: The current time, for the analysis and the soak time.
        signers: Called only when the decision moves the rollout, so a run
            with nothing to do needs no signing key.
        actor: Who acts, for the history.
        expires_days: The new state's validity.

    Raises:
        RolloutError: the unit has no release in this registry, the state
            changed during the analysis, or the move is not allowed.
        TrustError, StorageError: reading or writing the registry.
    """
    state, _ = registry.read_state(model)
    if state is None:
        # A misspelt name in a cron line should fail loudly, not "wait" forever.
        raise RolloutError(
            f"model '{model}' has no release in this registry",
            hint=f"Publish one first: edgereg publish {model} --canary 5%",
        )
    analysis = None
    decision = precheck(state, model)
    if decision is None:
        analysis = analyse(state, now)
        decision = decide(state, model, analysis, policy=policy, now=now)
    if not decision.changes_state:
        return AutoResult(model, decision, state, analysis)
    expected = state.sequence
    chosen = decision
    new_state = registry.change(
        model,
        lambda current, when, expires: apply(
            chosen,
            current,
            model,
            analysis=analysis,
            policy=policy,
            now=when,
            expires=expires,
            actor=actor,
            expected_sequence=expected,
        ),
        signer=signers(),
        expires_days=expires_days,
    )
    return AutoResult(model, decision, new_state, analysis)


def _failed(analysis: Analysis, *, critical: bool) -> str:
    # A fail counts wherever it shows: in a tier, or only in the pool of every tier.
    pool = (analysis.pool,) if analysis.pool is not None else ()
    return "; ".join(
        f"{_where(tier)} {result.name} ({result.reason})"
        for tier in (*analysis.tiers, *pool)
        for result in tier.guardrails
        if result.verdict == "fail" and result.critical == critical
    )


def _where(tier: TierAnalysis) -> str:
    return tier.label


def _unclear(analysis: Analysis) -> str:
    names = [
        f"{_where(tier)} {result.name}"
        + (" failed (not critical)" if result.verdict == "fail" else " inconclusive")
        for tier in analysis.judged
        for result in tier.guardrails
        if result.verdict != "pass"
    ]
    pooled = [tier.tier for tier in analysis.tiers if tier.pooled]
    shown = ", ".join(names[:6])
    shown += f" and {len(names) - 6} more" if len(names) > 6 else ""
    if pooled:
        shown += (
            f" (too few networks to be judged alone, so judged within the pool: "
            f"{', '.join(pooled)})"
        )
    return shown


def _not_harmless(analysis: Analysis) -> str:
    """Why a step after max_soak_hours cannot happen (a fail, or too little seen), or ""."""
    failed = [
        f"{_where(tier)} {result.name} failed"
        for tier in (*analysis.tiers, *analysis.judged)
        for result in tier.guardrails
        if result.verdict == "fail"
    ]
    thin = [
        f"{_where(tier)} {result.name}"
        for tier in analysis.judged
        for result in tier.guardrails
        if not result.harmless and result.verdict != "fail"
    ]
    parts = []
    if failed:
        parts.append(", ".join(dict.fromkeys(failed)))
    if thin:
        shown = ", ".join(thin[:4]) + (f" and {len(thin) - 4} more" if len(thin) > 4 else "")
        parts.append(f"not observed without harm on min_networks per arm yet: {shown}")
    if not analysis.judged:
        parts.append("no tier has the networks to be judged, alone or pooled")
    return "; ".join(parts)


def _estimated_over(analysis: Analysis) -> str:
    """The unproven guardrails whose estimate is beyond the limit, or "".

    Every step without proof asks it: of the pool of every tier (a sole
    tier's own), whose arms are the rollout's largest, so that a good
    candidate's estimate is rarely beyond the limit there by chance, and one
    that is worse than the limit, which no test could show at this fleet size,
    waits for a person instead of reaching more devices; and of every tier judged
    alone, whether its estimate is clearly beyond the limit (its one-look 95 %
    interval beyond it): a harm confined to one tier, which the pool dilutes.
    Each estimate is read with the tolerated networks most against the candidate
    set aside (:attr:`~edgereg.analysis.GuardrailResult.beyond_limit`): a hold is a
    claim of harm, which forged failures must not make.
    """
    estimated = analysis.estimated
    if estimated is None:
        return "no tier has reported"
    over = [
        f"{_where(estimated)} {result.name} is {result.beyond_limit}"
        for result in estimated.guardrails
        if result.verdict != "pass" and result.beyond_limit is not None
    ]
    if estimated is not (analysis.tiers[0] if len(analysis.tiers) == 1 else None):
        over += [
            f"{tier.tier} {result.name} is {result.clearly_beyond_limit}"
            for tier in analysis.tiers
            if not tier.pooled
            for result in tier.guardrails
            if result.verdict != "pass" and result.clearly_beyond_limit is not None
        ]
    return ", ".join(over)


def _unproven(analysis: Analysis) -> str:
    """Each guardrail a step after max_soak_hours passes unproven, with the harm left open."""
    names = [
        f"{_where(tier)} {result.name}"
        + (f" (up to {result.harm_left_open})" if result.harm_left_open else "")
        for tier in analysis.judged
        for result in tier.guardrails
        if result.verdict == "inconclusive"
    ]
    shown = ", ".join(names[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _duration(delta: timedelta) -> str:
    minutes = max(1, int(delta.total_seconds() // 60))
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"
