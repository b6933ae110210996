"""A registry directory written by hand for client tests: blobs and signed manifests.

Until the registry publishes bundles, tests build manifests with
:mod:`edgereg.protocol.wire` and :func:`~edgereg.protocol.wire.sign_document`
(as tests/vectors/generate.py does) and serve the directory with
tests/statichttp.py. Each blob is random bytes named by its digest.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from edgereg.protocol.contract import BlobRef, IOContract
from edgereg.protocol.fields import Requirements, RuntimeHints
from edgereg.protocol.rules import in_cohort
from edgereg.protocol.wire import BundleEntry, Manifest, ManifestEntry, blob_path, sign_document
from edgereg.signing import Signer, generate_key

SALT = "0123456789abcdef"
MEMBERS = ("det", "cls", "rec")


def contract(labels: list[str] | None = None, labels_blob: BlobRef | None = None) -> IOContract:
    """A small classifier contract: one image input, one output."""
    return IOContract.model_validate(
        {
            "inputs": [
                {
                    "name": "image",
                    "dtype": "float32",
                    "shape": [1, 3, 32, 32],
                    "batch_axis": 0,
                    "kind": "image",
                    "layout": "NCHW",
                    "color": "RGB",
                    "mean": [0.5, 0.5, 0.5],
                    "std": [0.25, 0.25, 0.25],
                }
            ],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
            "task": {"kind": "classification", "output": "logits"},
            "labels": labels,
            "labels_blob": None if labels_blob is None else labels_blob.model_dump(),
        }
    )


@dataclass
class Kit:
    """A registry root, its signing key, and the manifests written so far."""

    root: Path
    signer: Signer = field(default_factory=lambda: Signer.from_pem(generate_key()[0]))
    sequence: int = 0
    blobs: dict[str, bytes] = field(default_factory=dict)

    def blob(self, data: bytes) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / blob_path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.blobs[digest] = data
        return BlobRef.of(digest, len(data))

    def entry(
        self,
        name: str,
        version: str,
        *,
        size: int = 40_000,
        runtime: str = "3.6.1",
        requires: Requirements | None = None,
        labels: list[str] | None = None,
        labels_as_blob: bool = False,
        probe: bool = False,
        backends: tuple[str, ...] = ("opencl", "cpu"),
    ) -> ManifestEntry:
        """A model entry with fresh blob bytes (deterministic per name and version)."""
        data = random.Random(f"{name}-{version}").randbytes(size)
        ref = self.blob(data)
        labels_ref = None
        if labels is not None and labels_as_blob:
            labels_ref = self.blob(json.dumps(labels).encode())
        probe_ref = self.blob(f"probe of {name} {version}".encode()) if probe else None
        return ManifestEntry(
            version=version,
            variant="int8",
            path=ref.path,
            sha256=ref.sha256,
            size=ref.size,
            min_mnn_runtime=runtime,
            runtime=RuntimeHints(threads=2, backends=list(backends)),
            contract=contract(labels=None if labels_as_blob else labels, labels_blob=labels_ref),
            requires=requires,
            probe=probe_ref,
        )

    def bundle_entry(
        self,
        version: str,
        *,
        members: tuple[str, ...] = MEMBERS,
        size: int = 40_000,
        requires: Requirements | None = None,
        **member_options: Any,
    ) -> BundleEntry:
        return BundleEntry(
            version=version,
            # Each member's own version happens to equal the bundle's here.
            members={
                name: self.entry(name, version, size=size, **member_options) for name in members
            },
            requires=requires,
        )

    def publish(
        self,
        unit: str,
        stable: ManifestEntry | BundleEntry | None,
        candidate: ManifestEntry | BundleEntry | None = None,
        *,
        percent: float = 50.0,
        tier: str = "high",
        expires: datetime | None = None,
        sequence: int | None = None,
    ) -> bytes:
        """Sign and write ``manifests/<unit>/<tier>.json``; returns the envelope bytes."""
        self.sequence = sequence if sequence is not None else self.sequence + 1
        manifest = Manifest(
            model=unit,
            tier=tier,
            sequence=self.sequence,
            expires=expires
            or datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=30),
            stable=stable,
            candidate=candidate,
            percent=percent if candidate is not None else None,
            salt=SALT if candidate is not None else None,
        )
        data = sign_document(manifest, [self.signer])
        path = self.root / "manifests" / unit / f"{tier}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data


def device_id(inside: bool, percent: float = 50.0) -> str:
    """A device id inside (or outside) the cohort of :data:`SALT` at ``percent``."""
    n = 0
    while in_cohort(f"device-{n}", SALT, percent) != inside:
        n += 1
    return f"device-{n}"
