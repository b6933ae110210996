"""Which toolchain is installed, and whether it is the one models.toml pins.

Versions come from package metadata (:mod:`importlib.metadata`): importing
MNN just to ask its version would print to stdout and load a native library.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

from edgereg.errors import ToolchainError

#: The packages whose version decides what a build produces.
TOOLCHAIN_PACKAGES = ("mnn", "onnx", "onnxruntime")

#: Stage named in errors raised here.
STAGE = "pin check"


def installed_version(package: str) -> str | None:
    """Return the installed version of ``package``, or None if it is absent."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def installed_versions(packages: tuple[str, ...] = TOOLCHAIN_PACKAGES) -> dict[str, str]:
    """Return ``{package: version}`` for every one of ``packages`` installed.

    Args:
        packages: Distribution names to look up.

    Returns:
        The versions found; a package that is not installed is left out.
    """
    found = {name: installed_version(name) for name in packages}
    return {name: version for name, version in found.items() if version is not None}


def check_versions(pinned: Mapping[str, str]) -> None:
    """Require every pinned package to be installed at exactly its pinned version.

    Args:
        pinned: ``{package: version}`` from models.toml ``[toolchain]``.

    Raises:
        ToolchainError: One or more packages differ or are missing; the
            message lists every one, with the installed and pinned versions.
    """
    problems: list[str] = []
    fixes: list[str] = []
    for package in sorted(pinned):
        want = pinned[package]
        have = installed_version(package)
        if have == want:
            continue
        fixes.append(f"{package}=={want}")
        if have is None:
            problems.append(
                f"{package} {want} is pinned in models.toml [toolchain] but is not installed; "
                f"install the pinned version (pip install {package}=={want}) or remove the pin"
            )
        else:
            problems.append(
                f"{package} {want} is pinned in models.toml [toolchain] but {have} is installed; "
                f"install the pinned version (pip install {package}=={want}) or update the pin"
            )
    if problems:
        raise ToolchainError(
            "\n".join(problems),
            stage=STAGE,
            hint=f"pip install {' '.join(fixes)}",
        )
