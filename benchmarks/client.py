"""Client benchmark: memory while streaming a big blob, bytes of an unchanged check, cold fetches.

Measures, in one run:

1. peak memory growth of a client fetching a 200 MB blob (target < 50 MB):
   the client runs in a child process and compares its ``ru_maxrss`` before
   and after ``Client.fetch()``; the blob is served by the stdlib's
   ``http.server`` in another process;
2. the bytes an unchanged check costs on the wire (request + 304 response,
   counted by a TCP proxy), against a static file server with ETags and
   against ``edgereg serve`` (target < 400 bytes);
3. the time to fetch every example model and tier from a cold cache, from
   the repository's ``registry/`` (made by ``make demo`` / ``edgereg
   publish``), or from a small registry built here when there is none;
4. installing a bundle of three models against installing the same three
   models one by one (three clients): wall time and peak memory growth, each
   in a fresh child process, and their ratios (target: the bundle costs no
   more than 1.5x the time and memory of the three separate installs).

Usage: .venv/bin/python benchmarks/client.py [--blob-mb 200] [--member-mb 20] [--registry DIR]
Prints the numbers and PASS or FAIL per target; exits 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _memory import current_rss  # noqa: E402
from statichttp import StaticServer, TcpProxy  # noqa: E402

from edgereg.client import Client, DeviceProfile, TrustedKeys  # noqa: E402
from edgereg.config import RuntimeHints  # noqa: E402
from edgereg.protocol.envelope import Signer, generate_key, load_public_key  # noqa: E402
from edgereg.protocol.fields import format_time  # noqa: E402
from edgereg.protocol.wire import (  # noqa: E402  # noqa: E402
    BundleEntry,
    Manifest,
    ManifestEntry,
    ReleaseRecord,
    ReleaseVariant,
    blob_path,
    sign_document,
)
from edgereg.registry import PreparedRelease, Registry  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

MEMORY_TARGET_MB = 50
WIRE_TARGET_BYTES = 400
BUNDLE_RATIO_TARGET = 1.5
MEMBERS = ("det", "cls", "rec")
results: list[tuple[str, bool]] = []


def report(name: str, ok: bool, detail: str) -> None:
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")


# --- registries ---------------------------------------------------------------


def publish_blob(root: Path, work: Path, size: int, *, model: str = "big") -> Signer:
    """A registry with one model whose only variant is ``size`` bytes of random data."""
    signer = Signer.from_pem(generate_key()[0])
    blob = work / f"{model}.mnn"
    digest = hashlib.sha256()
    with blob.open("wb") as out:
        left = size
        while left:
            chunk = os.urandom(min(left, 4 << 20))
            out.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    sha = digest.hexdigest()
    record = ReleaseRecord(
        model=model,
        version="1.0.0",
        created=datetime.now(timezone.utc),
        variants={
            "fp32": ReleaseVariant(
                tier="high", sha256=sha, size=size, min_mnn_runtime="3.6.1", runtime=RuntimeHints()
            )
        },
        tiers={"high": "fp32"},
    )
    registry = Registry(open_storage(str(root)))
    registry.publish(
        PreparedRelease(record=record, blobs={sha: blob}),
        signer=signer,
        percent=None,
        full=True,
        actor="benchmark",
        expires_days=7,
    )
    # A first release published --full is stable for every device already.
    blob.unlink()
    return signer


def registry_keys(root: Path) -> TrustedKeys:
    # The benchmark trusts the keys of a registry it was pointed at; apps never do.
    return TrustedKeys(load_public_key(p.read_bytes()) for p in (root / "keys").glob("*.pem"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def stdlib_server_process(root: Path) -> Iterator[str]:
    """``python -m http.server`` over ``root`` in its own process."""
    port = free_port()
    command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1"]
    command += ["--directory", str(root), str(port)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("http.server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/"
    finally:
        process.terminate()
        process.wait(timeout=10)


def device(device_id: str = "bench-device") -> DeviceProfile:
    return DeviceProfile(device_id=device_id, ram_mb=8192, cpu_cores=8, mnn_runtime="3.6.1")


# --- 1. memory ----------------------------------------------------------------


def child_memory(url: str, key_pem: str, cache: str) -> None:
    """Run in the child: fetch once and print the ru_maxrss growth as JSON."""
    client = Client(
        url,
        TrustedKeys.from_pems([key_pem]),
        cache,
        model="big",
        device=device(),
        tier="high",
        timeout=60,
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    current = current_rss() // 1024
    start = time.perf_counter()
    result = client.fetch()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "before_kb": before,
                "current_kb": current,
                "after_kb": after,
                "ok": result.ok,
                "error": result.error,
                "bytes": result.downloaded_bytes,
                "seconds": seconds,
            }
        )
    )


def bench_memory(work: Path, blob_mb: int) -> None:
    root = work / "big-registry"
    size = blob_mb * 1024 * 1024
    signer = publish_blob(root, work, size)
    with stdlib_server_process(root) as url:
        cache = work / "big-cache"
        out = subprocess.run(
            [sys.executable, __file__, "--child-memory", url, str(cache)],
            input=signer.public_pem().decode(),
            capture_output=True,
            text=True,
            check=True,
        )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    growth_mb = (data["after_kb"] - data["before_kb"]) / 1024
    # Stricter: the peak after against the resident size just before (the
    # import-time peak cannot hide the fetch's own growth).
    above_current_mb = (data["after_kb"] - data["current_kb"]) / 1024
    ok = data["ok"] and data["bytes"] == size and above_current_mb < MEMORY_TARGET_MB
    rate = size / data["seconds"] / 1e6
    report(
        f"memory while fetching a {blob_mb} MB blob",
        ok,
        f"ru_maxrss +{growth_mb:.1f} MB, peak {above_current_mb:.1f} MB above the RSS "
        f"before the fetch ({data['current_kb'] / 1024:.0f} MB) (target < "
        f"{MEMORY_TARGET_MB} MB), {data['seconds']:.2f} s, {rate:.0f} MB/s"
        + ("" if data["ok"] else f", error: {data['error']}"),
    )
    shutil.rmtree(root)
    shutil.rmtree(cache, ignore_errors=True)


# --- 2. bytes of an unchanged check ---------------------------------------------


def unchanged_check_bytes(upstream_port: int, root: Path, work: Path, name: str) -> None:
    model, tier = first_manifest(root)
    with TcpProxy(upstream_port) as proxy:
        client = Client(
            proxy.url,
            registry_keys(root),
            work / f"check-{name}",
            model=model,
            device=device(),
            tier=tier,
            timeout=10,
        )
        first = client.fetch()
        wait_connections(proxy, 1 + (first.downloaded_bytes > 0))
        proxy.reset()
        again = client.fetch()
        wait_connections(proxy, 1)
        up, down = proxy.per_connection[0]
    ok = again.ok and again.not_modified and up + down < WIRE_TARGET_BYTES
    report(
        f"unchanged check through {name}",
        ok,
        f"{up + down} bytes on the wire (request {up}, 304 response {down}; "
        f"target < {WIRE_TARGET_BYTES})" + ("" if again.ok else f", error: {again.error}"),
    )


def wait_connections(proxy: TcpProxy, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(proxy.per_connection) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def first_manifest(root: Path) -> tuple[str, str]:
    return manifests(root)[0]


# --- 3. cold fetches of the example models --------------------------------------


def manifests(root: Path) -> list[tuple[str, str]]:
    return [
        (p.parent.name, p.stem)
        for p in sorted((root / "manifests").glob("*/*.json"))
        if not p.name.startswith(".")
    ]


def is_bundle(root: Path, unit: str, tier: str) -> bool:
    """A bundle's manifest (its entries have members), read without verifying: to pick the API."""
    envelope = json.loads((root / "manifests" / unit / f"{tier}.json").read_bytes())
    import base64

    payload = json.loads(base64.b64decode(envelope["payload"]))
    entry = payload.get("stable") or payload.get("candidate") or {}
    return "members" in entry


def cold_fetches(root: Path, url: str, work: Path, name: str) -> None:
    trusted = registry_keys(root)
    total = 0.0
    rows = []
    all_ok = True
    for model, tier in manifests(root):
        cache = work / f"cold-{name}-{model}-{tier}"
        unit = {"bundle" if is_bundle(root, model, tier) else "model": model}
        client = Client(url, trusted, cache, **unit, device=device(), tier=tier, timeout=30)
        start = time.perf_counter()
        result = client.fetch()
        seconds = time.perf_counter() - start
        total += seconds
        all_ok &= result.ok
        rows.append(
            f"    {model}/{tier}: {result.version} {result.variant} "
            f"{result.downloaded_bytes / 1024:.0f} KiB in {seconds * 1000:.1f} ms"
            + ("" if result.ok else f"  ERROR {result.error_code}: {result.error}")
        )
        shutil.rmtree(cache, ignore_errors=True)
    report(
        f"cold fetch of every example model and tier through {name}",
        all_ok,
        f"{len(rows)} fetches, {total * 1000:.0f} ms in all",
    )
    print("\n".join(rows))


# --- 4. a bundle of three against three models one by one ------------------------


def write_trio(root: Path, member_mb: int) -> Signer:
    """Three models and a bundle of the same three, as static files, signed by hand."""
    signer = Signer.from_pem(generate_key()[0])
    entries = {}
    for name in MEMBERS:
        data = os.urandom(member_mb * 1024 * 1024)
        sha = hashlib.sha256(data).hexdigest()
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (root / blob_path(sha)).write_bytes(data)
        entries[name] = ManifestEntry(
            version="1.0.0",
            variant="int8",
            path=blob_path(sha),
            sha256=sha,
            size=len(data),
            min_mnn_runtime="3.6.1",
            runtime=RuntimeHints(),
        )
    expires = datetime.now(timezone.utc).replace(microsecond=0)
    expires = datetime.fromisoformat(format_time(expires).replace("Z", "+00:00"))
    expires = expires.replace(year=expires.year + 1)
    units: dict[str, ManifestEntry | BundleEntry] = dict(entries)
    units["trio"] = BundleEntry(version="1.0.0", members=entries)
    for unit, entry in units.items():
        manifest = Manifest(model=unit, tier="high", sequence=1, expires=expires, stable=entry)
        path = root / "manifests" / unit / "high.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(sign_document(manifest, [signer]))
    return signer


def child_install(url: str, key_pem: str, cache: str, mode: str) -> None:
    """Run in the child: install the bundle, or the three models; print time and memory."""
    trusted = TrustedKeys.from_pems([key_pem])
    units = [{"bundle": "trio"}] if mode == "bundle" else [{"model": m} for m in MEMBERS]
    clients = [
        Client(url, trusted, cache, **unit, device=device(), tier="high", timeout=60)
        for unit in units
    ]
    reset = reset_peak_rss()
    before_kb = peak_rss_kb() if reset else current_rss() // 1024
    start = time.perf_counter()
    results = [client.fetch() for client in clients]
    seconds = time.perf_counter() - start
    after_kb = peak_rss_kb()
    ok = all(r.ok for r in results)
    print(
        json.dumps(
            {
                "ok": ok,
                "errors": [r.error for r in results if r.error],
                "seconds": seconds,
                "peak_mb": (after_kb - before_kb) / 1024,
                "peak_reset": reset,
                "bytes": sum(r.downloaded_bytes for r in results),
            }
        )
    )


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux clear_refs 5), so the import-time peak
    cannot hide the fetch's own; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_kb() -> int:
    """The peak resident size: VmHWM on Linux, else ru_maxrss."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def bench_bundle(work: Path, member_mb: int, rounds: int = 3) -> None:
    root = work / "trio-registry"
    signer = write_trio(root, member_mb)
    best: dict[str, dict[str, float]] = {}
    with stdlib_server_process(root) as url:
        for _ in range(rounds):
            for mode in ("models", "bundle"):
                cache = work / f"trio-cache-{mode}"
                shutil.rmtree(cache, ignore_errors=True)
                out = subprocess.run(
                    [sys.executable, __file__, "--child-install", url, str(cache), mode],
                    input=signer.public_pem().decode(),
                    capture_output=True,
                    text=True,
                    check=True,
                )
                data = json.loads(out.stdout.strip().splitlines()[-1])
                if not data["ok"]:
                    report(f"install ({mode})", False, f"errors: {data['errors']}")
                    return
                kept = best.setdefault(mode, data)
                kept["seconds"] = min(kept["seconds"], data["seconds"])
                kept["peak_mb"] = min(kept["peak_mb"], data["peak_mb"])
    models, bundle = best["models"], best["bundle"]
    time_ratio = bundle["seconds"] / models["seconds"]
    # Memory: both stream; compare peaks with a 1 MB floor so noise does not divide by ~0.
    memory_ratio = max(bundle["peak_mb"], 1.0) / max(models["peak_mb"], 1.0)
    ok = time_ratio <= BUNDLE_RATIO_TARGET and memory_ratio <= BUNDLE_RATIO_TARGET
    report(
        f"a bundle of three {member_mb} MB models against the three one by one",
        ok,
        f"bundle {bundle['seconds'] * 1000:.0f} ms, peak +{bundle['peak_mb']:.1f} MB; "
        f"three models {models['seconds'] * 1000:.0f} ms, peak +{models['peak_mb']:.1f} MB; "
        f"time ratio {time_ratio:.2f}, memory ratio {memory_ratio:.2f} "
        f"(target <= {BUNDLE_RATIO_TARGET}; best of {rounds})",
    )
    shutil.rmtree(root)


def example_registry(arg: str | None, work: Path) -> Path:
    if arg:
        return Path(arg)
    if (ROOT / "registry" / "manifests").is_dir():
        return ROOT / "registry"
    print("no ./registry (run `make demo`); building a small one with servekit")
    import servekit

    return servekit.make_registry(work / "examples").root  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child-memory"]:
        child_memory(argv[1], sys.stdin.read(), argv[2])
        return 0
    if argv[:1] == ["--child-install"]:
        child_install(argv[1], sys.stdin.read(), argv[2], argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blob-mb", type=int, default=200)
    parser.add_argument("--member-mb", type=int, default=20, help="size of each bundle member")
    parser.add_argument("--registry", default=None, help="registry directory with examples")
    args = parser.parse_args(argv)

    from edgereg.serve import start_in_thread

    with tempfile.TemporaryDirectory(prefix="edgereg-client-bench-") as tmp:
        work = Path(tmp)
        bench_memory(work, args.blob_mb)
        bench_bundle(work, args.member_mb)

        root = example_registry(args.registry, work)
        print(f"example registry: {root}")
        with StaticServer(root) as static:
            server, serve_url = start_in_thread(root)
            try:
                serve_port = int(serve_url.rstrip("/").rsplit(":", 1)[1])
                unchanged_check_bytes(static.port, root, work, "a static server (nginx-style ETag)")
                unchanged_check_bytes(serve_port, root, work, "edgereg serve")
                cold_fetches(root, static.url, work, "a static server")
                cold_fetches(root, serve_url, work, "edgereg serve")
                cold_fetches(root, root.as_uri(), work, "file://")
            finally:
                server.close()

    failed = [name for name, ok in results if not ok]
    print(
        f"\n{'FAIL' if failed else 'PASS'}: {len(results) - len(failed)}/{len(results)} targets met"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
