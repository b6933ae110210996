"""The registry: signed releases, rollout state and manifests on a storage backend.

Writes go blobs, then release record, then state, then manifests, each one
atomic, so a crash at any point leaves a registry that verifies, and running
the same command again finishes the job. The state is written with
compare-and-swap: of two concurrent publishers one wins and the other gets a
:class:`~edgereg.errors.ConflictError` and retries.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from edgereg.errors import ConflictError, TrustError
from edgereg.protocol import layout
from edgereg.protocol.envelope import Signer, TrustedKeys, key_id, load_public_key, public_key_pem
from edgereg.protocol.layout import KEYS_PREFIX
from edgereg.protocol.patterns import NAME_RE
from edgereg.protocol.wire import (
    Action,
    AnyRelease,
    BundleRecord,
    HistoryEvent,
    Manifest,
    ReleaseRecord,
    RolloutState,
    W,
    blob_path,
    sign_document,
    verify_document,
    verify_release,
)
from edgereg.registry._errors import ReleaseError
from edgereg.registry._manifests import build_manifests
from edgereg.signing import looks_like_private_key
from edgereg.storage import NotFound, Storage

if TYPE_CHECKING:
    import logging

    # Publishing only: the build outputs and models.toml's schema stay out of the
    # read path (status, history, verify, serve; benchmarks/startup.py).
    from edgereg.registry._bundle import PreparedBundle
    from edgereg.registry._release import PreparedRelease


def _log() -> logging.Logger:
    """This module's logger; logging is imported when a write has something to say.

    `edgereg status` reads and logs nothing: importing logging is ~5 % of its imports.
    """
    import logging

    return logging.getLogger(__name__)


# The registry layout is spelled once, in the protocol.
state_key = layout.state_path
release_key = layout.release_path
manifest_key = layout.manifest_path
public_key_key = layout.public_key_path


def signers_of(signer: Signer | Sequence[Signer]) -> list[Signer]:
    """One signer or several (a key rotation signs with the old and the new key)."""
    signers = [signer] if isinstance(signer, Signer) else list(signer)
    if not signers:
        raise ValueError("at least one signer is needed")
    return signers


class _Keep(Enum):
    """The report URL a state write keeps: the one the current state has."""

    KEEP = "keep"


KEEP = _Keep.KEEP
"""Pass as ``report_url`` to keep the current state's (a command run without models.toml)."""

ReportUrl = str | None | _Keep


def utcnow() -> datetime:
    """The current time, UTC, whole seconds (what the wire format keeps)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


@dataclass(frozen=True)
class PublishResult:
    """What a publish did."""

    model: str
    """The rollout unit: a model, or a bundle."""
    version: str
    state: RolloutState
    uploaded_blobs: int
    uploaded_bytes: int
    already_published: bool
    record: AnyRelease | None = None
    """The release published (a bundle's names its members and their versions)."""


def _same_content(prepared: PreparedRelease | PreparedBundle, existing: AnyRelease) -> bool:
    from edgereg.registry._bundle import PreparedBundle

    if isinstance(prepared, PreparedBundle):
        return prepared.same_content(existing)
    return isinstance(existing, ReleaseRecord) and prepared.same_content(existing)


@dataclass
class VerifyReport:
    """Problems found by :meth:`Registry.verify`; warnings do not fail it."""

    checked: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.errors


class Registry:
    """A model registry on one storage backend.

    Args:
        storage: Where the registry lives.
        trusted: The publisher keys the operator pinned (models.toml
            ``[registry] trusted_keys`` or ``--trusted-key``): the only keys
            whose signatures are accepted, and the only keys that may sign.
            None falls back to the keys published in the registry's own
            ``keys/``, which anyone with write access to the storage can
            plant: only for read-only views without a project (the status
            page); every edgereg command passes pinned keys. A callable is
            called once, on first use (the server opens a registry it never
            verifies, and need not read the keys).
        clock: Returns the current UTC time (tests pass a fixed one).
    """

    def __init__(
        self,
        storage: Storage,
        *,
        trusted: TrustedKeys | Callable[[], TrustedKeys] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.storage = storage
        self._trusted = trusted
        self.pinned = trusted is not None
        # keys/ read once per Registry: a command verifies many documents. A
        # Registry lives for one command (or one status page), so it is fresh.
        self._published_keys: TrustedKeys | None = None
        self.clock = clock

    # -- trust ----------------------------------------------------------------------

    def trusted_keys(self) -> TrustedKeys:
        """The keys signatures are checked against."""
        if callable(self._trusted):
            self._trusted = self._trusted()
        if self._trusted is not None:
            return self._trusted
        return self.published_keys()

    def published_keys(self) -> TrustedKeys:
        """The public keys in the registry's keys/: what apps may download, never trust.

        Files that are not public keys are skipped here; `verify` reports them.
        """
        if self._published_keys is None:
            keys = []
            for key in self.storage.list(KEYS_PREFIX):
                if not layout.is_public_key_path(key):
                    continue
                try:
                    keys.append(load_public_key(self.storage.get(key)))
                except (TrustError, NotFound):
                    continue
            self._published_keys = TrustedKeys(keys)
        return self._published_keys

    def add_public_key(self, signer: Signer) -> bool:
        """Publish the signer's public key under keys/ (True if it was new).

        This is how a key becomes trusted: `edgereg keys generate` calls it.
        Signing commands call :meth:`check_signer` instead, so a wrong key is
        refused rather than quietly added.
        """
        created = self.storage.put_if_absent(public_key_key(signer.key_id), signer.public_pem())
        self._published_keys = None
        return created

    def check_signer(self, signer: Signer | Sequence[Signer]) -> None:
        """Refuse a signing key the registry does not trust yet.

        The first key of an empty registry is accepted (the first publish
        brings it along); after that, only keys already in keys/ may sign.
        A document signed by another key would be rejected by every app that
        trusts the registry's keys, so the key must be added on purpose first.

        Raises:
            TrustError: keys/ holds keys and the signer's is not among them.
        """
        trusted = self.trusted_keys()
        if not trusted and not self.pinned:
            return
        unknown = [one for one in signers_of(signer) if one.key_id not in trusted]
        if not unknown:
            return
        stranger = unknown[0]
        if self.pinned and not trusted:
            self._trust_for_signed()  # raises: no publisher key is pinned
        if self.pinned:
            known = ", ".join(keyid[:12] for keyid in trusted) or "none"
            raise TrustError(
                f"the signing key {stranger.key_id[:12]} is not one of the publisher keys "
                f"pinned in the project ({known}); apps and `edgereg verify` would reject "
                "whatever it signs",
                hint="Sign with a pinned key (--key PATH). A first key: `edgereg keys "
                "generate` makes and pins one; another key: `edgereg keys generate --add`, "
                "or copy its .pub.pem into publisher-keys/ (docs/operations/keys.md).",
            )
        known = ", ".join(keyid[:12] for keyid in trusted)
        raise TrustError(
            f"the signing key {stranger.key_id[:12]} is not one of the keys of registry "
            f"{self.storage.url} ({known}); apps that trust those keys would reject "
            "whatever it signs",
            hint="Sign with the registry's key (--key PATH). To rotate to a new key, add "
            "its public key first: `edgereg keys generate` publishes a new one, or copy "
            f"the .pub.pem to keys/{stranger.key_id}.pem in the registry.",
        )

    # -- reading --------------------------------------------------------------------

    def models(self) -> list[str]:
        """Every rollout unit (model or bundle) with a rollout state, sorted."""
        states = (layout.parse_state_path(key) for key in self.storage.list(layout.MODELS_PREFIX))
        return sorted(name for name in states if name is not None)

    def read_state(self, model: str) -> tuple[RolloutState | None, str | None]:
        """The verified state and its version token, or (None, None) for a new model."""
        try:
            data, token = self.storage.get_versioned(state_key(model))
        except NotFound:
            return None, None
        state = self._verified(RolloutState, state_key(model), data)
        if state.model != model:
            raise TrustError(f"{state_key(model)} is the state of model '{state.model}'")
        return state, token

    def versions(self, model: str) -> list[str]:
        """Every version with a release record, oldest first."""
        import semver  # here: `status` and `pull` list no versions (semver imports argparse)

        prefix = layout.releases_prefix(model)
        found = [
            key[len(prefix) : -len(".json")]
            for key in self.storage.list(prefix)
            if key.endswith(".json")
        ]
        return sorted((v for v in found if semver.Version.is_valid(v)), key=semver.Version.parse)

    def read_release(self, model: str, version: str) -> AnyRelease:
        """A verified release record: a model's, or a bundle's when ``model`` is a bundle."""
        key = release_key(model, version)
        data = self.storage.get(key)
        trusted = self._trust_for_signed()
        try:
            record = verify_release(data, trusted)
        except TrustError as exc:
            raise type(exc)(f"{key}: {exc.message}", hint=exc.hint) from exc
        if record.name != model or record.version != version:
            raise TrustError(f"{key} holds {record.name} {record.version}")
        return record

    def read_manifest(self, model: str, tier: str) -> Manifest:
        """A verified manifest."""
        key = manifest_key(model, tier)
        return self._verified(Manifest, key, self.storage.get(key))

    def _verified(self, cls: type[W], key: str, data: bytes) -> W:
        """Verify a document against the pinned keys; a failure names the object."""
        trusted = self._trust_for_signed()
        try:
            return verify_document(cls, data, trusted)
        except TrustError as exc:
            raise type(exc)(f"{key}: {exc.message}", hint=exc.hint) from exc

    def _trust_for_signed(self) -> TrustedKeys:
        trusted = self.trusted_keys()
        if not trusted:
            if self.pinned:
                raise TrustError(
                    "no publisher key is pinned in the project, so nothing in registry "
                    f"{self.storage.url} can be verified",
                    hint="Run `edgereg keys generate` (it pins its public key in "
                    "publisher-keys/), list your keys in [registry] trusted_keys of "
                    "models.toml, or pass --trusted-key PUBLIC_KEY.pem.",
                )
            raise TrustError(
                f"the registry {self.storage.url} holds no public keys, so nothing in it "
                "can be verified",
                hint="Publish with a key (edgereg keys generate) or pass --trusted-key.",
            )
        return trusted

    # -- publishing -----------------------------------------------------------------

    def publish(
        self,
        prepared: PreparedRelease | PreparedBundle,
        *,
        signer: Signer | Sequence[Signer],
        percent: float | None,
        full: bool,
        actor: str,
        expires_days: int,
        on_step: Callable[[str], None] | None = None,
        report_url: ReportUrl = KEEP,
    ) -> PublishResult:
        """Upload a release of a model or a bundle and start its rollout.

        Idempotent for the same content. A bundle is one rollout unit: one
        state, one sequence, one salt for all its members.

        Args:
            on_step: Told what is being written, for progress output.
            report_url: ``[reports] url`` of models.toml, signed into the state
                (and so into every manifest); :data:`KEEP` keeps the state's.

        Raises:
            ReleaseError: the version exists with other content, or the name
                is a model here and a bundle in the release (or the reverse).
            RolloutError: the version is not above stable and candidate.
            ConflictError: another publisher changed the state meanwhile; retry.
            StorageError: the backend failed; nothing half-written is visible.
        """
        from edgereg.registry import _transitions as transitions

        record = prepared.record
        model, version = record.name, record.version
        signers = signers_of(signer)
        self.check_signer(signers)
        state, token = self.read_state(model)
        self._refuse_lost_state(model, state, publishing=version)
        self._refuse_stale_state(model, state)
        self._check_same_kind(state, record)
        existing = self._existing_release(model, version)
        if existing is not None and not _same_content(prepared, existing):
            raise ReleaseError(
                f"{model} {version} is already published with other content; a version "
                "never changes once published",
                hint="Bump `version` in models.toml (or pass --version).",
            )
        step = on_step or (lambda _: None)
        if (
            existing is not None
            and state is not None
            and version in (state.stable, state.candidate)
        ):
            # Published before; make sure the last step (manifests) happened.
            self._write_manifests(state, signers)
            return PublishResult(model, version, state, 0, 0, already_published=True, record=record)
        transitions.check_publish(state, model, version, percent=percent, full=full)

        # Nothing was written before this point: a refused publish changes nothing.
        with ExitStack() as frozen_blobs:
            # Every artifact is copied and re-hashed before the first write, so a
            # file rewritten since it was checked stops the publish here.
            frozen = {
                digest: frozen_blobs.enter_context(_snapshot(path, digest))
                for digest, path in sorted(prepared.blobs.items())
            }
            # The key goes first, so whatever is signed next can be verified.
            for one in signers:
                self.add_public_key(one)
            uploaded_blobs = uploaded_bytes = 0
            for digest, path in frozen.items():
                step(f"blob {digest[:12]} ({path.stat().st_size / 1e6:.2f} MB)")
                if self.storage.put_file_if_absent(blob_path(digest), path):
                    uploaded_blobs += 1
                    uploaded_bytes += path.stat().st_size
        step(f"release record {version}")
        if existing is None:
            created = self.storage.put_if_absent(
                release_key(model, version), sign_document(record, signers)
            )
            if not created:
                existing = self._existing_release(model, version)
                if existing is None or not _same_content(prepared, existing):
                    raise ConflictError(
                        f"another publisher wrote {model} {version} at the same time",
                        url=self.storage.url,
                        hint="Run the command again.",
                    )
        now = self.clock()
        new_state = transitions.publish(
            state,
            model,
            version,
            percent=percent,
            full=full,
            salt=secrets.token_hex(8),
            now=now,
            expires=now + timedelta(days=expires_days),
            actor=actor,
        )
        step("rollout state and manifests")
        new_state = self._write_state(new_state, token, signers, report_url)
        return PublishResult(
            model,
            version,
            new_state,
            uploaded_blobs,
            uploaded_bytes,
            already_published=False,
            record=record,
        )

    def _refuse_lost_state(
        self, model: str, state: RolloutState | None, *, publishing: str | None = None
    ) -> None:
        """No state, but a history: writing a new one would restart the sequence at 1.

        Devices remember the highest manifest sequence they accepted and refuse
        anything lower as a rollback, so a state restarted at 1 would strand
        every device that ever installed the model. The record of the version
        being published is no history: an interrupted first publish leaves it.
        """
        from edgereg.registry import _transitions as transitions

        if state is not None:
            return
        records = [v for v in self.versions(model) if v != publishing]
        tiers = self.manifest_tiers(model)
        if not records and not tiers:
            return
        found = []
        if records:
            found.append(f"{len(records)} release record(s) ({', '.join(records[-3:])})")
        if tiers:
            found.append(f"manifests for {', '.join(tiers)}")
        raise transitions.RolloutError(
            f"{state_key(model)} is missing in {self.storage.url}, but {' and '.join(found)} "
            f"of {model} exist; a new state would restart at sequence 1 and every device "
            "would refuse it as a rollback",
            hint=f"Restore state.json from a backup, or rebuild it: `edgereg rebuild-state "
            f"{model}` (from the signed manifests; `--reset` starts an empty, recorded state "
            "above their highest sequence when no manifest is left).",
        )

    def newest_manifest(self, model: str) -> Manifest | None:
        """The verified manifest of ``model`` with the highest sequence, or None.

        A manifest that does not verify against the pinned keys is skipped (it
        tells nothing a device would believe); the next write replaces it.
        """
        trusted = self._trust_for_signed()
        newest: Manifest | None = None
        for tier in self.manifest_tiers(model):
            try:
                manifest = verify_document(
                    Manifest, self.storage.get(manifest_key(model, tier)), trusted
                )
            except (NotFound, TrustError):
                continue
            if newest is None or manifest.sequence > newest.sequence:
                newest = manifest
        return newest

    def _refuse_stale_state(self, model: str, state: RolloutState | None) -> None:
        """A state behind the newest signed manifest: refuse to write from it.

        The sequence is the registry's clock: a manifest signed at a higher
        sequence than the state was written from a newer state (a state.json
        restored from an older backup, or a stale copy synced over the new
        one). A transition from the old state would bring back what the newer
        one had moved past (a rolled-back candidate) once its sequence
        overtakes the manifests'.
        """
        from edgereg.registry import _transitions as transitions

        if state is None:
            return
        newest = self.newest_manifest(model)
        if newest is None or newest.sequence <= state.sequence:
            return
        raise transitions.RolloutError(
            f"{state_key(model)} is at sequence {state.sequence}, behind sequence "
            f"{newest.sequence} of the signed {manifest_key(model, newest.tier)}: the state is "
            "older than what devices were last told (restored from an old backup?), and a "
            "change from it could hand out again what a newer state moved past",
            hint=f"Rebuild the state from the newest manifests: `edgereg rebuild-state {model}` "
            f"(it keeps what sequence {newest.sequence} says, above it), or restore the newest "
            "state.json from a backup.",
        )

    def rebuild_state(
        self,
        model: str,
        *,
        signer: Signer | Sequence[Signer],
        actor: str,
        expires_days: int,
        reset: bool = False,
        sequence: int | None = None,
    ) -> RolloutState:
        """Write a lost (or stale) rollout state again from what devices were last told.

        The highest-sequence signed manifest of ``model`` gives stable,
        candidate, percent, salt and pause; the new state takes the sequence
        after it, so every device accepts the manifests written from it. A
        state that exists but is behind that manifest (restored from an old
        backup) is replaced the same way, its history kept. With
        ``reset``, the state is empty instead (no stable, no candidate): the
        next publish starts over, still above every sequence a manifest shows,
        and at ``sequence`` when given (required when no manifest is left: only
        the operator knows what the devices saw).

        Raises:
            RolloutError: the state exists and is not behind any manifest, or
                nothing is left to rebuild it from (no manifest) and ``reset``
                is not given.
            TrustError: a manifest does not verify.
        """
        from edgereg.registry import _transitions as transitions

        signers = signers_of(signer)
        self.check_signer(signers)
        state, token = self.read_state(model)
        trusted = self._trust_for_signed()
        manifests = [
            verify_document(Manifest, self.storage.get(manifest_key(model, tier)), trusted)
            for tier in self.manifest_tiers(model)
        ]
        latest = max(manifests, key=lambda m: m.sequence, default=None)
        stale = state
        if state is not None and (latest is None or latest.sequence <= state.sequence):
            raise transitions.RolloutError(
                f"{state_key(model)} exists (sequence {state.sequence}, not behind any "
                "manifest); nothing to rebuild",
                hint=f"`edgereg status {model}` shows it; `edgereg resign {model}` rewrites "
                "its manifests.",
            )
        if latest is None and (not reset or sequence is None):
            raise transitions.RolloutError(
                f"no manifest of {model} is left in {self.storage.url}, so what devices were "
                "last told cannot be rebuilt, nor the sequence they remember",
                hint=f"`edgereg rebuild-state {model} --reset --sequence N` writes an empty "
                "state at sequence N (recorded in its history): choose N above any sequence "
                "a device may have seen (`edgereg history` output, logs, a device's cache); "
                "devices that remember a higher one refuse it.",
            )
        floor = 1 if latest is None else latest.sequence + 1
        if sequence is not None and (not reset or sequence < floor):
            raise transitions.RolloutError(
                f"--sequence {sequence} "
                + (
                    "is for --reset"
                    if not reset
                    else f"is below {floor}: manifest "
                    f"sequence {floor - 1} exists, and devices would refuse it as a rollback"
                ),
                hint=f"Drop --sequence, or pass --reset with --sequence {floor} or more.",
            )
        now = self.clock()
        sequence = floor if sequence is None else sequence
        empty = RolloutState(model=model, sequence=sequence, expires=now)
        if reset or latest is None:
            fields: dict[str, object] = {}
            action: Action = "reset"
            note = f"state lost; reset to empty at sequence {sequence}" + (
                " (no manifest left)"
                if latest is None
                else f" above manifest sequence {latest.sequence}"
            )
        else:
            fields = {
                "stable": latest.stable.version if latest.stable else None,
                "candidate": latest.candidate.version if latest.candidate else None,
                "percent": latest.percent,
                "salt": latest.salt,
                "paused": latest.paused,
                "report_url": latest.report_url,
            }
            action = "rebuild"
            note = (
                f"state lost; rebuilt from the {latest.tier} manifest, sequence {latest.sequence}"
            )
        new_state = RolloutState.model_validate(
            {
                **empty.model_dump(),
                **fields,
                "expires": now + timedelta(days=expires_days),
            }
        )
        history: list[HistoryEvent] = []
        before = empty.snapshot()
        if stale is not None:
            # What happened between the stale state and the newest manifest is lost;
            # what came before it is still history.
            note = note.replace("state lost", f"state at sequence {stale.sequence} was stale", 1)
            history = list(stale.history)
            before = stale.snapshot()
        event = HistoryEvent(
            sequence=sequence,
            at=now,
            actor=actor,
            action=action,
            before=before,
            after=new_state.snapshot(),
            note=note,
        )
        history = [*history, event][-transitions.HISTORY_LIMIT :]
        new_state = new_state.model_copy(update={"history": history})
        return self._write_state(new_state, token, signers)

    def _check_same_kind(self, state: RolloutState | None, record: AnyRelease) -> None:
        """A name is a model or a bundle for good: its manifests' entries must all be alike."""
        if state is None:
            return
        current = state.candidate or state.stable
        if current is None:
            return
        before = self.read_release(state.model, current)
        if isinstance(before, BundleRecord) == isinstance(record, BundleRecord):
            return
        was, now = ("bundle", "model") if isinstance(before, BundleRecord) else ("model", "bundle")
        raise ReleaseError(
            f"'{state.model}' is a {was} in registry {self.storage.url} ({current}), and this "
            f"release makes it a {now}; apps that asked for the {was} would refuse its manifests",
            hint="Give the new one another name (models and bundles share one namespace).",
        )

    def change(
        self,
        model: str,
        transition: Callable[[RolloutState | None, datetime, datetime], RolloutState],
        *,
        signer: Signer | Sequence[Signer],
        expires_days: int,
        report_url: ReportUrl = KEEP,
    ) -> RolloutState:
        """Apply one rollout transition (rollout, promote, rollback, pause, resume, resign).

        Works the same on a model and on a bundle (one state for all members).

        Args:
            transition: called with (state, now, expires); returns the next state.
            report_url: as for :meth:`publish`.
        """
        signers = signers_of(signer)
        self.check_signer(signers)
        self.repair_manifests(model, signers)
        state, token = self.read_state(model)
        self._refuse_lost_state(model, state)
        self._refuse_stale_state(model, state)
        now = self.clock()
        new_state = transition(state, now, now + timedelta(days=expires_days))
        return self._write_state(new_state, token, signers, report_url)

    def _existing_release(self, model: str, version: str) -> AnyRelease | None:
        try:
            return self.read_release(model, version)
        except NotFound:
            return None

    def _write_state(
        self,
        state: RolloutState,
        token: str | None,
        signers: list[Signer],
        report_url: ReportUrl = KEEP,
    ) -> RolloutState:
        if report_url is not KEEP:
            # Re-validated (not model_copy): the URL's format is a rule of the state.
            state = RolloutState.model_validate({**state.model_dump(), "report_url": report_url})
        # Verify the releases the new state names before it is written, so a
        # missing or tampered record refuses the command instead of leaving a
        # state that no manifest can be built from.
        releases = self._releases_of(state)
        try:
            self.storage.put_if_unchanged(
                state_key(state.model), sign_document(state, signers), token
            )
        except ConflictError as exc:
            raise ConflictError(
                f"the rollout state of {state.model} changed while this command ran "
                "(another publisher?); nothing was lost",
                url=self.storage.url,
                hint="Run the command again.",
            ) from exc
        self._write_manifests(state, signers, releases)
        return state

    def _releases_of(self, state: RolloutState) -> dict[str, AnyRelease]:
        return {
            version: self.read_release(state.model, version)
            for version in (state.stable, state.candidate)
            if version is not None
        }

    def _write_manifests(
        self,
        state: RolloutState,
        signers: list[Signer],
        releases: dict[str, AnyRelease] | None = None,
    ) -> None:
        if releases is None:
            releases = self._releases_of(state)
        published = self.manifest_tiers(state.model)
        for manifest in build_manifests(state, releases, published).values():
            self._put_manifest(manifest, signers)

    def manifest_tiers(self, model: str) -> list[str]:
        """The tiers that have a manifest of ``model`` in the registry."""
        prefix = layout.manifest_prefix(model)
        names = (key[len(prefix) :].removesuffix(".json") for key in self.storage.list(prefix))
        return sorted(name for name in names if NAME_RE.fullmatch(name))

    def _put_manifest(self, manifest: Manifest, signers: list[Signer]) -> None:
        """Write a manifest unless the registry already holds one at least as new.

        Compare-and-swap, so a command that read an older state (a publish
        rerun racing a rollout) never replaces newer manifests with older ones.
        """
        key = manifest_key(manifest.model, manifest.tier)
        envelope = sign_document(manifest, signers)
        for attempt in range(1, 6):
            try:
                data, token = self.storage.get_versioned(key)
            except NotFound:
                data, token = b"", None
            if token is not None:
                try:
                    current = verify_document(Manifest, data, self._trust_for_signed())
                except TrustError as exc:
                    current = None  # unreadable or foreign: replace it
                    _log().warning(
                        "%s does not verify (%s); replacing it with sequence %d of %s",
                        key,
                        exc.message,
                        manifest.sequence,
                        self.storage.url,
                    )
                if current is not None and current.sequence >= manifest.sequence:
                    return
            try:
                self.storage.put_if_unchanged(key, envelope, token)
                return
            except ConflictError:
                _log().info(
                    "%s changed while writing sequence %d (attempt %d of 5); reading it again",
                    key,
                    manifest.sequence,
                    attempt,
                )
                continue
        raise ConflictError(
            f"{key} kept changing while this command wrote it",
            url=self.storage.url,
            hint="Run the command again.",
        )

    def repair_manifests(self, model: str, signer: Signer | Sequence[Signer]) -> bool:
        """Write the manifests of the current state where they lag behind it.

        A command interrupted between the state and the manifests leaves them
        behind; every later command calls this first, so rerunning finishes
        the job.

        Returns:
            True if any manifest was behind.
        """
        state, _ = self.read_state(model)
        if state is None:
            return False
        trusted = self._trust_for_signed()
        releases = self._releases_of(state)
        behind = False
        published = self.manifest_tiers(model)
        for tier, want in build_manifests(state, releases, published).items():
            try:
                got = verify_document(
                    Manifest, self.storage.get(manifest_key(model, tier)), trusted
                )
                stale = got.sequence < want.sequence
            except (NotFound, TrustError):
                stale = True
            if stale:
                behind = True
                self._put_manifest(want, signers_of(signer))
        return behind

    # -- checking -------------------------------------------------------------------

    def verify(self, *, deep: bool = True) -> VerifyReport:
        """Check every signature, digest and reference in the registry.

        Args:
            deep: also re-hash every blob (otherwise only sizes are checked).
        """
        report = VerifyReport()
        self._verify_keys(report)
        try:
            trusted = self._trust_for_signed()
        except TrustError as exc:
            if not self.storage.list(layout.MODELS_PREFIX) and not self.storage.list(
                layout.MANIFESTS_PREFIX
            ):
                report.warnings.append("the registry is empty")
                return report
            report.errors.append(exc.message)
            return report
        checked_blobs: dict[str, str | None] = {}
        models = self.models()
        for model in models:
            self._verify_model(model, trusted, report, checked_blobs, deep=deep)
        with_manifests, releases_only = self._models_without_state(models)
        for model in with_manifests:
            report.errors.append(
                f"{state_key(model)}: missing, but manifests of {model} exist (was it "
                "deleted?); devices keep installing what they say, and no command can "
                "change it; restore state.json from a backup or run `edgereg rebuild-state "
                f"{model}`"
            )
        for model in releases_only:
            report.warnings.append(
                f"{state_key(model)}: missing, but release records of {model} exist (a first "
                f"publish interrupted?); run `edgereg publish {model}` again"
            )
        return report

    def _verify_keys(self, report: VerifyReport) -> None:
        """keys/ holds public keys only, each named by its id, and (pinned) each one pinned."""
        pinned = self.trusted_keys() if self.pinned else None
        for key in self.storage.list(KEYS_PREFIX):
            try:
                data = self.storage.get(key)
            except NotFound:
                continue
            if looks_like_private_key(data):
                report.errors.append(
                    f"{key}: holds a PRIVATE key, readable by anyone who can read the "
                    "registry; delete it now and rotate that key (docs/operations/keys.md)"
                )
                continue
            try:
                keyid = key_id(load_public_key(data))
            except TrustError as exc:
                report.errors.append(f"{key}: {exc.message}")
                continue
            if key != public_key_key(keyid):
                report.errors.append(
                    f"{key}: holds key {keyid[:12]}, expected at {public_key_key(keyid)}"
                )
            elif pinned is not None and keyid not in pinned:
                report.errors.append(
                    f"{key}: key {keyid[:12]} is not pinned in the project, so nothing it "
                    "signs is trusted; delete it from the registry (was it planted?), or pin "
                    "it if it is yours (docs/operations/keys.md)"
                )

    def _models_without_state(self, models: list[str]) -> tuple[list[str], list[str]]:
        """Models with no state.json: (those with manifests, those with release records only)."""
        found = {
            prefix: {
                key.split("/")[1]
                for key in self.storage.list(prefix)
                if key.count("/") >= 2 and key.endswith(".json")
            }
            - set(models)
            for prefix in (layout.MODELS_PREFIX, layout.MANIFESTS_PREFIX)
        }
        with_manifests = found[layout.MANIFESTS_PREFIX]
        return sorted(with_manifests), sorted(found[layout.MODELS_PREFIX] - with_manifests)

    def _verify_model(
        self,
        model: str,
        trusted: TrustedKeys,
        report: VerifyReport,
        checked_blobs: dict[str, str | None],
        *,
        deep: bool,
    ) -> None:
        try:
            state, _ = self.read_state(model)
        except TrustError as exc:
            report.errors.append(exc.message)
            return
        assert state is not None
        report.checked += 1
        if state.expires <= self.clock():
            report.warnings.append(
                f"{state_key(model)}: expired at {state.expires:%Y-%m-%d %H:%M} UTC; "
                f"run `edgereg resign {model}`"
            )
        records: dict[str, AnyRelease] = {}
        for version in self.versions(model):
            key = release_key(model, version)
            try:
                records[version] = self.read_release(model, version)
            except TrustError as exc:
                report.errors.append(exc.message)
                continue
            report.checked += 1
            # Every blob: each member's artifacts of a bundle, probes and labels too.
            for where, ref in records[version].blob_refs():
                problem = self._check_blob(ref.sha256, ref.size, checked_blobs, deep)
                report.checked += 1
                if problem:
                    report.errors.append(f"{key}: {where}: {problem}")
        for role, named in (("stable", state.stable), ("candidate", state.candidate)):
            if named is not None and named not in records:
                report.errors.append(
                    f"{state_key(model)}: {role} {named} has no valid release record"
                )
        if any(v is not None and v not in records for v in (state.stable, state.candidate)):
            return
        try:
            expected = build_manifests(state, records, self.manifest_tiers(model))
        except ValueError as exc:  # a model's release and a bundle's under one state
            report.errors.append(f"{state_key(model)}: no manifest can be built from it: {exc}")
            return
        for tier, want in expected.items():
            key = manifest_key(model, tier)
            try:
                got = verify_document(Manifest, self.storage.get(key), trusted)
            except NotFound:
                report.warnings.append(f"{key}: missing; run `edgereg resign {model}` to write it")
                continue
            except TrustError as exc:
                report.errors.append(f"{key}: {exc.message}")
                continue
            report.checked += 1
            if got.sequence < state.sequence:
                report.warnings.append(
                    f"{key}: sequence {got.sequence} is behind the state's {state.sequence} "
                    "(an interrupted command?); run it again or `edgereg resign "
                    f"{model}`"
                )
                continue
            if got.sequence > state.sequence:
                report.errors.append(
                    f"{key}: sequence {got.sequence} is ahead of the state's {state.sequence}"
                )
            elif got != want:
                report.errors.append(f"{key}: does not match the rollout state")

    def _check_blob(
        self, digest: str, size: int, checked: dict[str, str | None], deep: bool
    ) -> str | None:
        if digest in checked:
            return checked[digest]
        key = blob_path(digest)
        problem: str | None = None
        try:
            actual_size = self.storage.size(key)
            if actual_size != size:
                problem = f"{key} is {actual_size} bytes, the record says {size}"
            elif deep:
                hasher = hashlib.sha256()
                stream = self.storage.open_read(key)
                try:
                    for chunk in stream.iter_chunks():
                        hasher.update(chunk)
                finally:
                    stream.close()
                if hasher.hexdigest() != digest:
                    problem = f"{key} content does not match its sha256"
        except NotFound:
            problem = f"{key} is missing"
        checked[digest] = problem
        return problem


def public_key_id(pem: bytes) -> str:
    """The key id of a PEM public key."""
    return key_id(load_public_key(pem))


def export_public_key(signer: Signer) -> bytes:
    """The PEM of a signer's public key."""
    return public_key_pem(signer.public_key)


@contextmanager
def _snapshot(path: Path, digest: str) -> Iterator[Path]:
    """A private copy of an artifact, proven to have ``digest``; the upload reads the copy.

    The artifact was hashed when the release was prepared; a file rewritten
    since (a rebuild racing the publish) would become a blob whose content
    does not match its name, forever. Copying while hashing closes that gap.

    Raises:
        ReleaseError: the file changed since the release was prepared.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".edgereg-publish-", dir=path.parent) as work:
        frozen = Path(work) / path.name
        hasher = hashlib.sha256()
        with path.open("rb") as source, frozen.open("wb") as copy:
            while chunk := source.read(1 << 20):
                hasher.update(chunk)
                copy.write(chunk)
        if hasher.hexdigest() != digest:
            raise ReleaseError(
                f"{path} changed while it was being published (sha256 {hasher.hexdigest()[:12]}, "
                f"checked as {digest[:12]}); nothing was uploaded for it",
                hint="Let the build finish (`dvc repro`), then publish again.",
            )
        yield frozen
