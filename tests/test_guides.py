"""The Android and iOS guides, checked against the libraries they document.

The guides teach an app team to use ``clients/android`` (edgereg-android, Java)
and ``clients/swift`` (the EdgeReg Swift package); there is no Kotlin compiler
and no Android or Apple SDK on this machine, so most checks read the guides'
code blocks and the libraries' sources as text:

- every name the code calls or reads on the library exists in the library's
  public sources (and a Swift call's argument labels exist on that function);
- the model-runner adapter implements the library's interface with its exact
  parameters;
- every reason code of the protocol (and every code the library reports) has
  a row saying what the app does;
- the install step names the artefact the build really makes;
- no force unwraps or ``!!`` in the code an app copies;
- the copy-me protocol sketches the guides once were are gone;
- the iOS MNN runner the guide shows is the text of the example the package builds;
- where a compiler is here: the Java start compiles against the library's
  sources (javac), and the Swift blocks against the package (swift build,
  Swift 6, stand-ins only for the MNN wrapper; marked slow, about 90 s).

A guide that names a method the library lacks fails here; so does each of
the old sketch guides (they fail the sketch, section and table checks).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgereg.protocol.reasons import CLIENT_REASONS, REASONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
GUIDES = REPO_ROOT / "docs" / "guides"
JAVA_SRC = REPO_ROOT / "clients" / "android" / "src" / "main" / "java" / "dev" / "edgereg"
SWIFT_PKG = REPO_ROOT / "clients" / "swift"
SWIFT_SRC = SWIFT_PKG / "Sources" / "EdgeReg"

FORCE_MARKER = "force-unwrap:"
"""A Swift line carrying this comment may force-unwrap (it must say why)."""


# --- the libraries' public API, read from their sources ------------------------------


@dataclass(frozen=True)
class Api:
    """What a library exposes: its type names, member names, and Swift call labels."""

    types: frozenset[str]
    members: frozenset[str]
    labels: dict[str, frozenset[str]]
    """Callable name (a function, or a type for its inits) -> every argument label it takes."""
    reasons: frozenset[str]


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*(?:.|\n)*?\*/", " ", source)
    return re.sub(r"//[^\n]*", "", source)


def _braced(source: str, open_at: int) -> str:
    """The text from the brace at ``open_at`` to its closing brace."""
    depth = 0
    for index in range(open_at, len(source)):
        depth += {"{": 1, "}": -1}.get(source[index], 0)
        if depth == 0:
            return source[open_at : index + 1]
    raise AssertionError("unbalanced braces")


JAVA_MODIFIERS = r"(?:(?:static|final|abstract|synchronized)\s+)*"


def _java_api() -> Api:
    types: set[str] = set()
    members: set[str] = set()
    for path in sorted(JAVA_SRC.glob("*.java")):  # dev.edgereg only: internal is not API
        source = _strip_comments(path.read_text(encoding="utf-8"))
        source = re.sub(r"@\w+(?:\.\w+)*", " ", source)  # annotations
        declared = r"(?:class|interface|enum)\s+(\w+)"
        types.update(re.findall(rf"\bpublic\s+(?:(?:static|final|abstract)\s+)*{declared}", source))
        # Members with `public`: methods, constructors, fields.
        members.update(
            re.findall(
                rf"\bpublic\s+{JAVA_MODIFIERS}[\w<>\[\],.? ]*?(\w+)\s*[(;=]",
                source,
            )
        )
        # Interface bodies: every member is public without saying so.
        for match in re.finditer(rf"\bpublic\s+{declared}[^{{]*\{{", source):
            body = _braced(source, match.end() - 1)
            types.update(re.findall(rf"\b{declared}", body))
            members.update(
                re.findall(r"[\w>\]]\s+(\w+)\s*\([^;{]*\)\s*(?:throws [\w., ]+)?;", body)
            )
    reasons = _java_reasons()
    return Api(frozenset(types), frozenset(members - types), {}, frozenset(reasons))


def _java_reasons() -> set[str]:
    source = (JAVA_SRC / "internal" / "Reasons.java").read_text(encoding="utf-8")
    return set(re.findall(r'static final String \w+ = "([a-z-]+)";', source))


def _labels(parameters: str) -> set[str]:
    """Argument labels of a Swift parameter list (``_`` for an unlabeled one)."""
    labels: set[str] = set()
    depth = 0
    start = 0
    parts: list[str] = []
    for index, char in enumerate(parameters):
        depth += {"(": 1, "[": 1, "<": 1, ")": -1, "]": -1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(parameters[start:index])
            start = index + 1
    parts.append(parameters[start:])
    for part in parts:
        words = part.split(":")[0].split()
        if words:
            labels.add(words[0])
    return labels


def _swift_api() -> Api:
    types: set[str] = set()
    members: set[str] = set()
    labels: dict[str, set[str]] = {}
    for path in sorted(SWIFT_SRC.glob("*.swift")):
        source = _strip_comments(path.read_text(encoding="utf-8"))
        modifiers = r"(?:(?:static|final|nonisolated|mutating|override|indirect)\s+)*"
        kinds = r"(?:struct|class|enum|protocol|actor|typealias)"
        types.update(re.findall(rf"\bpublic\s+{modifiers}{kinds}\s+(\w+)", source))
        members.update(re.findall(rf"\bpublic\s+{modifiers}(?:func|var|let)\s+(\w+)", source))
        # Enum cases (`case model(String)`), never `case .x` or `case "x"` of a switch.
        members.update(re.findall(r"^\s*case\s+(?!let\b|var\b)([a-z]\w*)\b", source, flags=re.M))
        for match in re.finditer(rf"\bpublic\s+{modifiers}func\s+(\w+)\s*(?:<[^>]*>)?\(", source):
            parameters = _balanced_parens(source, match.end() - 1)
            labels.setdefault(match.group(1), set()).update(_labels(parameters))
        # Protocol requirements are public without saying so.
        for match in re.finditer(r"\bpublic\s+protocol\s+\w+[^{]*\{", source):
            body = _braced(source, match.end() - 1)
            members.update(re.findall(r"\b(?:func|var)\s+(\w+)", body))
        # A public init belongs to the type declared around it.
        for match in re.finditer(rf"\bpublic\s+{kinds}\s+(\w+)[^{{]*\{{", source):
            body = _braced(source, match.end() - 1)
            own = labels.setdefault(match.group(1), set())
            for init in re.finditer(r"\bpublic\s+init[?!]?\s*\(", body):
                found = _labels(_balanced_parens(body, init.end() - 1))
                # A nested type's init is the nested type's: count it only at the right depth.
                if _depth_at(body, init.start()) == 1:
                    own.update(found)
    reason_enum = (SWIFT_SRC / "Decision.swift").read_text(encoding="utf-8")
    body = _braced(reason_enum, reason_enum.index("{", reason_enum.index("public enum Reason")))
    reasons = set(re.findall(r'public static let \w+ = "([a-z-]+)"', body))
    frozen = {name: frozenset(found) for name, found in labels.items()}
    return Api(frozenset(types), frozenset(members - {"init"}), frozen, frozenset(reasons))


def _balanced_parens(source: str, open_at: int) -> str:
    """The text inside the parenthesis at ``open_at``."""
    depth = 0
    for index in range(open_at, len(source)):
        depth += {"(": 1, ")": -1}.get(source[index], 0)
        if depth == 0:
            return source[open_at + 1 : index]
    raise AssertionError("unbalanced parentheses")


def _depth_at(body: str, index: int) -> int:
    return body[:index].count("{") - body[:index].count("}")


# --- the guides ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Guide:
    """One guide: its file, the languages of its app code, the tags it may use."""

    name: str
    code_languages: frozenset[str]
    tags: frozenset[str]

    @property
    def text(self) -> str:
        return (GUIDES / f"{self.name}.md").read_text(encoding="utf-8")

    def blocks(self, languages: Iterable[str] | None = None) -> list[str]:
        wanted = set(languages or self.code_languages)
        return [code for tag, code in _fences(self.text) if tag in wanted]

    @property
    def code(self) -> str:
        return "\n".join(self.blocks())

    def section(self, heading: str) -> str:
        """From the ``## `` heading that starts with ``heading`` to the next one."""
        match = re.search(rf"^## {re.escape(heading)}.*$", self.text, flags=re.M)
        assert match is not None, f"{self.name}: no section '## {heading}...'"
        rest = self.text[match.end() :]
        end = re.search(r"^## ", rest, flags=re.M)
        return rest[: end.start()] if end else rest


ANDROID = Guide(
    "android", frozenset({"java", "kotlin"}), frozenset({"java", "kotlin", "sh", "cpp"})
)
IOS = Guide("ios", frozenset({"swift"}), frozenset({"swift", "objc", "sh"}))
BOTH = [pytest.param(ANDROID, id="android"), pytest.param(IOS, id="ios")]


def _api(guide: Guide) -> Api:
    return _java_api() if guide is ANDROID else _swift_api()


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


def _words(text: str) -> list[str]:
    return text.split()


def _strip_literals(code: str) -> str:
    """Code without comments and string literals (a `!` or a name there means nothing)."""
    code = re.sub(r'"""(?:.|\n)*?"""', '""', code)
    code = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', code)
    return _strip_comments(code)


# Names the guides' code takes from the platform (Android, Kotlin, WorkManager, MNN's Java
# API; Foundation, BackgroundTasks, the MNN wrapper the iOS guide defines) or declares itself.
# A name here is not checked against the library: keep it to what really is not edgereg's.
PLATFORM: dict[str, frozenset[str]] = {
    "android": frozenset(
        _words(
            """
        absolutePath apply associateWith availableProcessors enqueueUniquePeriodicWork
        getInput getInstance getIntExtra getOutput getSystemService isActiveNetworkMetered
        let map readBytes registerReceiver release reshape retry setConstraints
        setInputFloatData setInputIntData setRequiredNetworkType setRequiresCharging success
        toInt toIntArray type createFromFile createSession getFilesDir dimensions floatData
        HARDWARE SOC_MODEL SDK_INT VERSION VERSION_NAME ACTION_BATTERY_CHANGED EXTRA_PLUGGED
        FORWARD_CPU FORWARD_OPENCL FORWARD_VULKAN FORWARD_OPENGL UNMETERED HOURS KEEP IO
        Config valueOf edgereg getRuntime java startsWith asExecutor await i isCharging
        isDeviceIdleMode progress
        associate forward getValue keys outputShape toList withIndex
        """
        )
    ),
    "ios": frozenset(
        _words(
            """
        applicationSupportDirectory userDomainMask urls appendingPathComponent processInfo
        operatingSystemVersion physicalMemory processorCount mapValues map append
        littleEndian register shared submit setTaskCompleted expirationHandler cancel
        requiresNetworkConnectivity requiresExternalPower earliestBeginDate url flatMap
        default main net outputShape package product target batteryState full
        isBatteryMonitoringEnabled isConstrained isExpensive resourceValues value
        volumeAvailableCapacityForOpportunisticUsage volumeAvailableCapacityForOpportunisticUsageKey
        module lock unlock open isUnavailable mnn reduce key
        """
        )
    ),
}
PLATFORM_TYPES: dict[str, frozenset[str]] = {
    "android": frozenset(
        _words(
            """
        Build BuildConfig Runtime File List IOException IllegalStateException IntArray Int
        String Map MNNForwardType MNNNetInstance Context WorkerParameters Worker Result
        ConnectivityManager IntentFilter Intent BatteryManager PeriodicWorkRequestBuilder
        TimeUnit Constraints NetworkType WorkManager ExistingPeriodicWorkPolicy Dispatchers
        App MnnRunner ModelUpdateWorker Log PowerManager
        MnnModule MnnModuleRunner Set
        """
        )
    ),
    "ios": frozenset(
        _words(
            """
        URL String FileManager ProcessInfo Int64 Int32 Int Data Date NSNumber Dictionary
        MNNModel MNNModelError MNNRunner MNNSession BGTaskScheduler BGProcessingTaskRequest
        MNNNet NSLock AnyObject Bool Error
        Bundle Sendable CancellationError NSHomeDirectory NWPath UIDevice
        MNNModule MNNModuleRunner MNNModuleSession Set
        """
        )
    ),
}


def unknown_names(guide: Guide, code: str) -> list[str]:
    """Names ``code`` uses that are neither the library's nor the platform's."""
    api = _api(guide)
    platform, platform_types = PLATFORM[guide.name], PLATFORM_TYPES[guide.name]
    found: list[str] = []
    lines = []
    for line in code.splitlines():
        imported = re.match(r"\s*import\s+([\w.]+)", line)
        if imported is None:
            lines.append(line)
        elif imported.group(1).startswith("dev.edgereg."):
            name = imported.group(1).rsplit(".", 1)[1]
            if name not in api.types:
                found.append(f"import {imported.group(1)}")
    stripped = _strip_literals("\n".join(lines))
    for name in re.findall(r"\.\s*([A-Za-z_]\w*)", stripped):
        if name not in api.members | api.types | platform:
            found.append(f".{name}")
    for name in re.findall(r"(?<![.\w])([A-Z]\w*)", stripped):
        if name not in api.types | platform_types and not name.isupper():
            found.append(name)
    return sorted(set(found))


def wrong_labels(code: str) -> list[str]:
    """Swift calls of the package whose argument labels it does not declare."""
    labels = _swift_api().labels
    stripped = _strip_literals(code)
    wrong: list[str] = []
    for match in re.finditer(r"(?<![\w])\.?(\w+)\s*\(", stripped):
        name = match.group(1)
        if name not in labels or re.match(
            r"\s*(?:func|init)\b", stripped[max(0, match.start() - 5) : match.start()]
        ):
            continue
        if re.search(r"\bfunc\s+$", stripped[: match.start()]):
            continue  # the adapter's own declaration, checked against the protocol below
        arguments = _balanced_parens(stripped, match.end() - 1)
        used = {label for label in _call_labels(arguments)}
        extra = used - labels[name]
        if extra:
            wrong.append(f"{name}({', '.join(sorted(extra))}:)")
    return wrong


def _call_labels(arguments: str) -> set[str]:
    labels: set[str] = set()
    depth = 0
    start = 0
    parts: list[str] = []
    for index, char in enumerate(arguments):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(arguments[start:index])
            start = index + 1
    parts.append(arguments[start:])
    for part in parts:
        if not part.strip():
            continue
        labeled = re.match(r"\s*(\w+)\s*:(?!:)", part)
        labels.add(labeled.group(1) if labeled else "_")
    return labels


# --- the API the code names exists ------------------------------------------------------------


def test_the_sources_parse_to_the_api_the_guides_rely_on() -> None:
    java, swift = _java_api(), _swift_api()
    assert {"EdgeregClient", "ModelRunner", "Session", "BackendUnavailableException"} <= java.types
    assert {
        "builder",
        "update",
        "appStarted",
        "confirm",
        "load",
        "inputShape",
        "errorCode",
    } <= java.members
    assert {
        "EdgeRegClient",
        "ModelRunner",
        "ModelSession",
        "BackendUnavailable",
        "Tensor",
    } <= swift.types
    assert {
        "update",
        "appStarted",
        "confirm",
        "load",
        "inputShapes",
        "model",
        "bundle",
    } <= swift.members
    assert swift.labels["ClientConfiguration"] >= {
        "registry",
        "trustedKeys",
        "cacheDirectory",
        "device",
    }
    assert "version" in swift.labels["confirm"]


@pytest.mark.parametrize("guide", BOTH)
def test_every_name_the_code_uses_exists_in_the_library_or_the_platform(guide: Guide) -> None:
    unknown = unknown_names(guide, guide.code)
    assert not unknown, f"{guide.name}: names neither the library nor the platform has: {unknown}"


@pytest.mark.parametrize(
    ("guide", "invented"),
    [
        (ANDROID, 'val r = client.updateEverything("digits")'),
        (ANDROID, 'val r = EdgeregUpdater.create("digits")'),
        (ANDROID, "import dev.edgereg.ModelLoader"),
        (IOS, 'let r = await client.refresh(.model("digits"))'),
        (IOS, "let c = EdgeRegUpdater()"),
    ],
    ids=["android-method", "android-type", "android-import", "ios-method", "ios-type"],
)
def test_a_name_the_library_lacks_is_caught(guide: Guide, invented: str) -> None:
    assert unknown_names(guide, guide.code + "\n" + invented), f"not caught: {invented}"


def test_swift_calls_use_the_labels_the_package_declares() -> None:
    wrong = wrong_labels(IOS.code)
    assert not wrong, f"ios: calls with labels the package does not declare: {wrong}"
    invented = 'await client.confirm(.model("digits"), release: v)'
    assert wrong_labels(invented) == ["confirm(release:)"]
    assert wrong_labels("ClientConfiguration(registryURL: u, trustedKeys: k)") == [
        "ClientConfiguration(registryURL:)"
    ]


# Android's classes are not on this machine: the least of them the Java start names, so
# javac checks the start against the library's real sources (the library is not stood in for)
# and the guide's MNN runner, clients/android/examples/mnn (MNN's wrapper is a compile-only stub).
ANDROID_STAND_INS = """
import com.example.models.MnnRunner;
import dev.edgereg.*;
import java.io.File;
import java.util.List;

final class Build {
    static final String HARDWARE = "stand-in";
    static final class VERSION { static final int SDK_INT = 24; }
}
final class BuildConfig { static final String VERSION_NAME = "1.0.0"; }
final class Context { File getFilesDir() { return new File("."); } }
public final class GuideStart {
    static byte[] readAsset(String name) { return new byte[0]; }
    static void start(Context ctx, String installId, long ramMb) {
%s
    }
}
"""


def test_the_java_start_compiles_against_the_library(tmp_path: Path) -> None:
    javac = shutil.which("javac")
    assert javac is not None, "no javac: `make system-deps` installs the JDK the SDK builds with"
    jsr305 = Path("/usr/share/java/jsr305.jar")
    assert jsr305.is_file(), "no jsr305.jar: `make system-deps` (libjsr305-java)"
    blocks = [code for tag, code in _fences(ANDROID.section("Ten-line start")) if tag == "java"]
    assert len(blocks) == 1, "android: the start has one Java block"
    (tmp_path / "GuideStart.java").write_text(ANDROID_STAND_INS % blocks[0], encoding="utf-8")
    examples = REPO_ROOT / "clients" / "android" / "examples" / "mnn"
    sources = [
        str(path)
        for root in (JAVA_SRC, examples / "java", examples / "stub")
        for path in sorted(root.rglob("*.java"))
    ]
    run = subprocess.run(
        [
            javac,
            *("--release", "8", "-nowarn", "-cp", str(jsr305), "-d", str(tmp_path / "classes")),
            *sources,
            str(tmp_path / "GuideStart.java"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, f"the guide's Java start does not compile:\n{run.stderr[-3000:]}"
    assert (tmp_path / "classes" / "GuideStart.class").is_file()


# The Objective-C++ wrapper of the iOS guide as Swift imports it: MNN and the Apple SDK are
# not on this machine. The package itself is real, built from clients/swift.
IOS_STAND_INS = """
import EdgeReg
import Foundation

enum MNNModelError: Error { case unavailable, loadFailed, badInput }
final class MNNModel {  // as Swift imports MNNModel.h (an ObjC class: not Sendable)
    init(path: String, backend: String, threads: Int32, precision: String) throws {
        if backend != "cpu" { throw MNNModelError.unavailable }
    }
    func run(_ inputs: [String: Data], shapes: [String: [NSNumber]], outputs: [String]) throws
        -> [String: Data] { [:] }
    func outputShape(_ name: String) -> [NSNumber] { [] }
    var inputShapes: [String: [NSNumber]] { [:] }
}
final class MNNModule {
    init(path: String, threads: Int32) throws {}
    func run(_ inputs: [String: Data], shapes: [String: [NSNumber]], outputs: [String]) throws
        -> [String: Data] { [:] }
    func outputShape(_ name: String) -> [NSNumber] { [] }
    var inputShapes: [String: [NSNumber]] { [:] }
}
func openPipeline(_ detector: InstalledModel, _ recognizer: InstalledModel) throws {}
"""


@pytest.mark.slow
def test_the_swift_code_compiles_against_the_package(tmp_path: Path) -> None:
    """Every Swift block but the Package.swift fragment and the Apple-only ones.

    Those importing BackgroundTasks, Network or UIKit (not on Linux) are left out.

    Swift 6 language mode, so the adapter's Sendable conformances are checked
    too. About 90 s on two shared cores: it builds the package from clean.
    """
    swift = shutil.which("swift")
    assert swift is not None, "no swift toolchain on PATH (the Swift SDK's tests need it too)"
    parts = [IOS_STAND_INS]
    for number, code in enumerate(IOS.blocks()):
        apple_only = ("import BackgroundTasks", "import Network", "import UIKit")
        if code.lstrip().startswith("dependencies:") or any(m in code for m in apple_only):
            continue
        body = "\n".join(line for line in code.splitlines() if not line.startswith("import "))
        if re.match(
            r"(?:\s*//[^\n]*\n)*\s*(?:func|struct|final class|class|enum|protocol|extension)\b",
            body,
        ):
            parts.append(body)
        else:  # statements: inside a function that has what they use
            parts.append(
                f"func block{number}(client: EdgeRegClient, elapsedMs: Double, ms: Double,"
                " installID: String, registryPEM: String, appVersion: String,"
                " userKeptTheText: Bool)"
                f" async throws {{\n{body}\n}}"
            )
    sources = tmp_path / "Sources" / "GuideCheck"
    sources.mkdir(parents=True)
    (sources / "main.swift").write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    (tmp_path / "Package.swift").write_text(
        "// swift-tools-version:6.0\nimport PackageDescription\n"
        'let package = Package(name: "GuideCheck",\n'
        f'    dependencies: [.package(path: "{SWIFT_PKG}")],\n'
        '    targets: [.executableTarget(name: "GuideCheck",'
        ' dependencies: [.product(name: "EdgeReg", package: "swift")])],\n'
        "    swiftLanguageModes: [.v6])\n",
        encoding="utf-8",
    )
    run = subprocess.run(
        [swift, "build", "--package-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert run.returncode == 0, "the guide's Swift does not compile:\n" + "\n".join(
        errors or run.stdout.splitlines()[-30:] + run.stderr.splitlines()[-30:]
    )


def _code_of(text: str) -> str:
    """Code without its leading comment lines (what a file says about itself) and imports."""
    lines = text.strip().splitlines()
    while lines and lines[0].startswith("//"):
        lines.pop(0)
    return "\n".join(line for line in lines if not line.startswith("import ")).strip()


@pytest.mark.parametrize("name", ["MNNModel.h", "MNNRunner.swift", "MNNModel+MNNNet.swift"])
def test_the_ios_runner_shown_is_the_example_swift_build_compiles(name: str) -> None:
    # The guide shows the header and the Swift, and links to the Objective-C++ implementation:
    # each is the text of clients/swift/Examples/MNNRunner, so what `swift build` type-checks
    # (the MNNRunnerExample target) is what an app copies.
    example = _code_of((SWIFT_PKG / "Examples" / "MNNRunner" / name).read_text(encoding="utf-8"))
    shown = {_code_of(code) for code in IOS.blocks(["objc", "swift"])}
    assert example in shown, f"ios: the guide's copy of Examples/MNNRunner/{name} differs"
    # Repository files are outside the docs site (mkdocs --strict refuses links there):
    # the guide names them as paths, and each must exist.
    for path in re.findall(r"`(clients/[^`\s]+)`", IOS.text):
        assert (REPO_ROOT / path).exists(), f"ios: {path} does not exist"
    assert "`clients/swift/Examples/MNNRunner/MNNModel.mm`" in IOS.text


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_android_runner_implements_model_runner_with_its_parameters() -> None:
    source = _strip_comments((JAVA_SRC / "ModelRunner.java").read_text(encoding="utf-8"))
    source = re.sub(r"@\w+", "", source)
    kotlin = _strip_literals("\n".join(ANDROID.blocks(["kotlin"])))
    java_types = {"int": "Int", "boolean": "Boolean", "long": "Long", "int[]": "IntArray"}
    for method in ("load", "run", "inputShape"):
        declared = re.search(rf"\b{method}\s*\(([^)]*)\)", source)
        assert declared is not None, method
        params = [p.strip().rsplit(None, 1) for p in _split_top(declared.group(1))]
        expected = [
            (name, java_types.get(kind, re.sub(r"<.*", "", kind).split(".")[-1]))
            for kind, name in params
        ]
        adapter = re.search(rf"override fun {method}\(([^)]*)\)", kotlin)
        assert adapter is not None, f"android: the runner does not override {method}"
        got = [
            (name.strip(), re.sub(r"<.*", "", kind.strip()))
            for name, kind in (p.split(":", 1) for p in _split_top(adapter.group(1)))
        ]
        assert got == expected, f"android: {method}{got} does not match ModelRunner's {expected}"
    assert "BackendUnavailableException" in kotlin
    assert re.search(r"override fun close\(\)", kotlin), "android: the session does not close"


def _split_top(parameters: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(parameters):
        depth += {"<": 1, ">": -1, "(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(parameters[start:index])
            start = index + 1
    parts.append(parameters[start:])
    return [part for part in parts if part.strip()]


def test_the_ios_runner_implements_the_protocols_exactly() -> None:
    source = _strip_comments((SWIFT_SRC / "API.swift").read_text(encoding="utf-8"))
    swift = _strip_literals(IOS.code)
    requirements = []
    for protocol in ("ModelRunner", "ModelSession"):
        start = source.index("{", source.index(f"public protocol {protocol}"))
        body = _braced(source, start)
        requirements += re.findall(
            r"\b((?:func|var)\s[^{\n]*?)\s*(?:\{[^}]*\})?\s*$", body, flags=re.M
        )
    # load, mnnAPIs (fit rule (f); the Module-API runner declares it), run, close, inputShapes.
    assert len(requirements) == 5, requirements
    for requirement in requirements:
        signature = _one_line(requirement)
        if signature.startswith("var "):
            signature = signature.split("{")[0].strip()
        assert signature in _one_line(swift), f"ios: the adapter lacks `{signature}`"
    assert "throw BackendUnavailable(" in swift


# --- reason codes --------------------------------------------------------------------------


def _reason_rows(guide: Guide) -> dict[str, str]:
    table = guide.section("Reason codes")
    rows: dict[str, str] = {}
    for line in table.splitlines():
        match = re.match(r"^\| `([a-z-]+)` \|(.*)\|\s*$", line)
        if match:
            cells = [cell.strip() for cell in match.group(2).split("|")]
            assert match.group(1) not in rows, f"{guide.name}: two rows for {match.group(1)}"
            rows[match.group(1)] = cells[-1]
    return rows


PROTOCOL_CODES = {cls.reason for cls in REASONS} | {reason.code for reason in CLIENT_REASONS}


@pytest.mark.parametrize("guide", BOTH)
def test_every_reason_code_has_a_row_saying_what_the_app_does(guide: Guide) -> None:
    rows = _reason_rows(guide)
    missing = PROTOCOL_CODES - set(rows)
    assert not missing, f"{guide.name}: no row for {sorted(missing)}"
    for code, does in rows.items():
        assert len(does.split()) >= 4, f"{guide.name}: {code!r} does not say what the app does"


@pytest.mark.parametrize("guide", BOTH)
def test_the_table_lists_exactly_the_codes_the_library_reports(guide: Guide) -> None:
    library = _api(guide).reasons
    assert library >= PROTOCOL_CODES, f"the library lacks {sorted(PROTOCOL_CODES - library)}"
    rows = set(_reason_rows(guide))
    assert rows == library, (
        f"{guide.name}: rows without a library code {sorted(rows - library)}, "
        f"library codes without a row {sorted(library - rows)}"
    )


# --- install: the real artefact ------------------------------------------------------------


def test_android_install_names_the_jar_make_sdk_builds() -> None:
    install = ANDROID.section("Add the library")
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^sdk:.*\n\t\$\(MAKE\) -C clients/android jar\b", makefile, flags=re.M)
    lib_make = (REPO_ROOT / "clients" / "android" / "Makefile").read_text(encoding="utf-8")
    version_match = re.search(r"^VERSION\s*:=\s*(\S+)", lib_make, flags=re.M)
    assert version_match is not None
    version = version_match.group(1)
    client = (JAVA_SRC / "EdgeregClient.java").read_text(encoding="utf-8")
    assert f'SDK_VERSION = "{version}"' in client
    assert "make sdk" in install
    assert "clients/android/build/edgereg-android-<version>.jar" in install
    named = set(re.findall(r"edgereg-android-(\d[\w.]*)\.jar", ANDROID.text))
    assert named == {version}, f"android: jar versions {named}, the build makes {version}"
    assert "--release 8" in lib_make
    assert "Java 8" in ANDROID.text
    assert "minSdk = 24" in install
    table = (REPO_ROOT / "clients/android/api/android-24.txt").read_text(encoding="utf-8")
    assert "API level 24" in table
    assert "24/public/api/android.txt" in table
    pom = (REPO_ROOT / "clients" / "android" / "pom.xml").read_text(encoding="utf-8")
    bc = re.search(
        r"<artifactId>(bcprov[\w-]*)</artifactId>\s*<version>([\d.]+)</version>\s*<optional>true",
        pom,
    )
    assert bc is not None, "the POM no longer has BouncyCastle as optional"
    assert f"org.bouncycastle:{bc.group(1)}:{bc.group(2)}" in install
    rules = "META-INF/proguard/edgereg-android.pro"
    assert rules in install
    assert (REPO_ROOT / "clients" / "android" / "src" / "main" / "resources" / rules).is_file()


def test_ios_install_names_the_package_its_product_and_platforms() -> None:
    install = IOS.section("Add the package")
    manifest = (SWIFT_PKG / "Package.swift").read_text(encoding="utf-8")
    product = re.search(r'\.library\(name: "(\w+)"', manifest)
    assert product is not None
    assert f'.product(name: "{product.group(1)}", package: "swift")' in install
    assert re.search(r'\.package\(path: "[^"]*clients/swift"\)', install)
    assert ".package(url:" in install
    platforms = re.search(r"platforms: \[([^\]]*)\]", manifest)
    assert platforms is not None
    assert f"platforms: [{platforms.group(1)}]" in install
    for os_name, version in re.findall(r"\.(iOS|macOS)\(\.v(\d+)\)", platforms.group(1)):
        assert f"{os_name} {version}" in install, f"ios: {os_name} {version} is not said"
    # The Apple-only code paths it names are where the package has them.
    crypto = (SWIFT_SRC / "Crypto.swift").read_text(encoding="utf-8")
    assert "canImport(CryptoKit)" in crypto
    assert "Crypto.swift" in install
    for name in ("Transport.swift", "Reporter.swift"):
        assert "FoundationNetworking" in (SWIFT_SRC / name).read_text(encoding="utf-8")
        assert name in install


# --- code an app copies ---------------------------------------------------------------------


def test_kotlin_and_java_have_no_bang_bang() -> None:
    assert "!!" not in _strip_literals(ANDROID.code)


def test_swift_has_no_force_unwrap_try_or_cast_outside_marked_lines() -> None:
    code = "\n".join(line for line in IOS.code.splitlines() if FORCE_MARKER not in line)
    code = _strip_literals(code)
    for pattern, what in (
        (r"\btry!", "try!"),
        (r"\bas!", "as!"),
        (r"(?<=[\w)\]}])!(?![=])", "a force unwrap"),
    ):
        found = re.search(pattern, code)
        assert found is None, f"ios: {what} near {code[max(0, found.start() - 40) : found.end()]!r}"


@pytest.mark.parametrize("guide", BOTH)
def test_code_blocks_are_balanced_and_tagged(guide: Guide) -> None:
    tags = {tag for tag, _ in _fences(guide.text)}
    assert tags <= guide.tags, f"{guide.name}: blocks tagged {sorted(tags - guide.tags)}"
    assert guide.code_languages <= tags


@pytest.mark.parametrize("guide", BOTH)
def test_the_protocol_sketch_is_gone(guide: Guide) -> None:
    # What only a hand-written client does: crypto, raw HTTP, parsing the wire, the rules.
    sketch = re.compile(
        r"Signature\.getInstance|Curve25519|MessageDigest|SHA256\.hash|DSSEv1|HttpURLConnection"
        r"|JSONObject|JSONDecoder|\b(?:fun|func)\s+(?:decide|unfit|verify|install)\b"
    )
    found = sketch.search(guide.code)
    assert found is None, f"{guide.name}: sketch code ({found.group(0)!r}) is back"
    assert len(guide.text.splitlines()) < 650, f"{guide.name}: a guide, not a client to copy"


@pytest.mark.parametrize("guide", BOTH)
@pytest.mark.parametrize(
    "heading",
    [
        "Add the",
        "Ten-line start",
        "The model runner over MNN",
        "Background work",
        "Storage and download conditions",
        "Bundles",
        "The self-test, confirm and revert",
        "Reports",
        "Offline first launch",
        "Reason codes",
        "Troubleshooting",
    ],
)
def test_the_guide_has_the_section(guide: Guide, heading: str) -> None:
    assert guide.section(heading).strip(), f"{guide.name}: '{heading}' is empty"


@pytest.mark.parametrize("guide", BOTH)
def test_the_start_is_short_and_the_runner_says_what_was_not_compiled(guide: Guide) -> None:
    start = guide.section("Ten-line start")
    blocks = [code for tag, code in _fences(start) if tag in guide.code_languages]
    assert blocks, f"{guide.name}: the start shows no code"
    for code in blocks:
        lines = [line for line in code.splitlines() if line.strip()]
        assert len(lines) <= 16, f"{guide.name}: a start of {len(lines)} lines"
    runner = guide.section("The model runner over MNN")
    assert "Not compiled here" in runner
    assert ("no Android SDK" if guide is ANDROID else "no Apple SDK") in runner
    assert "](../protocol.md)" in guide.text, f"{guide.name}: no link to the protocol"


@pytest.mark.parametrize(
    ("guide", "api"),
    [
        (ANDROID, "PeriodicWorkRequestBuilder"),
        (ANDROID, "NetworkType.UNMETERED"),
        (ANDROID, "setRequiresCharging"),
        (ANDROID, "isActiveNetworkMetered"),
        (ANDROID, "Build.VERSION.SDK_INT"),
        (ANDROID, "BuildConfig.VERSION_NAME"),
        (ANDROID, "setInputIntData"),
        (ANDROID, "getSessionInfo"),
        (ANDROID, "assets.open"),
        (IOS, "BGProcessingTaskRequest"),
        (IOS, "requiresExternalPower"),
        (IOS, "requiresNetworkConnectivity"),
        (IOS, "BGTaskSchedulerPermittedIdentifiers"),
        (IOS, "isExpensive"),
        (IOS, "CFBundleShortVersionString"),
        (IOS, "isExcludedFromBackup"),
        (IOS, "getSessionInfo"),
        (IOS, "Bundle.main.url"),
    ],
    ids=lambda value: value.name if isinstance(value, Guide) else value,
)
def test_the_guide_uses_the_platform_mechanism(guide: Guide, api: str) -> None:
    assert api in guide.text, f"{guide.name}: {api} is not shown"


@pytest.mark.parametrize("guide", BOTH)
def test_example_units_and_members_exist_in_models_toml(guide: Guide) -> None:
    config = tomllib.loads((REPO_ROOT / "models.toml").read_text(encoding="utf-8"))
    models, bundles = set(config["models"]), config.get("bundles", {})
    named_models = set(re.findall(r'\.?model\("([a-z_]+)"\)', guide.code))
    named_bundles = set(re.findall(r'\.?bundle\("([a-z_]+)"\)', guide.code))
    assert named_models, f"{guide.name}: the examples name no model"
    assert named_models <= models, f"{guide.name}: models {sorted(named_models - models)}"
    assert named_bundles, f"{guide.name}: the examples name no bundle"
    assert named_bundles <= set(bundles), f"{guide.name}: bundles {sorted(named_bundles)}"
    members = set(re.findall(r'members\["([a-z_]+)"\]', guide.code))
    in_bundles = {member for bundle in named_bundles for member in bundles[bundle]["models"]}
    assert members, f"{guide.name}: the examples open no bundle member"
    assert members <= in_bundles, f"{guide.name}: members {sorted(members - in_bundles)}"


def test_readme_says_how_an_app_gets_edgereg() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for needle in ("docs/guides/android.md", "docs/guides/ios.md", "make sdk", "clients/swift"):
        assert needle in readme, f"README.md does not name {needle}"
