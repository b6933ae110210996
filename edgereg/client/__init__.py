"""The reference client SDK: fetch, verify, choose, download, install; never break the app.

Typical use::

    from edgereg.client import Client, DeviceProfile, TrustedKeys

    client = Client(
        "https://models.example.com/registry/",
        TrustedKeys.from_pems([REGISTRY_PUBLIC_KEY_PEM]),
        cache_dir,
        model="digits",
        device=DeviceProfile(device_id=install_id, ram_mb=6144, cpu_cores=8,
                             mnn_runtime="3.6.1"),
        tier="high",
    )
    result = client.fetch()          # never raises for network, trust or disk problems
    if result.path is not None:
        load_mnn_model(result.path, result.runtime)
    if result.error:
        log.warning("model update failed (%s): %s", result.error_code, result.error)

A bundle (models that ship together) is ``Client(..., bundle="ocr")``: every
member is verified before one pointer switch, and ``result.members`` holds
each model with its I/O contract and labels. ``status()``, ``revert()``,
``DownloadPolicy`` / ``Conditions``, ``BundledRelease`` (offline first launch),
``install_check=``, ``fetch(cancel=CancelToken(), progress=...)``, ``check()``,
``add_listener()``, ``delete()`` and :func:`installed_units` are described in
docs/protocol.md §10.

:func:`decide` is the pure trust core the client runs on every manifest; a
port to another language can be checked against the conformance vectors in
tests/vectors/ with it. docs/protocol.md describes the protocol.
"""

from edgereg.client._cache import CacheError, NoSpace
from edgereg.client._client import (
    Client,
    InstalledUnit,
    installed_units,
    manifest_path,
    unit_status,
    unsafe_registry_keys,
)
from edgereg.client._control import Cancelled, CancelToken, ModelChange, UpdateCheck
from edgereg.client._fetcher import Fetcher, Limits, open_fetcher
from edgereg.client._health import HealthLedger, Revert
from edgereg.client._installed import (
    InstallCheck,
    InstalledModel,
    LastError,
    MemberFiles,
    Pending,
    Status,
    UnitKind,
)
from edgereg.client._policy import BundledRelease, Conditions, DownloadPolicy
from edgereg.client._reporter import DeviceFacts, Reporter
from edgereg.client._results import BadRelease, FetchResult
from edgereg.client._selftest import (
    BackendRunner,
    BackendUnavailableError,
    SelfTest,
    SelfTestResult,
)
from edgereg.protocol.decision import (
    MAX_MANIFEST_BYTES,
    BlobCheck,
    Decision,
    compare_versions,
    decide,
)
from edgereg.protocol.envelope import TrustedKeys
from edgereg.protocol.errors import TransportError, TrustError
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
from edgereg.protocol.rules import DeviceProfile

__all__ = [
    "MAX_MANIFEST_BYTES",
    "BackendRunner",
    "BackendUnavailableError",
    "BadBlob",
    "BadRelease",
    "BadSignature",
    "BlobCheck",
    "BlobTooLarge",
    "BundledRelease",
    "CacheError",
    "CancelToken",
    "Cancelled",
    "Client",
    "Conditions",
    "Decision",
    "DeviceFacts",
    "DeviceProfile",
    "DownloadPolicy",
    "Expired",
    "FetchResult",
    "Fetcher",
    "HealthLedger",
    "InstallCheck",
    "InstalledModel",
    "InstalledUnit",
    "LastError",
    "Limits",
    "Malformed",
    "MemberFiles",
    "ModelChange",
    "NoSpace",
    "Pending",
    "Rejected",
    "Reporter",
    "Revert",
    "Rollback",
    "RuntimeTooOld",
    "SelfTest",
    "SelfTestResult",
    "Status",
    "TransportError",
    "TrustError",
    "TrustedKeys",
    "UnitKind",
    "UnknownKey",
    "UpdateCheck",
    "WrongModel",
    "WrongTier",
    "compare_versions",
    "decide",
    "installed_units",
    "manifest_path",
    "open_fetcher",
    "unit_status",
    "unsafe_registry_keys",
]
