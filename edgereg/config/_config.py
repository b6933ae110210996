"""The whole models.toml: cross-table rules and what commands ask of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from edgereg.config import _recipe
from edgereg.config._base import DEFAULT_CONFIG_FILE, NO_MODELS_NOTE, _rule_error, _Strict
from edgereg.config._bundles import Bundle
from edgereg.config._inputs import PinnedFile
from edgereg.config._metrics import AppMetric
from edgereg.config._models import Model
from edgereg.config._recipe import ResolvedVariant
from edgereg.config._registry import Registry, Reports
from edgereg.config._rollout import RolloutPolicy
from edgereg.config._tiers import Tier
from edgereg.config._toolchain import Toolchain
from edgereg.protocol.fields import Name


class Config(_Strict):
    """The whole models.toml."""

    toolchain: Toolchain
    registry: Registry = Field(default_factory=Registry)
    rollout: RolloutPolicy = Field(
        default_factory=RolloutPolicy, description="Default rollout policy of every model."
    )
    tiers: dict[Name, Tier] = Field(
        min_length=1, description="Device tiers, best first; the last one is the catch-all."
    )
    models: dict[Name, Model] = Field(
        default_factory=dict,
        description="The models to build; none yet right after `edgereg init`.",
    )
    bundles: dict[Name, Bundle] = Field(
        default_factory=dict,
        description="Models that ship together as one unit (one version, one rollout).",
    )
    reports: Reports = Field(default_factory=Reports)

    _path: Path = PrivateAttr(default=Path(DEFAULT_CONFIG_FILE))

    @model_validator(mode="after")
    def _tiers_and_variants(self) -> Config:
        tier_names = list(self.tiers)
        *upper, last = tier_names
        if not self.tiers[last].is_catch_all:
            raise _rule_error(
                f"tiers.{last}",
                f"the last tier ('{last}') must be a catch-all with no rules, so every "
                "device gets a tier; add an empty [tiers.<name>] table at the end",
            )
        for name in upper:
            if self.tiers[name].is_catch_all:
                raise _rule_error(
                    f"tiers.{name}",
                    f"tier '{name}' has no rules, so it catches every device and the "
                    "tiers after it can never match; give it rules or move it last",
                )
        for model_name, model in self.models.items():
            by_tier: dict[str, str] = {}
            for variant_name, variant in model.variants.items():
                where = f"models.{model_name}.variants.{variant_name}"
                if variant.tier not in self.tiers:
                    raise _rule_error(
                        f"{where}.tier",
                        f"unknown tier '{variant.tier}'; declared tiers: {', '.join(tier_names)}",
                    )
                if variant.tier in by_tier:
                    raise _rule_error(
                        f"{where}.tier",
                        f"tier '{variant.tier}' already has variant "
                        f"'{by_tier[variant.tier]}'; each tier takes exactly one variant "
                        "of a model",
                    )
                by_tier[variant.tier] = variant_name
                own = variant.min_mnn_runtime
                release = Toolchain._release
                if own is not None and not (
                    release(self.toolchain.minimum_runtime)
                    <= release(own)
                    <= release(self.toolchain.mnn)
                ):
                    raise _rule_error(
                        f"{where}.min_mnn_runtime",
                        f"{own} is outside {self.toolchain.minimum_runtime} (the toolchain's "
                        f"min_mnn_runtime) .. {self.toolchain.mnn} (the converter)",
                    )
                if (
                    variant.reads_calibration
                    and variant.calibration is None
                    and model.calibration is None
                ):
                    raise _rule_error(
                        f"{where}.quantization",
                        "int8 quantization needs a calibration set; "
                        f"add [models.{model_name}.calibration] with path and sha256",
                    )
            if last not in by_tier:
                raise _rule_error(
                    f"models.{model_name}.variants",
                    f"no variant for the catch-all tier '{last}', so "
                    "devices there would get no model; add a variant with "
                    f'tier = "{last}" (lower tiers have no tier below to fall back to)',
                )
        self._check_bundles()
        self._check_metric_guardrails()
        return self

    def _check_metric_guardrails(self) -> None:
        """Every guardrail on an app metric names a metric that a unit it governs declares.

        A unit's own ``[*.rollout.guardrails]`` judges that unit, which must declare the
        metric; the global ones judge every unit without its own policy that declares
        the metric (the others have nothing to judge), and at least one must.
        """
        units: dict[str, tuple[str, Any]] = {
            **{
                name: (f"models.{name}", m)
                for name, m in self.models.items()
                if self.bundle_of(name) is None
            },
            **{name: (f"bundles.{name}", b) for name, b in self.bundles.items()},
        }
        governed = {
            name: where_unit for name, where_unit in units.items() if where_unit[1].rollout is None
        }
        for name, (where, unit) in units.items():
            if unit.rollout is not None:
                self._check_metric_policy(
                    f"{where}.rollout.guardrails", unit.rollout.guardrails, {name: (where, unit)}
                )
        if governed:
            self._check_metric_policy("rollout.guardrails", self.rollout.guardrails, governed)

    @staticmethod
    def _check_metric_policy(
        table: str, guardrails: Any, units: dict[str, tuple[str, Any]]
    ) -> None:
        for guardrail_name, guardrail in guardrails.metric_guardrails().items():
            key = f"{table}.{guardrail_name}"
            declaring = [
                (where, unit.metrics[guardrail.metric])
                for where, unit in units.values()
                if guardrail.metric in unit.metrics
            ]
            if not declaring:
                names = ", ".join(where for where, _ in units.values())
                raise _rule_error(
                    f"{key}.metric",
                    f"names app metric '{guardrail.metric}', which no unit it judges declares "
                    f"({names}); declare it, e.g. [{next(iter(units.values()))[0]}.metrics."
                    f'{guardrail.metric}] kind = "rate", or fix the name',
                )
            for _, declared in declaring:
                guardrail.check_against(declared, key)

    def _check_bundles(self) -> None:
        member_of: dict[str, str] = {}
        for bundle_name, bundle in self.bundles.items():
            if bundle_name in self.models:
                raise _rule_error(
                    f"bundles.{bundle_name}",
                    f"'{bundle_name}' is also a model; bundles and models share one namespace "
                    "in the registry, so give the bundle another name",
                )
            for index, member in enumerate(bundle.models):
                if member not in self.models:
                    known = ", ".join(self.models) or "none"
                    raise _rule_error(
                        f"bundles.{bundle_name}.models.{index}",
                        f"unknown model '{member}'; models: {known}",
                    )
                if member in member_of:
                    raise _rule_error(
                        f"bundles.{bundle_name}.models.{index}",
                        f"model '{member}' is already in bundle '{member_of[member]}'; a model "
                        "ships in at most one bundle (one rollout decides what devices run)",
                    )
                member_of[member] = bundle_name
                if self.models[member].metrics:
                    raise _rule_error(
                        f"models.{member}.metrics",
                        f"model '{member}' ships in bundle '{bundle_name}', whose release is "
                        f"what devices install and report on: declare its app metrics under "
                        f"[bundles.{bundle_name}.metrics] instead",
                    )

    def bundle_of(self, model_name: str) -> str | None:
        """The bundle a model ships in, or None when it ships on its own."""
        for bundle_name, bundle in self.bundles.items():
            if model_name in bundle.models:
                return bundle_name
        return None

    @property
    def path(self) -> Path:
        """The models.toml this configuration was loaded from."""
        return self._path

    @property
    def root(self) -> Path:
        """The directory relative paths in the file are resolved against."""
        return self._path.parent

    def unit_metrics(self, unit: str) -> dict[str, AppMetric]:
        """The app metrics a model or bundle declares (none for an unknown name)."""
        found = self.models.get(unit) or self.bundles.get(unit)
        return dict(found.metrics) if found is not None else {}

    def rollout_policy(self, model_name: str) -> RolloutPolicy:
        """The rollout policy of a model: its own, else the global one.

        A model published from elsewhere (not in this file) gets the global one.
        """
        unit = self.models.get(model_name) or self.bundles.get(model_name)
        return (unit.rollout if unit is not None else None) or self.rollout

    def trusted_key_paths(self) -> list[Path]:
        """The files and directories ``[registry] trusted_keys`` names, resolved."""
        paths = []
        for entry in self.registry.trusted_keys:
            path = Path(entry.removeprefix("file://"))
            paths.append(path if path.is_absolute() else self.root / path)
        return paths

    def resolve_path(self, ref: PinnedFile) -> Path:
        """Return the local path a pinned file refers to."""
        raw = ref.path.removeprefix("file://")
        path = Path(raw)
        return path if path.is_absolute() else self.root / path

    def tier_variants(self, model_name: str) -> dict[str, tuple[str, bool]]:
        """Map every tier to the variant its devices get.

        Returns:
            tier name -> (variant name, True when the tier falls back to the
            variant of a lower tier because it has none of its own).
        """
        model = self.models[model_name]
        own = {variant.tier: name for name, variant in model.variants.items()}
        result: dict[str, tuple[str, bool]] = {}
        fallback: str | None = None
        for tier in reversed(list(self.tiers)):
            if tier in own:
                fallback = own[tier]
                result[tier] = (fallback, False)
            else:
                assert fallback is not None  # the catch-all always has a variant
                result[tier] = (fallback, True)
        return {tier: result[tier] for tier in self.tiers}

    def notes(self) -> list[str]:
        """Things worth knowing that are not errors (no models yet, tier fallbacks)."""
        if not self.models:
            return [NO_MODELS_NOTE]
        notes = []
        for model_name, model in self.models.items():
            specs = [("", model.inputs)] + [
                (f"variants.{name}.", variant.inputs)
                for name, variant in model.variants.items()
                if variant.inputs is not None
            ]
            for prefix, inputs in specs:
                for index, spec in enumerate(inputs):
                    if spec.kind == "image" and (spec.mean is None or spec.std is None):
                        missing = " and ".join(
                            k for k in ("mean", "std") if getattr(spec, k) is None
                        )
                        notes.append(
                            f"warning: models.{model_name}.{prefix}inputs.{index} "
                            f"('{spec.name}'): image input without {missing}: pixels reach "
                            "the model as 0..255; if it was trained on normalised images, "
                            "declare the mean and std it was trained with"
                        )
            for tier, (variant, fell_back) in self.tier_variants(model_name).items():
                if fell_back:
                    notes.append(
                        f"models.{model_name}: tier '{tier}' has no variant of its own and "
                        f"falls back to '{variant}' (the variant of the next lower tier)"
                    )
        return notes

    def resolve(self, model_name: str, variant_name: str) -> ResolvedVariant:
        """One variant with its model's settings filled in: what its build reads.

        The one place a variant's overrides of its model (source and inputs,
        evaluation and calibration sets, budgets, minimum runtime) are decided,
        and that only int8 reads the calibration set.

        Raises:
            KeyError: no such model or variant.
        """
        return _recipe.resolve(self, model_name, variant_name)

    def minimum_runtime(self, model_name: str, variant_name: str) -> str:
        """The MNN runtime a variant must be proven on: its own, else the toolchain's."""
        return self.resolve(model_name, variant_name).min_mnn_runtime

    def recipe(self, model_name: str, variant_name: str) -> dict[str, Any]:
        """Everything that determines a variant's bytes and gates, resolved.

        Model-level settings are merged with the variant's overrides, so two
        variants with the same recipe build the same artifact.
        """
        return _recipe.recipe(self, model_name, variant_name)

    def recipe_digest(self, model_name: str, variant_name: str) -> str:
        """sha256 of the canonical JSON of :meth:`recipe`."""
        return _recipe.recipe_digest(self, model_name, variant_name)
