"""``edgereg toolchain``: commands that :mod:`edgereg.cli` registers.

``edgereg toolchain runtimes install`` is the one place that downloads an old
MNN runtime (see :mod:`edgereg.toolchain.runtimes`); builds and tests only
look for it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from edgereg import config as config_module
from edgereg.cli._common import config_option, handle_errors, json_option, stderr
from edgereg.errors import ConfigError

__all__ = ["toolchain_group"]

_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def _versions(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if not _VERSION.fullmatch(value):
            raise click.BadParameter(f"{value!r} is not an MNN version like 3.0.0")
    return values


def _declared(config_path: Path, extra: tuple[str, ...]) -> tuple[list[str], Path]:
    """Versions to act on (models.toml's minimum, then --version ones) and the cache dir."""
    from edgereg.toolchain.runtimes import runtimes_dir

    versions: list[str] = []
    if config_path.exists():
        toolchain = config_module.load(config_path).toolchain
        if toolchain.needs_runtime_proof:
            versions.append(toolchain.minimum_runtime)
    elif not extra:
        raise ConfigError(
            "no models.toml here, so no min_mnn_runtime to install",
            file=str(config_path),
            hint="run inside the project (models.toml here or in a parent folder), pass "
            "--config, or name a version with --version 3.0.0",
        )
    versions += [v for v in extra if v not in versions]
    return versions, runtimes_dir()


@click.group("toolchain")
def toolchain_group() -> None:
    """The build toolchain: old MNN runtimes and the ARM sysroot builds verify on."""


@toolchain_group.group("runtimes")
def runtimes_group() -> None:
    """Isolated MNN runtimes (one venv per version) that builds prove artifacts on.

    They live in the per-user cache every repository shares,
    ~/.cache/edgereg/runtimes/mnn-VERSION/ ($XDG_CACHE_HOME or $EDGEREG_CACHE_DIR
    moves the cache, $EDGEREG_RUNTIMES_DIR this directory alone).
    """


@runtimes_group.command("install")
@config_option
@click.option(
    "--version",
    "extra",
    multiple=True,
    callback=_versions,
    help="Also install this MNN version (repeatable).",
)
@json_option
@handle_errors
def install_command(config_path: Path, extra: tuple[str, ...], as_json: bool) -> None:
    """Install the MNN runtime of models.toml's min_mnn_runtime (and each --version).

    Each is installed once (pip, from the configured package index) and kept;
    running it again downloads nothing.
    """
    from edgereg.toolchain.runtimes import RuntimeProofError, find_runtime, install_runtime

    versions, root = _declared(config_path, extra)
    results = []
    for version in versions:
        try:
            find_runtime(version, root=root)
        except RuntimeProofError:
            stderr.print(f"MNN {version}: installing into {root} (pip)", markup=False)
        results.append(install_runtime(version, root=root))
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "version": r.runtime.version,
                        "path": str(r.runtime.path),
                        "installed": r.installed,
                        "seconds": round(r.seconds, 3),
                    }
                    for r in results
                ],
                indent=2,
            )
        )
        return
    if not results:
        click.echo(
            f"{config_path}: min_mnn_runtime is the converter's version, so no other MNN "
            "runtime is needed"
        )
    for result in results:
        state = f"installed ({result.seconds:.1f} s)" if result.installed else "already installed"
        click.echo(f"MNN {result.runtime.version}: {state} in {result.runtime.path}")


@runtimes_group.command("list")
@config_option
@json_option
@handle_errors
def list_command(config_path: Path, as_json: bool) -> None:
    """Show the runtimes models.toml needs and the ones installed."""
    from edgereg.toolchain.runtimes import RuntimeProofError, find_runtime

    needed, root = _declared(config_path, ())
    present = sorted(
        p.name.removeprefix("mnn-")
        for p in (root.glob("mnn-*") if root.is_dir() else ())
        if p.is_dir() and _VERSION.fullmatch(p.name.removeprefix("mnn-"))
    )
    rows = []
    for version in dict.fromkeys([*needed, *present]):
        try:
            path: str | None = str(find_runtime(version, root=root).path)
        except RuntimeProofError:
            path = None
        rows.append({"version": version, "needed": version in needed, "path": path})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no MNN runtimes needed or installed (cache: {root})")
    for row in rows:
        where = row["path"] or "not installed: run `edgereg toolchain runtimes install`"
        need = "needed by models.toml" if row["needed"] else "not needed"
        click.echo(f"MNN {row['version']} ({need}): {where}")


@toolchain_group.group("arm")
def arm_group() -> None:
    """The aarch64 sysroot that runs MNN's ARM kernels under QEMU (ARM verification).

    It lives in the per-user cache every repository shares,
    ~/.cache/edgereg/arm/mnn-VERSION/ ($XDG_CACHE_HOME or $EDGEREG_CACHE_DIR moves
    the cache, $EDGEREG_ARM_DIR this directory alone).
    """


def _arm_root(config_path: Path) -> tuple[str, Path]:
    from edgereg.toolchain.arm import arm_dir
    from edgereg.toolchain.versions import installed_version

    if config_path.exists():
        version = config_module.load(config_path).toolchain.mnn
    else:
        version = installed_version("mnn") or ""
        if not version:
            raise ConfigError(
                "no models.toml here and no mnn installed, so no MNN version to set up",
                file=str(config_path),
                hint="run inside the project, or pass --config",
            )
    return version, arm_dir()


@arm_group.command("install")
@config_option
@json_option
@handle_errors
def arm_install_command(config_path: Path, as_json: bool) -> None:
    """Set up the aarch64 sysroot for the pinned MNN, once (Debian arm64 python + MNN wheels).

    Needs qemu-user-static and debootstrap (`make arm-deps`). Running it
    again downloads nothing; builds never download it.
    """
    from edgereg.toolchain.arm import ArmError, find_sysroot, install_sysroot

    version, root = _arm_root(config_path)
    try:
        find_sysroot(version, root=root)
    except ArmError:
        stderr.print(
            f"MNN {version} (aarch64): installing into {root} (debootstrap, pip)", markup=False
        )
    result = install_sysroot(version, root=root)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "mnn": result.sysroot.mnn_version,
                    "path": str(result.sysroot.path),
                    "installed": result.installed,
                    "seconds": round(result.seconds, 3),
                    "size_bytes": result.sysroot.size_bytes,
                },
                indent=2,
            )
        )
        return
    state = (
        f"installed ({result.seconds:.1f} s, {result.sysroot.size_bytes / 1e6:.0f} MB)"
        if result.installed
        else "already installed"
    )
    click.echo(f"MNN {version} aarch64 sysroot: {state} in {result.sysroot.path}")


@arm_group.command("list")
@config_option
@json_option
@handle_errors
def arm_list_command(config_path: Path, as_json: bool) -> None:
    """Show the sysroot, the emulator and each CPU class with its emulated CPU."""
    from edgereg.toolchain.arm import (
        CPU_CLASSES,
        INSTALL_COMMAND,
        ArmError,
        emulated_cpu,
        find_sysroot,
        qemu_cpus,
        qemu_path,
    )

    version, root = _arm_root(config_path)
    try:
        sysroot: str | None = str(find_sysroot(version, root=root).path)
    except ArmError:
        sysroot = None
    try:
        available: tuple[str, ...] | None = qemu_cpus(qemu_path())
    except ArmError:
        available = None
    rows: list[dict[str, Any]] = []
    for spec in CPU_CLASSES.values():
        cpu = None
        if available is not None:
            try:
                cpu = emulated_cpu(spec, available)
            except ArmError:
                cpu = None
        rows.append({"class": spec.name, "cpu": cpu, "features": list(spec.features)})
    if as_json:
        click.echo(json.dumps({"mnn": version, "sysroot": sysroot, "classes": rows}, indent=2))
        return
    click.echo(
        f"MNN {version} aarch64 sysroot: " + (sysroot or f"not installed: run `{INSTALL_COMMAND}`")
    )
    for row in rows:
        shown = row["cpu"] or "not available (make arm-deps)"
        features = ", ".join(row["features"]) or "none"
        click.echo(f"{row['class']}: -cpu {shown}; MNN sees {features}")
