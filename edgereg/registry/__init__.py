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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgereg.registry._auto import AutoDecision, AutoResult, run_auto
    from edgereg.registry._bundle import PreparedBundle, prepare_bundle_release
    from edgereg.registry._errors import ReleaseError
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

# The names below load with their module on first use (PEP 562): reading the
# registry (status, history, verify, serve) does not import what publishing
# needs (the build outputs, models.toml's schema) nor `rollout --auto`'s
# workflow (benchmarks/startup.py).
_WHERE = {
    "AutoDecision": "edgereg.registry._auto",
    "AutoResult": "edgereg.registry._auto",
    "build_manifests": "edgereg.registry._manifests",
    "bundle_entry_for": "edgereg.registry._manifests",
    "check_publishable_unit": "edgereg.registry._release",
    "entry_for": "edgereg.registry._manifests",
    "KEEP": "edgereg.registry._registry",
    "manifest_key": "edgereg.registry._registry",
    "member_entry_for": "edgereg.registry._manifests",
    "MemberStatus": "edgereg.registry._status",
    "model_status": "edgereg.registry._status",
    "ModelStatus": "edgereg.registry._status",
    "pause": "edgereg.registry._transitions",
    "prepare_bundle_release": "edgereg.registry._bundle",
    "prepare_release": "edgereg.registry._release",
    "PreparedBundle": "edgereg.registry._bundle",
    "PreparedRelease": "edgereg.registry._release",
    "promote": "edgereg.registry._transitions",
    "PublishResult": "edgereg.registry._registry",
    "Registry": "edgereg.registry._registry",
    "release_key": "edgereg.registry._registry",
    "release_version": "edgereg.registry._release",
    "ReleaseError": "edgereg.registry._errors",
    "report_url_of": "edgereg.registry._release",
    "resign": "edgereg.registry._transitions",
    "resume": "edgereg.registry._transitions",
    "rollback": "edgereg.registry._transitions",
    "RolloutError": "edgereg.registry._transitions",
    "run_auto": "edgereg.registry._auto",
    "set_percent": "edgereg.registry._transitions",
    "state_key": "edgereg.registry._registry",
    "TierStatus": "edgereg.registry._status",
    "unit_entry_for": "edgereg.registry._manifests",
    "utcnow": "edgereg.registry._registry",
    "VerifyReport": "edgereg.registry._registry",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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
