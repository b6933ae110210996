"""The device ids of `make demo`'s two phones, chosen for this run's canary cohorts.

A rollout's salt is random, so a fixed device id lands inside a 5 % canary in
one run of `make demo` and outside it in the next (a 50 % canary reached both
phones in a quarter of runs). The demo instead gives each phone the first id
of its series (``demo-flagship-0001``, ``-0002``, ...) whose cohort bucket is
inside the candidate cohort of every ``--inside`` unit and outside that of
every ``--outside`` unit, read from the signed rollout states (verified
against the project's pinned keys): every run shows the same thing.

    python pipelines/demo_devices.py demo-flagship --inside sensor --inside ocr

prints the id. Exit status 2 when a unit has no candidate, or no id of the
first million fits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgereg import config as config_module
from edgereg.protocol.rules import in_cohort
from edgereg.registry import Registry
from edgereg.signing import read_trusted_keys
from edgereg.storage import open_storage

#: Ids tried per series before giving up.
TRIES = 1_000_000


def cohorts(config_path: Path, units: list[str]) -> dict[str, tuple[str, float]]:
    """Each unit's candidate cohort: (salt, percent), from its verified rollout state.

    Raises:
        SystemExit: a unit has no rollout state or no candidate.
    """
    config = config_module.load(config_path)
    storage = open_storage(config.registry.url, base_dir=config.root)
    registry = Registry(storage, trusted=read_trusted_keys(config.trusted_key_paths()))
    found = {}
    for unit in units:
        state, _ = registry.read_state(unit)
        if state is None or state.candidate is None or state.salt is None:
            raise SystemExit(f"error: {unit} has no candidate in {storage.url}: no cohort")
        assert state.percent is not None
        found[unit] = (state.salt, state.percent)
    return found


def choose(
    prefix: str, inside: list[tuple[str, float]], outside: list[tuple[str, float]]
) -> str | None:
    """The first ``prefix-NNNN`` inside every cohort of ``inside`` and outside every other."""
    for n in range(1, TRIES + 1):
        device = f"{prefix}-{n:04d}"
        if all(in_cohort(device, salt, percent) for salt, percent in inside) and not any(
            in_cohort(device, salt, percent) for salt, percent in outside
        ):
            return device
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", help="The id series, like demo-flagship.")
    parser.add_argument("--inside", action="append", default=[], metavar="UNIT")
    parser.add_argument("--outside", action="append", default=[], metavar="UNIT")
    parser.add_argument("--config", type=Path, default=Path("models.toml"))
    args = parser.parse_args(argv)
    found = cohorts(args.config, [*args.inside, *args.outside])
    device = choose(
        args.prefix,
        [found[unit] for unit in args.inside],
        [found[unit] for unit in args.outside],
    )
    if device is None:
        print(f"error: no {args.prefix}-NNNN of the first {TRIES} fits", file=sys.stderr)
        return 2
    print(device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
