"""What every edgereg command shares: error handling, consoles, common options.

Every command module of :mod:`edgereg.cli` uses these pieces, so an error looks
and exits the same wherever it comes from: :func:`handle_errors` is the one
place that turns an error into a message and an :class:`~edgereg.errors.ExitCode`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, TypeVar, cast

import click

from edgereg.errors import ConfigError, EdgeregError, ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    # Imported where used: `edgereg --version` never reads models.toml, and importing
    # its schema (pydantic with it) was 0.2 s of the 0.35 s (benchmarks/analyze.py).
    from edgereg import config as config_module

F = TypeVar("F", bound=Callable[..., Any])


def exit_codes_help() -> str:
    r"""The exit-code table as a click help paragraph (\b: keep the lines as they are)."""
    rows = [f"  {code.value:<4} {code.meaning}" for code in ExitCode]
    return "\n".join(["Exit codes:", "", "\b", *rows])


class _LazyConsole:
    """A rich Console made on first use, standing in for it until then.

    Importing rich is about a third of `edgereg --version` (20 ms), and a --json
    command (`edgereg analyze --json`) may never print through a console.
    --quiet is kept until the console exists.
    """

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._quiet = False
        self._console: Console | None = None

    def _made(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(
                stderr=self._stderr, highlight=False, soft_wrap=True, quiet=self._quiet
            )
        return self._console

    @property
    def quiet(self) -> bool:
        return self._quiet if self._console is None else self._console.quiet

    @quiet.setter
    def quiet(self, value: bool) -> None:
        if self._console is None:
            self._quiet = value
        else:
            self._console.quiet = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not the console's: never recurse through _made
            raise AttributeError(name)
        return getattr(self._made(), name)


# Results go to stdout (`out`), for pipes and scripts; progress, notes and
# warnings to `stderr` (silenced by --quiet); errors always show. Typed as the
# Console each becomes on first use.
out = cast("Console", _LazyConsole(stderr=False))
stderr = cast("Console", _LazyConsole(stderr=True))
errors = cast("Console", _LazyConsole(stderr=True))


#: What a terminal would act on rather than show: C0 controls but tab and
#: newline, DEL, C1 controls (CSI is 0x9b), and the bidirectional overrides
#: that make text read differently from what it is (Trojan Source).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: every control character shown as an escape.

    Labels, actors, notes, error details and device output come from the
    registry or a device, signed or not; printed raw, an ESC sequence in one
    could rewrite the screen, hide a line or set the window title.
    """
    return _CONTROL.sub(_escape_control, text)


def _escape_control(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def echo(text: str = "", *, err: bool = False) -> None:
    """``click.echo`` for text that may hold registry or device data (see :func:`printable`)."""
    click.echo(printable(text), err=err)


def print_result(text: str) -> None:
    """Print one line of a command's result on stdout, as plain text (never markup)."""
    out.print(printable(text), markup=False, soft_wrap=True)


def print_note(text: str) -> None:
    """Print a diagnostic line (progress, a note, a hint) on stderr; --quiet drops it."""
    stderr.print(printable(text), markup=False, soft_wrap=True)


# --- global flags: before or after the command, like git and DVC ------------------

_FLAGS = "edgereg.flags"


def root_flag(name: str) -> bool:
    """Whether the global flag ``name`` (verbose, quiet, as_json) was given anywhere.

    Given before the command it is a parameter of the root group; given after it,
    a callback recorded it in the root context's meta.
    """
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    root = ctx.find_root()
    return bool(root.params.get(name)) or name in root.meta.get(_FLAGS, set())


def _record_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value and param.name is not None:
        ctx.find_root().meta.setdefault(_FLAGS, set()).add(param.name)
        if param.name == "quiet":
            stderr.quiet = True
    return value


def _json_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    # `edgereg --json status` means `edgereg status --json`.
    return bool(value) or bool(ctx.find_root().params.get("as_json"))


def _refuse_root_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    # Runs for every command without --json (click calls a callback even when the
    # option is absent): `edgereg --json serve` is a usage error, not silently text.
    _record_flag(ctx, param, value)
    if ctx.find_root().params.get("as_json"):
        raise click.UsageError(f"`{ctx.command_path}` has no --json output", ctx=ctx)
    return value


def add_global_options(command: click.Command) -> click.Command:
    """Let -v/--verbose, -q/--quiet and --json follow the command name, as in `status -q`.

    Applied to every command the root group hands out (and their subcommands),
    so each command keeps declaring only its own options.
    """
    if getattr(command, "_edgereg_global_options", False):
        return command
    names = {name for param in command.params for name in getattr(param, "opts", ())}
    has_json = False
    for param in command.params:
        if param.name == "as_json" and isinstance(param, click.Option):
            param.callback = _json_flag
            has_json = True
    # A group passes the root --json on to its subcommand, which decides.
    leaf = not isinstance(command, click.Group)
    verbose_callback = _refuse_root_json if leaf and not has_json else _record_flag
    if not names & {"-v", "--verbose"}:
        command.params.append(
            click.Option(
                ["--verbose", "-v"],
                is_flag=True,
                expose_value=False,
                callback=verbose_callback,
                help="Show tracebacks on errors (also before the command).",
            )
        )
    if not names & {"-q", "--quiet"}:
        command.params.append(
            click.Option(
                ["--quiet", "-q"],
                is_flag=True,
                expose_value=False,
                callback=_record_flag,
                help="Print only results and errors (also before the command).",
            )
        )
    command._edgereg_global_options = True  # type: ignore[attr-defined]
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_global_options(sub)
    return command


def exit_with(exc: EdgeregError, *, verbose: bool) -> NoReturn:
    """Print one error (its traceback too with --verbose) and exit with its code.

    Call it inside the ``except`` that caught ``exc``, so the traceback is its.
    """
    if verbose:
        traceback.print_exc()
    from rich.markup import escape

    # Messages quote TOML tables ("[models.x.calibration]"): not markup.
    errors.print(
        f"[bold red]error:[/] {escape(printable(exc.diagnostics()))}", markup=True, soft_wrap=True
    )
    sys.exit(exc.exit_code)


#: The one line every unexpected exception ends with (exit 70), whichever command raised it.
INTERNAL_ERROR_LINE = "edgereg hit an internal error (above); please report it with the traceback."


def handle_errors(command: F) -> F:
    """Turn every edgereg error into one message on stderr and its exit code.

    The root group runs every command through it (``edgereg.cli.main``), its
    option parsing included, so no command can escape it; a command module
    may also decorate its function with it, to be run on its own.
    click's own exceptions (usage errors, ``--help``) pass through to click.
    """
    if getattr(command, "_edgereg_handles_errors", False):
        return command

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except EdgeregError as exc:
            exit_with(exc, verbose=root_flag("verbose"))
        except KeyboardInterrupt:
            errors.print("interrupted")
            sys.exit(ExitCode.INTERRUPTED)
        except Exception:  # the last line of defence
            traceback.print_exc()
            errors.print(INTERNAL_ERROR_LINE)
            sys.exit(ExitCode.INTERNAL_ERROR)

    wrapper._edgereg_handles_errors = True  # type: ignore[attr-defined]
    return cast(F, wrapper)


def find_config(start: Path | None = None) -> Path:
    """The models.toml of the project around ``start`` (default: the working directory).

    Searched upward, like git and DVC find their repository: the directory
    itself, then each parent, stopping after the first that holds .git or .dvc
    (the repository root) so a stray models.toml above the repository is never
    picked up. Without one, models.toml in ``start`` (which does not exist, so
    the command says there is none here).
    """
    from edgereg import config as config_module

    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / config_module.DEFAULT_CONFIG_FILE
        if candidate.is_file():
            # Relative when found here: messages then name "models.toml" as before.
            return Path(config_module.DEFAULT_CONFIG_FILE) if folder == here else candidate
        if (folder / ".git").exists() or (folder / ".dvc").is_dir():
            break
    return Path(config_module.DEFAULT_CONFIG_FILE)


def _config_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    return find_config() if value is None else value


def config_option_for(help_text: str) -> Callable[[F], F]:
    """--config FILE: an explicit file wins, else the nearest models.toml upward."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        callback=_config_path,
        help=f"{help_text} Default: models.toml in this directory or the nearest parent "
        "up to the repository root, as git and DVC find theirs.",
    )


config_option = config_option_for("The models.toml to read.")


DEFAULT_KEY_FILE = Path(".edgereg/signing-key.pem")
KEY_ENV = "EDGEREG_SIGNING_KEY"
KEY_FILE_ENV = "EDGEREG_SIGNING_KEY_FILE"

registry_option = click.option(
    "--registry",
    "registry_url",
    default=None,
    help="Registry URL (file://PATH or s3://BUCKET/PREFIX); default: models.toml [registry].",
)


if TYPE_CHECKING:
    # click 8.2 made ParamType generic; 8.1 (still supported) cannot subscript it.
    _FloatParam: TypeAlias = click.ParamType[float, Any]
else:
    _FloatParam = click.ParamType


class Seconds(_FloatParam):
    """A finite number of seconds: nan, inf, negatives (and 0 unless allowed) are usage errors.

    click.FloatRange lets nan through: every comparison with nan is false.
    """

    name = "seconds"

    def __init__(self, minimum: float = 0.0, *, allow_zero: bool = False) -> None:
        self.minimum = minimum
        self.allow_zero = allow_zero

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if self.allow_zero and seconds == 0:
            return 0.0
        if not math.isfinite(seconds) or seconds <= 0 or seconds < self.minimum:
            if self.minimum > 0:
                bound = f"at least {self.minimum:g}"
            else:
                bound = "0 or more" if self.allow_zero else "greater than 0"
            self.fail(f"{value!r} is not a finite number of seconds {bound}", param, ctx)
        return seconds


if TYPE_CHECKING:
    _StrParam: TypeAlias = click.ParamType[str, Any]
else:
    _StrParam = click.ParamType


class UnitName(_StrParam):
    """A model, bundle, variant or tier name (the protocol's name rule), else a usage error.

    Checked before any file or registry key is built from it: `../digits` is the
    user's typo to fix (exit 2), not a storage failure to retry.
    """

    name = "name"

    def __init__(self, what: str = "model or bundle") -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from edgereg.protocol.patterns import NAME_RE, NAME_RULE

        text = str(value)
        if not NAME_RE.fullmatch(text):
            self.fail(f"{text[:80]!r} is not a {self.what} name: {NAME_RULE}", param, ctx)
        return text


#: The MODEL (or bundle) argument of every registry command.
UNIT_NAME = UnitName()


endpoint_option = click.option(
    "--endpoint-url", default=None, help="S3 endpoint for S3-compatible stores."
)
key_option = click.option(
    "--key",
    "key_paths",
    type=click.Path(path_type=Path, dir_okay=False),
    multiple=True,
    help=f"Private key file (default: ${KEY_FILE_ENV}, ${KEY_ENV} or {DEFAULT_KEY_FILE}); "
    "repeat to sign with several keys while rotating.",
)
build_dir_option = click.option(
    "--build-dir",
    "out_root",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the build outputs are (what `edgereg build --out` wrote). "
    "Default: build/ next to models.toml.",
)


def build_dir(out_root: Path | None, config: config_module.Config) -> Path:
    """--build-dir, else build/ beside models.toml (where the DVC stages write it)."""
    return out_root if out_root is not None else config.root / "build"


def _check_actor(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from edgereg.protocol.wire import MAX_ACTOR_LENGTH

    if value is not None and len(value) > MAX_ACTOR_LENGTH:
        raise click.BadParameter(
            f"{len(value)} characters; the history keeps at most {MAX_ACTOR_LENGTH}", ctx, param
        )
    return value


actor_option = click.option(
    "--actor",
    default=None,
    callback=_check_actor,
    help="Who is acting, for the history (default: $EDGEREG_ACTOR, else user@host; at most "
    "200 characters).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
trusted_key_option = click.option(
    "--trusted-key",
    "trusted_key_paths",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Verify against this publisher public key (PEM file, or a directory of them) "
    "instead of models.toml's [registry] trusted_keys; repeatable. Never the registry's keys/.",
)


def stack(*options: Callable[[F], F]) -> Callable[[F], F]:
    """Apply several click options as one decorator, first option outermost."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


registry_read_options = stack(
    config_option, registry_option, endpoint_option, trusted_key_option, json_option
)
registry_write_options = stack(
    config_option,
    registry_option,
    endpoint_option,
    trusted_key_option,
    key_option,
    actor_option,
    json_option,
)


#: What a command needs of models.toml to open the registry: the whole file, or
#: its [registry] table alone (commands that only read the registry).
RegistryConfig: TypeAlias = "config_module.Config | config_module.RegistrySettings"


def optional_config(config_path: Path) -> config_module.Config | None:
    from edgereg import config as config_module

    return config_module.load(config_path) if config_path.exists() else None


def optional_registry_config(config_path: Path) -> config_module.RegistrySettings | None:
    """[registry] of models.toml if there is one: all that `status`, `history` and `verify` read.

    They neither build nor check the rest of the schema (0.1 s and more of their
    start-up; benchmarks/startup.py); `edgereg validate` checks the whole file.
    """
    from edgereg import config as config_module

    return config_module.load_registry(config_path) if config_path.exists() else None


def pinned_keys(config: RegistryConfig | None, trusted_key_paths: tuple[Path, ...] = ()) -> Any:
    """The publisher keys the operator pinned: --trusted-key, else models.toml's trusted_keys.

    Never the registry's own keys/: whoever can write to the storage could
    plant a key there (docs/operations/keys.md).

    Raises:
        TrustError: a pinned file is missing, unreadable, or not a public key.
    """
    from edgereg.protocol.envelope import TrustedKeys
    from edgereg.signing import read_trusted_keys

    if trusted_key_paths:
        return read_trusted_keys(trusted_key_paths)
    if config is None:
        return TrustedKeys()
    return read_trusted_keys(config.trusted_key_paths())


def open_registry(
    config: RegistryConfig | None,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...] = (),
    *,
    create: bool = False,
) -> Any:
    """The registry of the command, verifying against the pinned publisher keys.

    Args:
        create: The command may create the registry (`publish`, `keys
            generate`); every other command refuses a registry directory that
            does not exist, rather than reporting it empty.

    Raises:
        StorageError: without ``create``, a file:// registry that does not exist.
    """
    registry = _open_registry(config, registry_url, endpoint_url, trusted_key_paths)
    root = getattr(registry.storage, "root", None)
    if not create and isinstance(root, Path) and not root.is_dir():
        from edgereg.errors import StorageError

        where = (
            "--registry"
            if registry_url is not None
            else f"[registry] url of {config_path_of(config)}"
        )
        raise StorageError(
            f"the registry {registry.storage.url} does not exist: no directory {root}",
            url=registry.storage.url,
            hint=f"Check {where}; `edgereg publish MODEL --canary 5%` creates the registry "
            "with its first release.",
            retryable=False,
        )
    return registry


def config_path_of(config: RegistryConfig | None) -> str:
    from edgereg import config as config_module

    return str(config.path) if config is not None else config_module.DEFAULT_CONFIG_FILE


def _open_registry(
    config: RegistryConfig | None,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
) -> Any:
    from edgereg import config as config_module
    from edgereg.registry import Registry
    from edgereg.storage import open_storage

    def trusted() -> Any:
        return pinned_keys(config, trusted_key_paths)

    if registry_url is None and config is None:
        raise ConfigError(
            "no registry given and no models.toml here",
            file=config_module.DEFAULT_CONFIG_FILE,
            hint="Pass --registry URL, run inside the project (models.toml here or in a "
            "parent folder), or create one with `edgereg init`.",
        )
    if registry_url is not None:
        return Registry(open_storage(registry_url, endpoint_url=endpoint_url), trusted=trusted)
    assert config is not None
    return Registry(
        open_storage(
            config.registry.url,
            endpoint_url=endpoint_url or config.registry.endpoint_url,
            base_dir=config.root,
        ),
        trusted=trusted,
    )


def default_key_file(config: config_module.Config | None) -> Path:
    """.edgereg/signing-key.pem of the project (beside models.toml), else of this directory."""
    return config.root / DEFAULT_KEY_FILE if config is not None else DEFAULT_KEY_FILE


def signer_from_options(
    key_paths: tuple[Path, ...], config: config_module.Config | None = None
) -> list[Any]:
    """The signers of a command: every --key, else the environment, else the default file."""
    from edgereg.signing import private_key_from_env, read_private_key_file

    if key_paths:
        signers: dict[str, Any] = {}
        for path in key_paths:
            signer = read_private_key_file(path)
            # --key K --key K (or two copies of one key): sign once with it.
            signers.setdefault(signer.key_id, signer)
        return list(signers.values())
    if os.environ.get(KEY_FILE_ENV):
        return [read_private_key_file(os.environ[KEY_FILE_ENV])]
    if os.environ.get(KEY_ENV):
        return [private_key_from_env(KEY_ENV)]
    key_file = default_key_file(config)
    if key_file.exists():
        return [read_private_key_file(key_file)]
    from edgereg.errors import TrustError

    raise TrustError(
        f"no signing key: --key not given, ${KEY_FILE_ENV} and ${KEY_ENV} unset, and no {key_file}",
        hint="Create one with `edgereg keys generate`, or point --key at your key file.",
    )


def actor_name(actor: str | None) -> str:
    """--actor, else $EDGEREG_ACTOR, else user@host: who acts, for the signed history.

    Raises:
        UsageError: the name given is longer than a history event holds.
    """
    import getpass
    import socket

    from edgereg.protocol.wire import MAX_ACTOR_LENGTH

    for given, where in ((actor, "--actor"), (os.environ.get("EDGEREG_ACTOR"), "$EDGEREG_ACTOR")):
        if not given:
            continue
        if len(given) > MAX_ACTOR_LENGTH:
            from edgereg.errors import UsageError

            raise UsageError(
                f"{where} is {len(given)} characters long; the history keeps at most "
                f"{MAX_ACTOR_LENGTH}",
                hint="Name who acts briefly, like release-bot@ci or alice@laptop.",
            )
        return given
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def expiry_days(config: config_module.Config | None) -> int:
    from edgereg import config as config_module

    return config.registry.expires_days if config else config_module.Registry().expires_days


@contextlib.contextmanager
def stage_reporter(label: str) -> Iterator[Callable[[str], None]]:
    """A live status line on a terminal; one plain line per stage otherwise (logs, DVC)."""
    if not stderr.is_terminal or stderr.quiet:
        yield lambda stage: stderr.print(f"{label}: {stage}")
        return
    with stderr.status(f"{label}: starting") as status:
        yield lambda stage: status.update(f"{label}: {stage}")


def warn_if_dvc_yaml_stale(config: config_module.Config) -> str | None:
    from edgereg.build.dvc import stale_dvc_yaml

    stale = stale_dvc_yaml(config)
    if stale is not None:
        stderr.print(f"warning: {stale}", markup=False, soft_wrap=True)
    return stale


def no_such_model(config: config_module.Config, model: str) -> ConfigError:
    if not config.models:
        return ConfigError(
            f"no model '{model}': the file declares no models yet",
            file=str(config.path),
            hint="Add one with `edgereg add path/to/model.onnx --evaluation data.npz`.",
        )
    bundles = f"; bundles: {', '.join(config.bundles)}" if config.bundles else ""
    return ConfigError(
        f"no model '{model}'; models: {', '.join(config.models)}{bundles}", file=str(config.path)
    )
