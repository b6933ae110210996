"""The CPU features a device has, for fit rule (e), and the coarse class reports carry.

docs/protocol.md §7 names the features (``dotprod``, ``fp16``, ``i8mm``, ``bf16``,
``sve2``, ``sme``) and how each platform reads them; the reference client reads
the ``Features`` line of ``/proc/cpuinfo`` on aarch64 Linux (the kernel's hwcap
names) and says the empty set on x86_64, where no ARM feature applies. An app
may pass its own set instead (tests and the fleet simulator do).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from pathlib import Path

from edgereg.protocol.fields import CPU_FEATURE_PATTERN

__all__ = [
    "ARM_MACHINES",
    "HWCAP_FEATURES",
    "X86_MACHINES",
    "check_features",
    "cpu_class",
    "detect_cpu_features",
    "features_from_cpuinfo",
]

HWCAP_FEATURES: dict[str, str] = {
    "asimddp": "dotprod",
    "asimdhp": "fp16",
    "fphp": "fp16",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve2": "sve2",
    "sme": "sme",
}
"""Linux hwcap name (``/proc/cpuinfo`` ``Features``) -> the protocol's feature name."""

ARM_MACHINES = frozenset({"aarch64", "arm64", "armv8l", "armv8b"})
X86_MACHINES = frozenset({"x86_64", "amd64"})


def features_from_cpuinfo(text: str) -> frozenset[str]:
    """The protocol's feature names in a ``/proc/cpuinfo`` text (every core's line, united)."""
    found: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "features":
            found.update(HWCAP_FEATURES[w] for w in value.split() if w in HWCAP_FEATURES)
    return frozenset(found)


def detect_cpu_features(
    machine: str | None = None, cpuinfo: Path = Path("/proc/cpuinfo")
) -> frozenset[str] | None:
    """This machine's CPU features, or None when they cannot be read (rule (e) then skipped).

    Args:
        machine: ``platform.machine()`` by default.
        cpuinfo: Where Linux lists the features.
    """
    arch = (machine if machine is not None else platform.machine()).lower()
    if arch in X86_MACHINES:
        return frozenset()
    if arch in ARM_MACHINES:
        try:
            return features_from_cpuinfo(cpuinfo.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            # Not Linux, or /proc hidden (a sandbox): unknown, never "none".
            return None
    return None


def check_features(features: Iterable[str]) -> frozenset[str]:
    """The features an app passed, each checked against the name rule.

    Raises:
        ValueError: a name that no manifest could ever name (``I8MM``, ``""``).
    """
    if isinstance(features, str):
        raise ValueError("cpu_features is a set of names, not one string")
    names = frozenset(features)
    for name in sorted(names):
        if not isinstance(name, str) or not re.fullmatch(CPU_FEATURE_PATTERN, name):
            raise ValueError(
                f"cpu feature {name!r} is not a feature name: a lowercase letter or digit, "
                "then up to 31 lowercase letters, digits, '_' or '-' (like i8mm)"
            )
    return names


def cpu_class(features: frozenset[str] | None, machine: str | None = None) -> str | None:
    """The coarse class a report carries (docs/protocol.md §11), never the features.

    ``armv9`` with ``i8mm`` or ``sve2``; ``armv8.2`` with ``dotprod`` or ``fp16``;
    else ``armv8`` on ARM (or when any ARM feature was named), ``x86_64`` on
    x86_64, ``other`` otherwise. None when the features were not said.
    """
    if features is None:
        return None
    if features & {"i8mm", "sve2"}:
        return "armv9"
    if features & {"dotprod", "fp16"}:
        return "armv8.2"
    arch = (machine if machine is not None else platform.machine()).lower()
    if features & set(HWCAP_FEATURES.values()) or arch in ARM_MACHINES:
        return "armv8"
    if arch in X86_MACHINES:
        return "x86_64"
    return "other"
