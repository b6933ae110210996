"""Wire formats: round trips, strict parsing, the rules between fields."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from edgereg.errors import TrustError
from edgereg.signing import Signer, TrustedKeys, generate_key
from edgereg.wire import (
    PAYLOAD_TYPE_MANIFEST,
    PAYLOAD_TYPE_RELEASE,
    PAYLOAD_TYPE_STATE,
    HistoryEvent,
    Manifest,
    ManifestEntry,
    ReleaseRecord,
    RolloutSnapshot,
    RolloutState,
    WireError,
    WireModel,
    blob_path,
    format_time,
    from_bytes,
    sign_document,
    to_bytes,
    verify_document,
)

T0 = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)
DIGEST_A = "a" * 64
DIGEST_B = "b" * 64
HINTS = {"threads": 2, "backends": ["opencl", "cpu"], "precision": "normal"}


def entry(version: str = "1.2.0", digest: str = DIGEST_A, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": version,
        "variant": "int8",
        "path": blob_path(digest),
        "sha256": digest,
        "size": 12345,
        "min_mnn_runtime": "3.6.1",
        "runtime": HINTS,
    }
    data.update(changes)
    return data


def manifest_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema_version": 1,
        "model": "digits",
        "tier": "mid",
        "sequence": 7,
        "expires": "2025-03-02T12:00:00Z",
        "stable": entry(),
        "candidate": entry("1.3.0", DIGEST_B),
        "percent": 5,
        "salt": "5f3a9c0e1b2d4c6a",
        "paused": False,
    }
    data.update(changes)
    return data


def state_data(**changes: Any) -> dict[str, Any]:
    before = {"stable": "1.2.0", "candidate": None, "percent": None, "paused": False}
    after = {"stable": "1.2.0", "candidate": "1.3.0", "percent": 5.0, "paused": False}
    data: dict[str, Any] = {
        "schema_version": 1,
        "model": "digits",
        "sequence": 8,
        "expires": "2025-03-02T12:00:00Z",
        "stable": "1.2.0",
        "candidate": "1.3.0",
        "percent": 25.0,
        "salt": "5f3a9c0e1b2d4c6a",
        "paused": False,
        "full": False,
        "history": [
            {
                "sequence": 7,
                "at": "2025-01-31T12:00:00Z",
                "actor": "alice@ci",
                "action": "publish",
                "before": before,
                "after": after,
                "forced": False,
                "note": None,
            },
            {
                "sequence": 8,
                "at": "2025-02-01T12:00:00Z",
                "actor": "alice@ci",
                "action": "rollout",
                "before": after,
                "after": {**after, "percent": 25.0},
                "forced": True,
                "note": "soak time overridden",
            },
        ],
    }
    data.update(changes)
    return data


def release_data(**changes: Any) -> dict[str, Any]:
    variant = {
        "tier": "high",
        "sha256": DIGEST_A,
        "size": 400_000,
        "metrics": {"accuracy": 0.981, "per_class_recall": {"0": 1.0}, "p50_ms": 1.5},
        "provenance": {"source_sha256": DIGEST_B, "converter": "3.6.1", "samples": [1, 2]},
        "min_mnn_runtime": "3.6.1",
        "runtime": HINTS,
    }
    data: dict[str, Any] = {
        "schema_version": 1,
        "model": "digits",
        "version": "1.3.0",
        "created": "2025-01-31T12:00:00Z",
        "variants": {
            "fp32": variant,
            "w8": {**variant, "tier": "low", "sha256": DIGEST_B, "runtime": {"threads": 1}},
        },
        "tiers": {"high": "fp32", "mid": "w8", "low": "w8"},
    }
    data.update(changes)
    return data


def _shipping_around(
    *, avoid_cpu: tuple[str, ...] | None = ("i8mm",), instead: str = "w8", w8_instead: bool = False
) -> dict[str, Any]:
    """A release whose fp32 avoids ``avoid_cpu`` and names ``instead``."""
    data = release_data()
    fp32 = {**data["variants"]["fp32"], "instead": instead}
    if avoid_cpu is not None:
        fp32["avoid_cpu"] = list(avoid_cpu)
    data["variants"]["fp32"] = fp32
    if w8_instead:
        data["variants"]["w8"] = {
            **data["variants"]["w8"],
            "avoid_cpu": ["sve2"],
            "instead": "fp32",
        }
    return data


def raw(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


# --- round trips ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "data"),
    [
        pytest.param(Manifest, manifest_data(), id="manifest-rollout"),
        pytest.param(
            Manifest,
            manifest_data(candidate=None, percent=None, salt=None),
            id="manifest-stable-only",
        ),
        pytest.param(Manifest, manifest_data(stable=None), id="manifest-first-canary"),
        pytest.param(
            Manifest,
            manifest_data(stable=None, candidate=None, percent=None, salt=None),
            id="manifest-empty",
        ),
        pytest.param(RolloutState, state_data(), id="state"),
        pytest.param(ReleaseRecord, release_data(), id="release"),
    ],
)
def test_round_trip(cls: type[WireModel], data: dict[str, Any]) -> None:
    parsed = from_bytes(cls, raw(data))
    canonical = to_bytes(parsed)
    assert from_bytes(cls, canonical) == parsed
    assert to_bytes(from_bytes(cls, canonical)) == canonical
    assert (
        canonical
        == json.dumps(
            json.loads(canonical), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
    )


def test_canonical_bytes_spell_times_with_z_and_whole_seconds() -> None:
    parsed = from_bytes(Manifest, raw(manifest_data(expires="2025-03-02T12:00:00Z")))
    assert parsed.expires == datetime(2025, 3, 2, 12, 0, tzinfo=timezone.utc)
    assert b'"expires":"2025-03-02T12:00:00Z"' in to_bytes(parsed)
    # One spelling on the wire; a Python time with a fraction is cut to the second.
    for other in ("2025-03-02T12:00:00.9Z", "2025-03-02T12:00:00+00:00", "2025-03-02t12:00:00z"):
        with pytest.raises(WireError, match="is not a time like"):
            from_bytes(Manifest, raw(manifest_data(expires=other)))
    fraction = datetime(2025, 3, 2, 12, 0, 0, 987654, tzinfo=timezone.utc)
    built = Manifest.model_validate({**manifest_data(), "expires": fraction})
    assert built.expires == parsed.expires
    assert format_time(datetime(2025, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == (
        "2025-01-01T00:00:00Z"
    )


def test_python_construction_and_defaults() -> None:
    manifest = Manifest(model="digits", tier="low", sequence=1, expires=T0, stable=entry())
    assert manifest.schema_version == 1
    assert manifest.candidate is None
    assert manifest.percent is None
    assert not manifest.paused
    assert manifest.stable is not None
    assert manifest.stable.runtime.backends == ["opencl", "cpu"]
    with pytest.raises(ValidationError):
        manifest.sequence = 2  # type: ignore[misc]  # frozen


def test_payload_types() -> None:
    assert Manifest.payload_type == PAYLOAD_TYPE_MANIFEST == "application/vnd.edgereg.manifest+json"
    assert RolloutState.payload_type == PAYLOAD_TYPE_STATE
    assert ReleaseRecord.payload_type == PAYLOAD_TYPE_RELEASE


# --- rejections --------------------------------------------------------------------


def test_a_manifest_ignores_keys_it_does_not_know_other_documents_refuse_them() -> None:
    # Forward compatibility: a newer publisher adds keys; older clients read on.
    data = manifest_data(
        extra=1,
        stable={
            **entry(),
            "url": "http://x",
            "runtime": {**entry()["runtime"], "future_hint": True},
        },
    )
    parsed = from_bytes(Manifest, json.dumps(data).encode())
    assert parsed == from_bytes(Manifest, json.dumps(manifest_data()).encode())
    state = json.loads(
        to_bytes(
            RolloutState(model="m", sequence=1, expires=datetime(2025, 3, 2, tzinfo=timezone.utc))
        )
    )
    with pytest.raises(WireError, match="extra: unknown key"):
        from_bytes(RolloutState, json.dumps({**state, "extra": 1}).encode())


MANIFEST_REJECTIONS = [
    pytest.param(
        manifest_data(extra=1, stable={**entry(), "size": "5"}),
        "stable.size: Input should be a valid integer",
        id="unknown-key-does-not-hide-a-bad-one",
    ),
    pytest.param(manifest_data(salt=None), "a candidate needs salt", id="candidate-without-salt"),
    pytest.param(
        manifest_data(percent=None, salt=None),
        "a candidate needs percent and salt",
        id="candidate-without-percent",
    ),
    pytest.param(
        manifest_data(candidate=None),
        "percent and salt may only be set with a candidate",
        id="percent-without-candidate",
    ),
    pytest.param(
        manifest_data(candidate=None, percent=None, salt=None, paused=True),
        "paused may only be true during a rollout",
        id="paused-without-candidate",
    ),
    pytest.param(
        manifest_data(expires="2025-03-02T12:00:00"), "is not a time like", id="naive-time"
    ),
    pytest.param(
        manifest_data(expires="2025-03-02T12:00:00+02:00"),
        "is not a time like",
        id="non-utc-offset",
    ),
    pytest.param(manifest_data(expires="next tuesday"), "is not a time like", id="time-garbage"),
    pytest.param(manifest_data(expires="2025-02-30T12:00:00Z"), "not a valid date", id="feb-30"),
    pytest.param(manifest_data(expires=1738324800), "expires", id="time-as-number"),
    pytest.param(manifest_data(sequence=0), "sequence", id="sequence-zero"),
    pytest.param(manifest_data(sequence="7"), "sequence", id="sequence-as-string"),
    pytest.param(manifest_data(paused=0), "paused", id="paused-as-int"),
    pytest.param(manifest_data(schema_version=2), "schema_version", id="schema-version-2"),
    pytest.param(manifest_data(percent=0), "greater than 0", id="percent-zero"),
    pytest.param(manifest_data(percent=150), "between 0 and 100", id="percent-150"),
    pytest.param(manifest_data(percent=12.345), "more than two decimals", id="percent-3-decimals"),
    pytest.param(manifest_data(salt="XYZ"), "salt", id="salt-not-hex"),
    pytest.param(manifest_data(tier="High"), "tier", id="tier-name"),
    pytest.param(
        manifest_data(candidate=entry("1.2")),
        "'1.2' is not a semantic version (MAJOR.MINOR.PATCH",
        id="not-semver",
    ),
    pytest.param(
        manifest_data(candidate=entry("1.1.0", DIGEST_B)),
        "candidate 1.1.0 must be a higher version than stable 1.2.0",
        id="candidate-below-stable",
    ),
    pytest.param(
        manifest_data(stable=entry(path=blob_path(DIGEST_B))),
        "expected 'blobs/sha256/aaaa",
        id="path-digest-mismatch",
    ),
    pytest.param(manifest_data(stable=entry(size=0)), "stable.size", id="size-zero"),
    # Finding 8: strict integers, bounded for JavaScript ports, one reading of each field.
    pytest.param(manifest_data(sequence=9.0), "sequence", id="sequence-as-float"),
    pytest.param(manifest_data(sequence=True), "sequence", id="sequence-as-bool"),
    pytest.param(manifest_data(sequence=2**53), "sequence", id="sequence-beyond-2^53-1"),
    pytest.param(manifest_data(stable=entry(size=5.0)), "stable.size", id="size-as-float"),
    pytest.param(manifest_data(stable=entry(size=2**53)), "stable.size", id="size-beyond-2^53-1"),
    pytest.param(
        manifest_data(stable={**entry(), "runtime": {"threads": 4.0}}),
        "stable.runtime.threads",
        id="threads-as-float",
    ),
    pytest.param(
        manifest_data(stable={**entry(), "runtime": {"threads": 17}}),
        "stable.runtime.threads",
        id="threads-17",
    ),
    pytest.param(
        manifest_data(stable={**entry(), "runtime": {"backends": ["cpu", "cpu"]}}),
        "each backend may appear once",
        id="backends-twice",
    ),
    pytest.param(
        manifest_data(stable=entry(version="1.0")), "not a semantic version", id="semver-short"
    ),
    pytest.param(
        manifest_data(stable=entry(version="01.0.0")),
        "not a semantic version",
        id="semver-leading-0",
    ),
    pytest.param(
        manifest_data(expires="2025-03-02T12:00:00.5Z"), "is not a time like", id="time-fraction"
    ),
    pytest.param(
        manifest_data(stable=entry(runtime={"backends": ["opencl"]})),
        'must end with "cpu"',
        id="backends-without-cpu",
    ),
]


@pytest.mark.parametrize(("data", "match"), MANIFEST_REJECTIONS)
def test_manifest_rejects(data: dict[str, Any], match: str) -> None:
    with pytest.raises(WireError, match=_literal(match)) as caught:
        from_bytes(Manifest, raw(data))
    assert caught.value.message.startswith("manifest is not valid: ")


def _literal(text: str) -> str:
    return re.escape(text)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(b"{", "manifest is not JSON", id="truncated"),
        pytest.param(b"\xff", "manifest is not JSON", id="not-utf8"),
        pytest.param(b"[]", "manifest is not valid", id="array"),
        pytest.param(b'{"model":"a","model":"b"}', "duplicate key 'model'", id="duplicate-key"),
        pytest.param(b'{"percent":NaN}', "NaN is not JSON", id="nan"),
    ],
)
def test_manifest_rejects_bad_json(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        from_bytes(Manifest, data)


def test_naive_datetime_rejected_in_python_too() -> None:
    with pytest.raises(ValidationError, match="time has no timezone"):
        Manifest(model="digits", tier="low", sequence=1, expires=datetime(2025, 1, 1))
    with pytest.raises(ValidationError, match="expected UTC"):
        Manifest(
            model="digits",
            tier="low",
            sequence=1,
            expires=datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=-5))),
        )


def test_integer_percent_accepted_from_json() -> None:
    assert from_bytes(Manifest, raw(manifest_data(percent=25))).percent == 25.0


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(
            state_data(history=list(reversed(state_data()["history"]))),
            "history sequence 7 follows 8",
            id="history-out-of-order",
        ),
        pytest.param(state_data(sequence=7), "beyond the state's 7", id="history-ahead"),
        pytest.param(
            state_data(history=[{**state_data()["history"][0], "action": "delete"}]),
            "history.0.action",
            id="unknown-action",
        ),
        pytest.param(
            state_data(history=[{**state_data()["history"][0], "actor": ""}]),
            "history.0.actor",
            id="empty-actor",
        ),
        pytest.param(state_data(salt=None), "a candidate needs salt", id="candidate-without-salt"),
        pytest.param(state_data(full="yes"), "full", id="full-not-bool"),
    ],
)
def test_state_rejects(data: dict[str, Any], match: str) -> None:
    with pytest.raises(WireError, match=_literal(match)) as caught:
        from_bytes(RolloutState, raw(data))
    assert caught.value.message.startswith("rollout state is not valid: ")


def test_state_last_change_and_snapshot() -> None:
    state = from_bytes(RolloutState, raw(state_data()))
    assert state.last_change_at() == datetime(2025, 2, 1, 12, tzinfo=timezone.utc)
    assert state.snapshot() == RolloutSnapshot(stable="1.2.0", candidate="1.3.0", percent=25)
    assert state.history[1].forced
    resigned = state.model_copy(
        update={
            "history": [
                *state.history,
                HistoryEvent(
                    sequence=9,
                    at=T0 + timedelta(days=5),
                    actor="bob",
                    action="resign",
                    before=state.snapshot(),
                    after=state.snapshot(),
                ),
            ]
        }
    )
    assert resigned.last_change_at() == state.last_change_at()  # resign is not a step
    assert RolloutState(model="digits", sequence=1, expires=T0).last_change_at() is None


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(
            release_data(tiers={"high": "fp32", "mid": "int8", "low": "w8"}),
            "tiers.mid names variant 'int8', which is not in variants",
            id="tier-names-unknown-variant",
        ),
        pytest.param(
            release_data(tiers={"high": "w8", "low": "w8"}),
            "variant 'fp32' is built for tier 'high', but tiers.high is 'w8'",
            id="variant-tier-not-mapped",
        ),
        pytest.param(release_data(variants={}), "variants", id="no-variants"),
        pytest.param(
            release_data(tier_order=["high", "low"]),
            "tier_order ['high', 'low'] must list exactly the tiers (high, low, mid)",
            id="tier-order-incomplete",
        ),
        pytest.param(release_data(version="v1.3.0"), "not a semantic version", id="version"),
        pytest.param(
            _shipping_around(instead="nope"),
            "variant 'fp32' names instead 'nope', which is not another variant (fp32, w8)",
            id="instead-unknown",
        ),
        pytest.param(
            _shipping_around(instead="fp32"),
            "variant 'fp32' names instead 'fp32', which is not another variant",
            id="instead-itself",
        ),
        pytest.param(
            _shipping_around(avoid_cpu=None), "instead ('w8') needs avoid_cpu", id="instead-alone"
        ),
        pytest.param(
            _shipping_around(avoid_cpu=("i8mm", "i8mm")),
            "avoid_cpu names a feature twice",
            id="avoid-cpu-twice",
        ),
        pytest.param(_shipping_around(avoid_cpu=()), "avoid_cpu", id="avoid-cpu-empty"),
        pytest.param(
            _shipping_around(w8_instead=True),
            "variant 'fp32' names instead 'w8', which has an instead of its own",
            id="instead-chained",
        ),
    ],
)
def test_release_rejects(data: dict[str, Any], match: str) -> None:
    with pytest.raises(WireError, match=_literal(match)):
        from_bytes(ReleaseRecord, raw(data))


def test_a_variant_carries_its_ship_around_and_leaves_it_off_when_unset() -> None:
    record = from_bytes(ReleaseRecord, raw(_shipping_around()))
    assert record.variants["fp32"].avoid_cpu == ["i8mm"]
    assert record.variants["fp32"].instead == "w8"
    assert from_bytes(ReleaseRecord, to_bytes(record)) == record
    # A variant that avoids nothing is written as before the fields existed.
    plain = to_bytes(from_bytes(ReleaseRecord, raw(release_data())))
    assert b"avoid_cpu" not in plain
    assert b"instead" not in plain


def test_tier_order_survives_canonical_json() -> None:
    written = ReleaseRecord.model_validate(release_data(tier_order=["high", "mid", "low"]))
    record = from_bytes(ReleaseRecord, to_bytes(written))
    assert list(record.tiers) == ["high", "low", "mid"]  # canonical JSON sorted the keys
    assert record.ordered_tiers() == ["high", "mid", "low"]
    # A record written before tier_order existed.
    older = from_bytes(ReleaseRecord, to_bytes(ReleaseRecord.model_validate(release_data())))
    assert older.ordered_tiers() == ["high", "low", "mid"]


def test_nan_metric_cannot_be_serialized() -> None:
    record = ReleaseRecord.model_validate(release_data())
    bad_variant = record.variants["fp32"].model_copy(update={"metrics": {"x": float("nan")}})
    bad = record.model_copy(update={"variants": {**record.variants, "fp32": bad_variant}})
    with pytest.raises(WireError, match="cannot serialize the release record"):
        to_bytes(bad)


def test_wire_error_is_a_trust_error() -> None:
    assert issubclass(WireError, TrustError)
    assert WireError.exit_code == 5


def test_manifest_entry_blob_path() -> None:
    assert ManifestEntry.model_validate(entry()).path == f"blobs/sha256/{DIGEST_A}"
    assert ReleaseRecord.model_validate(release_data()).variants["w8"].path == blob_path(DIGEST_B)


# --- signed documents ----------------------------------------------------------------


def test_sign_and_verify_document() -> None:
    signer = Signer.from_pem(generate_key()[0])
    trusted = TrustedKeys([signer.public_key])
    manifest = Manifest.model_validate(manifest_data())
    signed = sign_document(manifest, [signer])
    assert verify_document(Manifest, signed, trusted) == manifest

    release = ReleaseRecord.model_validate(release_data())
    with pytest.raises(TrustError, match=r"expected 'application/vnd\.edgereg\.manifest"):
        verify_document(Manifest, sign_document(release, [signer]), trusted)


def test_verified_envelope_with_invalid_payload_is_a_wire_error() -> None:
    from edgereg.signing import sign_envelope

    signer = Signer.from_pem(generate_key()[0])
    signed = sign_envelope(b'{"model":"digits"}', PAYLOAD_TYPE_MANIFEST, [signer])
    with pytest.raises(WireError, match="sequence: Field required"):
        verify_document(Manifest, signed, TrustedKeys([signer.public_key]))


def test_a_bundle_member_obeys_the_same_tier_rule_as_a_model_release() -> None:
    from edgereg.protocol.fields import RuntimeHints
    from edgereg.protocol.wire import BundleMember, ReleaseVariant

    def variant(tier: str) -> ReleaseVariant:
        return ReleaseVariant(
            tier=tier, sha256=DIGEST_A, size=10, min_mnn_runtime="3.0.0", runtime=RuntimeHints()
        )

    # "fast" is built for tier high, but tiers.high names "slow": refused for both kinds.
    variants = {"fast": variant("high"), "slow": variant("low")}
    tiers = {"high": "slow", "low": "slow"}
    with pytest.raises(ValidationError, match="variant 'fast' is built for tier 'high'"):
        BundleMember(version="1.0.0", variants=variants, tiers=tiers)
    with pytest.raises(ValidationError, match="variant 'fast' is built for tier 'high'"):
        ReleaseRecord(
            model="m",
            version="1.0.0",
            created=datetime(2025, 1, 1, tzinfo=timezone.utc),
            variants=variants,
            tiers=tiers,
        )
