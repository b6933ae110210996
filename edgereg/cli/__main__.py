"""`python -m edgereg.cli`: the same as the `edgereg` command."""

from edgereg.cli.main import main

main()
