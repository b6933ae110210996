"""SDK benchmark: the JVM and Swift clients against the Python reference, in one run.

Every client runs as its device program (docs/reference/device-program.md,
started by tests/devicekit.py), one fresh process per repetition, against
one real ``edgereg serve`` over the registry of benchmarks/client.py's
``write_trio``: a bundle of three 20 MB models (random bytes, so nothing
compresses), stable for every device.

1. Cold update of the bundle (the ``update`` op: manifest, three blobs
   streamed, hashed, installed into an empty cache): wall time seen by the
   harness, median of ``--rounds`` repetitions, clients interleaved, so the
   machine's load hits all three alike. Target: each SDK <= 1.0x the Python
   reference's time. Reported beside it: the program's start-up (spawn to
   its answer to ``hello``, not in the update's time) and the same install
   again in the same process into another empty cache (a warm runtime).
2. Peak memory of each device program process (Linux ``/proc/<pid>/status``):
   its resident size after ``configure`` (the baseline: interpreter, JVM or
   Swift runtime, client created), the peak mark reset there
   (``clear_refs`` 5) and read again after the update (``VmHWM``, the peak
   of the update itself), and the whole life's ``VmHWM`` read just before
   ``quit``. Reported with the ratio to the reference; for the JVM also its
   heap (``jcmd GC.heap_info``) and its default maximum.
3. An unchanged check: after the cold update the program is configured
   again with the same cache, through a counting TCP proxy (tests/statichttp.py,
   as benchmarks/bundles.py), and updates again; bytes sent + received on
   every connection it opened. Target: a 304 and < 400 bytes, as the reference.
   Reported beside it: the same with ``source_address`` set, which moves the
   SDKs from the platform's HTTP stack to their own raw-socket transport.
4. The JVM library jar: its size (target < 250 KB) and no required runtime
   dependency: jdeps lists only java.base and the compile-only JSR-305
   annotation names, no foreign class is packed in it, and the pom's dependencies
   are all optional or provided (BouncyCastle only below Android 13, loaded by
   reflection). The device program here runs on JDK 17 without BouncyCastle
   on its class path, as on Android 13+.
6. Cancel: each program starts an update of the bundle through a proxy that
   trickles the server's answers (``--cancel-rate`` bytes/s, so the download
   is far from done), is told ``cancel`` after 2 s, and the time from the
   cancel to the update's answer (``wait_update``, error code ``cancelled``)
   is measured: median of ``--rounds``. Target: < 1 s on every client
   (docs/protocol.md §8).
7. The guides' shortest integration (the code of "Ten-line start" in
   docs/guides/android.md and ios.md, non-blank lines of every block of a
   language together, imports and comments included), beside Firebase's
   Model Downloader counted by the same rule in issue 28 (12 Android, 15
   iOS, without the model runner). Target: <= 12 on each platform.
8. The Swift library's clean release build time: ``swift build -c release
   --target EdgeReg`` in a fresh copy of clients/swift (no ``.build``; the
   toolchain's shared module cache stays warm). Reported.

The SDK builds are copied into the work directory first, so a rebuild in
their checkout cannot change the programs mid-run. ``--jvm-before DIR`` adds
a second JVM build (another checkout's, say main's before a change) to the
cold updates, interleaved with the others, so a change is measured before
and after under the same load; it is reported beside the rest, without a
target.

Usage: .venv/bin/python benchmarks/sdk.py [--rounds 3] [--member-mb 20]
           [--cancel-rate 2000000] [--jvm-root DIR] [--swift-root DIR] [--skip-swift-build]
           [--jvm-before DIR]
(DIR: a checkout whose clients/ holds the built SDK; default EDGEREG_SDK_ROOT
or this checkout; `make sdk` builds them.) About 3-5 minutes.
Prints PASS or FAIL per target; exits 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from client import write_trio  # noqa: E402
from devicekit import DeviceError, DeviceProgram  # noqa: E402
from statichttp import TcpProxy  # noqa: E402

from edgereg.serve import start_in_thread  # noqa: E402

CLIENTS = ("python", "jvm", "swift")
BEFORE = "jvm-before"  # --jvm-before: another build of the JVM client, in the cold updates only
TIME_RATIO_TARGET = 1.0
WIRE_TARGET_BYTES = 400
JAR_TARGET_BYTES = 250 * 1024
JAR = "edgereg-android-0.2.0.jar"
# jsr305's javax.annotation: nullability annotations for Kotlin, absent at run time by design.
COMPILE_ONLY_PACKAGES = {"javax.annotation"}
results: list[tuple[str, bool | None, str]] = []


def report(target: str, passed: bool | None, measured: str) -> None:
    """``passed`` None: a number reported without a target."""
    results.append((target, passed, measured))
    mark = {True: "PASS", False: "FAIL", None: "----"}[passed]
    print(f"{mark}  {target}: {measured}", flush=True)


# --- the programs ----------------------------------------------------------------


def snapshot_sdks(jvm_root: Path, swift_root: Path, into: Path) -> Path:
    """Copy the built JVM jars and Swift program into ``into/clients/`` (an SDK root)."""
    jvm_build = jvm_root / "clients" / "android" / "build"
    swift_bin = swift_root / "clients" / "swift" / ".build" / "release" / "edgereg-device"
    missing = [p for p in (jvm_build / JAR, jvm_build / "device.jar", swift_bin) if not p.is_file()]
    if missing:
        raise SystemExit(
            "not built: " + ", ".join(map(str, missing)) + " (run `make sdk` in that checkout, "
            "or point --jvm-root / --swift-root at one where it is built)"
        )
    target = into / "clients" / "android" / "build"
    target.mkdir(parents=True)
    for name in (JAR, "device.jar"):
        shutil.copy2(jvm_build / name, target / name)
    swift_target = into / "clients" / "swift" / ".build" / "release"
    swift_target.mkdir(parents=True)
    shutil.copy2(swift_bin, swift_target / "edgereg-device")
    return into


@contextlib.contextmanager
def started(client: str, sdk_root: Path, log: Path) -> Iterator[tuple[DeviceProgram, float]]:
    """The running program and its start-up seconds (spawn to the answer to ``hello``)."""
    os.environ["EDGEREG_SDK_ROOT"] = str(sdk_root)  # devicekit.command reads it at spawn
    begin = time.perf_counter()
    program = DeviceProgram(client, log)
    try:
        hello = program.request("hello", timeout=120)
        if hello.get("client") != client:
            raise DeviceError(f"the {client} program says it is {hello.get('client')!r}")
        yield program, time.perf_counter() - begin
    finally:
        if program.process.poll() is None:
            with contextlib.suppress(DeviceError):
                program.quit(timeout=30)
            if program.process.poll() is None:
                program.kill()


def configure(
    program: DeviceProgram, url: str, pem: str, cache: Path, source: str | None = None
) -> None:
    program.request(
        "configure",
        registry=url,
        trusted_keys=[pem],
        cache_dir=str(cache),
        unit="trio",
        bundle=True,
        device={
            "device_id": "bench-device",
            "ram_mb": 8192,
            "cpu_cores": 8,
            "soc": None,
            "os": "android",
            "os_version": "34",
            "mnn_runtime": "3.6.1",
        },
        app_version="2.4.0",
        tier="high",
        tiers=None,
        self_test=False,
        runner=None,
        # No report after the install: the unchanged check's bytes are the check's alone.
        reporting=False,
        device_class="ram8-8c",
        max_unconfirmed_starts=3,
        policy={"allow_metered": True, "require_charging": False, "reserve_bytes": 8388608},
        timeout_s=60,
        deadline_s=600,
        min_rate=1024,
        bundled=None,
        source_address=source,
        now=None,
    )


def proc_status_kb(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            fields[name] = int(value.split()[0])
    return fields


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far, every thread (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are the 14th and 15th fields; the split starts at the 3rd.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak(pid: int) -> bool:
    """Reset the process's peak-RSS mark (Linux clear_refs 5); False where refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def jvm_heap(pid: int) -> str:
    """``jcmd GC.heap_info``'s first line (heap total / used), or why not."""
    try:
        out = subprocess.run(
            ["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"jcmd failed: {exc}"
    match = re.search(r"total (\d+)K, used (\d+)K", out)
    if not match:
        return "jcmd gave no heap line"
    flags = subprocess.run(
        ["java", "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True
    ).stdout
    found = re.search(r"\bMaxHeapSize\s*=\s*(\d+)", flags)
    maximum = f", default maximum {int(found[1]) >> 20} MB" if found else ""
    return (
        f"JVM heap after the update: committed {int(match[1]) / 1024:.0f} MB, "
        f"used {int(match[2]) / 1024:.0f} MB{maximum}"
    )


def cold_update(
    client: str, sdk_root: Path, url: str, pem: str, work: Path, index: int, label: str = ""
) -> dict[str, Any]:
    label = label or client
    cache = work / f"cache-{label}-{index}"
    with started(client, sdk_root, work / f"{label}-{index}.log") as (program, startup):
        pid = program.process.pid
        configure(program, url, pem, cache)
        baseline = proc_status_kb(pid)
        reset = reset_peak(pid)
        cpu_before = cpu_seconds(pid)
        begin = time.perf_counter()
        result = program.request("update", timeout=600)
        seconds = time.perf_counter() - begin
        cpu = cpu_seconds(pid) - cpu_before
        during = proc_status_kb(pid)
        heap = jvm_heap(pid) if client == "jvm" and index == 0 else ""
        if not result.get("ok") or not result.get("updated"):
            raise SystemExit(f"{client}: the cold update failed: {result}{program.tail()}")
        # The life's peak: the mark was reset at configure, so it is the larger of the two.
        life_peak = max(baseline["VmHWM"], proc_status_kb(pid)["VmHWM"])
        # The same install again in the same process, into an empty cache: what is left of
        # the cold time once the runtime is warm (the JVM's JIT, the first TLS-free socket).
        configure(program, url, pem, cache.with_name(cache.name + "-warm"))
        cpu_before = cpu_seconds(pid)
        begin = time.perf_counter()
        warm = program.request("update", timeout=600)
        warm_seconds = time.perf_counter() - begin
        warm_cpu = cpu_seconds(pid) - cpu_before
        if not warm.get("ok") or not warm.get("updated"):
            raise SystemExit(f"{client}: the warm update failed: {warm}{program.tail()}")
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(cache.with_name(cache.name + "-warm"), ignore_errors=True)
    return {
        "startup": startup,
        "cpu": cpu,
        "warm_cpu": warm_cpu,
        "warm_seconds": warm_seconds,
        "seconds": seconds,
        "bytes": result.get("downloaded_bytes", 0),
        "baseline_mb": baseline["VmRSS"] / 1024,
        "update_peak_mb": during["VmHWM"] / 1024 if reset else float("nan"),
        "life_peak_mb": life_peak / 1024,
        "heap": heap,
    }


def unchanged_check(
    client: str, sdk_root: Path, url: str, port: int, pem: str, work: Path, source: str | None
) -> dict[str, Any]:
    """``source``: a source address, which puts the SDKs on their raw-socket transport."""
    cache = work / f"check-{client}"
    with started(client, sdk_root, work / f"{client}-check.log") as (program, _):
        configure(program, url, pem, cache)
        first = program.request("update", timeout=600)
        if not first.get("ok"):
            raise SystemExit(f"{client}: the update before the check failed: {first}")
    with TcpProxy(port) as proxy:
        with started(client, sdk_root, work / f"{client}-check.log") as (program, _):
            configure(program, proxy.url, pem, cache, source)
            again = program.request("update", timeout=120)
        # quit closed every socket; the proxy records a connection when both sides end.
        deadline = time.monotonic() + 5
        while not proxy.per_connection and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        connections = list(proxy.per_connection)
    shutil.rmtree(cache, ignore_errors=True)
    return {
        "not_modified": bool(again.get("not_modified")),
        "ok": bool(again.get("ok")),
        "up": sum(up for up, _ in connections),
        "down": sum(down for _, down in connections),
        "connections": len(connections),
    }


def cancel_time(
    client: str, sdk_root: Path, port: int, pem: str, work: Path, index: int, rate: int
) -> dict[str, Any]:
    """Seconds from ``cancel`` to the cancelled update's answer, against a trickling server."""
    cache = work / f"cancel-{client}-{index}"
    log = work / f"{client}-cancel-{index}.log"
    with TcpProxy(port, rate=rate) as proxy, started(client, sdk_root, log) as (program, _):
        configure(program, proxy.url, pem, cache)
        program.request("start_update")
        time.sleep(2.0)
        begin = time.perf_counter()
        program.request("cancel")
        result = program.request("wait_update", timeout=600)
        seconds = time.perf_counter() - begin
        progress = result.get("progress") or [[0, 0]]
    shutil.rmtree(cache, ignore_errors=True)
    if result.get("error_code") != "cancelled":
        raise SystemExit(f"{client}: the update was not cancelled: {result}")
    return {"seconds": seconds, "done": progress[-1][0], "total": progress[-1][1]}


GUIDE_TARGET_LINES = 12
FIREBASE_LINES = {"android": 12, "ios": 15}
"""Firebase Model Downloader's shortest integration as issue 28 counted it (no model runner)."""


def guide_lines() -> None:
    """The non-blank code lines of each guide's "Ten-line start", per language.

    Every block of that language in the section counts (imports and comments included), so a
    start split over two blocks is counted whole; the model runner is in its own section.
    """
    for platform in ("android", "ios"):
        text = (ROOT / "docs" / "guides" / f"{platform}.md").read_text(encoding="utf-8")
        start = text.split("## Ten-line start", 1)[1].split("\n## ", 1)[0]
        counts: dict[str, int] = {}
        for language, code in re.findall(r"```(\w+)\n(.*?)```", start, re.S):
            lines = [line for line in code.splitlines() if line.strip()]
            counts[language] = counts.get(language, 0) + len(lines)
        for language, count in counts.items():
            report(
                f"{platform} guide's start in {language}: <= {GUIDE_TARGET_LINES} lines",
                count <= GUIDE_TARGET_LINES,
                f"{count} lines (Firebase Model Downloader: {FIREBASE_LINES[platform]}, "
                "as issue 28 counted it; both without the model runner)",
            )


# --- the jar and the Swift build ---------------------------------------------------


def jar_checks(jvm_root: Path) -> None:
    android = jvm_root / "clients" / "android"
    jar = android / "build" / JAR
    size = jar.stat().st_size
    report(
        "JVM library jar < 250 KB",
        size < JAR_TARGET_BYTES,
        f"{size:,} bytes ({size / 1024:.0f} KiB) ({jar.name}; device.jar, the harness "
        f"program, {(android / 'build' / 'device.jar').stat().st_size:,} bytes more, not shipped)",
    )
    out = subprocess.run(
        ["jdeps", "-verbose:package", "--multi-release", "17", str(jar)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    own = {line.split()[0] for line in out.splitlines() if line.startswith("   dev.edgereg")}
    foreign = {
        fields[2]
        for fields in (line.split() for line in out.splitlines() if "->" in line)
        if len(fields) >= 4 and fields[0] in own and fields[3] != "java.base"
    } - own
    listing = subprocess.run(["jar", "tf", str(jar)], capture_output=True, text=True, check=True)
    packed = sorted(
        {
            name.rsplit("/", 1)[0]
            for name in listing.stdout.split()
            if name.endswith(".class") and not name.startswith("dev/edgereg/")
        }
    )
    pom = (android / "pom.xml").read_text()
    required = [
        dep
        for dep in re.findall(r"<dependency>(.*?)</dependency>", pom, re.S)
        if "<optional>true</optional>" not in dep and "<scope>provided</scope>" not in dep
    ]
    ok = foreign <= COMPILE_ONLY_PACKAGES and not packed and not required
    report(
        "JVM library: no required runtime dependency (Android 13+: platform Ed25519)",
        ok,
        f"jdeps: java.base + {sorted(foreign) or 'nothing'} (compile-only annotations); "
        f"foreign classes packed: {packed or 'none'}; pom dependencies not optional/provided: "
        f"{len(required)}; BouncyCastle loaded only by reflection below Android 13",
    )


def swift_build_time(swift_root: Path, work: Path) -> None:
    source = swift_root / "clients" / "swift"
    copy = work / "swift-clean"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(".build", ".swiftpm"))
    begin = time.perf_counter()
    out = subprocess.run(
        ["swift", "build", "-c", "release", "--target", "EdgeReg"],
        cwd=copy,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - begin
    if out.returncode != 0:
        report("Swift library clean release build", False, (out.stdout + out.stderr)[-500:])
        return
    load = os.getloadavg()[0]
    report(
        "Swift library (target EdgeReg) clean release build time",
        None,
        f"{seconds:.1f} s (load average {load:.1f} at its end)",
    )


# --- main ------------------------------------------------------------------------


def checkout_commit(root: Path) -> str:
    """The checkout's commit and whether its clients/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "clients"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return head + (", clients/ modified" if dirty else "")


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(float(run[key]) for run in runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = os.environ.get("EDGEREG_SDK_ROOT") or str(ROOT)
    parser.add_argument("--rounds", type=int, default=3, help="cold updates per client")
    parser.add_argument("--member-mb", type=int, default=20, help="size of each bundle member")
    parser.add_argument("--jvm-root", type=Path, default=Path(default_root))
    parser.add_argument("--swift-root", type=Path, default=Path(default_root))
    parser.add_argument("--skip-swift-build", action="store_true")
    parser.add_argument(
        "--jvm-before",
        type=Path,
        help="a checkout whose built JVM client runs the cold updates too, interleaved "
        "(a before/after comparison under the same load)",
    )
    parser.add_argument(
        "--cancel-rate", type=int, default=2_000_000, help="the slow server's bytes/s"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.member_mb < 1:
        parser.error("--rounds and --member-mb must be at least 1")

    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="edgereg-sdk-bench-") as tmp:
        work = Path(tmp)
        sdk_root = snapshot_sdks(args.jvm_root, args.swift_root, work / "sdk")
        roots = {client: sdk_root for client in CLIENTS}
        sources = [("JVM", args.jvm_root), ("Swift", args.swift_root)]
        if args.jvm_before is not None:
            roots[BEFORE] = snapshot_sdks(args.jvm_before, args.swift_root, work / "sdk-before")
            sources.append(("JVM before", args.jvm_before))
        for name, root in sources:
            print(f"{name} SDK from {root} ({checkout_commit(root)})")
        signer = write_trio(work / "registry", args.member_mb)
        pem = signer.public_pem().decode()
        server, url = start_in_thread(work / "registry")
        cold_clients = tuple(roots)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cold_clients}
        try:
            for index in range(args.rounds):
                # Rotate the order so no client always runs first (or right after the JVM).
                shift = index % len(cold_clients)
                order = cold_clients[shift:] + cold_clients[:shift]
                for client in order:
                    program = "jvm" if client == BEFORE else client
                    run = cold_update(program, roots[client], url, pem, work, index, client)
                    runs[client].append(run)
                    print(
                        f"  round {index + 1} {client:10s} cold {run['seconds'] * 1000:5.0f} ms "
                        f"(CPU {run['cpu'] * 1000:4.0f})  "
                        f"warm {run['warm_seconds'] * 1000:5.0f} ms "
                        f"(CPU {run['warm_cpu'] * 1000:4.0f})  start-up "
                        f"{run['startup'] * 1000:4.0f} ms  "
                        f"{run['bytes'] / 1e6:.1f} MB  baseline {run['baseline_mb']:.0f} MB  "
                        f"update peak {run['update_peak_mb']:.0f} MB  "
                        f"life peak {run['life_peak_mb']:.0f} MB  load {os.getloadavg()[0]:.1f}"
                        + (f"  ({run['heap']})" if run["heap"] else ""),
                        flush=True,
                    )
            checks = {
                c: unchanged_check(c, sdk_root, url, server.port, pem, work, None) for c in CLIENTS
            }
            raw_checks = {
                c: unchanged_check(c, sdk_root, url, server.port, pem, work, "127.0.0.1")
                for c in CLIENTS
            }
            cancels: dict[str, list[dict[str, Any]]] = {c: [] for c in CLIENTS}
            for index in range(args.rounds):
                for client in CLIENTS[index % 3 :] + CLIENTS[: index % 3]:
                    cancels[client].append(
                        cancel_time(
                            client, sdk_root, server.port, pem, work, index, args.cancel_rate
                        )
                    )
        finally:
            server.close()

        reference = median(runs["python"], "seconds")
        ref_peak = median(runs["python"], "update_peak_mb")
        ref_life = median(runs["python"], "life_peak_mb")
        total_mb = args.member_mb * 3
        print(
            f"\ncold update of a bundle of three {args.member_mb} MB models, "
            f"median of {args.rounds}"
        )
        for client in CLIENTS:
            seconds = median(runs[client], "seconds")
            ratio = seconds / reference
            line = (
                f"{seconds * 1000:.0f} ms ({total_mb / seconds:.0f} MB/s) vs python "
                f"{reference * 1000:.0f} ms: {ratio:.2f}x (runs "
                + ", ".join(f"{r['seconds'] * 1000:.0f}" for r in runs[client])
                + " ms)"
            )
            if client == "python":
                report("python reference: cold update time", None, line)
            else:
                report(
                    f"{client}: cold update time <= {TIME_RATIO_TARGET:.1f}x python",
                    ratio <= TIME_RATIO_TARGET,
                    line,
                )
        if BEFORE in runs:
            seconds = median(runs[BEFORE], "seconds")
            after = median(runs["jvm"], "seconds")
            report(
                f"{BEFORE} ({args.jvm_before}): cold update time, the same run",
                None,
                f"{seconds * 1000:.0f} ms: {seconds / reference:.2f}x python (runs "
                + ", ".join(f"{r['seconds'] * 1000:.0f}" for r in runs[BEFORE])
                + f" ms); after / before {after / seconds:.2f}; CPU "
                f"{median(runs[BEFORE], 'cpu') * 1000:.0f} ms before, "
                f"{median(runs['jvm'], 'cpu') * 1000:.0f} ms after",
            )
        cpu_reference = median(runs["python"], "cpu")
        for client in CLIENTS:
            cpu = median(runs[client], "cpu")
            report(
                f"{client}: CPU time of the cold update (user + system, every thread)",
                None,
                f"{cpu * 1000:.0f} ms ({cpu / cpu_reference:.2f}x python's; less sensitive to "
                "the machine's load than the wall time)",
            )
        warm_reference = median(runs["python"], "warm_seconds")
        warm_cpu_reference = median(runs["python"], "warm_cpu")
        for client in CLIENTS:
            warm = median(runs[client], "warm_seconds")
            warm_cpu = median(runs[client], "warm_cpu")
            startup = median(runs[client], "startup")
            report(
                f"{client}: the same install again in the same process; process start-up",
                None,
                f"{warm * 1000:.0f} ms ({warm / warm_reference:.2f}x python's), CPU "
                f"{warm_cpu * 1000:.0f} ms ({warm_cpu / warm_cpu_reference:.2f}x); start-up to "
                f"the answer to hello {startup * 1000:.0f} ms (not in the update's time; "
                f"start-up + cold update {(startup + median(runs[client], 'seconds')) * 1000:.0f}"
                " ms)",
            )
        for client in CLIENTS:
            peak = median(runs[client], "update_peak_mb")
            life = median(runs[client], "life_peak_mb")
            base = median(runs[client], "baseline_mb")
            heap = next((r["heap"] for r in runs[client] if r["heap"]), "")
            report(
                f"{client}: peak memory (process RSS)",
                None,
                f"baseline after configure {base:.0f} MB; peak during the update {peak:.0f} MB "
                f"(+{peak - base:.0f} MB, {peak / ref_peak:.2f}x python's); whole-life peak "
                f"{life:.0f} MB ({life / ref_life:.2f}x)" + (f"; {heap}" if heap else ""),
            )
        for client in CLIENTS:
            check = checks[client]
            total = check["up"] + check["down"]
            report(
                f"{client}: unchanged check is a 304 < {WIRE_TARGET_BYTES} bytes on the wire",
                check["ok"] and check["not_modified"] and total < WIRE_TARGET_BYTES,
                f"{total} bytes (sent {check['up']}, received {check['down']}, "
                f"{check['connections']} connection(s)), not_modified {check['not_modified']}",
            )

        for client in CLIENTS:
            check = raw_checks[client]
            report(
                f"{client}: unchanged check with source_address set (the fleet simulator's "
                "raw-socket transport in the SDKs)",
                None,
                f"{check['up'] + check['down']} bytes (sent {check['up']}, received "
                f"{check['down']}, {check['connections']} connection(s)), "
                f"not_modified {check['not_modified']}",
            )

        for client in CLIENTS:
            seconds = median(cancels[client], "seconds")
            last = cancels[client][-1]
            report(
                f"{client}: cancel to return < 1 s (a download in progress, a slow server)",
                seconds < 1.0,
                f"{seconds * 1000:.0f} ms median (runs "
                + ", ".join(f"{r['seconds'] * 1000:.0f}" for r in cancels[client])
                + f" ms); at the cancel {last['done'] / 1e6:.1f} of {last['total'] / 1e6:.1f} MB "
                "were down, kept for a resume",
            )
        guide_lines()
        jar_checks(args.jvm_root)
        if not args.skip_swift_build:
            swift_build_time(args.swift_root, work)

    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    failed = [target for target, passed, _ in results if passed is False]
    met = sum(passed is True for _, passed, _ in results)
    print(f"\n{'FAIL' if failed else 'PASS'}: {met}/{met + len(failed)} targets met")
    for target in failed:
        print(f"  not met: {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
