# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
# dvc.yaml stage commands call `edgereg`; the venv must be first on PATH.
# The Swift toolchain lives in /opt/swift on this project's machines (also when a
# shell did not source /etc/profile.d/swift.sh).
export PATH := $(BIN):$(PATH):/opt/swift/usr/bin
export DVC_NO_ANALYTICS := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv runtimes arm demo test test-fast install-check lint typecheck unit bench clean system-deps \
	arm-deps sdk-deps sdk sdk-test
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# Old MNN runtimes that builds prove artifacts on (models.toml [toolchain]
# min_mnn_runtime; the tests prove on 3.0.0): one isolated venv per version in the
# per-user cache every repository shares (~/.cache/edgereg/runtimes/, or
# $EDGEREG_RUNTIMES_DIR), downloaded once and kept (a second run downloads nothing).
TEST_MNN_RUNTIMES := 3.0.0
runtimes: $(VENV)/.installed
	edgereg toolchain runtimes install $(addprefix --version ,$(TEST_MNN_RUNTIMES))

# The aarch64 sysroot that runs MNN's ARM kernels under QEMU (docs/operations/
# arm-verification.md): Debian's arm64 python and the pinned MNN wheel in
# ~/.cache/edgereg/arm/ (or $EDGEREG_ARM_DIR), set up once per user (about 45 s,
# 300 MB) and kept like the runtimes.
arm: $(VENV)/.installed arm-deps
	edgereg toolchain arm install

venv: $(VENV)/.installed runtimes arm

# Debian packages, by what needs them (each target installs only its own, when missing):
# ARM verification (`make arm`, so `make demo` too): qemu-user-static and debootstrap set
# up and run the aarch64 sysroot (`edgereg toolchain arm install`).
ARM_PACKAGES := qemu-user-static debootstrap
# The SDKs (`make sdk`): junit5 (the console launcher), libbcprov-java (BouncyCastle,
# the Ed25519 fallback for Android < 13) and libjsr305-java (compile-only nullability for
# Kotlin) for clients/android; libsodium-dev (Ed25519), libssl-dev (libcrypto's SHA-256,
# which uses the CPU's SHA instructions) and pkg-config for clients/swift on Linux.
SDK_PACKAGES := junit5 libbcprov-java libjsr305-java libsodium-dev libssl-dev pkg-config
# The Python tests (`make test`): chromium renders the HTML report and status page; nginx
# runs the documented static-host configuration (tests/test_static_hosting.py);
# postgresql is the report store's server (tests/pgkit.py runs initdb/pg_ctl from it).
TEST_PACKAGES := chromium nginx-light postgresql
SYSTEM_PACKAGES := $(ARM_PACKAGES) $(SDK_PACKAGES) $(TEST_PACKAGES)
# $(call apt_ensure,PACKAGES): apt-get install them unless every one is installed.
apt_ensure = test "$$(dpkg-query -W -f='$${Status}\n' $(1) 2>/dev/null | grep -c 'install ok installed')" \
	= "$(words $(1))" || ($(SUDO) apt-get update && $(SUDO) apt-get install -y $(1))
system-deps:
	$(call apt_ensure,$(SYSTEM_PACKAGES))
arm-deps:
	$(call apt_ensure,$(ARM_PACKAGES))
sdk-deps:
	$(call apt_ensure,$(SDK_PACKAGES))

# The native SDKs (docs/guides/android.md, docs/guides/ios.md): `make sdk` builds
# clients/android/build/edgereg-android-<version>.jar (with its sources jar and POM),
# the Swift package in clients/swift (release), and the device programs the client
# harness drives (docs/reference/device-program.md).
sdk: sdk-deps
	$(MAKE) -C clients/android jar device
	$(MAKE) -C clients/swift build

# Each SDK's own suite (JUnit 5 and swift test: every tests/vectors file, RFC 8032,
# real HTTP) and the Android API 24 fit of the jar.
sdk-test: sdk
	$(MAKE) -C clients/android test api-check
	$(MAKE) -C clients/swift test

DEMO_PULL = edgereg pull --registry file://$(CURDIR)/registry \
	--trusted-key .edgereg/signing-key.pub.pem --config models.toml --explain
# A rollout's salt is random, so the phones' device ids are chosen for this run's cohorts
# (pipelines/demo_devices.py): the flagship inside the sensor and ocr canaries, the budget
# phone inside ocr's and outside sensor's. Every run shows the same.
FLAGSHIP = --device-id $$(python pipelines/demo_devices.py demo-flagship --inside sensor \
	--inside ocr) --ram-mb 12288 --cpu-cores 8 --os android --out .edgereg/demo-devices/flagship
BUDGET_PHONE = --device-id $$(python pipelines/demo_devices.py demo-budget --inside ocr \
	--outside sensor) --ram-mb 2048 --cpu-cores 4 --os android --out .edgereg/demo-devices/budget

demo: venv
	edgereg validate
	dvc repro
	edgereg summary
	test -f .edgereg/signing-key.pem || edgereg keys generate
	edgereg publish digits --canary 5%
	edgereg publish sensor --canary 5%
	edgereg publish ocr --canary 5%
	edgereg status
	@echo "--- sensor stays a 5% canary: the flagship is in its cohort, the budget phone gets no model yet ---"
	$(DEMO_PULL) sensor $(FLAGSHIP)
	$(DEMO_PULL) sensor $(BUDGET_PHONE)
	@echo "--- demo only: digits goes to everyone now, skipping the soak time (--force) ---"
	if edgereg status digits --json | grep -q '"candidate": "'; then \
		edgereg rollout digits --to 100% --force && edgereg promote digits; fi
	$(DEMO_PULL) digits $(FLAGSHIP)
	$(DEMO_PULL) digits $(BUDGET_PHONE)
	edgereg history digits
	@echo "--- ocr ships textdet and textrec as one bundle: both phones are in its 5% canary and get both members of one version ---"
	$(DEMO_PULL) --bundle ocr $(FLAGSHIP)
	$(DEMO_PULL) --bundle ocr $(BUDGET_PHONE)
	$(DEMO_PULL) --bundle ocr --status $(FLAGSHIP)
	@echo "--- segment: 512x512 for high and mid phones; the low tier's memory ceiling refuses both (summary above), so budget phones run it at 256x256 ---"
	edgereg publish segment --full
	$(DEMO_PULL) segment $(FLAGSHIP)
	$(DEMO_PULL) segment $(BUDGET_PHONE)
	edgereg verify

lint: venv
	ruff check edgereg tests benchmarks pipelines docs/gen
	ruff format --check edgereg tests benchmarks pipelines docs/gen
	edgereg dvc sync --check

typecheck: venv
	mypy

unit: venv
	pytest

# The SDKs build before pytest: tests/test_clients_harness.py drives their device programs.
test: system-deps lint typecheck sdk-test unit

# The dependency set resolves quickly with the pip that Python 3.10-3.12 ship
# (issue 12: pip 23.2 backtracked for over 14 minutes without the bounds in
# pyproject.toml). Dry run: resolves and downloads metadata, installs nothing.
OLD_PIP := /tmp/edgereg-old-pip
install-check:
	test -x $(OLD_PIP)/bin/pip || ($(PYTHON) -m venv $(OLD_PIP) && \
		$(OLD_PIP)/bin/python -m pip install --quiet pip==23.2.1)
	timeout 300 $(OLD_PIP)/bin/pip install --dry-run --quiet -e '.[dev]'

# The edit-test loop: lint, types, and every test not marked slow (the slow ones
# build the full example models); `make test` (and CI) still run everything.
# By marker, not a file list: a new test file is in it unless it says otherwise.
test-fast: lint typecheck
	pytest -x -q -m "not slow"

# Ratios measured in one run each (a failed target does not stop the others);
# serve.py compares against nginx, startup.py against curl (Debian packages).
bench: venv sdk
	command -v nginx >/dev/null && command -v wrk >/dev/null && command -v curl >/dev/null || \
		($(SUDO) apt-get update && $(SUDO) apt-get install -y nginx-light wrk curl)
	-python benchmarks/build.py
	-python benchmarks/storage.py
	-python benchmarks/registry.py
	-python benchmarks/serve.py --soak 30
	-python benchmarks/serve.py --workers 2
	-python benchmarks/client.py
	-python benchmarks/startup.py
	-python benchmarks/runtime_proof.py
	-python benchmarks/arm.py
	-python benchmarks/verify.py
	-python benchmarks/memory.py
	-python benchmarks/reports.py
	-python benchmarks/analyze.py
	-python benchmarks/sdk.py

# Never the signing key (.edgereg/signing-key.pem) nor the pinned publisher-keys/:
# a deleted private key cannot be made again, and apps trust only that one.
# The MNN runtimes and the ARM sysroot live outside the repository (~/.cache/edgereg/).
clean:
	rm -rf build registry .edgereg/demo-devices .pytest_cache .mypy_cache .ruff_cache
