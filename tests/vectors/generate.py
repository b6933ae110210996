"""Generate the client conformance vectors and the manifest JSON Schema.

Usage::

    .venv/bin/python tests/vectors/generate.py          # rewrite the golden files
    .venv/bin/python tests/vectors/generate.py --check  # exit 1 if any is stale

Each ``tests/vectors/<name>.json`` holds the inputs of one client decision
(the manifest envelope bytes in base64, the trusted public keys, the model and
tier asked for, the device, the highest sequence already seen, the current
time) and the decision the reference implementation (``edgereg.client.decide``)
makes: accept with the chosen entry, or reject with a reason code. A Kotlin or
Swift client passes when it makes the same decision for every file.

Everything is fixed: the keys (tests/vectors/keys/, TEST ONLY), the times, the
salt and the digests, and Ed25519 signatures are deterministic, so running
this again writes the same bytes. tests/test_client.py checks that it does.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgereg.client import Rejected, TrustedKeys, decide
from edgereg.config import RuntimeHints
from edgereg.rollout import in_cohort
from edgereg.signing import Signer, canonical_json, sign_envelope
from edgereg.wire import (
    PAYLOAD_TYPE_STATE,
    Manifest,
    ManifestEntry,
    blob_path,
    format_time,
    sign_document,
    to_bytes,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KEYS = HERE / "keys"
SCHEMA_FILE = ROOT / "docs" / "schemas" / "manifest.schema.json"

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
EXPIRES = datetime(2025, 7, 1, 12, 0, tzinfo=timezone.utc)
SALT = "5f3a9c0e1b2d4c6a"
PERCENT = 25.0
APP_RUNTIME = "3.6.1"


def _signer(name: str) -> Signer:
    return Signer.from_pem((KEYS / f"test-only-{name}.private.pem").read_bytes())


def _entry(version: str, variant: str = "int8", *, runtime: str = "3.6.1") -> ManifestEntry:
    digest = hashlib.sha256(f"digits {version} {variant}".encode()).hexdigest()
    return ManifestEntry(
        version=version,
        variant=variant,
        path=blob_path(digest),
        sha256=digest,
        size=1_234_567,
        min_mnn_runtime=runtime,
        runtime=RuntimeHints(threads=4, backends=["opencl", "cpu"], precision="normal"),
    )


def _manifest(**changes: Any) -> Manifest:
    fields: dict[str, Any] = {
        "model": "digits",
        "tier": "mid",
        "sequence": 9,
        "expires": EXPIRES,
        "stable": _entry("1.0.0"),
    }
    fields.update(changes)
    return Manifest(**fields)


def _rollout(**changes: Any) -> Manifest:
    fields: dict[str, Any] = {"candidate": _entry("1.1.0"), "percent": PERCENT, "salt": SALT}
    fields.update(changes)
    return _manifest(**fields)


def _device(inside: bool) -> str:
    """The first device id ``device-<n>`` inside (or outside) the fixed rollout's cohort."""
    n = 0
    while in_cohort(f"device-{n}", SALT, PERCENT) != inside:
        n += 1
    return f"device-{n}"


def _signed(manifest: Manifest, *signers: str) -> bytes:
    return sign_document(manifest, [_signer(name) for name in signers or ("registry",)])


def _tampered_payload() -> bytes:
    """A valid envelope whose payload was edited after signing (threads 4 -> 16)."""
    envelope = json.loads(_signed(_manifest()))
    payload = base64.b64decode(envelope["payload"])
    edited = payload.replace(b'"threads":4', b'"threads":16')
    assert edited != payload
    envelope["payload"] = base64.b64encode(edited).decode()
    return canonical_json(envelope)


def _tampered_signature() -> bytes:
    envelope = json.loads(_signed(_manifest()))
    sig = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    sig[0] ^= 0x01
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    return canonical_json(envelope)


def _state_envelope() -> bytes:
    """A signed document of another kind (a rollout state type) passed off as a manifest."""
    return sign_envelope(to_bytes(_manifest()), PAYLOAD_TYPE_STATE, [_signer("registry")])


# name -> (description, manifest bytes factory, input overrides)
Case = tuple[str, Callable[[], bytes], dict[str, Any]]

CASES: dict[str, Case] = {
    "valid-stable": (
        "Stable only: every device gets stable.",
        lambda: _signed(_manifest()),
        {},
    ),
    "valid-candidate-in-cohort": (
        "A 25% rollout; the device's bucket is below 2500, so it gets the candidate.",
        lambda: _signed(_rollout()),
        {"device_id": _device(True)},
    ),
    "outside-cohort": (
        "The same rollout; the device's bucket is 2500 or more, so it gets stable.",
        lambda: _signed(_rollout()),
        {"device_id": _device(False)},
    ),
    "first-release-outside-cohort": (
        "A model's first release as a canary, no stable: outside the cohort there is no "
        "entry (accepted, nothing to install).",
        lambda: _signed(_rollout(stable=None)),
        {"device_id": _device(False)},
    ),
    "paused-rollout": (
        "A paused rollout serves stable even inside the cohort.",
        lambda: _signed(_rollout(paused=True)),
        {"device_id": _device(True)},
    ),
    "same-sequence-refetch": (
        "The sequence equals the highest already seen: the same manifest fetched again.",
        lambda: _signed(_manifest()),
        {"highest_seen_sequence": 9},
    ),
    "newer-sequence": (
        "A higher sequence than seen before is accepted and becomes the new highest.",
        lambda: _signed(_manifest(sequence=12)),
        {"highest_seen_sequence": 9},
    ),
    "key-rotation": (
        "Signed by an untrusted key and a trusted one: the untrusted signature is ignored.",
        lambda: _signed(_manifest(), "other", "registry"),
        {},
    ),
    "runtime-fallback-to-stable": (
        "In the cohort, but the candidate needs MNN 3.7.0 and the app has 3.6.1: stable "
        "fits, so the device gets stable.",
        lambda: _signed(_rollout(candidate=_entry("1.1.0", runtime="3.7.0"))),
        {"device_id": _device(True)},
    ),
    "tampered": (
        "The payload was edited after signing (threads 4 -> 16), the signature kept.",
        _tampered_payload,
        {},
    ),
    "tampered-signature": (
        "One bit of the signature flipped.",
        _tampered_signature,
        {},
    ),
    "expired": (
        "The current time is at the manifest's expiry: rejected (expires is exclusive).",
        lambda: _signed(_manifest()),
        {"now": EXPIRES},
    ),
    "rolled-back": (
        "Sequence 7 after 9 was seen: an old manifest replayed.",
        lambda: _signed(_manifest(sequence=7)),
        {"highest_seen_sequence": 9},
    ),
    "wrong-key": (
        "Validly signed, but only by a key the client does not trust.",
        lambda: _signed(_manifest(), "other"),
        {},
    ),
    "wrong-tier": (
        "A valid manifest of tier 'high' served where the client asked for 'mid'.",
        lambda: _signed(_manifest(tier="high")),
        {},
    ),
    "wrong-model": (
        "A valid manifest of model 'sensor' served where the client asked for 'digits'.",
        lambda: _signed(_manifest(model="sensor")),
        {},
    ),
    "too-new-runtime": (
        "Stable needs MNN 3.7.0 and the app has 3.6.1, with nothing to fall back to.",
        lambda: _signed(_manifest(stable=_entry("1.0.0", runtime="3.7.0"))),
        {},
    ),
    "wrong-payload-type": (
        "A trusted signature over another document type (a rollout state's payload type).",
        _state_envelope,
        {},
    ),
    "not-an-envelope": (
        "The bytes are not a JSON envelope.",
        lambda: b"<html>502 Bad Gateway</html>",
        {},
    ),
}


def _input(manifest: bytes, overrides: dict[str, Any]) -> dict[str, Any]:
    now = overrides.get("now", NOW)
    return {
        "manifest": base64.b64encode(manifest).decode("ascii"),
        "trusted_keys": [_signer("registry").public_pem().decode("ascii")],
        "model": "digits",
        "tier": "mid",
        "device": {
            "device_id": overrides.get("device_id", "device-42"),
            "mnn_runtime": APP_RUNTIME,
        },
        "highest_seen_sequence": overrides.get("highest_seen_sequence"),
        "now": format_time(now),
    }


def run(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference implementation's decision for one vector input."""
    try:
        decision = decide(
            base64.b64decode(vector_input["manifest"]),
            trusted=TrustedKeys.from_pems(vector_input["trusted_keys"]),
            model=vector_input["model"],
            tier=vector_input["tier"],
            device_id=vector_input["device"]["device_id"],
            app_mnn_runtime=vector_input["device"]["mnn_runtime"],
            highest_seen_sequence=vector_input["highest_seen_sequence"],
            now=datetime.fromisoformat(vector_input["now"].replace("Z", "+00:00")),
        )
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    entry = decision.entry
    return {
        "accept": True,
        "entry": None
        if entry is None
        else {
            "version": entry.version,
            "variant": entry.variant,
            "sha256": entry.sha256,
            "size": entry.size,
        },
        "is_candidate": decision.is_candidate,
        "runtime_fallback": decision.runtime_fallback,
        "sequence": decision.sequence,
    }


def build() -> dict[str, str]:
    """Every vector file's name and text."""
    files = {}
    for name, (description, manifest, overrides) in CASES.items():
        vector_input = _input(manifest(), overrides)
        vector = {
            "name": name,
            "description": description,
            "input": vector_input,
            "expected": run(vector_input),
        }
        files[f"{name}.json"] = json.dumps(vector, indent=2, ensure_ascii=False) + "\n"
    return files


def schema_text() -> str:
    """The JSON Schema of the manifest payload (docs/schemas/manifest.schema.json)."""
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgereg manifest payload"
    schema["description"] = (
        "The payload of a signed manifest envelope (payloadType "
        f"{Manifest.payload_type}); see docs/protocol.md. Generated by "
        "tests/vectors/generate.py from edgereg.wire.Manifest."
    )
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def stale() -> list[str]:
    """Golden files that differ from what this script would write (or should not exist)."""
    wanted = build()
    problems = [
        name
        for name, text in wanted.items()
        if not (HERE / name).exists() or (HERE / name).read_text("utf-8") != text
    ]
    problems += sorted(p.name for p in HERE.glob("*.json") if p.name not in wanted)
    if not SCHEMA_FILE.exists() or SCHEMA_FILE.read_text("utf-8") != schema_text():
        problems.append(str(SCHEMA_FILE.relative_to(ROOT)))
    return problems


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = stale()
        for name in problems:
            print(f"stale: {name}")
        return 1 if problems else 0
    wanted = build()
    for path in HERE.glob("*.json"):
        if path.name not in wanted:
            path.unlink()
    for name, text in wanted.items():
        (HERE / name).write_text(text, encoding="utf-8")
    SCHEMA_FILE.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    print(f"wrote {len(wanted)} vectors and {SCHEMA_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
