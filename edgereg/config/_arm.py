"""ARM verification settings: the CPU classes a variant is checked on, and what it avoids.

Declared project-wide (``[toolchain] arm``), per model (``[models.X] arm``)
or per variant (``[models.X.variants.Y] arm``); the most specific one set
wins. The class names are the device reports' ``cpu_class`` values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, StringConstraints

from edgereg.config._base import _rule_error

if TYPE_CHECKING:
    from edgereg.config._config import Config
    from edgereg.config._models import Model

#: A CPU class: what a phone's cores can do, oldest first.
ArmClass = Literal["armv8", "armv8.2", "armv9"]
ARM_CLASSES: tuple[ArmClass, ...] = ("armv8", "armv8.2", "armv9")

#: A CPU feature name as the protocol's ``avoid_cpu`` spells it (not an enum:
#: a feature named later must still validate).
CpuFeature = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")]

#: What ``arm`` means, wherever it is declared.
ARM_DESCRIPTION = (
    'CPU classes the variants are verified on under emulation (MNN\'s ARM kernels): "armv8" '
    '(Cortex-A53: no dot product), "armv8.2" (Cortex-A76: dotprod, fp16), "armv9" '
    "(Cortex-A710: dotprod, fp16, i8mm, sve2). The most specific one set wins (variant, "
    "model, [toolchain]). Default: every class for quantized variants and runtime precision "
    '"low", none for the others; [] verifies on none. See docs/operations/arm-verification.md.'
)

ArmClasses = Annotated[list[ArmClass], Field(max_length=3)]


def arm_classes(config: Config, model_name: str, variant_name: str) -> tuple[ArmClass, ...]:
    """The classes one variant is verified on: its own, else its model's, else the project's.

    With none declared: every class for a quantized variant or one hinted to
    run at ``precision = "low"`` (the kernels that differ between CPUs), none
    for float variants at normal precision (measured equal to x86 to 3e-7).
    """
    model = config.models[model_name]
    variant = model.variants[variant_name]
    for declared in (variant.arm, model.arm, config.toolchain.arm):
        if declared is not None:
            return tuple(c for c in ARM_CLASSES if c in declared)
    if variant.quantization.mode != "none" or variant.runtime.precision == "low":
        return ARM_CLASSES
    return ()


def check_instead(model: Model) -> None:
    """``instead`` names another variant of the model, one level deep, next to ``avoid_cpu``."""
    for name, variant in model.variants.items():
        where = f"variants.{name}"
        for key, classes in (("arm", variant.arm),):
            if classes is not None and len(set(classes)) != len(classes):
                raise _rule_error(f"{where}.{key}", "each CPU class may appear once")
        if variant.avoid_cpu is not None and len(set(variant.avoid_cpu)) != len(variant.avoid_cpu):
            raise _rule_error(f"{where}.avoid_cpu", "each CPU feature may appear once")
        if variant.instead is None:
            continue
        if not variant.avoid_cpu:
            raise _rule_error(
                f"{where}.instead",
                "instead names what devices with an avoided CPU feature install, so it needs "
                'avoid_cpu (such as avoid_cpu = ["i8mm"])',
            )
        other = model.variants.get(variant.instead)
        if other is None or variant.instead == name:
            raise _rule_error(
                f"{where}.instead",
                f"'{variant.instead}' is not another variant of this model "
                f"(variants: {', '.join(n for n in model.variants if n != name)})",
            )
        if other.instead is not None:
            raise _rule_error(
                f"{where}.instead",
                f"'{variant.instead}' has an instead of its own; a substitute goes one level "
                "deep (apps install it as it is)",
            )
