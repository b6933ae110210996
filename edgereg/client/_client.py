"""The client: fetch, verify, choose, download, install; never break the app.

Trust decisions are not made here but in :mod:`edgereg.protocol.decision`;
the client moves bytes through :mod:`._fetcher`, keeps them with
:mod:`._cache` and records what the pure core accepted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import TypeAdapter, ValidationError

from edgereg._files import sha256_file
from edgereg.client._cache import (
    CacheError,
    NoSpace,
    _Cache,
    _TierState,
    cache_error,
    fsync_dir,
    unlink,
    write_all,
)
from edgereg.client._control import (
    Cancelled,
    CancelToken,
    ChangeKind,
    Listener,
    ModelChange,
    UpdateCheck,
    notify,
)
from edgereg.client._cpu import check_features, cpu_class, detect_cpu_features
from edgereg.client._fetcher import (
    CHUNK,
    Fetcher,
    Limits,
    ManifestNotFound,
    Response,
    open_fetcher,
    read_up_to,
)
from edgereg.client._health import DEFAULT_MAX_UNCONFIRMED_STARTS, HealthLedger, Revert
from edgereg.client._installed import (
    InstallCheck,
    InstalledModel,
    LastError,
    MemberFiles,
    Pending,
    Status,
    UnitKind,
    _Installed,
    _Member,
)
from edgereg.client._metrics import bucket_of, refusal
from edgereg.client._policy import BundledRelease, Conditions, DownloadPolicy
from edgereg.client._reporter import DeviceFacts, InstallFacts, Reporter
from edgereg.client._results import BadRelease, FetchResult, cohort_position, error_code
from edgereg.protocol import layout
from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.contract import MNN_APIS, BlobRef, parse_labels
from edgereg.protocol.decision import (
    MAX_MANIFEST_BYTES,
    AppFacts,
    BlobCheck,
    Decision,
    Fit,
    compare_versions,
    decide,
    fit,
)
from edgereg.protocol.envelope import TrustedKeys, key_id, load_public_key
from edgereg.protocol.errors import EdgeregError, TransportError, TrustError
from edgereg.protocol.fields import MAX_MEMORY_MB, MAX_PROBE_DATA_BYTES, Name, format_time
from edgereg.protocol.hints import HintFacts
from edgereg.protocol.patterns import SHA256_RE
from edgereg.protocol.reasons import Malformed, ProbeNotRun, Rejected
from edgereg.protocol.rules import DeviceProfile, Tiers, choose_runtime, resolve_tier
from edgereg.protocol.wire import (
    BundleEntry,
    DistributionMetric,
    Manifest,
    ManifestEntry,
    Metrics,
    RateMetric,
    verify_document,
)

if TYPE_CHECKING:
    from edgereg.client._selftest import SelfTest

__all__ = [
    "Client",
    "InstalledUnit",
    "installed_units",
    "manifest_path",
    "unit_status",
    "unsafe_registry_keys",
]

_log = logging.getLogger(__name__)
_NAME: TypeAdapter[str] = TypeAdapter(Name)
MAX_LABELS_BYTES = 4 * 1024 * 1024
"""A labels blob larger than this is refused (a real one is a few KiB)."""

manifest_path = layout.manifest_path


def _blob_refs(entries: Mapping[str, ManifestEntry], *, probes: bool) -> list[BlobRef]:
    """Every blob a release needs (artifacts, labels; probes and their data if ``probes``), once."""
    refs: dict[str, BlobRef] = {}
    for name in sorted(entries):
        entry = entries[name]
        # A client that runs no install check needs no probe (docs/protocol.md section 8).
        unneeded = () if probes else (entry.probe, entry.probe_data)
        for ref in entry.blob_refs():
            if not any(ref is other for other in unneeded):
                refs.setdefault(ref.sha256, ref)
    return list(refs.values())


def _check_declared_sizes(entries: Mapping[str, ManifestEntry]) -> None:
    """Refuse, before any byte, a probe data blob larger than a client holds (section 11).

    Raises:
        Malformed: ``probe_data.size`` above :data:`MAX_PROBE_DATA_BYTES`.
    """
    for name in sorted(entries):
        data = entries[name].probe_data
        if data is not None and data.size > MAX_PROBE_DATA_BYTES:
            raise Malformed(
                f"the probe data of {name} declares {data.size} bytes, more than "
                f"{MAX_PROBE_DATA_BYTES}"
            )


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _free_bytes(path: Path) -> int:
    """Bytes free to an unprivileged writer where ``path`` is (``shutil.disk_usage``'s free)."""
    if hasattr(os, "statvfs"):  # what disk_usage does here, without importing shutil
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    import shutil

    return shutil.disk_usage(path).free


class _Tally:
    """A release's download progress: (bytes done, bytes total) to the app's callback.

    The total (the blobs still missing) is known before the first byte; bytes
    kept from an interrupted download count as done from the start.
    """

    def __init__(
        self, report: Callable[[int, int], None] | None, missing: list[BlobRef], cache: _Cache
    ) -> None:
        self.report = report
        self.total = sum(ref.size for ref in missing)
        self.done = 0
        for ref in missing:
            with contextlib.suppress(OSError):
                self.done += min(ref.size, cache.part(ref.sha256).stat().st_size)
        self._tell()

    def add(self, count: int) -> None:
        self.done += count
        self._tell()

    def restart(self, dropped: int) -> None:
        """A ``.part`` was dropped (the server ignored the range): its bytes are to do again."""
        self.done -= dropped
        self._tell()

    def _tell(self) -> None:
        if self.report is None:
            return
        try:
            self.report(self.done, self.total)
        except Exception:  # the app's callback never breaks the download
            _log.exception("the progress callback raised")


_NO_TALLY = _Tally(None, [], None)  # type: ignore[arg-type]


class Client:
    """Fetches, verifies and installs one model, or one bundle of models, for one device.

    Args:
        base_url: The registry root: ``https://…``, ``http://…`` or ``file://…``.
        trusted_keys: The public keys manifests must be signed by (key id -> key).
        cache_dir: Where verified blobs, the manifest state and the install pointer live.
        model: The model name (give exactly one of ``model`` and ``bundle``).
        bundle: The bundle name: every member is installed at one version, or none.
        device: The device profile (its ``device_id`` decides the cohort, its
            ``mnn_runtime``, ``os`` and ``os_version`` which entries fit).
        tier: The device's tier; when None, resolved from ``tiers``.
        tiers: The tier rules, best first: models.toml's ``[tiers]``, or the pairs
            of a tier file (:func:`~edgereg.protocol.rules.parse_tier_file`).
        app_version: The app's own version, for releases that declare
            ``requires.app`` (a release that needs one does not reach an app
            that does not say its version).
        policy: When blobs may be downloaded (metered network, charging) and
            the free space to leave.
        bundled: A release shipped inside the app: installed without network
            when nothing (newer) is installed.
        install_check: Called after every blob of a new release is verified and
            before the switch (see :data:`~edgereg.client.InstallCheck`).
        self_test: Run each member's golden probe on its hinted backends before
            the switch (True, or a :class:`~edgereg.client.SelfTest` with its own
            runner); the install check then (docs/protocol.md §11).
        reporting: Send the anonymous reports the manifest asks for (§11);
            False sends and stores nothing.
        device_class: A coarse bucket of the app's own (``ram4-8c``) for reports.
        cpu_features: The device's CPU features for fit rule (e) (docs/protocol.md
            §7): ``"detect"`` (the default) reads them from this machine
            (``/proc/cpuinfo`` on aarch64 Linux, none on x86_64); a set of names
            says them (a test, a simulator); None does not say them (rule (e) skipped).
            Reports carry only the class derived from them (``cpu_class``).
        memory_budget_mb: How much memory one model (a bundle: its members
            together) may take on this device, MiB; None (the default) skips
            fit rule (d).
        mnn_apis: The MNN APIs the app's model runner calls, for fit rule (f):
            ``"runner"`` (the default) takes what the self-test's runner says
            it calls (``mnn_apis`` of :class:`~edgereg.client.MnnRunner`: the
            Module API; of :class:`~edgereg.client.SessionRunner`: the session
            API); a set of ``session``/``module`` says them; None does not
            (rule (f) skipped).
        max_unconfirmed_starts: App starts a new release gets to be confirmed
            (:meth:`confirm`) before :meth:`app_started` reverts it.
        timeout: Seconds before a connection, a read or a response's headers give up.
        deadline: Seconds a whole :meth:`fetch` may take (manifest and blobs).
        min_rate: Bytes per second a response body must average over each
            ``timeout`` window; slower is given up (a blob resumes next time).
        max_manifest_bytes: Larger manifests are refused unread.
        clock: Returns the current time, timezone-aware.
        on_progress: Told ``(bytes done, bytes total)`` of a release's download
            as it goes (the total is known before the first byte; bytes kept
            from an interrupted download count as done); a ``progress=`` given
            to :meth:`fetch` replaces it for that fetch.
        fetcher: The transport (the seam tests and apps with their own HTTP
            stack plug into): a :class:`~edgereg.client.Fetcher`; by default
            :func:`~edgereg.client.open_fetcher` on ``base_url``.

    Raises:
        ValueError: a bad URL, name, version, both or neither of model and
            bundle, or neither tier nor tiers.
        EdgeregError: the device matches none of ``tiers``.
    """

    def __init__(
        self,
        base_url: str,
        trusted_keys: Mapping[str, Ed25519PublicKey],
        cache_dir: str | os.PathLike[str],
        *,
        model: str | None = None,
        bundle: str | None = None,
        device: DeviceProfile,
        tier: str | None = None,
        tiers: Tiers | None = None,
        app_version: str | None = None,
        policy: DownloadPolicy | None = None,
        bundled: BundledRelease | None = None,
        install_check: InstallCheck | None = None,
        self_test: bool | SelfTest = False,
        reporting: bool = True,
        device_class: str | None = None,
        cpu_features: Iterable[str] | Literal["detect"] | None = "detect",
        memory_budget_mb: float | None = None,
        mnn_apis: Iterable[str] | Literal["runner"] | None = "runner",
        max_unconfirmed_starts: int = DEFAULT_MAX_UNCONFIRMED_STARTS,
        timeout: float = 30.0,
        deadline: float = Limits.deadline,
        min_rate: int = Limits.min_rate,
        max_manifest_bytes: int = MAX_MANIFEST_BYTES,
        clock: Callable[[], datetime] = _utcnow,
        on_progress: Callable[[int, int], None] | None = None,
        fetcher: Fetcher | None = None,
    ) -> None:
        if not trusted_keys:
            raise ValueError("a client needs at least one trusted public key")
        if (model is None) == (bundle is None):
            raise ValueError("give exactly one of model= and bundle=")
        unit = model if model is not None else bundle
        try:
            self.model = _NAME.validate_python(unit)
            if tier is None:
                if tiers is None:
                    raise ValueError("give the device's tier, or the tier rules to resolve it")
                tier = resolve_tier(tiers, device)
            self.tier = _NAME.validate_python(tier)
        except ValidationError as exc:
            raise ValueError(
                f"not a valid model, bundle or tier name: {exc.errors()[0]['input']!r}"
            ) from exc
        self.kind: UnitKind = "bundle" if bundle is not None else "model"
        features: frozenset[str] | None
        if cpu_features == "detect":
            features = detect_cpu_features()
        else:
            features = None if cpu_features is None else check_features(cpu_features)
        if memory_budget_mb is not None and (
            isinstance(memory_budget_mb, bool)
            or not isinstance(memory_budget_mb, (int, float))
            or not 0 < memory_budget_mb <= MAX_MEMORY_MB
        ):
            raise ValueError(
                f"memory_budget_mb must be a number of MiB above 0 and at most {MAX_MEMORY_MB}, "
                f"got {memory_budget_mb!r}"
            )
        self.app = AppFacts(
            mnn_runtime=device.mnn_runtime,
            app_version=app_version,
            os=device.os,
            os_version=device.os_version,
            cpu_features=features,
            memory_budget_mb=None if memory_budget_mb is None else float(memory_budget_mb),
        )
        self.app.check()  # ValueError for a version that is not one
        self.device = device
        # What the runtime hint rules match (docs/protocol.md §11): the class, not the features.
        self.hint_facts = HintFacts(
            cpu_class=cpu_class(features), cores=device.cpu_cores, soc=device.soc
        )
        self.trusted = trusted_keys
        limits = Limits(timeout=timeout, deadline=deadline, min_rate=min_rate)
        self.fetcher = (
            fetcher
            if fetcher is not None
            else open_fetcher(base_url, timeout=timeout, limits=limits)
        )
        self.cache = _Cache(Path(cache_dir))
        self.policy = policy if policy is not None else DownloadPolicy()
        self.bundled = bundled
        self.install_check = install_check
        self.self_test: SelfTest | None = None
        if self_test is not False:
            if install_check is not None:
                raise ValueError("give self_test= or install_check=, not both")
            if self_test is True:
                from edgereg.client._selftest import SelfTest  # with its probe parser

                self.self_test = SelfTest(self.cache.root)
            else:
                self.self_test = self_test
            self.install_check = self.self_test
        if mnn_apis == "runner":
            said = getattr(self.self_test.runner, "mnn_apis", None) if self.self_test else None
            mnn_apis = None if said is None else list(said)
        if mnn_apis is not None:
            apis = frozenset(mnn_apis)
            if not apis <= set(MNN_APIS):
                raise ValueError(f"mnn_apis names {sorted(apis)}; the MNN APIs are {MNN_APIS}")
            self.app = dataclasses.replace(self.app, mnn_apis=apis)
        self.health = HealthLedger(self.cache.root, max_unconfirmed_starts=max_unconfirmed_starts)
        # app_started was called in this process: an install now is under a start (§11).
        self._started = False
        self.reporter = Reporter(
            base_url,
            self.cache.root,
            device=DeviceFacts(
                os=device.os,
                os_version=device.os_version,
                device_class=device_class,
                mnn_runtime=device.mnn_runtime,
                cpu_class=cpu_class(features),
            ),
            enabled=reporting,
            clock=clock,
        )
        self.max_manifest_bytes = max_manifest_bytes
        self.clock = clock
        # Told (bytes done, bytes total) of a release's download, for progress bars.
        self.on_progress = on_progress
        self._listeners: list[Listener] = []
        self._cancel: CancelToken | None = None
        self._progress: Callable[[int, int], None] | None = None
        self._tally = _NO_TALLY

    @property
    def unit(self) -> str:
        """The model or bundle this client installs."""
        return self.model

    @property
    def is_bundle(self) -> bool:
        """This client installs a bundle."""
        return self.kind == "bundle"

    # -- public ---------------------------------------------------------------

    def current(self) -> FetchResult | None:
        """What is installed, without touching the network (what an app loads at start).

        On the first launch with a shipped release (``bundled=``) and nothing
        installed, installs that release from the app's files first.
        """
        if self.bundled is not None:
            self._install_shipped_or_record()
        installed = self.cache.read_installed(self.kind, self.model)
        return None if installed is None else self._result(installed)

    def fetch(
        self,
        conditions: Conditions | None = None,
        *,
        cancel: CancelToken | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> FetchResult:
        """Check for an update and install it; on any failure keep the last known good.

        Args:
            conditions: The network, power, idle and storage state now; the
                download waits (``deferred``) when they break the client's
                :class:`DownloadPolicy`. A condition not said is unmet.
            cancel: Cancels this fetch from another thread (:class:`CancelToken`):
                ``error_code`` ``cancelled``, nothing installed, the partial
                download kept for a later resume.
            progress: Told ``(bytes done, bytes total)`` as the release downloads.

        Never raises for network, server, trust or disk problems: the result's
        ``error`` and ``error_code`` say what went wrong and its other fields
        describe what is still installed.
        """
        if self.bundled is not None:
            self._install_shipped_or_record()
        installed = self.cache.read_installed(self.kind, self.model)
        self.reporter.retry_pending()
        self._send_metrics()
        self.fetcher.start_deadline()
        self._cancel = cancel
        self._progress = progress if progress is not None else self.on_progress
        if cancel is not None:
            cancel.watch(self.fetcher)  # a request whose answer is held is cut too
        try:
            result = self._fetch(installed, conditions or Conditions())
        except (EdgeregError, OSError) as exc:
            error = exc if isinstance(exc, EdgeregError) else cache_error("cache directory", exc)
            if isinstance(error, TransportError) and cancel is not None and cancel.cancelled:
                # The connection the app's cancel cut (a manifest's, a key's, a blob's) is the
                # cancel, not the network failing: an app retries a transport error as one.
                error = cancel.error()
            if not isinstance(error, (TrustError, TransportError, CacheError, NoSpace, Cancelled)):
                raise
            code = error_code(error)
            self._record_error(code, error.message)
            if installed is None:
                return FetchResult(
                    self.model,
                    self.tier,
                    None,
                    error=error.message,
                    error_code=code,
                    exception=error,
                    bundle=self.is_bundle,
                )
            return self._result(installed, error=error, code=code)
        finally:
            if cancel is not None:
                cancel.unwatch(self.fetcher)
            self._cancel = None
            self._progress = None
        self._record_error(None, None)
        return result

    def check(self, conditions: Conditions | None = None) -> UpdateCheck:
        """Whether an update is available, and its size, without downloading a blob.

        The manifest is fetched and verified as by :meth:`fetch` (rollback
        protection advances), and the same rules choose the release; nothing
        else changes. Never raises for network, trust or disk problems.
        """
        installed = self.cache.read_installed(self.kind, self.model)
        now = installed.version if installed is not None else None
        self.fetcher.start_deadline()
        try:
            decision = self._avoid_bad(self._accept_manifest()[0])
        except (EdgeregError, OSError) as exc:
            error = exc if isinstance(exc, EdgeregError) else cache_error("cache directory", exc)
            if not isinstance(error, (TrustError, TransportError, CacheError, NoSpace)):
                raise
            return UpdateCheck(False, now, now, error_code=error_code(error), error=error.message)
        entry = decision.entry
        if entry is None:
            return UpdateCheck(False, None, now, fallback=decision.fallback)
        entries = self._entries(entry)
        new = _Installed(
            kind=self.kind,
            version=entry.version,
            tier=self.tier,
            is_candidate=decision.is_candidate,
            sequence=decision.manifest.sequence,
            members={name: self._member(e) for name, e in entries.items()},
        )
        same = installed is not None and new.same_release(installed)
        missing = [
            r
            for r in _blob_refs(entries, probes=self._checks_installs)
            if not self.cache.has_blob(r.sha256, r.size)
        ]
        remaining = 0
        for ref in missing:
            try:
                have = self.cache.part(ref.sha256).stat().st_size
            except OSError:
                have = 0
            remaining += max(0, ref.size - have)
        return UpdateCheck(
            available=not same,
            version=entry.version,
            installed=now,
            is_candidate=decision.is_candidate,
            download_bytes=0 if same else remaining,
            deferred=None if same or not missing else self.policy.unmet(conditions or Conditions()),
            fallback=decision.fallback,
        )

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(ModelChange)`` after each change of what is installed.

        Installed, rolled back by the server, reverted, deleted; on the thread
        that made the change. A listener that raises is logged, never breaks
        the client.
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener`` (nothing happens when it was not added)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def delete(self) -> bool:
        """Delete this unit from the device: its install, its last good set, its blobs.

        What keeps the device safe stays: the highest sequence seen (rollback
        protection) and the releases refused here. The next :meth:`fetch`
        installs the release for this device again. Idempotent: False when
        nothing was installed.
        """
        record = self.cache.read_record(self.kind, self.model)
        self._set_pending(None)
        if record is None:
            return False
        self.cache.write_installed(self.kind, self.model, None)
        self.cache.evict()
        self.health.reverted(self.model, None)
        _log.info("%s %s deleted by the app", self.model, record.version)
        notify(self._listeners, ModelChange(self.model, "deleted", None, record.version))
        return True

    def status(self, *, verify: bool = True) -> Status:
        """What is installed, pending and failing for this unit; whether it is ready to load.

        Reads the cache only. With ``verify`` (the default) every installed
        blob is hashed again, so ``ready`` means present and intact.
        """
        return unit_status(self.cache.root, self.model, self.kind, self.tier, verify=verify)

    def revert(self, reason: str) -> FetchResult | None:
        """Switch back to the last good set and mark the current release bad on this device.

        For a model that fails in the app (a crash loop, a failed first
        inference): the current version is never installed again here. When
        there is no last good set, nothing is installed afterwards.

        Returns:
            What is installed now, or None.
        """
        record = self.cache.read_record(self.kind, self.model)
        if record is None:
            return None
        self.cache.mark_bad(self.model, record.version, f"reverted: {reason}")
        previous = record.previous
        if previous is not None and not all(self.cache.blob(d).is_file() for d in previous.blobs):
            previous = None
        self.cache.write_installed(self.kind, self.model, previous)
        self._record_error("reverted", f"{record.version} reverted: {reason}")
        self.cache.evict()
        _log.warning("%s %s reverted (%s)", self.model, record.version, reason)
        self.health.reverted(self.model, None if previous is None else previous.version)
        for name in sorted(record.members):
            self.reporter.reverted(self.model, name, None if previous is None else previous.version)
        now = None if previous is None else previous.version
        notify(self._listeners, ModelChange(self.model, "reverted", now, record.version))
        return None if previous is None else self._result(previous, updated=True)

    def app_started(self) -> Revert | None:
        """Call once at every start of the app, before it loads the model.

        Counts the start before against an unconfirmed install when that start
        ran it (it ended without a confirmation: a crash, or the app closed
        before its first inference); when the installed release was not
        confirmed over ``max_unconfirmed_starts`` such starts (a crash loop),
        reverts it to the last good set and marks it bad (docs/protocol.md
        §11). Whether the app calls it before or after :meth:`fetch` installs
        an update, a start whose install happened in it counts the same. Reads
        and writes the cache only.

        Returns:
            The revert carried out (load :meth:`current` then), or None.
        """
        self._started = True
        before = self.health.health(self.model).starts
        revert = self.health.app_started(self.model)
        # The count went up: its report goes first, the revert's own report after it.
        self._report_unconfirmed(before)
        if revert is None:
            return None
        record = self.cache.read_record(self.kind, self.model)
        if record is None or record.version != revert.version:
            # Something else is installed by now: nothing to take back.
            self.health.reverted(self.model, None if record is None else record.version)
            return None
        self.revert(revert.reason)
        return revert

    def _report_unconfirmed(self, starts_before: int) -> None:
        """A start was counted against the unconfirmed install: report the count now."""
        health = self.health.health(self.model)
        if health.installed is None or health.confirmed or health.starts <= starts_before:
            return
        record = self.cache.read_record(self.kind, self.model)
        if record is None or record.version != health.installed:
            return
        for name in sorted(record.members):
            self.reporter.unconfirmed(self.model, name, health.starts)

    def confirm(self, version: str | None = None) -> bool:
        """The app's first real inference with the installed release succeeded.

        Args:
            version: The version the app ran (the bundle's for a bundle);
                a confirmation of another version than the installed one
                does not count.

        Returns:
            True when this confirmed a release that was waiting for it.
        """
        confirmed = self.health.confirm(self.model, version)
        if confirmed:
            record = self.cache.read_record(self.kind, self.model)
            for name in sorted(record.members if record is not None else {}):
                self.reporter.confirmed(self.model, name)
        return confirmed

    def record_inference(self, ms: float, model: str | None = None) -> None:
        """Add one real inference's latency (``model``: a bundle member) to the next report."""
        self.reporter.record_inference(model or self.model, ms)

    def record(self, name: str, success: bool) -> bool:
        """Count one event of the app metric ``name`` (a ``rate``): whether it succeeded.

        The installed release's metric (docs/protocol.md §3, "App metrics"):
        counted since its install, sent as totals with its reports. Nothing is
        counted while nothing is installed or reporting is off.

        Returns:
            Whether it was counted.

        Raises:
            ValueError: ``name`` is not a rate metric the installed release declares,
                or ``success`` is not a bool (a programming error of the caller).
        """
        if not isinstance(success, bool):
            raise ValueError(f"record({name!r}, ...): success must be True or False")
        installed = self._declared(name, RateMetric)
        if installed is None or not self.reporter.enabled:
            return False
        self.reporter.record(self.model, installed, name, success=success)
        return True

    def observe(self, name: str, value: float) -> bool:
        """Count one value of the app metric ``name`` (a ``distribution``) in its bucket.

        Returns:
            Whether it was counted (not while nothing is installed or reporting is off).

        Raises:
            ValueError: ``name`` is not a distribution the installed release declares,
                or ``value`` is not a finite number (a programming error of the caller).
        """
        if refusal({}, name, "distribution", value) == "not-finite":
            raise ValueError(f"observe({name!r}, {value!r}): the value must be a finite number")
        installed = self._declared(name, DistributionMetric)
        if installed is None or not self.reporter.enabled:
            return False
        declared = self._record_metrics(installed)[name]
        assert isinstance(declared, DistributionMetric)
        bucket = bucket_of(declared.buckets, value)
        self.reporter.observe(
            self.model, installed, name, bucket=bucket, buckets=len(declared.buckets) + 1
        )
        return True

    def _record_metrics(self, version: str) -> Mapping[str, RateMetric | DistributionMetric]:
        record = self.cache.read_record(self.kind, self.model)
        if record is None or record.version != version or record.metrics is None:
            return {}
        return record.metrics

    def _declared(self, name: str, kind: type[RateMetric | DistributionMetric]) -> str | None:
        """The installed version when it declares ``name`` of ``kind``; None when nothing is.

        Raises:
            ValueError: the installed release does not declare it, or as another kind.
        """
        record = self.cache.read_record(self.kind, self.model)
        if record is None:
            return None
        wanted: Literal["rate", "distribution"] = "rate" if kind is RateMetric else "distribution"
        why = refusal(record.metrics, name, wanted, 0.0)
        declared = (record.metrics or {}).get(name)
        if why == "undeclared" or declared is None:
            known = ", ".join(sorted(record.metrics or {})) or "none"
            raise ValueError(
                f"{self.model} {record.version} declares no app metric {name!r} "
                f"(declared: {known}); declare it in models.toml [models.{self.model}.metrics]"
            )
        if why == "other-kind":
            raise ValueError(
                f"app metric {name!r} of {self.model} {record.version} is a "
                f"{declared.metric}, not a {wanted}: use "
                f"{'record' if declared.metric == 'rate' else 'observe'}()"
            )
        return record.version

    def record_memory(
        self, peak_mb: float | None, steady_mb: float | None = None, model: str | None = None
    ) -> None:
        """Report the memory the app measured for the installed model, in MiB.

        ``peak_mb`` and ``steady_mb`` are the app's own measurements (the client
        never guesses them); ``model`` names a bundle member. Sent at once, and
        kept in the later reports of this install.
        """
        self.reporter.memory(self.model, model or self.model, peak_mb, steady_mb)

    def report_latency(self) -> None:
        """Send the latency recorded since the last report now (for a periodic send)."""
        record = self.cache.read_record(self.kind, self.model)
        for name in sorted(record.members if record is not None else {}):
            self.reporter.summary(self.model, name)

    def close(self, timeout: float = 11.0) -> None:
        """Wait up to ``timeout`` seconds for reports still being sent."""
        self.reporter.close(timeout)

    # -- steps ------------------------------------------------------------------

    def _fetch(self, installed: _Installed | None, conditions: Conditions) -> FetchResult:
        decision, not_modified = self._accept_manifest()
        try:
            self._checkpoint()
            return self._apply(
                self._avoid_bad(decision), installed, conditions, not_modified=not_modified
            )
        finally:
            # Whatever this check did, the release the manifest gives the device (before
            # its own refusals) hears from it in every rollout period (§11).
            self._report_period(decision)

    def _accept_manifest(self) -> tuple[Decision, bool]:
        """Fetch and verify the manifest; store its sequence and bytes. (decision, was 304)."""
        state = self.cache.read_state(self.model, self.tier)
        highest = self.cache.read_sequence(self.model)
        data, etag, not_modified = self._get_manifest(state)
        decision = self._decide(data, highest, self.clock())
        # Rollback protection first, before anything is downloaded.
        if decision.sequence != highest:
            self.cache.write_sequence(self.model, decision.sequence)
        accepted = _TierState(data, etag, decision.sequence)
        if accepted != state:
            self.cache.write_state(self.model, self.tier, accepted)
        return decision, not_modified

    def _checkpoint(self) -> None:
        """Stop here when the app cancelled the fetch (before anything is switched)."""
        if self._cancel is not None:
            self._cancel.check()

    def _decide(self, data: bytes, highest: int | None, now: datetime) -> Decision:
        return decide(
            data,
            trusted=self.trusted,
            model=self.model,
            tier=self.tier,
            device_id=self.device.device_id,
            app_mnn_runtime=self.device.mnn_runtime,
            highest_seen_sequence=highest,
            now=now,
            max_manifest_bytes=self.max_manifest_bytes,
            app=self.app,
            bundle=self.is_bundle,
        )

    def _avoid_bad(self, decision: Decision) -> Decision:
        """A release this device refused for good counts as not fitting (§10)."""
        entry = decision.entry
        if entry is None:
            return decision
        bad = self.cache.read_bad(self.model)
        if entry.version not in bad:
            return decision
        stable = decision.manifest.stable
        fitted = fit(stable, self.app) if stable is not None else None
        if (
            decision.is_candidate
            and stable is not None
            and stable.version not in bad
            and isinstance(fitted, Fit)
        ):
            return dataclasses.replace(
                decision,
                entry=fitted.entry,
                is_candidate=False,
                fallback="bad-release",
                substitute=fitted.substitute,
            )
        raise BadRelease(
            f"{self.model} {entry.version} was refused on this device before "
            f"({bad[entry.version]}); it is not installed again",
            hint="The installed release stays; a newer release replaces it.",
        )

    def _entries(self, entry: ManifestEntry | BundleEntry) -> dict[str, ManifestEntry]:
        if isinstance(entry, BundleEntry):
            return dict(entry.members)
        return {self.model: entry}

    def _apply(
        self,
        decision: Decision,
        installed: _Installed | None,
        conditions: Conditions,
        *,
        not_modified: bool,
        shipped: BundledRelease | None = None,
    ) -> FetchResult:
        """Install what the decision chose: every blob verified, then one pointer switch."""
        entry = decision.entry
        if entry is None:
            self._set_pending(None)
            return FetchResult(
                self.model,
                self.tier,
                None,
                not_modified=not_modified,
                bundle=self.is_bundle,
                # Nothing for this device, yet a rollout may be going on (a first
                # release as a canary): where the device stands in it.
                cohort=cohort_position(decision.manifest, self.device.device_id),
            )
        entries = self._entries(entry)
        new = _Installed(
            kind=self.kind,
            version=entry.version,
            tier=self.tier,
            is_candidate=decision.is_candidate,
            sequence=decision.manifest.sequence,
            members={name: self._member(e) for name, e in entries.items()},
            bundled=shipped is not None,
            metrics=_declared_metrics(decision, entry),
        )
        if installed is not None and new.same_release(installed):
            # Same blobs (a promote, a re-fetch): keep the check's backends and the last good.
            kept = dataclasses.replace(
                new,
                members={
                    name: dataclasses.replace(
                        m,
                        backend=installed.members[name].backend,
                        # The probe on disk: a release installed without a check has none.
                        probe_sha256=installed.members[name].probe_sha256,
                    )
                    for name, m in new.members.items()
                },
                previous=installed.previous,
                bundled=installed.bundled and shipped is not None,
            )
            if kept.to_json() != installed.to_json():
                self.cache.write_installed(self.kind, self.model, kept)
            self._set_pending(None)
            return self._result(kept, not_modified=not_modified, decision=decision)
        _check_declared_sizes(entries)
        missing = [
            ref
            for ref in _blob_refs(entries, probes=self._checks_installs)
            if not self.cache.has_blob(ref.sha256, ref.size)
        ]
        downloaded = 0
        if missing:
            if shipped is None:
                deferred = self.policy.unmet(conditions)
                self._set_pending(new, missing, deferred=deferred)
                if deferred is not None:
                    return self._deferred(installed, deferred, not_modified)
            self._preflight(missing)
            self._tally = _Tally(self._progress, missing, self.cache)
            for ref in missing:
                self._checkpoint()
                if shipped is None:
                    downloaded += self._download(ref)
                else:
                    self._copy_shipped(ref, shipped)
        for name, member_entry in entries.items():
            self._labels_of(name, member_entry)  # a bad labels blob refuses the release
        try:
            new = self._check(new, entries)
        except ProbeNotRun:
            raise  # no verdict on the release: it stays pending, nothing is reported
        except Rejected:
            self._set_pending(None)
            self._report_rejected(new, decision)
            raise
        self._checkpoint()  # the last moment a cancel counts: the switch is next
        if installed is not None:
            new = dataclasses.replace(new, previous=installed.without_previous())
        self.cache.write_installed(self.kind, self.model, new)
        self._set_pending(None)
        self.cache.evict()
        self._report_installed(new, decision)
        previous = None if installed is None else installed.version
        kind: ChangeKind = "installed"
        if previous is not None and compare_versions(new.version, previous) < 0:
            kind = "rolled-back"  # the server took the release back
        notify(self._listeners, ModelChange(self.model, kind, new.version, previous))
        return self._result(
            new,
            updated=True,
            not_modified=not_modified,
            downloaded=downloaded,
            decision=decision,
        )

    @property
    def _checks_installs(self) -> bool:
        """Whether an install check runs before a switch (and so needs each member's probe).

        Without one the golden probe is never downloaded: a client that does not
        self-test spends no bytes on it (docs/protocol.md §8).
        """
        return self.install_check is not None

    def _member(self, entry: ManifestEntry) -> _Member:
        # The hint rules are applied at every verified manifest, so a hint change (no new
        # blob, the sequence advanced) reaches the installed pointer without a download.
        member = _Member.of(
            entry, hint=choose_runtime(entry, self.hint_facts, self.device.device_id)
        )
        if member.probe_sha256 is not None and not self._checks_installs:
            return dataclasses.replace(member, probe_sha256=None)  # not fetched, not kept
        return member

    def _deferred(self, installed: _Installed | None, why: str, not_modified: bool) -> FetchResult:
        _log.info("%s: download deferred (%s)", self.model, why)
        if installed is None:
            return FetchResult(
                self.model,
                self.tier,
                None,
                not_modified=not_modified,
                bundle=self.is_bundle,
                deferred=why,
            )
        return dataclasses.replace(self._result(installed, not_modified=not_modified), deferred=why)

    def _facts(self, new: _Installed, name: str, decision: Decision) -> InstallFacts:
        member = new.members[name]
        return InstallFacts(
            unit=self.model,
            model=name,
            version=member.version,
            unit_version=new.version,
            variant=member.variant,
            tier=self.tier,
            arm="candidate" if new.is_candidate else "stable",
            sequence=decision.manifest.sequence,
        )

    def _send_metrics(self) -> None:
        """App metrics counted since the install's last report, 12 hours after it: send them."""
        record = self.cache.read_record(self.kind, self.model)
        if record is None or not record.metrics:
            return
        if self.reporter.metrics_due(self.model, record.version, self.clock()):
            for name in sorted(record.members):
                self.reporter.summary(self.model, name)

    def _report_period(self, decision: Decision) -> None:
        """A manifest with a new sequence: report again the release it gives this device.

        Its installed report, or its refusal's (rejected or reverted here): every
        period counts each device in its arm, whether the release works on it or
        not (docs/protocol.md §11). The reporter sends nothing when its report of
        that release already carries this sequence.
        """
        entry = decision.entry
        if entry is None:
            return
        arm: Literal["candidate", "stable"] = "candidate" if decision.is_candidate else "stable"
        for name in sorted(self._entries(entry)):
            self.reporter.period(
                self.model,
                name,
                entry.version,
                arm=arm,
                sequence=decision.manifest.sequence,
                report_url=decision.manifest.report_url,
            )

    def _report_installed(self, new: _Installed, decision: Decision) -> None:
        """A new release is installed: its count of starts begins, each member is reported."""
        self.health.installed(self.model, new.version, during_start=self._started)
        results = self.self_test.results if self.self_test is not None else {}
        for name in sorted(new.members):
            facts = self._facts(new, name, decision)
            result = results.get(name)
            if result is not None:
                facts = dataclasses.replace(
                    facts,
                    probe=result.probe,
                    backend=result.backend,
                    backends_skipped=result.skipped,
                    load_ms=result.load_ms,
                )
            self.reporter.installed(facts, decision.manifest.report_url)

    def _report_rejected(self, new: _Installed, decision: Decision) -> None:
        """The self-test refused a member: report it (the release is not installed)."""
        failed = self.self_test.failed if self.self_test is not None else {}
        for name, trials in sorted(failed.items()):
            if name not in new.members:
                continue
            tried = [t for t in trials if t.outcome == "failed"]
            facts = dataclasses.replace(
                self._facts(new, name, decision),
                probe="failed",
                backends_skipped=[
                    t.backend for t in trials if t.outcome in ("failed", "remembered")
                ],
                load_failed=bool(tried)
                and all((t.detail or "").startswith("does not load") for t in tried),
            )
            self.reporter.installed(facts, decision.manifest.report_url)

    def _check(self, new: _Installed, entries: Mapping[str, ManifestEntry]) -> _Installed:
        """Run the app's install check; store the backend it chose per member."""
        if self.install_check is None:
            return new
        files = {
            name: MemberFiles(
                entry,
                self.cache.blob(entry.sha256),
                self.cache.blob(entry.probe.sha256) if entry.probe is not None else None,
                self.cache.blob(entry.probe_data.sha256) if entry.probe_data is not None else None,
            )
            for name, entry in entries.items()
        }
        try:
            chosen = self.install_check(self.model, new.version, files)
        except Rejected as exc:
            if getattr(exc, "permanent", False) is True:
                self.cache.mark_bad(self.model, new.version, f"{exc.reason}: {exc.message}")
                _log.warning("%s %s marked bad on this device: %s", self.model, new.version, exc)
            raise
        if chosen is None:
            return new
        members = dict(new.members)
        for name, backend in chosen.items():
            if name not in entries:
                raise ValueError(f"install_check chose a backend for {name!r}, not a member")
            if backend not in entries[name].runtime.backends:
                raise ValueError(
                    f"install_check chose backend {backend!r} for {name}, not one of its hints "
                    f"{entries[name].runtime.backends}"
                )
            members[name] = dataclasses.replace(members[name], backend=backend)
        return dataclasses.replace(new, members=members)

    def _preflight(self, missing: list[BlobRef]) -> None:
        """Refuse, before any byte, a download the free space cannot hold (``no-space``)."""
        remaining = 0
        for ref in missing:
            try:
                have = self.cache.part(ref.sha256).stat().st_size
            except OSError:
                have = 0
            remaining += max(0, ref.size - have)
        try:
            self.cache.root.mkdir(parents=True, exist_ok=True)
            free = _free_bytes(self.cache.root)
        except OSError as exc:
            raise cache_error(f"cannot check the free space of {self.cache.root}", exc) from exc
        needed = remaining + self.policy.reserve_bytes
        if free < needed:
            raise NoSpace(
                f"the download needs {needed} bytes ({remaining} to fetch and a reserve of "
                f"{self.policy.reserve_bytes}) and {self.cache.root} has {free} free; "
                "nothing was downloaded",
                needed=needed,
                free=free,
            )

    def _copy_shipped(self, ref: BlobRef, shipped: BundledRelease) -> None:
        """Verify a blob the app ships and move a copy into the cache."""
        source = shipped.blob(ref.sha256)
        if source is None:
            raise Malformed(
                f"the shipped release has no blob {ref.sha256[:12]} in {shipped.blobs_dir}",
                hint="Ship every blob of the bundled manifest, named by its sha256.",
            )
        part = self.cache.part(ref.sha256)
        check = BlobCheck(ref)
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
            unlink(part)
            with source.open("rb") as handle, part.open("wb") as out:
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    check.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            check.finish()
            os.replace(part, self.cache.blob(ref.sha256))
        except Rejected:
            unlink(part)
            raise
        except OSError as exc:
            unlink(part)
            raise cache_error(f"cannot copy the shipped blob {source}", exc) from exc
        fsync_dir(part.parent)

    def _labels_of(self, name: str, entry: ManifestEntry | _Member) -> list[str] | None:
        contract = entry.contract
        if contract is None:
            return None
        if contract.labels is not None:
            return list(contract.labels)
        blob = contract.labels_blob
        if blob is None:
            return None
        if blob.size > MAX_LABELS_BYTES:
            raise Malformed(
                f"the labels blob of {name} is {blob.size} bytes, more than {MAX_LABELS_BYTES}"
            )
        try:
            data = self.cache.blob(blob.sha256).read_bytes()
        except OSError as exc:
            raise cache_error(f"cannot read the labels of {name}", exc) from exc
        return parse_labels(data)

    def _install_shipped_or_record(self) -> None:
        try:
            self._install_shipped()
        except (TrustError, CacheError, NoSpace) as exc:
            code = error_code(exc)
            _log.warning("the release shipped in the app was not installed (%s): %s", code, exc)
            with contextlib.suppress(CacheError):
                self._record_error(code, f"shipped release: {exc.message}")

    def _install_shipped(self) -> None:
        """Install the app's shipped release until the first manifest is accepted online.

        Verified like a fetched manifest (signature, model or bundle, tier,
        digests) except for its expiry: a copy inside the app cannot be
        re-signed. It stands in for the first fetch only (docs/protocol.md §10):

        - it never raises the remembered sequence, so a shipped manifest with
          a sequence far above the registry's (2^53 - 1 by mistake) cannot
          turn every later online manifest into a "rollback";
        - once a manifest was accepted online, no shipped release is
          installed again (else a high-sequence copy would replace every
          online update at each start); before that, a newer shipped copy (an
          app update) replaces an older one.
        """
        assert self.bundled is not None
        data = self.bundled.manifest
        manifest = verify_document(Manifest, data, self.trusted)
        if self.cache.read_sequence(self.model) is not None:
            return
        installed = self.cache.read_installed(self.kind, self.model)
        if installed is not None and manifest.sequence <= installed.sequence:
            return
        now = min(self.clock(), manifest.expires - timedelta(seconds=1))
        decision = self._avoid_bad(self._decide(data, None, now))
        if decision.entry is None:
            return
        self._apply(decision, installed, Conditions(), not_modified=False, shipped=self.bundled)
        _log.info("installed the release shipped in the app (%s)", decision.entry.version)

    # -- status bookkeeping -------------------------------------------------------------

    def _set_pending(
        self,
        new: _Installed | None,
        missing: list[BlobRef] | None = None,
        *,
        deferred: str | None = None,
    ) -> None:
        status = self.cache.read_status(self.model)
        if new is None:
            if status.get("pending") is None:
                return
            status["pending"] = None
        else:
            old = status.get("pending")
            since = (
                old.get("since")
                if isinstance(old, dict) and old.get("version") == new.version
                else format_time(self.clock())
            )
            status["pending"] = {
                "version": new.version,
                "is_candidate": new.is_candidate,
                "blobs": [{"sha256": r.sha256, "size": r.size} for r in missing or []],
                "deferred": deferred,
                "since": since,
            }
        self.cache.write_status(self.model, status)

    def _record_error(self, code: str | None, message: str | None) -> None:
        status = self.cache.read_status(self.model)
        if code is None:
            if status.get("last_error") is None:
                return
            status["last_error"] = None
        else:
            status["last_error"] = {
                "code": code,
                "message": message,
                "at": format_time(self.clock()),
            }
        try:
            self.cache.write_status(self.model, status)
        except CacheError as exc:
            # The fetch result still carries the error; only `status()` misses it.
            _log.warning("cannot record the last error of %s: %s", self.model, exc)

    def _get_manifest(self, state: _TierState) -> tuple[bytes, str | None, bool]:
        """The manifest bytes to verify, their ETag, and whether the server said 304."""
        cached = state.envelope
        path = manifest_path(self.model, self.tier)
        try:
            response = self.fetcher.open(path, etag=state.etag if cached else None)
        except TransportError as exc:
            if exc.status == 404:
                raise ManifestNotFound(
                    f"the registry has no manifest for model '{self.model}', tier "
                    f"'{self.tier}' ({exc.url} answered 404)",
                    url=exc.url,
                    status=404,
                    retryable=False,
                    hint="Check the model name and --tier (the tiers of models.toml), and "
                    "that the model was published to this registry.",
                ) from exc
            raise
        with response:
            if response.status == 304 and cached is not None:
                # Still verified again below: the cached copy may have expired.
                return cached, response.etag or state.etag, True
            if response.status != 200:
                raise TransportError(
                    f"{response.url} answered HTTP {response.status}, expected 200",
                    url=response.url,
                    status=response.status,
                )
            limit = self.max_manifest_bytes
            if response.length is not None and response.length > limit:
                raise Malformed(
                    f"manifest is {response.length} bytes, more than the limit of {limit}"
                )
            # One byte past the limit is enough to refuse it.
            data = read_up_to(response, limit + 1)
            return data, response.etag, False

    def _download(self, entry: BlobRef) -> int:
        """Download, verify and move a blob into the cache; returns the bytes transferred.

        Raises:
            TransportError: interrupted; the ``.part`` file stays for a resume.
            BadBlob: wrong size or digest; the ``.part`` file is deleted.
            CacheError: the disk is full or not writable; the ``.part`` file is deleted.
        """
        part = self.cache.part(entry.sha256)
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cache_error(f"cannot create {part.parent}", exc) from exc
        check = BlobCheck(entry)
        have = self._resume_from(part, check)
        transferred = 0
        if check.remaining:
            transferred = self._transfer(entry, part, check, have)
        try:
            check.finish()
        except Rejected:
            unlink(part)
            raise
        try:
            os.replace(part, self.cache.blob(entry.sha256))
        except OSError as exc:
            raise cache_error(f"cannot install {part.name}", exc) from exc
        fsync_dir(part.parent)
        return transferred

    def _resume_from(self, part: Path, check: BlobCheck) -> int:
        """Feed the bytes of an earlier interrupted download to the check; returns their count."""
        try:
            size = part.stat().st_size
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise cache_error(f"cannot read {part}", exc) from exc
        if size > check.entry.size:
            _log.warning(
                "dropped %s: %d bytes, more than the %d the manifest declares",
                part,
                size,
                check.entry.size,
            )
            unlink(part)
            return 0
        if size:
            _log.info("resuming %s from byte %d of %d", part.name, size, check.entry.size)
        try:
            with part.open("rb") as handle:
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    check.update(chunk)
        except OSError as exc:
            raise cache_error(f"cannot read {part}", exc) from exc
        return size

    def _transfer(self, entry: BlobRef, part: Path, check: BlobCheck, have: int) -> int:
        response = self.fetcher.open(entry.path, start=have)
        if self._cancel is not None:
            self._cancel.watch(response)
        try:
            if have and not (response.status == 206 and response.range_start == have):
                # The server ignored the Range (200 and the whole body: a plain
                # static server) or refused it: start again from the first byte.
                _log.info(
                    "%s answered HTTP %d to a range from byte %d; dropped %s, starting over",
                    response.url,
                    response.status,
                    have,
                    part.name,
                )
                unlink(part)
                check.reset()
                self._tally.restart(have)
                if response.status != 200:
                    if self._cancel is not None:
                        self._cancel.unwatch(response)
                    response.close()
                    response = self.fetcher.open(entry.path)
                    if self._cancel is not None:
                        self._cancel.watch(response)
            if response.status not in (200, 206) or (
                response.status == 206 and response.range_start != check.received
            ):
                raise TransportError(
                    f"{response.url} answered HTTP {response.status} "
                    f"(range from {response.range_start}), expected 200",
                    url=response.url,
                    status=response.status,
                )
            check.expect(response.length)
            return self._stream(response, part, check)
        except Rejected:
            unlink(part)
            raise
        finally:
            if self._cancel is not None:
                self._cancel.unwatch(response)
            response.close()

    def _stream(self, response: Response, part: Path, check: BlobCheck) -> int:
        """Append the body to the .part file while checking it; returns the bytes read."""
        transferred = 0
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise cache_error(f"cannot write {part}", exc) from exc
        try:
            while check.remaining:
                # At most one byte past the declared size is ever read.
                chunk = response.read(min(CHUNK, check.remaining))
                if not chunk and response.length is None:
                    # No Content-Length: the end of the body is the end of the
                    # answer, and a short answer is bad-blob (section 8, rule 14).
                    check.finish()
                if not chunk:
                    # Fewer bytes than the Content-Length the server announced
                    # (which expect() held to what remains): the connection was cut.
                    raise TransportError(
                        f"{response.url}: connection closed after {check.received} of "
                        f"{check.entry.size} bytes; the next fetch resumes",
                        url=response.url,
                    )
                check.update(chunk)
                transferred += len(chunk)
                write_all(fd, chunk)
                self._tally.add(len(chunk))
                self._checkpoint()
            check.update(response.read(1))  # anything more is BlobTooLarge
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            fd = -1
            unlink(part)  # free the space: the app needs it more than a resume
            raise cache_error(f"cannot write {part}", exc) from exc
        finally:
            if fd >= 0:
                os.close(fd)
        return transferred

    def _result(
        self,
        installed: _Installed,
        *,
        error: EdgeregError | None = None,
        code: str | None = None,
        updated: bool = False,
        not_modified: bool = False,
        downloaded: int = 0,
        decision: Decision | None = None,
    ) -> FetchResult:
        members = _installed_models(self.cache, installed)
        single = None if self.is_bundle else members.get(self.model)
        return FetchResult(
            model=self.model,
            tier=self.tier,
            path=single.path if single else None,
            version=installed.version,
            variant=single.variant if single else None,
            sha256=single.sha256 if single else None,
            runtime=single.runtime if single else None,
            runtime_rule=single.runtime_rule if single else None,
            min_mnn_runtime=single.min_mnn_runtime if single else None,
            is_candidate=installed.is_candidate,
            updated=updated,
            error=None if error is None else error.message,
            error_code=code,
            not_modified=not_modified,
            downloaded_bytes=downloaded,
            runtime_fallback=decision.runtime_fallback if decision else False,
            exception=error,
            members=members,
            bundle=self.is_bundle,
            fallback=decision.fallback if decision else None,
            substitute=decision.substitute if decision else None,
            bundled=installed.bundled,
            cohort=cohort_position(decision.manifest, self.device.device_id) if decision else None,
        )


def _installed_models(cache: _Cache, installed: _Installed) -> dict[str, InstalledModel]:
    models = {}
    for name, member in sorted(installed.members.items()):
        labels: list[str] | None = None
        if member.contract is not None:
            labels = member.contract.labels
            blob = member.contract.labels_blob
            if blob is not None:
                try:
                    labels = parse_labels(cache.blob(blob.sha256).read_bytes())
                except (OSError, Malformed):
                    _log.warning("the labels blob of %s cannot be read", name)
        models[name] = InstalledModel(
            name=name,
            path=cache.blob(member.sha256),
            version=member.version,
            variant=member.variant,
            sha256=member.sha256,
            runtime=member.use_runtime,
            runtime_rule=None if member.hint is None else member.hint.rule,
            min_mnn_runtime=member.min_mnn_runtime,
            contract=member.contract,
            labels=None if labels is None else list(labels),
            probe_path=None if member.probe_sha256 is None else cache.blob(member.probe_sha256),
            backend=member.backend,
        )
    return models


def _pending_of(cache: _Cache, pend: object) -> Pending | None:
    if not isinstance(pend, dict):
        return None
    blobs = [b for b in pend.get("blobs") or [] if isinstance(b, dict)]
    total = sum(int(b.get("size", 0)) for b in blobs)
    remaining = 0
    for item in blobs:
        digest, size = str(item.get("sha256")), int(item.get("size", 0))
        if cache.has_blob(digest, size):
            continue
        try:
            remaining += max(0, size - cache.part(digest).stat().st_size)
        except OSError:
            remaining += size
    deferred = pend.get("deferred")
    return Pending(
        version=str(pend.get("version")),
        is_candidate=pend.get("is_candidate") is True,
        total_bytes=total,
        remaining_bytes=remaining,
        deferred=deferred if isinstance(deferred, str) else None,
        since=str(pend.get("since")),
    )


@dataclass(frozen=True)
class InstalledUnit:
    """One model or bundle installed in a client cache (:func:`installed_units`)."""

    unit: str
    kind: UnitKind
    version: str
    is_candidate: bool


def installed_units(cache_dir: str | os.PathLike[str]) -> list[InstalledUnit]:
    """Every model and bundle installed in a client cache directory, by name; reads disk only.

    Raises:
        CacheError: ``installed.json`` cannot be read.
    """
    cache = _Cache(Path(cache_dir))
    found: list[InstalledUnit] = []
    for kind in ("model", "bundle"):
        for name in cache.unit_names(kind):
            record = cache.read_installed(kind, name)
            if record is not None:
                found.append(InstalledUnit(name, kind, record.version, record.is_candidate))
    return sorted(found, key=lambda u: (u.unit, u.kind))


def unit_status(
    cache_dir: str | os.PathLike[str],
    unit: str,
    kind: UnitKind = "model",
    tier: str | None = None,
    *,
    verify: bool = True,
) -> Status:
    """The status of a model or bundle in a client cache directory, read from disk only.

    Needs no keys and no network (``edgereg pull --status``); see :meth:`Client.status`.
    """
    cache = _Cache(Path(cache_dir))
    record = cache.read_record(kind, unit)
    raw = cache.read_status(unit)
    try:
        pending = _pending_of(cache, raw.get("pending"))
    except (TypeError, ValueError):
        _log.warning("the pending record of %s is damaged; ignoring it", unit)
        pending = None
    err = raw.get("last_error")
    last_error = (
        LastError(code=str(err.get("code")), message=str(err.get("message")), at=str(err.get("at")))
        if isinstance(err, dict)
        else None
    )
    ready = False
    members: Mapping[str, InstalledModel] = {}
    if record is not None:
        members = _installed_models(cache, record)
        sizes = {m.sha256: m.size for m in record.members.values()}
        ready = True
        for digest in record.blobs:
            path = cache.blob(digest)
            if not path.is_file() or (sizes.get(digest) not in (None, path.stat().st_size)):
                ready = False
                break
            if verify and sha256_file(path) != digest:
                ready = False
                break
    return Status(
        unit=unit,
        kind=kind,
        tier=record.tier if record is not None else (tier or ""),
        version=record.version if record is not None else None,
        is_candidate=record.is_candidate if record is not None else False,
        bundled=record.bundled if record is not None else False,
        members=members,
        previous=record.previous.version if record and record.previous else None,
        pending=pending,
        last_error=last_error,
        bad_releases=cache.read_bad(unit),
        ready=ready,
    )


def unsafe_registry_keys(fetcher: Fetcher, model: str, tier: str) -> TrustedKeys:
    """Trust whatever keys the registry publishes for the current manifest (TOFU).

    Reads the manifest's signature key ids, fetches ``keys/<keyid>.pem`` for
    each and keeps those whose key id matches. This only proves the manifest
    and the keys came from the same place: anyone who can change the registry
    or the connection can change both. For trying things out, never for apps.

    Raises:
        TransportError: the manifest or no key could be fetched.
        TrustError: no published key matches a signature's key id.
    """
    with fetcher.open(manifest_path(model, tier)) as response:
        if response.status != 200:
            raise TransportError(f"{response.url} answered HTTP {response.status}")
        data = read_up_to(response, MAX_MANIFEST_BYTES + 1)
    try:
        envelope = strict_json_loads(data)
        keyids = [str(sig["keyid"]) for sig in envelope["signatures"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise Malformed("the manifest is not a signed envelope; no key ids to look up") from exc
    keys = []
    for keyid in _unique(keyids):
        if not SHA256_RE.fullmatch(keyid):
            continue
        with fetcher.open(layout.public_key_path(keyid)) as response:
            pem = read_up_to(response, 16 * 1024)
        key = load_public_key(pem)
        if key_id(key) == keyid:
            keys.append(key)
    if not keys:
        raise TrustError("the registry publishes no key matching the manifest's signatures")
    return TrustedKeys(keys)


def _unique(items: list[str]) -> Iterator[str]:
    seen: set[str] = set()
    for item in items:
        if item not in seen:
            seen.add(item)
            yield item


def _declared_metrics(decision: Decision, entry: ManifestEntry | BundleEntry) -> Metrics | None:
    """The app metrics of the unit's entry: an ``instead`` counts its outer entry's.

    The metrics are the unit's (docs/protocol.md §3): an ``instead`` carries none
    of its own, and a device that installs one records what the entry declares.
    """
    if entry.metrics is not None or decision.substitute is None:
        return entry.metrics
    manifest = decision.manifest
    outer = manifest.candidate if decision.is_candidate else manifest.stable
    if outer is None or outer.version != entry.version:
        return None
    return outer.metrics
