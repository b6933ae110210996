"""edgereg.protocol: the contract, depending on nothing else in edgereg."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import semver
from hypothesis import given, settings
from hypothesis import strategies as st

import edgereg.protocol
from edgereg.protocol.fields import compare_semver

PACKAGE = Path(edgereg.protocol.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_a_protocol_module_imports_nothing_of_edgereg_but_the_protocol(path: Path) -> None:
    outside = {
        name
        for name in _imports(path)
        if name.split(".")[0] == "edgereg" and not name.startswith("edgereg.protocol")
    }
    assert not outside, f"{path.name} imports {sorted(outside)}"
    third_party = {name.split(".")[0] for name in _imports(path)} - set(sys.stdlib_module_names)
    assert third_party <= {"edgereg", "pydantic", "pydantic_core", "cryptography"}, third_party


def test_importing_the_protocol_loads_nothing_else_of_edgereg() -> None:
    code = (
        "import sys, edgereg.protocol.build_outputs, edgereg.protocol; "
        "print(sorted(m for m in sys.modules if m.startswith('edgereg') "
        "and m != 'edgereg' and not m.startswith('edgereg.protocol')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_importing_the_client_loads_nothing_of_edgereg_but_the_client_and_the_protocol() -> None:
    # The reference client is what a port reads: it must not pull in models.toml's
    # schema, the rollout tools or the signing CLI helpers.
    code = (
        "import sys, edgereg.client; "
        "print(sorted(m for m in sys.modules if m.startswith('edgereg') "
        "and not m.startswith(('edgereg.client', 'edgereg.protocol'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    # edgereg itself (its __version__) and the file helpers (atomic write, digests).
    assert out.strip() == "['edgereg', 'edgereg._files']"


def test_the_server_routes_import_nothing_of_edgereg_but_the_protocol() -> None:
    routes = PACKAGE.parent / "serve" / "_routes.py"
    outside = {
        name
        for name in _imports(routes)
        if name.split(".")[0] == "edgereg" and not name.startswith("edgereg.protocol")
    }
    assert not outside, f"_routes.py imports {sorted(outside)}"


def test_old_import_paths_still_work() -> None:
    from edgereg import client, errors, rollout, signing, wire
    from edgereg.protocol import decision, envelope, rules
    from edgereg.protocol import errors as protocol_errors
    from edgereg.protocol import wire as protocol_wire

    assert wire.Manifest is protocol_wire.Manifest
    assert signing.verify_envelope is envelope.verify_envelope
    assert rollout.in_cohort is rules.in_cohort
    assert rollout.DeviceProfile is rules.DeviceProfile is client.DeviceProfile
    assert signing.TrustedKeys is envelope.TrustedKeys is client.TrustedKeys
    assert decision.decide is client.decide
    assert errors.TransportError is protocol_errors.TransportError is client.TransportError


_IDENT = st.from_regex(r"\A(0|[1-9][0-9]{0,2}|[a-z-][0-9a-z-]{0,3})\Z")
_VERSION = st.builds(
    lambda a, b, c, pre, build: (
        f"{a}.{b}.{c}"
        + (f"-{'.'.join(pre)}" if pre else "")
        + (f"+{'.'.join(build)}" if build else "")
    ),
    st.integers(0, 20),
    st.integers(0, 20),
    st.integers(0, 20),
    st.lists(_IDENT, max_size=3),
    st.lists(st.from_regex(r"\A[0-9a-z]{1,3}\Z"), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(_VERSION, _VERSION)
def test_semver_precedence_agrees_with_the_semver_package(a: str, b: str) -> None:
    """The protocol orders versions itself (no dependency); the publisher uses `semver`."""
    assert compare_semver(a, b) == semver.Version.parse(a).compare(semver.Version.parse(b))
