"""The Android and iOS guides: their sketches say what the protocol says.

The guides are code an app team copies, so these checks read the code
blocks: every reason code is produced, every field an app reads is read,
the update boundary lets nothing escape, and nothing is hard-coded that the
I/O contract now carries. They are text checks (no Kotlin or Swift compiler
here), each one able to fail on a real mistake the guides once had.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

from edgereg.protocol.contract import (
    BlobRef,
    InputTensor,
    IOContract,
    StateLink,
    TaskInfo,
    TensorSpec,
)
from edgereg.protocol.fields import Requirements, RuntimeHints
from edgereg.protocol.probe import GoldenProbe, ProbeCase, ProbeStep, ProbeTensor, ProbeTolerance
from edgereg.protocol.reasons import REASONS
from edgereg.protocol.reports import LatencySummary, Report
from edgereg.protocol.wire import BundleEntry, Manifest, ManifestEntry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
GUIDES = REPO_ROOT / "docs" / "guides"


@dataclass(frozen=True)
class Guide:
    """One guide: its file, the language of its sketches, and the languages it may show."""

    name: str
    language: str
    languages: frozenset[str]
    os: str

    @property
    def text(self) -> str:
        return (GUIDES / f"{self.name}.md").read_text(encoding="utf-8")

    def blocks(self, language: str | None = None) -> list[str]:
        """The fenced code blocks of ``language`` (default: the guide's own)."""
        wanted = language or self.language
        return [code for tag, code in _fences(self.text) if tag == wanted]

    @property
    def code(self) -> str:
        return "\n".join(self.blocks())


ANDROID = Guide("android", "kotlin", frozenset({"kotlin"}), "android")
IOS = Guide("ios", "swift", frozenset({"swift", "objc"}), "ios")
BOTH = [pytest.param(ANDROID, id="android"), pytest.param(IOS, id="ios")]

CLIENT_CODES = ("probe-failed", "reverted", "no-space", "deferred", "transport", "cache")
"""Reason codes the client decides itself (beside the protocol's REASONS)."""


def _fences(text: str) -> list[tuple[str, str]]:
    """(language tag, code) of every fenced block; AssertionError on an unbalanced fence."""
    blocks: list[tuple[str, str]] = []
    tag: str | None = None
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("```"):
            if tag is not None:
                body.append(line)
            continue
        if tag is None:
            tag = line[3:].strip()
            assert tag, f"line {number}: a code block without a language tag"
            body = []
        else:
            assert line.strip() == "```", f"line {number}: a fence opens inside a block"
            blocks.append((tag, "\n".join(body)))
            tag = None
    assert tag is None, "the last code block is never closed"
    return blocks


def _strip_literals(code: str) -> str:
    """Code without comments and string literals (a `!` or `require(` there means nothing)."""
    code = re.sub(r'"""(?:.|\n)*?"""', '""', code)
    code = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', code)
    return re.sub(r"//[^\n]*", "", code)


def _body(code: str, signature: str) -> str:
    """The first function declared with ``signature``: from after its parameters to its end.

    An expression body (``fun update() = try { ... } catch ...``) is included
    with its catches, up to the end of the line that closes the last brace.
    """
    start = code.index(signature)
    after_params = code.index(")", start) + 1
    depth = 0
    for index in range(code.index("{", after_params), len(code)):
        depth += {"{": 1, "}": -1}.get(code[index], 0)
        if depth == 0:
            end = index + 1
            # An expression body goes on with `catch (...) { ... }` blocks.
            while (match := re.match(r"\s*catch\s*\([^)]*\)\s*\{", code[end:])) is not None:
                end = _close(code, end + match.end() - 1) + 1
            return code[after_params:end]
    raise AssertionError(f"{signature}: unbalanced braces")


def _close(code: str, open_at: int) -> int:
    """The index of the brace that closes the one at ``open_at``."""
    depth = 0
    for index in range(open_at, len(code)):
        depth += {"{": 1, "}": -1}.get(code[index], 0)
        if depth == 0:
            return index
    raise AssertionError("unbalanced braces")


def _spans(body: str, opener: str) -> list[tuple[int, int]]:
    """(start, end) of every block opened by ``opener`` (like ``try {``) in ``body``."""
    return [
        (match.end() - 1, _close(body, match.end() - 1))
        for match in re.finditer(re.escape(opener), body)
    ]


def _field_names(*models: type[BaseModel]) -> set[str]:
    return {name for model in models for name in model.model_fields}


# --- structure ------------------------------------------------------------------------


@pytest.mark.parametrize("guide", BOTH)
def test_code_blocks_are_balanced_and_tagged_with_the_guides_languages(guide: Guide) -> None:
    tags = [tag for tag, _ in _fences(guide.text)]
    assert set(tags) <= guide.languages, f"{guide.name}: blocks tagged {sorted(set(tags))}"
    assert tags.count(guide.language) >= 8, f"{guide.name}: the sketch is mostly {guide.language}"


# --- what the sketches produce and read --------------------------------------------------


@pytest.mark.parametrize("guide", BOTH)
def test_every_reason_code_is_produced_by_the_sketch_and_listed(guide: Guide) -> None:
    table = guide.text[guide.text.index("## One result") :]
    table = table[: table.index("\n## ")]
    for code in [cls.reason for cls in REASONS] + list(CLIENT_CODES):
        assert f'"{code}"' in guide.code, f"{guide.name}: no sketch path reports {code!r}"
        assert f"`{code}`" in table, f"{guide.name}: {code!r} missing from the reason table"


@pytest.mark.parametrize("guide", BOTH)
@pytest.mark.parametrize(
    ("what", "models"),
    [
        ("the I/O contract", (IOContract, InputTensor, TensorSpec, StateLink, TaskInfo, BlobRef)),
        ("a manifest", (Manifest, ManifestEntry, BundleEntry, RuntimeHints)),
        ("the golden probe", (GoldenProbe, ProbeCase, ProbeStep, ProbeTensor, ProbeTolerance)),
        ("a report", (Report, LatencySummary)),
    ],
)
def test_the_sketch_reads_or_writes_every_field_an_app_needs(
    guide: Guide, what: str, models: tuple[type[BaseModel], ...]
) -> None:
    fields = _field_names(*models)
    # The probe's model/variant/state repeat what the verified entry says already.
    fields -= {"model", "variant", "state"} if what == "the golden probe" else set()
    fields -= {"schema_version"} if what == "the golden probe" else set()
    if guide is ANDROID:  # org.json reads keys by their quoted name
        missing = {name for name in fields if f'"{name}"' not in guide.code}
    else:  # Codable properties carry the wire's names
        missing = {name for name in fields if not re.search(rf"\b{name}\b", guide.code)}
    assert not missing, f"{guide.name}: {what} fields the sketch never touches: {sorted(missing)}"


@pytest.mark.parametrize("guide", BOTH)
def test_the_fit_rule_reads_the_app_range_and_its_own_os_range_in_order(guide: Guide) -> None:
    assert set(Requirements.model_fields) == {"app", "android", "ios"}
    signature = "fun unfit(" if guide is ANDROID else "func unfit("
    body = _body(guide.code, signature)
    assert re.search(r"\.app\b", body), f"{guide.name}: unfit() never checks requires.app"
    assert re.search(rf"\.{guide.os}\b", body), (
        f"{guide.name}: unfit() never checks requires.{guide.os}"
    )
    order = [body.find(f'"{code}"') for code in ("app-incompatible", "os-incompatible")]
    assert -1 not in order, f"{guide.name}: unfit() does not report both codes"
    assert order == sorted(order), f"{guide.name}: the app range is checked before the OS range"
    assert '"runtime-too-old"' in body, f"{guide.name}: unfit() skips the MNN runtime"


@pytest.mark.parametrize("guide", BOTH)
def test_no_input_shape_is_hard_coded(guide: Guide) -> None:
    # The old Android example reshaped to 1x1x28x28 for a model whose input is [1, 3, 32, 32].
    for pattern in (r"\b28\s*[x×,*]\s*28\b", r"\b1\s*,\s*[13]\s*,\s*(?:28|32)\s*,\s*(?:28|32)\b"):
        found = re.search(pattern, guide.text)
        assert found is None, f"{guide.name}: a hard-coded shape {found.group(0)!r}"


@pytest.mark.parametrize("guide", BOTH)
def test_example_inputs_and_members_exist_in_models_toml(guide: Guide) -> None:
    config = tomllib.loads((REPO_ROOT / "models.toml").read_text(encoding="utf-8"))
    models = config["models"]
    inputs = {spec["name"] for model in models.values() for spec in model.get("inputs", [])}
    named = set(re.findall(r'\binput\("([a-z_]+)"\)', guide.code))
    assert named, f"{guide.name}: the examples name no inputs"
    assert named <= inputs, f"{guide.name}: inputs no example model has: {sorted(named - inputs)}"
    members = set(re.findall(r'members(?:\.getValue\(|\[)"([a-z_]+)"', guide.code))
    assert members, f"{guide.name}: the examples open no member by name"
    assert members <= set(models), f"{guide.name}: no such model: {sorted(members - set(models))}"


# --- the update boundary ----------------------------------------------------------------


def test_android_update_lets_no_require_or_bang_bang_escape() -> None:
    body = _strip_literals(_body(ANDROID.code, "fun update("))
    guarded = _spans(body, "try {")
    assert guarded, "update() has no try"
    for risky in ("require(", "requireNotNull(", "checkNotNull(", "!!", "error("):
        for match in re.finditer(re.escape(risky), body):
            inside = any(start < match.start() < end for start, end in guarded)
            assert inside, f"update(): {risky} outside a try"
    catches = re.findall(r"catch \(\w+: (\w+)\)", body)
    assert {"Rejected", "IOException"} <= set(catches), catches
    assert "Exception" in catches, (
        "update() must catch every Exception: JSON errors escaped it once"
    )


def test_android_sketch_has_no_bang_bang() -> None:
    assert "!!" not in _strip_literals(ANDROID.code)


def test_ios_update_catches_everything_and_has_no_trap() -> None:
    body = _strip_literals(_body(IOS.code, "func update("))
    assert re.search(r"\bdo \{", body), "update() has no do/catch"
    assert re.search(r"\bcatch \{", body), "update() must end with a catch-all"


def test_ios_sketch_has_no_force_unwrap_force_try_or_force_cast() -> None:
    code = _strip_literals(IOS.code)
    for pattern, what in (
        (r"\btry!", "try!"),
        (r"\bas!", "as!"),
        (r"(?<=[\w)\]}])!(?![=])", "a force unwrap"),
    ):
        found = re.search(pattern, code)
        assert found is None, f"ios: {what} near {code[max(0, found.start() - 40) : found.end()]!r}"


# --- the platform mechanisms the brief of each guide names --------------------------------


@pytest.mark.parametrize(
    ("guide", "api"),
    [
        (ANDROID, "AtomicFile"),
        (ANDROID, "StatFs"),
        (ANDROID, "NetworkType.UNMETERED"),
        (ANDROID, "setRequiresCharging"),
        (ANDROID, "versionName"),
        (ANDROID, "Build.VERSION.SDK_INT"),
        (ANDROID, "setInputIntData"),
        (ANDROID, "assets.open"),
        (IOS, "replaceItemAt"),
        (IOS, "options: .atomic"),
        (IOS, "volumeAvailableCapacityForImportantUsage"),
        (IOS, "allowsExpensiveNetworkAccess"),
        (IOS, "isDiscretionary"),
        (IOS, "requiresExternalPower"),
        (IOS, "CFBundleShortVersionString"),
        (IOS, "systemVersion"),
        (IOS, "getSessionInfo"),
        (IOS, "Bundle.main.url"),
    ],
    ids=lambda value: value.name if isinstance(value, Guide) else value,
)
def test_the_guide_uses_the_platform_mechanism(guide: Guide, api: str) -> None:
    assert api in guide.text, f"{guide.name}: {api} is not shown"
