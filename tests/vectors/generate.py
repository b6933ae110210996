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
import math
import struct
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgereg.client.device import (
    check_blob_vector,
    check_conditions_vector,
    check_health_vector,
    check_hints_vector,
    check_metrics_vector,
    check_selftest_vector,
    check_tier_file_vector,
    decide_vector,
)
from edgereg.protocol._json import canonical_json
from edgereg.protocol.contract import (
    MAX_LABELS_BYTES,
    BlobRef,
    InputTensor,
    IOContract,
    TaskInfo,
    TensorSpec,
    parse_labels,
)
from edgereg.protocol.decision import BlobCheck
from edgereg.protocol.envelope import Signer, sign_envelope
from edgereg.protocol.fields import (
    Requirements,
    RuntimeHints,
    TierRules,
    VersionRange,
    is_version,
    parse_range,
    satisfies,
)
from edgereg.protocol.hints import RuntimeTrials
from edgereg.protocol.probe import (
    MAX_PROBE_DATA_BYTES,
    GoldenProbe,
    ProbeTensor,
    check_probe,
)
from edgereg.protocol.reasons import Malformed, Rejected
from edgereg.protocol.reports import Report, ReportError, parse_report
from edgereg.protocol.rules import (
    DeviceProfile,
    cohort_bucket,
    in_cohort,
    resolve_tier,
    tier_file,
)
from edgereg.protocol.wire import (
    PAYLOAD_TYPE_STATE,
    BundleEntry,
    DistributionMetric,
    Manifest,
    ManifestEntry,
    RateMetric,
    WireError,
    blob_path,
    format_time,
    from_bytes,
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


NEEDS_APP_2 = Requirements(app=VersionRange(">=2.0.0"))
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


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        del data[key]

    return edit


def _raw_text(edit: Callable[[str], str], manifest: Manifest | None = None) -> bytes:
    """A manifest payload edited as text (what JSON libraries would not write), then signed."""
    text = to_bytes(manifest or _manifest()).decode("utf-8")
    edited = edit(text)
    assert edited != text
    return sign_envelope(edited.encode("utf-8"), Manifest.payload_type, [_signer("registry")])


def _keyid_with_newline() -> bytes:
    envelope = json.loads(_signed(_manifest()))
    envelope["signatures"][0]["keyid"] += "\n"
    return canonical_json(envelope)


def _bundle_with_unfit_cls_and_rec() -> BundleEntry:
    bundle = _bundle("1.0.0", rec_runtime="3.7.0")
    members = dict(bundle.members)
    members["cls"] = members["cls"].model_copy(update={"requires": NEEDS_API_35})
    return bundle.model_copy(update={"members": members})


# --- rule 12 (d) memory and (e) CPU --------------------------------------------------

I8MM_PHONE = ["dotprod", "fp16", "i8mm"]
"""A Cortex-A710-class CPU's features, as a client reads them (docs/protocol.md §7)."""
OLDER_PHONE = ["dotprod", "fp16"]


def _mem(entry: ManifestEntry, mb: float) -> ManifestEntry:
    return entry.model_copy(update={"peak_memory_mb": mb})


def _safe(version: str, variant: str = "int8w", **changes: Any) -> ManifestEntry:
    """The variant a device with i8mm gets instead (weight-only int8: no i8mm kernel)."""
    return _entry(version, variant).model_copy(update=changes)


def _avoiding(
    entry: ManifestEntry, features: list[str], instead: ManifestEntry | None = None
) -> ManifestEntry:
    return entry.model_copy(update={"avoid_cpu": features, "instead": instead})


def _i8mm_stable(**instead: Any) -> ManifestEntry:
    """Stable 1.0.0 int8, which avoids i8mm, with int8w as its instead."""
    return _avoiding(_entry("1.0.0"), ["i8mm"], _safe("1.0.0", **instead))


def _module(entry: ManifestEntry) -> ManifestEntry:
    """The entry of a bidirectional-LSTM tagger: its contract says it needs MNN's Module API."""
    contract = IOContract(
        inputs=[InputTensor(name="x", dtype="float32", shape=[16, 1, 8], batch_axis=1)],
        outputs=[TensorSpec(name="tags", dtype="float32", shape=[16, 1, 6])],
        task=TaskInfo(kind="generic"),
        mnn_api="module",
    )
    return entry.model_copy(update={"contract": contract})


def _bundle_with(**members: ManifestEntry) -> BundleEntry:
    bundle = _bundle("1.0.0")
    return bundle.model_copy(update={"members": {**bundle.members, **members}})


def _ocr_memory(rec: ManifestEntry | None = None) -> BundleEntry:
    """The OCR bundle with measured peaks det 200, cls 100, rec 300 (600 MiB together)."""
    bundle = _bundle("1.0.0")
    members = bundle.members
    return _bundle_with(
        det=_mem(members["det"], 200),
        cls=_mem(members["cls"], 100),
        rec=rec or _mem(members["rec"], 300),
    )


def _rec_avoiding_i8mm() -> ManifestEntry:
    rec = _mem(_bundle("1.0.0").members["rec"], 300)
    instead = _mem(rec, 100).model_copy(
        update={
            "variant": "rec-int8w",
            "sha256": hashlib.sha256(b"rec int8w").hexdigest(),
        }
    )
    instead = instead.model_copy(update={"path": blob_path(instead.sha256)})
    return _avoiding(rec, ["i8mm"], instead)


_METRICS = {
    "accepted": RateMetric(kind="rate"),
    "confidence": DistributionMetric(kind="distribution", buckets=[0.5, 0.7, 0.9]),
}


def _with_metrics(entry: ManifestEntry) -> ManifestEntry:
    return entry.model_copy(update={"metrics": _METRICS})


def _nested_instead(data: dict[str, Any]) -> None:
    inner = dict(data["stable"]["instead"])
    data["stable"]["instead"]["instead"] = inner


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


def _contract(**changes: Any) -> dict[str, Any]:
    """A small contract as it goes on the wire, with ``changes`` applied (JSON, unchecked)."""
    contract: dict[str, Any] = {
        "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 1, 28, 28], "batch_axis": 0}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
        "task": {"kind": "classification", "output": "logits"},
    }
    contract.update(changes)
    return contract


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
    # Patterns match the whole string (section 3): '$' in many regex engines also
    # matches before a final newline, which let these through.
    "version-trailing-newline": (
        "stable.version '1.0.0\\n': a trailing newline is not part of a semantic version.",
        lambda: _raw_payload(_set(stable__version="1.0.0\n")),
        {},
    ),
    "expires-trailing-newline": (
        "expires '2025-07-01T12:00:00Z\\n': a trailing newline is no time.",
        lambda: _raw_payload(_set(expires="2025-07-01T12:00:00Z\n")),
        {},
    ),
    "tier-trailing-newline": (
        "tier 'mid\\n': not a name (rule 6, before the tier is compared at rule 8).",
        lambda: _raw_payload(_set(tier="mid\n")),
        {},
    ),
    "sha256-trailing-newline": (
        "stable.sha256 with a trailing newline: not 64 lowercase hex characters.",
        lambda: _raw_payload(lambda d: d["stable"].update(sha256=d["stable"]["sha256"] + "\n")),
        {},
    ),
    "salt-trailing-newline": (
        "salt with a trailing newline: not 8 to 64 lowercase hex characters.",
        lambda: _raw_payload(_set(salt=SALT + "\n"), _rollout()),
        {"device_id": _device(True)},
    ),
    "keyid-trailing-newline": (
        "The trusted key's id with a trailing newline: not that key's id, so no signature "
        "is by a trusted key.",
        lambda: _keyid_with_newline(),
        {},
    ),
    # Integers (section 2): a number no double holds is malformed however it is spelled.
    "integer-beyond-double-in-unknown-key": (
        "1 and 309 zeros (10^309, 310 digits) in an unknown key: larger than any double, "
        "so malformed like 1e400, though the key would be ignored.",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', '"comment":1' + "0" * 309 + ',"expires":', 1)
        ),
        {},
    ),
    "integer-5000-digits-in-unknown-key": (
        "A 5000-digit integer in an unknown key: malformed (a double's range, not a "
        "parser's own digit limit, decides).",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', '"comment":' + "7" * 5000 + ',"expires":', 1)
        ),
        {},
    ),
    "integer-rounding-to-infinity-in-unknown-key": (
        "2^1024 - 2^970 (309 digits) in an unknown key: the first integer whose nearest "
        "double is infinity (round to nearest, ties to even), so malformed.",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', f'"comment":{2**1024 - 2**970},"expires":', 1)
        ),
        {},
    ),
    "integer-largest-double-in-unknown-key": (
        "The largest double written as a 309-digit integer in an unknown key: a finite "
        "double, so accepted (and ignored).",
        lambda: _raw_text(
            lambda text: text.replace(
                '"expires":', f'"comment":{int(sys.float_info.max)},"expires":', 1
            )
        ),
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
    # The MNN runtime the app says (rule 12a).
    "no-mnn-runtime": (
        "The device does not say its MNN version (no mnn_runtime): rule 12(a) is skipped, "
        "so stable needing MNN 3.7.0 is accepted.",
        lambda: _signed(_manifest(stable=_entry("1.0.0", runtime="3.7.0"))),
        {"device": {"mnn_runtime": None}},
    ),
    "garbage-mnn-runtime": (
        "The app says MNN version 'three': not a version, so no entry can be shown to fit "
        "(runtime-too-old), not an error.",
        lambda: _signed(_manifest()),
        {"device": {"mnn_runtime": "three"}},
    ),
    "unknown-newer-mnn-runtime": (
        "MNN 9.0.0, newer than any release known today: it fits.",
        lambda: _signed(_manifest()),
        {"device": {"mnn_runtime": "9.0.0"}},
    ),
    # Issue #30: patterns mean the same in every regex engine (docs/protocol.md §3,
    # "Patterns"): explicit ASCII classes, never \s or \d, whose meaning differs.
    "report-url-with-bom": (
        "report_url ending in U+FEFF (a byte order mark): not printable ASCII, so not a report "
        "URL (ECMA-262's \\s counts it as a space, Python's does not: no pattern relies on it).",
        lambda: _raw_payload(_set(report_url="https://reports.example.com/v1\ufeff")),
        {},
    ),
    "report-url-with-next-line": (
        "report_url ending in U+0085 (NEXT LINE): not printable ASCII, so not a report URL "
        "(Python's \\s counts it as a space, ECMA-262's does not).",
        lambda: _raw_payload(_set(report_url="https://reports.example.com/v1\u0085")),
        {},
    ),
    "report-url-not-ascii": (
        "report_url with an é: a URL on the wire is ASCII (an IRI is percent-encoded first).",
        lambda: _raw_payload(_set(report_url="https://reports.example.com/caf\u00e9")),
        {},
    ),
    "report-url-ascii": (
        "report_url of printable ASCII with a query: accepted (the report URL is not part of "
        "the decision's answer).",
        lambda: _raw_payload(_set(report_url="https://reports.example.com/v1/reports?app=x&v=2")),
        {},
    ),
    "version-with-arabic-indic-digit": (
        "stable version 1.0.1٣ (U+0663): a digit to Python's and Rust's \\d, not to "
        "ECMA-262's; versions are ASCII digits.",
        lambda: _raw_payload(_set(stable__version="1.0.1\u0663")),
        {},
    ),
    "expires-with-arabic-indic-digit": (
        "expires 2025-07-0١T12:00:00Z (U+0661): times are ASCII digits.",
        lambda: _raw_payload(_set(expires="2025-07-0\u0661T12:00:00Z")),
        {},
    ),
    # Issue #30: spec gaps a client written from the docs alone had to decide, settled.
    "runtime-empty": (
        "An entry whose runtime is {}: every key has a default (threads 4, backends "
        '["cpu"], precision normal), so it is accepted.',
        lambda: _raw_payload(_set(stable__runtime={})),
        {},
    ),
    "runtime-without-backends": (
        "An entry whose runtime names threads and precision but no backends: backends "
        'default to ["cpu"]; accepted.',
        lambda: _raw_payload(_set(stable__runtime={"threads": 2, "precision": "high"})),
        {},
    ),
    "expires-year-0000": (
        "expires 0000-01-01T00:00:00Z: RFC 3339 allows year 0000, the protocol's years are "
        "0001 to 9999 (what every platform's date type holds): malformed.",
        lambda: _raw_payload(_set(expires="0000-01-01T00:00:00Z")),
        {},
    ),
    "expires-year-9999": (
        "expires 9999-12-31T23:59:59Z, the last second the protocol can say: accepted.",
        lambda: _raw_payload(_set(expires="9999-12-31T23:59:59Z")),
        {},
    ),
    "percent-as-integer": (
        "percent written 25 (the publisher writes 25.0): a number field takes any JSON "
        "spelling of its value; the device's bucket is below 2500, it gets the candidate.",
        lambda: _raw_payload(_set(percent=25), _rollout()),
        {"device_id": _device(True)},
    ),
    "percent-as-exponent": (
        "percent written 2.5e1: the same number, the same decision (the bytes are verified "
        "as received, never re-serialized).",
        lambda: _raw_text(
            lambda text: text.replace('"percent":25.0', '"percent":2.5e1'), _rollout()
        ),
        {"device_id": _device(True)},
    ),
    "bundle-memory-sum-in-name-order": (
        "Members cls 0.1, det 0.2, rec 0.3 MiB against a budget of 0.6: summed in ascending "
        "name order in double precision, 0.1 + 0.2 + 0.3 is 0.6000000000000001, over the "
        "budget (insufficient-memory); summed det, rec, cls it would be 0.6 and fit.",
        lambda: _signed(
            _bundle_manifest(
                stable=_bundle_with(
                    cls=_mem(_bundle("1.0.0").members["cls"], 0.1),
                    det=_mem(_bundle("1.0.0").members["det"], 0.2),
                    rec=_mem(_bundle("1.0.0").members["rec"], 0.3),
                )
            )
        ),
        {"model": "ocr", "bundle": True, "device": {"memory_budget_mb": 0.6}},
    ),
    "contract-minimal": (
        "An entry with a small contract (one input, one output, a task reading it): accepted.",
        lambda: _raw_payload(_set(stable__contract=_contract())),
        {},
    ),
    "contract-labels-and-labels-blob": (
        "A contract with both labels and labels_blob: they are exclusive (inline up to 2048 "
        "bytes of JSON, a blob beyond); malformed.",
        lambda: _raw_payload(
            _set(
                stable__contract=_contract(
                    labels=["a", "b"],
                    labels_blob={
                        "path": blob_path("ab" * 32),
                        "sha256": "ab" * 32,
                        "size": 10,
                    },
                )
            )
        ),
        {},
    ),
    "contract-state-names-a-missing-tensor": (
        "A state pair whose input is no input of the contract: malformed.",
        lambda: _raw_payload(
            _set(stable__contract=_contract(state=[{"input": "h", "output": "logits"}]))
        ),
        {},
    ),
    "contract-task-output-not-an-output": (
        "task.output names a tensor that is no output: malformed.",
        lambda: _raw_payload(
            _set(stable__contract=_contract(task={"kind": "classification", "output": "probs"}))
        ),
        {},
    ),
    # Issue #30: the longest min_mnn_runtime any client compares is 64 characters.
    "min-mnn-runtime-64-characters": (
        "min_mnn_runtime of 64 characters (3.3.….3.10, below the app's 3.6.1): the longest "
        "the schema allows; it fits.",
        lambda: _raw_payload(_set(stable__min_mnn_runtime="3." * 31 + "10")),
        {},
    ),
    "min-mnn-runtime-65-characters": (
        "min_mnn_runtime of 65 characters: past the schema's 64, the manifest is malformed "
        "(not a version any client compares; never an exception out of the client).",
        lambda: _raw_payload(_set(stable__min_mnn_runtime="3." * 32 + "1")),
        {},
    ),
    "mnn-runtime-pre-release": (
        "MNN 3.7.0-rc.1 against min_mnn_runtime 3.7.0: a pre-release is below its release.",
        lambda: _signed(_manifest(stable=_entry("1.0.0", runtime="3.7.0"))),
        {"device": {"mnn_runtime": "3.7.0-rc.1"}},
    ),
    # schema_version, numbers and nulls (rule 6).
    "schema-version-as-float": (
        "schema_version 1.0: an integer is written without a fraction.",
        lambda: _raw_payload(_set(schema_version=1.0)),
        {},
    ),
    "schema-version-missing": (
        "No schema_version: the key is required on the wire.",
        lambda: _raw_payload(_drop("schema_version")),
        {},
    ),
    "schema-version-2": (
        "schema_version 2: a format this client does not know; it keeps its model.",
        lambda: _raw_payload(_set(schema_version=2)),
        {},
    ),
    "infinity-in-unknown-key": (
        "1e400 inside an unknown key: the number overflows a double to infinity, which "
        "JSON cannot carry; malformed even though the key would be ignored.",
        lambda: _raw_text(lambda text: text.replace('"expires":', '"comment":1e400,"expires":', 1)),
        {},
    ),
    # Strings are Unicode text (section 2): a surrogate escape only as a high-low pair.
    "lone-high-surrogate-in-unknown-key": (
        "A lone high surrogate escape (\\ud800) in an unknown key's string: no Unicode text, "
        "read differently by different parsers; malformed even though the key is ignored.",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', '"comment":"\\ud800","expires":', 1)
        ),
        {},
    ),
    "lone-low-surrogate-in-unknown-key": (
        "A low surrogate escape (\\udc00) with no high one before it: malformed.",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', '"comment":"a\\udc00b","expires":', 1)
        ),
        {},
    ),
    "high-surrogate-then-not-low": (
        "A high surrogate escape followed by \\u0041, not a low surrogate: malformed.",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', '"comment":"\\ud800\\u0041","expires":', 1)
        ),
        {},
    ),
    "lone-surrogate-in-unknown-key-name": (
        "A lone surrogate escape in a key, not a value: malformed all the same.",
        lambda: _raw_text(lambda text: text.replace('"expires":', '"\\udbff":1,"expires":', 1)),
        {},
    ),
    "surrogate-pair-escape-accepted": (
        "A high surrogate escape followed by a low one is one code point (U+1F600): valid, "
        "the unknown key is ignored and the device gets stable.",
        lambda: _raw_text(
            lambda text: text.replace('"expires":', '"comment":"\\ud83d\\ude00","expires":', 1)
        ),
        {},
    ),
    "lone-surrogate-in-envelope": (
        "A lone surrogate escape in an unknown envelope field (the signed payload is valid): "
        "the envelope is strict JSON too, so malformed.",
        lambda: _signed(_manifest()).replace(b'{"payload":', b'{"note":"\\udfff","payload":', 1),
        {},
    ),
    "paused-null": (
        "paused null: a boolean key (absent means false) is never null.",
        lambda: _raw_payload(_set(paused=None), _rollout()),
        {"device_id": _device(True)},
    ),
    # requires and version ranges (rule 12b, 12c).
    "bad-range-in-requires": (
        "Stable's requires.app is 'at least 2.3': not a range. The manifest is valid; the "
        "entry does not fit (app-incompatible) and there is nothing to fall back to.",
        lambda: _raw_payload(_set(stable__requires={"app": "at least 2.3"})),
        {"device": OLD_ANDROID_APP},
    ),
    "bad-range-candidate-falls-back": (
        "The candidate's requires.app is '~>2.3' (an operator this client does not know): "
        "the candidate does not fit, the device gets stable (fallback app-incompatible).",
        lambda: _raw_payload(_set(candidate__requires={"app": "~>2.3"}), _rollout()),
        {"device_id": _device(True), "device": OLD_ANDROID_APP},
    ),
    "bad-range-after-wrong-tier": (
        "A bad range in a manifest of another tier: wrong-tier (rule 8) comes first, since "
        "ranges are read at rule 12.",
        lambda: _raw_payload(
            _set(tier="high", stable__requires={"app": "at least 2.3"}), _manifest()
        ),
        {"device": OLD_ANDROID_APP},
    ),
    "bad-ios-range-on-android": (
        "requires.ios does not parse, the device is Android: only the device's own OS key "
        "is read, so the entry fits.",
        lambda: _raw_payload(_set(stable__requires={"ios": "sixteen"})),
        {"device": OLD_ANDROID_APP},
    ),
    "app-version-missing": (
        "Stable needs app >=2.0.0 and the app does not say its version: it does not fit.",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_APP_2}))
        ),
        {"device": {"os": "android", "os_version": "33"}},
    ),
    "app-version-with-build": (
        "App version '2.4.0 (123)' (a store build number): the build is ignored, 2.4.0 is "
        "in >=2.0.0.",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_APP_2}))
        ),
        {"device": {**OLD_ANDROID_APP, "app_version": "2.4.0 (123)"}},
    ),
    "app-version-leading-v": (
        "App version 'v3': a leading v is ignored, and 3 is 3.0.0, in >=3.0.0.",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_APP_3}))
        ),
        {"device": {**OLD_ANDROID_APP, "app_version": "v3"}},
    ),
    "app-version-pre-release": (
        "App version '3.0.0-beta.1' against >=3.0.0: a pre-release is below its release.",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_APP_3}))
        ),
        {"device": {**OLD_ANDROID_APP, "app_version": "3.0.0-beta.1"}},
    ),
    "app-version-garbage": (
        "App version 'latest': not a version, so it is in no range (app-incompatible).",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_APP_2}))
        ),
        {"device": {**OLD_ANDROID_APP, "app_version": "latest"}},
    ),
    # The order of the fit rules, and which reason refuses.
    "runtime-before-requires": (
        "Stable needs MNN 3.7.0 and app >=3.0.0; the app has 3.6.1 and 2.4.0: the runtime "
        "is checked first (runtime-too-old).",
        lambda: _signed(
            _manifest(
                stable=_entry("1.0.0", runtime="3.7.0").model_copy(update={"requires": NEEDS_APP_3})
            )
        ),
        {"device": OLD_ANDROID_APP},
    ),
    "both-arms-fail-candidates-reason": (
        "In the cohort; the candidate needs app >=3.0.0, stable needs Android API >=35: "
        "neither fits, the refusal is the candidate's reason (app-incompatible).",
        lambda: _signed(
            _rollout(
                candidate=_entry("1.1.0").model_copy(update={"requires": NEEDS_APP_3}),
                stable=_entry("1.0.0").model_copy(update={"requires": NEEDS_API_35}),
            )
        ),
        {"device_id": _device(True), "device": OLD_ANDROID_APP},
    ),
    "bundle-requires-before-members": (
        "A bundle whose own requires.app (>=3.0.0) fails and whose member rec needs MNN "
        "3.7.0: the bundle's requires is checked before its members (app-incompatible).",
        lambda: _signed(
            _bundle_manifest(
                stable=_bundle("1.0.0", rec_runtime="3.7.0").model_copy(
                    update={"requires": NEEDS_APP_3}
                )
            )
        ),
        {"model": "ocr", "bundle": True, "device": OLD_ANDROID_APP},
    ),
    "bundle-members-by-name": (
        "Two members fail: cls needs Android API >=35, rec needs MNN 3.7.0. Members are "
        "checked by name (cls < det < rec), so cls decides (os-incompatible).",
        lambda: _signed(_bundle_manifest(stable=_bundle_with_unfit_cls_and_rec())),
        {"model": "ocr", "bundle": True, "device": OLD_ANDROID_APP},
    ),
    "bundle-both-arms-fail": (
        "In the cohort; the candidate bundle's rec needs MNN 3.7.0, the stable bundle "
        "needs app >=3.0.0: the candidate's reason refuses (runtime-too-old).",
        lambda: _signed(
            _bundle_manifest(
                stable=_bundle("1.0.0").model_copy(update={"requires": NEEDS_APP_3}),
                candidate=_bundle("1.1.0", rec_runtime="3.7.0"),
                percent=PERCENT,
                salt=SALT,
            )
        ),
        {"device_id": _device(True), "model": "ocr", "bundle": True, "device": OLD_ANDROID_APP},
    ),
    # Rule 12 (d): the entry's measured peak memory against the app's budget.
    "memory-fits": (
        "Stable's peak_memory_mb is 300, the app's memory budget 512: it fits.",
        lambda: _signed(_manifest(stable=_mem(_entry("1.0.0"), 300))),
        {"device": {"memory_budget_mb": 512}},
    ),
    "memory-exactly-the-budget": (
        "peak_memory_mb 512.5 and a budget of 512.5: equal fits (only above refuses).",
        lambda: _signed(_manifest(stable=_mem(_entry("1.0.0"), 512.5))),
        {"device": {"memory_budget_mb": 512.5}},
    ),
    "memory-over-budget": (
        "Stable's peak is 600 MiB, the budget 512, nothing to fall back to: insufficient-memory.",
        lambda: _signed(_manifest(stable=_mem(_entry("1.0.0"), 600))),
        {"device": {"memory_budget_mb": 512}},
    ),
    "memory-candidate-over-falls-back": (
        "In the cohort; the candidate's peak is 600 MiB, stable's 300, the budget 512: "
        "the device gets stable (fallback insufficient-memory).",
        lambda: _signed(
            _rollout(stable=_mem(_entry("1.0.0"), 300), candidate=_mem(_entry("1.1.0"), 600))
        ),
        {"device_id": _device(True), "device": {"memory_budget_mb": 512}},
    ),
    "memory-budget-not-said": (
        "Stable's peak is 600 MiB and the app says no memory budget: rule (d) is skipped.",
        lambda: _signed(_manifest(stable=_mem(_entry("1.0.0"), 600))),
        {},
    ),
    "memory-not-measured": (
        "The app's budget is 1 MiB and the entry has no peak_memory_mb (published before "
        "it was measured): rule (d) is skipped.",
        lambda: _signed(_manifest()),
        {"device": {"memory_budget_mb": 1}},
    ),
    "peak-memory-zero": (
        "peak_memory_mb 0: a measured peak is above 0.",
        lambda: _raw_payload(_set(stable__peak_memory_mb=0)),
        {},
    ),
    "peak-memory-above-1-tib": (
        "peak_memory_mb 1048577: at most 1048576 MiB.",
        lambda: _raw_payload(_set(stable__peak_memory_mb=1048577)),
        {},
    ),
    # Rule 12 (e): CPU features the entry avoids, and its instead.
    "cpu-avoided-no-instead": (
        "Stable avoids i8mm and names no instead; the device has i8mm: cpu-unsupported.",
        lambda: _signed(_manifest(stable=_avoiding(_entry("1.0.0"), ["i8mm"]))),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "cpu-avoided-instead-installed": (
        "Stable int8 avoids i8mm, its instead is int8w; the device has i8mm: it installs "
        "int8w (substitute cpu-unsupported), same version.",
        lambda: _signed(_manifest(stable=_i8mm_stable())),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "cpu-feature-absent": (
        "The same manifest; the device has dotprod and fp16, no i8mm: it installs int8 itself.",
        lambda: _signed(_manifest(stable=_i8mm_stable())),
        {"device": {"cpu_features": OLDER_PHONE}},
    ),
    "cpu-features-not-said": (
        "The same manifest; the app does not say its CPU features: rule (e) is skipped, "
        "int8 itself.",
        lambda: _signed(_manifest(stable=_i8mm_stable())),
        {},
    ),
    "cpu-features-empty": (
        "The same manifest; the app says its CPU has none of the named features (an "
        "empty list, as on x86_64): int8 itself.",
        lambda: _signed(_manifest(stable=_i8mm_stable())),
        {"device": {"cpu_features": []}},
    ),
    "cpu-instead-over-memory": (
        "Stable int8 (300 MiB) avoids i8mm; its instead int8w needs 700 MiB, the budget "
        "is 512: the instead does not fit, so cpu-unsupported.",
        lambda: _signed(
            _manifest(
                stable=_avoiding(
                    _mem(_entry("1.0.0"), 300), ["i8mm"], _safe("1.0.0", peak_memory_mb=700)
                )
            )
        ),
        {"device": {"cpu_features": I8MM_PHONE, "memory_budget_mb": 512}},
    ),
    "cpu-instead-avoids-too": (
        "Stable avoids i8mm; its instead avoids sve2; the device has both: cpu-unsupported.",
        lambda: _signed(_manifest(stable=_i8mm_stable(avoid_cpu=["sve2"]))),
        {"device": {"cpu_features": [*I8MM_PHONE, "sve2"]}},
    ),
    "cpu-instead-needs-newer-runtime": (
        "Stable avoids i8mm; its instead needs MNN 3.7.0, the app has 3.6.1: the "
        "instead does not fit, so cpu-unsupported (not runtime-too-old: the entry's own "
        "reason is its CPU).",
        lambda: _signed(_manifest(stable=_i8mm_stable(min_mnn_runtime="3.7.0"))),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "cpu-unknown-feature-name": (
        "Stable avoids 'sme2p1-x', a feature no client knows today: a name, not an enum, "
        "so the manifest is valid; this device lacks it and gets int8.",
        lambda: _signed(_manifest(stable=_avoiding(_entry("1.0.0"), ["sme2p1-x"]))),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "cpu-candidate-avoided-falls-back": (
        "In the cohort; the candidate avoids i8mm with no instead: the device gets stable "
        "(fallback cpu-unsupported).",
        lambda: _signed(_rollout(candidate=_avoiding(_entry("1.1.0"), ["i8mm"]))),
        {"device_id": _device(True), "device": {"cpu_features": I8MM_PHONE}},
    ),
    "cpu-candidate-instead": (
        "In the cohort; the candidate avoids i8mm and names int8w instead: the device "
        "gets the candidate's int8w (is_candidate, substitute cpu-unsupported).",
        lambda: _signed(_rollout(candidate=_avoiding(_entry("1.1.0"), ["i8mm"], _safe("1.1.0")))),
        {"device_id": _device(True), "device": {"cpu_features": I8MM_PHONE}},
    ),
    "cpu-fallback-to-stable-instead": (
        "In the cohort; the candidate needs 600 MiB (budget 512), stable avoids i8mm and "
        "names int8w: the device gets stable's int8w (fallback insufficient-memory, "
        "substitute cpu-unsupported).",
        lambda: _signed(_rollout(stable=_i8mm_stable(), candidate=_mem(_entry("1.1.0"), 600))),
        {
            "device_id": _device(True),
            "device": {"cpu_features": I8MM_PHONE, "memory_budget_mb": 512},
        },
    ),
    "metrics-declared": (
        "Stable declares two app metrics, a rate and a distribution: accepted, and the "
        "entry says them.",
        lambda: _signed(_manifest(stable=_with_metrics(_entry("1.0.0")))),
        {},
    ),
    "metrics-null": (
        "Stable's metrics is null: the same as absent (a key added after 0.1.0), accepted.",
        lambda: _raw_payload(_set(stable__metrics=None)),
        {},
    ),
    "metrics-null-on-bundle-member": (
        "A bundle member's metrics is null: absent, so the member declares none, accepted.",
        lambda: _raw_payload(_set(stable__members__rec__metrics=None), _bundle_manifest()),
        {"model": "ocr", "bundle": True},
    ),
    "metrics-unknown-key-ignored": (
        "A metric declaration carries a key this client does not know (a direction): "
        "ignored, as everywhere in a manifest.",
        lambda: _raw_payload(
            _set(stable__metrics__accepted__better="higher"),
            _manifest(stable=_with_metrics(_entry("1.0.0"))),
        ),
        {},
    ),
    "metrics-unknown-kind": (
        "A metric of kind 'histogram': no kind a client counts, malformed.",
        lambda: _raw_payload(
            _set(stable__metrics__accepted__kind="histogram"),
            _manifest(stable=_with_metrics(_entry("1.0.0"))),
        ),
        {},
    ),
    "metrics-buckets-unsorted": (
        "A distribution's buckets [0.5, 0.3]: edges increase strictly, malformed.",
        lambda: _raw_payload(
            _set(stable__metrics__confidence__buckets=[0.5, 0.3]),
            _manifest(stable=_with_metrics(_entry("1.0.0"))),
        ),
        {},
    ),
    "metrics-buckets-empty": (
        "A distribution with no bucket edge: malformed.",
        lambda: _raw_payload(
            _set(stable__metrics__confidence__buckets=[]),
            _manifest(stable=_with_metrics(_entry("1.0.0"))),
        ),
        {},
    ),
    "metrics-buckets-32-edges": (
        "A distribution with 32 edges (33 buckets): at most 31, malformed.",
        lambda: _raw_payload(
            _set(stable__metrics__confidence__buckets=[i / 32 for i in range(32)]),
            _manifest(stable=_with_metrics(_entry("1.0.0"))),
        ),
        {},
    ),
    "metrics-17": (
        "Seventeen declared metrics: at most 16, malformed.",
        lambda: _raw_payload(
            _set(stable__metrics={f"m{i:02d}": {"kind": "rate"} for i in range(17)})
        ),
        {},
    ),
    "metrics-on-instead": (
        "Stable's instead declares metrics: only the unit's own entry does, malformed.",
        lambda: _raw_payload(
            _set(stable__instead__metrics={"accepted": {"kind": "rate"}}),
            _manifest(stable=_i8mm_stable()),
        ),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "metrics-on-bundle": (
        "A bundle entry declares the bundle's metrics: accepted, and the bundle entry says them.",
        lambda: _signed(
            _bundle_manifest(stable=_bundle("1.0.0").model_copy(update={"metrics": _METRICS}))
        ),
        {"model": "ocr", "bundle": True},
    ),
    "metrics-on-bundle-member": (
        "A bundle member's entry declares metrics: a bundle's are its own entry's, malformed.",
        lambda: _raw_payload(
            _set(stable__members__rec__metrics={"accepted": {"kind": "rate"}}),
            _bundle_manifest(),
        ),
        {"model": "ocr", "bundle": True},
    ),
    "instead-nested": (
        "Stable's instead has an instead of its own: one level only, malformed.",
        lambda: _raw_payload(_nested_instead, _manifest(stable=_i8mm_stable())),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "instead-other-version": (
        "Stable 1.0.0's instead is version 0.9.0: a substitute is the same release, malformed.",
        lambda: _raw_payload(
            _set(stable__instead__version="0.9.0"), _manifest(stable=_i8mm_stable())
        ),
        {"device": {"cpu_features": OLDER_PHONE}},
    ),
    "instead-unknown-key": (
        "Stable's instead carries a key this client does not know: ignored there too "
        "(forward compatibility), and the device with i8mm installs int8w.",
        lambda: _raw_payload(
            _set(stable__instead__kernel_notes="sdot only"), _manifest(stable=_i8mm_stable())
        ),
        {"device": {"cpu_features": I8MM_PHONE}},
    ),
    "avoid-cpu-twice": (
        "avoid_cpu ['i8mm', 'i8mm']: each feature once, malformed.",
        lambda: _raw_payload(_set(stable__avoid_cpu=["i8mm", "i8mm"])),
        {},
    ),
    "avoid-cpu-not-a-name": (
        "avoid_cpu ['I8MM']: feature names are lowercase, malformed.",
        lambda: _raw_payload(_set(stable__avoid_cpu=["I8MM"])),
        {},
    ),
    "avoid-cpu-empty": (
        "avoid_cpu []: 1 to 8 names (leave the key out to avoid nothing), malformed.",
        lambda: _raw_payload(_set(stable__avoid_cpu=[])),
        {},
    ),
    # Rule 12 (f): an entry that needs MNN's Module API, a runner that calls the session API.
    "api-module-session-runner": (
        "Stable's contract says mnn_api module (an LSTM's While subgraph); the app's runner "
        "calls MNN's session API only: api-unsupported, refused before any download.",
        lambda: _signed(_manifest(stable=_module(_entry("1.0.0")))),
        {"device": {"mnn_apis": ["session"]}},
    ),
    "api-module-module-runner": (
        "The same manifest; the app's runner calls the Module API: it fits.",
        lambda: _signed(_manifest(stable=_module(_entry("1.0.0")))),
        {"device": {"mnn_apis": ["module"]}},
    ),
    "api-module-both-apis": (
        "The same manifest; the app calls both APIs: it fits.",
        lambda: _signed(_manifest(stable=_module(_entry("1.0.0")))),
        {"device": {"mnn_apis": ["module", "session"]}},
    ),
    "api-not-said": (
        "The same manifest; the app does not say which MNN API its runner calls: rule (f) is "
        "skipped, it fits.",
        lambda: _signed(_manifest(stable=_module(_entry("1.0.0")))),
        {},
    ),
    "api-session-entry": (
        "An entry whose contract says nothing of an API (the session API runs it) fits a "
        "session-API runner.",
        lambda: _signed(_manifest()),
        {"device": {"mnn_apis": ["session"]}},
    ),
    "api-candidate-falls-back": (
        "In the cohort; the candidate needs the Module API, the app's runner calls the session "
        "API: the device gets stable (fallback api-unsupported).",
        lambda: _signed(_rollout(candidate=_module(_entry("1.1.0")))),
        {"device_id": _device(True), "device": {"mnn_apis": ["session"]}},
    ),
    "api-instead-needs-module": (
        "Stable avoids i8mm; its instead needs the Module API; the device has i8mm and a "
        "session-API runner: api-unsupported (f is checked on what e chose).",
        lambda: _signed(
            _manifest(stable=_avoiding(_entry("1.0.0"), ["i8mm"], _module(_safe("1.0.0"))))
        ),
        {"device": {"cpu_features": I8MM_PHONE, "mnn_apis": ["session"]}},
    ),
    "cpu-before-api": (
        "Stable avoids i8mm (no instead) and needs the Module API; the device has i8mm and a "
        "session-API runner: cpu-unsupported (e comes before f).",
        lambda: _signed(_manifest(stable=_avoiding(_module(_entry("1.0.0")), ["i8mm"]))),
        {"device": {"cpu_features": I8MM_PHONE, "mnn_apis": ["session"]}},
    ),
    "api-unknown-value": (
        "A contract whose mnn_api is 'tensorrt': mnn_api is session or module, malformed.",
        lambda: _raw_payload(
            _set(stable__contract__mnn_api="tensorrt"),
            _manifest(stable=_module(_entry("1.0.0"))),
        ),
        {},
    ),
    "bundle-member-api-unsupported": (
        "Bundle member rec needs the Module API; the app's runner calls the session API: the "
        "bundle does not fit (api-unsupported), never a mix.",
        lambda: _signed(
            _bundle_manifest(stable=_bundle_with(rec=_module(_bundle("1.0.0").members["rec"])))
        ),
        {"model": "ocr", "bundle": True, "device": {"mnn_apis": ["session"]}},
    ),
    # The order of (a), (d), (e).
    "runtime-before-memory": (
        "Stable needs MNN 3.7.0 and 600 MiB; the app has 3.6.1 and a 512 MiB budget: "
        "runtime-too-old (a comes before d).",
        lambda: _signed(_manifest(stable=_mem(_entry("1.0.0", runtime="3.7.0"), 600))),
        {"device": {"memory_budget_mb": 512}},
    ),
    "memory-before-cpu": (
        "Stable needs 600 MiB (budget 512) and avoids i8mm with an instead of 100 MiB; the "
        "device has i8mm: insufficient-memory (d comes before e; the entry's own peak).",
        lambda: _signed(
            _manifest(
                stable=_avoiding(
                    _mem(_entry("1.0.0"), 600), ["i8mm"], _safe("1.0.0", peak_memory_mb=100)
                )
            )
        ),
        {"device": {"cpu_features": I8MM_PHONE, "memory_budget_mb": 512}},
    ),
    # Bundles: (d) for the members together, (e) per member.
    "bundle-memory-sum-over": (
        "Bundle members det 200, cls 100, rec 300 MiB: 600 together against a budget of "
        "512 (each alone fits): insufficient-memory.",
        lambda: _signed(_bundle_manifest(stable=_ocr_memory())),
        {"model": "ocr", "bundle": True, "device": {"memory_budget_mb": 512}},
    ),
    "bundle-memory-sum-fits": (
        "The same bundle with a budget of 600: the sum equals it, so it fits.",
        lambda: _signed(_bundle_manifest(stable=_ocr_memory())),
        {"model": "ocr", "bundle": True, "device": {"memory_budget_mb": 600}},
    ),
    "bundle-member-instead": (
        "Member rec (300 MiB) avoids i8mm, its instead rec-int8w takes 100 MiB; the device "
        "has i8mm and a 512 MiB budget: rec is substituted and the sum is 200 + 100 + 100 "
        "= 400, so the bundle fits (substitute cpu-unsupported; one bundle version).",
        lambda: _signed(_bundle_manifest(stable=_ocr_memory(_rec_avoiding_i8mm()))),
        {
            "model": "ocr",
            "bundle": True,
            "device": {"cpu_features": I8MM_PHONE, "memory_budget_mb": 512},
        },
    ),
    "bundle-member-cpu-unsupported": (
        "Member cls avoids i8mm with no instead; the device has i8mm: the bundle does not "
        "fit (cpu-unsupported).",
        lambda: _signed(
            _bundle_manifest(
                stable=_bundle_with(cls=_avoiding(_bundle("1.0.0").members["cls"], ["i8mm"]))
            )
        ),
        {"model": "ocr", "bundle": True, "device": {"cpu_features": I8MM_PHONE}},
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
            key: value
            for key, value in {
                "device_id": overrides.get("device_id", "device-42"),
                "mnn_runtime": APP_RUNTIME,
                # app_version, os, os_version: only in the vectors that use them.
                **overrides.get("device", {}),
            }.items()
            if value is not None  # a key left out: the app did not say
        },
        "highest_seen_sequence": overrides.get("highest_seen_sequence"),
        "now": format_time(now),
    }
    if overrides.get("bundle"):
        vector_input["bundle"] = True
    return vector_input


def run(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference implementation's decision for one vector input.

    The reference client's own vector runner (the Python device program answers
    with it too), so the recorded answer and the program cannot drift.
    """
    return decide_vector(vector_input)


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
    # Optional for Python callers (it defaults to 1), required on the wire.
    schema["required"] = sorted({*schema.get("required", []), "schema_version"})
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgereg manifest payload"
    schema["description"] = (
        "The payload of a signed manifest envelope (payloadType "
        f"{Manifest.payload_type}); see docs/protocol.md. Generated by "
        "tests/vectors/generate.py from edgereg.protocol.wire.Manifest."
    )
    schema["$comment"] = (
        "Rules JSON Schema cannot state, which a client checks too (docs/protocol.md "
        "section 3): integers are written without a fraction or exponent (9, never 9.0; "
        "schema_version is 1, never 1.0); a number that overflows a double (1e400) or a "
        "lone surrogate escape in a string (\\ud800 not followed by a low surrogate, "
        "section 2) is malformed anywhere, in unknown keys too; "
        "an entry's path is exactly blobs/sha256/ followed by its sha256; percent has at "
        "most two decimals; keys not listed here are ignored (a newer publisher "
        "may add them); percent and salt are set iff candidate is; paused is true "
        "only with a candidate; the candidate's version is higher than stable's; an "
        "entry's instead has the entry's version and no instead of its own; expires is a "
        "real date and time in the years 0001 to 9999; a contract's labels and labels_blob "
        "are exclusive, and its state pairs and task.output name its own inputs and outputs."
    )
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _document_schema(model: type[Any], title: str, description: str, comment: str) -> str:
    schema = model.model_json_schema()
    if model.ignores_unknown_keys:
        # What a client reads (a probe): unknown keys ignored, schema_version required.
        schema = _open_objects(schema)
        schema["required"] = sorted({*schema.get("required", []), "schema_version"})
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = title
    schema["description"] = description + " Generated by tests/vectors/generate.py."
    schema["$comment"] = comment
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def schemas() -> dict[Path, str]:
    """Every JSON Schema in docs/schemas/, generated from the protocol package."""
    return {
        SCHEMA_FILE: schema_text(),
        SCHEMA_FILE.parent / "probe.schema.json": _document_schema(
            GoldenProbe,
            "edgereg golden probe",
            "A golden probe blob (docs/protocol.md section 11), from "
            "edgereg.protocol.probe.GoldenProbe.",
            "Rules JSON Schema cannot state (docs/protocol.md section 11): integers without a "
            "fraction (schema_version is 1, never 1.0); no number beyond a double (1e400) "
            "and no lone surrogate escape anywhere; keys not listed here are ignored; data "
            "is the canonical padded base64 of exactly product(shape) x element-size "
            "bytes; tensor names are unique within inputs and within expected; "
            "artifact_sha256 equals the entry's sha256; a tensor has exactly one of data "
            "and offset (null is absent); an offset needs data_sha256, which is present "
            "exactly when the entry has probe_data and equals its sha256; a tensor's "
            "offset + product(shape) x element-size lies within the data blob.",
        ),
        SCHEMA_FILE.parent / "report.schema.json": _document_schema(
            Report,
            "edgereg device report",
            "A device report body (docs/protocol.md section 12), from "
            "edgereg.protocol.reports.Report.",
            "Rules JSON Schema cannot state (docs/protocol.md section 12): at most 16384 bytes; "
            "integers without a fraction (schema_version is 1, never 1.0; sequence 9, never "
            "9.0); no number beyond a double (1e400), no lone surrogate escape; unknown keys "
            "are refused; a "
            "schema_version 1 report (or one without schema_version) carries none of the "
            "keys version 2 added (unconfirmed_starts, cpu_class, memory_peak_mb, "
            "memory_steady_mb, first_inference_ms), not even as null, and one of version 1 "
            "or 2 carries no metrics; a rate's successes are at most its events.",
        ),
    }


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
    "blob-short": (
        "No Content-Length, and the body ends one byte before size (rule 14).",
        BLOB[:-1],
        None,
        len(BLOB),
        "bad-blob",
    ),
    "blob-content-length-short": (
        "Content-Length announces one byte less than size and the whole body of that "
        "length arrives: a complete answer holding another file, refused before reading "
        "(rule 14), never a transport failure retried forever.",
        BLOB[:-1],
        len(BLOB) - 1,
        len(BLOB),
        "bad-blob",
    ),
    "blob-content-length-short-and-cut": (
        "Content-Length announces less than size and the body is cut short too: the "
        "announced length already decides (rule 14, before reading).",
        BLOB[:5],
        len(BLOB) - 10,
        len(BLOB),
        "bad-blob",
    ),
    "blob-cut-before-content-length": (
        "Content-Length equals size, but the body ends one byte early: the connection was "
        "cut (transport; the download resumes later), not a bad blob.",
        BLOB[:-1],
        len(BLOB),
        len(BLOB),
        "transport",
    ),
    "blob-wrong-digest": (
        "Exactly size bytes, another sha256 (rule 14).",
        BLOB[:-1] + b"y",
        None,
        len(BLOB),
        "bad-blob",
    ),
}


def run_blob(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference decision for one blob vector: the reference client's own blob check.

    One implementation for the recorded answer and for what the Python device
    program answers (docs/reference/device-program.md), so the two cannot drift.
    """
    return check_blob_vector(vector_input)


def _vector_file(
    folder: str, name: str, description: str, vector_input: dict[str, Any]
) -> dict[str, str]:
    """One golden file of ``folder``, its ``expected`` from the folder's runner (RUNNERS)."""
    vector = {
        "name": name,
        "description": description,
        "input": vector_input,
        "expected": RUNNERS[folder](vector_input),
    }
    return {f"{folder}/{name}.json": json.dumps(vector, indent=2) + "\n"}


def build_blobs() -> dict[str, str]:
    files = {}
    digest = hashlib.sha256(BLOB).hexdigest()
    for name, (description, body, length, size, _reason) in BLOB_CASES.items():
        vector_input = {
            "entry": {"sha256": digest, "size": size},
            "content_length": length,
            "body": base64.b64encode(body).decode("ascii"),
        }
        files.update(_vector_file("blobs", name, description, vector_input))
    return files


# --- tier resolution and cohort buckets ----------------------------------------------

TIERS = {
    "high": {"min_ram_mb": 6144, "min_cpu_cores": 6, "soc_allow": ["Snapdragon 8*", "Apple A1?"]},
    "mid": {"min_ram_mb": 3072, "os": ["android"]},
    "low": {},
}
DEVICES: list[tuple[str, dict[str, Any]]] = [
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


# --- download conditions (docs/protocol.md section 8) -----------------------------------

_FREE = {
    "allow_metered": True,
    "require_charging": False,
    "require_idle": False,
    "require_storage_not_low": False,
}
_WIFI = {**_FREE, "allow_metered": False}
_EVERYTHING = {
    "allow_metered": False,
    "require_charging": True,
    "require_idle": True,
    "require_storage_not_low": True,
}
_MET = {"metered": False, "charging": True, "idle": True, "storage_low": False}
CONDITIONS_CASES: dict[str, tuple[str, dict[str, bool], dict[str, bool | None]]] = {
    "nothing-required-nothing-said": (
        "A policy that restricts nothing: no facts needed.",
        _FREE,
        {},
    ),
    "nothing-required-worst-conditions": (
        "A policy that restricts nothing downloads on a metered, discharging, busy, full device.",
        _FREE,
        {"metered": True, "charging": False, "idle": False, "storage_low": True},
    ),
    "wifi-only-nothing-said": (
        "Wi-Fi only and the app said nothing about the network: unknown is unmet (the bug of "
        "a one-line update that downloaded on cellular).",
        _WIFI,
        {},
    ),
    "wifi-only-null-is-unknown": ("null says nothing, as a missing key.", _WIFI, {"metered": None}),
    "wifi-only-metered": ("Wi-Fi only on a metered network.", _WIFI, {"metered": True}),
    "wifi-only-unmetered": ("Wi-Fi only on an unmetered network.", _WIFI, {"metered": False}),
    "charging-not-said": (
        "Charging required and not said.",
        {**_FREE, "require_charging": True},
        {"metered": False},
    ),
    "charging-false": (
        "Charging required, not charging.",
        {**_FREE, "require_charging": True},
        {"charging": False},
    ),
    "charging-true": (
        "Charging required and charging.",
        {**_FREE, "require_charging": True},
        {"charging": True},
    ),
    "idle-not-said": ("Device idle required and not said.", {**_FREE, "require_idle": True}, {}),
    "idle-false": (
        "Device idle required, the device is in use.",
        {**_FREE, "require_idle": True},
        {"idle": False},
    ),
    "idle-true": (
        "Device idle required and idle.",
        {**_FREE, "require_idle": True},
        {"idle": True},
    ),
    "storage-not-said": (
        "Storage-not-low required and not said.",
        {**_FREE, "require_storage_not_low": True},
        {},
    ),
    "storage-low": (
        "Storage-not-low required and storage is low.",
        {**_FREE, "require_storage_not_low": True},
        {"storage_low": True},
    ),
    "storage-fine": (
        "Storage-not-low required and storage is fine.",
        {**_FREE, "require_storage_not_low": True},
        {"storage_low": False},
    ),
    "everything-required-nothing-said": (
        "Every condition required, none said: the first in the protocol's order.",
        _EVERYTHING,
        {},
    ),
    "everything-required-first-met": (
        "Every condition required, unmetered said: the next unmet one.",
        _EVERYTHING,
        {"metered": False},
    ),
    "everything-required-only-storage-unsaid": (
        "Every condition required, all said but storage: storage-low.",
        _EVERYTHING,
        {"metered": False, "charging": True, "idle": True},
    ),
    "everything-required-everything-met": ("Every condition required and met.", _EVERYTHING, _MET),
}


def build_conditions() -> dict[str, str]:
    files = {}
    for name, (description, policy, said) in CONDITIONS_CASES.items():
        vector_input = {"policy": policy, "conditions": said}
        files.update(_vector_file("conditions", name, description, vector_input))
    return files


# --- the self-test's verdict (docs/protocol.md section 11, rules 15 to 19) ----------------

_GPU_CPU = ["opencl", "cpu"]
SELFTEST_CASES: dict[str, tuple[str, list[str], bool, dict[str, str], dict[str, str]]] = {
    # name: (description, backends, probe, remembered, trials)
    "gpu-passes": (
        "The first hinted backend passes: chosen.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "passed", "cpu": "passed"},
    ),
    "gpu-fails-cpu-passes": (
        "A miscomputing GPU is skipped (and remembered); the CPU passes.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "failed", "cpu": "passed"},
    ),
    "gpu-unavailable-cpu-passes": (
        "A GPU this device lacks is not a failure: not skipped, not remembered.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "unavailable", "cpu": "passed"},
    ),
    "gpu-remembered-not-tried": (
        "A backend that failed this artifact before is not tried again.",
        _GPU_CPU,
        True,
        {"opencl": "cosine 0.91 below 0.999"},
        {"opencl": "passed", "cpu": "passed"},
    ),
    "every-backend-fails": (
        "The CPU fails too: probe-failed, the version marked bad, a report with probe failed.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "failed", "cpu": "failed"},
    ),
    "every-backend-fails-to-load": (
        "No backend loads the model: probe-failed, and the report says it did not load.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "load-failed", "cpu": "load-failed"},
    ),
    "cpu-fails-gpu-unavailable": (
        "The CPU ran the probe and missed it: a verdict on the model.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "unavailable", "cpu": "failed"},
    ),
    "cpu-remembered-failed": (
        "Every backend failed this artifact before: rejected without running anything.",
        _GPU_CPU,
        True,
        {"opencl": "abs-error", "cpu": "cosine"},
        {"opencl": "passed", "cpu": "passed"},
    ),
    "no-runner": (
        "No backend can be created (an app without a model runner, or without the MNN "
        "library): the probe did not run. Never a probe failure: nothing marked bad, "
        "nothing reported, the next fetch tries again.",
        _GPU_CPU,
        True,
        {},
        {"opencl": "unavailable", "cpu": "unavailable"},
    ),
    "gpu-fails-cpu-unavailable": (
        "The GPU missed the probe but the CPU cannot be created: no verdict on the model "
        "(the GPU is still remembered as failing).",
        _GPU_CPU,
        True,
        {},
        {"opencl": "failed", "cpu": "unavailable"},
    ),
    "no-probe-first-that-loads": (
        "Without a probe the first backend that loads is chosen; the report says probe none.",
        ["vulkan", "opencl", "cpu"],
        False,
        {},
        {"vulkan": "load-failed", "opencl": "passed", "cpu": "passed"},
    ),
    "no-probe-nothing-available": (
        "Without a probe and without any backend: not run.",
        ["cpu"],
        False,
        {},
        {"cpu": "unavailable"},
    ),
    "cpu-only-passes": ("A CPU-only entry.", ["cpu"], True, {}, {"cpu": "passed"}),
}


def build_selftest() -> dict[str, str]:
    files = {}
    for name, (description, backends, probe, remembered, trials) in SELFTEST_CASES.items():
        vector_input = {
            "backends": backends,
            "probe": probe,
            "remembered": remembered,
            "trials": trials,
        }
        files.update(_vector_file("selftest", name, description, vector_input))
    return files


# --- the confirmation ledger (docs/protocol.md section 11) ---------------------------------

_L, _S = {"do": "launch"}, {"do": "app_started"}


def _inst(version: str) -> dict[str, Any]:
    return {"do": "install", "version": version}


def _conf(version: str | None) -> dict[str, Any]:
    return {"do": "confirm", "version": version}


_GOOD_1 = [_L, _S, _inst("1.0.0"), _conf("1.0.0")]
"""1.0.0 installed during a start and confirmed: the last good version."""

HEALTH_CASES: dict[str, tuple[str, int, list[dict[str, Any]]]] = {
    # name: (description, max_unconfirmed_starts, steps)
    "install-before-app-started-confirmed": (
        "The app installs the update, then calls app_started, then confirms in the same "
        "process: that start began before the install and ran it, and was confirmed: "
        "nothing counts, nothing is reported.",
        3,
        [_L, _inst("1.0.0"), _S, _conf("1.0.0")],
    ),
    "install-before-app-started-first-launch-crash": (
        "Installed before app_started, the app dies before its first inference: the "
        "next start counts that start (1, reported), and a confirmation then keeps it.",
        3,
        [_L, _inst("1.0.0"), _S, _L, _S, _conf("1.0.0")],
    ),
    "app-started-before-install-confirmed": (
        "app_started, then the install, then the confirmation in the same process: nothing counts.",
        3,
        [_L, _S, _inst("1.0.0"), _conf("1.0.0")],
    ),
    "app-started-before-install-first-launch-crash": (
        "app_started, then the install, then the app dies running it: that start is under "
        "way with the install, so the next start counts it (1).",
        3,
        [_L, _S, _inst("1.0.0"), _L, _S, _conf("1.0.0")],
    ),
    "installed-in-the-background-confirmed": (
        "A process that never calls app_started (a background worker) installs: the next "
        "app start is the first that runs it, and it is confirmed: nothing counts.",
        3,
        [_L, _inst("1.0.0"), _L, _S, _conf("1.0.0")],
    ),
    "installed-in-the-background-first-launch-crash": (
        "Installed in the background; the first app start that runs it dies: the next "
        "start counts it (1).",
        3,
        [_L, _inst("1.0.0"), _L, _S, _L, _S, _conf("1.0.0")],
    ),
    "installed-during-a-start-run-at-the-next": (
        "app_started, the install, and the app keeps the model it loaded until the next "
        "start, which confirms: the start of the install counts (1), as a crash in it "
        "would (the client cannot tell the two apart; docs/protocol.md section 11).",
        3,
        [_L, _S, _inst("1.0.0"), _L, _S, _conf("1.0.0")],
    ),
    "crash-loop-reverts-after-max-starts": (
        "A crash at every start: 1, 2, 3 reported, the start that counts the third "
        "reverts to the last good version and reports the count first.",
        3,
        [*_GOOD_1, _L, _inst("2.0.0"), _S, _L, _S, _L, _S, _L, _S],
    ),
    "crash-loop-in-either-order-runs-as-often": (
        "The same crash loop when app_started comes first: the install's own start "
        "counts, so the revert comes after the same three runs.",
        3,
        [*_GOOD_1, _L, _S, _inst("2.0.0"), _L, _S, _L, _S, _L, _S],
    ),
    "max-one-start": (
        "max_unconfirmed_starts 1: the first start after a run that ended unconfirmed "
        "reverts; with nothing confirmed before, to no version.",
        1,
        [_L, _inst("1.0.0"), _S, _L, _S],
    ),
    "starts-before-the-install-do-not-count": (
        "Starts of the confirmed 1.0.0 before 2.0.0 arrives count nothing against 2.0.0.",
        3,
        [*_GOOD_1, _L, _S, _L, _S, _L, _inst("2.0.0"), _S, _conf("2.0.0")],
    ),
    "confirm-of-another-version": (
        "A confirmation of the version loaded before the update does not vouch for it: "
        "the next start counts.",
        3,
        [*_GOOD_1, _L, _S, _inst("2.0.0"), _conf("1.0.0"), _L, _S],
    ),
    "confirm-without-a-version": (
        "A confirmation that names no version confirms the installed one.",
        3,
        [_L, _inst("1.0.0"), _S, _conf(None), _L, _S],
    ),
    "app-started-twice-in-one-process": (
        "app_started called twice in one process: the second call counts the first "
        "(call it once per start).",
        3,
        [_L, _inst("1.0.0"), _S, _S],
    ),
    "nothing-installed": (
        "Starts with nothing installed count nothing.",
        3,
        [_L, _S, _L, _S, _conf(None)],
    ),
}


def build_health() -> dict[str, str]:
    files = {}
    for name, (description, max_starts, steps) in HEALTH_CASES.items():
        vector_input = {"max_unconfirmed_starts": max_starts, "steps": steps}
        files.update(_vector_file("health", name, description, vector_input))
    return files


# --- app metrics counted on the device (docs/protocol.md sections 3 and 11) ----------------

_RATE = {"kind": "rate"}
_CONF = {"kind": "distribution", "buckets": [0.25, 0.5, 0.75]}
_DECLARED = {"accepted": _RATE, "confidence": _CONF}
_MAX = 10**9


def _rec(name: str, success: bool) -> dict[str, Any]:
    return {"record": name, "success": success}


def _obs(name: str, value: float | str) -> dict[str, Any]:
    return {"observe": name, "value": value}


_LONG = ["m" + "x" * 60 + f"{i:02d}" for i in range(16)]
"""Sixteen names of 63 characters: the most a release declares, at the longest name."""

METRICS_CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = {
    # name: (description, declared, counts before, calls)
    "rate-counts-events-and-successes": (
        "Each record() is one event; a success counts in successes too.",
        _DECLARED,
        {},
        [_rec("accepted", True), _rec("accepted", False), _rec("accepted", True)],
    ),
    "distribution-buckets-and-edges": (
        "A value equal to an edge falls in the bucket that edge closes: 0.25 in (-inf, 0.25], "
        "0.5 in (0.25, 0.5], 0.75000001 in (0.75, +inf); K edges, K + 1 counts.",
        _DECLARED,
        {},
        [
            _obs("confidence", 0.25),
            _obs("confidence", 0.2500001),
            _obs("confidence", 0.5),
            _obs("confidence", 0.75),
            _obs("confidence", 0.75000001),
        ],
    ),
    "distribution-beyond-the-edges": (
        "Values below the first edge and above the last, however far, are counted in the "
        "first and last buckets: nothing is clamped away or refused for its size.",
        _DECLARED,
        {},
        [
            _obs("confidence", -1e308),
            _obs("confidence", -5),
            _obs("confidence", 1e308),
            _obs("confidence", 7),
        ],
    ),
    "distribution-negative-zero-and-integers": (
        "-0.0 equals an edge 0.0 (its bucket closes there); an integer value is a number "
        "like any other.",
        {"delta": {"kind": "distribution", "buckets": [-1, 0, 1]}},
        {},
        [_obs("delta", -0.0), _obs("delta", 0), _obs("delta", -1), _obs("delta", 2)],
    ),
    "not-finite-values-refused": (
        "NaN and the infinities are refused (a programming error at the call site): nothing "
        "counted, the counts before stay as they were.",
        _DECLARED,
        {"confidence": {"counts": [1, 0, 0, 0]}},
        [
            _obs("confidence", "NaN"),
            _obs("confidence", "Infinity"),
            _obs("confidence", "-Infinity"),
            _obs("confidence", 0.9),
        ],
    ),
    "not-finite-before-the-name": (
        "A value that is not finite is refused as such, even under a name nobody declares.",
        _DECLARED,
        {},
        [_obs("nobody", "NaN"), _obs("nobody", 0.5)],
    ),
    "undeclared-names-refused": (
        "Names compare exactly: another case, a space, a name of another release are not "
        "declared; refused, nothing counted, no metrics key.",
        _DECLARED,
        {},
        [_rec("Accepted", True), _rec("accepted ", True), _obs("latency", 3.0)],
    ),
    "the-other-kind-refused": (
        "A distribution recorded as a rate, or a rate observed as a distribution: refused.",
        _DECLARED,
        {},
        [_rec("confidence", True), _obs("accepted", 1.0), _rec("accepted", False)],
    ),
    "only-metrics-counted-are-sent": (
        "A declared metric never counted is left out of the report, not sent as zeros.",
        {**_DECLARED, "retried": _RATE},
        {},
        [_rec("retried", False)],
    ),
    "nothing-counted-no-metrics": (
        "No call counted: the report carries no metrics.",
        _DECLARED,
        {},
        [],
    ),
    "totals-go-on-from-earlier-counts": (
        "The install's counts are never reset: new calls add to the totals so far (counted "
        "in earlier app sessions).",
        _DECLARED,
        {"accepted": {"events": 40, "successes": 37}, "confidence": {"counts": [1, 2, 3, 4]}},
        [_rec("accepted", True), _obs("confidence", 0.1)],
    ),
    "rate-stops-at-a-billion": (
        "At 10^9 events (the most a report carries) an event counts no more, its success "
        "neither: the share stays; below it, both count.",
        {"accepted": _RATE, "kept": _RATE},
        {
            "accepted": {"events": _MAX - 1, "successes": 5},
            "kept": {"events": _MAX, "successes": _MAX - 1},
        },
        [_rec("accepted", True), _rec("accepted", True), _rec("kept", True)],
    ),
    "distribution-bucket-stops-at-a-billion": (
        "A bucket at 10^9 counts no more; the other buckets go on.",
        _DECLARED,
        {"confidence": {"counts": [_MAX - 1, 0, 0, 0]}},
        [_obs("confidence", 0.1), _obs("confidence", 0.1), _obs("confidence", 0.3)],
    ),
    "sixteen-metrics-at-the-bound": (
        "The most a report carries: 16 distributions of 32 buckets under names of 63 "
        "characters, every count at 10^9 (6,897 bytes of metrics; the report vector "
        "worst-case shows the whole report within 16384 bytes).",
        {
            name: {"kind": "distribution", "buckets": [float(e) for e in range(31)]}
            for name in _LONG
        },
        {name: {"counts": [_MAX] * 31 + [_MAX - 1]} for name in _LONG},
        [_obs(name, 99.5) for name in _LONG] + [_obs(_LONG[0], 100)],
    ),
}


def build_metrics() -> dict[str, str]:
    files = {}
    for name, (description, declared, counts, calls) in METRICS_CASES.items():
        vector_input = {"declared": declared, "counts": counts, "calls": calls}
        files.update(_vector_file("metrics", name, description, vector_input))
    return files


# --- tier files (docs/protocol.md section 5) -----------------------------------------------

FILE_TIERS = {
    "high": TierRules(min_ram_mb=6144, min_cpu_cores=6),
    "mid": TierRules(min_ram_mb=3072),
    "low": TierRules(),
}
_EXPORTED = tier_file(FILE_TIERS)
_PHONE = {"ram_mb": 4096, "cpu_cores": 6}  # 4 GB, 6 cores: mid


def _tier_doc(tiers: Any, **extra: Any) -> bytes:
    return json.dumps({"schema_version": 1, "tiers": tiers, **extra}).encode()


_LISTED = [
    {"name": "high", "rules": {"min_ram_mb": 6144, "min_cpu_cores": 6}},
    {"name": "mid", "rules": {"min_ram_mb": 3072}},
    {"name": "low", "rules": {}},
]
TIER_FILE_CASES: dict[str, tuple[str, bytes, dict[str, Any]]] = {
    "exported": ("What `edgereg tiers` writes: a 4 GB, 6-core phone is mid.", _EXPORTED, _PHONE),
    "exported-flagship": (
        "The same file, a flagship.",
        _EXPORTED,
        {"ram_mb": 12288, "cpu_cores": 8},
    ),
    "exported-budget": (
        "The same file, a budget phone: the catch-all.",
        _EXPORTED,
        {"ram_mb": 2048, "cpu_cores": 4},
    ),
    "keys-in-another-order": (
        "Keys written in any order, with any spacing: the array alone orders the tiers.",
        b'{ "tiers" : [ {"rules": {"min_cpu_cores": 6, "min_ram_mb": 6144}, "name": "high"},'
        b' {"rules": {"min_ram_mb": 3072}, "name": "mid"}, {"rules": {}, "name": "low"} ],'
        b' "schema_version": 1 }',
        _PHONE,
    ),
    "object-of-tiers-refused": (
        "The tiers as an object whose key order was meant as the tier order: refused (JSON "
        "objects are unordered; with sorted keys this put the phone in low).",
        canonical_json(
            {
                "high": {"min_ram_mb": 6144, "min_cpu_cores": 6},
                "mid": {"min_ram_mb": 3072},
                "low": {},
            }
        ),
        _PHONE,
    ),
    "tiers-object-inside-refused": (
        'An object of tiers under "tiers": refused the same way.',
        _tier_doc({"high": {"min_ram_mb": 6144}, "low": {}}),
        _PHONE,
    ),
    "name-twice": (
        "A tier listed twice.",
        _tier_doc([*_LISTED[:2], {"name": "mid", "rules": {}}, _LISTED[2]]),
        _PHONE,
    ),
    "unknown-rule": (
        "A rule this client does not know: refused, never ignored (ignoring it would put "
        "devices in a better tier).",
        _tier_doc(
            [{"name": "high", "rules": {"min_ram_mb": 6144, "min_gpu": "adreno"}}, _LISTED[2]]
        ),
        _PHONE,
    ),
    "rule-as-string": (
        "min_ram_mb as a string.",
        _tier_doc([{"name": "high", "rules": {"min_ram_mb": "6144"}}, _LISTED[2]]),
        _PHONE,
    ),
    "rule-as-float": (
        "min_ram_mb as 6144.0: integers have no fraction.",
        b'{"schema_version": 1, "tiers": [{"name": "high", "rules": {"min_ram_mb": 6144.0}},'
        b' {"name": "low", "rules": {}}]}',
        _PHONE,
    ),
    "rule-null": (
        "A rule set to null: refused (leave it out instead).",
        _tier_doc([{"name": "high", "rules": {"min_ram_mb": None}}, _LISTED[2]]),
        _PHONE,
    ),
    "cores-zero": (
        "min_cpu_cores 0: a device has at least one core.",
        _tier_doc([{"name": "high", "rules": {"min_cpu_cores": 0}}, _LISTED[2]]),
        _PHONE,
    ),
    "os-unknown": (
        "An os other than android and ios.",
        _tier_doc([{"name": "high", "rules": {"os": ["windows"]}}, _LISTED[2]]),
        _PHONE,
    ),
    "soc-pattern": (
        "A SoC rule, matched case-insensitively with * wildcards.",
        _tier_doc([{"name": "high", "rules": {"soc_allow": ["Snapdragon 8*"]}}, _LISTED[2]]),
        {"ram_mb": 4096, "cpu_cores": 6, "soc": "snapdragon 8 gen 2"},
    ),
    "no-catch-all-last": (
        "The last tier sets a rule: some devices would get no tier.",
        _tier_doc(_LISTED[:2]),
        _PHONE,
    ),
    "empty": ("No tiers at all.", _tier_doc([]), _PHONE),
    "bad-name": (
        "A tier name that is not a name.",
        _tier_doc([{"name": "High Tier", "rules": {}}]),
        _PHONE,
    ),
    "extra-key-in-tier": (
        "A tier with a key beside name and rules.",
        _tier_doc([{"name": "low", "rules": {}, "variant": "int8"}]),
        _PHONE,
    ),
    "unknown-top-level-key": (
        "A key beside schema_version and tiers.",
        _tier_doc([{"name": "low", "rules": {}}], published="2025-06-01"),
        _PHONE,
    ),
    "schema-version-2": (
        "A newer format.",
        json.dumps({"schema_version": 2, "tiers": [{"name": "low", "rules": {}}]}).encode(),
        _PHONE,
    ),
    "schema-version-missing": (
        "No schema_version.",
        json.dumps({"tiers": [{"name": "low", "rules": {}}]}).encode(),
        _PHONE,
    ),
    "duplicate-key": (
        "Strict JSON: a key twice.",
        b'{"schema_version": 1, "tiers": [{"name": "low", "rules": {}}], "tiers": []}',
        _PHONE,
    ),
    "not-json": ("Not JSON.", b"high: 6144\nlow:\n", _PHONE),
}


def build_tier_files() -> dict[str, str]:
    files = {}
    for name, (description, data, device) in TIER_FILE_CASES.items():
        vector_input = {"file": base64.b64encode(data).decode("ascii"), "device": device}
        files.update(_vector_file("tiers", name, description, vector_input))
    return files


# --- golden probes (docs/protocol.md section 11) --------------------------------------

PROBE_ARTIFACT = hashlib.sha256(b"digits 1.0.0 int8").hexdigest()
_PACK = {"float32": "f", "float16": "e", "int8": "b", "uint8": "B", "int32": "i", "int64": "q"}


def _tensor(
    name: str, values: list[float], shape: list[int] | None = None, dtype: str = "float32"
) -> dict[str, Any]:
    """A tensor in the probe encoding: base64 of the little-endian elements, C order."""
    data = struct.pack(f"<{len(values)}{_PACK[dtype]}", *values)
    return {
        "name": name,
        "dtype": dtype,
        "shape": shape if shape is not None else [len(values)],
        "data": base64.b64encode(data).decode("ascii"),
    }


X = _tensor("x", [0.5, -1.0, 2.0, 0.25], [1, 4])
PROBS = [0.05, 0.1, 0.6, 0.05, 0.2]


def _probe(
    expected: list[list[list[dict[str, Any]]]] | None = None,
    *,
    min_cosine: float = 0.99,
    max_abs_error: float = 0.05,
    **extra: Any,
) -> dict[str, Any]:
    """A probe document: per case, per step, the expected tensors (input x each step)."""
    cases = expected if expected is not None else [[[_tensor("probs", PROBS)]]]
    document: dict[str, Any] = {
        "schema_version": 1,
        "model": "digits",
        "variant": "int8",
        "artifact_sha256": PROBE_ARTIFACT,
        "state": [],
        "cases": [
            {"steps": [{"inputs": [X], "expected": step} for step in case]} for case in cases
        ],
        "tolerance": {"min_cosine": min_cosine, "max_abs_error": max_abs_error},
    }
    document.update(extra)
    return document


def _probs(values: list[float], shape: list[int] | None = None) -> list[list[list[dict[str, Any]]]]:
    """One case, one step, output probs holding ``values``: the computed side."""
    return [[[_tensor("probs", values, shape)]]]


def _at_cosine(
    cosine: float,
) -> tuple[list[list[list[dict[str, Any]]]], list[list[list[dict[str, Any]]]]]:
    """Expected [1, 0] and computed [c, sqrt(1 - c^2)]: their cosine is c."""
    expected = [[[_tensor("direction", [1.0, 0.0])]]]
    computed = [[[_tensor("direction", [cosine, math.sqrt(1 - cosine * cosine)])]]]
    return expected, computed


def _with_state() -> dict[str, Any]:
    document = _probe(
        [[[_tensor("y", [1.0, 2.0])], [_tensor("y", [3.0, 4.0])]]], state=[["h_in", "h_out"]]
    )
    return document


_COS_UNDER = _at_cosine(0.9899)
_COS_OVER = _at_cosine(0.9901)
_NAN = float("nan")

# name -> (description, probe document (or raw bytes), computed outputs, artifact sha256)
PROBE_CASES: dict[str, tuple[str, dict[str, Any] | bytes, list[Any]]] = {
    "exact": ("The computed outputs are the expected ones.", _probe(), _probs(PROBS)),
    "within-tolerance": (
        "Small float differences: cosine above 0.99, largest difference 0.01 <= 0.05.",
        _probe(),
        _probs([0.06, 0.09, 0.61, 0.04, 0.2]),
    ),
    "cosine-just-below": (
        "Cosine 0.9899 < min_cosine 0.99 (max_abs_error 0.5 is met): fails on cosine.",
        _probe(_COS_UNDER[0], max_abs_error=0.5),
        _COS_UNDER[1],
    ),
    "cosine-just-above": (
        "Cosine 0.9901 >= min_cosine 0.99, differences within 0.5: passes.",
        _probe(_COS_OVER[0], max_abs_error=0.5),
        _COS_OVER[1],
    ),
    "abs-error-above": (
        "Every output doubled: cosine 1, but the largest difference 0.6 > 0.05.",
        _probe(),
        _probs([2 * v for v in PROBS]),
    ),
    "nan-in-expected": (
        "The expected values hold a NaN; the device computed -7x the other values. A NaN "
        "anywhere fails (never compare through it).",
        _probe(_probs([0.05, _NAN, 0.6, 0.05, 0.2])),
        _probs([-7 * v for v in PROBS]),
    ),
    "nan-in-computed": (
        "The device computed a NaN.",
        _probe(),
        _probs([0.05, 0.1, _NAN, 0.05, 0.2]),
    ),
    "infinity-in-computed": (
        "The device computed an infinity.",
        _probe(),
        _probs([0.05, 0.1, float("inf"), 0.05, 0.2]),
    ),
    "two-zero-vectors": (
        "Expected all zeros, computed all zeros: cosine 1 by definition, difference 0.",
        _probe(_probs([0.0, 0.0, 0.0])),
        _probs([0.0, 0.0, 0.0]),
    ),
    "zero-against-nonzero": (
        "Expected all zeros, computed 0.01s: cosine 0 by definition (fails), though every "
        "difference is within 0.05.",
        _probe(_probs([0.0, 0.0, 0.0])),
        _probs([0.01, 0.01, 0.01]),
    ),
    "empty-tensor": (
        "A tensor of shape [0] on both sides: nothing differs; passes.",
        _probe(_probs([], [0])),
        _probs([], [0]),
    ),
    "shape-mismatch": (
        "The right 6 values, computed with shape [2, 3] where [6] is expected.",
        _probe(_probs([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        _probs([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]),
    ),
    "element-count-mismatch": (
        "Four values computed where five are expected.",
        _probe(),
        _probs(PROBS[:4]),
    ),
    "missing-output": (
        "The device returned no output named probs.",
        _probe(),
        [[[_tensor("logits", PROBS)]]],
    ),
    "extra-output-ignored": (
        "The device returned probs and another output: only expected outputs are compared.",
        _probe(),
        [[[_tensor("probs", PROBS), _tensor("logits", [9.0])]]],
    ),
    "float16-expected": (
        "Expected values stored as float16, computed as float32: compared as numbers.",
        _probe([[[_tensor("probs", PROBS, dtype="float16")]]]),
        _probs(PROBS),
    ),
    "int8-output": (
        "An int8 output (a quantized class map) computed exactly.",
        _probe([[[_tensor("classes", [3, -2, 0, 7], dtype="int8")]]]),
        [[[_tensor("classes", [3, -2, 0, 7], dtype="int8")]]],
    ),
    "stateful-two-steps": (
        "A stateful probe (state h_in <- h_out): one case of two steps, each checked.",
        _with_state(),
        [[[_tensor("y", [1.0, 2.0])], [_tensor("y", [3.0, 4.0])]]],
    ),
    "steps-count-mismatch": (
        "One step computed for a case of two steps.",
        _with_state(),
        [[[_tensor("y", [1.0, 2.0])]]],
    ),
    "first-failure-decides": (
        "Case 1 misses max_abs_error, case 2 computed a NaN: the first failure in order "
        "(case, step, expected output) is the reason.",
        _probe([[[_tensor("probs", PROBS)]], [[_tensor("probs", PROBS)]]]),
        [
            [[_tensor("probs", [2 * v for v in PROBS])]],
            [[_tensor("probs", [0.05, _NAN, 0.6, 0.05, 0.2])]],
        ],
    ),
    "unknown-keys-ignored": (
        "Keys this client does not know, at the top, in a case, a step, a tensor and the "
        "tolerance: ignored (a newer build may add them).",
        {
            **_probe(
                [[[{**_tensor("probs", PROBS), "quantization": {"scale": 0.1}}]]],
                calibration={"runs": 3},
            ),
            "cases": [
                {
                    "steps": [
                        {
                            "inputs": [X],
                            "expected": [{**_tensor("probs", PROBS), "quantization": 1}],
                            "timing_ms": 3,
                        }
                    ],
                    "label": "zero",
                }
            ],
            "tolerance": {"min_cosine": 0.99, "max_abs_error": 0.05, "max_rel_error": 0.1},
        },
        _probs(PROBS),
    ),
    "zero-cases": ("cases is empty: malformed.", _probe([]), []),
    "min-cosine-above-1": (
        "min_cosine 1.5: no cosine reaches it; malformed.",
        _probe(min_cosine=1.5),
        _probs(PROBS),
    ),
    "negative-max-abs-error": (
        "max_abs_error -0.1: malformed.",
        _probe(max_abs_error=-0.1),
        _probs(PROBS),
    ),
    "schema-version-2": (
        "schema_version 2: a probe format this client does not know; malformed.",
        _probe(schema_version=2),
        _probs(PROBS),
    ),
    "schema-version-as-float": (
        "schema_version 1.0: an integer is written without a fraction; malformed.",
        _probe(schema_version=1.0),
        _probs(PROBS),
    ),
    "data-size-wrong": (
        "A tensor of shape [5] float32 whose data holds 16 bytes, not 20: malformed.",
        _probe([[[{**_tensor("probs", PROBS), "data": _tensor("p", PROBS[:4])["data"]}]]]),
        _probs(PROBS),
    ),
    "data-not-canonical-base64": (
        "Tensor data without its base64 padding: only the canonical spelling is valid.",
        _probe(
            [[[{**_tensor("probs", PROBS[:4]), "data": _tensor("p", PROBS[:4])["data"] + "=="}]]]
        ),
        _probs(PROBS[:4]),
    ),
    "other-artifact": (
        "artifact_sha256 names another artifact than the entry's: malformed.",
        _probe(artifact_sha256="0" * 64),
        _probs(PROBS),
    ),
    "infinity-in-unknown-key": (
        "1e400 in an unknown key overflows a double: malformed (not JSON a client reads).",
        canonical_json(_probe()).replace(b'"cases":', b'"future":1e400,"cases":', 1),
        _probs(PROBS),
    ),
    # Issue #30: what a client written from the docs alone had to decide, settled.
    "model-missing": (
        "No model key: model and variant are informational (nothing is compared with "
        "them) but required; malformed.",
        {key: value for key, value in _probe().items() if key != "model"},
        _probs(PROBS),
    ),
    "variant-not-a-name": (
        "variant 'Int8': informational, but a name like every name; malformed.",
        _probe(variant="Int8"),
        _probs(PROBS),
    ),
    "state-pair-as-object": (
        'A state pair spelled {"input": ..., "output": ...} as the contract spells it: the '
        'probe spells a pair ["input", "output"], the other spelling is malformed here.',
        _probe(state=[{"input": "h", "output": "h_next"}]),
        _probs(PROBS),
    ),
    "expected-names-an-output-twice": (
        "A step whose expected names probs twice: names are unique per step; malformed "
        "(never the first or the last one compared).",
        _probe([[[_tensor("probs", PROBS), _tensor("probs", PROBS)]]]),
        _probs(PROBS),
    ),
    "duplicate-key": (
        "The tolerance names min_cosine twice: malformed.",
        canonical_json(_probe()).replace(
            b'"min_cosine":0.99', b'"min_cosine":0.0,"min_cosine":0.99', 1
        ),
        _probs(PROBS),
    ),
}


# --- probes with a data blob (the entry's probe_data; docs/protocol.md section 11) ---

_X_BYTES = base64.b64decode(X["data"])
_PROBS_BYTES = struct.pack("<5f", *PROBS)
#: The data blob: x's bytes, then the expected probs' bytes.
PROBE_DATA = _X_BYTES + _PROBS_BYTES
PROBE_DATA_SHA = hashlib.sha256(PROBE_DATA).hexdigest()


def _at(tensor: dict[str, Any], offset: int) -> dict[str, Any]:
    """The tensor with its bytes in the data blob at ``offset``."""
    return {**{k: v for k, v in tensor.items() if k != "data"}, "offset": offset}


def _data_probe(
    expected_offset: int = len(_X_BYTES),
    *,
    inputs: dict[str, Any] | None = None,
    expected: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A probe whose input and expected output are read from the data blob."""
    document = _probe([[[expected or _at(_tensor("probs", PROBS), expected_offset)]]], **extra)
    document["cases"][0]["steps"][0]["inputs"] = [inputs or _at(X, 0)]
    document.setdefault("data_sha256", PROBE_DATA_SHA)
    return document


def _blob(data: bytes = PROBE_DATA, size: int | None = None) -> dict[str, Any]:
    """The vector's probe_data: the entry's declared size and the verified blob."""
    return {
        "size": len(data) if size is None else size,
        "data": base64.b64encode(data).decode("ascii"),
    }


# name -> (description, probe document, computed outputs, probe_data (or None))
DATA_PROBE_CASES: dict[str, tuple[str, dict[str, Any], list[Any], dict[str, Any] | None]] = {
    "data-blob-exact": (
        "Input and expected output read from the probe data blob at their offsets; "
        "computed exactly: passes.",
        _data_probe(),
        _probs(PROBS),
        _blob(),
    ),
    "data-blob-abs-error": (
        "Expected output from the data blob, computed doubled: abs-error (the blob's "
        "values are the ones compared).",
        _data_probe(),
        _probs([2 * v for v in PROBS]),
        _blob(),
    ),
    "data-blob-mixed": (
        "The input inline, the expected output in the data blob: each tensor chooses.",
        _data_probe(inputs=X),
        _probs([0.06, 0.09, 0.61, 0.04, 0.2]),
        _blob(),
    ),
    "data-blob-offset-past-end": (
        "The expected output's 20 bytes start 4 bytes before the blob's end: malformed.",
        _data_probe(len(PROBE_DATA) - 4),
        _probs(PROBS),
        _blob(),
    ),
    "data-blob-not-in-entry": (
        "The probe reads a data blob (data_sha256, offsets), the entry names none: malformed.",
        _data_probe(),
        _probs(PROBS),
        None,
    ),
    "data-blob-other-digest": (
        "The probe's data_sha256 is not the entry's probe_data: malformed.",
        _data_probe(data_sha256="0" * 64),
        _probs(PROBS),
        _blob(),
    ),
    "data-blob-unnamed": (
        "The entry names a probe data blob, the probe (all inline) names no data_sha256: "
        "malformed.",
        _probe(),
        _probs(PROBS),
        _blob(),
    ),
    "data-blob-declared-too-large": (
        "The entry declares a probe data blob of 128 MiB + 1 byte: malformed before any byte "
        "(its data is not downloaded: empty here).",
        _data_probe(),
        _probs(PROBS),
        _blob(b"", size=MAX_PROBE_DATA_BYTES + 1),
    ),
    "tensor-with-data-and-offset": (
        "A tensor with both data and offset: malformed (exactly one).",
        _data_probe(expected={**_tensor("probs", PROBS), "offset": len(_X_BYTES)}),
        _probs(PROBS),
        _blob(),
    ),
    "tensor-without-data-or-offset": (
        "A tensor with neither data nor offset: malformed.",
        _data_probe(expected={"name": "probs", "dtype": "float32", "shape": [5]}),
        _probs(PROBS),
        _blob(),
    ),
    "offset-without-data-sha256": (
        "A tensor names an offset, the probe no data_sha256 (nor the entry a blob): malformed.",
        {k: v for k, v in _data_probe().items() if k != "data_sha256"},
        _probs(PROBS),
        None,
    ),
    "offset-as-float": (
        "offset 20.0: an integer is written without a fraction; malformed.",
        _data_probe(expected={**_at(_tensor("probs", PROBS), 0), "offset": float(len(_X_BYTES))}),
        _probs(PROBS),
        _blob(),
    ),
}


def run_probe(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference verdict for one probe vector: parse the probe, then check the outputs."""
    blob = vector_input.get("probe_data")
    data = None
    if blob is not None:
        if blob["size"] > MAX_PROBE_DATA_BYTES:
            return {"pass": False, "reason": "malformed"}  # refused before any byte
        data = base64.b64decode(blob["data"])
    try:
        probe = from_bytes(GoldenProbe, base64.b64decode(vector_input["probe"]))
    except WireError:
        return {"pass": False, "reason": "malformed"}
    if probe.artifact_sha256 != vector_input["artifact_sha256"]:
        return {"pass": False, "reason": "malformed"}
    try:
        probe = probe.resolved(data)
    except ValueError:
        return {"pass": False, "reason": "malformed"}
    computed = [
        [{t["name"]: ProbeTensor.model_validate(t, strict=True) for t in step} for step in case]
        for case in vector_input["computed"]
    ]
    result = check_probe(probe, computed)
    return {"pass": result.passed, "reason": result.code}


def build_probes() -> dict[str, str]:
    files = {}
    cases = {**PROBE_CASES, **{name: case[:3] for name, case in DATA_PROBE_CASES.items()}}
    for name, (description, document, computed) in cases.items():
        data = document if isinstance(document, bytes) else canonical_json(document)
        vector_input: dict[str, Any] = {
            "probe": base64.b64encode(data).decode("ascii"),
            "artifact_sha256": PROBE_ARTIFACT,
            "computed": computed,
        }
        if name in DATA_PROBE_CASES:
            vector_input["probe_data"] = DATA_PROBE_CASES[name][3]
        files.update(_vector_file("probes", name, description, vector_input))
    return files


# --- versions and ranges (docs/protocol.md section 7, "Versions") ---------------------

# name -> (version, range, what it shows)
VERSION_CASES: dict[str, tuple[str, str, str]] = {
    "in-range": ("2.4.0", ">=2.3.0, <3", "Every comparator holds."),
    "at-upper-bound": ("3.0.0", ">=2.3.0, <3", "3 is 3.0.0, and <3 excludes it."),
    "missing-parts-are-zero": ("3", "==3.0.0", "Missing parts count as 0."),
    "trailing-zero-parts": ("2.4.0.0", "==2.4", "2.4.0.0 equals 2.4."),
    "numeric-not-text": ("10.0", ">9.9", "Parts compare as numbers: 10 > 9."),
    "leading-zeros": ("2.04.0", "==2.4.0", "A part's number ignores leading zeros."),
    "huge-part": (
        "99999999999999999999.1",
        ">99999999999999999998.9",
        "Parts are unbounded integers (20 digits here): compare them exactly.",
    ),
    "leading-v": ("v3", ">=3.0.0", "A leading v (or V) is ignored."),
    "leading-capital-v": ("V2.1", "==2.1.0", "A leading V is ignored."),
    "build-in-parentheses": ("2.4.0 (123)", "==2.4.0", "A build ' (123)' is ignored."),
    "build-with-plus": ("2.4.0+456", "<=2.4.0, >=2.4.0", "A build '+456' is ignored."),
    "bound-with-build": ("2.4.0", "==2.4.0 (7)", "A bound's build is ignored too."),
    "pre-release-below-release": ("2.4.0-beta.1", ">=2.4.0", "A pre-release is below its release."),
    "pre-release-above-previous": ("2.4.0-beta.1", ">2.3.9", "...and above the release before."),
    "pre-release-numeric-identifiers": (
        "2.4.0-beta.10",
        ">2.4.0-beta.2",
        "Numeric identifiers compare as numbers: 10 > 2.",
    ),
    "pre-release-numeric-below-text": (
        "2.4.0-1",
        "<2.4.0-alpha",
        "A numeric identifier is below a text one.",
    ),
    "pre-release-shorter-is-lower": (
        "2.4.0-alpha",
        "<2.4.0-alpha.1",
        "With equal leading identifiers, fewer identifiers is lower.",
    ),
    "pre-release-text-by-ascii": (
        "2.4.0-RC.1",
        "<2.4.0-beta.1",
        "Text identifiers compare by ASCII ('R' < 'b').",
    ),
    "part-with-text-suffix": (
        "3.6.1rc2",
        ">3.6.1",
        "A part's text after its number compares as text after the number: 1rc2 > 1 "
        "(unlike a pre-release; kept from earlier releases for MNN versions).",
    ),
    "android-api-level": ("34", ">=29", "An Android API level is a one-part version."),
    "android-api-level-too-low": ("33", ">=35", "33 < 35."),
    "ios-version": ("17.2.1", ">=16.0, <18", "An iOS version."),
    "equal-operator": ("2.4.1", "==2.4.0", "== needs equality."),
    "spaces-around": (
        "2.4.0",
        "  >=  2.3.0 ,<3  ",
        "Spaces around operators and commas are ignored.",
    ),
    "no-space-needed": ("2.4.0", ">=2.3.0,<3", "Spaces are optional."),
    "version-empty": ("", ">=1", "An empty version is not a version."),
    "version-text": ("latest", ">=1", "Not a version: no leading number."),
    "version-surrounding-space": (" 2.4.0", ">=1", "No space around a version."),
    "version-trailing-space": ("2.4.0 ", ">=1", "No space around a version."),
    "version-empty-part": ("2..4", ">=1", "An empty part."),
    "version-empty-pre-release": ("2.4.0-", ">=1", "A '-' with no pre-release."),
    "version-empty-build": ("2.4.0+", ">=1", "A '+' with no build."),
    "version-open-parenthesis": ("2.4.0 (123", ">=1", "An unclosed build."),
    "version-space-in-build": ("2.4.0 (12 3)", ">=1", "A space inside the build."),
    "version-underscore": ("2.4.0_beta", ">=1", "'_' is no separator."),
    "version-double-v": ("vv2", ">=1", "One leading v at most."),
    "version-negative": ("-1", ">=1", "No sign."),
    "version-too-long": ("1." + "0." * 31 + "1", ">=1", "65 characters: more than 64."),
    "version-at-length-limit": ("1." + "0." * 30 + "01", ">=1", "64 characters: a version."),
    "version-trailing-newline": ("2.4.0\n", ">=1", "A trailing newline is not a version."),
    "range-trailing-newline": ("2.4.0", ">=1\n", "A trailing newline is not a range."),
    "range-empty": ("2.4.0", "", "An empty range."),
    "range-without-operator": ("2.4.0", "2.4.0", "A bare version is not a range."),
    "range-single-equals": ("2.4.0", "=2.4.0", "'=' is not an operator (==)."),
    "range-not-equal": ("2.4.0", "!=2.3.0", "'!=' is not an operator."),
    "range-tilde": ("2.4.0", "~>2.3", "'~>' is not an operator."),
    "range-caret": ("2.4.0", "^2.3.0", "'^' is not an operator."),
    "range-trailing-comma": ("2.4.0", ">=2.3.0,", "An empty comparator after the comma."),
    "range-bad-bound": ("2.4.0", ">=two", "A bound that is not a version."),
    "range-or": ("2.4.0", ">=2 || <1", "No alternatives: every comparator must hold."),
    "range-too-long": ("2.4.0", ">=1," * 50 + ">=1", "203 characters: more than 200."),
    "range-and-version-bad": ("latest", "at least 2", "Both bad: the range is read first."),
}


def run_version(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference answer for one version vector."""
    try:
        parse_range(vector_input["range"])
    except ValueError:
        return {"result": "invalid-range"}
    if not is_version(vector_input["version"]):
        return {"result": "invalid-version"}
    matched = satisfies(vector_input["version"], vector_input["range"])
    return {"result": "match" if matched else "no-match"}


def build_versions() -> dict[str, str]:
    files = {}
    for name, (version, version_range, description) in VERSION_CASES.items():
        vector_input = {"version": version, "range": version_range}
        files.update(_vector_file("versions", name, description, vector_input))
    return files


# --- device reports (docs/protocol.md section 12) ---------------------------------------

REPORT: dict[str, Any] = {
    "schema_version": 1,
    "token": "0123456789abcdef0123456789abcdef",
    "unit": "digits",
    "model": "digits",
    "version": "1.1.0",
    "unit_version": "1.1.0",
    "variant": "int8",
    "tier": "mid",
    "arm": "candidate",
    "sequence": 9,
    "probe": "passed",
}
FULL_REPORT: dict[str, Any] = {
    **REPORT,
    "backend": "opencl",
    "backends_skipped": ["vulkan"],
    "load_ms": 41.5,
    "load_failed": False,
    "inference": {"count": 120, "p50_ms": 8.0, "p90_ms": 11.5, "p99_ms": 30.25},
    "confirmed": True,
    "reverted": False,
    "mnn_runtime": "3.6.1",
    "os": "android",
    "os_version": "34",
    "device_class": "ram4-8c",
}


V2_KEYS: dict[str, Any] = {
    "unconfirmed_starts": 3,
    "cpu_class": "armv9",
    "memory_peak_mb": 212.5,
    "memory_steady_mb": 140,
    "first_inference_ms": 96.0,
}
FULL_REPORT_V2: dict[str, Any] = {**FULL_REPORT, **V2_KEYS, "schema_version": 2}


# The largest report a client can build (docs/protocol.md section 12, "Size"): every key at
# its bound, 16 metrics of 32 counts of 10^9 under 63-character names. Versions have no
# bound of their own; these are 64 characters, the longest a runtime version may be.
_TINY = 2.2250738585072014e-308  # a double whose shortest spelling is the longest: 23 bytes
_LONG_VERSION = "1.0.0-" + "a" * 58
WORST_REPORT: dict[str, Any] = {
    "schema_version": 3,
    "token": "f" * 32,
    "unit": "u" + "n" * 62,
    "model": "m" + "n" * 62,
    "version": _LONG_VERSION,
    "unit_version": _LONG_VERSION,
    "variant": "v" + "n" * 62,
    "tier": "t" + "n" * 62,
    "arm": "candidate",
    "sequence": 2**53 - 1,
    "probe": "passed",
    "backend": "opencl",
    "backends_skipped": ["opencl"] * 8,
    "load_ms": _TINY,
    "load_failed": False,
    "inference": {"count": 10**9, "p50_ms": _TINY, "p90_ms": _TINY, "p99_ms": _TINY},
    "confirmed": False,
    "reverted": False,
    "mnn_runtime": "3." + "1" * 62,
    "os": "android",
    "os_version": "o" * 32,
    "device_class": "d" * 32,
    "unconfirmed_starts": 1000,
    "cpu_class": "c" * 32,
    "memory_peak_mb": _TINY,
    "memory_steady_mb": _TINY,
    "first_inference_ms": _TINY,
    "metrics": {f"m{i:02d}" + "n" * 60: {"counts": [10**9] * 32} for i in range(16)},
}
_WORST = canonical_json(WORST_REPORT)


def _report(**changes: Any) -> bytes:
    body = {**REPORT, **changes}
    return canonical_json({k: v for k, v in body.items() if v is not _DROP})


_DROP = object()

REPORT_CASES: dict[str, tuple[str, bytes]] = {
    "minimal": ("Only the required keys.", _report()),
    "full": ("Every key.", canonical_json(FULL_REPORT)),
    "bundle-member": (
        "A bundle member: unit is the bundle, model the member, unit_version the bundle's.",
        _report(unit="ocr", model="det", version="2.1.0", unit_version="1.1.0"),
    ),
    "rejected-by-probe": (
        "probe failed on every backend: no backend, every one skipped.",
        _report(probe="failed", backend=None, backends_skipped=["opencl", "cpu"]),
    ),
    "optional-null": (
        "Optional keys may be null (the same as absent).",
        _report(
            backend=None,
            load_ms=None,
            inference=None,
            mnn_runtime=None,
            os=None,
            os_version=None,
            device_class=None,
        ),
    ),
    "exactly-16384-bytes": (
        "16384 bytes (padded with JSON whitespace): at the limit, accepted.",
        _report() + b" " * (16384 - len(_report())),
    ),
    "too-large": (
        "16385 bytes: refused before parsing (413 at the endpoint).",
        _report() + b" " * (16385 - len(_report())),
    ),
    "worst-case": (
        f"The largest report a client builds, {len(_WORST)} bytes: every key at its bound "
        "(names of 63 characters, versions of 64, numbers of 23 bytes), 16 metrics of 32 "
        "counts of 10^9: accepted (more than 8192 bytes).",
        _WORST,
    ),
    "not-json": ("Not JSON.", b"token=0123"),
    "not-utf8": ("Not UTF-8.", _report(device_class="ram4").replace(b"ram4", b"r\xe4m4")),
    "duplicate-key": (
        "token twice: not JSON a receiver reads.",
        _report().replace(b'"token":', b'"token":"ffffffffffffffffffffffffffffffff","token":', 1),
    ),
    "nan": ("NaN is not JSON.", _report().replace(b'"sequence":9', b'"sequence":NaN')),
    "infinity-overflow": (
        "1e400 overflows a double: not JSON a receiver reads.",
        _report().replace(b'"sequence":9', b'"sequence":1e400'),
    ),
    "not-an-object": ("A JSON array, not an object.", b"[]"),
    "unknown-key": (
        "A key the schema does not name (device_id): refused.",
        _report(device_id="abc"),
    ),
    "schema-version-missing": (
        "No schema_version: a receiver takes it as 1 (what shipped senders send is kept).",
        _report(schema_version=_DROP),
    ),
    "schema-version-2": (
        "schema_version 2 with none of its keys: accepted (every key it adds is optional).",
        _report(schema_version=2),
    ),
    "schema-version-4": (
        "schema_version 4: a format the receiver does not know.",
        _report(schema_version=4),
    ),
    "full-v2": ("Every key of schema version 2.", canonical_json(FULL_REPORT_V2)),
    **{
        f"v2-{key.replace('_', '-')}": (
            f"schema_version 2 with {key} {value!r}.",
            _report(schema_version=2, **{key: value}),
        )
        for key, value in V2_KEYS.items()
    },
    "v2-unconfirmed-starts-zero": (
        "unconfirmed_starts 0 (installed, started once, confirmed since): accepted.",
        _report(schema_version=2, unconfirmed_starts=0),
    ),
    "v2-cpu-class-later": (
        "cpu_class 'armv9.2': not a class clients send today, a name all the same, so a "
        "later client's class is stored.",
        _report(schema_version=2, cpu_class="armv9.2"),
    ),
    "v2-keys-null": (
        "Every key of version 2 null (the same as absent) in a version 2 report.",
        _report(schema_version=2, **dict.fromkeys(V2_KEYS)),
    ),
    "v1-with-v2-key": (
        "schema_version 1 with unconfirmed_starts: a key version 1 does not have, refused "
        "(a sender that sets it says 2).",
        _report(unconfirmed_starts=3),
    ),
    "v1-with-v2-key-null": (
        "schema_version 1 with memory_peak_mb null: the key itself is unknown in version 1.",
        _report(memory_peak_mb=None),
    ),
    "v1-absent-with-v2-key": (
        "No schema_version (so 1) with cpu_class: refused like a 1.",
        _report(schema_version=_DROP, cpu_class="armv8"),
    ),
    "unconfirmed-starts-above-1000": (
        "unconfirmed_starts 1001: at most 1000.",
        _report(schema_version=2, unconfirmed_starts=1001),
    ),
    "unconfirmed-starts-negative": (
        "unconfirmed_starts -1.",
        _report(schema_version=2, unconfirmed_starts=-1),
    ),
    "unconfirmed-starts-as-float": (
        "unconfirmed_starts 3.0: not an integer.",
        _report(schema_version=2, unconfirmed_starts=3.0),
    ),
    "cpu-class-uppercase": (
        "cpu_class 'ARMv9': lowercase letters, digits, '.', '_', '-'.",
        _report(schema_version=2, cpu_class="ARMv9"),
    ),
    "cpu-class-too-long": (
        "cpu_class of 33 characters.",
        _report(schema_version=2, cpu_class="a" * 33),
    ),
    "memory-peak-negative": (
        "memory_peak_mb -1.",
        _report(schema_version=2, memory_peak_mb=-1),
    ),
    "memory-steady-above-1-tib": (
        "memory_steady_mb 1048577: at most 1048576.",
        _report(schema_version=2, memory_steady_mb=1048577),
    ),
    "memory-peak-as-string": (
        'memory_peak_mb "212": a number.',
        _report(schema_version=2, memory_peak_mb="212"),
    ),
    "first-inference-above-an-hour": (
        "first_inference_ms 3600001: at most 3600000.",
        _report(schema_version=2, first_inference_ms=3600001),
    ),
    "schema-version-as-float": ("schema_version 1.0.", _report(schema_version=1.0)),
    "token-missing": ("No token.", _report(token=_DROP)),
    "token-uppercase": (
        "token in uppercase hex.",
        _report(token="0123456789ABCDEF0123456789ABCDEF"),
    ),
    "token-short": ("token of 31 hex digits.", _report(token="0123456789abcdef0123456789abcde")),
    "unit-not-a-name": ("unit 'Digits': not a name.", _report(unit="Digits")),
    "version-not-semver": ("version 1.1: not a semantic version.", _report(version="1.1")),
    "version-trailing-newline": (
        "version '1.1.0\\n': a trailing newline is not a semantic version.",
        _report(version="1.1.0\n"),
    ),
    "os-version-trailing-newline": (
        "os_version '34\\n': a newline is not one of the allowed characters.",
        _report(os_version="34\n"),
    ),
    "arm-unknown": ("arm 'canary': candidate or stable.", _report(arm="canary")),
    "sequence-as-float": ("sequence 9.0: not an integer.", _report(sequence=9.0)),
    "sequence-zero": ("sequence 0: at least 1.", _report(sequence=0)),
    "sequence-above-max-safe-integer": ("sequence 2^53.", _report(sequence=2**53)),
    "probe-unknown": ("probe 'skipped': passed, failed or none.", _report(probe="skipped")),
    "backend-unknown": ("backend 'npu': not a backend.", _report(backend="npu")),
    "backends-skipped-too-many": (
        "9 backends skipped: at most 8.",
        _report(backends_skipped=["cpu"] * 9),
    ),
    "load-ms-negative": ("load_ms -1.", _report(load_ms=-1)),
    "load-ms-above-an-hour": ("load_ms 3600001: at most 3600000.", _report(load_ms=3600001)),
    "load-ms-integer": ("load_ms 40: an integer is a number.", _report(load_ms=40)),
    "inference-count-zero": (
        "inference.count 0: at least 1 (leave inference out when nothing was measured).",
        _report(inference={"count": 0, "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0}),
    ),
    "inference-missing-p99": (
        "inference without p99_ms.",
        _report(inference={"count": 3, "p50_ms": 1.0, "p90_ms": 1.0}),
    ),
    "confirmed-as-integer": ("confirmed 1: a boolean is true or false.", _report(confirmed=1)),
    "load-failed-null": ("load_failed null: a boolean is never null.", _report(load_failed=None)),
    "os-unknown": ("os 'windows'.", _report(os="windows")),
    "metrics-rate-and-distribution": (
        "Version 3: a rate's events and successes, a distribution's counts per bucket.",
        _report(
            schema_version=3,
            metrics={
                "accepted": {"events": 40, "successes": 37},
                "confidence": {"counts": [1, 2, 30, 7]},
            },
        ),
    ),
    "metrics-in-version-2": (
        "metrics in a schema_version 2 report: version 2 did not have it.",
        _report(schema_version=2, metrics={"accepted": {"events": 1, "successes": 1}}),
    ),
    "metrics-successes-above-events": (
        "A rate with more successes than events.",
        _report(schema_version=3, metrics={"accepted": {"events": 3, "successes": 4}}),
    ),
    "metrics-one-count": (
        "A distribution of one count: at least two buckets.",
        _report(schema_version=3, metrics={"confidence": {"counts": [5]}}),
    ),
    "metrics-33-counts": (
        "A distribution of 33 counts: at most 32 buckets.",
        _report(schema_version=3, metrics={"confidence": {"counts": [1] * 33}}),
    ),
    "metrics-negative-count": (
        "A count below zero.",
        _report(schema_version=3, metrics={"confidence": {"counts": [1, -1]}}),
    ),
    "metrics-count-with-fraction": (
        "A count of 3.0: an integer is written without a fraction.",
        _report(schema_version=3, metrics={"accepted": {"events": 3.0, "successes": 1}}),
    ),
    "metrics-count-too-large": (
        "A count above 10^9.",
        _report(schema_version=3, metrics={"accepted": {"events": 10**9 + 1, "successes": 1}}),
    ),
    "metrics-17": (
        "Seventeen metrics: at most 16.",
        _report(
            schema_version=3,
            metrics={f"m{i:02d}": {"events": 1, "successes": 1} for i in range(17)},
        ),
    ),
    "metrics-empty": (
        "An empty metrics object: leave the key out instead.",
        _report(schema_version=3, metrics={}),
    ),
    "metrics-a-value": (
        "A metric carrying a raw value: counts only, never a value.",
        _report(schema_version=3, metrics={"confidence": {"counts": [1, 2], "value": 0.83}}),
    ),
    "mnn-runtime-not-a-version": (
        "mnn_runtime 'latest': not a version of §7's grammar.",
        _report(mnn_runtime="latest"),
    ),
    "mnn-runtime-leading-v": (
        "mnn_runtime 'v3.6.1': every version of §7's grammar is a runtime (one grammar).",
        _report(mnn_runtime="v3.6.1"),
    ),
    "mnn-runtime-pre-release": (
        "mnn_runtime '3.6.1-rc.2': a pre-release is a version.",
        _report(mnn_runtime="3.6.1-rc.2"),
    ),
    "mnn-runtime-build": (
        "mnn_runtime '3.6.1 (123)': a store build number is a version.",
        _report(mnn_runtime="3.6.1 (123)"),
    ),
    "mnn-runtime-64": (
        "mnn_runtime of 64 characters: the longest version.",
        _report(mnn_runtime="3." + "1" * 62),
    ),
    "mnn-runtime-65": (
        "mnn_runtime of 65 characters: longer than any version.",
        _report(mnn_runtime="3." + "1" * 63),
    ),
    # os_version: the short text earlier clients sent, or any version of §7's grammar
    # (issue 30 item 21: one grammar for the device's versions).
    "os-version-build": (
        "os_version '17.4 (21E219)': a version of §7's grammar with its build (one grammar).",
        _report(os_version="17.4 (21E219)"),
    ),
    "os-version-plus-build": (
        "os_version '14+beta.2': a version with a '+' build.",
        _report(os_version="14+beta.2"),
    ),
    "os-version-64": (
        "os_version of 64 characters: the longest version.",
        _report(os_version="3." + "1" * 62),
    ),
    "os-version-65": (
        "os_version of 65 characters: longer than any version and than the short text.",
        _report(os_version="3." + "1" * 63),
    ),
    "os-version-slash": (
        "os_version '14/beta': neither the short text nor a version.",
        _report(os_version="14/beta"),
    ),
    "device-class-too-long": ("device_class of 33 characters.", _report(device_class="r" * 33)),
    "device-class-slash": (
        "device_class 'ram4/8c': letters, digits, '.', '_', '-', ' '.",
        _report(device_class="ram4/8c"),
    ),
}


def run_report(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The receiver's answer for one report body."""
    try:
        parse_report(base64.b64decode(vector_input["body"]))
    except ReportError as exc:
        return {"accept": False, "reason": exc.code, "field": exc.field}
    return {"accept": True}


def build_reports() -> dict[str, str]:
    files = {}
    for name, (description, body) in REPORT_CASES.items():
        vector_input = {"body": base64.b64encode(body).decode("ascii")}
        files.update(_vector_file("reports", name, description, vector_input))
    return files


# --- labels blobs (docs/protocol.md section 8) ------------------------------------------

LABELS_CASES: dict[str, tuple[str, bytes, int | None]] = {
    # name: (description, blob body, declared size when it differs from the body's)
    "ascii": ("Ten digit classes.", json.dumps([str(i) for i in range(10)]).encode(), None),
    "unicode": (
        "CTC characters beyond ASCII, as UTF-8 and as \\u escapes.",
        '["é", "中", "\\u00e9", " ", ""]'.encode(),
        None,
    ),
    "empty-list": ("An empty array is a list of no labels.", b"[]", None),
    "whitespace": ("JSON whitespace anywhere.", b' [ "a" ,\n"b" ] \n', None),
    "duplicates-kept": ("Repeated labels stay (index order is the meaning).", b'["a","a"]', None),
    "not-json": ("Not JSON.", b"cat\ndog\n", None),
    "object": ("An object, not an array.", b'{"0":"cat"}', None),
    "number-inside": ("A number among the strings.", b'["cat",1]', None),
    "null-inside": ("A null among the strings.", b'["cat",null]', None),
    "nested-array": ("An array inside.", b'["cat",["dog"]]', None),
    "byte-order-mark": ("A UTF-8 byte order mark first.", b'\xef\xbb\xbf["cat"]', None),
    "not-utf8": ("Latin-1 bytes.", b'["caf\xe9"]', None),
    "too-deep": ("Nested 65 deep.", b"[" * 65 + b"]" * 65, None),
    "wrong-digest": ("The body differs from the declared sha256 (rule 14).", b'["cat"]', -1),
    "short": ("One byte fewer than the declared size (rule 14).", b'["cat"', 7),
    "too-long": ("One byte more than the declared size (rule 13).", b'["cat"] ', 7),
    "declared-too-large": (
        "A labels_blob declared larger than 4 MiB: refused before any byte is fetched.",
        b'["cat"]',
        4 * 1024 * 1024 + 1,
    ),
}


def run_labels(vector_input: dict[str, Any]) -> dict[str, Any]:
    """The reference answer for one labels blob: check it as a blob, then parse it."""
    ref = vector_input["entry"]
    body = base64.b64decode(vector_input["body"])
    try:
        if ref["size"] > MAX_LABELS_BYTES:
            raise Malformed(f"labels blob of {ref['size']} bytes, more than {MAX_LABELS_BYTES}")
        check = BlobCheck(BlobRef.of(ref["sha256"], ref["size"]))
        check.update(body)
        check.finish()
        labels = parse_labels(body)
    except Rejected as exc:
        return {"accept": False, "reason": exc.reason}
    return {"accept": True, "labels": labels}


def build_labels() -> dict[str, str]:
    files = {}
    for name, (description, body, declared) in LABELS_CASES.items():
        digest = hashlib.sha256(body).hexdigest()
        size = len(body)
        if declared == -1:
            digest = hashlib.sha256(body + b" ").hexdigest()
        elif declared is not None:
            size = declared
            digest = hashlib.sha256(body[:declared] if declared < len(body) else body).hexdigest()
        vector_input = {
            "entry": {"sha256": digest, "size": size},
            "body": base64.b64encode(body).decode("ascii"),
        }
        vector = {
            "name": name,
            "description": description,
            "input": vector_input,
            "expected": run_labels(vector_input),
        }
        files[f"labels/{name}.json"] = json.dumps(vector, indent=2, ensure_ascii=False) + "\n"
    return files


# --- runtime trials and hints (docs/protocol.md sections 3 and 11) ----------------------

TRIALS = RuntimeTrials.of([1, 2, 4], ["opencl", "cpu"])
HINT_SALT = "0d15ea5e"
_ARMV9 = {"cpu_class": "armv9", "cores": 8, "soc": "QTI SM8550"}


def _rule(
    match: dict[str, Any],
    threads: int = 2,
    backends: list[str] | None = None,
    percent: float = 100.0,
    salt: str = HINT_SALT,
) -> dict[str, Any]:
    return {
        "match": match,
        "runtime": {"threads": threads, "backends": backends or ["cpu"]},
        "percent": percent,
        "salt": salt,
    }


def _hint_device(inside: bool, salt: str = HINT_SALT, percent: float = 10.0) -> str:
    """The first device id ``phone-<n>`` inside (or outside) a rule's cohort."""
    n = 0
    while in_cohort(f"phone-{n}", salt, percent) != inside:
        n += 1
    return f"phone-{n}"


def _in_rule_not_rollout() -> str:
    """A device inside the rule's 10 % (its salt) and outside the rollout's 25 % (SALT)."""
    n = 0
    while not (
        in_cohort(f"phone-{n}", HINT_SALT, 10.0) and not in_cohort(f"phone-{n}", SALT, PERCENT)
    ):
        n += 1
    return f"phone-{n}"


def _with_trials(trials: Any) -> bytes:
    return _raw_payload(_set(stable__runtime_trials=trials))


def _trials(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = TRIALS.model_dump(mode="json")
    data.update(changes)
    return {k: v for k, v in data.items() if v is not _DROP}


def _with_hints(*rules: dict[str, Any], entry: str = "stable", **changes: Any) -> bytes:
    manifest = _rollout() if entry == "candidate" else _manifest()
    edit = _set(**{f"{entry}__runtime_hints": list(rules), **changes})
    return _raw_payload(edit, manifest)


def _setting(threads: int, backend: str) -> dict[str, Any]:
    return {"threads": threads, "backend": backend}


_NINE = [_setting(t, b) for t in (1, 2, 4) for b in ("opencl", "vulkan", "cpu")]

# name -> (description, manifest bytes factory, device facts and id)
HINT_CASES: dict[str, Case] = {
    "trials-offered": (
        "threads [1, 2, 4] x backends [opencl, cpu]: six settings, sorted by backend then "
        "threads, with the default bounds and the set's id; the declared runtime is used.",
        lambda: _signed(
            _manifest(stable=_entry("1.0.0").model_copy(update={"runtime_trials": TRIALS}))
        ),
        {"device": _ARMV9},
    ),
    "trials-bounds-absent": (
        "max_runs_per_setting and max_total_ms left out: 5 and 2000.",
        lambda: _with_trials(_trials(max_runs_per_setting=_DROP, max_total_ms=_DROP)),
        {},
    ),
    "trials-eight-settings": (
        "Eight settings, the most a try-set holds.",
        lambda: _with_trials(_trials(settings=_NINE[:8])),
        {},
    ),
    "trials-nine-settings": (
        "Nine settings, one more than a try-set holds: malformed.",
        lambda: _with_trials(_trials(settings=_NINE)),
        {},
    ),
    "trials-no-settings": (
        "An empty settings list: malformed.",
        lambda: _with_trials(_trials(settings=[])),
        {},
    ),
    "trials-setting-twice": (
        "The same {threads, backend} twice: malformed.",
        lambda: _with_trials(_trials(settings=[_setting(2, "cpu"), _setting(2, "cpu")])),
        {},
    ),
    "trials-threads-zero": (
        "A setting of 0 threads: malformed (1 to 16).",
        lambda: _with_trials(_trials(settings=[_setting(0, "cpu")])),
        {},
    ),
    "trials-threads-17": (
        "A setting of 17 threads: malformed (1 to 16).",
        lambda: _with_trials(_trials(settings=[_setting(17, "cpu")])),
        {},
    ),
    "trials-threads-as-float": (
        "threads written 2.0: an integer field, malformed.",
        lambda: _raw_text(
            lambda t: t.replace('{"backend":"cpu","threads":2}', '{"backend":"cpu","threads":2.0}'),
            _manifest(stable=_entry("1.0.0").model_copy(update={"runtime_trials": TRIALS})),
        ),
        {},
    ),
    "trials-unknown-backend": (
        "A backend no client knows (cuda): malformed, as in runtime.backends.",
        lambda: _with_trials(_trials(settings=[_setting(2, "cuda")])),
        {},
    ),
    "trials-id-missing": (
        "No id: malformed.",
        lambda: _with_trials(_trials(id=_DROP)),
        {},
    ),
    "trials-id-uppercase": (
        "An id in uppercase hex: malformed (8 lowercase hex).",
        lambda: _with_trials(
            _trials(id=TRIALS.id.upper() if TRIALS.id.upper() != TRIALS.id else "ABCDEF12")
        ),
        {},
    ),
    "trials-id-not-recomputed": (
        "An id that is not the digest of the set: accepted as it is (clients compare ids, "
        "they never recompute them).",
        lambda: _with_trials(_trials(id="00000000")),
        {},
    ),
    "trials-runs-zero": (
        "max_runs_per_setting 0: malformed (1 to 20).",
        lambda: _with_trials(_trials(max_runs_per_setting=0)),
        {},
    ),
    "trials-runs-21": (
        "max_runs_per_setting 21: malformed (1 to 20).",
        lambda: _with_trials(_trials(max_runs_per_setting=21)),
        {},
    ),
    "trials-total-ms-10000": (
        "max_total_ms 10000, the most a trial may take.",
        lambda: _with_trials(_trials(max_total_ms=10000)),
        {},
    ),
    "trials-total-ms-10001": (
        "max_total_ms 10001: malformed (1 to 10000).",
        lambda: _with_trials(_trials(max_total_ms=10001)),
        {},
    ),
    "trials-null": (
        "runtime_trials null: the same as absent (a key added after 0.1.0).",
        lambda: _with_trials(None),
        {},
    ),
    "trials-unknown-keys": (
        "Unknown keys in the try-set and in a setting are ignored.",
        lambda: _with_trials(
            _trials(settings=[{**_setting(1, "cpu"), "affinity": "big"}], warmup_runs=2)
        ),
        {},
    ),
    "hints-first-match-wins": (
        "Two rules match an armv9 8-core phone: the first decides (4 threads on OpenCL).",
        lambda: _with_hints(
            _rule({"cpu_class": "armv9"}, 4, ["opencl", "cpu"]),
            _rule({"cpu_class": "armv9", "cores": 8}, 1),
        ),
        {"device": _ARMV9},
    ),
    "hints-order-decides": (
        "The narrower rule first: an armv9 6-core phone skips it and takes the second.",
        lambda: _with_hints(
            _rule({"cpu_class": "armv9", "cores": 8}, 1),
            _rule({"cpu_class": "armv9"}, 4, ["opencl", "cpu"]),
        ),
        {"device": {**_ARMV9, "cores": 6}},
    ),
    "hints-no-rule-matches": (
        "No rule names an armv8 phone: the declared runtime.",
        lambda: _with_hints(_rule({"cpu_class": "armv9"}), _rule({"cores": 4})),
        {"device": {**_ARMV9, "cpu_class": "armv8"}},
    ),
    "hints-unknown-class": (
        "A rule for a class no client derives (armv10) matches nothing; the next rule decides.",
        lambda: _with_hints(_rule({"cpu_class": "armv10"}, 1), _rule({"cores": 8}, 4)),
        {"device": _ARMV9},
    ),
    "hints-class-not-known": (
        "A device that does not know its CPU class (its features not said) never matches a "
        "rule naming cpu_class: the declared runtime.",
        lambda: _with_hints(_rule({"cpu_class": "armv9"}, 1)),
        {"device": {"cores": 8}},
    ),
    "hints-soc-not-known": (
        "A rule naming soc never matches a device without one; the next rule decides.",
        lambda: _with_hints(_rule({"soc": "QTI SM8550"}, 1), _rule({"cores": 8}, 4)),
        {"device": {"cpu_class": "armv9", "cores": 8}},
    ),
    "hints-soc-exact": (
        "soc is compared exactly: QTI SM8550 is not qti sm8550.",
        lambda: _with_hints(_rule({"soc": "qti sm8550"}, 1)),
        {"device": _ARMV9},
    ),
    "hints-all-keys-match": (
        "cpu_class, cores and soc all equal the device's: the rule decides.",
        lambda: _with_hints(_rule(dict(_ARMV9), 3, ["vulkan", "cpu"])),
        {"device": _ARMV9},
    ),
    "hints-one-key-differs": (
        "Two keys equal the device's, the third (cores) does not: no match.",
        lambda: _with_hints(_rule({**_ARMV9, "cores": 4}, 3)),
        {"device": _ARMV9},
    ),
    "hints-unknown-match-key": (
        "A rule naming a key this client does not know (gpu) never matches, though its "
        "other keys do; the next rule decides.",
        lambda: _with_hints(
            _rule({"cpu_class": "armv9", "gpu": "adreno-740"}, 1), _rule({"cores": 8}, 4)
        ),
        {"device": _ARMV9},
    ),
    "hints-unknown-match-key-null": (
        "A rule naming a key this client does not know never matches, even with a null "
        "value (only a known key given as null is not given); the next rule decides.",
        lambda: _with_hints(_rule({"cpu_class": "armv9", "gpu": None}, 1), _rule({"cores": 8}, 4)),
        {"device": _ARMV9},
    ),
    "hints-empty-match": (
        "A rule naming no key matches every device of the tier.",
        lambda: _with_hints(_rule({}, 1)),
        {"device": {}},
    ),
    "hints-match-key-null": (
        "A match key that is null is not given (a key added after 0.1.0): the rule matches "
        "on its other keys.",
        lambda: _with_hints(_rule({"cpu_class": "armv9", "soc": None}, 1)),
        {"device": {"cpu_class": "armv9", "cores": 8}},
    ),
    "hints-inside-percent": (
        "The matching rule at 10 %: this device's bucket (the rule's salt) is inside, so it "
        "uses the rule's runtime.",
        lambda: _with_hints(_rule({"cpu_class": "armv9"}, 1, percent=10.0)),
        {"device": _ARMV9, "device_id": _hint_device(True)},
    ),
    "hints-outside-percent": (
        "The same rule, a device outside its 10 %: the declared runtime (the rule's "
        "comparison arm); the later rule that also matches is not read.",
        lambda: _with_hints(_rule({"cpu_class": "armv9"}, 1, percent=10.0), _rule({"cores": 8}, 4)),
        {"device": _ARMV9, "device_id": _hint_device(False)},
    ),
    "hints-own-salt": (
        "The rule's cohort is by its own salt, not the rollout's: a device inside the "
        "rule's 10 % and outside the rollout's 25 % candidate cohort.",
        lambda: _with_hints(
            _rule({"cpu_class": "armv9"}, 1, percent=10.0),
            entry="stable",
            candidate=json.loads(to_bytes(_rollout()))["candidate"],
            percent=PERCENT,
            salt=SALT,
        ),
        {"device": _ARMV9, "device_id": _in_rule_not_rollout()},
    ),
    "hints-on-candidate": (
        "A device in the candidate's cohort uses the candidate's rules.",
        lambda: _with_hints(_rule({"cpu_class": "armv9"}, 1), entry="candidate"),
        {"device": _ARMV9, "device_id": _device(True)},
    ),
    "hints-keep-precision": (
        "A rule replaces threads and backends; the declared precision stays.",
        lambda: _with_hints(_rule({"cores": 8}, 1), stable__runtime__precision="low"),
        {"device": _ARMV9},
    ),
    "hints-unknown-rule-keys": (
        "Unknown keys in a rule and in its runtime are ignored; the rule decides.",
        lambda: _with_hints(
            {
                **_rule({"cores": 8}, 1),
                "since": "2025-06-01",
                "runtime": {"threads": 1, "backends": ["cpu"], "affinity": "big"},
            }
        ),
        {"device": _ARMV9},
    ),
    "hints-32-rules": (
        "32 rules, the most an entry holds; the last one matches.",
        lambda: _with_hints(
            *[_rule({"cores": n}, 1) for n in range(100, 131)], _rule({"cores": 8}, 2)
        ),
        {"device": _ARMV9},
    ),
    "hints-33-rules": (
        "33 rules, one more than an entry holds: malformed.",
        lambda: _with_hints(*[_rule({"cores": n}, 1) for n in range(100, 133)]),
        {"device": _ARMV9},
    ),
    "hints-empty-list": (
        "runtime_hints [] : malformed (absent says no rule).",
        lambda: _with_hints(),
        {"device": _ARMV9},
    ),
    "hints-backends-not-ending-in-cpu": (
        "A rule's backends must end with cpu, as the declared runtime's: malformed.",
        lambda: _with_hints(_rule({"cores": 8}, 1, ["cpu", "opencl"])),
        {"device": _ARMV9},
    ),
    "hints-threads-missing": (
        "A rule's runtime without threads: malformed (both keys are required).",
        lambda: _with_hints({**_rule({"cores": 8}), "runtime": {"backends": ["cpu"]}}),
        {"device": _ARMV9},
    ),
    "hints-percent-zero": (
        "percent 0: malformed (0 < percent <= 100, as a rollout's).",
        lambda: _with_hints(_rule({"cores": 8}, percent=0)),
        {"device": _ARMV9},
    ),
    "hints-salt-not-hex": (
        "A salt that is not 8 to 64 lowercase hex: malformed.",
        lambda: _with_hints(_rule({"cores": 8}, salt="not-a-salt")),
        {"device": _ARMV9},
    ),
    "hints-cpu-class-not-a-name": (
        "cpu_class ARMv9 breaks the class pattern: malformed.",
        lambda: _with_hints(_rule({"cpu_class": "ARMv9"})),
        {"device": _ARMV9},
    ),
    "hints-cores-zero": (
        "cores 0: malformed (1 to 1024).",
        lambda: _with_hints(_rule({"cores": 0})),
        {"device": _ARMV9},
    ),
    "hints-soc-64-characters": (
        "An soc of 64 characters, the longest.",
        lambda: _with_hints(_rule({"soc": "S" * 64}, 1)),
        {"device": {**_ARMV9, "soc": "S" * 64}},
    ),
    "hints-soc-65-characters": (
        "An soc of 65 characters: malformed.",
        lambda: _with_hints(_rule({"soc": "S" * 65})),
        {"device": _ARMV9},
    ),
    "hints-soc-trailing-space": (
        "An soc ending with a space: malformed (printable ASCII, spaces only inside).",
        lambda: _with_hints(_rule({"soc": "QTI SM8550 "})),
        {"device": _ARMV9},
    ),
}


def build_hints() -> dict[str, str]:
    files = {}
    for name, (description, manifest, overrides) in HINT_CASES.items():
        vector_input = _input(manifest(), {"device_id": "phone-0", **overrides})
        vector_input["device"] = {
            "device_id": vector_input["device"]["device_id"],
            "mnn_runtime": APP_RUNTIME,
            **overrides.get("device", {}),
        }
        files.update(_vector_file("hints", name, description, vector_input))
    return files


def everything() -> dict[str, str]:
    """Every golden file under tests/vectors/, by relative path."""
    return {
        **build(),
        **build_blobs(),
        **build_rules(),
        **build_probes(),
        **build_versions(),
        **build_reports(),
        **build_labels(),
        **build_conditions(),
        **build_selftest(),
        **build_health(),
        **build_metrics(),
        **build_tier_files(),
        **build_hints(),
    }


RUNNERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "": run,
    "blobs": run_blob,
    "probes": run_probe,
    "versions": run_version,
    "reports": run_report,
    "labels": run_labels,
    "conditions": check_conditions_vector,
    "selftest": check_selftest_vector,
    "health": check_health_vector,
    "metrics": check_metrics_vector,
    "tiers": check_tier_file_vector,
    "hints": check_hints_vector,
}
"""The reference runner of each vector folder ("" is tests/vectors/ itself; rules/ has its
own format)."""


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
    for path, text in schemas().items():
        if not path.exists() or path.read_text("utf-8") != text:
            problems.append(str(path.relative_to(ROOT)))
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
    for path, text in schemas().items():
        path.write_text(text, encoding="utf-8")
    print(f"wrote {len(wanted)} vectors and the schemas in {SCHEMA_FILE.parent.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
