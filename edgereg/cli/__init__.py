"""The edgereg command line: parse, call the library, print.

One module per command family (build, keys, release, analyze, onboard, pull,
serve, toolchain, buildreport), all sharing :mod:`edgereg.cli._common` (the
options, the consoles, and the one place that turns an error into a message
and an exit code). Nothing outside this package imports click or rich.
``edgereg.cli:main`` is the console entry point.
"""

from edgereg.cli.main import main

__all__ = ["main"]
