"""Arms of the canary analysis written by hand, as the report store gives them."""

from __future__ import annotations

from edgereg.reports.summary import ArmSummary, Histogram, MetricTally, Tally

EVENT_FIELDS = ("probe_failed", "load_failed", "reverted", "confirmed", "stalled", "first_start")
HISTOGRAM_FIELDS = {
    "load_ms": "load_ms",
    "inference_p50_ms": "inference_ms",
    "memory_peak_mb": "memory_peak_mb",
}


def arm(
    arm_name: str,
    devices: int,
    *,
    tier: str = "high",
    version: str | None = None,
    unit: str = "vision",
    metrics: dict[str, MetricTally] | None = None,
    **fields: object,
) -> ArmSummary:
    """An arm whose every device sits in a network of its own (as the fleet simulation's).

    ``aged_devices``, ``aged_reverted``, ``aged_stalled`` and ``aged_first_start``
    describe the installs old enough to have crash-looped. ``metrics``: statistic
    name (a guardrail's) -> its tally.
    """
    events = {name: int(fields.pop(name)) for name in EVENT_FIELDS if name in fields}  # type: ignore[call-overload]
    # Networks, where a row says so: ``sources`` networks in all, ``<event>_sources``
    # of them with the event (each wholly); else each device is a network of its own.
    networks = int(fields.pop("sources", devices))  # type: ignore[call-overload]
    fields.pop("sourced_devices", None)
    network_events = {
        name: float(fields.pop(f"{name}_sources", events.get(name, 0)))  # type: ignore[arg-type]
        for name in EVENT_FIELDS
    }
    histograms = {
        HISTOGRAM_FIELDS[name]: fields.pop(name)
        for name in list(fields)
        if name in HISTOGRAM_FIELDS
    }
    aged: Tally | None = None
    if "aged_devices" in fields:
        aged_devices = int(fields.pop("aged_devices"))  # type: ignore[call-overload]
        aged_events = {
            name: int(fields.pop(f"aged_{name}", 0))  # type: ignore[call-overload]
            for name in ("reverted", "stalled", "first_start", "confirmed")
        }
        aged = Tally(
            aged_devices,
            int(fields.pop("aged_sources", aged_devices)),  # type: ignore[call-overload]
            aged_events,
            {
                name: float(fields.pop(f"aged_{name}_sources", count))  # type: ignore[arg-type]
                for name, count in aged_events.items()
            },
        )
    assert not fields, f"unknown arm fields: {sorted(fields)}"
    return ArmSummary(
        unit,
        tier,
        arm_name,  # type: ignore[arg-type]
        version or ("1.1.0" if arm_name == "candidate" else "1.0.0"),
        Tally(devices, networks, events, network_events),
        aged,
        {name: Histogram.of_devices(h) for name, h in histograms.items()},  # type: ignore[arg-type]
        dict(metrics or {}),
    )
