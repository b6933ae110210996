"""Registry benchmark: publishing through the real publish path, on loopback S3 and disk.

Starts its own moto server (tests/s3server.py) and builds the tiny project of
tests/buildkit.py once, then measures in one run:

1. bytes of blobs uploaded by publishing the same release again (target: 0),
   counted on the wire (a botocore hook), not taken from the return value;
2. throughput of ``Registry.publish`` of a release whose artifact is a 50 MB
   file, against a bare boto3 ``upload_file`` of the same file, to the same
   server (target: ratio >= 0.5);
3. peak memory of that publish for a 5, 50, 200 and 400 MB artifact, each in
   a fresh child process: ru_maxrss of the 50 MB publish exceeds the 5 MB
   one's by less than a quarter of the 45 MB difference, and the RSS growth
   sampled during the publish rises by less than a tenth of the extra data
   from 200 to 400 MB (uploads stream from disk: memory is bounded by the
   parts in flight, reached from about 64 MB on);
4. ``edgereg status`` (the CLI, a subprocess) on a local registry of 50
   models (target: under a second).

The release is the tiny project's real build of one model (provenance checked
by ``prepare_release``); for 2 and 3 its largest variant's artifact is swapped
for a file of random bytes of the size measured.

Usage: .venv/bin/python benchmarks/registry.py [--size-mb 50] [--rounds 3] [--models 50]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from _memory import peak_growth  # noqa: E402
from s3server import FAKE_CREDENTIALS, MotoServer, make_client  # noqa: E402

from edgereg._files import sha256_file  # noqa: E402
from edgereg.protocol.envelope import Signer, generate_key  # noqa: E402
from edgereg.registry import PreparedRelease, Registry, prepare_release, utcnow  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

MB = 1_000_000
BUCKET = "bench"
MODEL = "vision"
results: list[tuple[str, bool, str]] = []


def report(target: str, passed: bool, measured: str) -> None:
    results.append((target, passed, measured))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}", flush=True)


# --- the release ---------------------------------------------------------------------------


def build_project(root: Path) -> Path:
    """Write the tiny project and build every variant of MODEL (a few seconds)."""
    import buildkit

    project = buildkit.write_project(root)
    for variant in buildkit.VARIANTS[MODEL]:
        project.build(MODEL, variant)
    return root


def make_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 4 * MB)
            f.write(os.urandom(n))
            left -= n
    return path


def release(project: Path, version: str, artifact: Path | None = None) -> PreparedRelease:
    """The real release of MODEL; with ``artifact``, its largest variant ships that file."""
    from edgereg import config as config_module

    config = config_module.load(project / "models.toml")
    prepared = prepare_release(config, MODEL, project / "build", version=version, now=utcnow())
    if artifact is None:
        return prepared
    record = prepared.record
    name = max(record.variants, key=lambda v: record.variants[v].size)
    digest = sha256_file(artifact)
    variant = record.variants[name].model_copy(
        update={"sha256": digest, "size": artifact.stat().st_size}
    )
    blobs = {d: p for d, p in prepared.blobs.items() if d != record.variants[name].sha256}
    blobs[digest] = artifact
    record = record.model_copy(update={"variants": {**record.variants, name: variant}})
    return PreparedRelease(record=record, blobs=blobs)


def publish(registry: Registry, prepared: PreparedRelease, signer: Signer) -> Any:
    return registry.publish(
        prepared, signer=signer, percent=5.0, full=False, actor="bench", expires_days=30
    )


def s3_registry(endpoint: str, prefix: str) -> Registry:
    return Registry(open_storage(f"s3://{BUCKET}/{prefix}", endpoint_url=endpoint))


class BlobBytes:
    """Counts the body bytes an S3 client sends to blob keys (a botocore event hook)."""

    def __init__(self, client: Any) -> None:
        self.blob_bytes = 0
        self.other_bytes = 0
        self.requests: dict[str, int] = {}
        client.meta.events.register("provide-client-params.s3.*", self._seen)

    def _seen(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.requests[model.name] = self.requests.get(model.name, 0) + 1
        body = params.get("Body")
        if body is None:
            return
        size = len(body) if hasattr(body, "__len__") else os.fstat(body.fileno()).st_size
        if "/blobs/" in str(params.get("Key", "")):
            self.blob_bytes += size
        else:
            self.other_bytes += size


# --- 1. publishing again -----------------------------------------------------------------------


def again(endpoint: str, project: Path, signer: Signer) -> None:
    registry = s3_registry(endpoint, "again")
    prepared = release(project, "1.0.0")
    first = publish(registry, prepared, signer)
    counter = BlobBytes(registry.storage.client)  # type: ignore[attr-defined]
    second = publish(registry, prepared, signer)
    print(
        f"first publish: {first.uploaded_blobs} blobs, {first.uploaded_bytes} bytes; again: "
        f"{counter.blob_bytes} blob bytes on the wire, {counter.other_bytes} other bytes "
        f"(manifests rewritten), requests {counter.requests}"
    )
    report(
        "publishing a release again uploads 0 blob bytes",
        counter.blob_bytes == 0 and second.uploaded_bytes == 0 and second.already_published,
        f"{counter.blob_bytes} bytes",
    )


# --- 2. throughput -----------------------------------------------------------------------------


def throughput(endpoint: str, project: Path, signer: Signer, big: Path, rounds: int) -> None:
    client = make_client(endpoint)
    size = big.stat().st_size
    prepared = release(project, "1.0.0", big)
    # Warm both paths (connections, imports, boto3's transfer manager).
    client.upload_file(str(big), BUCKET, "warm/bare")
    publish(s3_registry(endpoint, "warm"), prepared, signer)
    bare, ours = [], []
    for i in range(rounds):
        start = time.perf_counter()
        client.upload_file(str(big), BUCKET, f"bare/{i}")
        bare.append(size / MB / (time.perf_counter() - start))
        registry = s3_registry(endpoint, f"tput-{i}")  # empty: the blob is new
        start = time.perf_counter()
        result = publish(registry, prepared, signer)
        ours.append(size / MB / (time.perf_counter() - start))
        assert result.uploaded_bytes >= size
        client.delete_object(Bucket=BUCKET, Key=f"bare/{i}")
    b, o = statistics.median(bare), statistics.median(ours)
    print(
        f"{size / MB:.0f} MB artifact, median of {rounds}: boto3 upload_file {b:.1f} MB/s, "
        f"Registry.publish {o:.1f} MB/s (rounds: {', '.join(f'{x:.0f}' for x in ours)} "
        f"vs {', '.join(f'{x:.0f}' for x in bare)})"
    )
    report(
        f"publishing a {size / MB:.0f} MB artifact runs at >= 0.5x boto3 upload_file",
        o / b >= 0.5,
        f"ratio {o / b:.2f}",
    )


# --- 3. memory ---------------------------------------------------------------------------------


def memory_child(endpoint: str, project: str, artifact: str, prefix: str, key_pem: str) -> None:
    """In a fresh process: one publish; print its peak RSS growth and ru_maxrss as JSON.

    The growth is sampled every millisecond against the RSS once every module
    is loaded and a connection is open (ru_maxrss alone also counts imports,
    which peak higher than a streaming upload; it is printed too).
    """
    os.environ.update(FAKE_CREDENTIALS)
    signer = Signer.from_pem(Path(key_pem).read_bytes())
    prepared = release(Path(project), "1.0.0", Path(artifact))
    registry = s3_registry(endpoint, prefix)
    registry.storage.list("keys/")  # client, connection, service model loaded
    growth = peak_growth(lambda: publish(registry, prepared, signer))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"growth_mb": growth / MB, "maxrss_mb": maxrss / MB}))


def memory(endpoint: str, project: Path, key: Path, tmp: Path, sizes: list[int]) -> None:
    measured = {}
    for size_mb in sizes:
        artifact = make_file(tmp / f"artifact-{size_mb}.bin", size_mb * MB)
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--memory-child",
                endpoint,
                str(project),
                str(artifact),
                f"mem-{size_mb}",
                str(key),
            ],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, **FAKE_CREDENTIALS},
        ).stdout
        measured[size_mb] = json.loads(out.strip().splitlines()[-1])
        artifact.unlink()
        got = measured[size_mb]
        print(
            f"{size_mb:4d} MB artifact: peak RSS growth during publish "
            f"{got['growth_mb']:6.1f} MB, ru_maxrss {got['maxrss_mb']:6.1f} MB"
        )
    small, medium, *_, large = sizes
    budget = 0.25 * (medium - small)
    maxrss = measured[medium]["maxrss_mb"] - measured[small]["maxrss_mb"]
    report(
        f"peak memory (ru_maxrss) does not grow with artifact size ({small} -> {medium} MB: "
        f"< {budget:.1f} MB more)",
        maxrss < budget,
        f"+{maxrss:.1f} MB",
    )
    # ru_maxrss is dominated by imports; the sampled growth of the publish itself,
    # between two sizes that both go up in parts, shows whether uploads stream.
    half = sizes[-2]
    budget = 0.1 * (large - half)
    growth = measured[large]["growth_mb"] - measured[half]["growth_mb"]
    report(
        f"RSS growth during publish stays flat ({half} -> {large} MB: < {budget:.0f} MB more)",
        growth < budget,
        f"{measured[half]['growth_mb']:.1f} -> {measured[large]['growth_mb']:.1f} MB",
    )


# --- 4. status on 50 models --------------------------------------------------------------------


def status(project: Path, signer: Signer, tmp: Path, count: int) -> None:
    root = tmp / "fifty"
    registry = Registry(open_storage(f"file://{root}"))
    base = release(project, "1.0.0")
    start = time.perf_counter()
    for i in range(count):
        record = base.record.model_copy(update={"model": f"model-{i:02d}"})
        publish(registry, PreparedRelease(record=record, blobs=base.blobs), signer)
    made = time.perf_counter() - start
    edgereg = Path(sys.executable).with_name("edgereg")
    env = {**os.environ, "PATH": f"{edgereg.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    timings = {}
    for args in (["status"], ["status", "--json"]):
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            done = subprocess.run(
                [str(edgereg), *args, "--registry", f"file://{root}"],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(time.perf_counter() - t)
        timings[" ".join(args)] = statistics.median(runs)
        if args[-1] == "--json":
            assert len(json.loads(done.stdout)) == count
    t = time.perf_counter()
    subprocess.run([str(edgereg), "--help"], env=env, capture_output=True, check=True)
    startup = time.perf_counter() - t
    print(
        f"{count} models published through the library in {made:.1f}s; "
        + ", ".join(f"`edgereg {k}` {v:.2f}s" for k, v in timings.items())
        + f" (median of 3; `edgereg --help` alone {startup:.2f}s)"
    )
    worst = max(timings.values())
    report(
        f"`edgereg status` on {count} models answers in under a second",
        worst < 1.0,
        f"{worst:.2f}s",
    )


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--memory-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child)
        return

    os.environ.update(FAKE_CREDENTIALS)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "EDGEREG_S3_ENDPOINT_URL"):
        os.environ.pop(name, None)
    with MotoServer() as endpoint, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        make_client(endpoint).create_bucket(Bucket=BUCKET)
        t = time.perf_counter()
        project = build_project(tmp / "project")
        print(f"moto server {endpoint}; tiny project built in {time.perf_counter() - t:.1f}s")
        private_pem, _ = generate_key()
        key = tmp / "key.pem"
        key.write_bytes(private_pem)
        key.chmod(0o600)
        signer = Signer.from_pem(private_pem)
        big = make_file(tmp / "big.bin", args.size_mb * MB)

        print("\n1. publishing again")
        again(endpoint, project, signer)
        print("\n2. throughput")
        throughput(endpoint, project, signer, big, args.rounds)
        print("\n3. memory")
        memory(endpoint, project, key, tmp, [5, args.size_mb, 4 * args.size_mb, 8 * args.size_mb])
        print("\n4. status")
        status(project, signer, tmp, args.models)
        shutil.rmtree(tmp / "fifty", ignore_errors=True)

    failed = [target for target, passed, _ in results if not passed]
    print(f"\n{len(results) - len(failed)}/{len(results)} targets met")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
