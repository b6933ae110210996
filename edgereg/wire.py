"""Wire formats: moved to :mod:`edgereg.protocol.wire`; this module keeps the old import path.

A compatibility shim for code written against earlier releases. edgereg itself
never imports it (ruff's banned-api rule, ``TID251`` in pyproject.toml); new
code imports :mod:`edgereg.protocol.wire`.
"""

from edgereg.protocol.fields import SemVer
from edgereg.protocol.wire import (
    MAX_DOCUMENT_BYTES,
    PAYLOAD_TYPE_MANIFEST,
    PAYLOAD_TYPE_RELEASE,
    PAYLOAD_TYPE_STATE,
    SCHEMA_VERSION,
    Action,
    HistoryEvent,
    Manifest,
    ManifestEntry,
    ReleaseRecord,
    ReleaseVariant,
    RolloutSnapshot,
    RolloutState,
    UtcTime,
    W,
    WireError,
    WireModel,
    blob_path,
    format_time,
    from_bytes,
    sign_document,
    to_bytes,
    verify_document,
)

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "PAYLOAD_TYPE_MANIFEST",
    "PAYLOAD_TYPE_RELEASE",
    "PAYLOAD_TYPE_STATE",
    "SCHEMA_VERSION",
    "Action",
    "HistoryEvent",
    "Manifest",
    "ManifestEntry",
    "ReleaseRecord",
    "ReleaseVariant",
    "RolloutSnapshot",
    "RolloutState",
    "SemVer",
    "UtcTime",
    "W",
    "WireError",
    "WireModel",
    "blob_path",
    "format_time",
    "from_bytes",
    "sign_document",
    "to_bytes",
    "verify_document",
]
