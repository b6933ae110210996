"""Runtime trials and runtime hints of a manifest entry (docs/protocol.md §3, §11; decision 0008).

Two keys an entry may carry beside its declared ``runtime``:

- ``runtime_trials``: the settings (``{threads, backend}``, at most
  :data:`MAX_TRIAL_SETTINGS`) a device may time the golden probe under after
  an install, the bounds of that trial, and the set's ``id``;
- ``runtime_hints``: ordered rules ``{match, runtime, percent, salt}`` that
  give a class of devices another runtime than the declared one
  (:func:`~edgereg.protocol.rules.choose_runtime` is the rule a client applies).

Types only (no rule that needs the cohort): :mod:`~edgereg.protocol.wire`
imports them, and :mod:`~edgereg.protocol.rules` imports the wire.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints, field_validator

from edgereg.protocol._json import canonical_json
from edgereg.protocol.fields import (
    BACKENDS_SCHEMA,
    Backend,
    Percent,
    Salt,
    check_backends,
)

__all__ = [
    "CPU_CLASS_PATTERN",
    "DEFAULT_MAX_RUNS_PER_SETTING",
    "DEFAULT_MAX_TOTAL_MS",
    "MAX_HINT_RULES",
    "MAX_RUNS_PER_SETTING",
    "MAX_SOC_LENGTH",
    "MAX_TOTAL_MS",
    "MAX_TRIAL_SETTINGS",
    "SOC_PATTERN",
    "HintFacts",
    "HintMatch",
    "HintRule",
    "HintRuntime",
    "RuntimeTrials",
    "TrialSetting",
    "trial_set_id",
]

MAX_TRIAL_SETTINGS = 8
"""Settings a try-set offers at most (the cross product of its threads and backends)."""
DEFAULT_MAX_RUNS_PER_SETTING = 5
"""Warm runs of the probe per setting and install, when models.toml does not say."""
MAX_RUNS_PER_SETTING = 20
DEFAULT_MAX_TOTAL_MS = 2000
"""Milliseconds a device spends on one install's trial at most, when models.toml does not say."""
MAX_TOTAL_MS = 10_000
MAX_HINT_RULES = 32
"""Rules an entry's ``runtime_hints`` holds at most (a tier's classes: cpu class x cores x SoC
families that measured apart; 32 rules of the longest keys are about 6 KiB of the 64 KiB a
manifest may take)."""
MAX_SOC_LENGTH = 64

CPU_CLASS_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,31}$"
"""A ``cpu_class`` (§11): the report's pattern, so a class a client derives later is a name."""
SOC_PATTERN = r"^[!-~]([ -~]{0,62}[!-~])?$"
"""An SoC family: 1 to 64 printable ASCII characters, inner spaces allowed (``QTI SM8550``)."""

Threads = Annotated[int, Strict(), Field(ge=1, le=16)]
TrialId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8}$")]
CpuClassName = Annotated[str, StringConstraints(pattern=CPU_CLASS_PATTERN)]
Soc = Annotated[str, StringConstraints(pattern=SOC_PATTERN)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class TrialSetting(_Wire):
    """One setting a device may time: a thread count on one backend."""

    threads: Threads = Field(description="Inference threads, 1 to 16.")
    backend: Backend


class RuntimeTrials(_Wire):
    """The settings an entry offers a device to time after an install (``runtime_trials``)."""

    id: TrialId = Field(
        description="8 lowercase hex: the first 8 hex digits of the SHA-256 of the canonical "
        "JSON of this object without `id`; new exactly when the settings or bounds change. "
        "Clients compare it, never recompute it."
    )
    settings: list[TrialSetting] = Field(
        min_length=1,
        max_length=MAX_TRIAL_SETTINGS,
        description="The settings, 1 to 8, each once (the publisher writes them sorted by "
        "backend, then threads).",
    )
    max_runs_per_setting: Annotated[int, Strict()] = Field(
        default=DEFAULT_MAX_RUNS_PER_SETTING,
        ge=1,
        le=MAX_RUNS_PER_SETTING,
        description="Warm runs of the probe per setting and install, 1 to 20; absent: 5.",
    )
    max_total_ms: Annotated[int, Strict()] = Field(
        default=DEFAULT_MAX_TOTAL_MS,
        ge=1,
        le=MAX_TOTAL_MS,
        description="Milliseconds one install's trial may take at most, 1 to 10000; absent: 2000.",
    )

    @field_validator("settings")
    @classmethod
    def _each_once(cls, value: list[TrialSetting]) -> list[TrialSetting]:
        seen = [(s.threads, s.backend) for s in value]
        if len(set(seen)) != len(seen):
            raise ValueError("each setting may appear once")
        return value

    @classmethod
    def of(
        cls,
        threads: Iterable[int],
        backends: Iterable[str],
        *,
        max_runs_per_setting: int = DEFAULT_MAX_RUNS_PER_SETTING,
        max_total_ms: int = DEFAULT_MAX_TOTAL_MS,
    ) -> RuntimeTrials:
        """The try-set of models.toml's ``runtime.try``: the cross product, sorted, its id derived.

        Raises:
            pydantic.ValidationError: a setting or bound out of range, more than 8 settings.
        """
        settings = sorted({(b, t) for t in threads for b in backends})
        body: dict[str, Any] = {
            "max_runs_per_setting": max_runs_per_setting,
            "max_total_ms": max_total_ms,
            "settings": [{"backend": b, "threads": t} for b, t in settings],
        }
        return cls.model_validate({**body, "id": trial_set_id(body)})


def trial_set_id(body: dict[str, Any]) -> str:
    """The id of a try-set: the first 8 hex of SHA-256 over the canonical JSON of ``body``.

    ``body`` is the ``runtime_trials`` object without its ``id`` (settings and
    bounds, every key written), so the id changes exactly when one of them does.
    """
    return hashlib.sha256(canonical_json(body)).hexdigest()[:8]


class HintMatch(_Wire):
    """Which devices a hint rule is for; every key given must equal the device's own.

    Unknown keys are kept (not dropped as elsewhere in a manifest): a rule
    naming a key this client does not know never matches (§11).
    """

    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)

    cpu_class: CpuClassName | None = Field(
        default=None,
        description="The device's CPU class (§11): armv8, armv8.2, armv9, x86_64, other.",
    )
    cores: Annotated[int, Strict()] | None = Field(
        default=None, ge=1, le=1024, description="The device's CPU core count, 1 to 1024."
    )
    soc: Soc | None = Field(
        default=None,
        description="The device's SoC family as its platform names it (§11), compared exactly.",
    )

    def unknown_keys(self) -> list[str]:
        """The keys of this match that this client does not know."""
        return sorted(self.model_extra or {})


class HintRuntime(_Wire):
    """What a hint rule's devices use instead of the declared ``threads`` and ``backends``."""

    threads: Threads = Field(description="Inference threads, 1 to 16.")
    backends: list[Backend] = Field(
        min_length=1,
        description='Backends to try in order, each once, ending with "cpu".',
        json_schema_extra=BACKENDS_SCHEMA,
    )

    @field_validator("backends")
    @classmethod
    def _cpu_last(cls, value: list[str]) -> list[str]:
        return check_backends(value)


class HintRule(_Wire):
    """One rule of ``runtime_hints``: a device class, its runtime, and the share using it."""

    match: HintMatch
    runtime: HintRuntime
    percent: Percent = Field(
        description="The share of the matching devices that use the rule (§6's cohort with "
        "the rule's salt); the others keep the declared runtime."
    )
    salt: Salt


@dataclass(frozen=True)
class HintFacts:
    """What a device knows of itself for the hint rules (None: not known).

    Attributes:
        cpu_class: Its CPU class as §11 derives it from its features.
        cores: Its CPU core count.
        soc: Its SoC family, as its platform names it.
    """

    cpu_class: str | None = None
    cores: int | None = None
    soc: str | None = None
