"""A team's own streaming model through the whole path, as a user runs it.

In an empty git repository: `edgereg init`, the datasets written by the
docs' own code, `edgereg add` with the docs' command, `dvc repro`, `edgereg
publish --canary`, `edgereg serve`, and `edgereg pull --self-test` on two
phones of different make, every tier. The model is shaped like Silero VAD v5
(a 576-sample chunk: 64 of context then 512 new, an int64 `sr` scalar, a
recurrent state whose batch axis is dynamic in the ONNX, outputs with -1 and
unset axes): the shape that every device refused after every build stage had
passed. The walk-through in docs/own-repository.md is what runs here: its
fenced commands, its dataset code, its row sizes and the block it says `add`
writes are read from the file, so the doc cannot drift from what works.

Real git, DVC, ONNX Runtime, MNN and HTTP; every command in a child process.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import numpy as np
import pytest
import tiny_models

from edgereg import toolchain
from edgereg.protocol.layout import manifest_path
from edgereg.protocol.rules import in_cohort

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "own-repository.md"
VENV_BIN = Path(sys.executable).parent
MODEL = "vad"
CANARY = 5.0

#: Two phones, their facts and the tier models.toml resolves for them. Each
#: also pulls every other tier's variant (--tier), so every variant runs its
#: self-test on both.
PHONES = {
    "android-flagship": ([
        "--ram-mb", "12288", "--cpu-cores", "8", "--soc", "Snapdragon 8 Gen 2",
        "--os", "android", "--os-version", "34", "--abi", "arm64-v8a", "--mnn-runtime", "3.6.1",
    ], "high"),
    "iphone-older": ([
        "--ram-mb", "4096", "--cpu-cores", "6", "--soc", "Apple A15",
        "--os", "ios", "--os-version", "16.4", "--abi", "arm64", "--mnn-runtime", "3.7.0",
    ], "mid"),
}  # fmt: skip


@dataclass(frozen=True)
class WalkThrough:
    """What docs/own-repository.md's streaming walk-through tells the user to run."""

    dataset_code: str  # the np.savez_compressed block
    add_command: list[str]  # `edgereg add models/vad.onnx ...`
    block: dict[str, Any]  # the [models.vad] it says `add` writes
    task_line: str  # `task = { kind = "frame_decision", ... }`
    context: int  # samples of context in front of each chunk
    new: int  # new samples per chunk
    arm_fix: str  # the int8 variant's quantization line after the ARM refusal


def walk_through() -> WalkThrough:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("### A streaming model, walked through")
    section = text[start : text.index("\n## ", start)]
    fences = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    code = next(body for lang, body in fences if lang == "python" and "savez" in body)
    add = next(body for _, body in fences if body.startswith("edgereg add"))
    tomls = [body for lang, body in fences if lang == "toml"]
    block = next(body for body in tomls if body.startswith(f"[models.{MODEL}]"))
    task = next(body for body in tomls if body.startswith("task = "))
    arm_fix = next(body for body in tomls if body.startswith('quantization = { mode = "weight"'))
    sizes = re.search(r"# (\d+) samples of context \+ (\d+) new ones", block)
    assert sizes is not None, "the walk-through names its row size in the chunk's shape"
    context, new = int(sizes[1]), int(sizes[2])
    # The text and the dataset code say the same size as the block.
    assert f"({'N'}, {context + new})" in code
    assert f"{context + new} samples per step" in section or f"reads {context + new}" in section
    return WalkThrough(
        dataset_code=code,
        add_command=shlex.split(add.strip()),
        block=tomllib.loads(block)["models"][MODEL],
        task_line=task.strip(),
        context=context,
        new=new,
        arm_fix=arm_fix.strip(),
    )


def sh(cwd: Path, *args: str, expect: int = 0, stdout_only: bool = False) -> str:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
    }
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return done.stdout if stdout_only else output


def start_project(root: Path, doc: WalkThrough, *, context: int) -> Path:
    """An empty git repository after `edgereg init`, the model, and the docs' datasets."""
    root.mkdir()
    sh(root, "git", "init", "--quiet")
    sh(root, "git", "config", "core.autocrlf", "false")
    sh(root, "edgereg", "init")
    (root / "models").mkdir()
    (root / "data").mkdir()
    tiny_models.context_vad_model(root / "models" / f"{MODEL}.onnx")
    for name, recordings, seed in (("vad_eval", 10, 8), ("vad_calib", 4, 9)):
        rows = tiny_models.vad_recordings(recordings, 10, context=context, new=doc.new, seed=seed)
        # The docs' own dataset code, run as written (for the calibration set at its path).
        namespace = {
            "np": np,
            "chunks": rows["chunk"],
            "recording_ids": rows["sequences"],
            "speech": rows["labels"],
        }
        # The path made absolute: the code runs here, not in the repository.
        target = (root / "data" / f"{name}.npz").as_posix()
        code = doc.dataset_code.replace('"data/vad_eval.npz"', f'"{target}"')
        assert code != doc.dataset_code
        exec(code, namespace)
    sh(root, *doc.add_command)
    return root


@pytest.fixture(scope="module")
def doc() -> WalkThrough:
    return walk_through()


def test_the_walk_through_builds_publishes_and_passes_self_test_on_two_phones(
    doc: WalkThrough, tmp_path: Path
) -> None:
    assert (doc.context, doc.new) == (tiny_models.VAD_CONTEXT, tiny_models.VAD_NEW)
    repo = start_project(tmp_path / "repo", doc, context=doc.context)

    # `add` writes what the docs show: the state found, the scalar, concrete shapes.
    written = tomllib.loads((repo / "models.toml").read_text())["models"][MODEL]
    for key in ("task", "inputs", "state"):
        assert written[key] == doc.block[key], key
    assert [o["name"] for o in written["outputs"]] == [o["name"] for o in doc.block["outputs"]]
    text = (repo / "models.toml").read_text()
    text = text.replace('task = "frame_decision"', doc.task_line, 1)
    # Devices report to `edgereg serve`: the block init wrote, uncommented.
    for line in ("[reports]", 'url = "v1/reports"', 'store = "sqlite:///reports.sqlite"'):
        assert text.count(f"# {line}\n") == 1, line
        text = text.replace(f"# {line}\n", f"{line}\n")
    (repo / "models.toml").write_text(text)
    sh(repo, "edgereg", "dvc", "sync")
    sh(repo, "edgereg", "validate")

    # MNN's ARM int8 kernels compute this stream wrong on every CPU class while x86 is right
    # (a cosine near 0.58 against ONNX Runtime): the build refuses the int8 variant by name,
    # and the user does what its hint says, as the docs' walk-through shows.
    refused = sh(repo, "dvc", "repro", expect=255)
    assert "vad/int8 failed its gates on MNN's ARM kernels" in refused, refused
    for cpu_class in ("armv8", "armv8.2", "armv9"):
        assert f"arm {cpu_class} (" in refused, cpu_class
    assert 'mode = "weight"' in refused
    assert not (repo / "build" / MODEL / "int8" / "model.mnn").exists()
    text = (repo / "models.toml").read_text()
    int8 = 'quantization = { mode = "int8", method = "auto" }'
    assert text.count(int8) == 1
    (repo / "models.toml").write_text(text.replace(int8, doc.arm_fix, 1))
    built = sh(repo, "dvc", "repro")
    variants = {"fp32": "high", "int8": "mid", "w8": "low"}
    for variant in variants:
        assert f"Running stage 'build-{MODEL}-{variant}'" in refused + built
        metrics = json.loads((repo / "build" / MODEL / variant / "metrics.json").read_text())
        assert metrics["status"] == "passed", metrics
        # A reference that fires, and a variant that agrees with it, on real data.
        assert metrics["baseline"]["f1"] > 0.8, metrics["baseline"]
        contract = json.loads((repo / "build" / MODEL / variant / "contract.json").read_text())
        shapes = {spec["name"]: spec["shape"] for spec in contract["inputs"]}
        assert shapes == {"chunk": [1, 576], "sr": [], "state": [2, 1, 128]}
    # The artifact itself declares the state [2, -1, 128] (and the chunk [1, -1]):
    # what every device refused when the client zero-filled from it.
    artifact = toolchain.model_info(repo / "build" / MODEL / "fp32" / "model.mnn")
    assert artifact.input_shapes == ((1, -1), (), (2, -1, 128))

    sh(repo, "edgereg", "keys", "generate")
    published = sh(repo, "edgereg", "publish", MODEL, "--canary", f"{CANARY:g}%")
    assert "0.1.0" in published
    keys = sorted((repo / "publisher-keys").glob("*.pem"))
    assert keys, "keys generate pins the public key in publisher-keys/"

    with edgereg_serve(repo) as url:
        salt = _salt(url)
        inside = [f"phone-{i}" for i in range(2000) if in_cohort(f"phone-{i}", salt, CANARY)]
        assert len(inside) >= len(PHONES)
        for (phone, (facts, own_tier)), device in zip(PHONES.items(), inside, strict=False):
            for variant, tier in variants.items():
                # The phone's own tier resolved from models.toml; the others forced.
                forced = None if tier == own_tier else tier
                got = _pull(repo, url, keys[0], device, facts, tier=forced, out=f"{phone}-{tier}")
                assert (got["tier"], got["variant"], got["is_candidate"]) == (tier, variant, True)
                found = got["self_test"][MODEL]
                assert (found["passed"], found["probe"], found["backend"]) == (
                    True,
                    "passed",
                    "cpu",
                ), (phone, variant, found)
        # Every pull reported its self-test to the server's report store.
        reported = _reports(repo / "reports.sqlite", expected=len(PHONES) * len(variants))
    assert sorted(reported) == sorted(
        (variant, tier, "candidate", "passed", "cpu")
        for variant, tier in variants.items()
        for _ in PHONES
    )


@contextlib.contextmanager
def edgereg_serve(repo: Path) -> Iterator[str]:
    """`edgereg serve` in the repository, as a user starts it; yields its base URL."""
    log = repo / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "edgereg"), "serve", "--port", "0"],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not (
            found := re.search(r" on (http://[0-9.:]+) ", log.read_text("utf-8", "replace"))
        ):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield found[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _reports(store: Path, *, expected: int) -> list[tuple[str, ...]]:
    """The reports in the store once ``expected`` have arrived (the server batches writes)."""
    deadline = time.monotonic() + 30
    while True:
        rows: list[tuple[str, ...]] = []
        if store.exists():
            with contextlib.closing(sqlite3.connect(store)) as db:
                rows = db.execute(
                    "SELECT variant, tier, arm, probe, backend FROM reports"
                ).fetchall()
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _salt(url: str) -> str:
    """The rollout's salt, from the manifest a device fetches (as protocol §6 uses it)."""
    with urllib.request.urlopen(f"{url}/{manifest_path(MODEL, 'high')}") as response:
        envelope = json.loads(response.read())
    salt: str = json.loads(base64.b64decode(envelope["payload"]))["salt"]
    return salt


def _pull(
    repo: Path, url: str, key: Path, device: str, facts: list[str], *, tier: str | None, out: str
) -> dict[str, Any]:
    args = [
        "edgereg", "pull", MODEL, "--registry", url, "--device-id", device,
        "--trusted-key", str(key), "--out", str(repo / "devices" / out), "--self-test", "--json",
        *facts,
    ]  # fmt: skip
    if tier is not None:
        args += ["--tier", tier]
    data: dict[str, Any] = json.loads(sh(repo, *args, stdout_only=True))
    return data


def test_the_walk_through_with_bare_chunks_fails_its_build_naming_the_context(
    doc: WalkThrough, tmp_path: Path
) -> None:
    # The same walk-through with rows of 512 bare samples: the graph runs, the
    # reference never fires, and the build says so instead of passing every gate.
    repo = start_project(tmp_path / "repo", doc, context=0)
    written = tomllib.loads((repo / "models.toml").read_text())["models"][MODEL]
    assert written["inputs"][0]["shape"] == [1, doc.new]
    failed = sh(repo, "dvc", "repro", expect=255)
    assert "f1.min_baseline" in failed
    assert "frame_agreement.informative" in failed
    assert "never crosses the threshold 0.5" in failed
    assert "context in front of each chunk" in failed
    assert "576 per row" in failed
    assert not list((repo / "build").glob(f"{MODEL}/*/model.mnn"))
