"""Cohorts, tiers and the entry a device runs: pure, shared bit for bit.

The registry, ``edgereg serve`` and the client SDK all decide with these
functions; a Kotlin or Swift port must reproduce :func:`cohort_bucket`,
:func:`in_cohort`, :func:`resolve_tier` and :func:`choose_runtime` (the runtime
hint rules, docs/protocol.md §11) exactly (the conformance vectors in
tests/vectors/ are the check).

Cohort rule (docs/protocol.md §6)::

    bucket = int(sha256(utf8(salt + ":" + device_id)).hexdigest()[:8], 16) % 10000
    in cohort  <=>  bucket < basis_points(percent)

``basis_points(percent)`` is the percent times 100 as an exact integer
(5 -> 500, 12.5 -> 1250, 99.99 -> 9999). Comparing the bucket with the float
``percent * 100`` instead would differ when the float product lands just
above an integer (``1.1 * 100`` is 110.00000000000001), so ports must compare
integers. A bucket below a threshold stays below any higher threshold, so
raising the percent never removes a device from the cohort while the salt
stays the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.errors import EdgeregError, ExitCode
from edgereg.protocol.fields import (
    BUCKETS,
    MAX_SAFE_INTEGER,
    RuntimeHints,
    TierRules,
    basis_points,
)
from edgereg.protocol.hints import HintFacts, HintMatch
from edgereg.protocol.patterns import NAME_RE
from edgereg.protocol.reasons import Malformed
from edgereg.protocol.wire import BundleEntry, Manifest, ManifestEntry

__all__ = [
    "DeviceProfile",
    "HintChoice",
    "NoTierError",
    "Tiers",
    "choose_entry",
    "choose_runtime",
    "cohort_bucket",
    "explain_tier",
    "hint_matches",
    "in_cohort",
    "parse_tier_file",
    "resolve_tier",
    "soc_matches",
    "tier_file",
    "tier_matches",
    "unmet_rules",
]


class NoTierError(EdgeregError):
    """A device matches none of the tiers (the tier rules have no catch-all)."""

    exit_code = ExitCode.USAGE


def cohort_bucket(device_id: str, salt: str) -> int:
    """Return the device's bucket in [0, 10000) for a rollout salt."""
    digest = hashlib.sha256((salt + ":" + device_id).encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % BUCKETS


def in_cohort(device_id: str, salt: str, percent: float) -> bool:
    """True when the device is in the candidate cohort at this percent.

    Raises:
        PercentError: ``percent`` is outside [0, 100] or has more than two decimals.
    """
    return cohort_bucket(device_id, salt) < basis_points(percent)


def choose_entry(
    manifest: Manifest, device_id: str
) -> tuple[ManifestEntry | BundleEntry, bool] | None:
    """Pick what a device should run: the candidate inside the cohort, else stable.

    A paused rollout serves stable to everyone. Without a stable entry (the
    first release of a model, published as a canary) devices outside the
    cohort get nothing yet.

    Returns:
        (entry, True when it is the candidate), or None when the device gets no model.
    """
    candidate = manifest.candidate
    if (
        candidate is not None
        and not manifest.paused
        and manifest.salt is not None
        and manifest.percent is not None
        and in_cohort(device_id, manifest.salt, manifest.percent)
    ):
        return candidate, True
    if manifest.stable is not None:
        return manifest.stable, False
    return None


@dataclass(frozen=True)
class HintChoice:
    """The runtime a device uses for an entry, and the hint rule behind it.

    Attributes:
        runtime: The declared ``runtime``, or its ``threads`` and ``backends``
            replaced by the rule's.
        rule: The index in ``runtime_hints`` of the rule whose runtime is used;
            None when the declared runtime is.
        matched: The index of the first rule the device matched, whether or not
            its cohort took it in (a device outside a rule's percent is that
            rule's comparison arm); None when no rule matched.
    """

    runtime: RuntimeHints
    rule: int | None = None
    matched: int | None = None


def hint_matches(match: HintMatch, facts: HintFacts) -> bool:
    """Whether every key a rule names equals the device's own (docs/protocol.md §11).

    A key the device does not know (None), or one this client does not know
    at all (a key added later), never matches; a rule naming no key matches
    every device of the tier.
    """
    if match.unknown_keys():
        return False
    wanted = {"cpu_class": match.cpu_class, "cores": match.cores, "soc": match.soc}
    own = {"cpu_class": facts.cpu_class, "cores": facts.cores, "soc": facts.soc}
    return all(
        own[key] is not None and own[key] == value
        for key, value in wanted.items()
        if value is not None
    )


def choose_runtime(entry: ManifestEntry, facts: HintFacts, device_id: str) -> HintChoice:
    """The runtime a device uses for ``entry``: the first matching hint rule's, or the declared.

    The first rule whose ``match`` holds decides alone: the device uses its
    runtime when it is in the rule's cohort (§6's cohort with the rule's own
    salt and percent), else the declared runtime (later rules are not read).
    No rule matches: the declared runtime.
    """
    for index, rule in enumerate(entry.runtime_hints or ()):
        if not hint_matches(rule.match, facts):
            continue
        if not in_cohort(device_id, rule.salt, rule.percent):
            return HintChoice(entry.runtime, rule=None, matched=index)
        hinted = entry.runtime.model_copy(
            update={"threads": rule.runtime.threads, "backends": list(rule.runtime.backends)}
        )
        return HintChoice(hinted, rule=index, matched=index)
    return HintChoice(entry.runtime)


class DeviceProfile(BaseModel):
    """What a device reports about itself; the input of tier and cohort choice."""

    # defer_build: each schema is built on first use, so a command pays only for the
    # models it touches (start-up time: benchmarks/analyze.py).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    device_id: str = Field(min_length=1)
    ram_mb: int = Field(ge=0)
    cpu_cores: int = Field(ge=1)
    soc: str | None = None
    os: Literal["android", "ios"] | None = None
    os_version: str | None = None
    abi: str | None = None
    mnn_runtime: str | None = Field(
        default=None, description="Version of the MNN runtime in the app, like 3.6.1."
    )


def soc_matches(pattern: str, soc: str) -> bool:
    """Match a SoC name against a ``soc_allow`` pattern.

    Case-insensitive; ``*`` matches any run of characters (also none) and
    ``?`` exactly one. Unlike fnmatch, ``[`` and ``]`` are literal, so the
    rule is the same in every language.
    """
    regex = "".join(
        ".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern.lower()
    )
    return re.fullmatch(regex, soc.lower(), flags=re.DOTALL) is not None


def tier_matches(rules: TierRules, device: DeviceProfile) -> bool:
    """True when the device meets every rule the tier sets (unset rules always hold)."""
    if rules.min_ram_mb is not None and device.ram_mb < rules.min_ram_mb:
        return False
    if rules.min_cpu_cores is not None and device.cpu_cores < rules.min_cpu_cores:
        return False
    if rules.soc_allow is not None and (
        device.soc is None or not any(soc_matches(p, device.soc) for p in rules.soc_allow)
    ):
        return False
    return rules.os is None or (device.os is not None and device.os in rules.os)


def unmet_rules(rules: TierRules, device: DeviceProfile) -> list[str]:
    """Each rule of a tier the device misses, as a phrase ("needs 8 cores, has 4")."""
    unmet = []
    if rules.min_ram_mb is not None and device.ram_mb < rules.min_ram_mb:
        unmet.append(f"needs {rules.min_ram_mb} MB RAM, has {device.ram_mb}")
    if rules.min_cpu_cores is not None and device.cpu_cores < rules.min_cpu_cores:
        unmet.append(f"needs {rules.min_cpu_cores} cores, has {device.cpu_cores}")
    if rules.soc_allow is not None and (
        device.soc is None or not any(soc_matches(p, device.soc) for p in rules.soc_allow)
    ):
        unmet.append(f"needs a SoC in {', '.join(rules.soc_allow)}, has {device.soc or 'none'}")
    if rules.os is not None and (device.os is None or device.os not in rules.os):
        unmet.append(f"needs OS {' or '.join(rules.os)}, has {device.os or 'none'}")
    return unmet


Tiers = Mapping[str, TierRules] | Iterable[tuple[str, TierRules]]
"""Tier rules best first: models.toml's ``[tiers]`` table, or a tier file's pairs."""


def _ordered(tiers: Tiers) -> list[tuple[str, TierRules]]:
    return list(tiers.items()) if isinstance(tiers, Mapping) else list(tiers)


def explain_tier(tiers: Tiers, device: DeviceProfile) -> list[str]:
    """Why a device lands in its tier: each better tier it misses, then the one it meets.

    The same walk as :func:`resolve_tier`, in words, for people (the demo, `pull`).
    """
    lines = []
    for name, rules in _ordered(tiers):
        unmet = unmet_rules(rules, device)
        if unmet:
            lines.append(f"not {name}: {'; '.join(unmet)}")
            continue
        met = []
        if rules.min_ram_mb is not None:
            met.append(f"{device.ram_mb} MB RAM >= {rules.min_ram_mb}")
        if rules.min_cpu_cores is not None:
            met.append(f"{device.cpu_cores} cores >= {rules.min_cpu_cores}")
        if rules.soc_allow is not None:
            met.append(f"SoC {device.soc} allowed")
        if rules.os is not None:
            met.append(f"OS {device.os}")
        lines.append(f"tier {name}: " + (", ".join(met) if met else "the catch-all tier"))
        break
    return lines


def resolve_tier(tiers: Tiers, device: DeviceProfile) -> str:
    """Return the first tier, best first, whose every rule the device meets.

    With a valid models.toml the last tier is a catch-all, so every device
    gets exactly one tier.

    Raises:
        NoTierError: no tier matches (the tiers have no catch-all).
    """
    ordered = _ordered(tiers)
    for name, rules in ordered:
        if tier_matches(rules, device):
            return name
    raise NoTierError(
        f"device {device.device_id!r} matches none of the tiers "
        f"{', '.join(name for name, _ in ordered) or '(none given)'}",
        hint="The last tier must be a catch-all with no rules; check [tiers] in models.toml.",
    )


# --- the tier file (docs/protocol.md §5): the tier rules an app ships, in order -------------

TIER_FILE_SCHEMA_VERSION = 1
TIER_RULE_KEYS = ("min_ram_mb", "min_cpu_cores", "soc_allow", "os")
"""The rules a tier file may set; any other key is refused (a rule a client ignored would
put devices in a better tier than the publisher meant)."""
MAX_TIER_FILE_BYTES = 64 * 1024
MAX_TIERS = 64


def tier_file(tiers: Mapping[str, TierRules] | Iterable[tuple[str, TierRules]]) -> bytes:
    """The tier file of docs/protocol.md §5: canonical JSON, the tiers as an array, best first.

    ``edgereg tiers`` writes it from models.toml's ``[tiers]``; apps ship it
    and resolve their tier from it. Order lives in the array, never in an
    object's keys (which JSON does not order), so a file rewritten with sorted
    keys still means the same.
    """
    pairs = list(tiers.items()) if isinstance(tiers, Mapping) else list(tiers)
    listed: list[dict[str, Any]] = []
    for name, rules in pairs:
        set_rules = {
            key: getattr(rules, key) for key in TIER_RULE_KEYS if getattr(rules, key) is not None
        }
        listed.append({"name": name, "rules": set_rules})
    # Pretty-printed canonical JSON: sorted keys, the array's order kept.
    text = json.dumps(
        {"schema_version": TIER_FILE_SCHEMA_VERSION, "tiers": listed},
        sort_keys=True,
        indent=2,
        ensure_ascii=False,
    )
    return (text + "\n").encode("utf-8")


def _tier_rules(where: str, raw: Any) -> TierRules:
    if not isinstance(raw, dict):
        raise Malformed(f"{where}: the rules must be an object")
    unknown = sorted(set(raw) - set(TIER_RULE_KEYS))
    if unknown:
        raise Malformed(
            f"{where}: unknown rule {unknown[0]!r} (this client knows {', '.join(TIER_RULE_KEYS)})",
            hint="A newer tier file raises schema_version; update the SDK or re-export.",
        )
    for key, low in (("min_ram_mb", 0), ("min_cpu_cores", 1)):
        if key in raw:
            value = raw[key]
            if type(value) is not int or not low <= value <= MAX_SAFE_INTEGER:
                raise Malformed(f"{where}: {key} must be an integer from {low}, got {value!r}")
    for key in ("soc_allow", "os"):
        if key in raw:
            value = raw[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise Malformed(f"{where}: {key} must be a list of strings, got {value!r}")
    if "os" in raw and not set(raw["os"]) <= {"android", "ios"}:
        raise Malformed(f"{where}: os may hold android and ios only, got {raw['os']!r}")
    return TierRules.model_validate(raw)


def parse_tier_file(data: bytes) -> list[tuple[str, TierRules]]:
    """The tiers of a tier file, best first (docs/protocol.md §5).

    Raises:
        Malformed: not strict JSON, not ``{"schema_version": 1, "tiers": [...]}``
            (an object of tiers is refused: its key order means nothing), a
            name twice or not a name, an unknown rule, a rule of the wrong
            type, or a last tier that is not a catch-all.
    """
    if len(data) > MAX_TIER_FILE_BYTES:
        raise Malformed(f"the tier file is {len(data)} bytes, more than {MAX_TIER_FILE_BYTES}")
    try:
        document = strict_json_loads(data)
    except (ValueError, RecursionError) as exc:
        raise Malformed(f"the tier file is not strict JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("tiers"), list):
        raise Malformed(
            'the tier file must be {"schema_version": 1, "tiers": [{"name", "rules"}, ...]}, '
            "the tiers an array best first",
            hint="Export it with `edgereg tiers --out tiers.json`; an object of tiers is "
            "refused because JSON does not order an object's keys.",
        )
    if type(document.get("schema_version")) is not int or (
        document["schema_version"] != TIER_FILE_SCHEMA_VERSION
    ):
        raise Malformed(
            f"the tier file's schema_version is {document.get('schema_version')!r}; this client "
            f"reads {TIER_FILE_SCHEMA_VERSION}"
        )
    unknown = sorted(set(document) - {"schema_version", "tiers"})
    if unknown:
        raise Malformed(f"the tier file has an unknown key {unknown[0]!r}")
    listed = document["tiers"]
    if not 1 <= len(listed) <= MAX_TIERS:
        raise Malformed(f"the tier file must list 1 to {MAX_TIERS} tiers, it lists {len(listed)}")
    tiers: list[tuple[str, TierRules]] = []
    seen: set[str] = set()
    for index, item in enumerate(listed):
        where = f"tiers[{index}]"
        if not isinstance(item, dict) or set(item) != {"name", "rules"}:
            raise Malformed(f'{where} must be {{"name": ..., "rules": {{...}}}}')
        name = item["name"]
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise Malformed(f"{where}: {name!r} is not a tier name")
        if name in seen:
            raise Malformed(f"{where}: tier {name!r} is listed twice")
        seen.add(name)
        tiers.append((name, _tier_rules(f"{where} ({name})", item["rules"])))
    last_name, last = tiers[-1]
    if not last.is_catch_all:
        raise Malformed(
            f"the last tier, {last_name!r}, sets rules: the last tier must be a catch-all "
            "so that every device gets one"
        )
    return tiers
