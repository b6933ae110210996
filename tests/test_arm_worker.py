"""The ARM classes' kept emulators: the one-shot runs' bits and failures, nothing left running.

Nothing is mocked: a tiny classifier converted by the real MNN converter runs
under qemu-aarch64-static in the aarch64 sysroot `make venv` installs, once
through a :class:`ClassWorker` (the emulator a build stage keeps per class)
and once through a process of its own (what the build did before). Failures
the real QEMU cannot be made to have on demand come from small emulator
scripts run through the same launchers, or from killing the real emulator.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import buildkit
import numpy as np
import pytest
import tiny_models
from buildkit import FAST_BENCH

from edgereg.build.arm import ARM_CACHE, EmulatedRunner, _emulate
from edgereg.build.outputs import METRICS
from edgereg.build.variant import build_variant
from edgereg.errors import GateError
from edgereg.toolchain import mnn
from edgereg.toolchain.arm import (
    CPU_CLASSES,
    QEMU_ENV,
    ArmError,
    ArmRun,
    ClassWorker,
    Sysroot,
    emulated_cpu,
    find_sysroot,
    qemu_cpus,
    qemu_path,
    run_on_class,
)

MNN_VERSION = "3.6.1"


@pytest.fixture(scope="module")
def sysroot() -> Sysroot:
    return find_sysroot(MNN_VERSION)


@pytest.fixture(scope="module")
def cpus() -> tuple[str, ...]:
    return qemu_cpus()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("worker")
    tiny_models.conv_classifier(root / "net.onnx", batch_dynamic=False)
    mnn.convert(root / "net.onnx", root / "net.mnn", weight_quant_bits=8)
    return root / "net.mnn"


def rows(count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` whole input tensors of the classifier (one forward each)."""
    generator = np.random.default_rng(seed)
    return {"image": generator.normal(0, 1, (count, 1, 3, 8, 8)).astype(np.float32)}


def run(
    artifact: Path,
    cpu_class: str,
    inputs: Mapping[str, np.ndarray],
    sysroot: Sysroot,
    cpus: Sequence[str],
    *,
    worker: ClassWorker | None = None,
    qemu: str | None = None,
    precision: str = "normal",
) -> ArmRun:
    return run_on_class(
        artifact,
        cpu_class,
        inputs,
        input_names=["image"],
        output_names=["logits"],
        sysroot=sysroot,
        precision=precision,
        available_cpus=cpus,
        qemu=qemu,
        worker=worker,
    )


def worker_for(
    cpu_class: str, sysroot: Path, cpus: Sequence[str], qemu: str | None = None
) -> ClassWorker:
    return ClassWorker(
        qemu or qemu_path(), sysroot, cpu_class, emulated_cpu(CPU_CLASSES[cpu_class], cpus)
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for good; reaped by whoever waits for it.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        return state != "Z"
    return False


def emulator(tmp_path: Path, name: str, body: str) -> str:
    """An emulator script: what QEMU does when it dies or stops at once."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    ("cpu_class", "precision"),
    [("armv8", "normal"), ("armv8.2", "low"), ("armv9", "normal")],
)
def test_a_worker_gives_the_one_shot_runs_bits(
    artifact: Path,
    sysroot: Sysroot,
    cpus: tuple[str, ...],
    cpu_class: str,
    precision: str,
) -> None:
    first, second = rows(5, seed=1), rows(3, seed=2)
    worker = worker_for(cpu_class, sysroot.path, cpus)
    try:
        worker.start()
        pid = worker.pid
        assert pid is not None
        served = [
            run(artifact, cpu_class, x, sysroot, cpus, worker=worker, precision=precision)
            for x in (first, second)
        ]
        # Both requests answered by the one emulator, still running for the next.
        assert worker.pid == pid
    finally:
        worker.close()
    assert not alive(pid)
    for inputs, got in zip((first, second), served, strict=True):
        alone = run(artifact, cpu_class, inputs, sysroot, cpus, precision=precision)
        assert got.outputs["logits"].shape == (len(inputs["image"]), 1, 4)
        assert got.outputs["logits"].dtype == alone.outputs["logits"].dtype
        assert got.outputs["logits"].tobytes() == alone.outputs["logits"].tobytes()
        assert (got.cpu_class, got.qemu_cpu, got.features, got.mnn_version) == (
            alone.cpu_class,
            alone.qemu_cpu,
            alone.features,
            alone.mnn_version,
        )
    # What MNN reported at import is each request's, as each one-shot run's.
    assert served[1].features == CPU_CLASSES[cpu_class].features


def same_failure(a: ArmError, b: ArmError) -> None:
    assert (a.message, a.reason, a.cpu_class, a.stage, a.hint, a.exit_status) == (
        b.message,
        b.reason,
        b.cpu_class,
        b.stage,
        b.hint,
        b.exit_status,
    )


@pytest.mark.parametrize(
    ("name", "body", "reason", "words"),
    [
        (
            "crashing",
            "echo 'qemu: uncaught target signal 11 (Segmentation fault)' >&2\nkill -SEGV $$",
            "crash",
            "crashed (killed by signal SIGSEGV) without a result",
        ),
        ("stopping", "echo 'qemu: could not open the binary' >&2\nexit 1", "broken", "stopped"),
    ],
)
def test_an_emulator_that_dies_fails_as_a_one_shot_run(
    artifact: Path,
    sysroot: Sysroot,
    cpus: tuple[str, ...],
    tmp_path: Path,
    name: str,
    body: str,
    reason: str,
    words: str,
) -> None:
    qemu = emulator(tmp_path, name, body)
    inputs = rows(2, seed=3)
    with pytest.raises(ArmError) as alone:
        run(artifact, "armv8.2", inputs, sysroot, cpus, qemu=qemu)
    worker = worker_for("armv8.2", sysroot.path, cpus, qemu=qemu)
    with pytest.raises(ArmError) as served:
        run(artifact, "armv8.2", inputs, sysroot, cpus, worker=worker)
    same_failure(served.value, alone.value)
    assert served.value.reason == reason
    assert words in served.value.message
    assert "qemu:" in (served.value.output_tail or "")
    assert worker.pid is None


def test_an_emulator_that_cannot_start_is_missing_as_in_a_one_shot_run(
    artifact: Path, sysroot: Sysroot, cpus: tuple[str, ...], tmp_path: Path
) -> None:
    qemu = str(tmp_path / "no-such-qemu")
    with pytest.raises(ArmError) as alone:
        run(artifact, "armv8", rows(1, seed=4), sysroot, cpus, qemu=qemu)
    worker = worker_for("armv8", sysroot.path, cpus, qemu=qemu)
    with pytest.raises(ArmError) as started:
        worker.start()
    same_failure(started.value, alone.value)
    assert started.value.reason == "missing"
    assert "cannot start" in started.value.message


def test_a_sysroot_without_its_python_is_broken_as_in_a_one_shot_run(
    artifact: Path, cpus: tuple[str, ...], tmp_path: Path
) -> None:
    empty = Sysroot(tmp_path / "empty", MNN_VERSION, "", 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArmError) as alone:
        run(artifact, "armv8", rows(1, seed=5), empty, cpus)
    worker = worker_for("armv8", empty.path, cpus)
    with pytest.raises(ArmError) as served:
        run(artifact, "armv8", rows(1, seed=5), empty, cpus, worker=worker)
    same_failure(served.value, alone.value)
    assert served.value.reason == "broken"
    assert "reinstall the sysroot" in (served.value.hint or "")


def test_a_model_mnn_refuses_fails_as_in_a_one_shot_run_and_ends_the_worker(
    sysroot: Sysroot, cpus: tuple[str, ...], tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.mnn"
    garbage.write_bytes(b"not a model" * 100)
    inputs = rows(1, seed=6)
    with pytest.raises(ArmError) as alone:
        run(garbage, "armv8", inputs, sysroot, cpus)
    worker = worker_for("armv8", sysroot.path, cpus)
    try:
        with pytest.raises(ArmError) as served:
            run(garbage, "armv8", inputs, sysroot, cpus, worker=worker)
        same_failure(served.value, alone.value)
        assert served.value.reason == "load"
        assert worker.pid is None
    finally:
        worker.close()


READY = b'{"ok": true, "phase": "import", "mnn_version": "3.6.1", "numpy_version": "1"}\n'


def answering(tmp_path: Path, ready: bytes, answer: bytes) -> str:
    """An emulator whose probe says ``ready``, then ``answer`` to each request.

    Run one-shot (a request file, no ``--serve``), it writes ``answer`` as its result file.
    """
    path = tmp_path / "answering"
    path.write_text(
        f"""#!{sys.executable}
import json, os, sys
ready, answer = {ready!r}, {answer!r}
if "--serve" in sys.argv:
    reply = int(sys.argv[sys.argv.index("--serve") + 1])
    os.write(reply, ready)
    for _ in sys.stdin:
        os.write(reply, answer)
else:
    with open(sys.argv[-1], encoding="utf-8") as request:
        result = json.load(request)["result"]
    with open(result, "wb") as out:
        out.write(answer)
""",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    ("ready", "answer", "words"),
    [
        pytest.param(b"MNN says hello\n", b"", "b'MNN says hello'", id="not-json-when-ready"),
        pytest.param(READY, b'{"ok": true, "pha\n', 'b\'{"ok": true, "pha\'', id="cut-off"),
        pytest.param(READY, b"[1, 2]\n", "b'[1, 2]'", id="not-an-object"),
        pytest.param(READY, b"\xff\xfe\n", "b'\\xff\\xfe'", id="not-utf8"),
    ],
)
def test_an_answer_that_is_not_a_result_is_a_clear_error_and_ends_the_worker(
    artifact: Path,
    sysroot: Sysroot,
    cpus: tuple[str, ...],
    tmp_path: Path,
    ready: bytes,
    answer: bytes,
    words: str,
) -> None:
    qemu = answering(tmp_path, ready, answer)
    worker = worker_for("armv8", sysroot.path, cpus, qemu=qemu)
    try:
        with pytest.raises(ArmError) as caught:
            run(artifact, "armv8", rows(1, seed=9), sysroot, cpus, worker=worker)
        assert caught.value.reason == "broken"
        assert caught.value.message == (
            f"the emulated armv8 run (cortex-a53) answered with no result: {words}"
        )
        assert "reinstall the sysroot" in (caught.value.hint or "")
        assert worker.pid is None
    finally:
        worker.close()


def test_a_success_without_its_outputs_is_a_clear_error_as_in_a_one_shot_run(
    artifact: Path, sysroot: Sysroot, cpus: tuple[str, ...], tmp_path: Path
) -> None:
    short = b'{"ok": true, "phase": "forward", "mnn_version": "3.6.1"}\n'
    qemu = answering(tmp_path, READY, short)
    with pytest.raises(ArmError) as alone:
        run(artifact, "armv8", rows(1, seed=10), sysroot, cpus, qemu=qemu)
    worker = worker_for("armv8", sysroot.path, cpus, qemu=qemu)
    try:
        with pytest.raises(ArmError) as served:
            run(artifact, "armv8", rows(1, seed=10), sysroot, cpus, worker=worker)
    finally:
        worker.close()
    same_failure(served.value, alone.value)
    assert served.value.reason == "broken"
    assert served.value.message.startswith(
        "the emulated armv8 run (cortex-a53) reported outputs it did not give: "
    )


def test_the_emulator_killed_between_runs_is_a_crash_and_the_next_run_starts_another(
    artifact: Path, sysroot: Sysroot, cpus: tuple[str, ...]
) -> None:
    worker = worker_for("armv8", sysroot.path, cpus)
    try:
        before = run(artifact, "armv8", rows(2, seed=7), sysroot, cpus, worker=worker)
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGSEGV)
        with pytest.raises(ArmError) as caught:
            run(artifact, "armv8", rows(2, seed=7), sysroot, cpus, worker=worker)
        assert caught.value.reason == "crash"
        assert caught.value.message == (
            "the emulated armv8 run (cortex-a53) crashed (killed by signal SIGSEGV) "
            "without a result"
        )
        assert caught.value.exit_status == -signal.SIGSEGV
        after = run(artifact, "armv8", rows(2, seed=7), sysroot, cpus, worker=worker)
        assert worker.pid not in (None, pid)
        assert after.outputs["logits"].tobytes() == before.outputs["logits"].tobytes()
    finally:
        worker.close()
    assert worker.pid is None


def test_a_timeout_kills_the_worker_as_a_one_shot_run_is_killed(
    artifact: Path, sysroot: Sysroot, cpus: tuple[str, ...]
) -> None:
    worker = worker_for("armv9", sysroot.path, cpus)
    worker.start()
    pid = worker.pid
    assert pid is not None
    with pytest.raises(ArmError) as caught:
        worker.run({"op": "version"}, timeout=0.01)
    assert caught.value.reason == "timeout"
    assert caught.value.message == (
        f"the emulated armv9 run ({worker.cpu}) did not finish within 0.01 s"
    )
    assert not alive(pid)
    assert worker.pid is None


def test_ctrl_c_leaves_no_emulator_running(
    artifact: Path,
    sysroot: Sysroot,
    cpus: tuple[str, ...],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    runner = EmulatedRunner(sysroot, cpus)
    classes = ["armv8", "armv8.2", "armv9"]
    missing = [(c, tmp_path / f"{c}.npz") for c in classes]
    before = set(threading.enumerate())
    # Ctrl-C to this process alone (a terminal's would reach the emulators too). Python's own
    # handler, whatever this process inherited: a job started in the background by a
    # non-interactive shell (CI) ignores SIGINT, and Python then never raises KeyboardInterrupt.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, inherited))
    ctrl_c = threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    # As the ARM stage runs them: started first, closed however the stage ends.
    runner.start(classes)
    pids = [pid for w in runner._workers.values() if (pid := w.pid) is not None]
    ctrl_c.start()
    with pytest.raises(KeyboardInterrupt), contextlib.closing(runner):
        _emulate(
            runner,
            missing,
            artifact=artifact,
            # armv8.2 emulates every row: far more than the test waits for.
            inputs=rows(50000, seed=8),
            input_names=["image"],
            output_names=["logits"],
            precision="normal",
            mnn_version=MNN_VERSION,
        )
    ctrl_c.join()
    # Not after every row: the interrupted stage killed the emulators it waited for.
    assert time.monotonic() - started < 60
    assert len(pids) == len(classes)
    assert not [pid for pid in pids if alive(pid)]
    assert set(threading.enumerate()) <= before
    assert not list(tmp_path.glob("*.npz"))


PARENT = """
import sys

import numpy as np

from edgereg.toolchain.arm import ClassWorker, find_sysroot, run_on_class

artifact, version, qemu, cpu, then = sys.argv[1:]
sysroot = find_sysroot(version)
worker = ClassWorker(qemu, sysroot.path, "armv8", cpu)
worker.run({"op": "version"})  # MNN imported: the next request is sent at once
print(worker.pid, flush=True)
if then == "exit":
    sys.exit(0)  # without close()
rows = np.random.default_rng(11).normal(0, 1, (50000, 1, 3, 8, 8)).astype(np.float32)
run_on_class(
    artifact,
    "armv8",
    {"image": rows},
    input_names=["image"],
    output_names=["logits"],
    sysroot=sysroot,
    worker=worker,
)
"""


def parent_of_a_worker(
    artifact: Path, cpus: Sequence[str], tmp_path: Path, then: str
) -> tuple[subprocess.Popen[str], int]:
    """A build process with a worker for armv8 (its files in ``tmp_path``), and the worker's pid."""
    cpu = emulated_cpu(CPU_CLASSES["armv8"], cpus)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(artifact), MNN_VERSION, qemu_path(), cpu, then],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    if not line:
        parent.wait()
        pytest.fail(f"the parent exited ({parent.returncode}) without starting its worker")
    return parent, int(line)


def wait_gone(pid: int, seconds: float) -> bool:
    gone = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < gone:
        time.sleep(0.2)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        return False
    return True


def test_a_worker_whose_parent_dies_mid_run_exits(
    artifact: Path, cpus: tuple[str, ...], tmp_path: Path
) -> None:
    parent, pid = parent_of_a_worker(artifact, cpus, tmp_path, then="run")
    try:
        # Its request sent (50000 rows: minutes under emulation), the parent dies outright.
        time.sleep(3.0)
        assert alive(pid)
    finally:
        parent.kill()
        parent.wait()
    assert wait_gone(pid, 15.0), "the worker outlived its parent by 15 s"


def test_a_worker_left_open_at_exit_is_killed_and_its_files_removed(
    artifact: Path, cpus: tuple[str, ...], tmp_path: Path
) -> None:
    parent, pid = parent_of_a_worker(artifact, cpus, tmp_path, then="exit")
    assert parent.wait(timeout=60) == 0
    assert wait_gone(pid, 5.0), "the worker outlived its parent's exit"
    assert not list(tmp_path.glob(".edgereg-arm-*"))


@pytest.mark.slow
def test_a_build_with_kept_emulators_records_the_one_shot_builds_bytes(
    sysroot: Sysroot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = buildkit.write_project(tmp_path / "repo")
    project.edit("arm = []\n", 'arm = ["armv8", "armv8.2", "armv9"]\n')
    config = project.load()
    # Each emulator started, logged on its way to the real one.
    starts = tmp_path / "starts.log"
    qemu = emulator(
        tmp_path,
        "logging-qemu",
        f'[ "$2" = help ] || echo "$*" >> {starts}\nexec {qemu_path()} "$@"',
    )
    monkeypatch.setenv(QEMU_ENV, qemu)
    records = {}
    started = {}
    for label, runner in (("one_shot", EmulatedRunner(sysroot, persistent=False)), ("kept", None)):
        starts.write_text("", encoding="utf-8")
        out = tmp_path / label
        # MNN's i8mm int8 kernel gets the 4 logits wrong on armv9: it emulates its
        # other rows too, a second run sent to its emulator.
        with pytest.raises(GateError, match="arm armv9"):
            build_variant(config, "vision", "int8", out, bench=FAST_BENCH, arm_runner=runner)
        arm = json.loads((out / "vision" / "int8" / METRICS).read_text(encoding="utf-8"))["arm"]
        assert [c["status"] for c in arm["classes"].values()] == ["passed", "passed", "failed"]
        assert "rest_from" not in arm["classes"]["armv9"]
        cached = {}
        for path in sorted((out / ARM_CACHE).glob("*.npz")):
            with np.load(path) as data:
                cached[path.name] = {name: data[name].tobytes() for name in data.files}
        records[label] = (json.dumps(arm, sort_keys=True), cached)
        lines = starts.read_text(encoding="utf-8").splitlines()
        started[label] = (sum("--serve" in line for line in lines), len(lines))
    # One emulator per run (armv8.2's rows, armv8's and armv9's first two, armv9's rest), and
    # one per class kept for the stage, armv9's second run sent to the emulator it had.
    assert started == {"one_shot": (0, 4), "kept": (3, 3)}
    assert records["kept"][0] == records["one_shot"][0]
    # Every class's outputs and the host's, under the same cache keys, bit for bit.
    assert records["kept"][1] == records["one_shot"][1]
    assert len(records["kept"][1]) == 4
