"""What the command line imports before it does anything: a guard on start-up, not a timer.

`edgereg --version` was 0.3-2 s of imports (models.toml's schema, the whole
protocol, rich); benchmarks/analyze.py measures the time. These tests hold
the shape that made it fast, in a fresh interpreter each: which modules a
command has loaded once it is parsed, and, for `pull`, `status`, `analyze`
and `publish`, once it has run for real (issue 32; benchmarks/startup.py
measures those against curl and the targets).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Never needed to parse a command line or print help: the toolchain, DVC, the
# test-only statistics and anything an outside plugin could drag in.
NEVER = ["numpy", "scipy", "onnx", "onnxruntime", "MNN", "dvc", "pandas", "jinja2", "torch"]
# Not needed for --version either: models.toml's schema, pydantic, keys, rich.
NOT_FOR_VERSION = [*NEVER, "pydantic", "cryptography", "rich", "edgereg.config", "semver"]

_PROBE = """
import contextlib, io, json, sys
args, expected = json.loads(sys.argv[1])
from edgereg.cli import main
if args is not None:
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        try:
            main(args)
        except SystemExit as exit:
            code = exit.code
    assert code == expected, (code, printed.getvalue())
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_after(args: list[str] | None, *, cwd: Path = ROOT, exit_code: int = 0) -> set[str]:
    """The modules a fresh interpreter holds after importing the CLI (and running ``args``).

    ``args`` run as a real command (in ``cwd``), which must end with ``exit_code``.
    """
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([args, exit_code])],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
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


@pytest.mark.parametrize(
    ("package", "example"),
    [("edgereg.protocol", "decide"), ("edgereg.config", "load"), ("edgereg.registry", "Registry")],
)
def test_every_name_of_a_lazy_package_still_resolves(package: str, example: str) -> None:
    # These packages load their names on first use: each must still be there, and
    # be the object of the module that defines it.
    import importlib

    lazy = importlib.import_module(package)
    assert set(lazy._WHERE) == set(lazy.__all__)
    for name in lazy.__all__:
        module = importlib.import_module(lazy._WHERE[name])
        assert getattr(lazy, name) is getattr(module, name), name
    assert example in dir(lazy)
    with pytest.raises(AttributeError):
        _ = lazy.no_such_name


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


# --- commands that start fast (issue 32): each imports only what it uses ---------------

# What no command that only reads the registry or installs a model needs: publishing,
# serving, the build, the canary statistics and the report store.
NOT_FOR_READING = [
    *NEVER,
    "edgereg.build",
    "edgereg.registry._release",
    "edgereg.registry._bundle",
    "edgereg.registry._auto",
    "edgereg.protocol.build_outputs",
    "edgereg.serve",
    "edgereg.analysis",
    "edgereg.reports",
    "sqlite3",
    # the rollout rules'.
    "semver",
    "edgereg.registry._transitions",
]
# models.toml's schema past [registry]: its tables and the whole file.
SCHEMA = ["edgereg.config._config", "edgereg.config._models", "edgereg.tasks"]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A registry of two models (stable and canary), and its publisher's public key file."""
    from servekit import make_registry

    base = tmp_path_factory.mktemp("startup")
    made = make_registry(base / "registry")
    key = base / "publisher.pem"
    key.write_bytes(made.signer.public_pem())
    return base / "registry", key


def test_pull_loads_the_client_and_nothing_else(
    registry: tuple[Path, Path], tmp_path: Path
) -> None:
    root, key = registry
    args = ["pull", "digits", "--registry", f"file://{root}", "--device-id", "d1", "--tier"]
    args += ["high", "--trusted-key", str(key), "--out", str(tmp_path / "cache")]
    loaded = _loaded_after(args, cwd=tmp_path)
    assert "edgereg.client._client" in loaded  # it did run the client
    assert (tmp_path / "cache" / "installed.json").is_file()
    # No table of models.toml (there is none here), no registry code, no rich without a
    # terminal, no self-test (nor its probe parser) without --self-test.
    unused = [*NOT_FOR_READING, *SCHEMA, "edgereg.registry", "rich", "edgereg.client._selftest"]
    assert _present(loaded, [*unused, "edgereg.protocol.probe"]) == []


def test_status_loads_no_publishing_code_and_no_schema(
    registry: tuple[Path, Path], tmp_path: Path
) -> None:
    root, key = registry
    # In a project: status reads [registry] of models.toml and nothing else of it.
    (tmp_path / "models.toml").write_text(
        f'[registry]\nurl = "file://{root}"\ntrusted_keys = ["{key}"]\n\n'
        "[models.broken]\nnot_a_key = 1\n"  # a table status never reads
    )
    loaded = _loaded_after(["status", "digits"], cwd=tmp_path)
    assert {"edgereg.registry._status", "rich.table"} <= loaded
    # Nor logging: only a write of the registry has something to log.
    assert _present(loaded, [*NOT_FOR_READING, *SCHEMA, "edgereg.client", "logging"]) == []
    as_json = _loaded_after(["status", "digits", "--json"], cwd=tmp_path)
    assert _present(as_json, [*NOT_FOR_READING, *SCHEMA, "edgereg.client", "rich"]) == []


def test_status_loads_no_emoji_table(registry: tuple[Path, Path], tmp_path: Path) -> None:
    # No cell of the table can hold an emoji code; rich's table of them stays unloaded,
    # and the registry's path is shown as it is named.
    root, key = registry
    named = tmp_path / "a:smile:b"
    shutil.copytree(root, named)
    probe = (
        "import sys\nfrom edgereg.cli import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('rich._emoji_codes' in sys.modules)"
    )
    args = ["status", "digits", "--registry", f"file://{named}", "--trusted-key", str(key)]
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True
    )
    assert ":smile:" in done.stdout.replace("\n", "").replace(" ", "")
    assert "high-int8" in done.stdout
    assert done.stdout.splitlines()[-1] == "False"


def test_analyze_loads_no_client_server_or_build(
    registry: tuple[Path, Path], tmp_path: Path
) -> None:
    root, key = registry
    args = ["analyze", "digits", "--registry", f"file://{root}", "--trusted-key", str(key)]
    args += ["--reports", f"sqlite:///{tmp_path}/reports.sqlite", "--json"]
    # No report yet: the analysis runs and is inconclusive.
    loaded = _loaded_after(args, cwd=tmp_path, exit_code=13)
    assert {"edgereg.analysis", "edgereg.reports.store"} <= loaded
    unused = [m for m in NEVER if m != "numpy"]  # the statistics need numpy
    unused += ["edgereg.build", "edgereg.registry._release", "edgereg.serve", "edgereg.client"]
    unused += [*SCHEMA, "rich", "edgereg.protocol.probe"]
    assert _present(loaded, unused) == []


def test_publish_loads_no_client_server_or_statistics(site: Any) -> None:
    loaded = _loaded_after(["publish", "vision", "--canary", "5%"], cwd=site.root)
    assert {"edgereg.registry._release", "edgereg.config._config"} <= loaded
    assert site.state().candidate is not None  # it did publish
    unused = [*NEVER, "edgereg.client", "edgereg.serve", "edgereg.analysis", "edgereg.reports"]
    unused += ["edgereg.registry._auto", "edgereg.toolchain", "sqlite3", "http.client"]
    assert _present(loaded, unused) == []


# --- the end of a command: the process exits as the interpreter would, minus the teardown ---

_ENTRY_WITH_EXIT_HOOKS = """
import atexit, sys
class Finalized:
    def __del__(self):
        sys.stderr.write("module teardown\\n")
kept = Finalized()  # freed only when the interpreter tears its modules down
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
from edgereg.cli import main
main()
"""


@pytest.mark.parametrize(
    ("args", "code", "stdout", "stderr"),
    [
        (["--version"], 0, "edgereg, version", ""),
        (["status", "nosuch", "--registry", "file://{root}"], 1, "", "has no release"),
        (["no-such-command"], 2, "", "No such command"),
    ],
)
def test_a_command_line_run_ends_without_the_teardown(
    registry: tuple[Path, Path], args: list[str], code: int, stdout: str, stderr: str
) -> None:
    # As the console script runs it (main() with no arguments): the exit code, the
    # output and the exit handlers are the interpreter's; the module teardown
    # (60-90 ms of freeing every object, benchmarks/startup.py) is skipped.
    root, _ = registry
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY_WITH_EXIT_HOOKS, *(a.format(root=root) for a in args)],
        capture_output=True,
        text=True,
        cwd=root.parent,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert stdout in done.stdout
    assert stderr in done.stderr
    assert done.stderr.endswith("exit handler ran\n")
    assert "module teardown" not in done.stderr


def test_a_command_with_threads_left_or_a_message_exits_the_interpreters_way() -> None:
    # A thread still running is waited for, and a message as the exit code is printed
    # (exit 1), as the interpreter does: the teardown runs then.
    code = (
        "import sys, threading, time, click\n"
        "from edgereg.cli import main\n"
        "@main.command('wait')\n"
        "def wait():\n"
        "    threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
        "@main.command('say')\n"
        "def say():\n"
        "    sys.exit('a message')\n"
        "main()\n"
    )
    waited = subprocess.run([sys.executable, "-c", code, "wait"], capture_output=True, text=True)
    assert (waited.returncode, waited.stdout) == (0, "thread done\n"), waited.stderr
    said = subprocess.run([sys.executable, "-c", code, "say"], capture_output=True, text=True)
    assert (said.returncode, said.stderr) == (1, "a message\n")
