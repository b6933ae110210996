"""`edgereg serve` answers unchanged checks from memory: no file opened, and never a stale ETag.

The server keeps, per registry object, the answer it made from the version it
last read, with that version's storage stamp (a stat; a HEAD on S3). These
tests pin both halves: a 304 (or a 200 of an unchanged document) opens no
file of the registry, counted with the interpreter's audit hook on every
``open``; and a document changed in any way (the registry's own rewrite, an
in-place edit with its mtime put back, a copy keeping the old mtime, a
delete, a link swapped in) is never answered with the old ETag, in one
process, across ``--workers`` and on S3.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from servekit import FakeRegistry, make_registry, serve_process

from edgereg.registry import _transitions as transitions
from edgereg.serve import App, Request, start_in_thread
from edgereg.serve._validators import Remembered
from edgereg.storage import Storage, open_storage
from edgereg.storage._local import LocalStorage

MANIFEST = "manifests/digits/high.json"
#: Long enough on any file system for a fresh file to get a stamp (see LocalStorage).
SETTLE = 0.2


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- counting opens --------------------------------------------------------------------

_opened: list[str] | None = None
_hooked = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str):
        _opened.append(args[0])


@contextlib.contextmanager
def opens_under(root: Path) -> Iterator[list[str]]:
    """Every file under ``root`` this process opens inside the block (os.open, open, io)."""
    global _opened, _hooked
    if not _hooked:  # an audit hook stays for the life of the process: add one, once
        sys.addaudithook(_audit)
        _hooked = True
    seen: list[str] = []
    _opened = seen
    prefix = os.path.join(str(root), "")
    under: list[str] = []
    try:
        yield under
    finally:
        _opened = None
    under += [path for path in seen if path.startswith(prefix)]


def test_the_open_counter_sees_the_server_read_a_file(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    with serve_local(reg, settle=SETTLE) as (url, _), opens_under(tmp_path) as opened:
        assert get(url, MANIFEST)[0] == 200
    assert opened == [f"{reg.root}/{MANIFEST}"]


# -- helpers ---------------------------------------------------------------------------


@contextlib.contextmanager
def serve_local(reg: FakeRegistry, *, settle: float) -> Iterator[tuple[str, App]]:
    """Serve ``reg`` in this process once its files are ``settle`` seconds old."""
    assert reg.root is not None
    time.sleep(settle * 1.5)
    server, url = start_in_thread(LocalStorage(reg.root, settle_seconds=settle))
    try:
        yield url, server.app
    finally:
        server.close()


def get(
    url: str, path: str, etag: str | None = None, method: str = "GET"
) -> tuple[int, str | None, bytes]:
    """(status, ETag, body) of one request on a fresh connection."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, "/" + path, headers={"If-None-Match": etag} if etag else {})
        response = conn.getresponse()
        return response.status, response.getheader("ETag"), response.read()
    finally:
        conn.close()


def pause(reg: FakeRegistry, model: str = "digits") -> None:
    """A rollout step: the registry signs and rewrites every manifest of ``model``."""
    reg.registry.change(
        model,
        lambda state, now, expires: transitions.pause(
            state, model, now=now, expires=expires, actor="test"
        ),
        signer=reg.signer,
        expires_days=30,
    )


# -- a 304 opens nothing ----------------------------------------------------------------


def test_an_unchanged_check_opens_no_file_of_the_registry(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    blob = reg.blob("digits", "1.1.0", "high")
    key = next(p.relative_to(reg.root).as_posix() for p in (reg.root / "keys").iterdir())
    documents = [MANIFEST, "models/digits/state.json", "models/digits/releases/1.1.0.json", key]
    blob_path = f"blobs/sha256/{blob.digest}"
    with serve_local(reg, settle=SETTLE) as (url, _):
        with opens_under(reg.root) as first:
            etags = {path: get(url, path)[1] for path in documents}
            assert get(url, blob_path, f'"{blob.digest}"')[0] == 304
        assert sorted(first) == sorted(f"{reg.root}/{p}" for p in [*documents, blob_path])
        expected = (reg.root / MANIFEST).read_bytes()
        with opens_under(reg.root) as opened:
            for _ in range(10):
                for path in documents:
                    assert get(url, path, etags[path])[:2] == (304, etags[path])
                assert get(url, blob_path, f'"{blob.digest}"')[0] == 304
            # A 200 of an unchanged document: headers and bytes from memory too.
            status, etag, body = get(url, MANIFEST)
            assert (status, etag) == (200, etags[MANIFEST])
            assert body == expected
            assert get(url, MANIFEST, method="HEAD")[:2] == (200, etags[MANIFEST])
        assert opened == []


def test_a_fresh_file_is_read_again_until_it_settles(tmp_path: Path) -> None:
    # A file changed within the last settle_seconds gets no stamp: a second change
    # in the same clock tick of the file system would leave its stat as it was.
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    server, url = start_in_thread(LocalStorage(reg.root, settle_seconds=3600))
    try:
        with opens_under(reg.root) as opened:
            etag = get(url, MANIFEST)[1]
            assert get(url, MANIFEST, etag)[0] == 304
        assert len(opened) == 2
        assert len(server.app.documents) == 0
    finally:
        server.close()


# -- a change is never answered with the old ETag ---------------------------------------


def _rollout_step(reg: FakeRegistry, path: Path) -> None:
    pause(reg)


def _other_bytes(data: bytes) -> bytes:
    """The same length, one byte different (the server does not check signatures)."""
    return data[:10] + (b"X" if data[10:11] != b"X" else b"Y") + data[11:]


def _in_place_same_size_mtime_put_back(reg: FakeRegistry, path: Path) -> None:
    before = path.stat()
    with path.open("r+b") as f:  # the same inode, rewritten
        f.write(_other_bytes(path.read_bytes()))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _copy_keeping_the_old_mtime(reg: FakeRegistry, path: Path) -> None:
    # What `cp -p` or `rsync -a` of another version leaves: a new file, the old mtime.
    before = path.stat()
    other = path.with_name(".tmp-other")
    other.write_bytes(_other_bytes(path.read_bytes()))
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)


def _deleted(reg: FakeRegistry, path: Path) -> None:
    path.unlink()


def _link_out_of_the_registry(reg: FakeRegistry, path: Path) -> None:
    assert reg.root is not None
    outside = reg.root.parent / "outside.json"
    outside.write_bytes(path.read_bytes())  # even the same bytes: never served
    path.unlink()
    path.symlink_to(outside)


CHANGES: dict[str, tuple[Callable[[FakeRegistry, Path], None], int]] = {
    "a rollout step": (_rollout_step, 200),
    "rewritten in place, same size, mtime put back": (_in_place_same_size_mtime_put_back, 200),
    "a copy keeping the old mtime": (_copy_keeping_the_old_mtime, 200),
    "deleted": (_deleted, 404),
    "a link out of the registry": (_link_out_of_the_registry, 403),
}


@pytest.mark.parametrize(("change", "status"), CHANGES.values(), ids=CHANGES.keys())
def test_a_changed_document_is_never_answered_with_the_old_etag(
    tmp_path: Path, change: Callable[[FakeRegistry, Path], None], status: int
) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    path = reg.root / MANIFEST
    with serve_local(reg, settle=SETTLE) as (url, app):
        old = get(url, MANIFEST)[1]
        assert get(url, MANIFEST, old)[0] == 304
        assert app.documents.get(MANIFEST) is not None  # answered from memory so far
        change(reg, path)
        got, etag, body = get(url, MANIFEST, old)
        assert got == status
        if status == 200:
            assert body == path.read_bytes()
            assert etag == f'"{sha(body)}"' != old
            # And once the new version has settled, it is remembered in its turn.
            time.sleep(SETTLE * 1.5)
            assert get(url, MANIFEST)[1] == etag
            assert get(url, MANIFEST, etag)[0] == 304
            assert app.documents.get(MANIFEST).etag == etag  # type: ignore[union-attr]


def test_changes_in_a_row_each_get_their_own_etag(tmp_path: Path) -> None:
    # With the default settle time every change here is "fresh": read every time.
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    server, url = start_in_thread(reg.root)
    try:
        seen = []
        for step in range(4):
            etag = get(url, MANIFEST)[1]
            seen.append(etag)
            if step < 3:
                (pause if step % 2 == 0 else resume)(reg)
                assert get(url, MANIFEST, etag)[0] == 200
        assert len(set(seen)) == 4
    finally:
        server.close()


def resume(reg: FakeRegistry, model: str = "digits") -> None:
    reg.registry.change(
        model,
        lambda state, now, expires: transitions.resume(
            state, model, now=now, expires=expires, actor="test"
        ),
        signer=reg.signer,
        expires_days=30,
    )


def test_a_removed_blob_is_not_answered_304(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    blob = reg.blob("digits", "1.1.0", "high")
    path = f"blobs/sha256/{blob.digest}"
    with serve_local(reg, settle=SETTLE) as (url, _):
        assert get(url, path, f'"{blob.digest}"')[0] == 304
        assert get(url, path, f'"{blob.digest}"')[0] == 304
        (reg.root / path).unlink()
        assert get(url, path, f'"{blob.digest}"')[0] == 404


# -- the same across worker processes, and on S3 ----------------------------------------


def _manifest_304s(metrics: str) -> int:
    found = re.search(
        r'edgereg_http_requests_total\{route="manifest",method="GET",code="304"\} (\d+)', metrics
    )
    return int(found.group(1)) if found else 0


def test_workers_never_answer_a_changed_manifest_with_the_old_etag(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    time.sleep(2.5)  # older than the default settle time: the workers will remember it
    with serve_process(
        tmp_path / "serve.log", "--registry", str(reg.root), "--workers", "2", cwd=tmp_path
    ) as (_, url):
        old = get(url, MANIFEST)[1]
        checks = 40  # each on its own connection: the kernel spreads them over both
        assert all(get(url, MANIFEST, old)[0] == 304 for _ in range(checks))
        counts = {_manifest_304s(get(url, "metrics")[2].decode()) for _ in range(20)}
        assert all(0 < n < checks for n in counts), counts  # both workers answered some
        pause(reg)
        new = f'"{sha((reg.root / MANIFEST).read_bytes())}"'
        answers = [get(url, MANIFEST, old)[:2] for _ in range(checks)]
        assert answers == [(200, new)] * checks
        time.sleep(2.5)
        assert all(get(url, MANIFEST, new)[0] == 304 for _ in range(checks))
        pause_again = [get(url, MANIFEST, new)[:2] for _ in range(4)]
        assert pause_again == [(304, new)] * 4
        resume(reg)
        newest = f'"{sha((reg.root / MANIFEST).read_bytes())}"'
        answers = [get(url, MANIFEST, new)[:2] for _ in range(checks)]
        assert answers == [(200, newest)] * checks


def test_an_s3_registry_never_answers_a_changed_manifest_with_the_old_etag(
    s3_bucket: str, moto_endpoint: str, tmp_path: Path
) -> None:
    storage = open_storage(f"s3://{s3_bucket}/registry", endpoint_url=moto_endpoint)
    reg = make_registry(storage, models=("digits",), workdir=tmp_path)
    server, url = start_in_thread(storage)
    try:
        old = get(url, MANIFEST)[1]
        assert get(url, MANIFEST, old)[0] == 304
        assert server.app.documents.get(MANIFEST) is not None  # S3's ETag is its stamp
        pause(reg)
        new = f'"{sha(storage.get(MANIFEST))}"'
        assert get(url, MANIFEST, old)[:2] == (200, new)
        assert get(url, MANIFEST, new)[0] == 304
        storage.put(MANIFEST, _other_bytes(storage.get(MANIFEST)))
        assert get(url, MANIFEST, new)[0] == 200
        storage.delete(MANIFEST)
        assert get(url, MANIFEST, new)[0] == 404
    finally:
        server.close()


# -- the parts --------------------------------------------------------------------------


def _stamped(storage: Storage) -> Storage:
    """The storage, stamping a local file however fresh (the settle rule has its own test)."""
    if isinstance(storage, LocalStorage):
        return LocalStorage(storage.root, settle_seconds=0)
    return storage


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return _stamped(open_storage(f"file://{tmp_path}/registry"))
    bucket = request.getfixturevalue("s3_bucket")
    endpoint = request.getfixturevalue("moto_endpoint")
    return open_storage(f"s3://{bucket}/registry", endpoint_url=endpoint)


def test_a_stamp_is_of_the_version_read_and_changes_with_it(storage: Storage) -> None:
    storage.put("models/m/state.json", b"one")
    data, stamp = storage.get_stamped("models/m/state.json")
    assert data == b"one"
    assert stamp is not None
    assert storage.stamp("models/m/state.json") == stamp
    assert storage.size_stamped("models/m/state.json") == (3, stamp)
    storage.put("models/m/state.json", b"two")  # same size
    assert storage.stamp("models/m/state.json") != stamp
    data, again = storage.get_stamped("models/m/state.json")
    assert data == b"two"
    assert again == storage.stamp("models/m/state.json") != stamp
    from edgereg.storage import NotFound

    for call in (storage.stamp, storage.get_stamped, storage.size_stamped):
        with pytest.raises(NotFound):
            call("models/m/missing.json")  # type: ignore[operator]


def test_a_local_stamp_waits_for_the_file_to_settle(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path, settle_seconds=SETTLE)
    storage.put("a.json", b"x")
    assert storage.get_stamped("a.json") == (b"x", None)
    assert storage.size_stamped("a.json") == (1, None)
    time.sleep(SETTLE * 1.5)
    data, stamp = storage.get_stamped("a.json")
    assert data == b"x"
    assert stamp is not None
    assert stamp == storage.stamp("a.json")


def test_a_backend_without_stamps_is_read_every_time(tmp_path: Path) -> None:
    class Plain(LocalStorage):  # what any other backend gets from the base class
        _get_stamped = Storage._get_stamped
        _size_stamped = Storage._size_stamped
        _stamp = Storage._stamp

    shutil.copytree(make_registry(tmp_path / "r", models=("digits",)).root, tmp_path / "p")  # type: ignore[arg-type]
    app = App(Plain(tmp_path / "p", settle_seconds=0))
    etag = app.handle(Request("GET", "/" + MANIFEST)).header("ETag")
    assert app.handle(Request("GET", "/" + MANIFEST, {"if-none-match": etag})).status == 304  # type: ignore[dict-item]
    assert len(app.documents) == 0


def test_remembered_is_bounded_by_entries_and_bytes() -> None:
    memory: Remembered[str] = Remembered(max_entries=3, max_bytes=100, max_body_bytes=60)
    for name in "abc":
        memory.put(name, name, 10)
    memory.put("d", "d", 10)  # a fourth: the oldest goes
    assert [memory.get(n) for n in "abcd"] == [None, "b", "c", "d"]
    memory.put("e", "e", 60)  # 30 + 60 > 100 bytes... after the oldest go
    assert memory.get("e") == "e"
    assert memory.bytes <= 100
    assert len(memory) <= 3
    memory.put("f", "f", 61)  # larger than any one body may be: never kept
    assert memory.get("f") is None
    memory.put("e", "e2", 5)  # replacing counts its bytes once
    assert memory.get("e") == "e2"
    memory.forget("e")
    assert memory.get("e") is None


def test_a_remembered_route_still_refuses_other_methods(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    app = App(open_storage(str(reg.root)))
    assert app.handle(Request("GET", "/" + MANIFEST)).status == 200
    for method in ("POST", "PUT", "DELETE"):
        refused = app.handle(Request(method, "/" + MANIFEST))
        assert (refused.status, refused.route) == (405, "manifest")
    assert app.handle(Request("HEAD", "/" + MANIFEST)).status == 200
    assert app.handle(Request("GET", "/" + MANIFEST + "?x=1")).status == 200


# -- the short path answers as the long one ---------------------------------------------


def _raw(url: str, request: bytes) -> bytes:
    """Send one request on its own connection (it asks to close); everything sent back."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _without_date(answer: bytes) -> bytes:
    return re.sub(rb"\r\nDate: [^\r]*", b"", answer, count=1)


def test_an_answer_from_memory_is_the_answer_of_the_long_path(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "registry", models=("digits",))
    assert reg.root is not None
    etag = f'"{sha((reg.root / MANIFEST).read_bytes())}"'
    target = f"/{MANIFEST}"
    heads = {
        "get": f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close",
        "head": f"HEAD {target} HTTP/1.1\r\nHost: x\r\nConnection: close",
        "304": f"GET {target} HTTP/1.1\r\nHost: x\r\nIf-None-Match: {etag}\r\nConnection: close",
        "304 head": f"HEAD {target} HTTP/1.1\r\nIf-None-Match: {etag}\r\nConnection: close",
        "other etag": f'GET {target} HTTP/1.1\r\nIf-None-Match: "other"\r\nConnection: close',
        "weak and a list": f'GET {target} HTTP/1.1\r\nif-none-match:  W/{etag} , "x"\r\n'
        "CONNECTION: keep-alive, close",
        "two headers": f'GET {target} HTTP/1.1\r\nIf-None-Match: "x"\r\nIf-None-Match: {etag}'
        "\r\nConnection: close",
        "bare LF": f"GET {target} HTTP/1.1\nIf-None-Match: {etag}\nConnection: close",
        "star": f"GET {target} HTTP/1.1\r\nIf-None-Match: *\r\nConnection: close",
        "query": f"GET {target}?x=1 HTTP/1.1\r\nIf-None-Match: {etag}\r\nConnection: close",
        "HTTP/1.0": f"GET {target} HTTP/1.0\r\nIf-None-Match: {etag}",
        "folded": f"GET {target} HTTP/1.1\r\nIf-None-Match: {etag}\r\n x\r\nConnection: close",
        "empty body": f"GET {target} HTTP/1.1\r\nContent-Length: 0\r\nConnection: close",
    }
    time.sleep(SETTLE * 1.5)
    remembering = start_in_thread(LocalStorage(reg.root, settle_seconds=SETTLE))
    reading = start_in_thread(LocalStorage(reg.root, settle_seconds=SETTLE))
    reading[0].app.documents = Remembered(max_body_bytes=-1)  # keeps nothing: the long path
    try:
        for url in (remembering[1], reading[1]):  # resolve the targets once
            _raw(url, heads["get"].encode() + b"\r\n\r\n")
            _raw(url, heads["query"].encode() + b"\r\n\r\n")
        with opens_under(reg.root) as opened:
            remembered = {
                name: _raw(remembering[1], head.encode() + b"\r\n\r\n")
                for name, head in heads.items()
            }
        assert opened == []  # every answer above came from memory
        for name, head in heads.items():
            read = _raw(reading[1], head.encode() + b"\r\n\r\n")
            assert _without_date(remembered[name]) == _without_date(read), name
        statuses = {name: int(answer.split(b" ", 2)[1]) for name, answer in remembered.items()}
        assert statuses == {
            "get": 200, "head": 200, "304": 304, "304 head": 304, "other etag": 200,
            "weak and a list": 304, "two headers": 304, "bare LF": 304, "star": 304,
            "query": 304, "HTTP/1.0": 304, "folded": 400, "empty body": 200,
        }  # fmt: skip
        assert remembered["HTTP/1.0"].endswith(b"\r\n\r\n")
        assert b"Connection: close" in remembered["HTTP/1.0"]  # 1.0 without keep-alive
    finally:
        remembering[0].close()
        reading[0].close()
