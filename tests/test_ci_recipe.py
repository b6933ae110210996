"""The documented CI recipe, for real: builds shared between machines through DVC.

Two CI machines are two git clones of one repository whose DVC remote is a
bucket on the loopback S3 server (moto). The first runs `dvc repro` and
`dvc push --run-cache`. Then:

* a clone of a commit without dvc.lock (another branch, a parallel job) runs
  `dvc repro --pull`: every stage is restored from the run cache, none runs;
* a clone of the commit with dvc.lock runs `dvc pull` and `dvc repro`: nothing
  to do.

Either way the outputs are byte-identical to the first machine's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import buildkit
import pytest
from buildkit import IMAGE_MODEL, Project

from edgereg.build.dvc import stage_name
from edgereg.build.outputs import PROBE_DATA, STAGE_OUTPUTS

VENV_BIN = Path(sys.executable).parent
VARIANTS = buildkit.VARIANTS[IMAGE_MODEL]
STAGES = [stage_name(IMAGE_MODEL, variant) for variant in VARIANTS]
RUNNING = re.compile(r"Running stage '([^']+)'")
CACHED = re.compile(r"Stage '([^']+)' is cached - skipping run, checking out outputs")


@pytest.fixture
def ci_env(tmp_path: Path, s3_env: None) -> dict[str, str]:
    """What a CI job's environment holds: the venv on PATH, S3 credentials, no analytics."""
    # aiobotocore (DVC's S3 client) insists that AWS_CONFIG_FILE exists;
    # os.devnull, which s3_env uses to hide the user's profile, does not count.
    empty = tmp_path / "aws-empty"
    empty.write_text("", encoding="utf-8")
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
        "AWS_CONFIG_FILE": str(empty),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
    }


def run(cwd: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode} in {cwd}:\n{output}"
    return output


def outputs(root: Path) -> dict[str, bytes]:
    return {
        f"{variant}/{name}": (root / "build" / IMAGE_MODEL / variant / name).read_bytes()
        for variant in VARIANTS
        for name in STAGE_OUTPUTS  # what DVC restores; the host benchmark is per machine
        if name != PROBE_DATA  # small inputs: the probe's tensors are inline
    }


def test_second_machine_rebuilds_nothing(
    tmp_path: Path, ci_env: dict[str, str], moto_endpoint: str, s3_bucket: str
) -> None:
    if not (VENV_BIN / "dvc").exists() or not (VENV_BIN / "edgereg").exists():
        pytest.fail("dvc and edgereg must be installed next to the test interpreter (make venv)")
    # The repository: the tiny project's image model (three variants), its
    # dvc.yaml and a DVC remote on S3, committed without any build.
    first = Project(tmp_path / "first")
    buildkit.write_project(first.root)
    text = first.toml()
    first.config_path.write_text(text[: text.index("[models.sensor]")], encoding="utf-8")
    for name in ("sensor.onnx", "sensor-calibration.npz", "sensor-evaluation.npz"):
        first.path(f"data/{name}").unlink()
    git_dvc = [
        ("git", "init", "--quiet"),
        ("dvc", "init", "--quiet"),
        ("dvc", "config", "core.analytics", "false"),
        ("edgereg", "dvc", "sync"),
        ("dvc", "remote", "add", "--default", "store", f"s3://{s3_bucket}/dvc"),
        ("dvc", "remote", "modify", "store", "endpointurl", moto_endpoint),
        ("git", "add", "--all"),
        ("git", "commit", "--quiet", "-m", "models, dvc.yaml, S3 remote"),
    ]
    for command in git_dvc:
        run(first.root, ci_env, *command)
    # A parallel job checks out this commit: no dvc.lock, nothing built.
    parallel = tmp_path / "parallel"
    run(tmp_path, ci_env, "git", "clone", "--quiet", str(first.root), str(parallel))

    # Machine 1 builds and shares its outputs and run cache.
    built = run(first.root, ci_env, "dvc", "repro")
    assert RUNNING.findall(built) == STAGES
    run(first.root, ci_env, "dvc", "push", "--run-cache")
    run(first.root, ci_env, "git", "add", "--all")
    run(first.root, ci_env, "git", "commit", "--quiet", "-m", "build")
    expected = outputs(first.root)
    lock = first.path("dvc.lock").read_text(encoding="utf-8")

    # Machine 2, no dvc.lock: the run cache restores every stage.
    restored = run(parallel, ci_env, "dvc", "repro", "--pull")
    assert RUNNING.findall(restored) == [], restored
    assert sorted(CACHED.findall(restored)) == sorted(STAGES), restored
    assert outputs(parallel) == expected
    assert (parallel / "dvc.lock").read_text(encoding="utf-8") == lock
    assert "Data and pipelines are up to date." in run(parallel, ci_env, "dvc", "status")

    # Machine 3 checks out the commit with dvc.lock: pull, and repro has nothing to do.
    later = tmp_path / "later"
    run(tmp_path, ci_env, "git", "clone", "--quiet", str(first.root), str(later))
    run(later, ci_env, "dvc", "pull")
    again = run(later, ci_env, "dvc", "repro")
    assert RUNNING.findall(again) == [], again
    assert "Data and pipelines are up to date." in again
    assert outputs(later) == expected
