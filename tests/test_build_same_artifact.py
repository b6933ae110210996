"""One artifact, one behaviour: each ARM class held to the host's run of the same artifact.

The pure rule (edgereg/build/arm_compare.py) on numbers shaped like the ones
measured on the examples: the i8mm int8 kernel wrong on channels 8-9 of ten
logits, ARM int8 kernels that agree with one another while x86 rounds
otherwise, fp16 arithmetic under ``precision = "low"``, a stream's state.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgereg.build.arm import ArmReport, ClassResult, ship_around_differing
from edgereg.build.arm_compare import (
    HOST,
    REASSOCIATION_RTOL,
    channel_axis,
    compare,
    compare_outputs,
)
from edgereg.build.quality import GateReport

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
