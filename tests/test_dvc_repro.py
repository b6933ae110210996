"""`dvc repro` on a tiny project: real DVC and git in a temporary repository.

What a platform engineer relies on: the first repro builds every variant, a
second does nothing, a forced rebuild gives the same bytes, editing one
variant rebuilds one stage, changing a pinned tool rebuilds all of them, a
failed gate fails the pipeline, and DVC's metrics and plots read the outputs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import buildkit
import pytest
from buildkit import IMAGE_MODEL, TENSOR_MODEL, Project

from edgereg.build.dvc import stage_name
from edgereg.build.outputs import ARTIFACT, HOST_BENCHMARK, METRICS, PROVENANCE
from edgereg.toolchain import installed_version

VENV_BIN = Path(sys.executable).parent
ALL_VARIANTS = [
    (model, variant) for model, variants in buildkit.VARIANTS.items() for variant in variants
]
ALL_STAGES = [stage_name(model, variant) for model, variant in ALL_VARIANTS]
RUNNING = re.compile(r"Running stage '([^']+)'")


def run(repo: Project, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """Run a command in the repository with the venv first on PATH (dvc.yaml calls edgereg)."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
    }
    done = subprocess.run(args, cwd=repo.root, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == expect, (
        f"{' '.join(args)} exited {done.returncode}, expected {expect}:\n"
        f"{done.stdout}\n{done.stderr}"
    )
    return done


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def ran(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The stages a `dvc repro` ran, in order."""
    return RUNNING.findall(output(done))


def status(repo: Project) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(run(repo, "dvc", "status", "--json").stdout)
    return result


def host_benchmarks(repo: Project) -> dict[str, bytes]:
    return {
        f"{model}/{variant}": repo.out_dir(model, variant).joinpath(HOST_BENCHMARK).read_bytes()
        for model, variant in ALL_VARIANTS
    }


def artifacts(repo: Project) -> dict[str, bytes]:
    return {
        f"{model}/{variant}": repo.out_dir(model, variant).joinpath(ARTIFACT).read_bytes()
        for model, variant in ALL_VARIANTS
    }


def provenances(repo: Project) -> dict[str, Any]:
    return {
        f"{model}/{variant}": json.loads(
            repo.out_dir(model, variant).joinpath(PROVENANCE).read_text(encoding="utf-8")
        )
        for model, variant in ALL_VARIANTS
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The tiny project with every variant built by the library (no git, no DVC)."""
    if not (VENV_BIN / "dvc").exists() or not (VENV_BIN / "edgereg").exists():
        pytest.fail(
            "dvc and edgereg are not installed next to the test interpreter: run `make venv`"
        )
    return buildkit.write_built_project(tmp_path_factory.mktemp("template"))


@pytest.fixture
def repo(template: Project, tmp_path: Path) -> Project:
    """A fresh git + DVC repository holding the project, nothing built yet."""
    project = Project(tmp_path / "repo")
    shutil.copytree(template.root, project.root, ignore=shutil.ignore_patterns("build"))
    run(project, "git", "init", "--quiet")
    run(project, "dvc", "init", "--quiet")
    run(project, "dvc", "config", "core.analytics", "false")
    run(project, "edgereg", "dvc", "sync")
    run(project, "git", "add", "--all")
    run(project, "git", "commit", "--quiet", "-m", "tiny project")
    return project


@pytest.fixture
def built_repo(repo: Project, template: Project) -> Project:
    """The repository with every stage up to date.

    The outputs come from the library build of the same project and are
    recorded in dvc.lock with `dvc commit`, which is what a finished `dvc repro`
    leaves behind, without paying for one; the first test checks a real one.
    """
    shutil.copytree(template.out_root, repo.out_root)
    run(repo, "dvc", "commit", "--force", "--quiet")
    run(repo, "git", "add", "--all")
    run(repo, "git", "commit", "--quiet", "-m", "build")
    assert status(repo) == {}
    return repo


def test_repro_builds_everything_once_and_force_is_byte_identical(
    repo: Project, template: Project, tmp_path: Path
) -> None:
    assert sorted(status(repo)) == sorted(ALL_STAGES)

    first = run(repo, "dvc", "repro")
    assert ran(first) == ALL_STAGES
    built = artifacts(repo)
    # The pipeline's `edgereg build` and the library build make the same bytes.
    assert built == artifacts(template)
    assert status(repo) == {}

    again = run(repo, "dvc", "repro")
    assert ran(again) == []
    assert "Data and pipelines are up to date." in output(again)
    assert status(repo) == {}

    run(repo, "git", "add", "--all")
    run(repo, "git", "commit", "--quiet", "-m", "built")
    # DVC caches every stage output (metrics too: its run-cache needs them), so
    # git tracks none of them.
    tracked = set(run(repo, "git", "ls-files", "build").stdout.split())
    out = f"build/{IMAGE_MODEL}/fp32"
    assert not {f"{out}/{ARTIFACT}", f"{out}/{METRICS}", f"{out}/class_recall.json"} & tracked
    metrics_before = {
        path: path.read_bytes() for path in sorted(repo.out_root.glob(f"*/*/{METRICS}"))
    }

    recorded = provenances(repo)
    measured = host_benchmarks(repo)
    for _ in range(2):
        forced = run(repo, "dvc", "repro", "--force")
        assert ran(forced) == ALL_STAGES
        assert artifacts(repo) == built
        assert provenances(repo) == recorded
        # Same bytes, so dvc.lock records the same hashes, and metrics.json is unchanged ...
        run(repo, "git", "diff", "--exit-code", "--", "dvc.lock")
        assert {
            path: path.read_bytes() for path in sorted(repo.out_root.glob(f"*/*/{METRICS}"))
        } == metrics_before
        # ... while the host was measured again, outside what DVC locks.
        remeasured = host_benchmarks(repo)
        assert remeasured.keys() == measured.keys()
        assert all(remeasured[key] != measured[key] for key in measured)
        measured = remeasured
    assert status(repo) == {}

    # The host figures still show, as the metrics that changed; nothing fails to load.
    diff = run(repo, "dvc", "metrics", "diff", "--json")
    assert sorted(json.loads(diff.stdout)) == sorted(
        f"build/{model}/{variant}/{HOST_BENCHMARK}" for model, variant in ALL_VARIANTS
    )
    assert "failed to load" not in output(diff)


def test_editing_one_variant_reruns_only_its_stage(built_repo: Project) -> None:
    repo = built_repo
    before = artifacts(repo)

    repo.edit_table(f"models.{TENSOR_MODEL}.variants.w8", "threads = 1", "threads = 2")
    assert list(status(repo)) == [stage_name(TENSOR_MODEL, "w8")]
    done = run(repo, "dvc", "repro")
    assert ran(done) == [stage_name(TENSOR_MODEL, "w8")]
    assert f"Stage '{stage_name(IMAGE_MODEL, 'fp32')}' didn't change, skipping" in output(done)
    assert provenances(repo)[f"{TENSOR_MODEL}/w8"]["runtime"]["threads"] == 2

    repo.edit_table(f"models.{IMAGE_MODEL}.variants.int8", '"KL"', '"ADMM"')
    done = run(repo, "dvc", "repro")
    assert ran(done) == [stage_name(IMAGE_MODEL, "int8")]
    assert provenances(repo)[f"{IMAGE_MODEL}/int8"]["recipe"]["quantization"]["method"] == "ADMM"
    assert status(repo) == {}

    after = artifacts(repo)
    changed = {key for key in before if before[key] != after[key]}
    # Both rebuilt variants get new bytes (at least a new id); nothing else moved.
    assert changed == {f"{TENSOR_MODEL}/w8", f"{IMAGE_MODEL}/int8"}


def test_changing_a_pinned_version_invalidates_every_stage(built_repo: Project) -> None:
    repo = built_repo
    installed = installed_version("onnx")
    repo.edit(f'onnx = "{installed}"', 'onnx = "1.0.0"')

    changed = status(repo)
    assert sorted(changed) == sorted(ALL_STAGES)
    for entries in changed.values():
        assert {"changed deps": {"models.toml": {"toolchain": "modified"}}} in entries

    # The installed onnx is not the pinned one, so the first stage refuses to build.
    failed = run(repo, "dvc", "repro", expect=255)
    text = output(failed)
    assert ran(failed) == [ALL_STAGES[0]]
    assert f"onnx 1.0.0 is pinned in models.toml [toolchain] but {installed} is installed" in text
    assert f"failed to reproduce '{ALL_STAGES[0]}'" in text
    assert not repo.out_dir(*ALL_VARIANTS[0]).joinpath(ARTIFACT).exists()


def test_a_gate_failure_fails_repro_and_names_the_budget(built_repo: Project) -> None:
    repo = built_repo
    repo.edit_table(
        f"models.{IMAGE_MODEL}.variants.fp32",
        'tier = "high"',
        'tier = "high"\nbudgets = { max_size_mb = 0.001 }',
    )
    failed = run(repo, "dvc", "repro", expect=255)
    text = output(failed)
    assert ran(failed) == [stage_name(IMAGE_MODEL, "fp32")]
    assert f"{IMAGE_MODEL}/fp32 failed its gates" in text
    assert re.search(r"max_size_mb [0-9.e+-]+ > 0\.001", text)
    assert not repo.out_dir(IMAGE_MODEL, "fp32").joinpath(ARTIFACT).exists()
    for model, variant in ALL_VARIANTS[1:]:
        assert repo.out_dir(model, variant).joinpath(ARTIFACT).exists()
    assert list(status(repo)) == [stage_name(IMAGE_MODEL, "fp32")]


def without_lists(value: Any) -> Any:
    """A JSON document as `dvc metrics show` reads it: lists left out, at any depth."""
    if isinstance(value, dict):
        return {k: without_lists(v) for k, v in value.items() if not isinstance(v, list)}
    return value


def test_metrics_show_every_variant(built_repo: Project) -> None:
    shown = json.loads(run(built_repo, "dvc", "metrics", "show", "--json").stdout)
    files = shown[""]["data"]
    assert sorted(files) == sorted(
        f"build/{model}/{variant}/{name}"
        for model, variant in ALL_VARIANTS
        for name in (METRICS, HOST_BENCHMARK)
    )
    for path in [path for path in files if path.endswith(HOST_BENCHMARK)]:
        host = files.pop(path)["data"]
        assert host["figures"] == "host"
        # The variant's own count (1, 2 or 4 here), and the host sweep, labelled.
        timed = [value for key, value in host.items() if key.startswith("threads_")]
        assert len(timed) == 1
        assert timed[0]["p50_ms"] > 0
        assert host["host_threads"]["figures"] == "host"
    for path, entry in files.items():
        metrics = entry["data"]
        on_disk = json.loads((built_repo.root / path).read_text(encoding="utf-8"))
        # DVC shows numbers and strings; it leaves out lists (the failed gates, none here).
        assert metrics == without_lists(on_disk)
        assert on_disk["failed"] == []
        assert metrics["metrics"]["accuracy"] == 1.0
        assert metrics["size_mb"] > 0
        assert all(metrics["gates"].values())


def test_plots_show_writes_the_recall_and_latency_plots(built_repo: Project) -> None:
    done = run(built_repo, "dvc", "plots", "show", "--out", "plots")
    page = built_repo.root / "plots" / "index.html"
    assert page.is_file(), output(done)
    html = page.read_text(encoding="utf-8")
    for model, variant in ALL_VARIANTS:
        assert f"{model}/{variant}: recall change per class" in html
        assert f"{model}/{variant}: host p50 latency (ms)" in html


EVALUATOR = """
import numpy as np

from team.gates import MAX_DIFF


def score(*, inputs, reference, outputs, labels):
    diff = float(np.mean(np.abs(outputs["logits"] - reference["logits"])))
    return {"metrics": {"mean_abs_diff": diff}, "gates": {"mean_abs_diff": {"max": MAX_DIFF}}}
"""


def test_editing_a_custom_evaluator_or_what_it_imports_reruns_its_stages(
    built_repo: Project,
) -> None:
    repo = built_repo
    (repo.root / "team_evals.py").write_text(EVALUATOR, encoding="utf-8")
    (repo.root / "team").mkdir()
    (repo.root / "team" / "__init__.py").write_text("", encoding="utf-8")
    gates = repo.root / "team" / "gates.py"
    gates.write_text("MAX_DIFF = 0.5\n", encoding="utf-8")
    repo.edit_table(
        f"models.{IMAGE_MODEL}",
        'task = "classification"',
        'task = { kind = "custom", evaluator = "team_evals:score" }',
    )
    # Class names and label metrics are a classifier's.
    classes = "classes = " + buildkit._toml_list(buildkit.IMAGE_CLASSES) + "\n"
    repo.edit_table(f"models.{IMAGE_MODEL}", classes, "")
    for line in (
        "metrics.accuracy = { max_drop = 0.25 }\n",
        "metrics.class_recall_drop = { max = 0.5 }\n",
    ):
        repo.edit_table(f"models.{IMAGE_MODEL}.budgets", line, "")
    run(repo, "edgereg", "dvc", "sync")
    stages = [stage_name(IMAGE_MODEL, variant) for variant in buildkit.VARIANTS[IMAGE_MODEL]]
    dvc_yaml = (repo.root / "dvc.yaml").read_text(encoding="utf-8")
    for dep in ("team_evals.py", "team/__init__.py", "team/gates.py"):
        assert f'      - "{dep}"' in dvc_yaml
    done = run(repo, "dvc", "repro", *stages)
    assert ran(done) == stages
    assert status(repo) == {}
    run(repo, "edgereg", "dvc", "sync", "--check")

    # Tightening the gate in the module the evaluator imports changes every stage using it.
    gates.write_text("MAX_DIFF = 0.0\n", encoding="utf-8")
    changed = status(repo)
    assert sorted(changed) == sorted(stages)
    for entries in changed.values():
        assert {"changed deps": {"team/gates.py": "modified"}} in entries
    failed = run(repo, "dvc", "repro", stages[-1], expect=255)
    assert "mean_abs_diff.max" in output(failed)
    metrics = json.loads(repo.out_dir(IMAGE_MODEL, "w8").joinpath(METRICS).read_text())
    assert metrics["status"] == "failed"
