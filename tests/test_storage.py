"""Registry storage: the same behaviour on a local directory and on S3 (moto over HTTP)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgereg.errors import ConflictError, StorageError
from edgereg.storage import NotFound, Storage, open_storage
from edgereg.storage._local import LocalStorage
from edgereg.storage._s3 import S3Storage

MiB = 1024 * 1024


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(f"file://{tmp_path}/registry")
    bucket = request.getfixturevalue("s3_bucket")
    endpoint = request.getfixturevalue("moto_endpoint")
    return open_storage(f"s3://{bucket}/team/registry", endpoint_url=endpoint)


@pytest.fixture
def s3_storage(s3_bucket: str, moto_endpoint: str) -> S3Storage:
    store = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=moto_endpoint)
    assert isinstance(store, S3Storage)
    return store


def race(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run fn(0..n-1) in n threads released at the same instant; return results/errors."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# -- behaviour shared by every backend ------------------------------------------------


def test_put_get_roundtrip(storage: Storage) -> None:
    storage.put("keys/abc.pub", b"public key")
    assert storage.get("keys/abc.pub") == b"public key"
    assert storage.exists("keys/abc.pub")
    assert storage.size("keys/abc.pub") == 10
    storage.put("keys/abc.pub", b"rotated")
    assert storage.get("keys/abc.pub") == b"rotated"


def test_reads_ranges_and_streams(storage: Storage) -> None:
    data = bytes(range(256)) * 100
    assert storage.put_if_absent("blobs/sha256/x", data)
    assert storage.get_range("blobs/sha256/x", 10, 5) == data[10:15]
    assert storage.get_range("blobs/sha256/x", len(data) - 3, 100) == data[-3:]
    assert storage.get_range("blobs/sha256/x", len(data) + 10, 5) == b""
    with storage.open_read("blobs/sha256/x") as stream:
        assert b"".join(stream.iter_chunks(1000)) == data


def test_put_if_absent_never_overwrites(storage: Storage) -> None:
    assert storage.put_if_absent("models/m/releases/1.0.0.json", b"first") is True
    assert storage.put_if_absent("models/m/releases/1.0.0.json", b"second") is False
    assert storage.get("models/m/releases/1.0.0.json") == b"first"


def test_put_file_if_absent_small(storage: Storage, tmp_path: Path) -> None:
    src = tmp_path / "model.mnn"
    src.write_bytes(b"mnn bytes")
    assert storage.put_file_if_absent("blobs/sha256/aa", src) is True
    src.write_bytes(b"other bytes")
    assert storage.put_file_if_absent("blobs/sha256/aa", src) is False
    assert storage.get("blobs/sha256/aa") == b"mnn bytes"


def test_compare_and_swap(storage: Storage) -> None:
    key = "models/m/state.json"
    token = storage.put_if_unchanged(key, b"v1", None)
    with pytest.raises(ConflictError, match="changed by someone else"):
        storage.put_if_unchanged(key, b"v1 again", None)  # must not exist: it does

    data, read_token = storage.get_versioned(key)
    assert (data, read_token) == (b"v1", token)
    token2 = storage.put_if_unchanged(key, b"v2", token)
    assert token2 != token
    assert storage.get_versioned(key) == (b"v2", token2)

    with pytest.raises(ConflictError) as info:
        storage.put_if_unchanged(key, b"stale", token)  # token is out of date
    assert info.value.retryable
    assert info.value.url == storage.url
    assert storage.get(key) == b"v2"


def test_compare_and_swap_on_missing_object_with_token(storage: Storage) -> None:
    token = storage.put_if_unchanged("a/state.json", b"x", None)
    with pytest.raises(ConflictError):
        storage.put_if_unchanged("b/state.json", b"y", token)
    assert not storage.exists("b/state.json")


@pytest.mark.parametrize("round_", range(3))
def test_racing_compare_and_swap_has_one_winner(storage: Storage, round_: int) -> None:
    key = "models/m/state.json"
    token = storage.put_if_unchanged(key, b"base", None)
    results = race(8, lambda i: storage.put_if_unchanged(key, f"writer {i}".encode(), token))

    winners = [i for i, r in enumerate(results) if isinstance(r, str)]
    losers = [r for r in results if isinstance(r, ConflictError)]
    assert len(winners) == 1, results
    assert len(losers) == 7, results
    assert storage.get_versioned(key) == (f"writer {winners[0]}".encode(), results[winners[0]])


def test_racing_first_writers_have_one_winner(storage: Storage) -> None:
    results = race(8, lambda i: storage.put_if_unchanged("s.json", f"w{i}".encode(), None))
    winners = [i for i, r in enumerate(results) if isinstance(r, str)]
    assert len(winners) == 1, results
    assert all(isinstance(r, ConflictError) for i, r in enumerate(results) if i != winners[0])
    assert storage.get("s.json") == f"w{winners[0]}".encode()


def test_racing_put_if_absent_has_one_winner(storage: Storage) -> None:
    results = race(8, lambda i: storage.put_if_absent("blobs/sha256/b", f"w{i}".encode()))
    assert results.count(True) == 1, results
    assert results.count(False) == 7, results
    assert storage.get("blobs/sha256/b") == f"w{results.index(True)}".encode()


def test_list_is_recursive_sorted_and_prefix_filtered(storage: Storage) -> None:
    assert storage.list() == []
    keys = [
        "models/digits/state.json",
        "models/digits/releases/1.0.0.json",
        "models/digitsx/state.json",
        "models/kws/state.json",
        "manifests/digits/high.json",
        "blobs/sha256/ff",
    ]
    for key in keys:
        storage.put(key, b"x")
    assert storage.list() == sorted(keys)
    assert storage.list("models/digits/") == [
        "models/digits/releases/1.0.0.json",
        "models/digits/state.json",
    ]
    assert storage.list("models/digits") == [  # a string prefix, as on S3
        "models/digits/releases/1.0.0.json",
        "models/digits/state.json",
        "models/digitsx/state.json",
    ]
    assert storage.list("models/d") == storage.list("models/digits")
    assert storage.list("nothing/") == []
    assert storage.list("blobs/sha256/ff") == ["blobs/sha256/ff"]


def test_missing_object(storage: Storage) -> None:
    assert not storage.exists("models/none/state.json")
    for read in (storage.get, storage.get_versioned, storage.size, storage.open_read):
        with pytest.raises(NotFound) as info:
            read("models/none/state.json")
        assert info.value.key == "models/none/state.json"
        assert "does not exist" in str(info.value)
        assert not info.value.retryable
    with pytest.raises(NotFound):
        storage.get_range("models/none/state.json", 0, 10)


def test_delete(storage: Storage) -> None:
    storage.put("tmp/x", b"1")
    storage.delete("tmp/x")
    assert not storage.exists("tmp/x")
    storage.delete("tmp/x")  # idempotent


BAD_KEYS = {
    "parent": "../x",
    "parent inside": "a/../b",
    "absolute": "/abs",
    "empty part": "a//b",
    "trailing slash": "a/",
    "dot": "./a",
    "backslash": "a\\b",
    "empty": "",
    "reserved temp name": "blobs/.tmp-x",
    "reserved lock name": ".lock-state.json",
    "part longer than a file name": "models/digits/releases/" + "1" * 256 + ".json",
    "key longer than S3 allows": "/".join(["a" * 200] * 6),
}


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_bad_keys_are_rejected(storage: Storage, key: str) -> None:
    operations: list[Callable[[], object]] = [
        lambda: storage.get(key),
        lambda: storage.put(key, b"x"),
        lambda: storage.put_if_absent(key, b"x"),
        lambda: storage.put_if_unchanged(key, b"x", None),
        lambda: storage.exists(key),
        lambda: storage.delete(key),
    ]
    for operation in operations:
        with pytest.raises(StorageError, match="invalid registry key") as info:
            operation()
        assert not info.value.retryable
    assert storage.list() == []


@pytest.mark.parametrize("prefix", ["../", "/abs", "a//"])
def test_bad_list_prefixes_are_rejected(storage: Storage, prefix: str) -> None:
    with pytest.raises(StorageError, match="invalid registry key"):
        storage.list(prefix)


def test_large_file_streams_in_parts_and_roundtrips(
    storage: Storage, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    src = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with src.open("wb") as f:
        for i in range(20):
            chunk = os.urandom(MiB) if i % 2 else bytes([i]) * MiB
            digest.update(chunk)
            f.write(chunk)
    key = f"blobs/sha256/{digest.hexdigest()}"

    assert storage.put_file_if_absent(key, src) is True
    assert storage.size(key) == 20 * MiB
    copy = hashlib.sha256()
    with storage.open_read(key) as stream:
        for chunk in stream.iter_chunks():
            copy.update(chunk)
    assert copy.hexdigest() == digest.hexdigest()
    assert storage.put_file_if_absent(key, src) is False

    if isinstance(storage, S3Storage):
        # A multipart ETag ends in -<number of parts>: 20 MiB in 8 MiB parts.
        assert storage.multipart_threshold == 8 * MiB < 20 * MiB
        client = request.getfixturevalue("s3_client")
        head = client.head_object(Bucket=storage.bucket, Key=f"{storage.prefix}/{key}")
        assert head["ETag"].strip('"').endswith("-3")
        uploads = client.list_multipart_uploads(Bucket=storage.bucket)
        assert uploads.get("Uploads", []) == []


# -- the shared guard -----------------------------------------------------------------


class _Broken(LocalStorage):
    def _get(self, key: str) -> bytes:
        raise RuntimeError("disk on fire")

    def _put(self, key: str, data: bytes) -> None:
        raise self._conflict(key, "t1")


def test_guard_turns_any_backend_error_into_storage_error(tmp_path: Path) -> None:
    store = _Broken(tmp_path)
    with pytest.raises(StorageError) as info:
        store.get("models/m/state.json")
    error = info.value
    assert type(error) is StorageError
    assert error.url == f"file://{tmp_path}"
    assert "could not get 'models/m/state.json'" in str(error)
    assert "disk on fire" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    assert error.exit_code == 6
    with pytest.raises(ConflictError):  # storage errors pass through unchanged
        store.put("a", b"x")


# -- registry URLs --------------------------------------------------------------------


GOOD_URLS = {
    "file absolute": ("file:///srv/registry", "/srv/registry"),
    "file relative": ("file://registry/main", "{base}/registry/main"),
    "bare relative": ("registry", "{base}/registry"),
    "bare absolute": ("/srv/reg/", "/srv/reg"),
    "dots normalised": ("file:///srv/a/../reg", "/srv/reg"),
}


@pytest.mark.parametrize(("url", "root"), GOOD_URLS.values(), ids=GOOD_URLS.keys())
def test_local_urls(url: str, root: str, tmp_path: Path) -> None:
    store = open_storage(url, base_dir=tmp_path)
    assert isinstance(store, LocalStorage)
    assert str(store.root) == root.format(base=tmp_path)
    assert store.url == f"file://{store.root}"
    assert not store.root.exists()  # opening creates nothing


def test_relative_urls_default_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_storage("file://reg")
    assert isinstance(store, LocalStorage)
    assert store.root == tmp_path / "reg"


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my-bucket/team/registry/", "my-bucket", "team/registry"),
        ("s3://my.bucket.1/r", "my.bucket.1", "r"),
    ],
)
def test_s3_urls(url: str, bucket: str, prefix: str, s3_env: None) -> None:
    store = open_storage(url, endpoint_url="http://127.0.0.1:1")
    assert isinstance(store, S3Storage)
    assert (store.bucket, store.prefix, store.endpoint_url) == (
        bucket,
        prefix,
        "http://127.0.0.1:1",
    )
    assert store.url == (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"AWS_ENDPOINT_URL": "http://aws-env:9000"}, "http://aws-env:9000"),
        (
            {"AWS_ENDPOINT_URL": "http://aws-env:9000", "EDGEREG_S3_ENDPOINT_URL": "http://e:1"},
            "http://e:1",
        ),
    ],
)
def test_s3_endpoint_from_environment(
    env: dict[str, str], expected: str | None, s3_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = open_storage("s3://bucket/x")
    assert isinstance(store, S3Storage)
    assert store.endpoint_url == expected
    assert open_storage("s3://bucket/x", endpoint_url="http://arg:1").endpoint_url == (  # type: ignore[attr-defined]
        "http://arg:1"
    )


BAD_URLS = {
    "ftp": (
        "ftp://x",
        "registry URL 'ftp://x' is not supported; use file://PATH or s3://BUCKET/PREFIX",
    ),
    "http": ("http://example.com/reg", "is not supported"),
    "empty": ("", "registry URL '' is not supported"),
    "blank": ("   ", "is not supported"),
    "s3 without bucket": ("s3://", "no bucket is named"),
    "s3 without bucket, with prefix": ("s3:///prefix", "no bucket is named"),
    "s3 without slashes": ("s3:bucket/x", "is not supported"),
    "s3 bad bucket": ("s3://My_Bucket/x", "not a valid S3 bucket name"),
    "s3 bad prefix": ("s3://bucket/a/../b", "bad prefix"),
    "file without path": ("file://", "is not supported"),
}


@pytest.mark.parametrize(("url", "message"), BAD_URLS.values(), ids=BAD_URLS.keys())
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert message in str(info.value)
    assert "use file://PATH or s3://BUCKET/PREFIX" in str(info.value)
    assert not info.value.retryable


# -- local directory ------------------------------------------------------------------


def test_local_ignores_temp_files_left_by_a_crash(tmp_path: Path) -> None:
    store = open_storage(f"file://{tmp_path}")
    store.put("models/m/state.json", b"good")
    stray = tmp_path / "models" / "m" / ".tmp-state.json-0123456789ab"
    stray.write_bytes(b"half a wri")
    (tmp_path / ".tmp-top-level").write_bytes(b"")
    assert store.list() == ["models/m/state.json"]
    assert store.get("models/m/state.json") == b"good"
    _, token = store.get_versioned("models/m/state.json")
    store.put_if_unchanged("models/m/state.json", b"next", token)
    assert store.get("models/m/state.json") == b"next"


def test_local_lock_files_are_not_listed(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path))
    store.put_if_unchanged("models/m/state.json", b"1", None)
    store.put("keys/k.pub", b"k")
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [".lock-k.pub", "k.pub"]
    assert store.list() == ["keys/k.pub", "models/m/state.json"]


def test_local_failed_write_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_storage(str(tmp_path / "reg"))
    store.put("a/x", b"old")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    for write in (
        lambda: store.put_if_absent("a/y", b"new"),
        lambda: store.put("a/x", b"new"),
        lambda: store.put_if_unchanged("a/x", b"new", store.get_versioned("a/x")[1]),
    ):
        with pytest.raises(StorageError, match="No space left") as info:
            write()
        assert info.value.hint is not None
        assert "full" in info.value.hint
    monkeypatch.undo()

    with pytest.raises(StorageError, match="No such file"):
        store.put_file_if_absent("a/z", tmp_path / "missing.mnn")
    assert sorted(p.name for p in (tmp_path / "reg" / "a").iterdir()) == [".lock-x", "x"]
    assert store.get("a/x") == b"old"


def test_local_missing_root_reads_empty(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path / "not-yet"))
    assert store.list() == []
    assert not store.exists("a")
    with pytest.raises(NotFound):
        store.get("a/b")
    store.put_if_absent("a/b", b"1")
    assert store.list() == ["a/b"]


def test_local_files_follow_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = open_storage(str(tmp_path))
        store.put_if_absent("blobs/sha256/a", b"1")
        store.put("keys/k.pub", b"1")
    finally:
        os.umask(old)
    assert (tmp_path / "blobs/sha256/a").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "keys/k.pub").stat().st_mode & 0o777 == 0o644


def test_local_lock_held_elsewhere_times_out(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path, lock_timeout=0.2)
    store.put("state.json", b"1")
    with (tmp_path / ".lock-state.json").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(StorageError, match="still locked") as info:
            store.put_if_unchanged("state.json", b"2", store.get_versioned("state.json")[1])
        assert time.monotonic() - started < 2
    assert info.value.retryable
    assert store.get("state.json") == b"1"


def test_local_directory_in_the_way(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path))
    store.put("models/m/state.json", b"1")
    with pytest.raises(StorageError, match="directory"):
        store.put_if_absent("models/m", b"x")
    assert not store.exists("models/m")


# -- S3 -------------------------------------------------------------------------------


def test_s3_unreachable_endpoint_fails_fast(s3_env: None, closed_port: int) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    store = open_storage("s3://bucket/reg", endpoint_url=endpoint)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.get("models/m/state.json")
    assert time.monotonic() - started < 10
    assert f"could not reach S3 endpoint {endpoint}" in str(info.value)
    assert info.value.hint is not None
    assert "--endpoint-url" in info.value.hint
    assert info.value.retryable


def test_s3_unknown_bucket_is_named(moto_endpoint: str, s3_env: None, tmp_path: Path) -> None:
    store = open_storage("s3://no-such-bucket-edgereg/reg", endpoint_url=moto_endpoint)
    src = tmp_path / "f"
    src.write_bytes(b"x")
    operations: list[Callable[[], object]] = [
        lambda: store.get("a"),
        lambda: store.exists("a"),
        lambda: store.size("a"),
        lambda: store.list(),
        lambda: store.put("a", b"x"),
        lambda: store.put_if_absent("a", b"x"),
        lambda: store.put_file_if_absent("a", src),
        lambda: store.put_if_unchanged("a", b"x", None),
    ]
    for operation in operations:
        with pytest.raises(StorageError) as info:
            operation()
        assert not isinstance(info.value, NotFound)
        assert "S3 bucket 'no-such-bucket-edgereg' does not exist" in str(info.value)
        assert info.value.hint is not None
        assert "bucket name" in info.value.hint


def test_s3_missing_credentials(
    moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    store = open_storage(f"s3://{s3_bucket}", endpoint_url=moto_endpoint)
    with pytest.raises(StorageError, match="no usable AWS credentials") as info:
        store.exists("a")
    assert info.value.hint is not None
    assert "AWS_ACCESS_KEY_ID" in info.value.hint


def test_s3_keys_live_under_the_prefix(s3_storage: S3Storage, s3_client: Any) -> None:
    client = s3_client
    s3_storage.put("models/m/state.json", b"1")
    client.put_object(Bucket=s3_storage.bucket, Key="outside/x", Body=b"")
    client.put_object(Bucket=s3_storage.bucket, Key="reg/folder/", Body=b"")  # console marker
    listed = client.list_objects_v2(Bucket=s3_storage.bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == [
        "outside/x",
        "reg/.lock-conditional-write-probe",  # see tests/test_storage_guarantees.py
        "reg/folder/",
        "reg/models/m/state.json",
    ]
    assert s3_storage.list() == ["models/m/state.json"]


class _BlindS3(S3Storage):
    """Skips the existence check, as if another writer created the key right after it."""

    def _exists(self, key: str) -> bool:
        return False


def test_s3_multipart_complete_does_not_overwrite(
    s3_bucket: str, moto_endpoint: str, s3_client: Any, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(12 * MiB))
    first = S3Storage(s3_bucket, "reg", endpoint_url=moto_endpoint)
    assert first.put_if_absent("blobs/sha256/c", b"the original")

    blind = _BlindS3(s3_bucket, "reg", endpoint_url=moto_endpoint, part_size=5 * MiB)
    assert blind.put_file_if_absent("blobs/sha256/c", src) is False  # 412 on complete
    assert first.get("blobs/sha256/c") == b"the original"
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket)
    assert uploads.get("Uploads", []) == []  # the losing upload was aborted
