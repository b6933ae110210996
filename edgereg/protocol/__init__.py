"""The contract between the registry, the server, the client and apps: nothing else of edgereg.

Like python-tuf's ``tuf/api``, this package imports only pydantic and
cryptography, so the registry, ``edgereg serve`` and the client SDK (and a
port checking itself against tests/vectors/) share one definition of each
rule:

- :mod:`~edgereg.protocol.layout`: registry paths;
- :mod:`~edgereg.protocol.patterns`: the name and sha256 (key id) rules, compiled once;
- :mod:`~edgereg.protocol.fields`: names, versions, digests, times, percents,
  runtime hints and tier rules;
- :mod:`~edgereg.protocol.envelope`: keys, DSSE envelopes, the PAE and the one
  envelope parser;
- :mod:`~edgereg.protocol.wire`: the signed documents (manifest, rollout
  state, release record) and their one serialization;
- :mod:`~edgereg.protocol.rules`: cohorts, tiers, the entry a device runs;
- :mod:`~edgereg.protocol.decision`: the client's decision and blob check;
- :mod:`~edgereg.protocol.contract`: the I/O contract and the labels blob;
- :mod:`~edgereg.protocol.probe`: the golden probe and its check;
- :mod:`~edgereg.protocol.reports`: the device report and its one parser;
- :mod:`~edgereg.protocol.reasons`: one exception per reason code, and the
  client's other codes with what the app does about each;
- :mod:`~edgereg.protocol.build_outputs`: what publish reads from a build.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgereg.protocol._json import MAX_JSON_DEPTH, canonical_json, strict_json_loads
    from edgereg.protocol.decision import MAX_MANIFEST_BYTES, BlobCheck, Decision, decide
    from edgereg.protocol.envelope import Signer, TrustedKeys, pae, sign_envelope, verify_envelope
    from edgereg.protocol.errors import EdgeregError, TrustError
    from edgereg.protocol.reasons import CLIENT_REASONS, REASONS, ClientReason, Rejected
    from edgereg.protocol.rules import (
        DeviceProfile,
        choose_entry,
        cohort_bucket,
        in_cohort,
        resolve_tier,
    )
    from edgereg.protocol.wire import (
        PAYLOAD_TYPE_MANIFEST,
        PAYLOAD_TYPE_RELEASE,
        PAYLOAD_TYPE_STATE,
        Manifest,
        ManifestEntry,
        ReleaseRecord,
        RolloutState,
        from_bytes,
        to_bytes,
    )

# The names below load with their module on first use (PEP 562), so importing one
# module of the protocol (edgereg.protocol.errors, for the exit codes every command
# shares) does not import pydantic and cryptography: `edgereg --version` and
# `edgereg analyze` start faster (benchmarks/analyze.py).
_WHERE = {
    "BlobCheck": "edgereg.protocol.decision",
    "CLIENT_REASONS": "edgereg.protocol.reasons",
    "ClientReason": "edgereg.protocol.reasons",
    "Decision": "edgereg.protocol.decision",
    "DeviceProfile": "edgereg.protocol.rules",
    "EdgeregError": "edgereg.protocol.errors",
    "MAX_JSON_DEPTH": "edgereg.protocol._json",
    "MAX_MANIFEST_BYTES": "edgereg.protocol.decision",
    "Manifest": "edgereg.protocol.wire",
    "ManifestEntry": "edgereg.protocol.wire",
    "PAYLOAD_TYPE_MANIFEST": "edgereg.protocol.wire",
    "PAYLOAD_TYPE_RELEASE": "edgereg.protocol.wire",
    "PAYLOAD_TYPE_STATE": "edgereg.protocol.wire",
    "REASONS": "edgereg.protocol.reasons",
    "Rejected": "edgereg.protocol.reasons",
    "ReleaseRecord": "edgereg.protocol.wire",
    "RolloutState": "edgereg.protocol.wire",
    "Signer": "edgereg.protocol.envelope",
    "TrustError": "edgereg.protocol.errors",
    "TrustedKeys": "edgereg.protocol.envelope",
    "canonical_json": "edgereg.protocol._json",
    "choose_entry": "edgereg.protocol.rules",
    "cohort_bucket": "edgereg.protocol.rules",
    "decide": "edgereg.protocol.decision",
    "from_bytes": "edgereg.protocol.wire",
    "in_cohort": "edgereg.protocol.rules",
    "pae": "edgereg.protocol.envelope",
    "resolve_tier": "edgereg.protocol.rules",
    "sign_envelope": "edgereg.protocol.envelope",
    "strict_json_loads": "edgereg.protocol._json",
    "to_bytes": "edgereg.protocol.wire",
    "verify_envelope": "edgereg.protocol.envelope",
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
    "CLIENT_REASONS",
    "MAX_JSON_DEPTH",
    "MAX_MANIFEST_BYTES",
    "PAYLOAD_TYPE_MANIFEST",
    "PAYLOAD_TYPE_RELEASE",
    "PAYLOAD_TYPE_STATE",
    "REASONS",
    "BlobCheck",
    "ClientReason",
    "Decision",
    "DeviceProfile",
    "EdgeregError",
    "Manifest",
    "ManifestEntry",
    "Rejected",
    "ReleaseRecord",
    "RolloutState",
    "Signer",
    "TrustError",
    "TrustedKeys",
    "canonical_json",
    "choose_entry",
    "cohort_bucket",
    "decide",
    "from_bytes",
    "in_cohort",
    "pae",
    "resolve_tier",
    "sign_envelope",
    "strict_json_loads",
    "to_bytes",
    "verify_envelope",
]
