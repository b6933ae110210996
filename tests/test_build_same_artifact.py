"""One artifact, one behaviour: each ARM class held to the host's run of the same artifact.

The pure rule (edgereg/build/arm_compare.py) on numbers shaped like the ones
measured on the examples: the i8mm int8 kernel wrong on channels 8-9 of ten
logits, ARM int8 kernels that agree with one another while x86 rounds
otherwise, fp16 arithmetic under ``precision = "low"``, a stream's state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from buildkit import FAST_BENCH

from edgereg import config as config_module
from edgereg.build.arm import (
    ArmReport,
    ArmRunner,
    ClassResult,
    EmulatedRunner,
    ship_around_differing,
)
from edgereg.build.arm_compare import (
    HOST,
    REASSOCIATION_RTOL,
    channel_axis,
    compare,
    compare_outputs,
)
from edgereg.build.outputs import ARTIFACT, METRICS
from edgereg.build.quality import GateReport
from edgereg.build.variant import build_variant
from edgereg.errors import GateError
from edgereg.toolchain.arm import ArmRun, find_sysroot

RNG = np.random.default_rng(29)
#: Ten logits of 16 rows, as the probe script stacks them: (rows, 1, 10).
LOGITS = RNG.normal(0, 4, (16, 1, 10)).astype(np.float32)
FP32 = {HOST: "fp32", "armv8": "fp32", "armv8.2": "fp32", "armv9": "fp32"}


def reassociated(array: np.ndarray, scale: float = 3e-6) -> np.ndarray:
    """The same numbers added in another order: a few ulps off, per element."""
    noise = np.random.default_rng(7).uniform(-1, 1, array.shape)
    return (array + noise * scale * float(np.max(np.abs(array)))).astype(array.dtype)


@pytest.mark.parametrize(
    ("rank", "axis"), [(0, None), (1, 0), (2, 1), (3, 2), (4, 1), (5, 1)], ids=str
)
def test_the_channel_axis_of_one_forwards_tensor(rank: int, axis: int | None) -> None:
    # [1, C] logits and [T, 1, C] or [2, 1, H] states: the last axis; NCHW maps: axis 1.
    assert channel_axis(rank) == axis


def test_reassociation_agrees_and_a_channel_tail_differs_by_name() -> None:
    assert compare_outputs(reassociated(LOGITS), LOGITS, rtol=REASSOCIATION_RTOL["fp32"]) is None
    wrong = LOGITS.copy()
    wrong[:, :, 8:] += 0.375  # the armv9 channels, 0.375 off
    diff = compare_outputs(wrong, LOGITS, rtol=REASSOCIATION_RTOL["fp32"])
    assert diff is not None
    assert diff.channels == (8, 9)
    assert diff.max_abs_diff == pytest.approx(0.375, rel=1e-5)
    assert diff.tolerance == pytest.approx(float(np.max(np.abs(LOGITS))) * 2.0**-10)
    assert diff.describe("logits").startswith("logits channels 8, 9: 0.375 off (tolerance ")


def test_a_dense_map_is_compared_per_channel_of_axis_1() -> None:
    maps = RNG.uniform(0, 1, (4, 1, 3, 8, 8)).astype(np.float32)
    wrong = maps.copy()
    wrong[2, 0, 1, 5, 5] += 0.2
    diff = compare_outputs(wrong, maps, rtol=REASSOCIATION_RTOL["fp32"])
    assert diff is not None
    assert diff.channels == (1,)


def test_a_nan_on_one_side_differs_and_on_both_agrees() -> None:
    nan = LOGITS.copy()
    nan[0, 0, 3] = np.nan
    diff = compare_outputs(nan, LOGITS, rtol=1.0)
    assert diff is not None
    assert diff.channels == (3,)
    assert compare_outputs(nan, nan.copy(), rtol=REASSOCIATION_RTOL["fp32"]) is None


def test_the_i8mm_class_differs_from_the_host_and_the_others_agree() -> None:
    armv9 = LOGITS.copy()
    armv9[:, :, 8:] *= 1.5
    runs = {
        HOST: {"logits": LOGITS},
        "armv8": {"logits": LOGITS.copy()},
        "armv8.2": {"logits": reassociated(LOGITS)},
        "armv9": {"logits": armv9},
    }
    found = compare(runs, FP32, ["logits"])
    assert found.reference == HOST
    assert set(found.differs) == {"armv9"}
    assert found.differs["armv9"]["logits"].channels == (8, 9)
    assert found.host_differs == {}


def test_arm_int8_kernels_that_agree_with_each_other_outvote_x86s_rounding() -> None:
    # Measured on the examples' int8 variants: every ARM class the same bits, x86 one
    # quantization step off on some channels (textrec: channels 4-7).
    x86 = LOGITS.copy()
    x86[:, :, 4:8] += 0.1
    runs = {
        HOST: {"logits": x86},
        "armv8": {"logits": LOGITS},
        "armv8.2": {"logits": LOGITS.copy()},
        "armv9": {"logits": LOGITS.copy()},
    }
    found = compare(runs, FP32, ["logits"])
    assert found.reference == "armv8"
    assert found.differs == {}
    assert found.host_differs["logits"].channels == (4, 5, 6, 7)
    # A class that differs from that consensus is still named.
    runs["armv9"] = {"logits": LOGITS + np.where(np.arange(10) >= 8, 0.3, 0.0)}
    again = compare(runs, FP32, ["logits"])
    assert again.reference == "armv8"
    assert set(again.differs) == {"armv9"}


def test_a_lone_class_is_held_to_the_host() -> None:
    off = LOGITS + 0.05
    found = compare({HOST: {"logits": LOGITS}, "armv8": {"logits": off}}, FP32, ["logits"])
    assert found.reference == HOST
    assert set(found.differs) == {"armv8"}


def test_fp16_arithmetic_gets_fp16s_tolerance_only_where_it_computes() -> None:
    # precision = "low": fp16 on armv8.2 and armv9 (2.2e-3 of the scale measured), fp32 on armv8.
    half = (LOGITS + 2e-3 * float(np.max(np.abs(LOGITS)))).astype(np.float32)
    runs = {
        HOST: {"logits": LOGITS},
        "armv8": {"logits": half},
        "armv8.2": {"logits": half.copy()},
    }
    arithmetic = {HOST: "fp32", "armv8": "fp32", "armv8.2": "fp16"}
    found = compare(runs, arithmetic, ["logits"])
    # armv8 computes in fp32: 2e-3 is beyond re-association there.
    assert found.reference == HOST
    assert set(found.differs) == {"armv8"}


def test_a_streams_state_is_compared_too() -> None:
    state = RNG.normal(0, 1, (8, 2, 1, 32)).astype(np.float32)
    drifted = state.copy()
    drifted[:, 1, 0, 17] += 0.05
    prob = RNG.uniform(0, 1, (8, 1, 1)).astype(np.float32)
    runs = {
        HOST: {"prob": prob, "state_out": state},
        "armv8": {"prob": prob.copy(), "state_out": drifted},
    }
    found = compare(runs, {HOST: "fp32", "armv8": "fp32"}, ["prob", "state_out"])
    assert list(found.differs["armv8"]) == ["state_out"]
    assert found.differs["armv8"]["state_out"].channels == (17,)


def _result(cpu_class: str, features: tuple[str, ...], differs: bool) -> ClassResult:
    found = compare(
        {HOST: {"y": LOGITS}, cpu_class: {"y": LOGITS + (1.0 if differs else 0.0)}},
        {HOST: "fp32", cpu_class: "fp32"},
        ["y"],
    )
    return ClassResult(
        cpu_class=cpu_class,
        qemu_cpu=cpu_class,
        features=features,
        agreement={},
        scores=None,
        gates=GateReport(),
        avoided=False,
        differs=found.differs.get(cpu_class, {}),
    )


def _report(*results: ClassResult, avoid: tuple[str, ...] = ()) -> ArmReport:
    return ArmReport(results=results, samples=16, mnn_version="3.6.1", precision="normal",
                     avoid_cpu=avoid)  # fmt: skip


def test_a_differing_class_is_shipped_around_only_when_an_instead_exists() -> None:
    report = _report(
        _result("armv8", (), False),
        _result("armv8.2", ("dotprod", "fp16"), False),
        _result("armv9", ("dotprod", "fp16", "i8mm", "sve2"), True),
    )
    assert not report.passed
    assert "differs from the host's run of the same artifact: y channels" in " ".join(
        report.describe_failures()
    )
    kept, added = ship_around_differing(report, None)
    assert (kept, added) == (report, {})
    shipped, added = ship_around_differing(report, "w8")
    assert list(added) == ["i8mm"]
    assert "armv9: y channels 0, 1, 2" in added["i8mm"]
    assert shipped.avoid_cpu == ("i8mm",)
    assert shipped.passed
    assert [r.status for r in shipped.results] == ["passed", "passed", "avoided"]


def test_no_feature_tells_the_differing_class_apart_so_it_fails() -> None:
    # armv8 differs but has no feature the agreeing classes lack: nothing to avoid.
    report = _report(
        _result("armv8", (), True),
        _result("armv8.2", ("dotprod", "fp16"), False),
    )
    shipped, added = ship_around_differing(report, "w8")
    assert added == {}
    assert not shipped.passed


# --- the real thing: MNN's ARM kernels under QEMU, the host's MNN -----------------------

_TOML = """\
[toolchain]
mnn = "{mnn}"
onnx = "{onnx}"
onnxruntime = "{onnxruntime}"
arm_samples = 8

[tiers.high]
min_ram_mb = 6144

[tiers.low]

[models.net]
version = "1.0.0"
task = "generic"
source = {{ path = "net.onnx", sha256 = "{net}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}", samples = 32 }}

[[models.net.inputs]]
name = "x"
shape = [1, {inputs}]

[[models.net.outputs]]
name = "logits"

[models.net.variants.int8]
tier = "high"
quantization = {{ mode = "int8", method = "KL" }}

[models.net.variants.w8]
tier = "low"
quantization = {{ mode = "weight", bits = 8 }}
arm = ["armv8"]
"""


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with the 1026-output MLP (tests/tiny_models.py): int8 and w8."""
    import hashlib

    import onnxruntime as ort
    import tiny_models
    from buildkit import write_npz

    from edgereg.toolchain import installed_versions

    root = tmp_path_factory.mktemp("wide")
    tiny_models.wide_head_model(root / "net.onnx")
    x = np.random.default_rng(1).normal(0, 1, (96, tiny_models.WIDE_INPUTS)).astype(np.float32)
    session = ort.InferenceSession(str(root / "net.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": x[:1]})[0].shape == (1, tiny_models.WIDE_OUTPUTS)
    write_npz(root / "evaluation.npz", {"x": x[:64]})
    write_npz(root / "calibration.npz", {"x": x[64:]})
    pins = {
        name: hashlib.sha256((root / f"{name}.{suffix}").read_bytes()).hexdigest()
        for name, suffix in (("net", "onnx"), ("evaluation", "npz"), ("calibration", "npz"))
    }
    text = _TOML.format(**installed_versions(), **pins, inputs=tiny_models.WIDE_INPUTS)
    (root / "models.toml").write_text(text, encoding="utf-8")
    return root


def _load(root: Path, text: str | None = None) -> config_module.Config:
    path = root / "models.toml"
    return config_module.parse(text or path.read_text(encoding="utf-8"), file=str(path))


@pytest.mark.slow
def test_int8_wrong_only_on_i8mm_within_the_int8_gates_is_caught_and_shipped_around(
    wide: Path, tmp_path: Path
) -> None:
    out = tmp_path / "build"
    with pytest.raises(GateError) as caught:
        build_variant(_load(wide), "net", "int8", out, bench=FAST_BENCH)
    message = caught.value.message
    # Only the new rule names armv9: its numbers against fp32 are within int8's gates.
    lines = [line for line in message.splitlines() if line.strip().startswith("arm ")]
    assert len(lines) == 1, message
    assert lines[0].strip().startswith("arm armv9 (-cpu ")
    assert "differs from armv8's run of the same artifact (the classes' consensus)" in lines[0]
    assert "logits channels 1024, 1025: " in lines[0]
    assert 'avoid_cpu = ["i8mm"]' in (caught.value.hint or "")
    arm = json.loads((out / "net" / "int8" / METRICS).read_text())["arm"]
    armv9 = arm["classes"]["armv9"]
    assert armv9["agreement"]["logits"]["cosine"] >= 0.98  # int8's default min_cosine
    assert armv9["agreement"]["logits"]["snr_db"] >= 13.0  # and min_snr_db
    assert armv9["differs"]["logits"]["channels"] == [1024, 1025]
    assert armv9["status"] == "failed"
    for cpu_class in ("armv8", "armv8.2"):
        assert arm["classes"][cpu_class]["status"] == "passed"
        assert arm["classes"][cpu_class]["differs"] == {}
    # x86's int8 kernels round a few logits one step otherwise (channels 231 and 698
    # here); the ARM classes agree bit for bit, and their consensus is the reference.
    assert arm["same_artifact"]["reference"] == "armv8"
    assert set(arm["same_artifact"]["host_differs"]["logits"]["channels"]) <= set(range(1024))
    assert not (out / "net" / "int8" / ARTIFACT).exists()

    # With an instead (its declared avoid_cpu, bf16, matches no class), the build adds
    # i8mm: devices with it install w8. The emulator does not run again (cached).
    text = (
        (wide / "models.toml")
        .read_text(encoding="utf-8")
        .replace(
            'quantization = { mode = "int8", method = "KL" }',
            'quantization = { mode = "int8", method = "KL" }\navoid_cpu = ["bf16"]\ninstead = "w8"',
        )
    )
    result = build_variant(_load(wide, text), "net", "int8", out, bench=FAST_BENCH)
    arm = result.metrics["arm"]
    assert arm["avoid_cpu"] == ["bf16", "i8mm"]
    assert arm["instead"] == "w8"
    assert "armv9: logits channels 1024, 1025" in arm["avoid_cpu_added"]["i8mm"]
    assert arm["classes"]["armv9"]["status"] == "avoided"
    assert result.metrics["gates"]["arm[armv9]"] is True
    assert (out / "net" / "int8" / ARTIFACT).is_file()


class PerturbingRunner(ArmRunner):
    """The real emulator, with one output channel of one class off by ``offset``."""

    def __init__(self, cpu_class: str, channel: int, offset: float) -> None:
        self.real = EmulatedRunner(find_sysroot("3.6.1"))
        self.target = (cpu_class, channel, offset)
        self.calls: list[str] = []

    def available_cpus(self) -> tuple[str, ...]:
        return self.real.available_cpus()

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
        run = self.real(
            artifact,
            cpu_class,
            inputs,
            input_names=input_names,
            output_names=output_names,
            precision=precision,
        )
        target, channel, offset = self.target
        if cpu_class != target:
            return run
        outputs = {name: array.copy() for name, array in run.outputs.items()}
        for array in outputs.values():
            array[..., channel] += offset
        return ArmRun(run.cpu_class, run.qemu_cpu, run.features, outputs, run.mnn_version, 0.0)


@pytest.mark.slow
def test_one_channel_off_by_less_than_the_loose_gate_fails_that_class(
    wide: Path, tmp_path: Path
) -> None:
    # w8 is gated at cosine 0.99 against fp32; 0.2 on one of 1026 logits (a few percent
    # of their scale) leaves it far above that, and far beyond float re-association.
    runner = PerturbingRunner("armv8", channel=3, offset=0.2)
    out = tmp_path / "build"
    with pytest.raises(GateError) as caught:
        build_variant(_load(wide), "net", "w8", out, bench=FAST_BENCH, arm_runner=runner)
    assert runner.calls == ["armv8"]
    message = caught.value.message
    assert "arm armv8 (-cpu " in message
    assert "differs from the host's run of the same artifact: logits channel 3: 0.2 off" in message
    armv8 = json.loads((out / "net" / "w8" / METRICS).read_text())["arm"]["classes"]["armv8"]
    # Without the new rule the class passes: every gate against fp32 holds.
    assert armv8["agreement"]["logits"]["cosine"] > 0.999
    assert armv8["failed"] == [
        line for line in armv8["failed"] if line.startswith("differs from the host's run")
    ]
    assert armv8["differs"]["logits"]["channels"] == [3]
    # The same runner without the perturbation: the class computes as the host does.
    clean = build_variant(_load(wide), "net", "w8", tmp_path / "clean", bench=FAST_BENCH)
    assert clean.metrics["arm"]["classes"]["armv8"]["differs"] == {}
    assert clean.metrics["arm"]["classes"]["armv8"]["status"] == "passed"
