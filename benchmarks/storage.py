"""Storage benchmark: S3 uploads through edgereg.storage vs bare boto3, on loopback.

Starts its own moto server (tests/s3server.py), then measures in one run:

1. throughput of ``Storage.put_file_if_absent`` vs boto3 ``upload_file`` for
   the same 50 MB file (target: ratio >= 0.5);
2. peak RSS growth of one upload of 5, 50, 200 and 400 MB, each in a fresh
   child process: uploads stream from disk, so growth is bounded by the parts
   in flight (max_concurrency x a few MB of buffers), not by the file size;
3. bytes sent by a second put of the same blob (target: 0);
4. the cost of the conditional-write probe a process runs before its first
   write (three small PUTs, once per process and store), against one small
   conditional PUT.

Usage: .venv/bin/python benchmarks/storage.py [--size-mb 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
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

from edgereg.storage import open_storage  # noqa: E402
from edgereg.storage._s3 import S3Storage  # noqa: E402

MB = 1_000_000
BUCKET = "bench"


def make_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 4 * MB)
            f.write(os.urandom(n))
            left -= n
    return path


def open_s3(endpoint: str) -> S3Storage:
    store = open_storage(f"s3://{BUCKET}/registry", endpoint_url=endpoint)
    assert isinstance(store, S3Storage)
    return store


def body_size(body: Any) -> int:
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if hasattr(body, "__len__"):
        return len(body)
    pos = body.tell()
    end = body.seek(0, os.SEEK_END)
    body.seek(pos)
    return int(end - pos)


class UploadCounter:
    """Counts requests and body bytes an S3 client sends (a botocore event hook)."""

    def __init__(self, client: Any) -> None:
        self.calls: dict[str, int] = {}
        self.bytes = 0
        client.meta.events.register("provide-client-params.s3.*", self._seen)

    def _seen(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls[model.name] = self.calls.get(model.name, 0) + 1
        if "Body" in params:
            self.bytes += body_size(params["Body"])


def throughput(endpoint: str, path: Path, rounds: int) -> tuple[float, float]:
    client = make_client(endpoint)
    store = open_s3(endpoint)
    size = path.stat().st_size
    bare, ours = [], []
    # Warm both up (connections, imports) before timing.
    client.upload_file(str(path), BUCKET, "warm/bare")
    store.put_file_if_absent("warm/ours", path)
    for i in range(rounds):
        start = time.perf_counter()
        client.upload_file(str(path), BUCKET, f"bare/{i}")
        bare.append(size / MB / (time.perf_counter() - start))
        start = time.perf_counter()
        assert store.put_file_if_absent(f"blobs/{i}", path)
        ours.append(size / MB / (time.perf_counter() - start))
        client.delete_object(Bucket=BUCKET, Key=f"bare/{i}")
        store.delete(f"blobs/{i}")
    return statistics.median(bare), statistics.median(ours)


def rss_child(endpoint: str, path: str, key: str, mode: str) -> None:
    """Run in a fresh process: one upload; print peak RSS growth in MB as JSON.

    The peak is sampled every millisecond during the upload; the baseline is
    the RSS after a tiny request has loaded every module. (ru_maxrss cannot be
    used: importing botocore's service models peaks higher than an upload.)
    """
    os.environ.update(FAKE_CREDENTIALS)
    store = open_s3(endpoint)
    client = make_client(endpoint)
    store.put(f"{key}.warm", b"x")
    client.put_object(Bucket=BUCKET, Key=f"{key}.warm2", Body=b"x")

    def upload() -> None:
        if mode == "edgereg":
            assert store.put_file_if_absent(key, Path(path))
        else:
            client.upload_file(path, BUCKET, f"registry/{key}")

    growth = peak_growth(upload)
    print(json.dumps({"growth_mb": growth / MB}))


def rss_growth(endpoint: str, path: Path, key: str, mode: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", endpoint, str(path), key, mode],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **FAKE_CREDENTIALS},
    ).stdout
    growth: float = json.loads(out.strip().splitlines()[-1])["growth_mb"]
    open_s3(endpoint).delete(key)
    return growth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rss-child", nargs=4, metavar=("ENDPOINT", "FILE", "KEY", "MODE"))
    args = parser.parse_args()
    if args.rss_child:
        rss_child(*args.rss_child)
        return

    os.environ.update(FAKE_CREDENTIALS)
    with MotoServer() as endpoint, tempfile.TemporaryDirectory() as tmp:
        make_client(endpoint).create_bucket(Bucket=BUCKET)
        big = make_file(Path(tmp) / "big.bin", args.size_mb * MB)
        print(f"moto server {endpoint}; file {args.size_mb} MB; median of {args.rounds} rounds")

        bare, ours = throughput(endpoint, big, args.rounds)
        ratio = ours / bare
        verdict = "ok" if ratio >= 0.5 else "BELOW TARGET"
        print(f"boto3 upload_file           {bare:8.1f} MB/s")
        print(f"Storage.put_file_if_absent  {ours:8.1f} MB/s")
        print(f"ratio                       {ratio:8.2f}   (target >= 0.5: {verdict})")

        print("peak RSS growth of one upload (fresh process each):")
        growth = {}
        for size_mb in sorted({5, args.size_mb, 200, 400}):
            f = make_file(Path(tmp) / f"f{size_mb}.bin", size_mb * MB)
            growth[size_mb] = rss_growth(endpoint, f, f"rss/{size_mb}", "edgereg")
            bare_mb = rss_growth(endpoint, f, f"rss/bare-{size_mb}", "boto3")
            print(
                f"  {size_mb:4d} MB file: edgereg {growth[size_mb]:6.1f} MB   "
                f"(boto3 upload_file {bare_mb:6.1f} MB)"
            )
            f.unlink()
        concurrency = open_s3(endpoint).max_concurrency
        flat = growth[400] - growth[200] < 0.05 * 200
        print(
            f"  400 MB vs 200 MB: {growth[400] / max(growth[200], 0.1):.2f}x for 2x the data "
            f"({'flat: bounded by' if flat else 'GROWS beyond'} {concurrency} parts in flight); "
            f"50 MB vs 5 MB: {growth[args.size_mb]:.1f} vs {growth[5]:.1f} MB "
            "(single PUT below the 8 MiB multipart threshold, 6 parallel parts above)"
        )

        store = open_s3(endpoint)
        assert store.put_file_if_absent("blobs/again", big)
        counter = UploadCounter(store.client)
        start = time.perf_counter()
        created = store.put_file_if_absent("blobs/again", big)
        elapsed = time.perf_counter() - start
        print(
            f"second put of the same {args.size_mb} MB blob: returned {created}, "
            f"uploaded {counter.bytes} bytes in {elapsed * 1000:.1f} ms, requests {counter.calls}"
        )

        # A bucket this process has not written to yet: its first write probes.
        make_client(endpoint).create_bucket(Bucket=f"{BUCKET}-probe")
        fresh = open_storage(f"s3://{BUCKET}-probe/registry", endpoint_url=endpoint)
        fresh.exists("blobs/warm")  # the boto3 client and a connection, not timed
        start = time.perf_counter()
        fresh.check_conditional_writes()
        probe = time.perf_counter() - start
        start = time.perf_counter()
        fresh.check_conditional_writes()
        cached = time.perf_counter() - start
        start = time.perf_counter()
        fresh.put_if_absent("blobs/small", b"x" * 1000)
        small = time.perf_counter() - start
        print(
            f"conditional-write probe: {probe * 1000:.1f} ms once per process and store "
            f"({probe / small:.1f}x one small conditional PUT of {small * 1000:.1f} ms); "
            f"cached afterwards: {cached * 1e6:.1f} us"
        )


if __name__ == "__main__":
    main()
