"""Cohorts, tiers and rollout steps: the pure rules registry, server and client share."""

from __future__ import annotations

import functools
import hashlib
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgereg import config as config_module
from edgereg.config import TierRules
from edgereg.errors import EdgeregError
from edgereg.rollout import (
    DeviceProfile,
    PercentError,
    basis_points,
    check_percent,
    check_soak,
    choose_entry,
    cohort_bucket,
    in_cohort,
    next_step,
    parse_percent,
    resolve_tier,
    soc_matches,
    tier_matches,
)
from edgereg.wire import Manifest, blob_path

REPO = Path(__file__).resolve().parent.parent
SALT = "5f3a9c0e1b2d4c6a"


def _hand_bucket(salt: str, device_id: str) -> int:
    # The rule written out once more, independent of edgereg.rollout.
    return int(hashlib.sha256((salt + ":" + device_id).encode("utf-8")).hexdigest()[:8], 16) % 10000


# --- golden vectors: a Kotlin or Swift port must give the same answers ------------------

GOLDEN = [
    # (salt, device_id, percent, bucket, in cohort)
    (SALT, "device-6644", 1.1, 110, False),  # 1.1 * 100 is 110.00000000000001 in floats
    (SALT, "device-6644", 1.11, 110, True),
    (SALT, "device-5137", 5, 499, True),
    (SALT, "device-1418", 5, 500, False),
    (SALT, "device-1418", 5.01, 500, True),
    (SALT, "a", 68.3, 6830, False),
    (SALT, "a", 68.31, 6830, True),
    (SALT, "android-1234", 99.5, 6874, True),
    (SALT, "ios-ABCDEF", 48, 4800, False),
    (SALT, "ios-ABCDEF", 48.01, 4800, True),
    (SALT, "ünïcode-device", 2.89, 289, False),  # salt and id are hashed as UTF-8
    (SALT, "ünïcode-device", 2.9, 289, True),
    (SALT, "0f8fad5b-d9cb-469f-a165-70867728950e", 100, 3367, True),
    (SALT, "0f8fad5b-d9cb-469f-a165-70867728950e", 0, 3367, False),
]


@pytest.mark.parametrize(("salt", "device_id", "percent", "bucket", "expected"), GOLDEN)
def test_golden_vectors(
    salt: str, device_id: str, percent: float, bucket: int, expected: bool
) -> None:
    assert _hand_bucket(salt, device_id) == bucket
    assert cohort_bucket(device_id, salt) == bucket
    assert in_cohort(device_id, salt, percent) is expected


def test_first_eight_hex_digits_of_sha256() -> None:
    digest = hashlib.sha256(f"{SALT}:a".encode()).hexdigest()
    assert digest[:8] == "da5114ce"
    assert int("da5114ce", 16) % 10000 == cohort_bucket("a", SALT) == 6830


# --- cohort properties -----------------------------------------------------------------

device_ids = st.text(min_size=1, max_size=64)
salts = st.text(alphabet="0123456789abcdef", min_size=8, max_size=32)
points = st.integers(0, 10000)


@settings(max_examples=500)
@given(device_id=device_ids, salt=salts, low=points, high=points)
def test_raising_percent_never_removes_a_device(
    device_id: str, salt: str, low: int, high: int
) -> None:
    low, high = sorted((low, high))
    if in_cohort(device_id, salt, low / 100):
        assert in_cohort(device_id, salt, high / 100)


@given(device_id=device_ids, salt=salts)
def test_zero_admits_nobody_and_hundred_everybody(device_id: str, salt: str) -> None:
    assert not in_cohort(device_id, salt, 0)
    assert in_cohort(device_id, salt, 100)
    assert 0 <= cohort_bucket(device_id, salt) < 10000


def test_every_two_decimal_percent_maps_to_its_basis_points() -> None:
    for point in range(10001):
        assert basis_points(point / 100) == point
        assert basis_points(float(f"{point / 100:.2f}")) == point


@pytest.mark.parametrize("percent", [1, 5, 25, 50, 99.5])
def test_cohort_fraction_within_one_point(percent: float) -> None:
    rng = random.Random(20250131)
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(100_000)]
    inside = sum(in_cohort(device_id, SALT, percent) for device_id in ids)
    assert abs(inside / len(ids) * 100 - percent) < 1


def test_a_new_salt_draws_a_new_cohort() -> None:
    ids = [f"device-{i}" for i in range(2000)]
    first = {d for d in ids if in_cohort(d, SALT, 10)}
    second = {d for d in ids if in_cohort(d, "00112233aabbccdd", 10)}
    assert len(first & second) < len(first) / 2


# --- percentages ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5%", 5.0),
        ("5", 5.0),
        ("12.5%", 12.5),
        ("0.01%", 0.01),
        ("100%", 100.0),
        ("100", 100.0),
        (" 25 % ", 25.0),
        ("99.99%", 99.99),
        ("007%", 7.0),
    ],
)
def test_parse_percent(text: str, expected: float) -> None:
    assert parse_percent(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "0%",
        "0",
        "0.00%",
        "150%",
        "100.01%",
        "abc",
        "",
        "%",
        "-5%",
        "5%%",
        "1e1",
        "nan",
        "inf",
        "5.%",
        "5,5%",
        "five",
    ],
)
def test_parse_percent_rejects(text: str) -> None:
    with pytest.raises(PercentError) as caught:
        parse_percent(text)
    assert caught.value.message == (
        f"--canary must be a percentage greater than 0 and at most 100, like 5%; got {text!r}"
    )


def test_parse_percent_error_text_and_option_name() -> None:
    with pytest.raises(PercentError) as caught:
        parse_percent("abc")
    assert str(caught.value) == (
        "--canary must be a percentage greater than 0 and at most 100, like 5%; got 'abc'"
    )
    assert caught.value.exit_code == 2
    assert isinstance(caught.value, EdgeregError)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(PercentError, match=r"^--to must be"):
        parse_percent("150%", option="--to")
    with pytest.raises(PercentError, match=r"with at most two decimals; got '12\.345%'"):
        parse_percent("12.345%")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, "greater than 0"),
        (-1, "between 0 and 100"),
        (100.5, "between 0 and 100"),
        (float("nan"), "between 0 and 100"),
        (float("inf"), "between 0 and 100"),
        (12.345, "more than two decimals"),
        (True, "must be a number"),
        ("5", "must be a number"),
    ],
)
def test_check_percent_rejects(value: Any, match: str) -> None:
    with pytest.raises(PercentError, match=match):
        check_percent(value)


def test_basis_points_are_exact() -> None:
    assert basis_points(1.1) == 110
    assert basis_points(0.29) == 29
    assert basis_points(99.99) == 9999
    assert basis_points(12.5) == 1250
    assert basis_points(100) == 10000


# --- tiers --------------------------------------------------------------------------------

RULED_TIERS = {
    "flagship": TierRules(min_ram_mb=8192, min_cpu_cores=8, soc_allow=["Snapdragon 8*", "A1?"]),
    "apple": TierRules(os=["ios"]),
    "gpu": TierRules(min_ram_mb=4096, soc_allow=["*dimensity*", "exynos [0-9]"]),
    "mid": TierRules(min_ram_mb=3072, min_cpu_cores=4),
    "low": TierRules(),
}


@functools.cache
def repo_tiers() -> dict[str, TierRules]:
    return config_module.load(REPO / "models.toml").tiers


def device(**changes: Any) -> DeviceProfile:
    data: dict[str, Any] = {"device_id": "d1", "ram_mb": 2048, "cpu_cores": 2}
    data.update(changes)
    return DeviceProfile(**data)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        pytest.param(device(ram_mb=8192, cpu_cores=8), "high", id="flagship"),
        pytest.param(device(ram_mb=6144, cpu_cores=8), "high", id="exactly-high"),
        pytest.param(device(ram_mb=6143, cpu_cores=8), "mid", id="just-below-high-ram"),
        pytest.param(device(ram_mb=16384, cpu_cores=6), "mid", id="ram-without-cores"),
        pytest.param(device(ram_mb=3072, cpu_cores=4), "mid", id="exactly-mid"),
        pytest.param(device(ram_mb=3071, cpu_cores=8), "low", id="below-mid-ram"),
        pytest.param(device(ram_mb=0, cpu_cores=1), "low", id="anything"),
    ],
)
def test_resolve_tier_with_repo_tiers(profile: DeviceProfile, expected: str) -> None:
    assert resolve_tier(repo_tiers(), profile) == expected


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        pytest.param(
            device(ram_mb=12288, cpu_cores=8, soc="snapdragon 8 gen 3"), "flagship", id="soc-case"
        ),
        pytest.param(device(ram_mb=12288, cpu_cores=8, soc="A17"), "flagship", id="soc-question"),
        pytest.param(
            device(ram_mb=12288, cpu_cores=8, soc="A170", os="ios"), "apple", id="question-is-one"
        ),
        pytest.param(device(ram_mb=12288, cpu_cores=8), "mid", id="soc-unknown"),
        pytest.param(device(os="ios"), "apple", id="os"),
        pytest.param(device(ram_mb=4096, soc="MediaTek Dimensity 9000"), "gpu", id="soc-infix"),
        pytest.param(device(ram_mb=4096, soc="exynos 9"), "low", id="brackets-are-literal"),
        pytest.param(device(ram_mb=4096, soc="Exynos [0-9]"), "gpu", id="brackets-match-self"),
        pytest.param(device(os="android", ram_mb=3072, cpu_cores=4), "mid", id="android-mid"),
    ],
)
def test_resolve_tier_with_soc_and_os_rules(profile: DeviceProfile, expected: str) -> None:
    assert resolve_tier(RULED_TIERS, profile) == expected


@pytest.mark.parametrize(
    ("pattern", "soc", "expected"),
    [
        ("Snapdragon 8*", "SNAPDRAGON 8 GEN 2", True),
        ("Snapdragon 8*", "Snapdragon 888", True),
        ("Snapdragon 8*", "Snapdragon 7", False),
        ("*", "", True),
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("a.c", "abc", False),  # regex characters are literal
        ("tensor g3", "Tensor G3", True),
        ("tensor", "Tensor G3", False),  # the whole name must match
    ],
)
def test_soc_matches(pattern: str, soc: str, expected: bool) -> None:
    assert soc_matches(pattern, soc) is expected


profiles = st.builds(
    DeviceProfile,
    device_id=st.text(min_size=1, max_size=20),
    ram_mb=st.integers(0, 65536),
    cpu_cores=st.integers(1, 32),
    soc=st.one_of(
        st.none(),
        st.sampled_from(["Snapdragon 8 Gen 3", "A17", "Dimensity 9200", "Exynos 2400", "x"]),
        st.text(max_size=20),
    ),
    os=st.sampled_from([None, "android", "ios"]),
    os_version=st.one_of(st.none(), st.text(max_size=8)),
    abi=st.one_of(st.none(), st.sampled_from(["arm64-v8a", "armeabi-v7a", "x86_64"])),
    mnn_runtime=st.one_of(st.none(), st.sampled_from(["3.6.1", "2.9.0"])),
)


@settings(max_examples=300)
@given(profile=profiles)
def test_every_device_resolves_to_exactly_one_tier(profile: DeviceProfile) -> None:
    for tiers in (repo_tiers(), RULED_TIERS):
        tier = resolve_tier(tiers, profile)
        names = list(tiers)
        # The chosen tier matches and no better tier does: first match, hence exactly one.
        assert tier_matches(tiers[tier], profile)
        assert not any(tier_matches(tiers[name], profile) for name in names[: names.index(tier)])


@settings(max_examples=300)
@given(profile=profiles)
def test_the_tier_explanation_tells_the_same_walk_as_resolve_tier(profile: DeviceProfile) -> None:
    from edgereg.protocol.rules import explain_tier, unmet_rules

    for tiers in (repo_tiers(), RULED_TIERS):
        tier = resolve_tier(tiers, profile)
        names = list(tiers)
        lines = explain_tier(tiers, profile)
        # One "not <tier>" line per better tier, each naming what the device misses,
        # then the tier it lands in.
        assert [line.split(":")[0] for line in lines] == [
            *(f"not {name}" for name in names[: names.index(tier)]),
            f"tier {tier}",
        ]
        for name in names[: names.index(tier)]:
            assert unmet_rules(tiers[name], profile)
        assert unmet_rules(tiers[tier], profile) == []


def test_no_matching_tier_is_a_clear_error() -> None:
    with pytest.raises(EdgeregError, match=r"matches none of the tiers high") as caught:
        resolve_tier({"high": TierRules(min_ram_mb=8192)}, device())
    assert caught.value.hint is not None
    assert "catch-all" in caught.value.hint


def test_device_profile_is_strict_and_frozen() -> None:
    with pytest.raises(ValueError, match="extra"):
        DeviceProfile(device_id="d", ram_mb=1, cpu_cores=1, gpu="adreno")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="os"):
        device(os="windows")
    with pytest.raises(ValueError, match="device_id"):
        device(device_id="")


# --- choosing stable or candidate -----------------------------------------------------------


def _entry(version: str, digest: str) -> dict[str, Any]:
    return {
        "version": version,
        "variant": "int8",
        "path": blob_path(digest),
        "sha256": digest,
        "size": 10,
        "min_mnn_runtime": "3.6.1",
        "runtime": {"threads": 2, "backends": ["cpu"]},
    }


STABLE = _entry("1.2.0", "a" * 64)
CANDIDATE = _entry("1.3.0", "b" * 64)
INSIDE = "device-5137"  # bucket 499
OUTSIDE = "device-1418"  # bucket 500


def manifest(**changes: Any) -> Manifest:
    data: dict[str, Any] = {
        "model": "digits",
        "tier": "mid",
        "sequence": 3,
        "expires": "2030-01-01T00:00:00Z",
        "stable": STABLE,
        "candidate": CANDIDATE,
        "percent": 5,
        "salt": SALT,
    }
    data.update(changes)
    return Manifest.model_validate(data)


@pytest.mark.parametrize(
    ("changes", "device_id", "expected"),
    [
        pytest.param({}, INSIDE, ("1.3.0", True), id="inside-cohort"),
        pytest.param({}, OUTSIDE, ("1.2.0", False), id="outside-cohort"),
        pytest.param({"percent": 5.01}, OUTSIDE, ("1.3.0", True), id="raised-percent"),
        pytest.param({"paused": True}, INSIDE, ("1.2.0", False), id="paused"),
        pytest.param(
            {"candidate": None, "percent": None, "salt": None},
            INSIDE,
            ("1.2.0", False),
            id="no-rollout",
        ),
        pytest.param({"percent": 100}, OUTSIDE, ("1.3.0", True), id="full-percent"),
        pytest.param({"stable": None}, INSIDE, ("1.3.0", True), id="first-canary-inside"),
        pytest.param({"stable": None}, OUTSIDE, None, id="first-canary-outside"),
        pytest.param({"stable": None, "paused": True}, INSIDE, None, id="first-canary-paused"),
        pytest.param(
            {"stable": None, "candidate": None, "percent": None, "salt": None},
            INSIDE,
            None,
            id="nothing-published",
        ),
    ],
)
def test_choose_entry(
    changes: dict[str, Any], device_id: str, expected: tuple[str, bool] | None
) -> None:
    chosen = choose_entry(manifest(**changes), device_id)
    if expected is None:
        assert chosen is None
    else:
        assert chosen is not None
        entry, is_candidate = chosen
        assert (entry.version, is_candidate) == expected


# --- rollout steps and soak ------------------------------------------------------------------

STEPS = [5, 25, 50, 100]


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (0.5, 5.0),
        (5, 25.0),
        (10, 25.0),  # between steps after a manual `rollout --to 10%`
        (25, 50.0),
        (50, 100.0),
        (100, None),
        (49.99, 50.0),
    ],
)
def test_next_step(current: float, expected: float | None) -> None:
    assert next_step(STEPS, current) == expected


def test_next_step_after_a_policy_without_100() -> None:
    assert next_step([1, 10], 10) is None


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        ([], "at least one step"),
        ([5, 5, 50], "strictly increasing"),
        ([50, 25], "strictly increasing"),
        ([0, 50], "greater than 0"),
        ([5, 150], "between 0 and 100"),
    ],
)
def test_next_step_rejects_bad_steps(steps: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        next_step(steps, 1)


T0 = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


@pytest.mark.parametrize(
    ("now", "soak", "remaining"),
    [
        (T0, DAY, DAY),
        (T0 + timedelta(hours=20), DAY, timedelta(hours=4)),
        (T0 + DAY, DAY, None),
        (T0 + 2 * DAY, DAY, None),
        (T0, timedelta(0), None),
        (T0 - timedelta(hours=1), DAY, DAY + timedelta(hours=1)),  # clock behind: still waits
    ],
)
def test_check_soak(now: datetime, soak: timedelta, remaining: timedelta | None) -> None:
    assert check_soak(T0, now, soak) == remaining


def test_check_soak_compares_instants_across_offsets() -> None:
    later = (T0 + timedelta(hours=23)).astimezone(timezone(timedelta(hours=-8)))
    assert check_soak(T0, later, DAY) == timedelta(hours=1)


def test_check_soak_refuses_naive_times() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        check_soak(T0, datetime(2025, 2, 1), DAY)


def test_percent_text_regex_is_plain_ascii_digits() -> None:
    # Unicode digits (Arabic-Indic five) are not a percentage a release manager types.
    with pytest.raises(PercentError):
        parse_percent("\u0665%")
