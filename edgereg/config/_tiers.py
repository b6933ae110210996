"""[tiers.NAME]: which devices a tier holds (the protocol's rules) and what it allows."""

from __future__ import annotations

from pydantic import Field

from edgereg.config._base import MAX_MB
from edgereg.protocol.fields import TierRules


class Tier(TierRules):
    """Which devices belong to a tier (a tier with no rules is the catch-all), and its limits.

    The limits never reach the wire: they refuse a variant at validate or
    publish time, before any device sees it.
    """

    max_model_memory_mb: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MB,
        description="Most memory (MiB) one model may take on this tier's devices: a variant "
        "whose measured peak is higher is refused at validate and publish (a bundle's "
        "members are summed: they load together).",
    )
