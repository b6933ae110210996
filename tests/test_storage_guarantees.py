"""Storage proves its guarantees (issue 11, findings 6 and 10), against real S3 over HTTP.

The stores are moto in server mode, directly (honest) or behind a loopback
proxy that tampers with conditional writes (tests/s3proxy.py): one that
accepts ``If-None-Match``/``If-Match`` and overwrites anyway, and one that
answers 501. Each case is a named row.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from s3proxy import S3Proxy
from s3server import make_client
from servekit import make_registry

from edgereg.errors import StorageError
from edgereg.storage import NotFound, Storage, UnsafeObject, open_storage
from edgereg.storage._local import LocalStorage
from edgereg.storage._s3 import PROBE_KEY, S3Storage

MiB = 1024 * 1024


# -- the conditional-write probe -------------------------------------------------------


@dataclass(frozen=True)
class Store:
    name: str
    mode: str  # the proxy's mode
    error: str | None  # a phrase of the refusal, or None: the store is used


STORES = [
    Store("honest-store", "honest", None),
    Store("store-ignoring-conditions", "ignore", "ignores conditional writes"),
    Store("store-answering-501", "refuse", "does not implement conditional writes"),
    Store("store-answering-400", "refuse-400", "does not implement conditional writes"),
]
WRITES = {
    "put_if_absent": lambda s: s.put_if_absent("blobs/sha256/" + "a" * 64, b"x"),
    "put_if_unchanged": lambda s: s.put_if_unchanged("models/m/state.json", b"{}", None),
    "put": lambda s: s.put("manifests/m/high.json", b"{}"),
    "put_file_if_absent": lambda s: s.put_file_if_absent("blobs/sha256/" + "b" * 64, __file__),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
@pytest.mark.parametrize("store", STORES, ids=[s.name for s in STORES])
def test_the_first_write_proves_conditional_writes(
    store: Store, write: Any, moto_endpoint: str, s3_bucket: str, s3_client: Any
) -> None:
    with S3Proxy(moto_endpoint, store.mode) as proxy:
        storage = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=proxy.url)
        if store.error is None:
            write(storage)
            return
        with pytest.raises(StorageError) as info:
            write(storage)
    error = info.value
    assert store.error in error.message
    assert error.retryable is False
    assert error.exit_code == 6
    assert error.hint is not None
    assert "conditional writes" in error.hint
    assert "credentials" not in error.diagnostics().lower()
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert keys in ([], [f"reg/{PROBE_KEY}"]), "nothing of the registry was written"


def test_the_dishonest_proxy_really_overwrites(moto_endpoint: str, s3_bucket: str) -> None:
    """The rows above mean something only if the proxy's store really loses writes."""
    with S3Proxy(moto_endpoint, "ignore") as proxy:
        client = make_client(proxy.url)
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"first")
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"second", IfNoneMatch="*")
        assert client.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"second"


def test_a_registry_is_never_written_to_a_dishonest_store(
    moto_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    """Two rollouts at once on such a store both 'succeeded' and lost a change: now none starts."""
    with S3Proxy(moto_endpoint, "ignore") as proxy:
        storage = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=proxy.url)
        with pytest.raises(StorageError, match="ignores conditional writes") as info:
            make_registry(storage, models=("digits",), workdir=tmp_path)
    assert info.value.retryable is False
    assert not [key for key in storage.list() if not key.startswith(".")]


def test_reads_need_no_probe(moto_endpoint: str, s3_bucket: str, tmp_path: Path) -> None:
    honest = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=moto_endpoint)
    make_registry(honest, models=("digits",), workdir=tmp_path)
    with S3Proxy(moto_endpoint, "ignore") as proxy:
        storage = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=proxy.url)
        assert storage.get("manifests/digits/high.json")
        assert not any(PROBE_KEY in line for line in proxy.requests)


def test_the_probe_runs_once_per_process_and_store(moto_endpoint: str, s3_bucket: str) -> None:
    with S3Proxy(moto_endpoint, "honest") as proxy:
        for _ in range(3):
            storage = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=proxy.url)
            storage.put("manifests/m/high.json", b"{}")
            storage.check_conditional_writes()
    probes = [line for line in proxy.requests if PROBE_KEY in line]
    assert len(probes) == 3, probes  # one create and two writes that must be refused
    assert all(line.endswith("(if)") for line in probes)


def test_the_probe_object_is_not_a_registry_key(moto_endpoint: str, s3_bucket: str) -> None:
    storage = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=moto_endpoint)
    storage.put("manifests/m/high.json", b"{}")
    assert storage.list() == ["manifests/m/high.json"]


def test_an_unreachable_store_is_not_cached_as_a_verdict(
    s3_env: None, closed_port: int, moto_endpoint: str, s3_bucket: str
) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    storage = S3Storage(s3_bucket, "reg", endpoint_url=url, connect_timeout=0.5, max_attempts=1)
    with pytest.raises(StorageError) as info:
        storage.put("manifests/m/high.json", b"{}")
    assert info.value.retryable is True  # the network, not the store's rules


def test_a_store_answering_without_etags_is_a_storage_error_not_a_bug(
    moto_endpoint: str, s3_bucket: str
) -> None:
    honest = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=moto_endpoint)
    honest.put("models/m/state.json", b"{}")
    with S3Proxy(moto_endpoint, "no-etag") as proxy:
        storage = open_storage(f"s3://{s3_bucket}/reg", endpoint_url=proxy.url)
        with pytest.raises(StorageError, match="without a valid ETag") as info:
            storage.get_versioned("models/m/state.json")
    assert info.value.retryable is False


# -- Content-Type and Cache-Control on S3 objects -------------------------------------


TYPES = {
    "blob": ("blobs/sha256/" + "c" * 64, "application/octet-stream", "immutable"),
    "manifest": ("manifests/digits/high.json", "application/json", "max-age=60"),
    "state": ("models/digits/state.json", "application/json", "max-age=60"),
    "release": ("models/digits/releases/1.0.0.json", "application/json", "max-age=60"),
    "public-key": ("keys/" + "d" * 64 + ".pem", "application/x-pem-file", "max-age=60"),
}


WAYS = ["put", "put_if_absent", "put_if_unchanged", "put_file_if_absent"]
TYPE_ROWS = [
    pytest.param(*row, how, id=f"{name}-{how}")
    for name, row in TYPES.items()
    for how in [*WAYS, *(["multipart"] if name == "blob" else [])]
]


@pytest.mark.parametrize(("key", "content_type", "cache", "how"), TYPE_ROWS)
def test_objects_carry_content_type_and_cache_control(
    key: str,
    content_type: str,
    cache: str,
    how: str,
    moto_endpoint: str,
    s3_bucket: str,
    s3_client: Any,
    tmp_path: Path,
) -> None:
    storage = S3Storage(s3_bucket, "reg", endpoint_url=moto_endpoint, multipart_threshold=6 * MiB)
    source = tmp_path / "object"
    source.write_bytes(os.urandom(7 * MiB) if how == "multipart" else b"{}")
    if how == "put":
        storage.put(key, b"{}")
    elif how == "put_if_absent":
        assert storage.put_if_absent(key, b"{}")
    elif how == "put_if_unchanged":
        storage.put_if_unchanged(key, b"{}", None)
    else:
        assert storage.put_file_if_absent(key, source)
    head = s3_client.head_object(Bucket=s3_bucket, Key=f"reg/{key}")
    assert head["ContentType"] == content_type
    assert cache in head["CacheControl"]


# -- a bug in a backend is a bug, not "storage unavailable, retry" --------------------


class _Buggy(LocalStorage):
    def _get(self, key: str) -> bytes:
        return len(key) + "x"  # type: ignore[no-any-return, operator]

    def _size(self, key: str) -> int:
        return {}["missing"]  # type: ignore[no-any-return]

    def _list(self, prefix: str) -> list[str]:
        return self.nonexistent  # type: ignore[attr-defined, no-any-return]


class _Flaky(LocalStorage):
    def _get(self, key: str) -> bytes:
        raise OSError(5, "Input/output error")


BUGS = {
    "type-error": (_Buggy, lambda s: s.get("a"), TypeError),
    "key-error": (_Buggy, lambda s: s.size("a"), KeyError),
    "attribute-error": (_Buggy, lambda s: s.list(""), AttributeError),
}


@pytest.mark.parametrize(("cls", "call", "raised"), BUGS.values(), ids=BUGS.keys())
def test_backend_bugs_are_internal_errors(
    cls: type[Storage], call: Any, raised: type[Exception], tmp_path: Path
) -> None:
    storage = cls(tmp_path)  # type: ignore[call-arg]
    with pytest.raises(raised) as info:
        call(storage)
    assert not isinstance(info.value, StorageError)  # the CLI reports it as internal (70)


def test_a_real_storage_failure_stays_a_retryable_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as info:
        _Flaky(tmp_path).get("a")
    assert info.value.retryable is True
    assert info.value.exit_code == 6


def test_the_cli_reports_a_backend_bug_as_internal(tmp_path: Path) -> None:
    """Through the CLI's one error handler: exit 70, not 6."""
    import click
    from click.testing import CliRunner

    from edgereg.cli._common import handle_errors
    from edgereg.errors import ExitCode

    @click.command()
    @handle_errors
    def read() -> None:
        _Buggy(tmp_path).get("a")

    result = CliRunner().invoke(read, [])
    assert result.exit_code == ExitCode.INTERNAL_ERROR
    assert "internal error" in result.output


# -- a directory registry never reads outside its root ----------------------------------


LINKS = {
    # name: (what the key is, the outcome of get/size/exists)
    "link-to-a-file-outside": ("link-out", "unsafe"),
    "link-to-etc-passwd": ("link-passwd", "unsafe"),
    "directory-link-outside": ("dir-link-out", "unsafe"),
    "link-inside-the-registry": ("link-in", "read"),
    "fifo-does-not-hang": ("fifo", "missing"),
    "directory-is-not-an-object": ("directory", "missing"),
}


@pytest.mark.parametrize(("kind", "outcome"), LINKS.values(), ids=LINKS.keys())
def test_local_reads_stay_inside_the_root(kind: str, outcome: str, tmp_path: Path) -> None:
    root = tmp_path / "registry"
    (root / "keys").mkdir(parents=True)
    (root / "keys" / "real.pem").write_bytes(b"inside")
    (tmp_path / "secret.pem").write_bytes(b"outside")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.pem").write_bytes(b"outside")
    key = "keys/x.pem"
    target = root / key
    if kind == "link-out":
        target.symlink_to(tmp_path / "secret.pem")
    elif kind == "link-passwd":
        target.symlink_to("/etc/passwd")
    elif kind == "dir-link-out":
        (root / "manifests").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        key = "manifests/x.pem"
    elif kind == "link-in":
        target.symlink_to("real.pem")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    storage = open_storage(str(root))
    if outcome == "read":
        assert storage.get(key) == b"inside"
        assert storage.size(key) == 6
        assert storage.exists(key)
        with storage.open_read(key) as stream:
            assert stream.read() == b"inside"
        return
    if outcome == "missing":
        assert not storage.exists(key)
        with pytest.raises(NotFound):
            storage.get(key)
        return
    for call in (storage.get, storage.size, storage.exists, storage.open_read):
        with pytest.raises(UnsafeObject) as info:
            call(key)
        assert info.value.retryable is False
        assert "outside the registry root" in info.value.message
        for target_name in ("secret", "elsewhere", "passwd"):  # where it leads is not said
            assert target_name not in info.value.message


def test_a_linked_registry_root_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.json").write_bytes(b"{}")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    assert open_storage(str(tmp_path / "link")).get("a.json") == b"{}"
