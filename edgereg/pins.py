"""The sha256 pins of models.toml against the files on disk: which are stale, and refreshing them.

A pin (``source = { path = "...", sha256 = "..." }``) is what every build
checks first; a file changed on purpose (a re-exported model, a relabelled
evaluation set) needs its pin updated. :func:`check_pins` says which pins no
longer match; :func:`update_pins` rewrites exactly those digests in the text
of models.toml, leaving every comment and every other byte as it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgereg._files import atomic_write, sha256_file
from edgereg.config import Config, PinnedFile
from edgereg.errors import ConfigError

__all__ = ["Pin", "check_pins", "update_pins"]


@dataclass(frozen=True)
class Pin:
    """One pinned file and what is on disk.

    Attributes:
        key: Where models.toml pins it (``models.vad.evaluation``).
        path: The path as models.toml writes it.
        pinned: The sha256 models.toml holds.
        actual: The file's sha256 now, or None when it is missing.
    """

    key: str
    path: str
    pinned: str
    actual: str | None

    @property
    def stale(self) -> bool:
        """The file exists and has other bytes than the pin says."""
        return self.actual is not None and self.actual != self.pinned

    @property
    def missing(self) -> bool:
        """The file is not there."""
        return self.actual is None

    def describe(self) -> str:
        """One line: what changed."""
        if self.actual is None:
            return f"{self.key}: {self.path} is missing"
        if self.stale:
            return (
                f"{self.key}: {self.path} changed: pinned sha256 {self.pinned[:12]}…, "
                f"the file has {self.actual[:12]}…"
            )
        return f"{self.key}: {self.path} matches its pin"


def _refs(config: Config, models: Sequence[str] | None) -> Iterator[tuple[str, PinnedFile]]:
    for name, model in config.models.items():
        if models and name not in models:
            continue
        base = f"models.{name}"
        yield f"{base}.source", model.source
        yield f"{base}.evaluation", model.evaluation
        if model.calibration is not None:
            yield f"{base}.calibration", model.calibration
        for key, ref in model.task.pinned_files().items():
            yield f"{base}.task.{key}", ref
        for variant_name, variant in model.variants.items():
            where = f"{base}.variants.{variant_name}"
            for field in ("source", "evaluation", "calibration"):
                ref = getattr(variant, field)
                if ref is not None:
                    yield f"{where}.{field}", ref


def check_pins(config: Config, models: Sequence[str] | None = None) -> list[Pin]:
    """Every pin of ``models`` (all when None) against its file, in models.toml order.

    Raises:
        ConfigError: a model named in ``models`` is not in models.toml.
    """
    unknown = [name for name in models or () if name not in config.models]
    if unknown:
        raise ConfigError(
            f"no model {', '.join(repr(n) for n in unknown)}; models: "
            f"{', '.join(config.models) or 'none'}",
            file=str(config.path),
        )
    found: list[Pin] = []
    for key, ref in _refs(config, models):
        path = config.resolve_path(ref)
        found.append(Pin(key, ref.path, ref.sha256, sha256_file(path) if path.is_file() else None))
    return found


def update_pins(config: Config, models: Sequence[str] | None = None) -> list[Pin]:
    """Write each stale pin's new sha256 into models.toml; return the pins that changed.

    Only the digest next to the pin's own path is replaced, so two pins that
    happened to hold the same digest are updated independently.

    Raises:
        ConfigError: unknown model, a pinned file is missing (nothing to pin
            to), or a pin written in a form this cannot find in the text
            (then nothing is written).
    """
    pins = check_pins(config, models)
    missing = [pin for pin in pins if pin.missing]
    if missing:
        raise ConfigError(
            "cannot pin a missing file: " + "; ".join(pin.describe() for pin in missing),
            file=str(config.path),
            hint="Restore the file (`dvc pull` for a DVC-tracked one) or fix its path.",
        )
    stale = [pin for pin in pins if pin.stale]
    if not stale:
        return []
    path = Path(config.path)
    text = path.read_text(encoding="utf-8")
    # One rewrite per (path, digest): a model and a variant pinning the same file
    # are both updated by it.
    for pin in {(pin.path, pin.pinned): pin for pin in stale}.values():
        assert pin.actual is not None
        quoted = re.escape(pin.path)
        # path then sha256, or sha256 then path, in one inline or standard table.
        patterns = [
            rf'(path\s*=\s*"{quoted}"[^{{}}\[]*?sha256\s*=\s*"){pin.pinned}(")',
            rf'(sha256\s*=\s*"){pin.pinned}("[^{{}}\[]*?path\s*=\s*"{quoted}")',
        ]
        for pattern in patterns:
            text, count = re.subn(pattern, rf"\g<1>{pin.actual}\g<2>", text)
            if count:
                break
        else:
            raise ConfigError(
                f"cannot find the pin of {pin.key} ({pin.path}) in the text to rewrite it",
                file=str(config.path),
                key_path=pin.key,
                hint=f'Set sha256 = "{pin.actual}" there by hand.',
            )
    atomic_write(path, text)
    return stale
