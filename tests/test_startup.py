"""What the command line imports before it does anything: a guard on start-up, not a timer.

`edgereg --version` was 0.3-2 s of imports (models.toml's schema, the whole
protocol, rich); benchmarks/analyze.py measures the time. These tests hold
the shape that made it fast, in a fresh interpreter each: which modules a
command has loaded once it is parsed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Never needed to parse a command line or print help: the toolchain, DVC, the
# test-only statistics and anything an outside plugin could drag in.
NEVER = ["numpy", "scipy", "onnx", "onnxruntime", "MNN", "dvc", "pandas", "jinja2", "torch"]
# Not needed for --version either: models.toml's schema, pydantic, keys, rich.
NOT_FOR_VERSION = [*NEVER, "pydantic", "cryptography", "rich", "edgereg.config", "semver"]

_PROBE = """
import contextlib, io, json, sys
args = json.loads(sys.argv[1])
from edgereg.cli import main
if args is not None:
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        try:
            main(args)
        except SystemExit as exit:
            code = exit.code
    assert code == 0, (code, printed.getvalue())
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_after(args: list[str] | None) -> set[str]:
    """The modules a fresh interpreter holds after importing the CLI (and running ``args``)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return set(json.loads(done.stdout))


def _present(loaded: set[str], names: list[str]) -> list[str]:
    return [name for name in names if name in loaded]


def test_the_probe_sees_what_a_command_imports() -> None:
    # The checks below would pass on a probe that saw nothing: it must see the
    # command module a command loads, and what `edgereg --help` imports with all of them.
    assert {"click", "edgereg.cli.analyze"} <= _loaded_after(["analyze", "--help"])
    assert {"pydantic", "rich", "edgereg.config"} <= _loaded_after(["--help"])


def test_importing_the_entry_point_loads_only_click() -> None:
    assert _present(_loaded_after(None), NOT_FOR_VERSION) == []


def test_version_loads_only_click() -> None:
    loaded = _loaded_after(["--version"])
    assert _present(loaded, NOT_FOR_VERSION) == []
    # The exit codes are the protocol's; importing them must not import the rest of it.
    assert sorted(m for m in loaded if m.startswith("edgereg.protocol.")) == [
        "edgereg.protocol.errors"
    ]


def test_analyze_help_loads_only_click() -> None:
    loaded = _loaded_after(["analyze", "--help"])
    assert _present(loaded, [*NOT_FOR_VERSION, "edgereg.analysis", "edgereg.registry"]) == []


@pytest.mark.parametrize("args", [["--help"], ["build", "--help"], ["toolchain", "--help"]])
def test_help_loads_no_toolchain(args: list[str]) -> None:
    # --help imports every command's module for its one-line summary.
    assert _present(_loaded_after(args), [m for m in NEVER if m != "numpy"]) == []


def test_the_registry_loads_no_statistics() -> None:
    # Every registry command (status, publish, history, rollout) imports it; the
    # canary analysis and numpy come with the commands that run one.
    code = (
        "import sys, edgereg.registry; print([m for m in sys.modules "
        "if m.split('.')[0] == 'numpy' or m.startswith('edgereg.analysis')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "[]"


def test_every_name_of_the_protocol_package_still_resolves() -> None:
    # edgereg.protocol loads its names on first use: each must still be there, and
    # be the object of the module that defines it.
    import edgereg.protocol as protocol

    assert set(protocol._WHERE) == set(protocol.__all__)
    for name in protocol.__all__:
        module = sys.modules.get(protocol._WHERE[name]) or __import__(
            protocol._WHERE[name], fromlist=[name]
        )
        assert getattr(protocol, name) is getattr(module, name), name
    assert "decide" in dir(protocol)
    with pytest.raises(AttributeError):
        _ = protocol.no_such_name


def test_every_model_still_builds() -> None:
    # The models build their validators on first use (defer_build): one that could
    # not build would no longer fail at import but at its first use, in whatever
    # command reaches it first. Build them all here.
    import importlib
    import pkgutil

    from pydantic import BaseModel

    import edgereg

    for module in pkgutil.walk_packages(edgereg.__path__, "edgereg."):
        if module.name.startswith(("edgereg.protocol", "edgereg.config")):
            importlib.import_module(module.name)

    def subclasses(cls: type[BaseModel]) -> list[type[BaseModel]]:
        return [cls, *(sub for direct in cls.__subclasses__() for sub in subclasses(direct))]

    models = {m for m in subclasses(BaseModel) if m.__module__.startswith("edgereg.")}
    assert len(models) >= 50
    for model in sorted(models, key=lambda m: f"{m.__module__}.{m.__qualname__}"):
        model.model_rebuild(raise_errors=True)
        assert model.__pydantic_complete__, model
