"""ARM verification: the example variants on MNN's real ARM kernels under QEMU.

Nothing is mocked: the aarch64 sysroot is the one `make venv` installs
(`edgereg toolchain arm install`) into .edgereg/arm/ (or $EDGEREG_ARM_DIR),
MNN 3.6.1's own aarch64 wheel runs under qemu-aarch64-static, and the CPU
model decides its kernels. The example digits int8 (10 logits) is wrong on
armv9 (i8mm: channels 8-9) and right on armv8 and armv8.2. One test wraps the
real runner to corrupt one class, so a failing case remains if a future MNN
fixes its kernel. The same runner can start the real launcher with an emulator
that dies by a signal, which QEMU cannot be made to do on demand.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import buildkit
import numpy as np
import pytest
from buildkit import FAST_BENCH
from click.testing import CliRunner

from edgereg import config as config_module
from edgereg.build.arm import ArmRunner, EmulatedRunner, arm_rows
from edgereg.build.outputs import ARTIFACT, METRICS
from edgereg.build.variant import build_variant
from edgereg.cli import main
from edgereg.errors import ConfigError, GateError
from edgereg.protocol.decision import AppFacts, Fit, fit
from edgereg.registry import entry_for
from edgereg.registry._release import prepare_release
from edgereg.toolchain.arm import (
    CPU_CLASSES,
    INSTALL_COMMAND,
    ArmError,
    ArmRun,
    find_sysroot,
    parse_features,
    run_on_class,
)

REPO = Path(__file__).resolve().parent.parent

# Builds of the full example models: `make test-fast` leaves them out, `make test` runs them.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example() -> config_module.Config:
    return config_module.load(REPO / "models.toml")


def edited(config: config_module.Config, old: str, new: str) -> config_module.Config:
    text = config.path.read_text(encoding="utf-8")
    assert old in text
    return config_module.parse(text.replace(old, new, 1), file=str(config.path))


def metrics_of(out: Path, model: str, variant: str) -> Any:
    return json.loads((out / model / variant / METRICS).read_text(encoding="utf-8"))


def crashing_emulator(tmp_path: Path) -> Path:
    """An emulator that dies by SIGSEGV, as QEMU does on a guest's uncaught segfault."""
    path = tmp_path / "qemu-aarch64-crashing"
    path.write_text(
        "#!/bin/sh\necho 'qemu: uncaught target signal 11 (Segmentation fault)' >&2\n"
        "kill -SEGV $$\n",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


class CountingRunner(ArmRunner):
    """The real emulated runner, counting its runs and optionally corrupting one class.

    Args:
        corrupt: A class whose outputs get one channel wrong.
        crash: A class run by ``crash_with`` (through the real launcher) instead of QEMU.
        crash_with: The emulator that crashes.
        cpus: The emulator's ``-cpu`` models, to stand for another QEMU (default: installed).
    """

    def __init__(
        self,
        corrupt: str | None = None,
        *,
        crash: str | None = None,
        crash_with: Path | None = None,
        cpus: Sequence[str] | None = None,
    ) -> None:
        self.real = EmulatedRunner(find_sysroot("3.6.1"), cpus=cpus)
        self.corrupt = corrupt
        self.crash = crash
        self.crash_with = crash_with
        self.calls: list[str] = []

    def available_cpus(self) -> tuple[str, ...]:
        return self.real.available_cpus()

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
    ) -> ArmRun:
        self.calls.append(cpu_class)
        if cpu_class == self.crash:
            assert self.crash_with is not None
            return run_on_class(
                artifact,
                cpu_class,
                inputs,
                input_names=input_names,
                output_names=output_names,
                sysroot=self.real.sysroot,
                precision=precision,
                available_cpus=self.available_cpus(),
                qemu=str(self.crash_with),
            )
        run = self.real(
            artifact,
            cpu_class,
            inputs,
            input_names=input_names,
            output_names=output_names,
            precision=precision,
        )
        if cpu_class != self.corrupt:
            return run
        # A kernel that gets one channel wrong: what a runner fault looks like.
        outputs = {name: array.copy() for name, array in run.outputs.items()}
        for array in outputs.values():
            array[..., 3] += 5.0
        return ArmRun(run.cpu_class, run.qemu_cpu, run.features, outputs, run.mnn_version, 0.0)


def test_the_emulator_reports_each_class_features() -> None:
    line = "The device supports: i8sdot:1, fp16:1, i8mm: 1, sve2: 1, sme2: 0"
    assert parse_features(line) == ("dotprod", "fp16", "i8mm", "sve2")
    assert parse_features("The device supports: i8sdot:0, fp16:0, i8mm: 0") == ()
    result = CliRunner().invoke(main, ["toolchain", "arm", "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output[result.output.index("{") :])
    assert listed["sysroot"], f"run `{INSTALL_COMMAND}` (make venv) once"
    assert [c["class"] for c in listed["classes"]] == ["armv8", "armv8.2", "armv9"]
    assert all(c["cpu"] for c in listed["classes"])


def test_int8_with_ten_logits_is_caught_on_armv9_only_and_shipped_around(
    example: config_module.Config, tmp_path: Path
) -> None:
    out = tmp_path / "build"
    # The example declares avoid_cpu = ["i8mm"], instead = "w8": the build passes,
    # and armv9 is reported as avoided with its (wrong) numbers.
    runner = CountingRunner()
    result = build_variant(example, "digits", "int8", out, bench=FAST_BENCH, arm_runner=runner)
    # armv8.2 emulates every row; armv8 matches it bit for bit on its first two rows and
    # stops there; armv9 does not (i8mm) and emulates every row.
    assert sorted(runner.calls) == ["armv8", "armv8.2", "armv9", "armv9"]
    arm = result.metrics["arm"]
    assert arm["mnn"] == "3.6.1"
    classes = arm["classes"]
    assert classes["armv8"]["rest_from"] == "armv8.2"
    assert "rest_from" not in classes["armv9"]
    assert classes["armv8"]["status"] == "passed"
    assert classes["armv8.2"]["status"] == "passed"
    assert classes["armv9"]["status"] == "avoided"
    assert not classes["armv9"]["gates_passed"]
    assert "i8mm" in classes["armv9"]["features"]
    assert classes["armv8.2"]["features"] == ["dotprod", "fp16"]
    assert classes["armv8"]["features"] == []
    # On sdot and plain NEON cores int8 is bit-identical to x86, so it agrees as well.
    assert classes["armv9"]["agreement"]["logits"]["cosine"] < 0.95
    assert classes["armv8"]["agreement"]["logits"]["cosine"] > 0.98
    assert (out / "digits" / "int8" / ARTIFACT).is_file()

    # Without avoid_cpu the same artifact fails, naming armv9 and only armv9; the
    # emulator does not run again (cached by artifact digest, class, MNN version).
    strict = edited(example, 'avoid_cpu = ["i8mm"]\ninstead = "w8"\n', "")
    again = CountingRunner()
    with pytest.raises(GateError) as caught:
        build_variant(strict, "digits", "int8", out, bench=FAST_BENCH, arm_runner=again)
    assert again.calls == []
    error = caught.value
    assert error.stage == "arm verify"
    assert "armv9 (-cpu " in error.message
    assert "i8mm" in error.message
    assert "armv8 " not in error.message
    assert "armv8.2" not in error.message
    assert re.search(r"min_cosine\[logits\] 0\.\d+ < 0\.98", error.message)
    assert 'avoid_cpu = ["i8mm"]' in (error.hint or "")
    assert 'instead = "w8"' in (error.hint or "")
    failed = metrics_of(out, "digits", "int8")
    assert failed["status"] == "failed"
    assert failed["gates"]["arm[armv9]"] is False
    assert failed["gates"]["arm[armv8]"] is True
    assert any(line.startswith("arm armv9") for line in failed["failed"])
    assert not (out / "digits" / "int8" / ARTIFACT).exists()


def test_a_runner_fault_on_one_class_fails_that_class(
    example: config_module.Config, tmp_path: Path
) -> None:
    runner = CountingRunner(corrupt="armv8.2")
    with pytest.raises(GateError) as caught:
        build_variant(
            example, "digits", "w8", tmp_path / "build", bench=FAST_BENCH, arm_runner=runner
        )
    message = caught.value.message
    assert "arm armv8.2 (-cpu " in message
    assert "arm armv8 (" not in message
    assert "arm armv9" not in message
    classes = metrics_of(tmp_path / "build", "digits", "w8")["arm"]["classes"]
    assert [classes[c]["status"] for c in ("armv8", "armv8.2", "armv9")] == [
        "passed",
        "failed",
        "passed",
    ]


def test_an_emulator_crash_on_one_class_fails_that_class(
    example: config_module.Config, tmp_path: Path
) -> None:
    out = tmp_path / "build"
    runner = CountingRunner(crash="armv8.2", crash_with=crashing_emulator(tmp_path))
    with pytest.raises(GateError) as caught:
        build_variant(example, "digits", "w8", out, bench=FAST_BENCH, arm_runner=runner)
    # armv8 runs its first rows, then every row: fp32 there, fp16 on armv9, so no match.
    assert sorted(set(runner.calls)) == ["armv8", "armv8.2", "armv9"]
    crashed = "the emulated armv8.2 run (cortex-a76) crashed (killed by signal SIGSEGV)"
    message = caught.value.message
    assert f"arm armv8.2 (-cpu cortex-a76: dotprod, fp16): {crashed}" in message
    assert "arm armv8 (" not in message
    assert "arm armv9" not in message
    assert caught.value.stage == "arm verify"
    # Recorded like a failed gate: the class, why, and the other classes' numbers.
    metrics = metrics_of(out, "digits", "w8")
    assert metrics["status"] == "failed"
    assert metrics["gates"]["arm[armv8.2]"] is False
    assert metrics["gates"]["arm[armv8]"] is True
    assert any(crashed in line for line in metrics["failed"])
    classes = metrics["arm"]["classes"]
    assert [classes[c]["status"] for c in ("armv8", "armv8.2", "armv9")] == [
        "passed",
        "failed",
        "passed",
    ]
    assert crashed in classes["armv8.2"]["error"]
    assert classes["armv8.2"]["failed"] == [classes["armv8.2"]["error"]]
    assert classes["armv8.2"]["agreement"] == {}
    assert classes["armv8"]["agreement"]["logits"]["cosine"] > 0.98
    assert "error" not in classes["armv8"]
    assert not (out / "digits" / "w8" / ARTIFACT).exists()

    # A crash is not cached: the next build runs that class again (the others
    # come from the cache), and it passes.
    again = CountingRunner()
    result = build_variant(example, "digits", "w8", out, bench=FAST_BENCH, arm_runner=again)
    assert again.calls == ["armv8.2"]
    assert result.metrics["arm"]["classes"]["armv8.2"]["status"] == "passed"


def test_a_qemu_that_stands_in_with_another_cpu_runs_the_class_again(
    example: config_module.Config, tmp_path: Path
) -> None:
    narrowed = edited(example, "min_mnn_runtime = ", 'arm = ["armv8.2"]\nmin_mnn_runtime = ')
    out = tmp_path / "build"
    first = CountingRunner()
    assert {"cortex-a76", "neoverse-n1"} <= set(first.available_cpus())
    build_variant(narrowed, "digits", "w8", out, bench=FAST_BENCH, arm_runner=first)
    assert first.calls == ["armv8.2"]
    assert metrics_of(out, "digits", "w8")["arm"]["classes"]["armv8.2"]["cpu"] == "cortex-a76"
    same = CountingRunner()
    build_variant(narrowed, "digits", "w8", out, bench=FAST_BENCH, arm_runner=same)
    assert same.calls == []  # the same emulator: the cached run
    # An emulator without cortex-a76 (an upgrade that drops or renames it)
    # stands in with neoverse-n1, other kernels: the class runs again.
    upgraded = CountingRunner(cpus=[c for c in first.available_cpus() if c != "cortex-a76"])
    result = build_variant(narrowed, "digits", "w8", out, bench=FAST_BENCH, arm_runner=upgraded)
    assert upgraded.calls == ["armv8.2"]
    assert result.metrics["arm"]["classes"]["armv8.2"]["cpu"] == "neoverse-n1"


def test_precision_low_is_gated_on_the_fp16_classes(
    example: config_module.Config, tmp_path: Path
) -> None:
    # digits/fp32 hinted to run at precision = "low": fp16 arithmetic on cores that
    # have it (x86 and armv8 stay fp32). A budget fp32 arithmetic meets (errors
    # ~1e-5) and fp16's (~3e-3) does not fails the fp16 classes only.
    old = 'runtime = { threads = 4, backends = ["opencl", "cpu"] }'
    new = (
        'runtime = { threads = 4, backends = ["opencl", "cpu"], precision = "low" }\n'
        "budgets = { max_abs_error = 0.001 }"
    )
    text = example.path.read_text(encoding="utf-8")
    start = text.index("[models.digits.variants.fp32]")
    low = config_module.parse(
        text[:start] + text[start:].replace(old, new, 1), file=str(example.path)
    )
    assert config_module.arm_classes(low, "digits", "fp32") == tuple(CPU_CLASSES)
    out = tmp_path / "build"
    with pytest.raises(GateError) as caught:
        build_variant(low, "digits", "fp32", out, bench=FAST_BENCH)
    arm = metrics_of(out, "digits", "fp32")["arm"]
    assert arm["precision"] == "low"
    states = {c: r["status"] for c, r in arm["classes"].items()}
    assert states == {"armv8": "passed", "armv8.2": "failed", "armv9": "failed"}
    errors = {c: r["agreement"]["logits"]["max_abs_error"] for c, r in arm["classes"].items()}
    assert errors["armv8"] < 1e-4 < errors["armv8.2"]
    assert "max_abs_error[logits]" in caught.value.message
    assert 'precision = "normal"' in (caught.value.hint or "")


def test_a_missing_sysroot_names_the_install_command(
    example: config_module.Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEREG_ARM_DIR", str(tmp_path / "nothing"))
    with pytest.raises(ArmError) as caught:
        build_variant(example, "digits", "w8", tmp_path / "build", bench=FAST_BENCH)
    assert caught.value.reason == "missing"
    assert INSTALL_COMMAND in (caught.value.hint or "")
    # Found before any stage did work (not after convert, verify and benchmark).
    assert caught.value.stage == "toolchain"
    record = metrics_of(tmp_path / "build", "digits", "w8")
    assert record["stages"] == ["toolchain"]
    assert record["error"]["stage"] == "toolchain"


def test_rows_are_the_probe_and_a_spread() -> None:
    rows = arm_rows(100, np.array([3, 50]), 5)
    assert rows.tolist() == [0, 3, 25, 50, 74, 99]
    assert arm_rows(4, np.array([1]), 16).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('avoid_cpu = ["i8mm"]\n', "", "needs avoid_cpu"),
        ('instead = "w8"', 'instead = "nope"', "is not another variant"),
        ('instead = "w8"', 'instead = "int8"', "is not another variant"),
        ('avoid_cpu = ["i8mm"]', 'avoid_cpu = ["I8MM"]', "avoid_cpu"),
        ('avoid_cpu = ["i8mm"]', 'avoid_cpu = ["i8mm", "i8mm"]', "once"),
        ("min_mnn_runtime = ", 'arm = ["armv7"]\nmin_mnn_runtime = ', "arm"),
    ],
)
def test_ship_around_settings_are_checked(
    example: config_module.Config, old: str, new: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        edited(example, old, new)
    assert message in str(caught.value)


def test_classes_default_by_precision(example: config_module.Config) -> None:
    assert config_module.arm_classes(example, "digits", "fp32") == ()
    assert config_module.arm_classes(example, "digits", "int8") == tuple(CPU_CLASSES)
    assert config_module.arm_classes(example, "digits", "w8") == tuple(CPU_CLASSES)
    narrowed = edited(example, "min_mnn_runtime = ", 'arm = ["armv9"]\nmin_mnn_runtime = ')
    assert config_module.arm_classes(narrowed, "digits", "fp32") == ("armv9",)


def test_publish_ships_avoid_cpu_and_instead(example: config_module.Config, tmp_path: Path) -> None:
    out = tmp_path / "build"
    for variant in ("fp32", "int8", "w8"):
        build_variant(example, "digits", variant, out, bench=FAST_BENCH)
    prepared = prepare_release(
        example, "digits", out, version="1.0.0", now=datetime(2026, 12, 1, tzinfo=timezone.utc)
    )
    # The release record carries what the build verified, as the variant's own fields.
    int8 = prepared.record.variants["int8"]
    assert (int8.avoid_cpu, int8.instead) == (["i8mm"], "w8")
    assert prepared.record.variants["w8"].avoid_cpu is None
    mid = entry_for(prepared.record, "mid")
    assert mid is not None
    assert mid.variant == "int8"
    assert mid.avoid_cpu == ["i8mm"]
    assert mid.instead is not None
    low = entry_for(prepared.record, "low")
    assert low is not None
    assert mid.instead == low  # the w8 entry, as the low tier gets it
    high = entry_for(prepared.record, "high")
    assert high is not None
    assert high.avoid_cpu is None
    assert high.instead is None
    # The protocol's own fit rule: an i8mm phone installs w8, an sdot phone int8.
    phone = fit(mid, AppFacts(mnn_runtime="3.6.1", cpu_features=frozenset({"dotprod", "i8mm"})))
    assert isinstance(phone, Fit)
    assert phone.entry == low
    assert phone.substitute == "cpu-unsupported"
    older = fit(mid, AppFacts(mnn_runtime="3.6.1", cpu_features=frozenset({"dotprod", "fp16"})))
    assert isinstance(older, Fit)
    assert older.entry == mid
    assert older.substitute is None


def test_dvc_repro_stays_a_no_op_with_arm_verification(tmp_path: Path) -> None:
    project = buildkit.write_project(tmp_path / "repo")
    project.edit("arm = []\n", 'arm = ["armv8"]\n')
    stage = "build-vision-w8"

    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=project.root, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    for command in (
        ("git", "init", "--quiet"),
        ("dvc", "init", "--quiet"),
        ("edgereg", "dvc", "sync"),
        ("git", "add", "--all"),
        ("git", "commit", "--quiet", "-m", "tiny project"),
    ):
        run(*command)
    assert f"Running stage '{stage}'" in run("dvc", "repro", stage)
    metrics = metrics_of(project.out_root, "vision", "w8")
    assert metrics["arm"]["classes"]["armv8"]["status"] == "passed"
    run("git", "add", "--all")
    run("git", "commit", "--quiet", "-m", "built")
    assert "Running stage" not in run("dvc", "repro", stage)
    # A forced rebuild runs the emulator's cached result again: the same metrics
    # bytes, so dvc.lock does not change.
    assert f"Running stage '{stage}'" in run("dvc", "repro", "--force", stage)
    run("git", "diff", "--exit-code", "--", "dvc.lock")
