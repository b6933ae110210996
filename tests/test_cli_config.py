"""`edgereg validate` and `edgereg schema`, and the JSON Schema they are built on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from edgereg import config
from edgereg.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BAD_METHOD = 'quantization = { mode = "int8", method = "MINMAX" }'
KEY_PATH = "models.digits.variants.int8.quantization.method"
EDGEREG = Path(sys.executable).parent / "edgereg"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def bad_toml(tmp_path: Path, small_toml: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(
        small_toml.replace('quantization = { mode = "int8", method = "KL" }', BAD_METHOD),
        encoding="utf-8",
    )
    return path


# --- validate -----------------------------------------------------------------


def test_validate_repo_file(repo_root: Path) -> None:
    result = invoke("validate", "--config", str(repo_root / "models.toml"))
    assert result.exit_code == 0, result.output
    assert "valid" in result.stdout
    for name in ("digits", "sensor", "tier high", "tier mid", "tier low", "int8", "w8"):
        assert name in result.stdout
    # Notes are diagnostics: stderr, so the table alone goes down a pipe.
    assert "note:" not in result.stdout
    assert all(line.startswith("note: ") for line in result.stderr.splitlines())


def test_validate_bad_file_exits_2_naming_the_key(bad_toml: Path) -> None:
    result = invoke("validate", "--config", str(bad_toml))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"error: {bad_toml}: {KEY_PATH}: " in result.stderr
    assert "'KL', 'ADMM', 'EMA' or 'auto'" in result.stderr
    assert "Traceback" not in result.stderr


def test_error_text_is_not_taken_for_markup(tmp_path: Path, small_toml: str) -> None:
    # The fix-it text quotes TOML tables in brackets, which rich would swallow as markup.
    path = tmp_path / "models.toml"
    path.write_text(
        small_toml.replace('description = "Everything else"', "min_ram_mb = 1"), encoding="utf-8"
    )
    result = invoke("validate", "--config", str(path))
    assert result.exit_code == 2
    assert "add an empty [tiers.<name>] table at the end" in result.stderr


def test_validate_json(repo_root: Path) -> None:
    result = invoke("validate", "--json", "--config", str(repo_root / "models.toml"))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["valid"] is True
    # The streaming VAD and the embedding ship no int8 (it fails their gates): mid
    # falls back to w8, and validate says so.
    assert report["notes"] == [
        f"models.{model}: tier 'mid' has no variant of its own and falls back to 'w8' "
        "(the variant of the next lower tier)"
        for model in ("vad", "embed")
    ]
    assert report["tiers"]["digits"] == {
        "high": {"variant": "fp32", "fallback": False},
        "mid": {"variant": "int8", "fallback": False},
        "low": {"variant": "w8", "fallback": False},
    }
    assert set(report["tiers"]) == {
        "digits",
        "sensor",
        "textdet",
        "textrec",
        "vad",
        "embed",
        "segment",
    }
    assert report["bundles"] == {"ocr": {"version": "1.0.0", "models": ["textdet", "textrec"]}}


def test_validate_shows_tier_fallback(tmp_path: Path, small_toml: str) -> None:
    int8_table = (
        '[models.digits.variants.int8]\ntier = "mid"\n'
        'quantization = { mode = "int8", method = "KL" }\nruntime = { threads = 2 }\n'
    )
    assert int8_table in small_toml
    path = tmp_path / "models.toml"
    path.write_text(small_toml.replace(int8_table, ""), encoding="utf-8")

    table = invoke("validate", "--config", str(path))
    assert table.exit_code == 0, table.output
    assert "w8 (fallback)" in table.stdout
    assert "note: models.digits: tier 'mid' has no variant of its own" in table.stderr

    report = json.loads(invoke("validate", "--json", "--config", str(path)).stdout)
    assert report["tiers"]["digits"]["mid"] == {"variant": "w8", "fallback": True}
    assert len(report["notes"]) == 1


def test_validate_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "models.toml"
    result = invoke("validate", "--config", str(missing))
    assert result.exit_code == 2
    assert f"{missing}: file not found" in result.stderr
    assert "pass --config PATH" in result.stderr


def test_validate_default_path_is_models_toml_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_toml: str
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = invoke("validate")
    assert missing.exit_code == 2
    assert "models.toml: file not found" in missing.stderr
    (tmp_path / "models.toml").write_text(small_toml, encoding="utf-8")
    assert invoke("validate").exit_code == 0


def test_verbose_prints_the_traceback(bad_toml: Path) -> None:
    result = invoke("--verbose", "validate", "--config", str(bad_toml))
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "edgereg.errors.ConfigError" in result.stderr
    assert KEY_PATH in result.stderr


# --- the installed command, in a real process ----------------------------------


@pytest.fixture
def edgereg_bin() -> Path:
    if not EDGEREG.exists():
        pytest.fail(f"{EDGEREG} is not installed: run `make venv`")
    return EDGEREG


def test_installed_command_validates(edgereg_bin: Path, repo_root: Path, bad_toml: Path) -> None:
    good = subprocess.run(
        [edgereg_bin, "validate", "--json", "--config", repo_root / "models.toml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["valid"] is True  # nothing else on stdout

    bad = subprocess.run(
        [edgereg_bin, "validate", "--config", bad_toml],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert f"{bad_toml}: {KEY_PATH}: Input should be 'KL', 'ADMM', 'EMA' or 'auto'" in bad.stderr

    verbose = subprocess.run(
        [edgereg_bin, "-v", "validate", "--config", bad_toml],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verbose.returncode == 2
    assert "Traceback (most recent call last)" in verbose.stderr


# --- schema -------------------------------------------------------------------


def test_schema_to_stdout_and_file(tmp_path: Path) -> None:
    printed = invoke("schema")
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout) == config.json_schema()

    out = tmp_path / "models.schema.json"
    written = invoke("schema", "--out", str(out))
    assert written.exit_code == 0, written.output
    assert written.stdout == ""
    assert out.read_text(encoding="utf-8") == printed.stdout


def test_schema_structure() -> None:
    schema = config.json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "edgereg models.toml"
    assert schema["type"] == "object"
    assert {"toolchain", "tiers", "models", "registry", "rollout", "bundles", "reports"} == set(
        schema["properties"]
    )
    # models may be empty: `edgereg init` writes a file with no model yet.
    assert set(schema["required"]) == {"toolchain", "tiers"}
    assert schema["additionalProperties"] is False
    json.dumps(schema)  # serialisable as is


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        node = schema["$defs"][name]
    return node


def _json_type_fits(option: dict[str, Any], value: Any) -> bool:
    """Whether a (resolved) schema option could describe ``value``, by JSON type."""
    kind = option.get("type")
    if "discriminator" in option:
        return isinstance(value, dict)  # a tagged union of tables
    if kind is None:
        return "const" not in option or option["const"] == value
    if kind == "null":
        return False
    python = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "object": dict,
        "array": list,
        "boolean": bool,
    }[kind]
    return isinstance(value, python) and ("const" not in option or option["const"] == value)


def _check_keys(schema: dict[str, Any], node: dict[str, Any], value: Any, where: str) -> int:
    """Check every key of ``value`` is one the schema declares; return how many were seen."""
    node = _resolve(schema, node)
    for choice in ("anyOf", "oneOf"):
        if choice in node:
            options = [_resolve(schema, option) for option in node[choice]]
            for tag in ("mode", "kind"):
                if isinstance(value, dict) and tag in value:
                    options = [
                        option
                        for option in options
                        if option.get("properties", {}).get(tag, {}).get("const") == value[tag]
                        or "oneOf" in option  # a nested union, resolved below
                    ]
            typed = [option for option in options if _json_type_fits(option, value)]
            assert len(typed) == 1, f"{where}: no single schema option for {value!r}"
            node = typed[0]
    seen = 0
    if isinstance(value, dict):
        properties = node.get("properties")
        if properties is not None:
            assert node.get("additionalProperties") is False, where
            for key, item in value.items():
                assert key in properties, f"{where}.{key} is not in the schema"
                seen += 1 + _check_keys(schema, properties[key], item, f"{where}.{key}")
        elif isinstance(node.get("additionalProperties"), dict):
            # A table keyed by free names (budgets.metrics).
            for key, item in value.items():
                seen += 1 + _check_keys(
                    schema, node["additionalProperties"], item, f"{where}.{key}"
                )
        else:
            # A table keyed by names (tiers, models, variants).
            ((pattern, item_schema),) = node["patternProperties"].items()
            assert node.get("additionalProperties") is False, where
            for key, item in value.items():
                assert re.fullmatch(pattern, key), f"{where}.{key} is not a valid name"
                seen += 1 + _check_keys(schema, item_schema, item, f"{where}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            seen += _check_keys(schema, node["items"], item, f"{where}.{index}")
    return seen


def test_repo_models_toml_has_the_schema_key_structure(repo_root: Path) -> None:
    schema = config.json_schema()
    data = tomllib.loads((repo_root / "models.toml").read_text(encoding="utf-8"))
    assert _check_keys(schema, schema, data, "(top)") > 50


def test_repo_models_toml_conforms_to_the_schema(repo_root: Path) -> None:
    import jsonschema

    schema = config.json_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    data = tomllib.loads((repo_root / "models.toml").read_text(encoding="utf-8"))
    assert list(validator.iter_errors(data)) == []


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        (("models", "digits", "variants", "int8", "quantization"), "method", "MINMAX"),
        (("models", "digits", "variants", "int8", "quantization"), "mode", "int4"),
        (("models", "digits", "variants", "fp32"), "threads", 4),
        (("models", "digits", "variants"), "FP32", {"tier": "high"}),
        (("tiers",), "Mid", {}),
        ((), "telemetry", True),
    ],
    ids=["bad-method", "bad-mode", "unknown-key", "bad-variant-name", "bad-tier-name", "top"],
)
def test_schema_rejects_what_the_loader_rejects(
    repo_root: Path, where: tuple[str, ...], key: str, value: Any
) -> None:
    import jsonschema

    schema = config.json_schema()
    data = tomllib.loads((repo_root / "models.toml").read_text(encoding="utf-8"))
    table = data
    for part in where:
        table = table[part]
    table[key] = value
    errors = list(jsonschema.validators.validator_for(schema)(schema).iter_errors(data))
    assert errors
    assert all(tuple(error.absolute_path)[: len(where)] == where for error in errors)


def test_quiet_keeps_results_and_errors_only(repo_root: Path, tmp_path: Path) -> None:
    edgereg = str(EDGEREG)
    quiet = subprocess.run(
        [edgereg, "-q", "dvc", "sync", "--check", "--config", str(repo_root / "models.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    loud = subprocess.run(
        [edgereg, "dvc", "sync", "--check", "--config", str(repo_root / "models.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "up to date" in loud.stdout
    # Errors still show under --quiet.
    missing = subprocess.run(
        [edgereg, "-q", "validate", "--config", str(tmp_path / "nope.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert "file not found" in missing.stderr


# --- issue #30: every duration and size has an upper bound ---------------------------

#: (the table appended to small_models.toml, the key path named, the bound named). A value
#: past the bound passed `validate` and later crashed `rollout --next`, `--auto` and
#: `status --html` with exit 70 (1e308 hours is no timedelta), or became an infinite budget.
LIMITS = {
    "min-soak-1e308": ("[rollout]\nmin_soak_hours = 1e308", "rollout.min_soak_hours", "8760"),
    "min-soak-1e11": ("[rollout]\nmin_soak_hours = 1e11", "rollout.min_soak_hours", "8760"),
    "max-soak": ("[rollout]\nmax_soak_hours = 1e11", "rollout.max_soak_hours", "8760"),
    "revert-window": (
        "[rollout.guardrails]\nrevert_window_hours = 1e308",
        "rollout.guardrails.revert_window_hours",
        "8760",
    ),
    "a-models-own-soak": (
        "[models.digits.rollout]\nmin_soak_hours = 9000",
        "models.digits.rollout.min_soak_hours",
        "8760",
    ),
    "size-budget": (
        "[models.digits.variants.fp32.budgets]\nmax_size_mb = 1.7e308",
        "models.digits.variants.fp32.budgets.max_size_mb",
        "1048576",
    ),
    "memory-budget": (
        "[models.digits.variants.fp32.budgets]\nmax_memory_mb = 1e9",
        "models.digits.variants.fp32.budgets.max_memory_mb",
        "1048576",
    ),
    "latency-budget": (
        "[models.digits.variants.fp32.budgets]\nmax_latency_p50_ms = 1e300",
        "models.digits.variants.fp32.budgets.max_latency_p50_ms",
        "3600000",
    ),
    "first-inference-budget": (
        "[models.digits.variants.fp32.budgets]\nmax_first_inference_ms = 1e10",
        "models.digits.variants.fp32.budgets.max_first_inference_ms",
        "3600000",
    ),
    "tier-memory": (
        "[tiers.extra]\nmin_cpu_cores = 2\nmax_model_memory_mb = 1e12",
        "tiers.extra.max_model_memory_mb",
        "1048576",
    ),
    "tier-ram": ("[tiers.extra]\nmin_ram_mb = 10000000000", "tiers.extra.min_ram_mb", "1048576"),
}


def _with(small_toml: str, table: str) -> str:
    # A new tier goes before the catch-all one, which must stay last.
    if table.startswith("[tiers."):
        return small_toml.replace("[tiers.low]", f"{table}\n\n[tiers.low]")
    return f"{small_toml}\n{table}\n"


@pytest.mark.parametrize(("table", "key", "bound"), LIMITS.values(), ids=LIMITS.keys())
def test_every_duration_and_size_has_a_bound(
    tmp_path: Path, small_toml: str, table: str, key: str, bound: str
) -> None:
    path = tmp_path / "models.toml"
    path.write_text(_with(small_toml, table), encoding="utf-8")
    for command in (("validate",), ("rollout", "digits", "--next"), ("status", "--html", "s.html")):
        result = invoke(*command, "--config", str(path))
        assert result.exit_code == 2, (command, result.output)
        assert f"error: {path}: {key}: " in result.stderr, result.stderr
        assert bound in result.stderr
        assert "Traceback" not in result.output


def test_the_bounds_themselves_are_valid(tmp_path: Path, small_toml: str) -> None:
    path = tmp_path / "models.toml"
    at_the_bounds = (
        "[rollout]\nmin_soak_hours = 8760\nmax_soak_hours = 8760\n"
        "guardrails.revert_window_hours = 8760\n"
        "[models.digits.variants.fp32.budgets]\nmax_size_mb = 1048576\n"
        "max_latency_p50_ms = 3600000\n"
    )
    path.write_text(_with(small_toml, at_the_bounds), encoding="utf-8")
    result = invoke("validate", "--config", str(path))
    assert result.exit_code == 0, result.output


# --- issue #30: --config is a regular file of bounded size --------------------------


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo.toml"
    os.mkfifo(path)
    return str(path)


def _huge(tmp_path: Path) -> str:
    path = tmp_path / "huge.toml"
    with path.open("wb") as handle:
        handle.write(b"# " + b"x" * (config.MAX_CONFIG_BYTES + 10) + b"\n")
    return str(path)


NOT_A_CONFIG = {
    "dev-zero": (lambda tmp: "/dev/zero", "not a regular file"),
    "dev-urandom": (lambda tmp: "/dev/urandom", "not a regular file"),
    "a-fifo-without-a-writer": (_fifo, "not a regular file"),
    "past-the-size-limit": (_huge, "larger than 4 MiB"),
}


@pytest.mark.parametrize(("make", "message"), NOT_A_CONFIG.values(), ids=NOT_A_CONFIG.keys())
def test_config_that_is_no_file_is_refused_without_reading_it(
    tmp_path: Path, make: Any, message: str
) -> None:
    # A child process with a deadline: /dev/urandom was read without end, /dev/zero
    # until MemoryError.
    path = make(tmp_path)
    done = subprocess.run(
        [str(EDGEREG), "validate", "--config", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
