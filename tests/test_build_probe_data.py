"""Probes of large inputs: the tensors in a data blob beside the probe, and what no client holds.

The whole path (a 1x3x1024x1024 model through `edgereg add`, `dvc repro`,
publish, `edgereg serve` and every client's self-test) is
tests/test_clients_harness.py::test_a_1024_input_model_ships_with_its_probe_data_blob;
here the pieces, fast: the split and its read-back, the rule that decides
it from models.toml, the stage outputs DVC is told, and the limits.
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from edgereg import config as config_module
from edgereg.build.dvc import render_dvc_yaml
from edgereg.build.outputs import (
    PROBE_DATA,
    PROBE_INLINE_INPUT_BYTES,
    probe_input_bytes,
    writes_probe_data,
)
from edgereg.build.probe import MAX_MODEL_BYTES, check_client_limits, probe_bytes, split_probe
from edgereg.errors import BuildError
from edgereg.protocol.probe import (
    MAX_PROBE_BYTES,
    MAX_PROBE_DATA_BYTES,
    GoldenProbe,
    ProbeCase,
    ProbeStep,
    ProbeTensor,
    ProbeTolerance,
    check_probe,
)
from edgereg.protocol.wire import from_bytes


def _tensor(name: str, raw: bytes, shape: list[int]) -> ProbeTensor:
    return ProbeTensor(
        name=name, dtype="float32", shape=shape, data=base64.b64encode(raw).decode("ascii")
    )


def _probe() -> GoldenProbe:
    x = bytes(range(48))  # 12 float32 values
    y = bytes(range(100, 116))  # 4
    return GoldenProbe(
        model="seg",
        variant="fp32",
        artifact_sha256="a" * 64,
        cases=[
            ProbeCase(steps=[ProbeStep(inputs=[_tensor("image", x, [1, 3, 2, 2])],
                                       expected=[_tensor("mask", y, [1, 4])])]),
            ProbeCase(steps=[ProbeStep(inputs=[_tensor("image", x[::-1], [1, 3, 2, 2])],
                                       expected=[_tensor("mask", y[::-1], [1, 4])])]),
        ],
        tolerance=ProbeTolerance(min_cosine=0.99, max_abs_error=0.1),
    )  # fmt: skip


def test_a_split_probe_names_its_data_blob_and_reads_back_as_the_inline_one() -> None:
    inline = _probe()
    split, data = split_probe(inline)
    assert len(data) == 2 * (48 + 16)
    assert split.data_sha256 == hashlib.sha256(data).hexdigest()
    offsets = [t.offset for t in split.tensors()]
    assert offsets == [0, 48, 64, 112]
    assert all(t.data is None for t in split.tensors())
    # On the wire: no data key, an offset, and a document a fraction of the inline one.
    wire = probe_bytes(split)
    assert b'"data":' not in wire
    assert b'"offset":48' in wire
    parsed = from_bytes(GoldenProbe, wire)
    assert parsed.resolved(data) == inline
    # The data blob is what the expected values are read from.
    computed = [
        [{"mask": t} for t in step.expected] for case in inline.cases for step in case.steps
    ]
    assert check_probe(parsed.resolved(data), computed).passed


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (None, "the entry none"),
        (b"x" * 128, "data_sha256"),
    ],
    ids=["entry-without-data", "other-blob"],
)
def test_a_split_probe_refuses_a_data_blob_that_is_not_its_own(
    data: bytes | None, why: str
) -> None:
    split, _ = split_probe(_probe())
    with pytest.raises(ValueError, match=why):
        split.resolved(data)


def test_an_inline_probe_refuses_an_entry_data_blob() -> None:
    with pytest.raises(ValueError, match="the probe does not"):
        _probe().resolved(b"\0" * 16)


def test_the_rule_reads_models_toml_only(small_toml: str, tmp_path: object) -> None:
    config = config_module.parse(small_toml, file="models.toml")
    name, model = next(iter(config.models.items()))
    variant = next(iter(model.variants))
    inputs = config.resolve(name, variant).inputs
    assert probe_input_bytes(model, inputs) < PROBE_INLINE_INPUT_BYTES
    assert not writes_probe_data(model, inputs)
    assert PROBE_DATA not in render_dvc_yaml(config)
    # The same model declared at 1x3x1024x1024: 12 MiB a sample, the data blob.
    old = "shape = " + str(list(inputs[0].shape)).replace("'", "")
    assert old in small_toml
    large = config_module.parse(
        small_toml.replace(old, "shape = [1, 3, 1024, 1024]", 1), file="models.toml"
    )
    big = large.resolve(name, variant).inputs
    assert probe_input_bytes(large.models[name], big) == 3 * 1024 * 1024 * 4
    assert writes_probe_data(large.models[name], big)
    assert f"build/{name}/{variant}/{PROBE_DATA}" in render_dvc_yaml(large)


@pytest.mark.parametrize(
    ("sizes", "fragments"),
    [
        (
            {"model_bytes": MAX_MODEL_BYTES + 1},
            [f"model.mnn is {MAX_MODEL_BYTES + 1} bytes", "2 GiB", "Quantize"],
        ),
        (
            {"probe_bytes": MAX_PROBE_BYTES + 1},
            [f"the golden probe is {MAX_PROBE_BYTES + 1} bytes", "16 MiB", "fewer or smaller"],
        ),
        (
            {"probe_data_bytes": MAX_PROBE_DATA_BYTES + 1},
            [f"data is {MAX_PROBE_DATA_BYTES + 1} bytes", "128.0 MiB", "smaller input shape"],
        ),
    ],
    ids=["model", "probe", "probe-data"],
)
def test_what_no_client_holds_is_a_build_error_naming_size_limit_and_fix(
    sizes: dict[str, int], fragments: list[str]
) -> None:
    args = {"model_bytes": 1, "probe_bytes": 1, "probe_data_bytes": None, "input_bytes": 1}
    with pytest.raises(BuildError) as caught:
        check_client_limits(**{**args, **sizes})
    text = caught.value.message + " " + (caught.value.hint or "")
    assert caught.value.stage == "probe"
    for fragment in fragments:
        assert fragment in text, text
    check_client_limits(**args)  # within every limit: nothing
