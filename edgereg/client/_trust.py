"""The client's trust decisions: moved to :mod:`edgereg.protocol.decision`.

This module keeps the old import path; :mod:`edgereg.client` re-exports the
same names.
"""

from edgereg.protocol.decision import (
    MAX_MANIFEST_BYTES,
    BlobCheck,
    Decision,
    compare_versions,
    decide,
)
from edgereg.protocol.reasons import (
    BadBlob,
    BadSignature,
    BlobTooLarge,
    Expired,
    Malformed,
    Rejected,
    Rollback,
    RuntimeTooOld,
    UnknownKey,
    WrongModel,
    WrongTier,
)

__all__ = [
    "MAX_MANIFEST_BYTES",
    "BadBlob",
    "BadSignature",
    "BlobCheck",
    "BlobTooLarge",
    "Decision",
    "Expired",
    "Malformed",
    "Rejected",
    "Rollback",
    "RuntimeTooOld",
    "UnknownKey",
    "WrongModel",
    "WrongTier",
    "compare_versions",
    "decide",
]
