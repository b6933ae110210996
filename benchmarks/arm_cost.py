"""What ARM verification adds to a build: the examples built with their ARM classes and without.

Every example variant that is verified on ARM classes by default (quantized,
or hinted to run at ``precision = "low"``) is built three times in one run,
each into its own fresh output directory (nothing cached):

1. **host only**: ``[toolchain] arm = []``;
2. **ARM, every row**: the default classes, every class emulating every row
   (the runner's ``reuse_rows = False``: how the build ran before);
3. **ARM**: the default classes as the build runs them now: armv8.2 emulates
   every row, each other class its first two (``CHECK_ROWS``) and the rest
   only when those differ bit for bit from armv8.2's (edgereg/build/arm.py,
   ``_emulate``).

Printed per variant and summed over the examples: the wall seconds of each
build and the ratios ``ARM / host only``. Target: the examples with their ARM
classes take at most twice the host-only build. The machine's load is printed
with the numbers: emulation and the host builds share its cores.

Usage: .venv/bin/python benchmarks/arm_cost.py [--models digits,sensor] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg.build.arm import EmulatedRunner
from edgereg.build.variant import BenchSettings, build_variant
from edgereg.config import arm_classes
from edgereg.errors import BuildError
from edgereg.toolchain import arm as arm_toolchain

ROOT = Path(__file__).resolve().parents[1]
#: What `dvc repro` builds with (`edgereg build`: 50 benchmark iterations, the thread sweep).
SETTINGS = BenchSettings()
TARGET = 2.0


class EveryRowRunner(EmulatedRunner):
    """The real emulator, every class emulating every row (the build before the lever)."""

    reuse_rows = False

    def __call__(
        self,
        artifact: Path,
        cpu_class: str,
        inputs: Mapping[str, np.ndarray],
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        precision: str,
    ) -> arm_toolchain.ArmRun:
        return super().__call__(
            artifact,
            cpu_class,
            inputs,
            input_names=input_names,
            output_names=output_names,
            precision=precision,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated example models")
    parser.add_argument("--out", type=Path, default=None, help="where to build (default: temp)")
    args = parser.parse_args(argv)
    config = config_mod.load(ROOT / "models.toml")
    text = config.path.read_text(encoding="utf-8")
    host_only = config_mod.parse(
        text.replace("[toolchain]\n", "[toolchain]\narm = []\n", 1), file=str(config.path)
    )
    wanted = set(args.models.split(",")) if args.models else None
    sysroot = arm_toolchain.find_sysroot(config.toolchain.mnn, root=arm_toolchain.arm_dir(ROOT))
    every_row = EveryRowRunner(sysroot)
    base = args.out or Path(tempfile.mkdtemp(prefix="arm-cost-"))
    rows: list[dict[str, object]] = []
    print(f"load average at start: {os.getloadavg()[0]:.1f}; building into {base}", flush=True)
    for model_name, model in config.models.items():
        if wanted is not None and model_name not in wanted:
            continue
        for variant_name in model.variants:
            classes = arm_classes(config, model_name, variant_name)
            if not classes:
                continue
            seconds: dict[str, float] = {}
            for label, cfg, runner in (
                ("host", host_only, None),
                ("every_row", config, every_row),
                ("arm", config, None),
            ):
                out = base / label
                start = time.perf_counter()
                try:
                    build_variant(
                        cfg, model_name, variant_name, out, bench=SETTINGS, arm_runner=runner
                    )
                except BuildError as exc:  # a failed gate still ran every stage it timed
                    print(f"{model_name}/{variant_name} ({label}): {exc.message}", flush=True)
                seconds[label] = time.perf_counter() - start
            metrics = json.loads(
                (base / "arm" / model_name / variant_name / "metrics.json").read_text()
            )
            metrics.setdefault("arm", {"classes": {}})
            reused = {
                c: r.get("rest_from")
                for c, r in metrics["arm"]["classes"].items()
                if r.get("rest_from")
            }
            row = {
                "variant": f"{model_name}/{variant_name}",
                "classes": list(classes),
                **{k: round(v, 1) for k, v in seconds.items()},
                "every_row_ratio": round(seconds["every_row"] / seconds["host"], 2),
                "arm_ratio": round(seconds["arm"] / seconds["host"], 2),
                "rows_reused_from": reused,
                "load": round(os.getloadavg()[0], 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    total = {k: sum(float(r[k]) for r in rows) for k in ("host", "every_row", "arm")}  # type: ignore[arg-type]
    print(
        json.dumps(
            {
                "variants": len(rows),
                "host_s": round(total["host"], 1),
                "every_row_s": round(total["every_row"], 1),
                "arm_s": round(total["arm"], 1),
                "every_row_ratio": round(total["every_row"] / total["host"], 2),
                "arm_ratio": round(total["arm"] / total["host"], 2),
                "target": TARGET,
                "load_at_end": round(os.getloadavg()[0], 1),
            }
        )
    )
    return 0 if total["arm"] <= TARGET * total["host"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
