"""Shared fixtures: every test runs with its own HOME, git and DVC configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgereg.toolchain.arm import arm_dir
from edgereg.toolchain.runtimes import runtimes_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The machine's tool caches (`make venv` fills them), resolved before any test
#: gives itself a HOME of its own: the user's, or where the environment moves them.
RUNTIMES_DIR = str(runtimes_dir())
ARM_DIR = str(arm_dir())

# A real S3-protocol server (moto in server mode) on loopback: moto_endpoint, s3_env, s3_bucket.
pytest_plugins = ["s3server", "registrykit"]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point HOME, git and DVC at a fresh directory so no test reads or writes the user's.

    Returns the directory that serves as HOME.
    """
    home = tmp_path_factory.mktemp("home")
    for name, sub in (
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_DATA_HOME", ".local/share"),
        ("DVC_GLOBAL_CONFIG_DIR", "dvc-global"),
        ("DVC_SYSTEM_CONFIG_DIR", "dvc-system"),
        ("DVC_SITE_CACHE_DIR", "dvc-site-cache"),
    ):
        (home / sub).mkdir(parents=True)
        monkeypatch.setenv(name, str(home / sub))
    monkeypatch.setenv("HOME", str(home))
    # The old MNN runtimes that prove min_mnn_runtime are a cache `make venv`
    # fills (nothing downloads in a test); builds in temporary projects, and
    # their DVC stages, find it through this variable.
    monkeypatch.setenv("EDGEREG_RUNTIMES_DIR", RUNTIMES_DIR)
    # The aarch64 sysroot of ARM verification: the same kind of cache
    # (`edgereg toolchain arm install`, run by `make venv`).
    monkeypatch.setenv("EDGEREG_ARM_DIR", ARM_DIR)
    monkeypatch.delenv("EDGEREG_CACHE_DIR", raising=False)
    # DVC: no telemetry, no update check, no Studio, nothing shared between tests.
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("DVC_STUDIO_OFFLINE", "1")
    monkeypatch.delenv("DVC_STUDIO_TOKEN", raising=False)
    (home / "dvc-global" / "config").write_text(
        "[core]\n    analytics = false\n    check_update = false\n", encoding="utf-8"
    )
    # git: an empty global config, no system config, a fixed identity.
    gitconfig = home / ".gitconfig"
    gitconfig.write_text("", encoding="utf-8")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "edgereg tests")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "tests@edgereg.invalid")
    # A test run from a git hook or a DVC stage must not act on the outer repository.
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "DVC_ROOT", "DVC_STAGE"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def repo_root() -> Path:
    """The edgereg checkout (its models.toml and dvc.yaml are the worked example)."""
    return REPO_ROOT


@pytest.fixture
def small_toml() -> str:
    """The text of a small valid models.toml (tests/data/small_models.toml) to mutate."""
    return (REPO_ROOT / "tests" / "data" / "small_models.toml").read_text(encoding="utf-8")
