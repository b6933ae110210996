"""ARM verification benchmark: what setting it up and running it costs.

1. Setup on a fresh machine: ``edgereg toolchain arm install`` into an empty
   directory (debootstrap --download-only of Debian's arm64 python3.11,
   dpkg-deb -x, pip of the aarch64 MNN and numpy wheels, an import check
   under QEMU): seconds and megabytes on disk. Needs the network (Debian,
   PyPI); ``--skip-setup`` measures the installed one's size only.
2. Every variant of every example model built into a temporary directory with
   ``build_variant`` and ``[toolchain] arm`` set to every class (so float
   variants, verified on no class by default, are measured too): the host's
   verify stage seconds (batched, whole evaluation set), each class's
   emulator seconds (probe rows + arm_samples rows, one process; the classes
   run side by side, so each is measured under the others' load) and the whole
   ARM stage's wall seconds, each as a multiple of the host verification.
   Target: one class costs at most a few times the host verification.

Usage: .venv/bin/python benchmarks/arm.py [--skip-setup] [--models digits,sensor]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgereg import config as config_mod
from edgereg.build.arm import ArmRunner, EmulatedRunner
from edgereg.build.variant import BenchSettings, build_variant
from edgereg.errors import BuildError
from edgereg.toolchain import arm as arm_toolchain

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = BenchSettings(threads=(1,), warmup=1, iterations=3)
RATIO_TARGET = 5.0


class TimedRunner(ArmRunner):
    """The real emulated runner, recording each class's emulator seconds."""

    def __init__(self, sysroot: arm_toolchain.Sysroot) -> None:
        self.real = EmulatedRunner(sysroot)
        self.seconds: dict[str, float] = {}

    def start(self, classes: Sequence[str]) -> None:
        self.real.start(classes)

    def close(self) -> None:
        self.real.close()

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
        run = self.real(
            artifact,
            cpu_class,
            inputs,
            input_names=input_names,
            output_names=output_names,
            precision=precision,
        )
        self.seconds[cpu_class] = run.seconds
        return run


def _setup(mnn: str) -> None:
    with tempfile.TemporaryDirectory(prefix="edgereg-arm-bench-") as tmp:
        result = arm_toolchain.install_sysroot(mnn, root=tmp)
        print(
            f"setup (fresh): {result.seconds:.1f} s, "
            f"{result.sysroot.size_bytes / 1e6:.0f} MB on disk (MNN {mnn}, numpy "
            f"{result.sysroot.numpy_version}, Debian {arm_toolchain.DEBIAN_SUITE})"
        )


def _all_classes(config: config_mod.Config) -> config_mod.Config:
    text = config.path.read_text(encoding="utf-8")
    classes = ", ".join(f'"{c}"' for c in config_mod.ARM_CLASSES)
    text = text.replace("[toolchain]\n", f"[toolchain]\narm = [{classes}]\n", 1)
    return config_mod.parse(text, file=str(config.path))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-setup", action="store_true", help="do not time a fresh install")
    parser.add_argument("--models", default="", help="comma-separated models (default: all)")
    args = parser.parse_args()
    config = config_mod.load(ROOT / "models.toml")
    mnn = config.toolchain.mnn
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if not args.skip_setup:
        _setup(mnn)
    sysroot = arm_toolchain.find_sysroot(mnn, root=arm_toolchain.arm_dir())
    print(f"installed sysroot: {sysroot.size_bytes / 1e6:.0f} MB ({sysroot.path})")
    cpus = arm_toolchain.qemu_cpus()
    for spec in arm_toolchain.CPU_CLASSES.values():
        print(f"  {spec.name}: -cpu {arm_toolchain.emulated_cpu(spec, cpus)}")
    measured = _all_classes(config)
    wanted = [m for m in args.models.split(",") if m] or list(config.models)
    header = (
        f"{'variant':<16} {'host s':>7} "
        + " ".join(f"{c + ' s':>10} {'x':>5}" for c in config_mod.ARM_CLASSES)
        + f" {'stage s':>8} {'x':>5}"
    )
    print(f"arm_samples {config.toolchain.arm_samples} (+ the probe's rows)")
    print(header)
    worst = 0.0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgereg-arm-bench-") as tmp:
        for model in wanted:
            for variant in config.models[model].variants:
                runner = TimedRunner(sysroot)
                note = ""
                host = stage = float("nan")
                try:
                    result = build_variant(
                        measured, model, variant, Path(tmp), bench=SETTINGS, arm_runner=runner
                    )
                    host = result.stage_seconds.get("verify", float("nan"))
                    stage = result.stage_seconds.get("arm", float("nan"))
                except BuildError as exc:
                    note = f"  ({exc.stage}: {exc.message.splitlines()[0][:60]})"
                cells = []
                for cpu_class in config_mod.ARM_CLASSES:
                    seconds = runner.seconds.get(cpu_class)
                    if seconds is None:
                        cells.append(f"{'-':>10} {'-':>5}")
                        continue
                    ratio = seconds / host if host == host and host > 0 else float("nan")
                    worst = max(worst, ratio) if ratio == ratio else worst
                    cells.append(f"{seconds:>10.2f} {ratio:>5.1f}")
                cells.append(f"{stage:>8.2f} {stage / host:>5.1f}")
                print(f"{model + '/' + variant:<16} {host:>7.2f} " + " ".join(cells) + note)
    print(f"total {time.perf_counter() - started:.0f} s; worst class/host ratio {worst:.1f}")
    print(
        f"target: one class <= {RATIO_TARGET:g}x host verification: "
        + ("met" if worst <= RATIO_TARGET else "NOT met")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
