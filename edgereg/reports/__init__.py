"""Device reports: where they are stored and what the canary analysis reads of them.

``open_store(url)`` opens the store (``sqlite:///PATH`` or ``postgresql://...``);
``store.ingest(report, received_at)`` keeps the latest report of each install;
``store.summaries(unit, since)`` returns one :class:`ArmSummary` per tier, arm
and version, aggregated in the database; ``store.prune(older_than)`` applies
the retention.
"""

from edgereg.reports.store import (
    SCHEMA_VERSION,
    ReportStore,
    ReportStoreError,
    StoreURLError,
    open_store,
)
from edgereg.reports.summary import ArmSummary

__all__ = [
    "SCHEMA_VERSION",
    "ArmSummary",
    "ReportStore",
    "ReportStoreError",
    "StoreURLError",
    "open_store",
]
