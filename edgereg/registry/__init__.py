"""The model registry: publish signed releases and move their rollouts on.

Layout (the same on a directory, S3 or any static host)::

    blobs/sha256/<hex>                    immutable artifacts
    models/<name>/releases/<semver>.json  signed release records
    models/<name>/state.json              signed rollout state
    manifests/<name>/<tier>.json          signed, what an app of that tier fetches
    keys/<keyid>.pem                      public keys only
"""

from edgereg.registry._manifests import build_manifests, entry_for
from edgereg.registry._registry import (
    PublishResult,
    Registry,
    VerifyReport,
    manifest_key,
    release_key,
    state_key,
    utcnow,
)
from edgereg.registry._release import PreparedRelease, ReleaseError, prepare_release
from edgereg.registry._status import ModelStatus, TierStatus, model_status
from edgereg.registry._transitions import RolloutError

__all__ = [
    "ModelStatus",
    "PreparedRelease",
    "PublishResult",
    "Registry",
    "ReleaseError",
    "RolloutError",
    "TierStatus",
    "VerifyReport",
    "build_manifests",
    "entry_for",
    "manifest_key",
    "model_status",
    "prepare_release",
    "release_key",
    "state_key",
    "utcnow",
]
