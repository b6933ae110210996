"""What ARM verification adds to a build: the examples with their ARM classes against without.

Every example variant that is verified on ARM classes by default (quantized,
or hinted to run at ``precision = "low"``) is built twice in one run, as
``dvc repro`` builds it (``BenchSettings()``, one variant's stage at a time),
each into a fresh output directory (nothing cached):

1. **per call**: an emulator process started for every emulated run (QEMU,
   Python, numpy and MNN imported under emulation each time: how the build
   ran before);
2. **worker**: one emulator per class for the variant's ARM stage
   (``edgereg.toolchain.arm.ClassWorker``), started before the host's run of
   the same artifact and sent every run of its class, stopped when the stage
   ends. Nothing outlives a variant's stage, as under ``dvc repro``, where
   every stage is its own process.

Both emulate the same rows: armv8.2 every row, each other class its first two
(``CHECK_ROWS``) and the rest only when those differ bit for bit from
armv8.2's (edgereg/build/arm.py, ``_emulate``). ``--every-row`` adds a third
build with every class emulating every row (per call).

Each build times its own stages, so the host-only build is that build
without its ``arm`` stage (the emulated classes and the host's run of the
same artifact), measured under the same load: the ratio ``build / (build -
arm)`` is what the ARM classes cost against a host-only build, with no
second build to drift against. Printed per variant and summed over the
examples, in wall-clock seconds (``_ratio``) and in CPU seconds of the build
and every child it waited for (``_cpu_ratio``: what the ARM classes cost on
a machine whose cores are all busy, where wall time is the share the
scheduler gives). Target: at most twice the host-only build (the worker
build's wall time; the exit status says whether it is met).

``--large`` builds instead the weight-only variant of a 1x3x1024x1024
segmenter (tests/tiny_models.py, 8 evaluation rows): a model whose emulated
rows, not the emulator's start, are the cost.

Usage: .venv/bin/python benchmarks/arm_cost.py [--models digits,sensor] [--large]
[--every-row] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg.build.arm import EmulatedRunner
from edgereg.build.variant import BenchSettings, build_variant
from edgereg.config import arm_classes
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


_LARGE_TOML = """\
[toolchain]
mnn = "{mnn}"
onnx = "{onnx}"
onnxruntime = "{onnxruntime}"
arm_samples = 8

[tiers.low]

[models.seg]
version = "1.0.0"
task = "generic"
source = {{ path = "seg.onnx", sha256 = "{onnx_sha}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation_sha}" }}

[[models.seg.inputs]]
name = "image"
shape = [1, 3, 1024, 1024]

[[models.seg.outputs]]
name = "mask"

[models.seg.variants.w8]
tier = "low"
quantization = {{ mode = "weight", bits = 8 }}
"""


def large_project(root: Path) -> config_mod.Config:
    """A project with the 1x3x1024x1024 segmenter's weight-only variant (8 evaluation rows)."""
    import hashlib
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    import tiny_models

    from edgereg.toolchain import installed_versions

    root.mkdir(parents=True, exist_ok=True)
    tiny_models.large_input_segmenter(root / "seg.onnx")
    size = tiny_models.LARGE_SIZE
    images = np.random.default_rng(29).uniform(-1, 1, (8, 3, size, size)).astype(np.float32)
    np.savez(root / "evaluation.npz", image=images)
    digest = {
        name: hashlib.sha256((root / name).read_bytes()).hexdigest()
        for name in ("seg.onnx", "evaluation.npz")
    }
    text = _LARGE_TOML.format(
        **installed_versions(),
        onnx_sha=digest["seg.onnx"],
        evaluation_sha=digest["evaluation.npz"],
    )
    (root / "models.toml").write_text(text, encoding="utf-8")
    return config_mod.load(root / "models.toml")


def _cpu_seconds() -> float:
    """CPU seconds of this process and the children it has waited for (emulators included)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated example models")
    parser.add_argument("--out", type=Path, default=None, help="where to build (default: temp)")
    parser.add_argument("--large", action="store_true", help="the 1024x1024 segmenter instead")
    parser.add_argument(
        "--every-row", action="store_true", help="also build with every class emulating every row"
    )
    args = parser.parse_args(argv)
    base = args.out or Path(tempfile.mkdtemp(prefix="arm-cost-"))
    config = (
        large_project(base / "project") if args.large else config_mod.load(ROOT / "models.toml")
    )
    wanted = set(args.models.split(",")) if args.models else None
    sysroot = arm_toolchain.find_sysroot(config.toolchain.mnn, root=arm_toolchain.arm_dir())
    builds: list[tuple[str, EmulatedRunner | None]] = [
        ("per_call", EmulatedRunner(sysroot, persistent=False)),
        ("worker", None),
    ]
    if args.every_row:
        builds.insert(0, ("every_row", EveryRowRunner(sysroot, persistent=False)))
    labels = [label for label, _ in builds]
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
            arm: dict[str, float] = {}
            cpu: dict[str, float] = {}
            arm_cpu: dict[str, float] = {}
            reused: dict[str, object] = {}
            # Each variant swaps the order, so neither build always runs on the warmer machine.
            for label, runner in builds if len(rows) % 2 == 0 else builds[::-1]:
                out = base / label
                marks: list[tuple[str, float]] = []
                start = time.perf_counter()
                cpu_start = _cpu_seconds()
                result = build_variant(
                    config,
                    model_name,
                    variant_name,
                    out,
                    bench=SETTINGS,
                    arm_runner=runner,
                    on_stage=lambda name, marks=marks: marks.append((name, _cpu_seconds())),
                )
                seconds[label] = time.perf_counter() - start
                arm[label] = result.stage_seconds.get("arm", 0.0)
                marks.append(("end", _cpu_seconds()))
                cpu[label] = marks[-1][1] - cpu_start
                at = next(i for i, (name, _) in enumerate(marks) if name == "arm")
                arm_cpu[label] = marks[at + 1][1] - marks[at][1]
                reused = {
                    c: r.get("rest_from")
                    for c, r in result.metrics["arm"]["classes"].items()
                    if r.get("rest_from")
                }
            row = {
                "variant": f"{model_name}/{variant_name}",
                "classes": list(classes),
                **{f"{k}_s": round(v, 1) for k, v in seconds.items()},
                **{f"{k}_arm_s": round(v, 1) for k, v in arm.items()},
                **{f"{k}_ratio": round(seconds[k] / (seconds[k] - arm[k]), 2) for k in seconds},
                **{f"{k}_cpu_s": round(v, 1) for k, v in cpu.items()},
                **{f"{k}_arm_cpu_s": round(v, 1) for k, v in arm_cpu.items()},
                **{f"{k}_cpu_ratio": round(cpu[k] / (cpu[k] - arm_cpu[k]), 2) for k in cpu},
                "rows_reused_from": reused,
                "load": round(os.getloadavg()[0], 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    total = {
        key: sum(float(r[key]) for r in rows)  # type: ignore[arg-type]
        for label in labels
        for key in (f"{label}_s", f"{label}_arm_s", f"{label}_cpu_s", f"{label}_arm_cpu_s")
    }
    ratios = {
        label: round(total[f"{label}_s"] / (total[f"{label}_s"] - total[f"{label}_arm_s"]), 2)
        for label in labels
    }
    cpu_ratios = {
        label: round(
            total[f"{label}_cpu_s"] / (total[f"{label}_cpu_s"] - total[f"{label}_arm_cpu_s"]), 2
        )
        for label in labels
    }
    print(
        json.dumps(
            {
                "variants": len(rows),
                **{k: round(v, 1) for k, v in total.items()},
                **{f"{label}_ratio": ratio for label, ratio in ratios.items()},
                **{f"{label}_cpu_ratio": ratio for label, ratio in cpu_ratios.items()},
                "target": TARGET,
                "load_at_end": round(os.getloadavg()[0], 1),
            }
        )
    )
    return 0 if ratios["worker"] <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
