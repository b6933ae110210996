"""The client's pure trust core: a table of named cases, properties, and the golden vectors."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgereg.client import (
    BadBlob,
    BadSignature,
    BlobCheck,
    BlobTooLarge,
    Decision,
    Expired,
    Malformed,
    Rejected,
    Rollback,
    RuntimeTooOld,
    TrustedKeys,
    UnknownKey,
    WrongModel,
    WrongTier,
    compare_versions,
    decide,
)
from edgereg.config import RuntimeHints
from edgereg.errors import TrustError
from edgereg.protocol.decision import AppFacts
from edgereg.rollout import in_cohort
from edgereg.signing import Signer, canonical_json, generate_key, verify_envelope
from edgereg.wire import Manifest, ManifestEntry, blob_path, sign_document

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
SALT = "0123456789abcdef"
KEY = Signer.from_pem(generate_key()[0])
OTHER = Signer.from_pem(generate_key()[0])
TRUSTED = TrustedKeys([KEY.public_key])


def entry(version: str, *, runtime: str = "3.6.1", variant: str = "int8") -> ManifestEntry:
    digest = hashlib.sha256(version.encode()).hexdigest()
    return ManifestEntry(
        version=version,
        variant=variant,
        path=blob_path(digest),
        sha256=digest,
        size=1000,
        min_mnn_runtime=runtime,
        runtime=RuntimeHints(),
    )


def manifest(**changes: Any) -> Manifest:
    fields: dict[str, Any] = {
        "model": "digits",
        "tier": "mid",
        "sequence": 9,
        "expires": NOW + timedelta(days=30),
        "stable": entry("1.0.0"),
    }
    fields.update(changes)
    return Manifest(**fields)


def rollout(**changes: Any) -> Manifest:
    return manifest(**{"candidate": entry("1.1.0"), "percent": 50.0, "salt": SALT, **changes})


def device(inside: bool) -> str:
    n = 0
    while in_cohort(f"d{n}", SALT, 50.0) != inside:
        n += 1
    return f"d{n}"


INSIDE, OUTSIDE = device(True), device(False)


def flip_payload(data: bytes) -> bytes:
    envelope = json.loads(data)
    payload = base64.b64decode(envelope["payload"]).replace(b'"sequence":9', b'"sequence":99')
    envelope["payload"] = base64.b64encode(payload).decode()
    return canonical_json(envelope)


@dataclass
class Case:
    """One row: a manifest, how the client is set up, and what it must decide."""

    doc: Manifest
    signers: list[Signer] = field(default_factory=lambda: [KEY])
    mutate: Any = None  # bytes -> bytes, applied after signing
    kwargs: dict[str, Any] = field(default_factory=dict)
    accept: tuple[str, bool] | None = None  # (version, is_candidate)
    reject: type[Rejected] | None = None
    message: str | None = None


CASES: dict[str, Case] = {
    "stable only": Case(manifest(), accept=("1.0.0", False)),
    "candidate inside cohort": Case(
        rollout(), kwargs={"device_id": INSIDE}, accept=("1.1.0", True)
    ),
    "stable outside cohort": Case(
        rollout(), kwargs={"device_id": OUTSIDE}, accept=("1.0.0", False)
    ),
    "paused rollout serves stable": Case(
        rollout(paused=True), kwargs={"device_id": INSIDE}, accept=("1.0.0", False)
    ),
    "candidate at 100% for everyone": Case(
        rollout(percent=100.0), kwargs={"device_id": OUTSIDE}, accept=("1.1.0", True)
    ),
    "same sequence again": Case(
        manifest(), kwargs={"highest_seen_sequence": 9}, accept=("1.0.0", False)
    ),
    "higher sequence": Case(
        manifest(sequence=10), kwargs={"highest_seen_sequence": 9}, accept=("1.0.0", False)
    ),
    "rotation: untrusted and trusted signer": Case(
        manifest(), signers=[OTHER, KEY], accept=("1.0.0", False)
    ),
    "runtime unknown skips the runtime rule": Case(
        manifest(stable=entry("1.0.0", runtime="9.0")),
        kwargs={"app_mnn_runtime": None},
        accept=("1.0.0", False),
    ),
    "runtime fallback to stable": Case(
        rollout(candidate=entry("1.1.0", runtime="3.7.0")),
        kwargs={"device_id": INSIDE},
        accept=("1.0.0", False),
    ),
    "runtime equal to the need": Case(
        manifest(stable=entry("1.0.0", runtime="3.6.1.0")), accept=("1.0.0", False)
    ),
    "rollback": Case(
        manifest(sequence=7),
        kwargs={"highest_seen_sequence": 9},
        reject=Rollback,
        message="sequence 7 is older than 9 already seen",
    ),
    "expired": Case(manifest(expires=NOW), reject=Expired),
    "expired long ago": Case(manifest(expires=NOW - timedelta(days=400)), reject=Expired),
    "untrusted key only": Case(manifest(), signers=[OTHER], reject=UnknownKey),
    "tampered payload": Case(manifest(), mutate=flip_payload, reject=BadSignature),
    "wrong model": Case(
        manifest(model="sensor"),
        reject=WrongModel,
        message="manifest is for model 'sensor', expected 'digits'",
    ),
    "wrong tier": Case(manifest(tier="high"), reject=WrongTier),
    "stable needs a newer runtime": Case(
        manifest(stable=entry("1.0.0", runtime="3.7.0")),
        reject=RuntimeTooOld,
        message="stable 1.0.0 (int8) needs MNN 3.7.0, the app has 3.6.1",
    ),
    "first-release candidate needs a newer runtime": Case(
        rollout(stable=None, candidate=entry("1.1.0", runtime="3.7.0")),
        kwargs={"device_id": INSIDE},
        reject=RuntimeTooOld,
        message="candidate 1.1.0 (int8) needs MNN 3.7.0, the app has 3.6.1",
    ),
    "not json": Case(manifest(), mutate=lambda b: b"not json", reject=Malformed),
    "json but not an envelope": Case(manifest(), mutate=lambda b: b"[1, 2]", reject=Malformed),
    "no signatures": Case(
        manifest(),
        mutate=lambda b: canonical_json({**json.loads(b), "signatures": []}),
        reject=Malformed,
    ),
    "payload type of another kind": Case(
        manifest(),
        mutate=lambda b: canonical_json({**json.loads(b), "payloadType": "application/x"}),
        reject=Malformed,
    ),
    "too large": Case(
        manifest(),
        mutate=lambda b: b + b" " * 70_000,
        reject=Malformed,
        message="manifest is",
    ),
}


def run(case: Case) -> Decision:
    data = sign_document(case.doc, case.signers)
    if case.mutate is not None:
        data = case.mutate(data)
    kwargs: dict[str, Any] = {
        "trusted": TRUSTED,
        "model": "digits",
        "tier": "mid",
        "device_id": "device-1",
        "app_mnn_runtime": "3.6.1",
        "highest_seen_sequence": None,
        "now": NOW,
        **case.kwargs,
    }
    return decide(data, **kwargs)


@pytest.mark.parametrize("name", list(CASES))
def test_decide(name: str) -> None:
    case = CASES[name]
    if case.reject is not None:
        with pytest.raises(case.reject) as info:
            run(case)
        assert isinstance(info.value, TrustError)
        assert type(info.value) is case.reject, "each reason has its own class"
        if case.message:
            assert info.value.message.startswith(case.message), info.value.message
        return
    decision = run(case)
    assert decision.entry is not None
    assert case.accept is not None
    assert (decision.entry.version, decision.is_candidate) == case.accept
    assert decision.sequence == max(
        case.doc.sequence, case.kwargs.get("highest_seen_sequence") or 0
    )


def test_outside_a_first_release_canary_there_is_no_entry() -> None:
    decision = run(Case(rollout(stable=None), kwargs={"device_id": OUTSIDE}))
    assert decision.entry is None
    assert not decision.is_candidate


def test_runtime_fallback_is_flagged() -> None:
    case = CASES["runtime fallback to stable"]
    assert run(case).runtime_fallback
    assert not run(CASES["stable only"]).runtime_fallback


def test_reason_codes_are_distinct() -> None:
    from edgereg.protocol.reasons import CpuUnsupported, InsufficientMemory

    classes = [BadSignature, UnknownKey, Expired, Rollback, WrongModel, WrongTier]
    classes += [RuntimeTooOld, Malformed, BadBlob, BlobTooLarge]
    classes += [InsufficientMemory, CpuUnsupported]
    assert len({c.reason for c in classes}) == len(classes)


def test_size_limit_is_checked_before_parsing() -> None:
    with pytest.raises(Malformed, match="more than the limit of 100"):
        decide(
            b"{" * 101,
            trusted=TRUSTED,
            model="digits",
            tier="mid",
            device_id="d",
            app_mnn_runtime=None,
            highest_seen_sequence=None,
            now=NOW,
            max_manifest_bytes=100,
        )


def test_caller_mistakes_are_value_errors() -> None:
    data = sign_document(manifest(), [KEY])
    args: dict[str, Any] = {"trusted": TRUSTED, "model": "digits", "tier": "mid"}
    args |= {"device_id": "d", "highest_seen_sequence": None}
    with pytest.raises(ValueError, match="timezone"):
        decide(data, app_mnn_runtime=None, now=datetime(2025, 1, 1), **args)
    # A runtime version that does not parse is not the caller's crash: it fits nothing.
    with pytest.raises(RuntimeTooOld, match=r"the app has 'three', which is not a version"):
        decide(data, app_mnn_runtime="three", now=NOW, **args)
    with pytest.raises(ValueError, match=r"mnn_runtime: .three. is not a version"):
        AppFacts(mnn_runtime="three").check()


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("3.6.1", "3.6.1", 0),
        ("3.7", "3.7.0", 0),
        ("3.6.1", "3.7.0", -1),
        ("3.10.0", "3.9.9", 1),
        ("3.6.1", "3.6.1.1", -1),
        ("4", "3.99.99", 1),
    ],
)
def test_compare_versions(a: str, b: str, expected: int) -> None:
    assert compare_versions(a, b) == expected
    assert compare_versions(b, a) == -expected


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_flipping_any_byte_is_rejected(data: st.DataObject) -> None:
    signed = sign_document(rollout(), [KEY])
    index = data.draw(st.integers(0, len(signed) - 1), label="index")
    xor = data.draw(st.integers(1, 255), label="xor")
    mutated = bytearray(signed)
    mutated[index] ^= xor
    with pytest.raises(Rejected):
        decide(
            bytes(mutated),
            trusted=TRUSTED,
            model="digits",
            tier="mid",
            device_id=INSIDE,
            app_mnn_runtime="3.6.1",
            highest_seen_sequence=None,
            now=NOW,
        )


@settings(max_examples=100, deadline=None)
@given(seen=st.integers(1, 1000), sequence=st.integers(1, 1000))
def test_rollback_rule(seen: int, sequence: int) -> None:
    data = sign_document(manifest(sequence=sequence), [KEY])
    args: dict[str, Any] = {"trusted": TRUSTED, "model": "digits", "tier": "mid"}
    args |= {"device_id": "d", "app_mnn_runtime": None, "now": NOW}
    if sequence < seen:
        with pytest.raises(Rollback):
            decide(data, highest_seen_sequence=seen, **args)
    else:
        assert decide(data, highest_seen_sequence=seen, **args).sequence == sequence


# --- the device's CPU and memory (fit rules d and e) ----------------------------------

A710_CPUINFO = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb \
paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 \
i8mm bf16 dgh bti
CPU implementer\t: 0x41
""".replace("\\\n", "")
A53_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid\n"
A76_CPUINFO = (
    "Features\t: fp asimd aes crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n"
)


@pytest.mark.parametrize(
    ("cpuinfo", "features", "cpu_class"),
    [
        (A710_CPUINFO, {"dotprod", "fp16", "sve2", "i8mm", "bf16"}, "armv9"),
        (A76_CPUINFO, {"dotprod", "fp16"}, "armv8.2"),
        (A53_CPUINFO, set(), "armv8"),
        ("", None, None),  # no Features line: unknown (rule (e) skipped), not "none"
        # svei8mm and svebf16 are other hwcaps: only the exact names count.
        ("Features\t: svei8mm svebf16\n", set(), "armv8"),
        ("Features\t: fphp\nFeatures\t: asimddp\n", {"fp16", "dotprod"}, "armv8.2"),
    ],
    ids=["cortex-a710", "cortex-a76", "cortex-a53", "empty", "sve-only-names", "two-lines"],
)
def test_an_arm_linux_device_reads_its_features_from_cpuinfo(
    tmp_path: Path, cpuinfo: str, features: set[str] | None, cpu_class: str | None
) -> None:
    from edgereg.client._cpu import cpu_class as class_of
    from edgereg.client._cpu import detect_cpu_features

    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    found = detect_cpu_features("aarch64", path)
    assert found == features
    assert class_of(found, "aarch64") == cpu_class


@pytest.mark.parametrize(
    ("machine", "features", "cpu_class"),
    [
        ("x86_64", frozenset(), "x86_64"),  # no ARM feature applies: said, and empty
        ("AMD64", frozenset(), "x86_64"),
        ("aarch64", None, None),  # /proc/cpuinfo unreadable: not said, never "none"
        ("riscv64", None, None),
    ],
)
def test_other_machines_say_none_or_leave_the_features_unsaid(
    tmp_path: Path, machine: str, features: frozenset[str] | None, cpu_class: str | None
) -> None:
    from edgereg.client._cpu import cpu_class as class_of
    from edgereg.client._cpu import detect_cpu_features

    found = detect_cpu_features(machine, tmp_path / "no-such-cpuinfo")
    assert found == features
    assert class_of(found, machine) == cpu_class


@pytest.mark.parametrize(
    ("features", "machine", "cpu_class"),
    [
        ({"i8mm"}, "x86_64", "armv9"),  # what the app says wins over the host
        ({"sve2"}, "aarch64", "armv9"),
        ({"fp16"}, "aarch64", "armv8.2"),
        ({"bf16"}, "x86_64", "armv8"),
        (set(), "riscv64", "other"),
        ({"sme2p1-x"}, "riscv64", "other"),  # a name no class knows
    ],
)
def test_the_cpu_class_a_report_carries(features: set[str], machine: str, cpu_class: str) -> None:
    from edgereg.client._cpu import cpu_class as class_of

    assert class_of(frozenset(features), machine) == cpu_class


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_features": {"I8MM"}}, "not a feature name"),
        ({"cpu_features": "i8mm"}, "a set of names, not one string"),
        ({"memory_budget_mb": 0}, "memory_budget_mb must be"),
        ({"memory_budget_mb": -5.0}, "memory_budget_mb must be"),
        ({"memory_budget_mb": True}, "memory_budget_mb must be"),
        ({"memory_budget_mb": 2_000_000}, "memory_budget_mb must be"),
    ],
)
def test_a_client_refuses_device_facts_no_manifest_could_match(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    from edgereg.client import Client, DeviceProfile

    with pytest.raises(ValueError, match=message):
        Client(
            "http://127.0.0.1:9/",
            TRUSTED,
            tmp_path,
            model="digits",
            device=DeviceProfile(device_id="d", ram_mb=4096, cpu_cores=4),
            tier="mid",
            **kwargs,
        )


def test_a_client_says_the_facts_it_was_given_or_read(tmp_path: Path) -> None:
    from edgereg.client import Client, DeviceProfile
    from edgereg.client._cpu import detect_cpu_features

    def client(**kwargs: Any) -> Client:
        return Client(
            "http://127.0.0.1:9/",
            TRUSTED,
            tmp_path,
            model="digits",
            device=DeviceProfile(device_id="d", ram_mb=4096, cpu_cores=4),
            tier="mid",
            **kwargs,
        )

    assert client().app.cpu_features == detect_cpu_features()
    assert client(cpu_features=None).app.cpu_features is None
    given = client(cpu_features=["i8mm", "dotprod"], memory_budget_mb=512)
    assert given.app.cpu_features == {"i8mm", "dotprod"}
    assert given.app.memory_budget_mb == 512.0
    assert given.reporter.device.cpu_class == "armv9"
    assert client(cpu_features=None).reporter.device.cpu_class is None


# --- blobs --------------------------------------------------------------------


def blob_entry(data: bytes) -> ManifestEntry:
    digest = hashlib.sha256(data).hexdigest()
    return entry("1.0.0").model_copy(
        update={"sha256": digest, "path": blob_path(digest), "size": len(data)}
    )


def test_blob_check_accepts_the_exact_bytes_in_any_chunking() -> None:
    data = bytes(range(256)) * 40
    check = BlobCheck(blob_entry(data))
    for start in range(0, len(data), 777):
        check.update(data[start : start + 777])
    assert check.remaining == 0
    check.finish()


def test_blob_check_rejects_more_fewer_or_other_bytes() -> None:
    data = b"x" * 1000
    with pytest.raises(BlobTooLarge):
        BlobCheck(blob_entry(data)).update(data + b"!")
    with pytest.raises(BlobTooLarge, match="announces 1001 bytes"):
        BlobCheck(blob_entry(data)).expect(1001)
    short = BlobCheck(blob_entry(data))
    short.update(data[:-1])
    with pytest.raises(BadBlob, match="999 bytes"):
        short.finish()
    other = BlobCheck(blob_entry(data))
    other.update(b"y" * 1000)
    with pytest.raises(BadBlob, match="sha256"):
        other.finish()
    restarted = BlobCheck(blob_entry(data))
    restarted.update(b"y" * 10)
    restarted.reset()
    restarted.update(data)
    restarted.finish()


# --- golden vectors and the schema --------------------------------------------

VECTORS = Path(__file__).parent / "vectors"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vectors_generate", VECTORS / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vectors_and_schema_are_current() -> None:
    stale = load_generator().stale()
    assert not stale, f"regenerate with: .venv/bin/python tests/vectors/generate.py ({stale})"


def vector_files() -> list[Path]:
    return sorted(VECTORS.glob("*.json"))


def every_vector_file() -> list[Path]:
    """Every vector in every folder (keys/ holds keys; rules/ is checked below)."""
    return sorted(
        p
        for p in VECTORS.rglob("*.json")
        if p.relative_to(VECTORS).parts[0] not in ("keys", "rules")
    )


@pytest.mark.parametrize(
    "path", every_vector_file(), ids=lambda p: str(p.relative_to(VECTORS).with_suffix(""))
)
def test_vector(path: Path) -> None:
    """Each file, whatever its folder, against the reference runner of that folder.

    A folder without a runner fails: a new kind of vector must come with one
    (and with its format in docs/protocol.md section 9), so no port can pass
    by not knowing about it.
    """
    folder = "/".join(path.relative_to(VECTORS).parts[:-1])
    runners = load_generator().RUNNERS
    assert folder in runners, f"no runner for tests/vectors/{folder}/ (add one to generate.py)"
    vector = json.loads(path.read_text("utf-8"))
    assert set(vector) == {"name", "description", "input", "expected"}, path
    assert vector["name"] == path.stem
    assert runners[folder](vector["input"]) == vector["expected"]


def test_every_vector_folder_is_documented() -> None:
    protocol = (VECTORS.parent.parent / "docs" / "protocol.md").read_text("utf-8")
    folders = {p.name for p in VECTORS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {
        "blobs",
        "conditions",
        "health",
        "hints",
        "keys",
        "labels",
        "metrics",
        "probes",
        "reports",
        "rules",
        "selftest",
        "tiers",
        "versions",
    }
    for folder in folders - {"keys"}:
        assert f"tests/vectors/{folder}/" in protocol, folder


def test_new_vector_kinds_cover_their_rules() -> None:
    def expected(folder: str) -> list[dict[str, Any]]:
        return [
            json.loads(p.read_text("utf-8"))["expected"]
            for p in sorted((VECTORS / folder).glob("*.json"))
        ]

    probe_reasons = {e["reason"] for e in expected("probes")}
    assert probe_reasons == {None, "malformed", "count-mismatch", "missing-output"} | {
        "shape-mismatch",
        "not-finite",
        "cosine",
        "abs-error",
    }
    assert {e["result"] for e in expected("versions")} == {
        "match",
        "no-match",
        "invalid-version",
        "invalid-range",
    }
    assert {e.get("reason") for e in expected("reports")} == {
        None,
        "too-large",
        "not-json",
        "invalid",
    }
    assert {call for e in expected("metrics") for call in e["calls"]} == {
        "counted",
        "not-finite",
        "undeclared",
        "other-kind",
    }
    steps = [step for e in expected("health") for step in e["steps"]]
    assert {step["reported"] for step in steps} >= {None, 1, 2, 3}
    assert any(step["revert"] is not None for step in steps)
    hints = expected("hints")
    assert {e.get("reason") for e in hints} == {None, "malformed"}
    assert {e.get("rule") for e in hints} >= {None, 0, 1}
    # A device that matched a rule outside its percent: the rule's comparison arm.
    assert any(e.get("matched") == 0 and e.get("rule") is None for e in hints)
    assert any(e.get("runtime_trials") is not None for e in hints)
    assert {e.get("reason") for e in expected("labels")} == {
        None,
        "malformed",
        "bad-blob",
        "blob-too-large",
    }


def test_vectors_cover_every_required_case() -> None:
    names = {p.stem for p in vector_files()}
    required = {"valid-stable", "valid-candidate-in-cohort", "outside-cohort", "tampered"}
    required |= {"expired", "rolled-back", "wrong-key", "wrong-tier", "wrong-model"}
    required |= {"too-new-runtime", "app-incompatible-candidate-falls-back"}
    required |= {"os-incompatible-stable-refused", "bundle-in-cohort", "bundle-member-too-new"}
    required |= {"bundle-asked-as-model"}
    # Fit rules (d) and (e): the cases docs/protocol.md §9 lists for every port.
    required |= {"memory-fits", "memory-exactly-the-budget", "memory-over-budget"}
    required |= {"memory-candidate-over-falls-back", "memory-budget-not-said"}
    required |= {"cpu-avoided-no-instead", "cpu-avoided-instead-installed"}
    required |= {"cpu-instead-over-memory", "cpu-instead-avoids-too", "cpu-features-not-said"}
    required |= {"instead-nested", "instead-other-version", "cpu-unknown-feature-name"}
    required |= {"bundle-memory-sum-over", "bundle-member-instead"}
    required |= {"runtime-before-memory", "memory-before-cpu"}
    # Fit rule (f): the MNN API the app's runner calls.
    required |= {"api-module-session-runner", "api-module-module-runner", "api-not-said"}
    required |= {"api-candidate-falls-back", "cpu-before-api", "bundle-member-api-unsupported"}
    assert required <= names
    reasons = {json.loads(p.read_text())["expected"].get("reason") for p in vector_files()}
    assert {"bad-signature", "unknown-key", "expired", "rollback"} <= reasons
    assert {"wrong-model", "wrong-tier", "runtime-too-old", "malformed"} <= reasons
    assert {"os-incompatible", "insufficient-memory", "cpu-unsupported"} <= reasons
    assert "api-unsupported" in reasons
    fallbacks = {json.loads(p.read_text())["expected"].get("fallback") for p in vector_files()}
    assert {"app-incompatible", "runtime-too-old"} <= fallbacks
    assert {"insufficient-memory", "cpu-unsupported", "api-unsupported"} <= fallbacks
    substitutes = {json.loads(p.read_text())["expected"].get("substitute") for p in vector_files()}
    assert substitutes == {None, "cpu-unsupported"}


# --- compatibility: the previous release's vectors, frozen --------------------------------

GOLDEN_0_1_0 = Path(__file__).parent / "golden" / "manifests-0.1.0"
ACCEPTED_SINCE = {
    # 0.1.0 refused unknown payload keys; a newer publisher may now add them (§3).
    "unknown-field": {"accept": True},
}


@pytest.mark.parametrize("path", sorted(GOLDEN_0_1_0.glob("*.json")), ids=lambda p: p.stem)
def test_the_manifests_of_0_1_0_are_decided_as_that_release_did(path: Path) -> None:
    """Every manifest 0.1.0 accepted or refused, this client decides the same way."""
    vector = json.loads(path.read_text("utf-8"))
    got = load_generator().run(vector["input"])
    expected = ACCEPTED_SINCE.get(path.stem, vector["expected"])
    # Keys added to the decision since (fallback) are not in the frozen files.
    assert {key: got[key] for key in expected} == expected


def test_the_frozen_0_1_0_vectors_are_all_there() -> None:
    assert len(list(GOLDEN_0_1_0.glob("*.json"))) == 38


def test_schema_accepts_real_payloads_and_unknown_keys() -> None:
    import jsonschema

    schema = json.loads((VECTORS.parent.parent / "docs/schemas/manifest.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for path in vector_files():
        vector = json.loads(path.read_text("utf-8"))
        if not vector["expected"]["accept"]:
            continue
        envelope = json.loads(base64.b64decode(vector["input"]["manifest"]))
        validator.validate(json.loads(base64.b64decode(envelope["payload"])))
    payload = json.loads(manifest().model_dump_json())
    assert not list(validator.iter_errors(payload))
    assert not list(validator.iter_errors({**payload, "extra": 1}))  # forward compatible
    assert list(validator.iter_errors({**payload, "sequence": "9"}))


# --- blob, tier and cohort vectors; what the schema says -----------------------------


def blob_vector_files() -> list[Path]:
    return sorted((VECTORS / "blobs").glob("*.json"))


@pytest.mark.parametrize("path", blob_vector_files(), ids=lambda p: p.stem)
def test_blob_vector(path: Path) -> None:
    vector = json.loads(path.read_text("utf-8"))
    assert load_generator().run_blob(vector["input"]) == vector["expected"]


def test_blob_vectors_cover_rules_13_and_14() -> None:
    reasons = {json.loads(p.read_text())["expected"].get("reason") for p in blob_vector_files()}
    assert reasons == {None, "blob-too-large", "bad-blob", "transport"}


def test_tier_and_cohort_vectors_match_the_implementation() -> None:
    from edgereg.protocol.fields import TierRules
    from edgereg.protocol.rules import DeviceProfile, cohort_bucket, resolve_tier

    tiers = json.loads((VECTORS / "rules/tiers.json").read_text("utf-8"))
    rules = {t["name"]: TierRules(**t["rules"]) for t in tiers["tiers"]}
    assert len({case["tier"] for case in tiers["cases"]}) == len(rules)  # every tier reached
    for case in tiers["cases"]:
        device = DeviceProfile(device_id=case["name"], **case["device"])
        assert resolve_tier(rules, device) == case["tier"], case["name"]
    cohorts = json.loads((VECTORS / "rules/cohorts.json").read_text("utf-8"))
    for case in cohorts["cases"]:
        assert cohort_bucket(case["device_id"], case["salt"]) == case["bucket"]
        for percent, inside in case["in_cohort"].items():
            assert in_cohort(case["device_id"], case["salt"], float(percent)) is inside


# Rule-6 vectors whose payload breaks a rule JSON Schema cannot state (the
# schema's $comment lists them); every other strict-schema refusal the schema
# makes too.
SCHEMA_CANNOT_SAY = {
    "sequence-as-float": "JSON Schema's integer admits 9.0",
    "path-not-the-digest": "JSON Schema cannot compare two fields",
    "percent-three-decimals": "multipleOf 0.01 would refuse 0.29 in floating point",
    "bundle-asked-as-model": "a valid bundle manifest; the client asked for a model",
    "schema-version-as-float": "JSON Schema's const 1 admits 1.0",
    "infinity-in-unknown-key": "a JSON parser rule: 1e400 reads as infinity before any schema",
    "integer-beyond-double-in-unknown-key": "a JSON parser rule: a double's range",
    "integer-rounding-to-infinity-in-unknown-key": "a JSON parser rule: a double's range",
    "integer-5000-digits-in-unknown-key": "a JSON parser rule: a double's range",
    "lone-high-surrogate-in-unknown-key": "a JSON parser rule: a lone surrogate is no text",
    "lone-low-surrogate-in-unknown-key": "a JSON parser rule: a lone surrogate is no text",
    "high-surrogate-then-not-low": "a JSON parser rule: a lone surrogate is no text",
    "lone-surrogate-in-unknown-key-name": "a JSON parser rule: a lone surrogate is no text",
    "instead-nested": "instead is an entry, whose own schema allows instead",
    "instead-other-version": "JSON Schema cannot compare two fields",
    "expires-year-0000": "the pattern holds; no date has year 0000 (format is not asserted)",
    "contract-labels-and-labels-blob": "both keys may be null: exclusive only when both set",
    "contract-state-names-a-missing-tensor": "JSON Schema cannot compare two fields",
    "contract-task-output-not-an-output": "JSON Schema cannot compare two fields",
    "metrics-buckets-unsorted": "JSON Schema cannot say that a list increases",
    "metrics-on-instead": "instead is an entry, whose own schema allows metrics",
    "metrics-on-bundle-member": "a member is an entry, whose own schema allows metrics",
}
# Whole-string vectors: the schema's ^...$ patterns refuse them as JSON Schema
# reads them (ECMA-262, where $ is the end of the string), but Python's
# jsonschema uses re.search, whose $ also matches before a final newline.
DOLLAR_BEFORE_NEWLINE = {
    "version-trailing-newline",
    "expires-trailing-newline",
    "tier-trailing-newline",
    "sha256-trailing-newline",
    "salt-trailing-newline",
}


def _big_int(text: str) -> Any:
    # Past CPython's digit limit json.loads raises; the schema only sees a number.
    return int(text) if len(text) < 4000 else float("inf")


def _payload(vector: dict[str, Any]) -> Any:
    envelope = json.loads(base64.b64decode(vector["input"]["manifest"]))
    return json.loads(base64.b64decode(envelope["payload"]), parse_int=_big_int)


def test_the_schema_refuses_what_the_reference_refuses() -> None:
    import jsonschema

    schema = json.loads((VECTORS.parent.parent / "docs/schemas/manifest.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    checked = []
    for path in vector_files():
        vector = json.loads(path.read_text("utf-8"))
        if (
            vector["expected"].get("reason") != "malformed"
            or path.stem in SCHEMA_CANNOT_SAY
            or path.stem in DOLLAR_BEFORE_NEWLINE
        ):
            continue
        data = base64.b64decode(vector["input"]["manifest"])
        trusted = TrustedKeys.from_pems(vector["input"]["trusted_keys"])
        try:
            verify_envelope(data, trusted, payload_type=Manifest.payload_type)
        except Rejected:
            continue  # refused by rules 1-5, before the schema applies
        payload = _payload(vector)
        assert list(validator.iter_errors(payload)), f"the schema accepts {path.stem}"
        checked.append(path.stem)
    assert len(checked) >= 7, checked  # unknown-field is accepted (forward compatible)
    for name, why in SCHEMA_CANNOT_SAY.items():
        vector = json.loads((VECTORS / f"{name}.json").read_text("utf-8"))
        assert vector["expected"]["reason"] == "malformed"
        assert not list(validator.iter_errors(_payload(vector))), (name, why)


# Report vectors the JSON Schema cannot refuse (its $comment says so).
REPORT_SCHEMA_CANNOT_SAY = {
    "schema-version-as-float",
    "sequence-as-float",
    "unconfirmed-starts-as-float",
    "metrics-count-with-fraction",
    "metrics-successes-above-events",  # JSON Schema cannot compare two fields
    "metrics-in-version-2",
    # Which keys a version allows: said in the $comment.
    "v1-with-v2-key",
    "v1-with-v2-key-null",
    "v1-absent-with-v2-key",
}
# As DOLLAR_BEFORE_NEWLINE: refused by the schema read as ECMA-262, not by Python's re.
REPORT_DOLLAR_BEFORE_NEWLINE = {"version-trailing-newline", "os-version-trailing-newline"}


def test_the_report_and_probe_schemas_agree_with_the_vectors() -> None:
    import jsonschema

    schemas = VECTORS.parent.parent / "docs" / "schemas"
    reports = jsonschema.Draft202012Validator(
        json.loads((schemas / "report.schema.json").read_text())
    )
    for path in sorted((VECTORS / "reports").glob("*.json")):
        vector = json.loads(path.read_text("utf-8"))
        if vector["expected"].get("reason") in ("too-large", "not-json"):
            continue
        if path.stem in REPORT_DOLLAR_BEFORE_NEWLINE:
            continue
        body = json.loads(base64.b64decode(vector["input"]["body"]))
        errors = list(reports.iter_errors(body))
        if vector["expected"]["accept"] or path.stem in REPORT_SCHEMA_CANNOT_SAY:
            assert not errors, (path.stem, errors)
        else:
            assert errors, f"the report schema accepts {path.stem}"
    probes = jsonschema.Draft202012Validator(
        json.loads((schemas / "probe.schema.json").read_text())
    )
    for path in sorted((VECTORS / "probes").glob("*.json")):
        vector = json.loads(path.read_text("utf-8"))
        if vector["expected"]["reason"] != "malformed":
            document = json.loads(base64.b64decode(vector["input"]["probe"]))
            assert not list(probes.iter_errors(document)), path.stem


# --- the version grammar: properties the versions/ vectors cannot enumerate --------------

_IDENT = st.from_regex(r"[0-9A-Za-z-]{1,4}", fullmatch=True)
_VERSIONS = st.builds(
    lambda v, core, pre, build: v + core + pre + build,
    st.sampled_from(["", "v", "V"]),
    st.lists(st.from_regex(r"[0-9]{1,3}", fullmatch=True), min_size=1, max_size=4).map(".".join),
    st.one_of(
        st.just(""), st.lists(_IDENT, min_size=1, max_size=3).map(lambda p: "-" + ".".join(p))
    ),
    st.sampled_from(["", "+7", " (123)", "+build.5"]),
)


@settings(max_examples=300, deadline=None)
@given(_VERSIONS, _VERSIONS, _VERSIONS)
def test_versions_are_totally_ordered(a: str, b: str, c: str) -> None:
    from edgereg.protocol.fields import is_version, satisfies

    assert is_version(a)
    assert is_version(b)
    assert is_version(c)
    assert compare_versions(a, b) == -compare_versions(b, a)
    assert compare_versions(a, a) == 0
    assert satisfies(a, f"=={a}")
    if compare_versions(a, b) <= 0 and compare_versions(b, c) <= 0:
        assert compare_versions(a, c) <= 0
    # The comparators agree with the comparison.
    assert satisfies(a, f">={b}") == (compare_versions(a, b) >= 0)
    assert satisfies(a, f"<{b}") == (compare_versions(a, b) < 0)


# Issue #30: a signed manifest whose min_mnn_runtime no client can compare (65 characters,
# valid by the schema of the day) made Client.fetch raise ValueError and `edgereg pull`
# exit 1 with a traceback. The schema bounds it; the manifest is malformed.
LONG_RUNTIMES = {
    "stable-65-characters": ("stable", "3." * 32 + "1"),
    "candidate-65-characters": ("candidate", "3." * 32 + "1"),
    "stable-1000-characters": ("stable", "3." * 499 + "10"),
}


@pytest.mark.parametrize(("arm", "runtime"), LONG_RUNTIMES.values(), ids=LONG_RUNTIMES.keys())
def test_a_min_mnn_runtime_too_long_to_compare_is_malformed_never_raised(
    tmp_path: Path, arm: str, runtime: str
) -> None:
    from click.testing import CliRunner
    from clientkit import Kit

    from edgereg.cli import main
    from edgereg.client import Client, DeviceProfile
    from edgereg.protocol.envelope import public_key_pem, sign_envelope

    kit = Kit(tmp_path / "registry")
    envelope = kit.publish("digits", kit.entry("digits", "1.0.0"), kit.entry("digits", "1.1.0"))
    payload = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
    payload[arm]["min_mnn_runtime"] = runtime
    signed = sign_envelope(canonical_json(payload), Manifest.payload_type, [kit.signer])
    (kit.root / "manifests" / "digits" / "high.json").write_bytes(signed)
    phone = DeviceProfile(device_id="device-1", ram_mb=4096, cpu_cores=8, mnn_runtime="3.6.1")
    client = Client(
        kit.root.as_uri(),
        TrustedKeys([kit.signer.public_key]),
        tmp_path / "cache",
        model="digits",
        device=phone,
        tier="high",
    )
    try:
        result = client.fetch()
    finally:
        client.close()
    assert result.error_code == "malformed", result.error
    assert "min_mnn_runtime" in (result.error or "")
    assert not result.installed

    pem = tmp_path / "key.pub.pem"
    pem.write_bytes(public_key_pem(kit.signer.public_key))
    args = ["pull", "digits", "--registry", kit.root.as_uri(), "--device-id", "device-1"]
    args += ["--tier", "high", "--mnn-runtime", "3.6.1", "--trusted-key", str(pem)]
    done = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "cli-cache")])
    assert "Traceback" not in done.output
    assert isinstance(done.exception, SystemExit), done.exception
    assert done.exit_code == result.exception.exit_code != 0  # type: ignore[union-attr]
    assert "(malformed)" in done.stderr


def test_edgereg_tiers_exports_the_tier_file_apps_resolve_with(tmp_path: Path) -> None:
    """models.toml's [tiers] -> an ordered array; the same file, keys sorted, still resolves."""
    from click.testing import CliRunner

    from edgereg import cli
    from edgereg import config as config_module
    from edgereg.client import Client, DeviceProfile
    from edgereg.protocol.rules import parse_tier_file, resolve_tier, tier_file

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "tiers.json"
    done = CliRunner().invoke(
        cli.main, ["tiers", "--config", str(root / "models.toml"), "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    config = config_module.load(root / "models.toml")
    tiers = parse_tier_file(out.read_bytes())
    assert [name for name, _ in tiers] == list(config.tiers)
    assert out.read_bytes() == tier_file(config.tiers)
    # Rewritten by a tool that sorts keys: the order is the array's, nothing moves.
    resorted = json.dumps(json.loads(out.read_bytes()), sort_keys=True).encode()
    assert parse_tier_file(resorted) == tiers
    phone = DeviceProfile(device_id="p", ram_mb=4096, cpu_cores=6)
    client = Client(
        "http://127.0.0.1:9/",
        TrustedKeys.from_pems([Signer.from_pem(generate_key()[0]).public_pem()]),
        tmp_path / "cache",
        model="digits",
        device=phone,
        tiers=tiers,
    )
    assert client.tier == resolve_tier(config.tiers, phone)
