"""The documented static-host configuration, run with real nginx (issue 11, finding 7).

The nginx fixture runs the ``server`` block of docs/operations/s3-cdn.md over a
directory registry on loopback. Rows:

* a manifest rewritten with the same size within one second is never
  answered 304 (nginx's ETag is mtime-second + size), checked against nginx's
  defaults too, to show the test catches the bug, and against `edgereg serve`;
* only manifests/, blobs/ and keys/<id>.pem are reachable; not models/, not
  .lock-*/.tmp-* files, not dotfiles, not listings, not symlinks out.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from nginxkit import default_server_block, documented_server_block, run_nginx
from servekit import FakeRegistry, make_registry, serve

from edgereg.signing import generate_key
from edgereg.storage import open_storage

SECRET = b"TOPSECRET-outside-the-registry"


def request(
    url: str, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeRegistry, str, Path]]:
    """A registry with edgereg's own files and planted links, behind the documented nginx."""
    base = tmp_path_factory.mktemp("static")
    fake = make_registry(base / "registry", models=("digits",))
    root = base / "registry"
    (base / "secret.pem").write_bytes(SECRET)
    (base / "outside").mkdir()
    (base / "outside" / "high.json").write_bytes(SECRET)
    (root / "manifests" / "digits" / ".lock-high.json").write_bytes(b"")
    (root / "manifests" / "digits" / ".tmp-high.json-0a1b2c").write_bytes(b"half")
    (root / ".lock-conditional-write-probe").write_bytes(b"probe")
    (root / "keys" / "README.txt").write_bytes(b"notes")
    (root / "keys" / ("e" * 64 + ".pem")).symlink_to(base / "secret.pem")
    (root / "manifests" / "outside").symlink_to(base / "outside", target_is_directory=True)
    (root / "blobs" / "sha256" / ("f" * 64)).symlink_to(base / "secret.pem")
    with run_nginx(root, base) as url:
        yield fake, url, root


# -- exposure -------------------------------------------------------------------------


@dataclass(frozen=True)
class Path_:
    name: str
    path: str  # {blob} and {key} are filled in
    status: int | tuple[int, ...]
    content_type: str | None = None
    cache: str | None = None


PATHS = [
    Path_("manifest", "/manifests/digits/high.json", 200, "application/json", "max-age=60"),
    Path_("blob", "/blobs/sha256/{blob}", 200, "application/octet-stream", "immutable"),
    Path_("public-key", "/keys/{key}.pem", 200, "application/x-pem-file", "max-age=60"),
    Path_("rollout-state", "/models/digits/state.json", 404),
    Path_("release-record", "/models/digits/releases/1.0.0.json", 404),
    Path_("lock-file", "/manifests/digits/.lock-high.json", 404),
    Path_("temp-file", "/manifests/digits/.tmp-high.json-0a1b2c", 404),
    Path_("probe-object", "/.lock-conditional-write-probe", 404),
    Path_("root-listing", "/", 404),
    Path_("directory-listing", "/manifests/digits/", 404),
    Path_("blob-listing", "/blobs/sha256/", 404),
    Path_("not-a-key-under-keys", "/keys/README.txt", 404),
    Path_("key-link-out-of-the-registry", "/keys/" + "e" * 64 + ".pem", (403, 404)),
    Path_("manifest-dir-link-out", "/manifests/outside/high.json", (403, 404)),
    Path_("blob-link-out", "/blobs/sha256/" + "f" * 64, (403, 404)),
    Path_("traversal-into-models", "/manifests/../models/digits/state.json", (400, 404)),
    Path_("encoded-traversal", "/manifests/digits/..%2f..%2fmodels%2fdigits%2fstate.json", 404),
    Path_("uppercase-tier", "/manifests/digits/HIGH.json", 404),
]


@pytest.mark.parametrize("row", PATHS, ids=[p.name for p in PATHS])
def test_only_the_public_paths_are_served(site: tuple[FakeRegistry, str, Path], row: Path_) -> None:
    fake, url, _ = site
    path = row.path.format(blob=fake.blob("digits", "1.1.0", "high").digest, key=fake.signer.key_id)
    status, headers, body = request(url, path)
    assert status in (row.status if isinstance(row.status, tuple) else (row.status,)), path
    assert SECRET not in body
    if status == 200:
        assert headers.get("content-type") == row.content_type
        assert row.cache is not None
        assert row.cache in headers.get("cache-control", "")
        assert headers.get("x-content-type-options") == "nosniff"
    else:
        assert b"digits" not in body  # no history, no listing


def test_manifests_carry_no_validators(site: tuple[FakeRegistry, str, Path]) -> None:
    _, url, _ = site
    status, headers, _ = request(url, "/manifests/digits/high.json")
    assert status == 200
    assert "etag" not in headers


def test_blobs_resume_with_ranges(site: tuple[FakeRegistry, str, Path]) -> None:
    fake, url, _ = site
    blob = fake.blob("digits", "1.1.0", "mid")
    status, headers, body = request(url, f"/blobs/sha256/{blob.digest}", {"Range": "bytes=100-"})
    assert (status, body) == (206, blob.data[100:])
    etag = headers["etag"]  # blobs keep validators: their bytes never change
    status, _, _ = request(url, f"/blobs/sha256/{blob.digest}", {"If-None-Match": etag})
    assert status == 304


def test_documented_config_is_what_nginx_runs(tmp_path: Path) -> None:
    block = documented_server_block(tmp_path, 1234)
    for rule in ("etag off;", "if_modified_since off;", "disable_symlinks on", "return 404;"):
        assert rule in block, rule


# -- a same-size rewrite within one second ---------------------------------------------


def _nginx_documented(root: Path, work: Path):  # type: ignore[no-untyped-def]
    return run_nginx(root, work)


def _nginx_defaults(root: Path, work: Path):  # type: ignore[no-untyped-def]
    return run_nginx(root, work, default_server_block)


def _edgereg_serve(root: Path, work: Path):  # type: ignore[no-untyped-def]
    return serve(root)


HOSTS = {
    # (host, whether a device sees the new manifest)
    "nginx-documented": (_nginx_documented, True),
    "edgereg-serve": (_edgereg_serve, True),
    "nginx-defaults-freeze-devices": (_nginx_defaults, False),
}


def _same_second_rewrite(path: Path, second: bytes) -> bool:
    """Replace the file with ``second`` as publish does; True if its mtime second is unchanged."""
    before = int(path.stat().st_mtime)
    storage = open_storage(str(path.parents[2]))
    storage.put(path.relative_to(path.parents[2]).as_posix(), second)
    return int(path.stat().st_mtime) == before and path.read_bytes() == second


@pytest.mark.parametrize(("host", "fresh"), HOSTS.values(), ids=HOSTS.keys())
def test_a_same_size_rewrite_within_a_second_reaches_devices(
    host: Callable[[Path, Path], object], fresh: bool, tmp_path: Path
) -> None:
    root = tmp_path / "registry"
    storage = open_storage(str(root))
    key = "manifests/digits/high.json"
    old = b'{"payload": "A", "sequence": 41}'
    new = b'{"payload": "B", "sequence": 42}'
    assert len(old) == len(new)
    with host(root, tmp_path) as url:  # type: ignore[attr-defined]
        for _attempt in range(10):
            storage.put(key, old)
            status, headers, body = request(url, f"/{key}")
            assert (status, body) == (200, old)
            # A device (or any cache) sends back every validator it was given.
            validators = {}
            if "etag" in headers:
                validators["If-None-Match"] = headers["etag"]
            if "last-modified" in headers:
                validators["If-Modified-Since"] = headers["last-modified"]
            if _same_second_rewrite(root / key, new):
                break
            time.sleep(0.1)  # the second turned over in between: try again
        else:
            pytest.fail("could not rewrite within one second in 10 tries")
        status, _, body = request(url, f"/{key}", validators)
    if fresh:
        assert (status, body) == (200, new)
    else:
        assert status == 304, "nginx's defaults answer 304: devices keep the old manifest"


def test_a_private_key_in_keys_is_the_one_thing_a_static_server_cannot_catch(
    tmp_path: Path,
) -> None:
    """Documented: nginx serves a private key copied into keys/; edgereg serve does not."""
    root = tmp_path / "registry"
    private, _ = generate_key()
    name = "ab" * 32 + ".pem"
    (root / "keys").mkdir(parents=True)
    (root / "keys" / name).write_bytes(private)
    with serve(root) as url:
        assert request(url, f"/keys/{name}")[0] == 403
    text = (Path(__file__).resolve().parents[1] / "docs/operations/s3-cdn.md").read_text()
    assert "would\nserve a private key copied into `keys/`" in text


def test_the_loopback_port_is_free_after_teardown(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    root.mkdir()
    with run_nginx(root, tmp_path) as url:
        port = urlsplit(url).port
        assert request(url, "/")[0] == 404
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port or 0)) != 0  # nginx is gone
