"""Runtime hints and trials (decision 0008): the rule a device applies, and the entry keys.

The rule is pure (edgereg.protocol.rules.choose_runtime), so its cases are a table;
tests/vectors/hints/ holds the same rule as conformance vectors for every client.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest

from edgereg.protocol._json import canonical_json
from edgereg.protocol.fields import RuntimeHints
from edgereg.protocol.hints import HintFacts, HintRule, RuntimeTrials
from edgereg.protocol.rules import choose_runtime, cohort_bucket, hint_matches, in_cohort
from edgereg.protocol.wire import ManifestEntry, WireError, blob_path, from_bytes, to_bytes
from edgereg.wire import Manifest

DIGEST = hashlib.sha256(b"hints").hexdigest()
DECLARED = RuntimeHints(threads=4, backends=["opencl", "cpu"], precision="low")
SALT = "0d15ea5e"
ARMV9 = HintFacts(cpu_class="armv9", cores=8, soc="QTI SM8550")


def _entry(*rules: dict[str, Any]) -> ManifestEntry:
    return ManifestEntry(
        version="1.0.0",
        variant="int8",
        path=blob_path(DIGEST),
        sha256=DIGEST,
        size=100,
        min_mnn_runtime="3.6.1",
        runtime=DECLARED,
        runtime_hints=[HintRule.model_validate(rule) for rule in rules] if rules else None,
    )


def _rule(match: dict[str, Any], threads: int = 1, percent: float = 100.0) -> dict[str, Any]:
    return {
        "match": match,
        "runtime": {"threads": threads, "backends": ["cpu"]},
        "percent": percent,
        "salt": SALT,
    }


def _device(inside: bool, percent: float) -> str:
    n = 0
    while in_cohort(f"phone-{n}", SALT, percent) != inside:
        n += 1
    return f"phone-{n}"


@dataclass(frozen=True)
class Case:
    """Rules, a device, and the rule whose runtime it uses (None: the declared one)."""

    id: str
    rules: tuple[dict[str, Any], ...]
    facts: HintFacts
    rule: int | None
    matched: int | None
    device_id: str = "phone-0"


CASES = [
    Case("no-rules", (), ARMV9, None, None),
    Case(
        "first-of-two-matching", (_rule({"cpu_class": "armv9"}), _rule({"cores": 8})), ARMV9, 0, 0
    ),
    Case(
        "narrower-first-skipped",
        (_rule({"cpu_class": "armv9", "cores": 6}), _rule({"cpu_class": "armv9"}, 2)),
        ARMV9,
        1,
        1,
    ),
    Case("empty-match-is-every-device", (_rule({}),), HintFacts(), 0, 0),
    Case("class-not-known", (_rule({"cpu_class": "armv9"}),), HintFacts(cores=8), None, None),
    Case("soc-not-known", (_rule({"soc": "QTI SM8550"}),), HintFacts("armv9", 8), None, None),
    Case("cores-not-known", (_rule({"cores": 8}),), HintFacts("armv9"), None, None),
    Case("class-no-client-derives", (_rule({"cpu_class": "armv10"}),), ARMV9, None, None),
    Case("soc-exact-case", (_rule({"soc": "qti sm8550"}),), ARMV9, None, None),
    Case(
        "all-three-keys",
        (_rule({"cpu_class": "armv9", "cores": 8, "soc": "QTI SM8550"}),),
        ARMV9,
        0,
        0,
    ),
    Case("one-key-of-two-differs", (_rule({"cpu_class": "armv9", "cores": 4}),), ARMV9, None, None),
    Case(
        "unknown-match-key",
        (_rule({"cpu_class": "armv9", "gpu": "adreno"}), _rule({"cores": 8}, 2)),
        ARMV9,
        1,
        1,
    ),
    Case(
        "inside-the-rules-percent",
        (_rule({"cpu_class": "armv9"}, percent=10.0),),
        ARMV9,
        0,
        0,
        _device(True, 10.0),
    ),
    Case(
        "outside-the-rules-percent-keeps-declared-and-reads-no-later-rule",
        (_rule({"cpu_class": "armv9"}, percent=10.0), _rule({"cores": 8}, 2)),
        ARMV9,
        None,
        0,
        _device(False, 10.0),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_first_matching_rule_decides_for_its_cohort(case: Case) -> None:
    entry = _entry(*case.rules)
    choice = choose_runtime(entry, case.facts, case.device_id)
    assert (choice.rule, choice.matched) == (case.rule, case.matched)
    if case.rule is None:
        assert choice.runtime == DECLARED
    else:
        rule = case.rules[case.rule]["runtime"]
        assert choice.runtime.threads == rule["threads"]
        assert choice.runtime.backends == rule["backends"]
        assert choice.runtime.precision == DECLARED.precision  # a rule never changes it


def test_a_rules_percent_is_the_cohort_of_its_own_salt() -> None:
    """The same function as a rollout's cohort (§6), with the rule's salt: ~percent of devices."""
    entry = _entry(_rule({}, percent=12.5))
    ids = [f"device-{n}" for n in range(4000)]
    used = [d for d in ids if choose_runtime(entry, HintFacts(), d).rule == 0]
    assert used == [d for d in ids if cohort_bucket(d, SALT) < 1250]
    assert 0.10 < len(used) / len(ids) < 0.15
    # Raising the percent keeps every device already using the rule.
    wider = _entry(_rule({}, percent=50.0))
    assert all(choose_runtime(wider, HintFacts(), d).rule == 0 for d in used)


def test_a_match_key_this_client_does_not_know_is_kept_through_parsing() -> None:
    """Unknown keys are dropped everywhere in a manifest but in a rule's match (§3, §11)."""
    manifest = Manifest(
        model="digits",
        tier="mid",
        sequence=1,
        expires="2030-01-01T00:00:00Z",  # type: ignore[arg-type]
        stable=_entry(_rule({"cpu_class": "armv9"})),
    )
    data = to_bytes(manifest).replace(b'"match":{', b'"match":{"gpu":"adreno",')
    data = data.replace(b'"percent":100.0,', b'"percent":100.0,"since":"2025",')
    parsed = from_bytes(Manifest, data)
    assert isinstance(parsed.stable, ManifestEntry)
    assert parsed.stable.runtime_hints is not None
    rule = parsed.stable.runtime_hints[0]
    assert rule.match.unknown_keys() == ["gpu"]
    assert not hint_matches(rule.match, ARMV9)
    assert choose_runtime(parsed.stable, ARMV9, "phone-0").runtime == DECLARED


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"settings": []}, "settings"),
        ({"settings": [{"threads": 1, "backend": "cpu"}] * 2}, "each setting may appear once"),
        (
            {"settings": [{"threads": t, "backend": "cpu"} for t in range(1, 10)]},
            "at most 8 items",
        ),
        ({"max_runs_per_setting": 21}, "max_runs_per_setting"),
        ({"max_total_ms": 0}, "max_total_ms"),
        ({"id": "8A1CAD44"}, "id"),
    ],
)
def test_a_try_set_out_of_bounds_is_malformed(change: dict[str, Any], problem: str) -> None:
    good = RuntimeTrials.of([1, 2], ["cpu"]).model_dump(mode="json")
    entry = _entry().model_dump(mode="json", exclude_none=True)
    entry["runtime_trials"] = {**good, **change}
    with pytest.raises(WireError, match=problem):
        from_bytes(
            Manifest,
            canonical_json(
                {
                    "schema_version": 1,
                    "model": "digits",
                    "tier": "mid",
                    "sequence": 1,
                    "expires": "2030-01-01T00:00:00Z",
                    "stable": entry,
                }
            ),
        )


def test_a_try_sets_id_names_exactly_its_settings_and_bounds() -> None:
    base = RuntimeTrials.of([1, 2, 4], ["opencl", "cpu"])
    body = base.model_dump(mode="json", exclude={"id"})
    assert base.id == hashlib.sha256(canonical_json(body)).hexdigest()[:8]
    assert RuntimeTrials.of([4, 2, 1], ["cpu", "opencl"]) == base
    others = [
        RuntimeTrials.of([1, 2], ["opencl", "cpu"]),
        RuntimeTrials.of([1, 2, 4], ["cpu"]),
        RuntimeTrials.of([1, 2, 4], ["opencl", "cpu"], max_runs_per_setting=4),
        RuntimeTrials.of([1, 2, 4], ["opencl", "cpu"], max_total_ms=1999),
    ]
    assert len({base.id, *(o.id for o in others)}) == 1 + len(others)
