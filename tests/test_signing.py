"""Keys, signed envelopes and verification: real Ed25519, no mocks."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from edgereg.errors import EdgeregError, TrustError
from edgereg.signing import (
    Signer,
    TrustedKeys,
    canonical_json,
    generate_key,
    key_id,
    load_private_key,
    load_public_key,
    pae,
    private_key_from_env,
    read_private_key_file,
    sign_envelope,
    verify_envelope,
)

MANIFEST = "application/vnd.edgereg.manifest+json"
STATE = "application/vnd.edgereg.state+json"
PAYLOAD = b'{"model":"digits","sequence":7}'


def _signer() -> Signer:
    private_pem, _ = generate_key()
    return Signer.from_pem(private_pem)


OLD = _signer()
NEW = _signer()
OTHER = _signer()


def trust(*signers: Signer) -> TrustedKeys:
    return TrustedKeys.from_pems([signer.public_pem() for signer in signers])


def envelope(*signers: Signer, payload: bytes = PAYLOAD, payload_type: str = MANIFEST) -> bytes:
    return sign_envelope(payload, payload_type, list(signers) or [OLD])


def edit(change: Callable[[dict[str, Any]], None], base: bytes | None = None) -> bytes:
    data = json.loads(base or envelope(OLD))
    change(data)
    return json.dumps(data).encode()


# --- keys -----------------------------------------------------------------------


def test_key_id_is_sha256_of_raw_public_key() -> None:
    raw = OLD.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert len(raw) == 32
    assert OLD.key_id == key_id(OLD.public_key) == hashlib.sha256(raw).hexdigest()
    assert OLD.key_id != NEW.key_id


def test_generated_pems_load_back() -> None:
    private_pem, public_pem = generate_key()
    assert private_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    signer = Signer.from_pem(private_pem)
    assert key_id(load_public_key(public_pem)) == signer.key_id
    assert signer.public_pem() == public_pem
    assert signer.key_id[:12] in repr(signer)


def _ec_private_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _encrypted_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )


@pytest.mark.parametrize(
    ("pem", "match"),
    [
        pytest.param(b"", "found nothing", id="empty"),
        # Never quoted: a private key pasted without its header is still secret.
        pytest.param(b"hello world", "not a PEM private key.*11 bytes without", id="garbage"),
        pytest.param(generate_key()[1], "not a PEM private key", id="public-key"),
        pytest.param(_ec_private_pem(), "expected Ed25519", id="ec-key"),
        pytest.param(_encrypted_pem(), "encrypted with a passphrase", id="encrypted"),
    ],
)
def test_load_private_key_rejects(pem: bytes, match: str) -> None:
    with pytest.raises(TrustError, match=match):
        load_private_key(pem)


@pytest.mark.parametrize(
    ("pem", "match"),
    [
        pytest.param(b"garbage", "not a PEM public key", id="garbage"),
        pytest.param(generate_key()[0], "not a PEM public key", id="private-key"),
        pytest.param(
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            "expected Ed25519",
            id="ec-key",
        ),
    ],
)
def test_load_public_key_rejects(pem: bytes, match: str) -> None:
    with pytest.raises(TrustError, match=match):
        load_public_key(pem)


def test_trusted_keys_is_an_immutable_mapping_by_key_id() -> None:
    keys = TrustedKeys.from_pems([OLD.public_pem(), NEW.public_pem(), OLD.public_pem()])
    assert len(keys) == 2
    assert set(keys) == {OLD.key_id, NEW.key_id}
    assert key_id(keys[NEW.key_id]) == NEW.key_id
    assert OTHER.key_id not in keys
    assert not hasattr(keys, "__setitem__")


def test_trust_error_is_never_retried_exit_5() -> None:
    assert issubclass(TrustError, EdgeregError)
    assert TrustError.exit_code == 5


# --- envelopes --------------------------------------------------------------------


def test_pae_matches_the_dsse_spec() -> None:
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("t", b"") == b"DSSEv1 1 t 0 "


def test_sign_verify_roundtrip() -> None:
    signed = envelope(OLD)
    data = json.loads(signed)
    assert set(data) == {"payload", "payloadType", "signatures"}
    assert base64.b64decode(data["payload"]) == PAYLOAD
    assert data["payloadType"] == MANIFEST
    assert [s["keyid"] for s in data["signatures"]] == [OLD.key_id]
    assert signed == canonical_json(data)  # stored exactly as canonical JSON
    assert verify_envelope(signed, trust(OLD), payload_type=MANIFEST) == PAYLOAD


def test_signature_covers_pae_not_just_payload() -> None:
    sig = base64.b64decode(json.loads(envelope(OLD))["signatures"][0]["sig"])
    OLD.public_key.verify(sig, pae(MANIFEST, PAYLOAD))  # raises InvalidSignature if not
    with pytest.raises(InvalidSignature):
        OLD.public_key.verify(sig, PAYLOAD)  # the payload alone is not what was signed


def test_raw_private_key_can_sign() -> None:
    raw = Ed25519PrivateKey.generate()
    signed = sign_envelope(PAYLOAD, MANIFEST, [raw])
    trusted = TrustedKeys([raw.public_key()])
    assert verify_envelope(signed, trusted, payload_type=MANIFEST) == PAYLOAD


def test_unknown_envelope_fields_are_ignored_as_dsse_asks() -> None:
    def add(data: dict[str, Any]) -> None:
        data["future"] = 1
        data["signatures"][0]["cert"] = None

    assert verify_envelope(edit(add), trust(OLD), payload_type=MANIFEST) == PAYLOAD


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


def _flip_sig(data: dict[str, Any]) -> None:
    sig = bytearray(base64.b64decode(data["signatures"][0]["sig"]))
    sig[10] ^= 0x01
    data["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()


def _duplicate_signature(data: dict[str, Any]) -> None:
    data["signatures"].append(dict(data["signatures"][0]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Each row: the envelope bytes, verify() keyword arguments, and what the error says.
REJECTIONS = [
    pytest.param(
        lambda: edit(_set(("payload",), _b64(b'{"model":"digits","sequence":9}'))),
        {},
        "does not verify",
        id="tampered-payload",
    ),
    pytest.param(
        lambda: edit(_set(("payloadType",), STATE)),
        {"payload_type": STATE},
        "does not verify",
        id="tampered-payload-type",
    ),
    pytest.param(lambda: edit(_flip_sig), {}, "does not verify", id="flipped-signature-byte"),
    pytest.param(
        lambda: edit(_set(("signatures", 0, "sig"), _b64(b"\0" * 63))),
        {},
        "does not verify",
        id="short-signature",
    ),
    pytest.param(lambda: envelope(OTHER), {}, "no signature by a trusted key", id="untrusted-key"),
    pytest.param(lambda: edit(_set(("signatures",), [])), {}, "no signatures", id="no-signatures"),
    pytest.param(
        lambda: edit(_duplicate_signature),
        {"threshold": 2},
        "1 distinct trusted key, 2 needed",
        id="duplicate-signature-threshold-2",
    ),
    pytest.param(
        lambda: envelope(OLD, payload_type=STATE),
        {},
        re.escape(f"payload type is '{STATE}', expected '{MANIFEST}'"),
        id="wrong-payload-type",
    ),
    pytest.param(lambda: b"not json", {}, "not JSON", id="not-json"),
    pytest.param(lambda: b"\xff\xfe{}", {}, "not JSON", id="not-utf8"),
    pytest.param(lambda: b"[1, 2]", {}, "JSON array, expected an object", id="array"),
    pytest.param(lambda: edit(_drop(("payload",))), {}, "no 'payload'", id="missing-payload"),
    pytest.param(
        lambda: edit(_drop(("payloadType",))), {}, "no 'payloadType'", id="missing-payload-type"
    ),
    pytest.param(
        lambda: edit(_drop(("signatures",))), {}, "no 'signatures'", id="missing-signatures"
    ),
    pytest.param(
        lambda: edit(_drop(("signatures", 0, "keyid"))), {}, "no string 'keyid'", id="no-keyid"
    ),
    pytest.param(lambda: edit(_drop(("signatures", 0, "sig"))), {}, "has no 'sig'", id="no-sig"),
    pytest.param(
        lambda: edit(_set(("signatures",), {"keyid": "x"})),
        {},
        "'signatures' is a JSON object, expected a list",
        id="signatures-not-list",
    ),
    pytest.param(
        lambda: edit(_set(("signatures", 0), "sig")),
        {},
        r"signatures\[0\] is a JSON string",
        id="signature-not-object",
    ),
    pytest.param(
        lambda: edit(_set(("payload",), 5)), {}, "'payload' is a JSON number", id="payload-number"
    ),
    pytest.param(
        lambda: edit(_set(("signatures", 0, "keyid"), OLD.key_id.upper())),
        {},
        "no signature by a trusted key",  # an id that is no trusted key's id
        id="keyid-uppercase",
    ),
    pytest.param(
        lambda: edit(_set(("payload",), _b64(PAYLOAD).rstrip("="))),
        {},
        "not canonical standard base64",
        id="payload-unpadded",
    ),
    pytest.param(
        lambda: edit(_set(("payload",), base64.urlsafe_b64encode(b"\xfb\xff").decode())),
        {},
        "not canonical standard base64",
        id="payload-urlsafe",
    ),
    pytest.param(
        lambda: envelope(OLD).replace(b'{"payload"', b'{"payload":"","payload"', 1),
        {},
        "duplicate key 'payload'",
        id="duplicate-json-key",
    ),
    pytest.param(lambda: envelope(OLD)[:-1] + b',"x":NaN}', {}, "not JSON", id="nan-constant"),
]


@pytest.mark.parametrize(("make", "kwargs", "match"), REJECTIONS)
def test_verify_rejects(make: Callable[[], bytes], kwargs: dict[str, Any], match: str) -> None:
    options: dict[str, Any] = {"payload_type": MANIFEST, **kwargs}
    with pytest.raises(TrustError, match=match):
        verify_envelope(make(), trust(OLD), **options)


def _with_extra_signature(extra: dict[str, Any]) -> bytes:
    return edit(lambda data: data["signatures"].append(extra))


# Finding 8 (docs/protocol.md §2, decision 0001): a signature by a key the
# verifier does not trust is skipped, whatever it holds.
EXTRA_UNTRUSTED_SIGNATURES = [
    pytest.param({"keyid": OTHER.key_id, "sig": "AAAA"}, id="garbage-sig"),
    pytest.param({"keyid": OTHER.key_id, "sig": "not base64!"}, id="sig-not-base64"),
    pytest.param({"keyid": OTHER.key_id}, id="no-sig"),
    pytest.param({"keyid": OTHER.key_id, "sig": 5}, id="sig-not-a-string"),
    pytest.param({"keyid": "not-a-key-id", "sig": "AAAA"}, id="keyid-not-hex"),
    pytest.param({"keyid": OTHER.key_id, "sig": "AAAA", "extra": [1]}, id="unknown-field"),
]


@pytest.mark.parametrize("extra", EXTRA_UNTRUSTED_SIGNATURES)
def test_an_extra_signature_by_an_untrusted_key_is_skipped(extra: dict[str, Any]) -> None:
    assert verify_envelope(_with_extra_signature(extra), trust(OLD), payload_type=MANIFEST) == (
        PAYLOAD
    )


def test_untrusted_error_names_both_key_sets_and_hints_rotation() -> None:
    with pytest.raises(TrustError) as caught:
        verify_envelope(envelope(NEW), trust(OLD), payload_type=MANIFEST)
    assert NEW.key_id[:12] in caught.value.message
    assert OLD.key_id[:12] in caught.value.message
    assert caught.value.hint is not None
    assert "rotated" in caught.value.hint


def test_bad_signature_by_trusted_key_fails_even_beside_a_good_one() -> None:
    def corrupt_second(data: dict[str, Any]) -> None:
        sig = bytearray(base64.b64decode(data["signatures"][1]["sig"]))
        sig[0] ^= 0xFF
        data["signatures"][1]["sig"] = _b64(bytes(sig))

    tampered = edit(corrupt_second, envelope(OLD, NEW))
    assert verify_envelope(tampered, trust(OLD), payload_type=MANIFEST) == PAYLOAD
    with pytest.raises(TrustError, match="signature 1 by trusted key"):
        verify_envelope(tampered, trust(OLD, NEW), payload_type=MANIFEST)


# --- rotation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trusted", "threshold"),
    [
        pytest.param((OLD,), 1, id="apps-trust-old"),
        pytest.param((NEW,), 1, id="apps-trust-new"),
        pytest.param((OLD, NEW), 1, id="apps-trust-both"),
        pytest.param((OLD, NEW), 2, id="both-required"),
        pytest.param((OLD, OTHER), 1, id="old-and-unrelated"),
    ],
)
def test_rotation_signed_by_old_and_new(trusted: tuple[Signer, ...], threshold: int) -> None:
    signed = envelope(OLD, NEW)
    assert verify_envelope(signed, trust(*trusted), payload_type=MANIFEST, threshold=threshold)


def test_threshold_counts_distinct_trusted_keys() -> None:
    with pytest.raises(TrustError, match="1 distinct trusted key, 2 needed"):
        verify_envelope(envelope(OLD, NEW), trust(OLD, OTHER), payload_type=MANIFEST, threshold=2)


def test_sign_and_verify_argument_errors() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        sign_envelope(PAYLOAD, MANIFEST, [])
    with pytest.raises(ValueError, match="same key more than once"):
        sign_envelope(PAYLOAD, MANIFEST, [OLD, OLD])
    with pytest.raises(ValueError, match="printable ASCII"):
        sign_envelope(PAYLOAD, "has space", [OLD])
    with pytest.raises(ValueError, match="threshold must be at least 1"):
        verify_envelope(envelope(OLD), trust(OLD), payload_type=MANIFEST, threshold=0)


# --- mutation: flip any byte, verification must fail -----------------------------

SINGLE = envelope(OLD)
DOUBLE = envelope(OLD, NEW)
SHORT = sign_envelope(b"x", MANIFEST, [OLD])  # payload base64 ends in "==": unused bits


@pytest.mark.parametrize(
    ("signed", "trusted", "threshold"),
    [
        pytest.param(SINGLE, trust(OLD), 1, id="one-signature"),
        pytest.param(DOUBLE, trust(OLD, NEW), 2, id="two-signatures-threshold-2"),
        pytest.param(SHORT, trust(OLD), 1, id="padded-payload"),
    ],
)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_any_single_byte_change_is_rejected(
    data: st.DataObject, signed: bytes, trusted: TrustedKeys, threshold: int
) -> None:
    index = data.draw(st.integers(0, len(signed) - 1), label="index")
    value = data.draw(st.integers(0, 255).filter(lambda b: b != signed[index]), label="byte")
    mutated = signed[:index] + bytes([value]) + signed[index + 1 :]
    with pytest.raises(TrustError):
        verify_envelope(mutated, trusted, payload_type=MANIFEST, threshold=threshold)


def test_every_single_bit_flip_is_rejected() -> None:
    # Exhaustive over the short envelope: 8 flips per byte.
    for index in range(len(SHORT)):
        for bit in range(8):
            mutated = bytearray(SHORT)
            mutated[index] ^= 1 << bit
            with pytest.raises(TrustError):
                verify_envelope(bytes(mutated), trust(OLD), payload_type=MANIFEST)


# --- key files and environment ------------------------------------------------------


def _write_key(path: Path, mode: int) -> Signer:
    private_pem, _ = generate_key()
    path.write_bytes(private_pem)
    path.chmod(mode)
    return Signer.from_pem(private_pem)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_key_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "edgereg.key"
    _write_key(path, mode)
    with pytest.raises(TrustError) as caught:
        read_private_key_file(path)
    assert f"chmod 600 {path}" in caught.value.diagnostics()
    assert f"{mode:04o}" in caught.value.message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_key_file_owner_only_is_accepted(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "edgereg.key"
    expected = _write_key(path, mode)
    assert read_private_key_file(path).key_id == expected.key_id
    assert read_private_key_file(str(path)).key_id == expected.key_id


def test_key_file_missing_or_garbage(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match="does not exist"):
        read_private_key_file(tmp_path / "absent.key")
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key")
    garbage.chmod(0o600)
    with pytest.raises(TrustError, match=f"{garbage}: not a PEM private key"):
        read_private_key_file(garbage)


def test_private_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    private_pem, _ = generate_key()
    monkeypatch.setenv("EDGEREG_TEST_KEY", private_pem.decode())
    assert private_key_from_env("EDGEREG_TEST_KEY").key_id == Signer.from_pem(private_pem).key_id
    monkeypatch.setenv("EDGEREG_TEST_KEY", "nope")
    with pytest.raises(TrustError, match="environment variable EDGEREG_TEST_KEY: not a PEM"):
        private_key_from_env("EDGEREG_TEST_KEY")
    monkeypatch.delenv("EDGEREG_TEST_KEY")
    with pytest.raises(TrustError, match="EDGEREG_TEST_KEY is not set"):
        private_key_from_env("EDGEREG_TEST_KEY")
