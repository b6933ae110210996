"""What every models.toml table shares: strictness and the cross-field rule error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from edgereg.config._names import DEFAULT_CONFIG_FILE, DEFAULT_TRUSTED_KEYS, NO_MODELS_NOTE
from edgereg.protocol.fields import MAX_MEMORY_MB

__all__ = ["DEFAULT_CONFIG_FILE", "DEFAULT_TRUSTED_KEYS", "NO_MODELS_NOTE"]


# The upper bound of every duration and size in models.toml (docs/models-toml.md#limits).
# Past them a value is a typo, not a plan, and arithmetic on it breaks: 1e308 hours is
# no timedelta, 1.7e308 MB is no byte count.
#: Hours (soak times, the revert window): a year.
MAX_HOURS = 8760.0
#: Milliseconds (latency budgets): an hour.
MAX_MS = 3_600_000.0
#: Sizes and memory in MB or MiB (budgets, tier limits, RAM): 1 TiB, what any document carries.
MAX_MB = float(MAX_MEMORY_MB)


class _Strict(BaseModel):
    # strict: "0.5" is not a number and 4.0 is not a thread count; a budget of
    # inf is no budget at all. defer_build: each schema is built on first use, so a
    # command pays only for the tables it reads (start-up time: benchmarks/analyze.py).
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False, defer_build=True
    )


# A cross-field rule broken: pydantic reports such errors at the table that was
# validated, so the error carries the key (relative to that table) it is about.
_RULE_ERROR = "edgereg_rule"


def _rule_error(key: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(_RULE_ERROR, "{message}", {"key": key, "message": message})
