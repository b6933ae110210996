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

from edgereg.protocol._json import canonical_json
from edgereg.protocol.decision import AppFacts, BlobCheck, decide
from edgereg.protocol.envelope import Signer, TrustedKeys, sign_envelope
from edgereg.protocol.fields import Requirements, RuntimeHints, TierRules, VersionRange
from edgereg.protocol.reasons import Rejected
from edgereg.protocol.rules import DeviceProfile, cohort_bucket, in_cohort, resolve_tier
from edgereg.protocol.wire import (
    PAYLOAD_TYPE_STATE,
    BundleEntry,
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


def _bundle(version: str, *, rec_runtime: str = "3.6.1") -> BundleEntry:
    """The OCR bundle: three members with their own versions, one bundle version."""
    members = {"det": "2.0.0", "cls": "1.3.0", "rec": "4.1.0"}
    if version != "1.0.0":
        members = {
            name: f"{v.split('.')[0]}.{int(v.split('.')[1]) + 1}.0" for name, v in members.items()
        }
    return BundleEntry(
        version=version,
        members={
            name: _entry(
                member, variant="int8", runtime=rec_runtime if name == "rec" else "3.6.1"
            ).model_copy(update={"variant": f"{name}-int8"})
            for name, member in members.items()
        },
    )


def _bundle_manifest(**changes: Any) -> Manifest:
    fields: dict[str, Any] = {"model": "ocr", "stable": _bundle("1.0.0")}
    fields.update(changes)
    return _manifest(**fields)


NEEDS_APP_3 = Requirements(app=VersionRange(">=3.0.0"))
NEEDS_API_35 = Requirements(android=VersionRange(">=35"))
OLD_ANDROID_APP = {"app_version": "2.4.0", "os": "android", "os_version": "33"}


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


def _raw_payload(edit: Callable[[dict[str, Any]], None], manifest: Manifest | None = None) -> bytes:
    """A manifest payload edited as JSON (what the model would refuse to build), then signed."""
    data = json.loads(to_bytes(manifest or _manifest()))
    edit(data)
    payload = canonical_json(data)
    return sign_envelope(payload, Manifest.payload_type, [_signer("registry")])


def _set(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for dotted, value in changes.items():
            node = data
            *parents, last = dotted.split("__")
            for key in parents:
                node = node[key]
            node[last] = value

    return edit


def _extra_signature(extra: dict[str, Any]) -> bytes:
    envelope = json.loads(_signed(_manifest()))
    envelope["signatures"].append(extra)
    return canonical_json(envelope)


def _duplicate_key() -> bytes:
    envelope = _signed(_manifest()).decode()
    return envelope.replace('{"payload":', '{"payloadType":"x","payload":', 1).encode()


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
    # Rule 1: size, and nesting before parsing.
    "too-large": (
        "65537 bytes: one more than the 64 KiB limit, refused before parsing.",
        lambda: b" " * (64 * 1024 + 1),
        {},
    ),
    "deeply-nested": (
        "60,000 '[': nesting deeper than 64 is refused before parsing (malformed, no crash).",
        lambda: b"[" * 60_000,
        {},
    ),
    "duplicate-envelope-key": (
        "The envelope names payloadType twice: two readings of one document.",
        _duplicate_key,
        {},
    ),
    # Rules 2-5: one envelope parser; untrusted signatures are skipped, whatever they hold.
    "extra-garbage-signature-by-untrusted-key": (
        "A valid signature by the trusted key and a garbage one by another key: accepted.",
        lambda: _extra_signature({"keyid": "not-a-key-id", "sig": "!!"}),
        {},
    ),
    "extra-signature-without-sig": (
        "A valid signature and one by an untrusted key id without 'sig': accepted.",
        lambda: _extra_signature({"keyid": "0" * 64}),
        {},
    ),
    "signature-without-keyid": (
        "A signature object without a string keyid breaks the envelope shape (rule 2).",
        lambda: _extra_signature({"sig": "AAAA"}),
        {},
    ),
    # Rule 6: the strict schema (docs/protocol.md section 3).
    "sequence-as-float": (
        "sequence 9.0: a JSON number that is not an integer.",
        lambda: _raw_payload(_set(sequence=9.0)),
        {},
    ),
    "sequence-above-max-safe-integer": (
        "sequence 2^53: beyond what every JSON reader holds exactly.",
        lambda: _raw_payload(_set(sequence=2**53)),
        {},
    ),
    "size-as-string": (
        'size "1234567": JSON types must match exactly.',
        lambda: _raw_payload(_set(stable__size="1234567")),
        {},
    ),
    "expires-with-fraction": (
        "expires 2025-07-01T12:00:00.5Z: only whole seconds with Z are valid.",
        lambda: _raw_payload(_set(expires="2025-07-01T12:00:00.5Z")),
        {},
    ),
    "expires-with-offset": (
        "expires 2025-07-01T12:00:00+00:00: the only spelling is with Z.",
        lambda: _raw_payload(_set(expires="2025-07-01T12:00:00+00:00")),
        {},
    ),
    "percent-three-decimals": (
        "percent 12.345: at most two decimals.",
        lambda: _raw_payload(_set(percent=12.345), _rollout()),
        {},
    ),
    "percent-above-100": (
        "percent 100.5: at most 100.",
        lambda: _raw_payload(_set(percent=100.5), _rollout()),
        {},
    ),
    "backends-not-ending-in-cpu": (
        'runtime.backends ["cpu", "opencl"]: the list must end with "cpu".',
        lambda: _raw_payload(_set(stable__runtime__backends=["cpu", "opencl"])),
        {},
    ),
    "path-not-the-digest": (
        "path names another blob than sha256: path is always blobs/sha256/<sha256>.",
        lambda: _raw_payload(_set(stable__path="blobs/sha256/" + "a" * 64)),
        {},
    ),
    "version-not-semver": (
        "version 1.0: not a semantic version.",
        lambda: _raw_payload(_set(stable__version="1.0")),
        {},
    ),
    "unknown-field": (
        "An unknown payload field: ignored (forward compatibility: a newer publisher may "
        "add keys; docs/protocol.md section 3).",
        lambda: _raw_payload(_set(url="http://x")),
        {},
    ),
    # Rule 12: app and OS fit (requires), for models and bundles.
    "app-incompatible-candidate-falls-back": (
        "In the cohort, but the candidate needs app >=3.0.0 and the app is 2.4.0: stable "
        "fits, so the device gets stable (fallback app-incompatible).",
        lambda: _signed(
            _rollout(candidate=_entry("1.1.0").model_copy(update={"requires": NEEDS_APP_3}))
        ),
        {"device_id": _device(True), "device": OLD_ANDROID_APP},
    ),
    "os-incompatible-stable-refused": (
        "Stable needs Android API >=35, the device has 33, nothing to fall back to.",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_API_35}))
        ),
        {"device": OLD_ANDROID_APP},
    ),
    "bundle-in-cohort": (
        "A bundle's 25% rollout; the device is in the cohort: every member at the candidate.",
        lambda: _signed(_bundle_manifest(candidate=_bundle("1.1.0"), percent=PERCENT, salt=SALT)),
        {"device_id": _device(True), "model": "ocr", "bundle": True},
    ),
    "bundle-member-too-new": (
        "In the bundle's cohort, but the candidate's member rec needs MNN 3.7.0: the whole "
        "bundle falls back to stable (never a mix).",
        lambda: _signed(
            _bundle_manifest(
                candidate=_bundle("1.1.0", rec_runtime="3.7.0"), percent=PERCENT, salt=SALT
            )
        ),
        {"device_id": _device(True), "model": "ocr", "bundle": True},
    ),
    "bundle-asked-as-model": (
        "A bundle's manifest where the client asked for a model of that name: malformed.",
        lambda: _signed(_bundle_manifest()),
        {"model": "ocr"},
    ),
    "candidate-at-100-percent": (
        "A rollout at 100%: every bucket is below 10000, every device gets the candidate.",
        lambda: _signed(_rollout(percent=100.0)),
        {"device_id": _device(False)},
    ),
    "withdrawn": (
        "No stable and no candidate (a model rolled back with nothing stable): accepted, "
        "nothing to install.",
        lambda: _signed(_manifest(stable=None)),
        {},
    ),
}


def _input(manifest: bytes, overrides: dict[str, Any]) -> dict[str, Any]:
    now = overrides.get("now", NOW)
    vector_input: dict[str, Any] = {
        "manifest": base64.b64encode(manifest).decode("ascii"),
        "trusted_keys": [_signer("registry").public_pem().decode("ascii")],
        "model": overrides.get("model", "digits"),
        "tier": "mid",
        "device": {
            "device_id": overrides.get("device_id", "device-42"),
            "mnn_runtime": APP_RUNTIME,
            # app_version, os, os_version: only in the vectors that use them.
            **overrides.get("device", {}),
        },
        "highest_seen_sequence": overrides.get("highest_seen_sequence"),
        "now": format_time(now),
    }
    if overrides.get("bundle"):
        vector_input["bundle"] = True
    return vector_input


def _entry_json(entry: ManifestEntry) -> dict[str, Any]:
    return {
        "version": entry.version,
        "variant": entry.variant,
        "sha256": entry.sha256,
        "size": entry.size,
    }


def run(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference implementation's decision for one vector input."""
    device = vector_input["device"]
    try:
        decision = decide(
            base64.b64decode(vector_input["manifest"]),
            trusted=TrustedKeys.from_pems(vector_input["trusted_keys"]),
            model=vector_input["model"],
            tier=vector_input["tier"],
            device_id=device["device_id"],
            app_mnn_runtime=device["mnn_runtime"],
            highest_seen_sequence=vector_input["highest_seen_sequence"],
            now=datetime.fromisoformat(vector_input["now"].replace("Z", "+00:00")),
            app=AppFacts(
                app_version=device.get("app_version"),
                os=device.get("os"),
                os_version=device.get("os_version"),
            ),
            bundle=vector_input.get("bundle", False),
        )
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    entry = decision.entry
    chosen: dict[str, Any] | None
    if entry is None:
        chosen = None
    elif isinstance(entry, BundleEntry):
        chosen = {
            "version": entry.version,
            "members": {name: _entry_json(m) for name, m in sorted(entry.members.items())},
        }
    else:
        chosen = _entry_json(entry)
    return {
        "accept": True,
        "entry": chosen,
        "is_candidate": decision.is_candidate,
        "runtime_fallback": decision.runtime_fallback,
        "fallback": decision.fallback,
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


def _open_objects(node: Any) -> Any:
    """The schema without ``additionalProperties: false``: clients ignore unknown keys."""
    if isinstance(node, dict):
        return {
            key: _open_objects(value)
            for key, value in node.items()
            if not (key == "additionalProperties" and value is False)
        }
    if isinstance(node, list):
        return [_open_objects(item) for item in node]
    return node


def schema_text() -> str:
    """The JSON Schema of the manifest payload (docs/schemas/manifest.schema.json)."""
    schema = _open_objects(Manifest.model_json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgereg manifest payload"
    schema["description"] = (
        "The payload of a signed manifest envelope (payloadType "
        f"{Manifest.payload_type}); see docs/protocol.md. Generated by "
        "tests/vectors/generate.py from edgereg.protocol.wire.Manifest."
    )
    schema["$comment"] = (
        "Rules JSON Schema cannot state, which a client checks too (docs/protocol.md "
        "section 3): integers are written without a fraction or exponent (9, never 9.0); "
        "an entry's path is exactly blobs/sha256/ followed by its sha256; percent has at "
        "most two decimals; keys not listed here are ignored (a newer publisher "
        "may add them); percent and salt are set iff candidate is; paused is true "
        "only with a candidate; the candidate's version is higher than stable's."
    )
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


# --- blob rules 13 and 14 ----------------------------------------------------------

BLOB = b"edgereg blob vector \x00\x01\x02" * 10
BLOB_CASES: dict[str, tuple[str, bytes, int | None, int, str | None]] = {
    # name: (description, body sent, Content-Length announced, declared size, expected reason)
    "blob-exact": ("Exactly size bytes with the right sha256.", BLOB, len(BLOB), len(BLOB), None),
    "blob-no-content-length": (
        "No Content-Length: the bytes alone decide.",
        BLOB,
        None,
        len(BLOB),
        None,
    ),
    "blob-content-length-too-large": (
        "Content-Length announces more than size: refused before reading (rule 13).",
        BLOB,
        len(BLOB) + 1,
        len(BLOB),
        "blob-too-large",
    ),
    "blob-one-byte-too-many": (
        "One byte past size: a failure (rule 13).",
        BLOB + b"x",
        None,
        len(BLOB),
        "blob-too-large",
    ),
    "blob-short": ("One byte fewer than size (rule 14).", BLOB[:-1], None, len(BLOB), "bad-blob"),
    "blob-wrong-digest": (
        "Exactly size bytes, another sha256 (rule 14).",
        BLOB[:-1] + b"y",
        None,
        len(BLOB),
        "bad-blob",
    ),
}


def run_blob(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference decision for one blob vector: feed the body to BlobCheck."""
    entry = _entry("1.0.0").model_copy(
        update={
            "sha256": vector_input["entry"]["sha256"],
            "path": blob_path(vector_input["entry"]["sha256"]),
            "size": vector_input["entry"]["size"],
        }
    )
    check = BlobCheck(entry)
    body = base64.b64decode(vector_input["body"])
    try:
        check.expect(vector_input["content_length"])
        check.update(body)
        check.finish()
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    return {"accept": True}


def build_blobs() -> dict[str, str]:
    files = {}
    digest = hashlib.sha256(BLOB).hexdigest()
    for name, (description, body, length, size, _reason) in BLOB_CASES.items():
        vector_input = {
            "entry": {"sha256": digest, "size": size},
            "content_length": length,
            "body": base64.b64encode(body).decode("ascii"),
        }
        vector = {
            "name": name,
            "description": description,
            "input": vector_input,
            "expected": run_blob(vector_input),
        }
        files[f"blobs/{name}.json"] = json.dumps(vector, indent=2) + "\n"
    return files


# --- tier resolution and cohort buckets ----------------------------------------------

TIERS = {
    "high": {"min_ram_mb": 6144, "min_cpu_cores": 6, "soc_allow": ["Snapdragon 8*", "Apple A1?"]},
    "mid": {"min_ram_mb": 3072, "os": ["android"]},
    "low": {},
}
DEVICES = [
    ("flagship", {"ram_mb": 12288, "cpu_cores": 8, "soc": "Snapdragon 8 Gen 2", "os": "android"}),
    ("flagship-soc-case", {"ram_mb": 8192, "cpu_cores": 8, "soc": "snapdragon 8 GEN 3"}),
    ("iphone", {"ram_mb": 6144, "cpu_cores": 6, "soc": "Apple A15", "os": "ios"}),
    ("soc-question-mark-needs-one-char", {"ram_mb": 8192, "cpu_cores": 8, "soc": "Apple A1"}),
    ("soc-brackets-are-literal", {"ram_mb": 8192, "cpu_cores": 8, "soc": "[Snapdragon 8]"}),
    ("no-soc", {"ram_mb": 12288, "cpu_cores": 8, "os": "android"}),
    ("mid-android", {"ram_mb": 4096, "cpu_cores": 4, "os": "android"}),
    ("mid-ram-on-ios", {"ram_mb": 4096, "cpu_cores": 4, "os": "ios"}),
    ("exactly-3072", {"ram_mb": 3072, "cpu_cores": 1, "os": "android"}),
    ("one-below-3072", {"ram_mb": 3071, "cpu_cores": 8, "os": "android"}),
    ("nothing-known", {"ram_mb": 0, "cpu_cores": 1}),
]
COHORT_SALTS = ["5f3a9c0e1b2d4c6a", "00000000"]
COHORT_DEVICES = ["device-0", "device-1", "device-42", "ünïcödé-device", "a" * 200]
COHORT_PERCENTS = [0.01, 1.1, 5.0, 12.5, 50.0, 99.99, 100.0]


def build_rules() -> dict[str, str]:
    tiers = {name: TierRules(**rules) for name, rules in TIERS.items()}
    tier_cases = []
    for name, fields in DEVICES:
        device = DeviceProfile(device_id=name, **fields)
        tier_cases.append({"name": name, "device": fields, "tier": resolve_tier(tiers, device)})
    tier_vector = {
        "description": "Tier resolution (docs/protocol.md section 5): the first tier, best "
        "first, whose every set rule holds; the last tier is the catch-all.",
        "tiers": [{"name": name, "rules": rules} for name, rules in TIERS.items()],
        "cases": tier_cases,
    }
    cohort_cases = []
    for salt in COHORT_SALTS:
        for device_id in COHORT_DEVICES:
            bucket = cohort_bucket(device_id, salt)
            cohort_cases.append(
                {
                    "salt": salt,
                    "device_id": device_id,
                    "bucket": bucket,
                    "in_cohort": {f"{p:g}": in_cohort(device_id, salt, p) for p in COHORT_PERCENTS},
                }
            )
    cohort_vector = {
        "description": "Cohort buckets (docs/protocol.md section 6): bucket = "
        "int(sha256(utf8(salt + ':' + device_id)) hex [0:8], 16) % 10000; in cohort iff "
        "bucket < round(percent * 100), compared as integers.",
        "cases": cohort_cases,
    }
    return {
        "rules/tiers.json": json.dumps(tier_vector, indent=2, ensure_ascii=False) + "\n",
        "rules/cohorts.json": json.dumps(cohort_vector, indent=2, ensure_ascii=False) + "\n",
    }


def everything() -> dict[str, str]:
    """Every golden file under tests/vectors/, by relative path."""
    return {**build(), **build_blobs(), **build_rules()}


def _existing() -> list[Path]:
    return sorted(p for p in HERE.rglob("*.json") if p.parent.name != "keys" and p.is_file())


def stale() -> list[str]:
    """Golden files that differ from what this script would write (or should not exist)."""
    wanted = everything()
    problems = [
        name
        for name, text in wanted.items()
        if not (HERE / name).exists() or (HERE / name).read_text("utf-8") != text
    ]
    problems += [
        str(p.relative_to(HERE)) for p in _existing() if str(p.relative_to(HERE)) not in wanted
    ]
    if not SCHEMA_FILE.exists() or SCHEMA_FILE.read_text("utf-8") != schema_text():
        problems.append(str(SCHEMA_FILE.relative_to(ROOT)))
    return problems


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = stale()
        for name in problems:
            print(f"stale: {name}")
        return 1 if problems else 0
    wanted = everything()
    for path in _existing():
        if str(path.relative_to(HERE)) not in wanted:
            path.unlink()
    for name, text in wanted.items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_text(text, encoding="utf-8")
    SCHEMA_FILE.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    print(f"wrote {len(wanted)} vectors and {SCHEMA_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
