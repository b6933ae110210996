"""What the app allows a fetch to do: download conditions, storage reserve, a shipped release.

Pure values; :class:`~edgereg.client.Client` applies them. Kept apart from
the updater because the app changes them for other reasons (a settings
screen, a build step) than the updater changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BundledRelease", "Conditions", "DownloadPolicy"]

DEFAULT_RESERVE_BYTES = 8 * 1024 * 1024
"""Free space left over after a download: the app and the OS need room too."""


@dataclass(frozen=True)
class Conditions:
    """The device's state now, as the app sees it (None: the app did not say).

    A condition the app does not say is unknown, and an unknown condition
    counts as unmet (docs/protocol.md §8): ``Conditions()`` defers every
    download a policy restricts.

    Attributes:
        metered: The active network is metered (cellular, a hotspot).
        charging: The device is charging.
        idle: The device is idle (not in use: Android's ``isDeviceIdleMode``).
        storage_low: The OS says storage is low (Android's storage-low state;
            iOS: little capacity left for opportunistic use).
    """

    metered: bool | None = None
    charging: bool | None = None
    idle: bool | None = None
    storage_low: bool | None = None


@dataclass(frozen=True)
class DownloadPolicy:
    """When the app lets the client download blobs (a manifest is always fetched: it is small).

    Attributes:
        allow_metered: Download over a metered network. When False, a fetch
            whose conditions do not say ``metered=False`` is deferred.
        require_charging: Download only while charging. When True, a fetch
            whose conditions do not say ``charging=True`` is deferred.
        require_idle: Download only while the device is idle. When True, a
            fetch whose conditions do not say ``idle=True`` is deferred.
        require_storage_not_low: Download only while storage is not low. When
            True, a fetch whose conditions do not say ``storage_low=False`` is
            deferred.
        reserve_bytes: Free space that must remain after the bytes still to
            download; less is the ``no-space`` error, nothing downloaded.
    """

    allow_metered: bool = True
    require_charging: bool = False
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    require_idle: bool = False
    require_storage_not_low: bool = False

    def __post_init__(self) -> None:
        if (
            isinstance(self.reserve_bytes, bool)
            or not isinstance(self.reserve_bytes, int)
            or self.reserve_bytes < 0
        ):
            raise ValueError(
                f"reserve_bytes must be a whole number of bytes >= 0, got {self.reserve_bytes!r}"
            )

    def unmet(self, conditions: Conditions) -> str | None:
        """Why a download must wait, or None when it may run (docs/protocol.md §8).

        The first unmet condition in the protocol's order: ``metered``,
        ``not-charging``, ``not-idle``, ``storage-low``. An unknown condition
        counts as unmet: a policy the app set is never broken because the app
        forgot to say what the network is.
        """
        if not self.allow_metered and conditions.metered is not False:
            return "metered"
        if self.require_charging and conditions.charging is not True:
            return "not-charging"
        if self.require_idle and conditions.idle is not True:
            return "not-idle"
        if self.require_storage_not_low and conditions.storage_low is not False:
            return "storage-low"
        return None


@dataclass(frozen=True)
class BundledRelease:
    """A release the app ships inside its package, for the first launch without network.

    Attributes:
        manifest: The signed manifest envelope bytes exactly as the registry
            served them (``manifests/<unit>/<tier>.json``).
        blobs_dir: Where its blobs are, each named by its sha256 (``<hex>``),
            or a copy of a registry's ``blobs/sha256/<hex>`` tree.
    """

    manifest: bytes
    blobs_dir: Path

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str], unit: str, tier: str) -> BundledRelease:
        """The shipped release in ``directory``: a registry copy, or a manifest beside its blobs.

        Looks for ``manifests/<unit>/<tier>.json``, then ``<tier>.json``, then
        ``manifest.json``.

        Raises:
            ValueError: no manifest there, naming where it looked.
        """
        root = Path(directory)
        tried = [root / "manifests" / unit / f"{tier}.json", root / f"{tier}.json"]
        tried.append(root / "manifest.json")
        for path in tried:
            if path.is_file():
                return cls(manifest=path.read_bytes(), blobs_dir=root)
        raise ValueError(
            f"no shipped manifest in {root}: looked for "
            + ", ".join(str(path.relative_to(root)) for path in tried)
        )

    def blob(self, sha256: str) -> Path | None:
        """The shipped file of the blob ``sha256``, or None when it is not there."""
        for path in (self.blobs_dir / sha256, self.blobs_dir / "blobs" / "sha256" / sha256):
            if path.is_file():
                return path
        return None
