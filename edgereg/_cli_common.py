"""What every edgereg command shares: error handling, consoles, common options.

Commands live in :mod:`edgereg.cli` and next to their layer (the server, the
client, onboarding, reports); all of them use these pieces, so an error looks
and exits the same wherever it comes from.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from rich.console import Console
from rich.markup import escape

from edgereg import config as config_module
from edgereg.errors import ConfigError, EdgeregError

F = TypeVar("F", bound=Callable[..., Any])

INTERNAL_ERROR = 70

# Progress and notes go to `stderr` (silenced by --quiet); errors always show.
stderr = Console(stderr=True, highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)


def handle_errors(command: F) -> F:
    """Turn every edgereg error into one message on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = bool(click.get_current_context().find_root().params.get("verbose"))
        try:
            return command(*args, **kwargs)
        except EdgeregError as exc:
            if verbose:
                traceback.print_exc()
            # Messages quote TOML tables ("[models.x.calibration]"): not markup.
            errors.print(
                f"[bold red]error:[/] {escape(exc.diagnostics())}", markup=True, soft_wrap=True
            )
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            errors.print("interrupted")
            sys.exit(130)
        except Exception:  # the last line of defence
            traceback.print_exc()
            errors.print(
                "edgereg hit an internal error (above); please report it with the traceback."
            )
            sys.exit(INTERNAL_ERROR)

    return cast(F, wrapper)


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path(config_module.DEFAULT_CONFIG_FILE),
    show_default=True,
    help="The models.toml to read.",
)


DEFAULT_KEY_FILE = Path(".edgereg/signing-key.pem")
KEY_ENV = "EDGEREG_SIGNING_KEY"
KEY_FILE_ENV = "EDGEREG_SIGNING_KEY_FILE"

registry_option = click.option(
    "--registry",
    "registry_url",
    default=None,
    help="Registry URL (file://PATH or s3://BUCKET/PREFIX); default: models.toml [registry].",
)
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
    default=Path("build"),
    show_default=True,
    help="Where the build outputs are (what `edgereg build --out` wrote).",
)
actor_option = click.option(
    "--actor", default=None, help="Who is acting, for the history (default: user@host)."
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


def optional_config(config_path: Path) -> config_module.Config | None:
    return config_module.load(config_path) if config_path.exists() else None


def pinned_keys(
    config: config_module.Config | None, trusted_key_paths: tuple[Path, ...] = ()
) -> Any:
    """The publisher keys the operator pinned: --trusted-key, else models.toml's trusted_keys.

    Never the registry's own keys/: whoever can write to the storage could
    plant a key there (docs/operations/keys.md).

    Raises:
        TrustError: a pinned file is missing, unreadable, or not a public key.
    """
    from edgereg.signing import TrustedKeys, read_trusted_keys

    if trusted_key_paths:
        return read_trusted_keys(trusted_key_paths)
    if config is None:
        return TrustedKeys()
    return read_trusted_keys(config.trusted_key_paths())


def open_registry(
    config: config_module.Config | None,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...] = (),
) -> Any:
    """The registry of the command, verifying against the pinned publisher keys."""
    from edgereg.registry import Registry
    from edgereg.storage import open_storage

    def trusted() -> Any:
        return pinned_keys(config, trusted_key_paths)

    if registry_url is None and config is None:
        raise ConfigError(
            "no registry given and no models.toml here",
            file=config_module.DEFAULT_CONFIG_FILE,
            hint="Pass --registry URL, run from the directory that holds models.toml, or "
            "create one with `edgereg init`.",
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


def signer_from_options(key_paths: tuple[Path, ...]) -> list[Any]:
    """The signers of a command: every --key, else the environment, else the default file."""
    import os

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
    if DEFAULT_KEY_FILE.exists():
        return [read_private_key_file(DEFAULT_KEY_FILE)]
    from edgereg.errors import TrustError

    raise TrustError(
        f"no signing key: --key not given, ${KEY_FILE_ENV} and ${KEY_ENV} unset, "
        f"and no {DEFAULT_KEY_FILE}",
        hint="Create one with `edgereg keys generate`, or point --key at your key file.",
    )


def actor_name(actor: str | None) -> str:
    import getpass
    import os
    import socket

    if actor:
        return actor
    if os.environ.get("EDGEREG_ACTOR"):
        return os.environ["EDGEREG_ACTOR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def expiry_days(config: config_module.Config | None) -> int:
    return config.registry.expires_days if config else config_module.Registry().expires_days


@contextlib.contextmanager
def stage_reporter(label: str) -> Iterator[Callable[[str], None]]:
    """A live status line on a terminal; one plain line per stage otherwise (logs, DVC)."""
    if not stderr.is_terminal or stderr.quiet:
        yield lambda stage: stderr.print(f"{label}: {stage}")
        return
    with stderr.status(f"{label}: starting") as status:
        yield lambda stage: status.update(f"{label}: {stage}")
