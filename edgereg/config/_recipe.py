"""A variant resolved against its model: the one place its overrides are decided.

A variant may override its model's source (with its own input shapes),
evaluation and calibration sets, budgets (merged per key) and minimum MNN
runtime; only an int8 variant reads a calibration set. The build, the DVC
stage writer, the I/O contract and the recipe digest all read
:class:`ResolvedVariant`, so they cannot disagree about either rule.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from edgereg.config._budgets import Budgets
from edgereg.config._inputs import CalibrationSet, InputSpec, PinnedFile
from edgereg.config._models import ConverterOptions, Quantization
from edgereg.protocol._json import canonical_json
from edgereg.protocol.fields import RuntimeHints

if TYPE_CHECKING:
    from edgereg.config._config import Config


@dataclass(frozen=True)
class ResolvedVariant:
    """One variant with its model's settings filled in: what one build reads.

    Attributes:
        model: The model's name.
        name: The variant's name.
        tier: The device tier it is built for.
        source: The ONNX it converts: its own, else the model's.
        inputs: Input specs of that source: its own (only with its own source),
            else the model's.
        evaluation: The evaluation set: its own, else the model's.
        calibration: The calibration set, for int8 only (its own, else the
            model's); None for every other variant, which never reads one.
        precision: fp32 or fp16.
        quantization: The quantization table.
        converter: Converter options.
        runtime: Runtime hints shipped in the release.
        budgets: The model's budgets with the variant's set keys replaced.
        min_mnn_runtime: The MNN runtime it must be proven on: its own, else
            the toolchain's minimum.
    """

    model: str
    name: str
    tier: str
    source: PinnedFile
    inputs: tuple[InputSpec, ...]
    evaluation: PinnedFile
    calibration: CalibrationSet | None
    precision: Literal["fp32", "fp16"]
    quantization: Quantization
    converter: ConverterOptions
    runtime: RuntimeHints
    budgets: Budgets
    min_mnn_runtime: str


def resolve(config: Config, model_name: str, variant_name: str) -> ResolvedVariant:
    """Resolve one variant of ``config`` against its model (see :meth:`Config.resolve`).

    Raises:
        KeyError: no such model or variant.
    """
    model = config.models[model_name]
    variant = model.variants[variant_name]
    return ResolvedVariant(
        model=model_name,
        name=variant_name,
        tier=variant.tier,
        source=variant.source or model.source,
        inputs=tuple(variant.inputs or model.inputs),
        evaluation=variant.evaluation or model.evaluation,
        # Only int8 reads the calibration set; keeping it out of the other
        # variants keeps their recipes (the id derives from its digest) in step
        # with dvc.yaml, which does not rerun them when the set changes.
        calibration=(variant.calibration or model.calibration)
        if variant.reads_calibration
        else None,
        precision=variant.precision,
        quantization=variant.quantization,
        converter=variant.converter,
        # The declared hints only: a try-set changes what devices time, never the bytes.
        runtime=variant.runtime.hints,
        budgets=model.budgets.merged(variant.budgets),
        min_mnn_runtime=variant.min_mnn_runtime or config.toolchain.minimum_runtime,
    )


def recipe(config: Config, model_name: str, variant_name: str) -> dict[str, Any]:
    """Everything that determines a variant's bytes and gates (see :meth:`Config.recipe`)."""
    model = config.models[model_name]
    resolved = resolve(config, model_name, variant_name)
    calibration = resolved.calibration
    return {
        "model": model_name,
        "variant": variant_name,
        "task": model.task.model_dump(),
        "state": [pair.model_dump() for pair in model.state],
        "source": resolved.source.model_dump(),
        "inputs": [spec.model_dump() for spec in resolved.inputs],
        "outputs": [spec.model_dump() for spec in model.outputs],
        "calibration": calibration.model_dump() if calibration else None,
        "evaluation": resolved.evaluation.model_dump(),
        "precision": resolved.precision,
        "quantization": resolved.quantization.model_dump(),
        "converter": resolved.converter.model_dump(),
        "runtime": resolved.runtime.model_dump(),
        "budgets": _budgets_record(resolved.budgets),
        # ARM verification changes gates, not bytes: leaving it out keeps the
        # recipe digest (and the artifact's derived id) of existing builds.
        "toolchain": config.toolchain.model_dump(exclude={"arm", "arm_samples"}),
    }


#: Budgets added after recipes were first recorded: left out while unset, so a
#: models.toml that does not use them keeps its recipes, ids and artifact bytes.
_LATER_BUDGETS = ("max_memory_mb", "max_first_inference_ms")


def _budgets_record(budgets: Budgets) -> dict[str, Any]:
    record = budgets.model_dump()
    for key in _LATER_BUDGETS:
        if record.get(key) is None:
            record.pop(key, None)
    return record


def recipe_digest(config: Config, model_name: str, variant_name: str) -> str:
    """sha256 of the protocol's canonical JSON of :func:`recipe` (docs/decisions/)."""
    return hashlib.sha256(canonical_json(recipe(config, model_name, variant_name))).hexdigest()
