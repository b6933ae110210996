# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
# dvc.yaml stage commands call `edgereg`; the venv must be first on PATH.
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv demo test lint typecheck unit bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	edgereg validate
	dvc repro
	edgereg summary
	test -f .edgereg/signing-key.pem || edgereg keys generate
	edgereg publish digits --canary 5%
	edgereg publish sensor --canary 5%
	edgereg status
	edgereg verify

lint: venv
	ruff check edgereg tests benchmarks pipelines docs/gen
	edgereg dvc sync --check

typecheck: venv
	mypy

unit: venv
	pytest

test: lint typecheck unit

bench: venv
	python benchmarks/build.py

clean:
	rm -rf build registry .edgereg .pytest_cache .mypy_cache .ruff_cache
