"""A team adopts edgereg in its own repository: `edgereg init`, then `edgereg add`.

Real git, DVC, ONNX and MNN in temporary repositories; the commands run through
click as the CLI wires them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import buildkit
import click
import numpy as np
import onnx
import pytest
import tiny_models
from click.testing import CliRunner, Result

from edgereg import config as config_module
from edgereg.build.dvc import render_dvc_yaml
from edgereg.cli import main as edgereg_main
from edgereg.cli.onboard import add_command, init_command
from edgereg.errors import UsageError
from edgereg.onboard import (
    GITIGNORE_COMMENT,
    GITIGNORE_ENTRIES,
    ArrayInfo,
    DatasetInfo,
    GraphTensor,
    Proposal,
    model_name_from_path,
    propose_model,
    render_models_toml,
)
from edgereg.toolchain import installed_versions

VENV_BIN = Path(sys.executable).parent


def cli() -> click.Group:
    @click.group()
    @click.option("--verbose", is_flag=True)
    def main(verbose: bool) -> None:
        """The edgereg group, as edgereg.cli wires init_command and add_command into it."""

    main.add_command(init_command)
    main.add_command(add_command)
    return main


def edgereg(*args: str, expect: int = 0) -> Result:
    result = CliRunner().invoke(cli(), list(args))
    assert result.exit_code == expect, f"exit {result.exit_code}:\n{result.output}"
    return result


def sh(cwd: Path, *args: str, expect: int = 0) -> str:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
    }
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return output


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty git repository, the working directory."""
    root = tmp_path / "repo"
    root.mkdir()
    sh(root, "git", "init", "--quiet")
    monkeypatch.chdir(root)
    return root


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny project's data directory: two ONNX models and their datasets."""
    return buildkit.write_project(tmp_path_factory.mktemp("kit")).root / "data"


@pytest.fixture
def project(repo: Path, kit: Path) -> Path:
    """The repository after `edgereg init`, with the tiny models' files in data/."""
    edgereg("init")
    shutil.copytree(kit, repo / "data")
    return repo


# --- init --------------------------------------------------------------------------


def test_init_outside_git_says_git_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = edgereg("init", expect=2)
    assert "is not inside a git repository" in result.output
    assert "Run `git init` first, then `edgereg init` again." in result.output
    assert list(tmp_path.iterdir()) == []


def test_init_sets_up_a_project_with_no_model_yet(repo: Path) -> None:
    result = edgereg("init")
    assert "initialised DVC" in result.output
    assert "edgereg add path/to/model.onnx" in result.output

    text = (repo / "models.toml").read_text()
    config = config_module.parse(text, file="models.toml")
    assert config.models == {}
    assert list(config.tiers) == ["high", "mid", "low"]
    assert config.toolchain.as_dict() == installed_versions()
    assert config.registry.url == "file://registry"
    assert config.notes() == [config_module.NO_MODELS_NOTE]
    assert text.count("\n#") > 10, "the file explains itself in comments"
    # The reports block is there to uncomment, and uncommented it parses.
    assert "# [reports]\n" in text
    assert '# url = "v1/reports"\n' in text
    uncommented = text.replace("# [reports]\n", "[reports]\n").replace(
        '# url = "v1/reports"', 'url = "v1/reports"'
    )
    assert config_module.parse(uncommented, file="models.toml").reports.url == "v1/reports"

    assert (repo / ".dvc").is_dir()
    assert "analytics = false" in (repo / ".dvc" / "config").read_text()
    assert (repo / ".gitignore").read_text().splitlines()[-len(GITIGNORE_ENTRIES) :] == list(
        GITIGNORE_ENTRIES
    )
    assert "git add --all && git commit -m 'edgereg project'" in result.output
    assert (repo / "dvc.yaml").read_text() == render_dvc_yaml(config)
    assert "stages: {}" in (repo / "dvc.yaml").read_text()

    # DVC and edgereg both accept the empty project.
    assert "Data and pipelines are up to date." in sh(repo, "dvc", "repro")
    sh(repo, "edgereg", "dvc", "sync", "--check")
    assert "no models yet: run `edgereg add" in sh(repo, "edgereg", "validate")


def test_init_never_overwrites_without_force(repo: Path) -> None:
    (repo / ".gitignore").write_text("*.pyc\n/registry\n", encoding="utf-8")
    edgereg("init")
    # Entries already there (in any spelling) are not added twice; the rest stays.
    lines = (repo / ".gitignore").read_text().splitlines()
    assert lines[:5] == ["*.pyc", "/registry", "", *GITIGNORE_COMMENT.splitlines()]
    assert lines[5:] == [entry for entry in GITIGNORE_ENTRIES if entry != "/registry/"]
    (repo / "models.toml").write_text("# mine\n", encoding="utf-8")
    result = edgereg("init", expect=2)
    assert "refusing to overwrite: models.toml exists" in result.output
    assert "edgereg init --force" in result.output
    assert (repo / "models.toml").read_text() == "# mine\n"

    edgereg("init", "--force")
    config_module.load(repo / "models.toml")
    assert (repo / ".gitignore").read_text().count("/.edgereg/*\n") == 1


def test_init_gitignore_keeps_environments_builds_and_secrets_out(
    repo: Path,
) -> None:
    edgereg("init")
    wanted = {
        "models.toml": True,
        ".venv/bin/python": False,
        "venv/bin/python": False,
        "env/bin/python": False,
        "registry/keys/a.pem": False,
        ".edgereg/signing-key.pem": False,
        ".edgereg/runtimes/mnn-3.0.0/x.py": False,
        ".edgereg/signing-key.pub.pem": True,  # committing a public key pins it
        "build/m/v/model.mnn": False,
        "build/m/v/provenance.json": False,
        "build/m/v/.v.tmp/metrics.json": False,  # a build's scratch directory
        "build/m/v/metrics.json": False,  # DVC caches it (the run-cache needs it)
        "build/m/v/host-benchmark.json": False,
    }
    for path in wanted:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("x", encoding="utf-8")
    sh(repo, "git", "add", "--all")
    tracked = set(sh(repo, "git", "ls-files").split())
    assert {path for path, keep in wanted.items() if keep} <= tracked
    assert not {path for path, keep in wanted.items() if not keep} & tracked


def test_the_suggested_commit_gives_a_teammate_a_clone_that_builds_the_same_bytes(
    project: Path, tmp_path: Path
) -> None:
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").write_text("", encoding="utf-8")
    remote = tmp_path / "dvc-remote"  # a directory remote; S3 works the same way
    sh(project, "dvc", "remote", "add", "--default", "storage", str(remote))
    result = edgereg(
        "add",
        "data/sensor.onnx",
        "--evaluation",
        "data/sensor-evaluation.npz",
        "--calibration",
        "data/sensor-calibration.npz",
    )
    steps = [
        line.strip()
        for line in result.output.splitlines()
        if line.strip().startswith(("dvc add", "git add", "dvc push"))
    ]
    assert steps == [
        "dvc add data/sensor.onnx data/sensor-evaluation.npz data/sensor-calibration.npz",
        "git add --all && git commit -m 'add sensor'",
        "dvc push",
    ]
    sh(project, "dvc", "repro")
    # What `edgereg serve` and `edgereg report` leave behind must not ride along.
    for name in ("reports.sqlite", "reports.sqlite-wal", "reports.sqlite-shm", "report.html"):
        (project / name).write_bytes(b"live")
    for step in steps:
        sh(project, "sh", "-c", step)

    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "--quiet", str(project), str(clone))
    tracked = set(sh(clone, "git", "ls-files").split())
    assert {"models.toml", "dvc.yaml", "dvc.lock", ".gitignore", ".dvc/config"} <= tracked
    assert "data/sensor.onnx.dvc" in tracked
    assert "data/sensor.onnx" not in tracked  # DVC keeps the large files
    assert "build/sensor/fp32/metrics.json" not in tracked  # DVC caches it too
    assert not any(path.startswith(".venv/") for path in tracked)
    assert not {"reports.sqlite", "reports.sqlite-wal", "reports.sqlite-shm"} & tracked
    assert "report.html" not in tracked
    # The teammate pulls what DVC keeps and rebuilds: the same bytes, dvc.lock unchanged.
    sh(clone, "dvc", "pull")
    sh(clone, "dvc", "repro", "--force", "build-sensor-fp32")
    artifact = Path("build/sensor/fp32/model.mnn")
    assert (clone / artifact).read_bytes() == (project / artifact).read_bytes()
    sh(clone, "git", "diff", "--exit-code", "--", "dvc.lock")
    # Files git already tracks need no `dvc add`.
    sh(project, "git", "add", "data/vision.onnx", "data/vision-evaluation.npz")
    vision = edgereg("add", "data/vision.onnx", "--evaluation", "data/vision-evaluation.npz")
    assert "dvc add" not in vision.output
    assert "git add --all && git commit -m 'add vision'" in vision.output


def test_init_keeps_a_dvc_yaml_it_did_not_write_and_an_existing_dvc_setup(repo: Path) -> None:
    sh(repo, "dvc", "init", "--quiet")
    (repo / ".dvc" / "config").write_text("[core]\n    remote = mine\n", encoding="utf-8")
    (repo / "dvc.yaml").write_text("stages:\n  train:\n    cmd: python train.py\n")
    result = edgereg("init", expect=2)
    assert "dvc.yaml exists and was not written by `edgereg dvc sync`" in result.output
    assert not (repo / "models.toml").exists()

    result = edgereg("init", "--force")
    assert "initialised DVC" not in result.output
    assert (repo / ".dvc" / "config").read_text() == "[core]\n    remote = mine\n"
    assert "stages: {}" in (repo / "dvc.yaml").read_text()


def test_init_in_a_subdirectory_makes_a_dvc_subdir_repo(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = repo / "ml"
    sub.mkdir()
    monkeypatch.chdir(sub)
    edgereg("init")
    assert (sub / ".dvc").is_dir()
    assert not (repo / ".dvc").exists()
    assert "Data and pipelines are up to date." in sh(sub, "dvc", "repro")


# --- add -----------------------------------------------------------------------------


def test_add_appends_the_model_keeping_the_file_and_repro_builds_it(project: Path) -> None:
    before = (project / "models.toml").read_text()
    result = edgereg(
        "add",
        "data/sensor.onnx",
        "--evaluation",
        "data/sensor-evaluation.npz",
        "--calibration",
        "data/sensor-calibration.npz",
    )
    assert "added [models.sensor]" in result.output
    assert "fp32 (high), int8 (mid), w8 (low)" in result.output
    assert "dvc.yaml: written" in result.output
    assert "dvc repro" in result.output

    text = (project / "models.toml").read_text()
    assert text.startswith(before), "comments and formatting of the file are kept"
    config = config_module.load(project / "models.toml")
    model = config.models["sensor"]
    assert model.task.kind == "classification"
    assert [(spec.name, spec.shape, spec.kind) for spec in model.inputs] == [
        ("a", [1, 8], "tensor"),
        ("b", [1, 4], "tensor"),
    ]
    assert [spec.name for spec in model.outputs] == ["y"]
    assert model.source.sha256 == buildkit.sha256_file(project / "data" / "sensor.onnx")
    assert model.calibration is not None
    assert model.calibration.path == "data/sensor-calibration.npz"
    assert {name: v.tier for name, v in model.variants.items()} == {
        "fp32": "high",
        "int8": "mid",
        "w8": "low",
    }
    assert model.variants["int8"].quantization.mode == "int8"
    assert model.variants["w8"].quantization.mode == "weight"
    assert config.notes() == []
    assert (project / "dvc.yaml").read_text() == render_dvc_yaml(config)
    sh(project, "edgereg", "dvc", "sync", "--check")

    built = sh(project, "dvc", "repro")
    for variant in ("fp32", "int8", "w8"):
        assert f"Running stage 'build-sensor-{variant}'" in built
        assert (project / "build" / "sensor" / variant / "model.mnn").is_file()

    # A second model goes after the first, and the first stays as it was.
    edgereg("add", "data/vision.onnx", "--evaluation", "data/vision-evaluation.npz")
    assert (project / "models.toml").read_text().startswith(text)
    assert set(config_module.load(project / "models.toml").models) == {"sensor", "vision"}


def test_add_without_calibration_proposes_no_int8_and_says_how_to_add_it(project: Path) -> None:
    result = edgereg("add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz")
    assert "fp32 (high), w8 (low)" in result.output
    assert "no --calibration set, so no int8 variant" in result.output
    config = config_module.load(project / "models.toml")
    assert list(config.models["sensor"].variants) == ["fp32", "w8"]
    assert config.tier_variants("sensor")["mid"] == ("w8", True)
    assert "# [models.sensor.variants.int8]" in (project / "models.toml").read_text()


def test_pin_refreshes_stale_digests_and_validate_names_them(project: Path) -> None:
    edgereg("add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz")
    toml = project / "models.toml"
    before = toml.read_text()
    config = config_module.load(toml)
    old = config.models["sensor"].evaluation.sha256
    # The team relabels its evaluation set: same path, other bytes.
    with np.load(project / "data/sensor-evaluation.npz") as data:
        arrays = {key: data[key] for key in data.files}
    np.savez_compressed(project / "data/sensor-evaluation.npz", **arrays, extra=np.zeros(3))
    new = hashlib.sha256((project / "data/sensor-evaluation.npz").read_bytes()).hexdigest()

    validate = CliRunner().invoke(edgereg_main, ["validate", "--config", str(toml)])
    assert validate.exit_code == 0, validate.output
    assert "warning: stale pin: models.sensor.evaluation: data/sensor-evaluation.npz changed" in (
        validate.stderr
    )
    assert "run `edgereg pin sensor`" in validate.stderr
    report = json.loads(
        CliRunner().invoke(edgereg_main, ["validate", "--json", "--config", str(toml)]).stdout
    )
    assert report["stale_pins"] == [
        {
            "key": "models.sensor.evaluation",
            "path": "data/sensor-evaluation.npz",
            "pinned": old,
            "actual": new,
        }
    ]
    check = CliRunner().invoke(edgereg_main, ["pin", "--check", "--config", str(toml)])
    assert check.exit_code == 1
    assert "models.sensor.evaluation" in check.stdout
    assert toml.read_text() == before  # --check writes nothing

    pinned = CliRunner().invoke(edgereg_main, ["pin", "sensor", "--config", str(toml)])
    assert pinned.exit_code == 0, pinned.output
    assert f"models.sensor.evaluation: data/sensor-evaluation.npz: sha256 {old[:12]}" in (
        pinned.stdout
    )
    assert "models.sensor.source" not in pinned.stdout  # unchanged files are not listed
    assert toml.read_text() == before.replace(old, new)  # comments and the rest kept
    assert config_module.load(toml).models["sensor"].evaluation.sha256 == new
    again = CliRunner().invoke(edgereg_main, ["pin", "--check", "--config", str(toml)])
    assert again.exit_code == 0
    assert "every pin matches its file" in again.stdout
    unknown = CliRunner().invoke(edgereg_main, ["pin", "nosuch", "--config", str(toml)])
    assert unknown.exit_code != 0
    assert "no model 'nosuch'" in unknown.output


def test_add_picks_image_inputs_from_uint8_pictures(project: Path) -> None:
    result = edgereg(
        "add",
        "data/vision.onnx",
        "--name",
        "colours",
        "--evaluation",
        "data/vision-evaluation.npz",
        "--calibration",
        "data/vision-calibration.npz",
    )
    assert 'kind = "image"' in result.output
    spec = config_module.load(project / "models.toml").models["colours"].inputs[0]
    assert (spec.kind, spec.layout, spec.color, spec.shape) == (
        "image",
        "NCHW",
        "RGB",
        [1, 3, 8, 8],
    )
    assert "# mean = [127.5, 127.5, 127.5]" in (project / "models.toml").read_text()


def dynamic_size_model(path: Path) -> Path:
    """The tiny conv classifier with symbolic height and width."""
    tiny_models.conv_classifier(path)
    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for axis, name in ((2, "height"), (3, "width")):
        dims[axis].Clear()
        dims[axis].dim_param = name
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_add_flags_dynamic_axes_and_fixes_them_from_the_evaluation_set(project: Path) -> None:
    dynamic_size_model(project / "data" / "resizable.onnx")
    rng = np.random.default_rng(0)
    buildkit.write_npz(
        project / "data" / "resizable.npz",
        {"image": rng.normal(0, 1, (12, 3, 16, 12)).astype(np.float32)},
        rng.integers(0, 4, 12),
    )
    result = edgereg("add", "data/resizable.onnx", "--evaluation", "data/resizable.npz")
    assert "models.resizable.inputs.0.shape" in result.output
    assert "dynamic axes 2 ('height'), 3 ('width')" in result.output
    assert "fixed to [1, 3, 16, 12] from the evaluation set" in result.output
    text = (project / "models.toml").read_text()
    assert "shape = [1, 3, 16, 12]   # dynamic in the ONNX" in text
    assert config_module.load(project / "models.toml").models["resizable"].inputs[0].shape == [
        1,
        3,
        16,
        12,
    ]


def test_add_warns_about_operators_mnn_cannot_convert(project: Path) -> None:
    tiny_models.unsupported_op_model(project / "data" / "odd.onnx")
    report_inputs = onnx.load(str(project / "data" / "odd.onnx")).graph.input
    arrays = {}
    for value in report_inputs:
        dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        arrays[value.name] = np.zeros((4, *dims[1:]), dtype=np.float32)
    buildkit.write_npz(project / "data" / "odd.npz", arrays)
    result = edgereg("add", "data/odd.onnx", "--evaluation", "data/odd.npz")
    assert "cannot convert these operators" in result.output
    assert tiny_models.UNSUPPORTED_OP in result.output
    model = config_module.load(project / "models.toml").models["odd"]
    assert model.task.kind == "generic"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["data/sensor.onnx"], "--evaluation is required", id="no-evaluation"),
        pytest.param(
            ["data/missing.onnx", "--evaluation", "data/sensor-evaluation.npz"],
            "model data/missing.onnx: no such file",
            id="missing-model",
        ),
        pytest.param(
            ["data/sensor.onnx", "--evaluation", "data/vision-evaluation.npz"],
            "has no array 'a' for the model's input 'a'",
            id="dataset-of-another-model",
        ),
        pytest.param(
            [
                "data/sensor.onnx",
                "--evaluation",
                "data/sensor-evaluation.npz",
                "--calibration",
                "data/vision-calibration.npz",
            ],
            "--calibration data/vision-calibration.npz has no array 'a'",
            id="calibration-of-another-model",
        ),
        pytest.param(
            ["data/sensor.onnx", "--name", "Sensor", "--evaluation", "data/sensor-evaluation.npz"],
            "'Sensor' is not a valid model name",
            id="bad-name",
        ),
        # Issue #30: numpy reads a 0-byte member as b"", not an array (was exit 70).
        pytest.param(
            [
                "data/sensor.onnx",
                "--evaluation",
                "data/sensor-evaluation.npz",
                "--calibration",
                "data/zero-byte-member.npz",
            ],
            "member 'a' is not a .npy array (0 bytes",
            id="calibration-with-a-0-byte-member",
        ),
    ],
)
def test_add_rejects_bad_input_and_leaves_files_alone(
    project: Path, args: list[str], message: str
) -> None:
    with zipfile.ZipFile(project / "data" / "zero-byte-member.npz", "w") as archive:
        archive.writestr("a.npy", b"")
    before = {name: (project / name).read_text() for name in ("models.toml", "dvc.yaml")}
    result = edgereg("add", *args, expect=2)
    assert message in result.output
    assert {name: (project / name).read_text() for name in before} == before


def test_add_refuses_a_taken_name_and_files_outside_the_project(project: Path, kit: Path) -> None:
    edgereg("add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz")
    before = (project / "models.toml").read_text()
    result = edgereg(
        "add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz", expect=2
    )
    assert "models.sensor: a model named 'sensor' exists already" in result.output
    assert "--name" in result.output

    outside = kit / "sensor.onnx"
    result = edgereg(
        "add",
        str(outside),
        "--name",
        "other",
        "--evaluation",
        "data/sensor-evaluation.npz",
        expect=2,
    )
    assert "is outside the project" in result.output
    assert "Copy it in" in result.output
    assert (project / "models.toml").read_text() == before


def test_add_validates_before_writing(project: Path) -> None:
    # A valid file the appended block cannot extend: models is an inline table.
    config = project / "models.toml"
    config.write_text("models = {}\n" + config.read_text(), encoding="utf-8")
    config_module.load(config)
    before = config.read_text()
    result = edgereg(
        "add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz", expect=2
    )
    assert "models.toml is unchanged" in result.output
    assert config.read_text() == before


def test_add_needs_a_models_toml(repo: Path, kit: Path) -> None:
    shutil.copytree(kit, repo / "data")
    result = edgereg(
        "add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz", expect=2
    )
    assert "models.toml: file not found" in result.output
    assert "Run `edgereg init`" in result.output


def test_add_keeps_a_hand_written_dvc_yaml(project: Path) -> None:
    (project / "dvc.yaml").write_text("stages:\n  train:\n    cmd: python train.py\n")
    result = edgereg("add", "data/sensor.onnx", "--evaluation", "data/sensor-evaluation.npz")
    assert "was not written by edgereg, so it was left alone" in result.output
    assert "train.py" in (project / "dvc.yaml").read_text()


# --- the pure parts ------------------------------------------------------------------


def dataset(**arrays: tuple[str, tuple[int, ...]]) -> DatasetInfo:
    return DatasetInfo(
        path="data/eval.npz",
        sha256="0" * 64,
        arrays={name: ArrayInfo(dtype, shape) for name, (dtype, shape) in arrays.items()},
    )


def propose(tiers: list[str], *, calibration: bool = True, **overrides: object) -> Proposal:
    evaluation = dataset(x=("float32", (10, 5)), labels=("int64", (10,)))
    kwargs: dict[str, object] = {
        "name": "net",
        "source": "net.onnx",
        "source_sha256": "1" * 64,
        "source_bytes": 5_000_000,
        "inputs": [GraphTensor("x", ("N", 5), "float32")],
        "outputs": [GraphTensor("y", ("N", 3), "float32")],
        "evaluation": evaluation,
        "calibration": evaluation if calibration else None,
        "tiers": tiers,
    }
    kwargs.update(overrides)
    return propose_model(**kwargs)  # type: ignore[arg-type]


def test_proposals_fit_the_declared_tiers() -> None:
    base = render_models_toml(installed_versions())
    three = propose(["high", "mid", "low"])
    assert three.variants == {"fp32": "high", "int8": "mid", "w8": "low"}
    config = config_module.parse(base + three.text)
    assert config.models["net"].budgets.max_size_mb == 6.0
    assert config.models["net"].task.kind == "classification"

    mid = base[base.index("[tiers.mid]") : base.index("[tiers.low]")]
    two = propose(["high", "low"])
    assert two.variants == {"fp32": "high", "w8": "low"}
    assert list(config_module.parse(base.replace(mid, "") + two.text).models["net"].variants) == [
        "fp32",
        "w8",
    ]

    one = propose(["all"])
    assert one.variants == {"fp32": "all"}


def test_proposals_reject_what_a_build_cannot_use() -> None:
    with pytest.raises(UsageError, match="input 'x' is float64; MNN models take"):
        propose(["high"], inputs=[GraphTensor("x", ("N", 5), "float64")])
    with pytest.raises(UsageError, match="array 'x' holds float32, but the model's input is int64"):
        propose(["high"], inputs=[GraphTensor("x", ("N", 5), "int64")])
    with pytest.raises(UsageError, match="has no 'labels' array"):
        propose(["high"], evaluation=dataset(x=("float32", (10, 5))), task="classification")
    with pytest.raises(UsageError, match=r"samples of shape \[6\]"):
        propose(["high"], evaluation=dataset(x=("float32", (10, 6)), labels=("int64", (10,))))
    fixed = propose(["high"], inputs=[GraphTensor("x", (8, 5), "float32")])
    assert any("fixed batch of 8" in note for note in fixed.notes)


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("MobileNet_v2.onnx", "mobilenet_v2"),
        ("my model (final).onnx", "my-model-final"),
        ("2024-resnet.onnx", "model-2024-resnet"),
        ("___.onnx", "model"),
    ],
)
def test_model_names_from_file_names(file: str, name: str) -> None:
    assert model_name_from_path(Path(file)) == name


def test_proposals_take_dtypes_scalars_state_and_class_names_from_the_model() -> None:
    evaluation = dataset(
        chunk=("float32", (30, 8)),
        sr=("int64", (30,)),
        sequences=("int64", (30,)),
        labels=("int64", (30, 1)),
    )
    proposal = propose(
        ["high", "low"],
        calibration=False,
        inputs=[
            GraphTensor("chunk", (1, 8), "float32"),
            GraphTensor("sr", (), "int64"),
            GraphTensor("state", (2, 1, 16), "float32"),
        ],
        outputs=[
            GraphTensor("prob", (1, 1), "float32"),
            GraphTensor("stateN", (2, 1, 16), "float32"),
        ],
        evaluation=evaluation,
        task="frame_decision",
    )
    assert proposal.state == [("state", "stateN")]
    base = render_models_toml(installed_versions())
    mid = base[base.index("[tiers.mid]") : base.index("[tiers.low]")]
    model = config_module.parse(base.replace(mid, "") + proposal.text).models["net"]
    inputs = {spec.name: spec for spec in model.inputs}
    assert (inputs["chunk"].shape, inputs["chunk"].batch) == ([1, 8], 0)
    assert (inputs["sr"].shape, inputs["sr"].dtype, inputs["sr"].batch) == ([], "int64", None)
    assert (inputs["state"].shape, inputs["state"].batch) == ([2, 1, 16], None)
    assert [(p.input, p.output) for p in model.state] == [("state", "stateN")]
    assert model.task.kind == "frame_decision"

    # A stateful model needs its sequences named.
    without = dataset(chunk=("float32", (30, 8)), sr=("int64", (30,)))
    with pytest.raises(UsageError, match="no 'sequences' array"):
        propose(
            ["high"],
            inputs=[
                GraphTensor("chunk", (1, 8), "float32"),
                GraphTensor("h", (2, 1, 4), "float32"),
            ],
            outputs=[GraphTensor("y", (1, 1), "float32"), GraphTensor("hn", (2, 1, 4), "float32")],
            evaluation=without,
            task="generic",
        )

    named = propose(["high"], metadata={"names": "{0: 'cat', 1: 'dog', 2: 'bird'}"})
    assert named.class_names == ["cat", "dog", "bird"]
    assert 'classes = ["cat", "dog", "bird"]' in named.text
    wrong = propose(["high"], metadata={"classes": '["cat", "dog"]'})
    assert wrong.class_names is None
    assert any("lists 2 names but the output has 3" in note for note in wrong.notes)


def test_proposals_take_token_ids_with_their_dtype() -> None:
    evaluation = dataset(input_ids=("int64", (10, 16)), attention_mask=("int64", (10, 16)))
    proposal = propose(
        ["high", "mid", "low"],
        calibration=False,
        inputs=[
            GraphTensor("input_ids", ("batch", 16), "int64"),
            GraphTensor("attention_mask", ("batch", 16), "int64"),
        ],
        outputs=[GraphTensor("embedding", ("batch", 32), "float32")],
        evaluation=evaluation,
        task="embedding",
    )
    model = config_module.parse(render_models_toml(installed_versions()) + proposal.text)
    inputs = model.models["net"].inputs
    assert [(i.name, i.shape, i.dtype, i.batch) for i in inputs] == [
        ("input_ids", [1, 16], "int64", 0),
        ("attention_mask", [1, 16], "int64", 0),
    ]


@pytest.mark.parametrize(
    ("labels", "note"),
    [
        pytest.param(("<U8", (10,)), 'kind = "ctc"', id="text-labels"),
        pytest.param(("uint8", (10, 1, 5)), 'kind = "dense_map"', id="mask-labels"),
    ],
)
def test_labels_that_are_not_class_ids_propose_no_classifier(
    labels: tuple[str, tuple[int, ...]], note: str
) -> None:
    evaluation = dataset(x=("float32", (10, 5)), labels=labels)
    proposal = propose(["high"], calibration=False, evaluation=evaluation)
    assert proposal.task == "generic"
    assert proposal.classes is None
    assert any(note in line for line in proposal.notes), proposal.notes


@pytest.mark.parametrize(
    "shape", [("N", "T", 97), (1, 40, 97), ("T", 1, 97)], ids=["dynamic", "fixed", "time-first"]
)
def test_a_ctc_shaped_output_proposes_the_ctc_task(shape: tuple[int | str, ...]) -> None:
    evaluation = dataset(x=("float32", (10, 5)), labels=("<U12", (10,)))
    proposal = propose(
        ["high"],
        calibration=False,
        evaluation=evaluation,
        outputs=[GraphTensor("probs", shape, "float32")],
    )
    assert proposal.task == "generic"  # a charset file is the team's to name
    ctc = [line for line in proposal.notes if "looks like a CTC recogniser" in line]
    assert len(ctc) == 1, proposal.notes
    assert (
        "output 'probs' looks like a CTC recogniser's (per-step scores over 97 classes)" in (ctc[0])
    )
    assert 'kind = "ctc"' in ctc[0]
    assert "the 96 characters" in ctc[0]


@pytest.mark.parametrize(
    "shape", [("N", 3), (1, 1, 97), ("N", "T", 4), (1, 40, 1)], ids=["scores", "one", "few", "map"]
)
def test_outputs_that_are_not_ctc_shaped_propose_no_ctc(shape: tuple[int | str, ...]) -> None:
    proposal = propose(["high"], calibration=False, outputs=[GraphTensor("y", shape, "float32")])
    assert not any("CTC recogniser" in line for line in proposal.notes), proposal.notes


def test_add_proposes_no_ctc_for_a_per_character_tagger(project: Path) -> None:
    """Issue #30: an output [batch, steps, classes] with one label per step is a tagger."""
    import onnx.helper as oh
    from onnx import TensorProto, numpy_helper

    steps, features, classes = 16, 8, 30
    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array(rng.normal(size=(features, classes)).astype(np.float32), "w")
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["chars", "w"], ["tags"])],
        "tagger",
        [oh.make_tensor_value_info("chars", TensorProto.FLOAT, [1, steps, features])],
        [oh.make_tensor_value_info("tags", TensorProto.FLOAT, [1, steps, classes])],
        [weight],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, project / "data" / "tagger.onnx")
    np.savez(
        project / "data" / "tagger-evaluation.npz",
        chars=rng.normal(size=(12, steps, features)).astype(np.float32),
        labels=rng.integers(0, classes, size=(12, steps)).astype(np.int64),
    )
    result = edgereg("add", "data/tagger.onnx", "--evaluation", "data/tagger-evaluation.npz")
    assert "looks like a CTC recogniser" not in result.output
    assert 'kind = "ctc"' not in result.output
    assert "one class per step" in result.output
    assert "custom evaluator" in result.output
    assert "docs/models-toml.md#custom-evaluators" in result.output
    model_toml = config_module.load(project / "models.toml").models["tagger"]
    assert model_toml.task.kind == "generic"


def test_own_repository_md_says_what_add_proposes_and_the_custom_evaluator_path() -> None:
    """Issue #30: the page said labels make a classifier, and never named the custom path."""
    text = " ".join(
        (Path(__file__).resolve().parents[1] / "docs" / "own-repository.md").read_text().split()
    )
    assert (
        "a classifier when the evaluation set's `labels` are class ids (one integer per sample)"
        in text
    )
    assert "`generic` otherwise" in text
    assert 'task = { kind = "custom", evaluator = "evals.tagger:score" }' in text
    assert "(models-toml.md#custom-evaluators)" in text
    # What the page promises, `add` does: integer labels per sample make a classifier.
    evaluation = dataset(x=("float32", (10, 5)), labels=("int64", (10,)))
    assert propose(["high"], calibration=False, evaluation=evaluation).task == "classification"
    per_step = dataset(x=("float32", (10, 5)), labels=("int64", (10, 5)))
    assert propose(["high"], calibration=False, evaluation=per_step).task == "generic"
