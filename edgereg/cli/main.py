"""The edgereg command line: parse, call the library, print.

Results go to stdout, diagnostics to stderr; the exit codes are
:class:`edgereg.errors.ExitCode` (docs/reference/exit-codes.md).
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from typing import Any, ClassVar, NoReturn

import click

# pydantic looks for plugins (observability hooks) in the entry points of every
# installed distribution when it builds its first validator: 50-250 ms in a
# virtualenv of ~170 packages, more than importing pydantic, for hooks edgereg
# never uses. The command line loads none unless PYDANTIC_DISABLE_PLUGINS is set
# (to "" to load them all); the library itself leaves pydantic's default alone.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from edgereg import __version__
from edgereg.cli._common import (
    add_global_options,
    exit_codes_help,
    handle_errors,
    stderr,
)


class _LazyGroup(click.Group):
    """Every command, one module per family in this package, imported only when asked for.

    `edgereg build` (run once per DVC stage) should not pay for importing the
    client SDK, the server or the report renderer.
    """

    LAZY: ClassVar[dict[str, str]] = {
        "add": "edgereg.cli.onboard:add_command",
        "analyze": "edgereg.cli.analyze:analyze_command",
        "build": "edgereg.cli.build:build",
        "dvc": "edgereg.cli.build:dvc",
        "history": "edgereg.cli.release:history",
        "init": "edgereg.cli.onboard:init_command",
        "keys": "edgereg.cli.keys:keys",
        "pause": "edgereg.cli.release:pause",
        "promote": "edgereg.cli.release:promote",
        "publish": "edgereg.cli.release:publish",
        "pin": "edgereg.cli.onboard:pin_command",
        "pull": "edgereg.cli.pull:pull_command",
        "rebuild-state": "edgereg.cli.release:rebuild_state",
        "report": "edgereg.cli.buildreport:report_command",
        "resign": "edgereg.cli.release:resign",
        "resume": "edgereg.cli.release:resume",
        "rollback": "edgereg.cli.release:rollback",
        "rollout": "edgereg.cli.release:rollout",
        "schema": "edgereg.cli.build:schema",
        "serve": "edgereg.cli.serve:serve_command",
        "status": "edgereg.cli.release:status",
        "summary": "edgereg.cli.build:summary",
        "tiers": "edgereg.cli.build:tiers",
        "toolchain": "edgereg.cli.toolchain:toolchain_group",
        "validate": "edgereg.cli.build:validate",
        "verify": "edgereg.cli.release:verify",
    }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # `edgereg` itself (the console script, `python -m edgereg.cli`) calls the group
        # with no arguments; a caller that passes its own (tests, tools) keeps click's
        # plain SystemExit.
        if args or kwargs:
            return self.main(*args, **kwargs)
        try:
            self.main()
        except SystemExit as done:
            exit_process(done)

    def invoke(self, ctx: click.Context) -> Any:
        # Every command, its module's import and its option parsing run inside the
        # one error handler: an edgereg error is its message and exit code, an
        # unexpected exception exit 70 with the one line, Ctrl-C while a module
        # still imports "interrupted" and 130 (not click's "Aborted!" with exit 1
        # or a traceback out of importlib).
        return handle_errors(super().invoke)(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            module, attribute = self.LAZY[cmd_name].split(":")
            lazy: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(lazy, cmd_name)
        command = super().get_command(ctx, cmd_name)
        return None if command is None else add_global_options(command)


def exit_process(done: SystemExit) -> NoReturn:
    """End the process as the interpreter would, without tearing down every module first.

    After a command, the interpreter's own exit frees each object of each module
    one by one (pydantic's validators, rich, cryptography): 60-90 ms of CPU, 15 % of
    `edgereg status`, for memory the process gives back anyway. Here the exit
    handlers run (logging flushes, temporary files go) and stdout and stderr are
    flushed, then the process ends with the same code. When there is anything
    else the interpreter's exit would do (threads still running to wait for, a
    message as the exit code, a stream that fails to flush) it does it.
    """
    code = done.code
    if threading.active_count() > 1 or not (code is None or isinstance(code, int)):
        raise done
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        raise done from None  # the interpreter reports it (a closed pipe: exit 120)
    os._exit(code or 0)


MAIN_HELP = f"""Build MNN model variants per device tier and ship them to apps.

Results go to stdout, progress, notes and warnings to stderr. -v, -q and --json
work before or after the command (`edgereg status -q`). Commands find models.toml
in the working directory or the nearest parent, up to the repository root.
Text from the registry or a device (labels, actors, notes, errors) is printed
with its control characters escaped (\\x1b); --json output is exact JSON.

{exit_codes_help()}

Shell completion: eval "$(_EDGEREG_COMPLETE=bash_source edgereg)" (or
zsh_source, fish_source).
"""


@click.group(
    cls=_LazyGroup, help=MAIN_HELP, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="edgereg")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")
@click.option("--quiet", "-q", is_flag=True, help="Print only results and errors.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts (commands that have --json)."
)
def main(verbose: bool, quiet: bool, as_json: bool) -> None:
    """The edgereg command group (its help is MAIN_HELP, which holds the exit codes)."""
    stderr.quiet = quiet
