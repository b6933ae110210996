"""The on-device self-test: real MNN models, real probes, the real probe check.

Only the device is simulated: a "faulty GPU" runner plays an OpenCL backend
by running real MNN on the CPU and perturbing its outputs, as a driver that
miscomputes would. This host has no GPU, so real MNN reports OpenCL as
unavailable, which is tested too.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import tiny_models
from click.testing import CliRunner
from clientkit import device_id
from loopkit import LoopRegistry, Served, serve
from probekit import entry_for, make_probe, probe_blob
from registrykit import MODEL, PUBLIC_KEY_FILE, TIERS, Site, ok
from registrykit import cli as registry_cli
from servekit import serve as serve_registry

from edgereg import cli, toolchain
from edgereg.client import Client, DeviceProfile
from edgereg.client._selftest import (
    BackendUnavailableError,
    MnnRunner,
    ModelSession,
    SelfTest,
    parse_probe,
    zero_state,
)
from edgereg.config import RuntimeHints
from edgereg.protocol.contract import InputTensor, IOContract, StateLink, TaskInfo, TensorSpec
from edgereg.protocol.fields import Backend
from edgereg.protocol.probe import GoldenProbe
from edgereg.protocol.reasons import REASONS, BadBlob, Malformed, ProbeFailed
from edgereg.protocol.wire import ManifestEntry
from edgereg.reports import open_store
from edgereg.toolchain import InputFeed


@dataclass
class Models:
    conv: Path
    other: Path
    stream: Path
    conv_probe: GoldenProbe
    stream_probe: GoldenProbe


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("selftest-models")
    conv = root / "conv.mnn"
    toolchain.convert(tiny_models.conv_classifier(root / "conv.onnx"), conv)
    other = root / "other.mnn"
    toolchain.convert(tiny_models.conv_classifier(root / "other.onnx", seed=7), other)
    stream = root / "stream.mnn"
    toolchain.convert(tiny_models.streaming_model(root / "stream.onnx"), stream)
    rng = np.random.default_rng(0)
    images = rng.normal(0, 1, (3, *tiny_models.CONV_SHAPE)).astype(np.float32)
    conv_probe = make_probe(
        conv,
        {"image": images},
        feeds=[InputFeed("image", "float32", (1, *tiny_models.CONV_SHAPE), 0)],
        outputs=["logits"],
    )
    steps = 4
    chunks = rng.normal(0, 1, (2 * steps, tiny_models.STREAM_CHUNK)).astype(np.float32)
    stream_probe = make_probe(
        stream,
        {"chunk": chunks, "sr": np.full(2 * steps, 16000, np.int64)},
        feeds=[
            InputFeed("chunk", "float32", (1, tiny_models.STREAM_CHUNK), 0),
            InputFeed("sr", "int64", (), None),
            InputFeed("state", "float32", tiny_models.STREAM_STATE_SHAPE, None),
        ],
        outputs=["prob"],
        state=[("state", "state_out")],
        steps_per_case=steps,
    )
    return Models(conv, other, stream, conv_probe, stream_probe)


class _Perturbed:
    def __init__(self, inner: ModelSession, scale: float, rng: np.random.Generator) -> None:
        self.inner, self.scale, self.rng = inner, scale, rng

    def input_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self.inner.input_shapes()

    def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        outputs = self.inner.run(feeds)
        return {
            name: value + self.scale * self.rng.normal(0, 1, value.shape).astype(value.dtype)
            for name, value in outputs.items()
        }


@dataclass
class FaultyGpuRunner:
    """A device with an OpenCL GPU whose driver adds noise of ``scale`` to every output."""

    scale: float = 0.5
    real: MnnRunner = field(default_factory=MnnRunner)
    loads: list[Backend] = field(default_factory=list)

    def load(
        self,
        artifact: Path,
        backend: Backend,
        runtime: RuntimeHints,
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> ModelSession:
        self.loads.append(backend)
        if backend == "opencl":
            inner = self.real.load(artifact, "cpu", runtime, inputs, outputs)
            return _Perturbed(inner, self.scale, np.random.default_rng(1))
        if backend != "cpu":
            raise BackendUnavailableError(f"no {backend} on this simulated device")
        return self.real.load(artifact, backend, runtime, inputs, outputs)


def _entry(
    artifact: Path,
    probe: GoldenProbe | None,
    *,
    backends: Sequence[Backend] = ("cpu",),
    version: str = "1.0.0",
) -> ManifestEntry:
    ref = probe_blob(probe)[1] if probe is not None else None
    return entry_for(artifact, probe=ref, backends=backends, version=version)


def test_real_mnn_here_has_no_gpu_so_opencl_is_unavailable_and_cpu_passes(
    models: Models, tmp_path: Path
) -> None:
    entry = _entry(models.conv, models.conv_probe, backends=["opencl", "cpu"])
    result = SelfTest(tmp_path).run("m", models.conv, entry, models.conv_probe)
    assert result.backend == "cpu"
    assert result.unavailable == ("opencl",)
    assert result.skipped == ()
    assert result.probe == "passed"
    assert result.load_ms > 0
    assert result.probe_ms > 0
    # Unavailable is not a failure: nothing is remembered against the backend.
    memory = tmp_path / "selftest.json"
    assert (
        not memory.exists() or not json.loads(memory.read_text())["models"]["m"]["1.0.0"]["failed"]
    )


def test_a_faulty_gpu_is_skipped_remembered_and_cpu_chosen(models: Models, tmp_path: Path) -> None:
    entry = _entry(models.conv, models.conv_probe, backends=["opencl", "cpu"])
    runner = FaultyGpuRunner()
    result = SelfTest(tmp_path, runner=runner).run("m", models.conv, entry, models.conv_probe)
    assert (result.backend, result.skipped, result.unavailable) == ("cpu", ("opencl",), ())
    failed = result.trials[0]
    assert failed.outcome == "failed"
    assert failed.detail is not None
    assert "case 1 step 1 output logits" in failed.detail

    # The next self-test of the same version does not try the faulty backend again.
    runner.loads.clear()
    again = SelfTest(tmp_path, runner=runner).run("m", models.conv, entry, models.conv_probe)
    assert runner.loads == ["cpu"]
    assert again.skipped == ("opencl",)
    assert again.trials[0].outcome == "remembered"

    # A new version is tested afresh on every backend.
    runner.loads.clear()
    newer = _entry(models.conv, models.conv_probe, backends=["opencl", "cpu"], version="1.1.0")
    SelfTest(tmp_path, runner=runner).run("m", models.conv, newer, models.conv_probe)
    assert runner.loads == ["opencl", "cpu"]


def test_a_gpu_within_the_tolerance_is_chosen(models: Models, tmp_path: Path) -> None:
    entry = _entry(models.conv, models.conv_probe, backends=["opencl", "cpu"])
    runner = FaultyGpuRunner(scale=1e-6)
    result = SelfTest(tmp_path, runner=runner).run("m", models.conv, entry, models.conv_probe)
    assert (result.backend, result.skipped) == ("opencl", ())
    assert runner.loads == ["opencl"]


def test_a_model_that_fails_on_cpu_is_rejected_for_good(models: Models, tmp_path: Path) -> None:
    # The probe of one model, the artifact of another: wrong on every backend.
    probe = models.conv_probe.model_copy(update={"artifact_sha256": _sha(models.other)})
    entry = _entry(models.other, probe, backends=["opencl", "cpu"])
    runner = FaultyGpuRunner()
    with pytest.raises(ProbeFailed) as caught:
        SelfTest(tmp_path, runner=runner).run("m", models.other, entry, probe)
    error = caught.value
    assert error.reason == "probe-failed"
    assert error.permanent is True
    assert "opencl:" in error.message
    assert "cpu:" in error.message
    assert ProbeFailed in REASONS

    runner.loads.clear()
    with pytest.raises(ProbeFailed, match="rejected before on this device"):
        SelfTest(tmp_path, runner=runner).run("m", models.other, entry, probe)
    assert runner.loads == []
    assert SelfTest(tmp_path).rejected("m", "1.0.0", entry.sha256) is not None


def test_a_model_that_does_not_load_is_rejected(models: Models, tmp_path: Path) -> None:
    broken = tiny_models.corrupt_file(tmp_path / "broken.mnn")
    entry = _entry(broken, models.conv_probe)
    with pytest.raises(ProbeFailed, match="cpu: does not load"):
        SelfTest(tmp_path).run("m", broken, entry, models.conv_probe)


def test_a_stateful_probe_feeds_the_state_back(models: Models, tmp_path: Path) -> None:
    entry = _entry(models.stream, models.stream_probe)
    result = SelfTest(tmp_path).run("vad", models.stream, entry, models.stream_probe)
    assert (result.backend, result.probe) == ("cpu", "passed")

    @dataclass
    class ForgetfulRunner:
        """A runtime that loses the state between steps (zeros every step)."""

        real: MnnRunner = field(default_factory=MnnRunner)

        def load(
            self,
            artifact: Path,
            backend: Backend,
            runtime: RuntimeHints,
            inputs: Sequence[str],
            outputs: Sequence[str],
        ) -> ModelSession:
            session = self.real.load(artifact, backend, runtime, inputs, outputs)

            class Forgetful:
                def input_shapes(self) -> Mapping[str, tuple[int, ...]]:
                    return session.input_shapes()

                def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
                    zeros = np.zeros(tiny_models.STREAM_STATE_SHAPE, np.float32)
                    return session.run({**feeds, "state": zeros})

            return Forgetful()

    with pytest.raises(ProbeFailed, match="step 2"):
        SelfTest(tmp_path / "other", runner=ForgetfulRunner()).run(
            "vad", models.stream, entry, models.stream_probe
        )


def test_state_zeros_take_the_contracts_dtype_and_shape_not_the_declared_one(
    tmp_path: Path,
) -> None:
    # Silero-like: the ONNX declares the state [2, batch, 4]; MNN reports (2, -1, 4).
    # The protocol (section 11) says zeros of the contract's dtype and shape, each
    # named axis 1; the declared shape is the fallback, its dynamic axes 1.
    stream = tmp_path / "dyn.mnn"
    toolchain.convert(tiny_models.streaming_model(tmp_path / "dyn.onnx", dynamic=True), stream)
    session = MnnRunner().load(
        stream, "cpu", RuntimeHints(threads=1), ["chunk", "sr", "state"], ["prob", "state_out"]
    )
    assert session.input_shapes()["state"] == (2, -1, 4)
    fallback = zero_state("state", None, session.input_shapes())
    assert (fallback.shape, fallback.dtype) == ((2, 1, 4), np.float32)
    contract = IOContract(
        inputs=[
            InputTensor(name="chunk", dtype="float32", shape=[1, 8], batch_axis=0),
            InputTensor(name="sr", dtype="int64", shape=[]),
            InputTensor(name="state", dtype="float32", shape=[2, "batch", 4]),
        ],
        outputs=[
            TensorSpec(name="prob", dtype="float32", shape=["dim0", 1]),
            TensorSpec(name="state_out", dtype="float32", shape=[2, "dim1", 4]),
        ],
        state=[StateLink(input="state", output="state_out")],
        task=TaskInfo(kind="frame_decision", output="prob", threshold=0.5),
    )
    zeros = zero_state("state", contract, {})
    assert (zeros.shape, zeros.dtype, zeros.any()) == ((2, 1, 4), np.float32, False)
    as_int = contract.model_copy(
        update={"inputs": [InputTensor(name="state", dtype="int64", shape=[3, "n"])]}
    )
    assert zero_state("state", as_int, {}).dtype == np.int64
    assert zero_state("state", as_int, {}).shape == (3, 1)

    rng = np.random.default_rng(4)
    steps = 3
    probe = make_probe(
        stream,
        {
            "chunk": rng.normal(0, 1, (steps, tiny_models.STREAM_CHUNK)).astype(np.float32),
            "sr": np.full(steps, 16000, np.int64),
        },
        feeds=[
            InputFeed("chunk", "float32", (1, tiny_models.STREAM_CHUNK), 0),
            InputFeed("sr", "int64", (), None),
            InputFeed("state", "float32", tiny_models.STREAM_STATE_SHAPE, None),
        ],
        outputs=["prob"],
        state=[("state", "state_out")],
        steps_per_case=steps,
    )
    fed: list[tuple[int, ...]] = []

    @dataclass
    class Recording:
        real: MnnRunner = field(default_factory=MnnRunner)

        def load(
            self,
            artifact: Path,
            backend: Backend,
            runtime: RuntimeHints,
            inputs: Sequence[str],
            outputs: Sequence[str],
        ) -> ModelSession:
            inner = self.real.load(artifact, backend, runtime, inputs, outputs)

            class Session:
                def input_shapes(self) -> Mapping[str, tuple[int, ...]]:
                    return inner.input_shapes()

                def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
                    fed.append(tuple(feeds["state"].shape))
                    return inner.run(feeds)

            return Session()

    entry = _entry(stream, probe).model_copy(update={"contract": contract})
    result = SelfTest(tmp_path / "cache", runner=Recording()).run("vad", stream, entry, probe)
    assert (result.backend, result.probe) == ("cpu", "passed")
    assert fed == [(2, 1, 4)] * steps


def test_without_a_probe_the_first_backend_that_loads_is_chosen(
    models: Models, tmp_path: Path
) -> None:
    entry = _entry(models.conv, None, backends=["vulkan", "cpu"])
    result = SelfTest(tmp_path).run("m", models.conv, entry, None)
    assert (result.backend, result.probe, result.unavailable) == ("cpu", "none", ("vulkan",))
    assert result.probe_ms == 0.0


def test_the_probe_blob_is_checked_against_the_manifest(models: Models) -> None:
    data, ref = probe_blob(models.conv_probe)
    entry = _entry(models.conv, models.conv_probe)
    assert parse_probe(data, ref, entry) == models.conv_probe
    with pytest.raises(BadBlob, match="sha256"):
        parse_probe(data.replace(b'"fp32"', b'"fp16"'), ref, entry)
    other = _entry(models.other, models.conv_probe)
    with pytest.raises(Malformed, match="is for artifact"):
        parse_probe(data, ref, other)
    garbage = b'{"schema_version": 1}'
    with pytest.raises(Malformed, match="probe"):
        parse_probe(garbage, ref.model_copy(update={"sha256": _digest(garbage), "size": 21}), entry)


def test_an_unreadable_memory_is_logged_and_started_afresh(
    models: Models, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "selftest.json").write_text("{not json")
    entry = _entry(models.conv, models.conv_probe, backends=["opencl", "cpu"])
    with caplog.at_level(logging.WARNING, logger="edgereg.client"):
        result = SelfTest(tmp_path, runner=FaultyGpuRunner()).run(
            "m", models.conv, entry, models.conv_probe
        )
    assert result.backend == "cpu"
    assert "starting afresh" in caplog.text
    assert json.loads((tmp_path / "selftest.json").read_text())["models"]["m"]["1.0.0"]["failed"]


def _sha(path: Path) -> str:
    return _digest(path.read_bytes())


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Member(NamedTuple):
    entry: ManifestEntry
    artifact: Path
    probe: Path | None


def test_as_the_clients_install_check_every_member_is_tested(
    models: Models, tmp_path: Path
) -> None:
    data, ref = probe_blob(models.conv_probe)
    probe_file = tmp_path / "probe.json"
    probe_file.write_bytes(data)
    conv = entry_for(models.conv, probe=ref, backends=["opencl", "cpu"])
    stream = _entry(models.stream, None)
    check = SelfTest(tmp_path, runner=FaultyGpuRunner())
    chosen = check(
        "ocr",
        "2.0.0",
        {
            "det": _Member(conv, models.conv, probe_file),
            "vad": _Member(stream, models.stream, None),
        },
    )
    assert chosen == {"det": "cpu", "vad": "cpu"}
    assert check.results["det"].skipped == ("opencl",)
    assert check.results["vad"].probe == "none"

    # One member failing rejects the release; a probe blob that is not the entry's is refused.
    wrong = models.conv_probe.model_copy(update={"artifact_sha256": _sha(models.other)})
    wrong_data, wrong_ref = probe_blob(wrong)
    (tmp_path / "wrong.json").write_bytes(wrong_data)
    other = entry_for(models.other, probe=wrong_ref)
    with pytest.raises(ProbeFailed):
        check("ocr", "2.1.0", {"det": _Member(other, models.other, tmp_path / "wrong.json")})
    assert [t.outcome for t in check.failed["det"]] == ["failed"]
    assert "det" not in check.results
    with pytest.raises(BadBlob):
        check("ocr", "2.1.0", {"det": _Member(other, models.other, probe_file)})


# --- the client runs it: real registry over real HTTP, reports collected ---------------


def _client(served: Served, registry: LoopRegistry, cache: Path, check: SelfTest) -> Client:
    return Client(
        served.url,
        registry.trusted,
        cache,
        model=registry.model,
        device=DeviceProfile(
            device_id=device_id(True, 50.0),
            ram_mb=6144,
            cpu_cores=8,
            mnn_runtime="3.6.1",
            os="android",
        ),
        tier=registry.tier,
        self_test=check,
        device_class="ram4-8c",
    )


def test_the_client_installs_on_the_backend_that_passed_and_reports_it(
    models: Models, tmp_path: Path
) -> None:
    registry = LoopRegistry(tmp_path / "registry")
    registry.publish(registry.entry(models.conv, models.conv_probe, version="1.0.0"))
    with serve(registry.root) as served:
        client = _client(
            served,
            registry,
            tmp_path / "cache",
            SelfTest(tmp_path / "cache", runner=FaultyGpuRunner()),
        )
        result = client.fetch()
        client.close()
        assert result.error is None, result.error
        assert result.members["digits"].backend == "cpu"
        [report] = served.reports()
    assert (report.probe, report.backend, report.backends_skipped) == ("passed", "cpu", ["opencl"])
    assert (report.arm, report.version, report.sequence) == ("stable", "1.0.0", 1)
    assert (report.os, report.device_class, report.mnn_runtime) == ("android", "ram4-8c", "3.6.1")
    assert report.load_ms is not None


def test_a_candidate_that_fails_its_probe_is_never_installed(
    models: Models, tmp_path: Path
) -> None:
    registry = LoopRegistry(tmp_path / "registry")
    stable = registry.entry(models.conv, models.conv_probe, version="1.0.0")
    # The candidate's artifact computes other outputs than its probe expects.
    wrong = models.conv_probe.model_copy(update={"artifact_sha256": _sha(models.other)})
    candidate = registry.entry(models.other, wrong, version="1.1.0")
    registry.publish(stable)
    cache = tmp_path / "cache"
    with serve(registry.root) as served:
        client = _client(served, registry, cache, SelfTest(cache, runner=FaultyGpuRunner()))
        assert client.fetch().version == "1.0.0"
        registry.publish(stable, candidate)
        refused = client.fetch()
        assert refused.error_code == "probe-failed"
        assert refused.version == "1.0.0"  # the last good stays
        assert client.current() is not None
        assert client.current().version == "1.0.0"  # type: ignore[union-attr]
        assert "1.1.0" in client.status().bad_releases
        again = client.fetch()  # not tried again: stable, with the reason
        client.close()
        assert (again.version, again.fallback) == ("1.0.0", "bad-release")
        stable_report, failed_report = served.reports()
    assert (failed_report.version, failed_report.arm, failed_report.probe) == (
        "1.1.0",
        "candidate",
        "failed",
    )
    assert failed_report.backend is None
    assert failed_report.backends_skipped == ["opencl", "cpu"]
    assert failed_report.token != stable_report.token


def test_edgereg_pull_self_test_prints_the_backend_chosen_and_skipped(
    models: Models, tmp_path: Path
) -> None:
    registry = LoopRegistry(tmp_path / "registry")
    registry.publish(registry.entry(models.conv, models.conv_probe, version="1.0.0"))
    (tmp_path / "registry.pub.pem").write_bytes(registry.signer.public_pem())
    with serve(registry.root) as served:
        args = [
            "pull", "digits", "--registry", served.url, "--device-id", "d1", "--tier", "high",
            "--trusted-key", str(tmp_path / "registry.pub.pem"), "--out", str(tmp_path / "c"),
            "--self-test", "--config", str(tmp_path / "absent.toml"),
        ]  # fmt: skip
        text = CliRunner().invoke(cli.main, args)
        assert text.exit_code == 0, text.output
        assert "self-test digits: runs on cpu; not on this device: opencl" in text.output
        fresh = [*args[:-4], str(tmp_path / "fresh"), *args[-3:]]  # a new device cache
        as_json = CliRunner().invoke(cli.main, [*fresh, "--json", "--no-report"])
        assert as_json.exit_code == 0, as_json.output
        assert len(served.posted) == 1  # --no-report sent nothing
    found = json.loads(as_json.output)["self_test"]["digits"]
    assert (found["backend"], found["unavailable"], found["probe"]) == ("cpu", ["opencl"], "passed")


# --- the build's own probes, checked on this host's real MNN ---------------------------


def test_the_builds_probe_passes_on_this_hosts_cpu_for_every_tier(site: Site) -> None:
    ok(site.run("publish", MODEL, "--full"))
    key = str(site.root / PUBLIC_KEY_FILE)
    for tier in TIERS:
        args = [
            "pull", MODEL, "--registry", site.url, "--device-id", "d1", "--tier", tier,
            "--trusted-key", key, "--out", str(site.root / f"device-{tier}"), "--self-test",
        ]  # fmt: skip
        found = json.loads(ok(registry_cli(*args, "--json")).stdout)["self_test"][MODEL]
        assert found["passed"], found
        assert (found["probe"], found["backend"], found["skipped"]) == ("passed", "cpu", [])


def test_the_closed_loop_reaches_edgereg_serve_and_its_report_store(
    models: Models, tmp_path: Path
) -> None:
    registry = LoopRegistry(tmp_path / "registry")
    stable = registry.entry(models.conv, models.conv_probe, version="1.0.0")
    wrong = models.conv_probe.model_copy(update={"artifact_sha256": _sha(models.other)})
    candidate = registry.entry(models.other, wrong, version="1.1.0")
    registry.publish(stable)
    cache = tmp_path / "cache"
    with (
        open_store(f"sqlite:///{tmp_path}/reports.sqlite") as store,
        serve_registry(str(registry.root), reports=store) as url,
    ):
        client = Client(
            url + "/",
            registry.trusted,
            cache,
            model="digits",
            device=DeviceProfile(device_id=device_id(True, 50.0), ram_mb=6144, cpu_cores=8),
            tier="high",
            self_test=SelfTest(cache, runner=FaultyGpuRunner()),
        )
        assert client.fetch().version == "1.0.0"
        client.record_inference(3.0)
        assert client.confirm()
        registry.publish(stable, candidate)
        assert client.fetch().error_code == "probe-failed"
        client.close()
        arms = {(s.arm, s.version): s for s in store.summaries("digits")}
    assert arms[("stable", "1.0.0")].devices == 1
    assert arms[("stable", "1.0.0")].all.count("confirmed") == 1
    assert arms[("candidate", "1.1.0")].all.count("probe_failed") == 1


class _NoBackendRunner:
    """A runner that cannot create any backend here (an app whose MNN library is missing)."""

    def load(
        self,
        artifact: Path,
        backend: Backend,
        runtime: RuntimeHints,
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> ModelSession:
        raise BackendUnavailableError(f"no {backend}: the MNN library is not in this app")


def test_a_probe_that_did_not_run_is_no_failure_and_the_next_fetch_installs(
    models: Models, tmp_path: Path
) -> None:
    """Rule 20: no verdict, nothing marked bad, no report; a working runner installs later."""
    registry = LoopRegistry(tmp_path / "registry")
    registry.publish(registry.entry(models.conv, models.conv_probe, version="1.0.0"))
    cache = tmp_path / "cache"
    with serve(registry.root) as served:
        broken = _client(served, registry, cache, SelfTest(cache, runner=_NoBackendRunner()))
        refused = broken.fetch()
        broken.close()
        assert refused.error_code == "probe-not-run", refused.error
        assert refused.version is None
        status = broken.status()
        assert status.bad_releases == {}
        assert status.pending is not None
        assert status.pending.version == "1.0.0"
        assert served.reports() == []  # never reported as a probe failure
        fixed = _client(served, registry, cache, SelfTest(cache, runner=FaultyGpuRunner()))
        installed = fixed.fetch()
        fixed.close()
        assert (installed.error_code, installed.version) == (None, "1.0.0")
        [report] = served.reports()
    assert report.probe == "passed"


def test_a_client_that_cannot_run_the_probe_refuses_to_be_built(tmp_path: Path) -> None:
    """Without MNN and without a runner, self_test=True is a ValueError at construction."""
    script = f"""
import sys
sys.modules["MNN"] = None  # an app built without the MNN library: `import MNN` fails
from edgereg.client import Client, DeviceProfile, SelfTest, TrustedKeys
from edgereg.signing import Signer, generate_key
keys = TrustedKeys.from_pems([Signer.from_pem(generate_key()[0]).public_pem()])
device = DeviceProfile(device_id="d", ram_mb=4096, cpu_cores=4)
try:
    Client("http://127.0.0.1:9/", keys, {str(tmp_path)!r}, model="m", device=device,
           tier="low", self_test=True)
except ValueError as exc:
    print("refused:", exc)
Client("http://127.0.0.1:9/", keys, {str(tmp_path)!r}, model="m", device=device, tier="low")
print("without the self-test: built")
"""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "refused: the self-test needs a model runner" in done.stdout
    assert "without the self-test: built" in done.stdout
