"""Gather a model's build outputs into a release record, refusing anything not fit to ship."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import semver
from pydantic import ValidationError

from edgereg._files import sha256_file
from edgereg.build.fit import MeasuredPeak, ceiling_problems, measured_peak
from edgereg.build.outputs import (
    CONTRACT,
    FAILED,
    LABELS,
    NOT_BUILT,
    PROBE,
    PROBE_DATA,
    STALE,
    UNREADABLE,
    BuildOutputs,
    HostBenchmark,
    read_json,
    read_outputs,
)
from edgereg.config import Config
from edgereg.errors import ConfigError, UsageError
from edgereg.protocol.build_outputs import BuildMetrics, BuildOutputError, Provenance
from edgereg.protocol.contract import BlobRef, IOContract
from edgereg.protocol.probe import GoldenProbe
from edgereg.protocol.wire import ReleaseRecord, ReleaseVariant, WireError, from_bytes
from edgereg.registry._errors import ReleaseError as ReleaseError  # its home before

if TYPE_CHECKING:
    from edgereg.registry._registry import ReportUrl as StateReportUrl


@dataclass(frozen=True)
class PreparedRelease:
    """A release record and the local files of its blobs."""

    record: ReleaseRecord
    blobs: dict[str, Path]

    def same_content(self, other: ReleaseRecord) -> bool:
        """True when ``other`` ships exactly the same artifacts to the same tiers."""
        return {name: v.sha256 for name, v in other.variants.items()} == {
            name: v.sha256 for name, v in self.record.variants.items()
        } and other.tiers == self.record.tiers


def prepare_release(
    config: Config, model_name: str, out_root: Path, *, version: str, now: datetime
) -> PreparedRelease:
    """Check every variant's build and assemble the release record.

    Raises:
        ReleaseError: a variant is not built, failed a gate, or is stale
            against models.toml or its source; the message lists them all.
    """
    if model_name not in config.models:
        raise ReleaseError(
            f"no model '{model_name}' in {config.path}; models: {', '.join(config.models)}"
        )
    model = config.models[model_name]
    problems: list[str] = []
    variants: dict[str, ReleaseVariant] = {}
    blobs: dict[str, Path] = {}
    for variant_name, variant in model.variants.items():
        outputs = read_outputs(config, model_name, variant_name, out_root)
        where = f"{model_name}/{variant_name}"
        artifact = outputs.artifact
        if outputs.status == NOT_BUILT:
            problems.append(f"{where}: not built (no {artifact}); it may have failed a gate")
            continue
        if outputs.status == FAILED:
            reasons = "; ".join(outputs.metrics.get("failed") or []) or "see metrics.json"
            failure = outputs.metrics.get("failure")
            error = outputs.metrics.get("error")
            if isinstance(failure, str) and failure:
                # Not a gate: the quantizer crashed or failed (its signal is in reasons).
                problems.append(f"{where}: {failure} ({reasons})")
            elif isinstance(error, dict) and error.get("stage") not in ("gate", "arm verify"):
                # Not a gate either: a stage failed (its message is in reasons).
                problems.append(f"{where}: build failed ({reasons})")
            else:
                problems.append(f"{where}: failed its gates ({reasons})")
            continue
        if outputs.status == UNREADABLE:
            problems.append(f"{where}: build outputs unreadable ({outputs.problem})")
            continue
        if outputs.status == STALE:
            problems.append(f"{where}: stale: models.toml or the source changed since it was built")
            continue
        try:
            metrics = BuildMetrics.parse(outputs.metrics)
            provenance = Provenance.parse(outputs.provenance)
        except BuildOutputError as exc:
            problems.append(f"{where}: build outputs unreadable ({exc})")
            continue
        failed = metrics.failed_gates()
        if failed:
            problems.append(f"{where}: failed gates {', '.join(failed)}")
            continue
        if (provenance.model, provenance.variant, provenance.tier) != (
            model_name,
            variant_name,
            variant.tier,
        ):
            problems.append(
                f"{where}: its provenance is of {provenance.model}/{provenance.variant} for "
                f"tier {provenance.tier}"
            )
            continue
        digest = sha256_file(artifact)
        if digest != provenance.artifact.sha256:
            problems.append(f"{where}: {artifact} differs from the one its provenance records")
            continue
        try:
            shipped = _self_description(outputs, provenance, digest)
        except _NotShippable as exc:
            problems.append(f"{where}: {exc}")
            continue
        variants[variant_name] = ReleaseVariant(
            tier=variant.tier,
            sha256=digest,
            size=artifact.stat().st_size,
            metrics=_with_peak_memory(
                _with_host_figures(outputs.metrics, outputs.host_benchmark),
                measured_peak(outputs, model_name, variant_name),
            ),
            provenance=outputs.provenance,
            min_mnn_runtime=provenance.min_mnn_runtime,
            # What models.toml declares (4 threads when unsaid), never the host
            # sweep's count: the build host is not a phone (edgereg/build/threads.py).
            runtime=variant.runtime.hints,
            runtime_trials=variant.runtime.trial_set(),
            contract=shipped.contract,
            probe=shipped.probe,
            probe_data=shipped.probe_data,
            **_ship_around(metrics),
        )
        blobs[digest] = artifact
        blobs.update(shipped.blobs)
    if not problems and config.bundle_of(model_name) is None:
        # A bundle's members are summed by the bundle, not checked one by one.
        problems += ceiling_problems(config, model_name, out_root, require_measured=True)
    if problems:
        raise ReleaseError(
            f"cannot publish {model_name}:\n" + "\n".join(f"  {p}" for p in problems),
            hint="Run `dvc repro` (or `edgereg build MODEL VARIANT`) and fix what the gates "
            "report, then publish again.",
        )
    tiers = {tier: name for tier, (name, _) in config.tier_variants(model_name).items()}
    record = ReleaseRecord(
        model=model_name,
        version=version,
        created=now,
        variants=variants,
        tiers=tiers,
        tier_order=list(tiers),
        requires=model.requires,
        metrics={name: m.declaration() for name, m in model.metrics.items()} or None,
    )
    return PreparedRelease(record=record, blobs=blobs)


class _NotShippable(Exception):
    """A variant's contract or probe is missing or does not match what its build recorded."""


@dataclass(frozen=True)
class _SelfDescription:
    contract: IOContract
    probe: BlobRef
    probe_data: BlobRef | None
    blobs: dict[str, Path]


_REBUILD = (
    "built before I/O contracts and golden probes existed (no {name}): rebuild it "
    "(`dvc repro`, or `edgereg build MODEL VARIANT`)"
)


def _self_description(
    outputs: BuildOutputs, provenance: Provenance, artifact_sha256: str
) -> _SelfDescription:
    """The variant's contract and probe, checked against its provenance, and their blobs.

    Raises:
        _NotShippable: what is missing or differs, and that a rebuild fixes it.
    """
    files: dict[str, Path] = {}
    for name, recorded in ((CONTRACT, provenance.contract), (PROBE, provenance.probe)):
        path = outputs.out_dir / name
        if recorded is None or not path.is_file():
            raise _NotShippable(_REBUILD.format(name=name))
        if sha256_file(path) != recorded.sha256:
            raise _NotShippable(f"{path} differs from the one its provenance records")
        files[name] = path
    try:
        contract = IOContract.model_validate(read_json(files[CONTRACT]))
    except (OSError, ValueError, ValidationError) as exc:
        raise _NotShippable(f"{files[CONTRACT]} is not an I/O contract: {exc}") from exc
    probe_data = files[PROBE].read_bytes()
    try:
        probe = from_bytes(GoldenProbe, probe_data)
    except WireError as exc:
        raise _NotShippable(f"{files[PROBE]}: {exc}") from exc
    if probe.artifact_sha256 != artifact_sha256:
        raise _NotShippable(f"{files[PROBE]} was computed for another artifact")
    probe_sha256 = hashlib.sha256(probe_data).hexdigest()
    blobs = {probe_sha256: files[PROBE]}
    data_ref = None
    if probe.data_sha256 is not None:
        # The tensors too large to inline: a blob beside the model, named by the probe.
        data_file = outputs.out_dir / PROBE_DATA
        recorded = provenance.probe_data
        if recorded is None or not data_file.is_file():
            raise _NotShippable(_REBUILD.format(name=PROBE_DATA))
        if sha256_file(data_file) != probe.data_sha256 or recorded.sha256 != probe.data_sha256:
            raise _NotShippable(f"{data_file} differs from the one its probe and provenance name")
        data_ref = BlobRef.of(probe.data_sha256, data_file.stat().st_size)
        blobs[probe.data_sha256] = data_file
    if contract.labels_blob is not None:
        labels = outputs.out_dir / LABELS
        if not labels.is_file() or sha256_file(labels) != contract.labels_blob.sha256:
            raise _NotShippable(
                f"{labels} is missing or differs from the labels blob its contract names; "
                "rebuild it (`dvc repro`)"
            )
        blobs[contract.labels_blob.sha256] = labels
    return _SelfDescription(contract, BlobRef.of(probe_sha256, len(probe_data)), data_ref, blobs)


def _ship_around(metrics: BuildMetrics) -> dict[str, Any]:
    """The variant's ``avoid_cpu`` and ``instead``, as its ARM verification ran them.

    Taken from the build's record, not from models.toml: the release carries
    exactly what was verified (a models.toml edit since then makes the build
    stale, and stale builds are refused above).
    """
    if metrics.arm is None or not metrics.arm.avoid_cpu:
        return {}
    return {"avoid_cpu": list(metrics.arm.avoid_cpu), "instead": metrics.arm.instead}


def _with_host_figures(metrics: dict[str, Any], host: HostBenchmark | None) -> dict[str, Any]:
    """metrics.json plus the build host's benchmark, labelled as host figures."""
    if host is None:
        return metrics
    return {**metrics, "host_benchmark": host.release_metrics()}


#: Where a release record's variant metrics carry the peak its manifest entries announce.
PEAK_MEMORY_KEY = "peak_memory_mb"


def _with_peak_memory(metrics: dict[str, Any], peak: MeasuredPeak | None) -> dict[str, Any]:
    """The measured peak (MiB) the manifest entries carry (fit rule (d)), when there is one."""
    if peak is None:
        return metrics
    return {**metrics, PEAK_MEMORY_KEY: round(peak.mb, 2)}


# --- the rules of `edgereg publish`, before anything is prepared or uploaded ----------


def check_publishable_unit(config: Config, unit: str) -> None:
    """A unit publishes alone unless it is a bundle's member: one rollout decides a bundle.

    Raises:
        UsageError: ``unit`` is a model that ships in a bundle.
    """
    bundle = config.bundle_of(unit)
    if bundle is not None:
        raise UsageError(
            f"model '{unit}' ships in bundle '{bundle}' ([bundles.{bundle}] of "
            f"{config.path}), so it is published only with the bundle; published alone, "
            "devices could run it beside members of another version",
            hint=f"Publish the bundle: edgereg publish {bundle} --canary 5%",
        )


def release_version(config: Config, unit: str, version: str | None = None) -> str:
    """The version a release of ``unit`` gets: ``version`` (--version), else models.toml's.

    Raises:
        UsageError: not a semantic version like 1.2.0.
    """
    if version is None:
        declared = config.bundles[unit] if unit in config.bundles else config.models[unit]
        version = declared.version
    if not semver.Version.is_valid(version):
        raise UsageError(f"--version {version!r} is not a semantic version like 1.2.0")
    return version


def report_url_of(config: Config | None) -> StateReportUrl:
    """[reports] url, checked against the wire format; KEEP (the state's) without models.toml.

    Raises:
        ConfigError: the url is neither an http(s) URL nor a registry-relative path.
    """
    from pydantic import TypeAdapter

    from edgereg.protocol.wire import ReportUrl
    from edgereg.registry._registry import KEEP

    if config is None:
        return KEEP
    url = config.reports.url
    if url is None:
        return None
    try:
        return TypeAdapter(ReportUrl).validate_python(url)
    except ValidationError as exc:
        raise ConfigError(
            f"{url!r} is not a report URL: expected an http(s) URL without spaces, or a "
            "path relative to the registry root such as v1/reports",
            file=str(config.path),
            key_path="reports.url",
        ) from exc
