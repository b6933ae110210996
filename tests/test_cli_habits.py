"""The command line keeps git's and DVC's habits.

Global flags work after the command too, results go to stdout and diagnostics
to stderr, models.toml is found from a subfolder, usage errors exit 2, and a
registry that does not exist is an error. Each case runs through the installed
`edgereg` entry point (a child process, as a shell runs it) and through
click's CliRunner (in-process, as most tests run it): both must agree.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from registrykit import Site, ok

from edgereg.cli import main

EDGEREG = Path(sys.executable).parent / "edgereg"
REPO_TOML = Path(__file__).resolve().parents[1] / "models.toml"
MISSING_REGISTRY = "file:///nonexistent/edgereg-registry"
PULL = ("pull", "digits", "--registry", "file:///nowhere", "--device-id", "d", "--tier", "low")
PULL_KEYS = ("--unsafe-trust-registry-keys", "--out", "cache")


@dataclass(frozen=True)
class Run:
    """What one command line did."""

    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Case:
    """A command line and what it must do (run in an empty directory)."""

    name: str
    args: tuple[str, ...]
    exit_code: int
    stdout: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()
    stderr_empty: bool = False


CONFIG = ("--config", str(REPO_TOML))

CASES = [
    # Global flags after the command, as `git status -q` and `dvc status -q` take them.
    Case("quiet after the command", ("validate", "-q", *CONFIG), 0, ("valid",), stderr_empty=True),
    Case("quiet before the command", ("-q", "validate", *CONFIG), 0, ("valid",), stderr_empty=True),
    Case("verbose after the command", ("validate", *CONFIG, "-v"), 0, ("valid",)),
    Case("json before the command", ("--json", "validate", *CONFIG), 0, ('"valid": true',)),
    Case("json after the command", ("validate", "--json", *CONFIG), 0, ('"valid": true',)),
    Case(
        "json before a group reaches its subcommand",
        ("--json", "toolchain", "runtimes", "list", *CONFIG),
        0,
        ('"needed"',),
    ),
    Case("json for a command without it", ("--json", "dvc", "sync"), 2, (), ("has no --json",)),
    Case("quiet in a group", ("dvc", "-q", "sync", "--check", *CONFIG), 0, ("up to date",)),
    # A registry that does not exist is an error naming it and how to create it.
    Case(
        "status of a registry that does not exist",
        ("status", "--registry", MISSING_REGISTRY),
        6,
        (),
        ("/nonexistent/edgereg-registry", "does not exist", "edgereg publish"),
    ),
    Case(
        "status -q of a registry that does not exist still says why",
        ("status", "-q", "--registry", MISSING_REGISTRY),
        6,
        (),
        ("does not exist",),
    ),
    Case(
        "history of a registry that does not exist",
        ("history", "digits", "--registry", MISSING_REGISTRY),
        6,
        (),
        ("does not exist",),
    ),
    Case(
        "verify of a registry that does not exist",
        ("verify", "--registry", MISSING_REGISTRY),
        6,
        (),
        ("does not exist",),
    ),
    # Usage errors exit 2, from click or from the command itself.
    Case("unknown option", ("status", "--no-such-option"), 2, (), ("No such option",)),
    Case("rollout without --to or --next", ("rollout", "digits"), 2, (), ("--to PERCENT",)),
    Case(
        "rollout with --to and --next",
        ("rollout", "digits", "--to", "5%", "--next"),
        2,
        (),
        ("not both",),
    ),
    Case("rollout --to abc", ("rollout", "digits", "--to", "abc"), 2, (), ("--to must be",)),
    Case("publish without --canary or --full", ("publish", "digits"), 2, (), ("--canary",)),
    Case("publish --canary 150%", ("publish", "digits", "--canary", "150%"), 2, (), ("--canary",)),
    Case(
        "publish --version that is not semantic",
        ("publish", "digits", "--canary", "5%", "--version", "one", *CONFIG),
        2,
        (),
        ("semantic version",),
    ),
    Case("build --iterations 0", ("build", "digits", "fp32", "--iterations", "0"), 2),
    Case("pull --timeout -1", (*PULL, *PULL_KEYS, "--timeout", "-1"), 2, (), ("--timeout",)),
    Case("pull --timeout 0", (*PULL, *PULL_KEYS, "--timeout", "0"), 2, (), ("--timeout",)),
    Case("pull --timeout nan", (*PULL, *PULL_KEYS, "--timeout", "nan"), 2, (), ("--timeout",)),
    Case("pull --timeout inf", (*PULL, *PULL_KEYS, "--timeout", "inf"), 2, (), ("--timeout",)),
    Case("pull --deadline nan", (*PULL, *PULL_KEYS, "--deadline", "nan"), 2, (), ("--deadline",)),
    Case("pull without a trust choice", (*PULL, "--out", "cache"), 2, (), ("--trusted-key",)),
    Case("pull --registry-url is gone", ("pull", "digits", "--registry-url", "x"), 2),
    Case("serve --timeout nan", ("serve", "--timeout", "nan"), 2, (), ("--timeout",)),
    Case("serve --port 70000", ("serve", "--port", "70000"), 2, (), ("--port",)),
    Case("add without --evaluation", ("add", "model.onnx"), 2, (), ("--evaluation",)),
    Case("toolchain bad --version", ("toolchain", "runtimes", "install", "--version", "3"), 2),
    # A name that is no name is a usage error (2), before any registry key is built from
    # it; `../digits` was "storage, retryable" (6), issue #30.
    *(
        Case(
            f"{' '.join(args[:1])} of a name with a path in it",
            (*args, *CONFIG),
            2,
            (),
            ("'../digits' is not a", "lowercase letter"),
        )
        for args in (
            ("status", "../digits"),
            ("pause", "../digits"),
            ("resume", "../digits"),
            ("resign", "../digits"),
            ("promote", "../digits"),
            ("rollback", "../digits"),
            ("rebuild-state", "../digits"),
            ("history", "../digits"),
            ("rollout", "../digits", "--to", "10%"),
            ("publish", "../digits", "--canary", "5%"),
            ("analyze", "../digits"),
            ("build", "../digits", "fp32"),
            ("pull", "../digits", "--registry", "file:///nowhere", "--device-id", "d", *PULL_KEYS),
        )
    ),
    # A 100 KB --actor was exit 70 (the signed history keeps 200 characters).
    *(
        Case(
            f"{args[0]} --actor of 100 KB",
            (*args, "--actor", "a" * 100_000, "--registry", MISSING_REGISTRY),
            2,
            (),
            ("--actor", "100000 characters", "at most 200"),
        )
        for args in (
            ("pause", "digits"),
            ("rebuild-state", "digits", "--reset", "--sequence", "5"),
            ("rollout", "digits", "--next"),
            ("publish", "digits", "--canary", "5%"),
        )
    ),
    Case("status of an upper-case name", ("status", "Digits", *CONFIG), 2, (), ("lowercase",)),
    Case(
        "pull --bundle with a path in it",
        ("pull", "--bundle", "../ocr", "--registry", "file:///x", "--device-id", "d", *PULL_KEYS),
        2,
        (),
        ("'../ocr' is not a bundle name",),
    ),
    # Without models.toml here (or above, up to the repository root), commands say so.
    Case("validate without models.toml", ("validate",), 2, (), ("models.toml: file not found",)),
]


def run_subprocess(args: tuple[str, ...], cwd: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEREG_")}
    done = subprocess.run(
        [str(EDGEREG), *args], cwd=cwd, capture_output=True, text=True, check=False, env=env
    )
    return Run(done.returncode, done.stdout, done.stderr)


def run_in_process(args: tuple[str, ...], cwd: Path) -> Run:
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, list(args))
    finally:
        os.chdir(previous)
    return Run(result.exit_code, result.stdout, result.stderr)


RUNNERS = {"entry point": run_subprocess, "CliRunner": run_in_process}


@pytest.fixture
def empty_repo(tmp_path: Path) -> Path:
    """An empty git repository: the upward search for models.toml stops at its root."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    return root


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_command_line_habit(case: Case, runner: str, empty_repo: Path) -> None:
    done = RUNNERS[runner](case.args, empty_repo)
    assert done.exit_code == case.exit_code, f"{done.stdout}\n{done.stderr}"
    for text in case.stdout:
        assert text in done.stdout, done.stdout
    for text in case.stderr:
        assert text in done.stderr, done.stderr
    if case.stderr_empty:
        assert done.stderr == ""
    assert "Traceback" not in done.stderr


# --- models.toml from any subfolder -------------------------------------------------


def test_models_toml_is_found_from_a_subfolder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    shutil.copy(REPO_TOML, project / "models.toml")
    deep = project / "notebooks" / "week1"
    deep.mkdir(parents=True)
    for run in RUNNERS.values():
        done = run(("validate", "--json"), deep)
        assert done.exit_code == 0, done.stderr
        assert json.loads(done.stdout)["valid"] is True


def test_search_stops_at_the_repository_root(tmp_path: Path) -> None:
    # A models.toml above the repository belongs to something else.
    shutil.copy(REPO_TOML, tmp_path / "models.toml")
    inner = tmp_path / "repo" / "src"
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    inner.mkdir()
    for run in RUNNERS.values():
        done = run(("validate",), inner)
        assert done.exit_code == 2
        assert "models.toml: file not found" in done.stderr


def test_explicit_config_wins(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "models.toml").write_text("not toml at all = = =\n", encoding="utf-8")
    for run in RUNNERS.values():
        assert run(("validate",), project).exit_code == 2
        done = run(("validate", "--config", str(REPO_TOML)), project)
        assert done.exit_code == 0, done.stderr


def test_registry_commands_from_a_subfolder_use_the_projects_paths(site: Site) -> None:
    # [registry] url = "registry" and build/ are relative to models.toml, not to the
    # working directory; the default signing key lives beside models.toml too.
    sub = site.root / "notes"
    sub.mkdir()
    publish = run_subprocess(("publish", "vision", "--canary", "5%", "-q"), sub)
    assert publish.exit_code == 0, publish.stderr
    assert "published vision" in publish.stdout
    assert publish.stderr == ""
    assert (site.root / "registry").is_dir()
    assert not (sub / "registry").exists()
    status = run_subprocess(("status", "--json"), sub)
    assert status.exit_code == 0, status.stderr
    assert [entry["model"] for entry in json.loads(status.stdout)] == ["vision"]
    summary = run_subprocess(("summary", "--json"), sub)
    assert summary.exit_code == 0, summary.stderr
    assert {row["status"] for row in json.loads(summary.stdout)} == {"built"}


# --- results on stdout, diagnostics on stderr ---------------------------------------


def test_results_go_to_stdout_and_notes_to_stderr(site: Site) -> None:
    published = ok(site.run("publish", "vision", "--canary", "5%"))
    assert "published vision" in published.stdout
    assert "published" not in published.stderr
    moved = ok(site.run("rollout", "vision", "--to", "25%", "--force"))
    assert "candidate" in moved.stdout
    assert "25%" in moved.stdout
    assert moved.stderr == ""
    shown = ok(site.run("status"))
    assert "vision" in shown.stdout
    checked = ok(site.run("verify"))
    assert "objects checked, ok" in checked.stdout
    history = ok(site.run("history", "vision"))
    assert "publish" in history.stdout
    quiet = ok(site.run("publish", "vision", "--canary", "5%", "-q"))
    assert "already published" in quiet.stdout
    assert quiet.stderr == ""


def test_an_empty_registry_is_a_result_not_an_error(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    for run in RUNNERS.values():
        done = run(("status", "--registry", f"file://{registry}"), tmp_path)
        assert done.exit_code == 0, done.stderr
        assert "no models in" in done.stdout
        assert "edgereg publish" in done.stderr


# --- Ctrl-C ---------------------------------------------------------------------------


def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_pull_exits_130(tmp_path: Path) -> None:
    keys = run_subprocess(("keys", "generate", "--no-publish", "--out", "k.pem"), tmp_path)
    assert keys.exit_code == 0, keys.stderr
    # A registry that accepts the connection and never answers: the pull waits.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        args = ["pull", "digits", "--registry", f"http://127.0.0.1:{port}", "--device-id", "d"]
        args += ["--tier", "low", "--trusted-key", "k.pub.pem", "--out", "c"]
        pull = subprocess.Popen(
            [str(EDGEREG), *args],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A pull that hangs after Ctrl-C dumps every thread's stack on SIGABRT.
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            # A test run started in the background (`make test &`, nohup) inherits an
            # ignored SIGINT, and Python keeps it ignored: the pull then never sees the
            # Ctrl-C and ends on its 30 s header timeout (exit 10). As from a terminal.
            preexec_fn=_sigint_as_from_a_terminal,
        )
        connection, _ = silent.accept()  # the pull is now waiting for an answer
        with connection:
            pull.send_signal(signal.SIGINT)
            try:
                _, stderr = pull.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                pull.send_signal(signal.SIGABRT)
                _, stderr = pull.communicate(timeout=30)
                pytest.fail(f"the pull did not exit after Ctrl-C; its threads:\n{stderr}")
    assert pull.returncode == 130, stderr
    assert "interrupted" in stderr
    assert "Traceback" not in stderr


def test_ctrl_c_while_a_command_is_still_importing_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Commands import on first use: an interrupt then lands before the command's own
    # handler, and was click's "Aborted!" (exit 1) or a traceback out of importlib.
    (tmp_path / "slow_to_import.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(type(main).LAZY, "slow", "slow_to_import:command")
    result = CliRunner().invoke(main, ["slow"])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output
    assert "Aborted" not in result.output


# Issue #22: what the registry or a device says is printed with its control characters escaped.
PRINTABLE = [
    ("plain", "release-bot@ci", "release-bot@ci"),
    ("escape-sequence", "\x1b[2Jwiped", "\\x1b[2Jwiped"),
    ("window-title", "\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),
    ("c1-csi", "a\x9b31m", "a\\x9b31m"),
    ("carriage-return", "ok\rFAILED", "ok\\x0dFAILED"),
    ("bidi-override", "txt\u202eexe", "txt\\u202eexe"),
    ("tab-and-newline-kept", "a\tb\nc", "a\tb\nc"),
    ("unicode-kept", "café ✓", "café ✓"),
]


@pytest.mark.parametrize(
    ("text", "shown"), [p[1:] for p in PRINTABLE], ids=[p[0] for p in PRINTABLE]
)
def test_printable_escapes_control_characters(text: str, shown: str) -> None:
    from edgereg.cli._common import printable

    assert printable(text) == shown


def test_history_escapes_a_signed_actor(tmp_path: Path) -> None:
    from servekit import make_registry

    fake = make_registry(tmp_path / "registry", actor="bot\x1b]0;owned\x07\x1b[2J")
    pem = tmp_path / "key.pub.pem"
    pem.write_bytes(fake.signer.public_pem())
    result = CliRunner().invoke(
        main,
        ["history", "digits", "--registry", str(tmp_path / "registry"), "--trusted-key", str(pem)],
    )
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "\x07" not in result.output
    assert "\\x1b]0;owned" in result.output


# --- an unexpected exception, in every command family -----------------------------------

#: One command of each family (edgereg/cli/<family>.py), run with models.toml's reading
#: broken by a bug: each must end in exit 70 and the one line, never a raw traceback
#: with exit 1 (`pull` did, issue #30).
INTERNAL = {
    "build": ("validate", *CONFIG),
    "build-dvc": ("dvc", "sync", *CONFIG),
    "keys": ("keys", "generate", "--no-publish", "--out", "k.pem", *CONFIG),
    "release": ("status", "--html", "s.html", *CONFIG),
    "release-write": ("pause", "digits", *CONFIG),
    "analyze": ("analyze", "digits", *CONFIG),
    "onboard": ("pin", *CONFIG),
    "pull": (*PULL, *PULL_KEYS, *CONFIG),
    "serve": ("serve", "--port", "0", *CONFIG),
    "toolchain": ("toolchain", "runtimes", "list", *CONFIG),
    "buildreport": ("report", *CONFIG),
}


class _Bug(RuntimeError):
    pass


@pytest.mark.parametrize("args", INTERNAL.values(), ids=INTERNAL.keys())
def test_an_unexpected_exception_is_exit_70_with_the_one_line(
    args: tuple[str, ...], empty_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgereg import config as config_module
    from edgereg.cli._common import INTERNAL_ERROR_LINE

    def broken(*args: object, **kwargs: object) -> None:
        raise _Bug("injected")

    monkeypatch.setattr(config_module, "load", broken)
    monkeypatch.chdir(empty_repo)
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 70, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.strip().endswith(INTERNAL_ERROR_LINE), result.stderr
    assert "_Bug: injected" in result.stderr  # the traceback above the line, to report


def test_an_exception_while_parsing_options_is_exit_70_too(
    empty_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --config's default is found by a callback, before the command's own code runs.
    from edgereg.cli import _common
    from edgereg.cli._common import INTERNAL_ERROR_LINE

    def broken(start: Path | None = None) -> Path:
        raise _Bug("injected while parsing")

    monkeypatch.setattr(_common, "find_config", broken)
    monkeypatch.chdir(empty_repo)
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 70, result.output
    assert result.stderr.strip().endswith(INTERNAL_ERROR_LINE), result.stderr
