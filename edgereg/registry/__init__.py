"""The model registry: publish signed releases and move their rollouts on.

A rollout unit is a model, or a bundle of models that ship together (one
version, one state, one rollout; its release record is a ``BundleRecord``).

Layout (the same on a directory, S3 or any static host)::

    blobs/sha256/<hex>                    immutable artifacts
    models/<name>/releases/<semver>.json  signed release records
    models/<name>/state.json              signed rollout state
    manifests/<name>/<tier>.json          signed, what an app of that tier fetches
    keys/<keyid>.pem                      public keys only
"""

from edgereg.registry._auto import AutoDecision, AutoResult, run_auto
from edgereg.registry._bundle import PreparedBundle, prepare_bundle_release
from edgereg.registry._manifests import (
    build_manifests,
    bundle_entry_for,
    entry_for,
    member_entry_for,
    unit_entry_for,
)
from edgereg.registry._registry import (
    KEEP,
    PublishResult,
    Registry,
    VerifyReport,
    manifest_key,
    release_key,
    state_key,
    utcnow,
)
from edgereg.registry._release import (
    PreparedRelease,
    ReleaseError,
    check_publishable_unit,
    prepare_release,
    release_version,
    report_url_of,
)
from edgereg.registry._status import MemberStatus, ModelStatus, TierStatus, model_status
from edgereg.registry._transitions import (
    RolloutError,
    pause,
    promote,
    resign,
    resume,
    rollback,
    set_percent,
)

__all__ = [
    "KEEP",
    "AutoDecision",
    "AutoResult",
    "MemberStatus",
    "ModelStatus",
    "PreparedBundle",
    "PreparedRelease",
    "PublishResult",
    "Registry",
    "ReleaseError",
    "RolloutError",
    "TierStatus",
    "VerifyReport",
    "build_manifests",
    "bundle_entry_for",
    "check_publishable_unit",
    "entry_for",
    "manifest_key",
    "member_entry_for",
    "model_status",
    "pause",
    "prepare_bundle_release",
    "prepare_release",
    "promote",
    "release_key",
    "release_version",
    "report_url_of",
    "resign",
    "resume",
    "rollback",
    "run_auto",
    "set_percent",
    "state_key",
    "unit_entry_for",
    "utcnow",
]
