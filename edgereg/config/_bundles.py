"""[bundles.NAME]: models that ship together."""

from __future__ import annotations

from pydantic import Field, field_validator

from edgereg.config._base import _Strict
from edgereg.config._metrics import MAX_METRICS, AppMetric
from edgereg.config._rollout import RolloutPolicy
from edgereg.protocol.fields import Name, Requirements, SemVer


class Bundle(_Strict):
    """Models that ship together: one version, one rollout, installed as one set."""

    version: SemVer
    models: list[Name] = Field(
        min_length=1, description="The member models, each declared under [models]."
    )
    description: str = ""
    requires: Requirements | None = Field(
        default=None, description="App and OS versions the bundle needs, beyond its members'."
    )
    metrics: dict[Name, AppMetric] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        description="App metrics the app records for the bundle as a whole (at most 16).",
    )
    rollout: RolloutPolicy | None = Field(
        default=None, description="This bundle's rollout policy; the global one when unset."
    )

    @field_validator("models")
    @classmethod
    def _unique_members(cls, value: list[str]) -> list[str]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"each model may appear once; repeated: {', '.join(repeated)}")
        return value
