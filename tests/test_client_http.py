"""The client SDK against real HTTP on loopback: happy paths, attacks, failures, resume.

The registry is written with the library (edgereg.registry) and served by a
static file server (tests/statichttp.py, or the stdlib's plain
SimpleHTTPRequestHandler): no edgereg code on the server side, which is the
path to S3 and a CDN.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import functools
import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from clientkit import Kit
from statichttp import StaticServer, TcpProxy, free_port

from edgereg.cli.pull import pull_command
from edgereg.client import Client, DeviceProfile, FetchResult, TrustedKeys
from edgereg.config import RuntimeHints
from edgereg.registry import PreparedRelease, Registry
from edgereg.registry import _transitions as transitions
from edgereg.rollout import cohort_bucket, in_cohort
from edgereg.signing import Signer, generate_key
from edgereg.storage import open_storage
from edgereg.wire import (
    Manifest,
    ManifestEntry,
    ReleaseRecord,
    ReleaseVariant,
    blob_path,
    from_bytes,
    sign_document,
)

HIGH_SIZE = 300_000
LOW_SIZE = 120_000


def new_signer() -> Signer:
    return Signer.from_pem(generate_key()[0])


@dataclass
class Reg:
    """A registry directory written with the library, plus helpers to change it."""

    root: Path
    signer: Signer
    sources: Path
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc).replace(microsecond=0)
    blobs: dict[tuple[str, str, str], bytes] = field(default_factory=dict)

    @property
    def registry(self) -> Registry:
        return Registry(open_storage(str(self.root)), clock=self.now)

    def publish(
        self,
        version: str,
        *,
        model: str = "digits",
        percent: float | None = None,
        min_runtime: str = "3.6.1",
        promote: bool = False,
    ) -> None:
        variants: dict[str, ReleaseVariant] = {}
        files: dict[str, Path] = {}
        for name, tier, size in (("fp32", "high", HIGH_SIZE), ("int8", "low", LOW_SIZE)):
            data = random.Random(f"{model}-{version}-{name}").randbytes(size)
            digest = hashlib.sha256(data).hexdigest()
            path = self.sources / f"{model}-{version}-{name}.mnn"
            path.write_bytes(data)
            self.blobs[(model, version, tier)] = data
            files[digest] = path
            variants[name] = ReleaseVariant(
                tier=tier,
                sha256=digest,
                size=size,
                min_mnn_runtime=min_runtime,
                runtime=RuntimeHints(threads=2, backends=["opencl", "cpu"]),
            )
        record = ReleaseRecord(
            model=model,
            version=version,
            created=self.now(),
            variants=variants,
            tiers={"high": "fp32", "low": "int8"},
        )
        self.registry.publish(
            PreparedRelease(record=record, blobs=files),
            signer=self.signer,
            percent=percent,
            full=percent is None,
            actor="tests",
            expires_days=30,
        )
        state, _ = self.registry.read_state(model)
        if promote and state is not None and state.candidate is not None:
            self.registry.change(
                model,
                lambda state, now, expires: transitions.promote(
                    state, model, now=now, expires=expires, actor="tests", force=True
                ),
                signer=self.signer,
                expires_days=30,
            )

    def manifest_bytes(self, model: str = "digits", tier: str = "high") -> bytes:
        return (self.root / "manifests" / model / f"{tier}.json").read_bytes()

    def manifest(self, model: str = "digits", tier: str = "high") -> Manifest:
        envelope = json.loads(self.manifest_bytes(model, tier))
        return from_bytes(Manifest, base64.b64decode(envelope["payload"]))

    def blob(self, version: str, tier: str = "high", model: str = "digits") -> bytes:
        return self.blobs[(model, version, tier)]


@pytest.fixture
def reg(tmp_path: Path) -> Reg:
    sources = tmp_path / "sources"
    sources.mkdir()
    return Reg(tmp_path / "registry", new_signer(), sources)


@pytest.fixture
def server(reg: Reg) -> Iterator[StaticServer]:
    with StaticServer(reg.root) as running:
        yield running


def device(device_id: str = "device-1", *, runtime: str | None = "3.6.1") -> DeviceProfile:
    return DeviceProfile(device_id=device_id, ram_mb=4096, cpu_cores=8, mnn_runtime=runtime)


def make_client(
    reg: Reg,
    url: str,
    cache: Path,
    *,
    device_id: str = "device-1",
    tier: str = "high",
    trusted: TrustedKeys | None = None,
    runtime: str | None = "3.6.1",
    clock: Callable[[], datetime] | None = None,
    model: str = "digits",
) -> Client:
    return Client(
        url,
        trusted if trusted is not None else TrustedKeys([reg.signer.public_key]),
        cache,
        model=model,
        device=device(device_id, runtime=runtime),
        tier=tier,
        timeout=5,
        **({"clock": clock} if clock else {}),
    )


def device_in_cohort(manifest: Manifest, inside: bool) -> str:
    assert manifest.salt is not None
    assert manifest.percent is not None
    for index in range(10_000):
        candidate = f"device-{index}"
        if in_cohort(candidate, manifest.salt, manifest.percent) == inside:
            return candidate
    raise AssertionError("no device found")  # pragma: no cover


def assert_installed(result: FetchResult, data: bytes, version: str) -> None:
    assert result.path is not None
    assert result.version == version
    assert result.path.read_bytes() == data
    assert result.sha256 == hashlib.sha256(data).hexdigest()


def no_partial_files(cache: Path) -> bool:
    return not list(cache.rglob("*.part")) and not list(cache.rglob(".tmp-*"))


def later(days: int) -> Callable[[], datetime]:
    return lambda: datetime.now(timezone.utc) + timedelta(days=days)


# --- happy paths ----------------------------------------------------------------


def test_plain_static_server_stable_then_nothing_new(reg: Reg, tmp_path: Path) -> None:
    """The stdlib's SimpleHTTPRequestHandler: no ETag, no Range, no edgereg code."""
    reg.publish("1.0.0", promote=True)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(reg.root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"  # no trailing slash on purpose
        client = make_client(reg, url, tmp_path / "cache")
        first = client.fetch()
        assert first.ok, first.error
        assert_installed(first, reg.blob("1.0.0"), "1.0.0")
        assert (first.variant, first.is_candidate, first.updated) == ("fp32", False, True)
        assert first.downloaded_bytes == HIGH_SIZE
        assert first.runtime == RuntimeHints(threads=2, backends=["opencl", "cpu"])
        second = client.fetch()
        assert second.ok
        assert not second.updated
        assert second.downloaded_bytes == 0
        assert client.current() == second
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_hint_rule_changes_the_runtime_without_a_download(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    """Decision 0008: the first matching rule's runtime, applied at each verified manifest."""
    reg.publish("1.0.0", promote=True)
    declared = RuntimeHints(threads=2, backends=["opencl", "cpu"])

    def client() -> Client:
        # An armv9 phone (i8mm) with 8 cores: the hint facts the rules match.
        return Client(
            server.url,
            TrustedKeys([reg.signer.public_key]),
            tmp_path / "cache",
            model="digits",
            device=device("device-1"),
            tier="high",
            cpu_features={"dotprod", "fp16", "i8mm"},
            timeout=5,
        )

    def hint(*rules: dict[str, Any]) -> None:
        manifest = reg.manifest()
        assert isinstance(manifest.stable, ManifestEntry)
        stable = ManifestEntry.model_validate(
            {**manifest.stable.model_dump(), "runtime_hints": list(rules) or None}
        )
        changed = manifest.model_copy(update={"stable": stable, "sequence": manifest.sequence + 1})
        path = reg.root / "manifests" / "digits" / "high.json"
        path.write_bytes(sign_document(changed, [reg.signer]))

    phone = client()
    first = phone.fetch()
    assert first.ok, first.error
    assert (first.runtime, first.runtime_rule) == (declared, None)
    rule = {"runtime": {"threads": 4, "backends": ["cpu"]}, "percent": 100.0, "salt": "0d15ea5e"}
    hint(
        {**rule, "match": {"cpu_class": "armv8"}},
        {**rule, "match": {"cpu_class": "armv9", "cores": 8}},
    )
    hinted = phone.fetch()
    assert hinted.ok, hinted.error
    assert (hinted.updated, hinted.downloaded_bytes, hinted.version) == (False, 0, "1.0.0")
    assert hinted.runtime == RuntimeHints(threads=4, backends=["cpu"])
    assert hinted.runtime_rule == 1
    assert hinted.members["digits"].runtime_rule == 1
    # Kept with the install: an app start reads it without the network.
    assert client().current() == dataclasses.replace(hinted, not_modified=False, cohort=None)
    hint()  # the rule removed (a rollback of the hint): the declared runtime again
    back = phone.fetch()
    assert (back.runtime, back.runtime_rule, back.downloaded_bytes) == (declared, None, 0)


def test_candidate_in_cohort_stable_outside(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    reg.publish("1.1.0", percent=50)
    manifest = reg.manifest()
    inside, outside = device_in_cohort(manifest, True), device_in_cohort(manifest, False)

    got_in = make_client(reg, server.url, tmp_path / "in", device_id=inside).fetch()
    assert got_in.ok, got_in.error
    assert_installed(got_in, reg.blob("1.1.0"), "1.1.0")
    assert got_in.is_candidate

    got_out = make_client(reg, server.url, tmp_path / "out", device_id=outside).fetch()
    assert got_out.ok, got_out.error
    assert_installed(got_out, reg.blob("1.0.0"), "1.0.0")
    assert not got_out.is_candidate

    low = make_client(reg, server.url, tmp_path / "low", device_id=outside, tier="low").fetch()
    assert_installed(low, reg.blob("1.0.0", "low"), "1.0.0")
    assert low.variant == "int8"
    # Each result says where its device stands: its bucket against 50 % (5000).
    assert manifest.salt is not None
    for result, device, inside_it in ((got_in, inside, True), (got_out, outside, False)):
        assert result.cohort is not None
        assert result.cohort.bucket == cohort_bucket(device, manifest.salt)
        assert (result.cohort.threshold, result.cohort.percent) == (5000, 50)
        assert result.cohort.inside is inside_it
        assert (result.cohort.bucket < 5000) is inside_it
    assert "inside the cohort" in got_in.cohort.describe()  # type: ignore[union-attr]
    assert "outside the cohort" in got_out.cohort.describe()  # type: ignore[union-attr]


def test_pull_explain_prints_the_cohort_bucket_against_the_percentage(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    reg.publish("1.1.0", percent=50)
    manifest = reg.manifest()
    assert manifest.salt is not None
    outside = device_in_cohort(manifest, False)
    key = write_public_key(reg, tmp_path)
    args = ["digits", "--registry", server.url, "--device-id", outside, "--tier", "high"]
    args += ["--trusted-key", str(key), "--out", str(tmp_path / "out")]
    text = CliRunner().invoke(pull_command, [*args, "--explain"])
    assert text.exit_code == 0, text.output
    bucket = cohort_bucket(outside, manifest.salt)
    assert (
        f"cohort: bucket {bucket} of 10000; the candidate is at 50% (buckets below 5000): "
        "outside the cohort"
    ) in text.stderr
    data = json.loads(CliRunner().invoke(pull_command, [*args, "--json"]).stdout)
    assert data["cohort"] == {
        "bucket": bucket,
        "threshold": 5000,
        "percent": 50,
        "paused": False,
        "inside": False,
    }


def test_first_release_canary_outside_cohort_gets_nothing(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", percent=5)
    outside = device_in_cohort(reg.manifest(), False)
    result = make_client(reg, server.url, tmp_path / "c", device_id=outside).fetch()
    assert result.ok
    assert result.path is None
    assert result.downloaded_bytes == 0


def test_pull_explain_outside_a_first_release_canary_names_the_canary(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    """Issue #30: --explain said "no rollout in progress" under "the first release is a canary"."""
    reg.publish("1.0.0", percent=5)
    manifest = reg.manifest()
    assert manifest.salt is not None
    outside = device_in_cohort(manifest, False)
    key = write_public_key(reg, tmp_path)
    args = ["digits", "--registry", server.url, "--device-id", outside, "--tier", "high"]
    args += ["--trusted-key", str(key), "--out", str(tmp_path / "out")]
    text = CliRunner().invoke(pull_command, [*args, "--explain"])
    assert text.exit_code == 0, text.output
    assert "the first release is a canary and this device is outside its cohort" in text.stdout
    bucket = cohort_bucket(outside, manifest.salt)
    assert (
        f"cohort: bucket {bucket} of 10000; the candidate is at 5% (buckets below 500): "
        "outside the cohort"
    ) in text.stderr
    assert "no rollout in progress" not in text.output
    result = make_client(reg, server.url, tmp_path / "c", device_id=outside).fetch()
    assert result.cohort is not None
    assert not result.cohort.inside


def test_unchanged_check_is_a_304_and_still_verified(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    client = make_client(reg, server.url, tmp_path / "c")
    assert client.fetch().ok
    server.state.reset_counts()
    again = client.fetch()
    assert again.ok
    assert again.not_modified
    assert not again.updated
    assert server.state.statuses() == [304]
    request = server.state.requests[0]
    assert "If-None-Match" in request.headers
    assert request.wire_in + request.wire_out < 400, (request.wire_in, request.wire_out)

    # The cached manifest is verified again on a 304: once expired, nothing changes.
    stale = make_client(reg, server.url, tmp_path / "c", clock=later(60))
    result = stale.fetch()
    assert result.error_code == "expired"
    assert result.not_modified is False
    assert_installed(result, reg.blob("1.0.0"), "1.0.0")


def test_file_url_and_resume_from_a_partial_file(reg: Reg, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    data = reg.blob("1.0.0")
    cache = tmp_path / "c"
    part = cache / "blobs" / f"{hashlib.sha256(data).hexdigest()}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:100_000])
    result = make_client(reg, reg.root.as_uri(), cache).fetch()
    assert result.ok, result.error
    assert result.downloaded_bytes == HIGH_SIZE - 100_000
    assert_installed(result, data, "1.0.0")
    assert no_partial_files(cache)


# --- attacks ------------------------------------------------------------------


def install_then_publish(reg: Reg, url: str, cache: Path) -> FetchResult:
    """Install 1.0.0, then publish 1.1.0 to everyone: the next fetch would update."""
    reg.publish("1.0.0", promote=True)
    first = make_client(reg, url, cache).fetch()
    assert first.ok, first.error
    reg.publish("1.1.0", promote=True)
    return first


def assert_kept(result: FetchResult, reg: Reg, code: str) -> None:
    assert result.error_code == code, result.error
    assert result.error
    assert_installed(result, reg.blob("1.0.0"), "1.0.0")
    assert not result.updated


def test_tampered_manifest(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    install_then_publish(reg, server.url, tmp_path / "c")
    envelope = json.loads(reg.manifest_bytes())
    payload = base64.b64decode(envelope["payload"]).replace(b'"threads":2', b'"threads":9')
    envelope["payload"] = base64.b64encode(payload).decode()
    server.state.overrides["manifests/digits/high.json"] = json.dumps(envelope).encode()
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert_kept(result, reg, "bad-signature")
    assert server.state.body_bytes("blobs/") == HIGH_SIZE  # only the first install


def test_tampered_blob(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    install_then_publish(reg, server.url, tmp_path / "c")
    bad = bytearray(reg.blob("1.1.0"))
    bad[1234] ^= 0x01
    server.state.overrides[reg.manifest().stable.path] = bytes(bad)  # type: ignore[union-attr]
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert_kept(result, reg, "bad-blob")
    assert no_partial_files(tmp_path / "c")
    assert not (tmp_path / "c" / "blobs" / hashlib.sha256(reg.blob("1.1.0")).hexdigest()).exists()


def test_signature_by_an_untrusted_key(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    stranger = TrustedKeys([new_signer().public_key])
    result = make_client(reg, server.url, tmp_path / "c", trusted=stranger).fetch()
    assert result.error_code == "unknown-key"
    assert result.path is None
    assert server.state.body_bytes("blobs/") == 0


def test_expired_manifest_installs_nothing(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    result = make_client(reg, server.url, tmp_path / "c", clock=later(31)).fetch()
    assert result.error_code == "expired"
    assert result.path is None
    assert server.state.body_bytes("blobs/") == 0


def test_expired_manifest_never_installs_a_new_model(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    install_then_publish(reg, server.url, tmp_path / "c")
    result = make_client(reg, server.url, tmp_path / "c", clock=later(31)).fetch()
    assert_kept(result, reg, "expired")


def test_replayed_older_manifest_is_a_rollback_even_after_restart(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    old = reg.manifest_bytes()
    cache = tmp_path / "c"
    assert make_client(reg, server.url, cache).fetch().ok
    reg.publish("1.1.0", promote=True)
    newer = make_client(reg, server.url, cache).fetch()
    assert newer.ok
    assert newer.version == "1.1.0"

    server.state.overrides["manifests/digits/high.json"] = old
    for _ in range(2):  # a new Client: the highest sequence is persisted
        result = make_client(reg, server.url, cache).fetch()
        assert result.error_code == "rollback"
        assert result.error is not None
        assert "already seen" in result.error
        assert_installed(result, reg.blob("1.1.0"), "1.1.0")


def test_manifest_of_another_model(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    reg.publish("2.0.0", model="sensor", promote=True)
    server.state.overrides["manifests/digits/high.json"] = reg.manifest_bytes("sensor")
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert result.error_code == "wrong-model"
    assert result.path is None


def test_manifest_of_another_tier(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    server.state.overrides["manifests/digits/high.json"] = reg.manifest_bytes(tier="low")
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert result.error_code == "wrong-tier"


def test_oversized_manifest_is_refused_unread(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    server.state.overrides["manifests/digits/high.json"] = b" " * (1024 * 1024)
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert result.error_code == "malformed"
    assert result.error is not None
    assert "more than the limit of 65536" in result.error
    assert result.path is None


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "until-close"])
def test_blob_larger_than_declared(
    reg: Reg, server: StaticServer, tmp_path: Path, announced: bool
) -> None:
    install_then_publish(reg, server.url, tmp_path / "c")
    path = reg.manifest().stable.path  # type: ignore[union-attr]
    server.state.overrides[path] = reg.blob("1.1.0") + b"x" * 50_000
    if not announced:
        server.state.omit_length.add(path)
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert_kept(result, reg, "blob-too-large")
    assert no_partial_files(tmp_path / "c")


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "until-close"])
def test_blob_shorter_than_declared_is_a_bad_blob_not_a_transport_failure(
    reg: Reg, server: StaticServer, tmp_path: Path, announced: bool
) -> None:
    # A complete answer of fewer bytes (rule 14): the server holds another file,
    # so every later fetch would get the same bytes; not a blip retried forever.
    install_then_publish(reg, server.url, tmp_path / "c")
    path = reg.manifest().stable.path  # type: ignore[union-attr]
    server.state.overrides[path] = reg.blob("1.1.0")[:-1]
    if not announced:
        server.state.omit_length.add(path)
    for _ in range(2):
        result = make_client(reg, server.url, tmp_path / "c").fetch()
        assert_kept(result, reg, "bad-blob")
        assert no_partial_files(tmp_path / "c")
    if announced:  # refused on the headers: not one body byte read into the cache
        assert "announces" in (result.error or "")


def test_a_resume_from_a_server_whose_file_is_now_shorter_is_a_bad_blob(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    path = reg.manifest().stable.path  # type: ignore[union-attr]
    cache = tmp_path / "c"
    server.state.drop_after[path] = 100_000  # Content-Length announced, then cut
    cut = make_client(reg, server.url, cache).fetch()
    assert cut.error_code == "transport", cut.error
    assert [p.stat().st_size for p in cache.rglob("*.part")] == [100_000]
    server.state.overrides[path] = reg.blob("1.0.0")[:-10]
    shorter = make_client(reg, server.url, cache).fetch()
    assert (shorter.error_code, shorter.path) == ("bad-blob", None), shorter.error
    assert no_partial_files(cache)


def test_too_new_runtime_falls_back_to_stable_or_is_refused(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    reg.publish("1.1.0", percent=50, min_runtime="3.7.0")
    inside = device_in_cohort(reg.manifest(), True)

    fallback = make_client(reg, server.url, tmp_path / "a", device_id=inside).fetch()
    assert fallback.ok, fallback.error
    assert_installed(fallback, reg.blob("1.0.0"), "1.0.0")
    assert fallback.runtime_fallback
    assert not fallback.is_candidate

    newer_app = make_client(reg, server.url, tmp_path / "b", device_id=inside, runtime="3.7.0")
    assert newer_app.fetch().version == "1.1.0"

    old_app = make_client(reg, server.url, tmp_path / "c", device_id=inside, runtime="3.5.0")
    refused = old_app.fetch()
    assert refused.error_code == "runtime-too-old"
    assert refused.error == (
        "candidate 1.1.0 (fp32) needs MNN 3.7.0, the app has 3.5.0; stable 1.0.0 (fp32) needs "
        "MNN 3.6.1, the app has 3.5.0"
    )
    assert refused.path is None


# --- failures -----------------------------------------------------------------


def test_connection_dropped_mid_download_then_resumed(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    path = reg.manifest().stable.path  # type: ignore[union-attr]
    server.state.drop_after[path] = 100_000
    cache = tmp_path / "c"
    first = make_client(reg, server.url, cache).fetch()
    assert first.error_code == "transport"
    assert first.error is not None
    assert "resumes" in first.error
    assert first.path is None
    parts = list(cache.rglob("*.part"))
    assert [p.stat().st_size for p in parts] == [100_000]

    server.state.reset_counts()
    second = make_client(reg, server.url, cache).fetch()
    assert second.ok, second.error
    assert_installed(second, reg.blob("1.0.0"), "1.0.0")
    blob_requests = [r for r in server.state.requests if r.path == path]
    assert [r.status for r in blob_requests] == [206]
    assert blob_requests[0].headers["Range"] == "bytes=100000-"
    assert server.state.body_bytes(path) == HIGH_SIZE - 100_000
    assert second.downloaded_bytes == HIGH_SIZE - 100_000
    assert no_partial_files(cache)


def test_resume_against_a_server_without_range_restarts_cleanly(reg: Reg, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    path = reg.manifest().stable.path  # type: ignore[union-attr]
    cache = tmp_path / "c"
    with StaticServer(reg.root, ranges=False) as plain:
        plain.state.drop_after[path] = 100_000
        assert make_client(reg, plain.url, cache).fetch().error_code == "transport"
        result = make_client(reg, plain.url, cache).fetch()
        assert result.ok, result.error
        assert result.downloaded_bytes == HIGH_SIZE
        assert_installed(result, reg.blob("1.0.0"), "1.0.0")
        assert no_partial_files(cache)


def test_server_down_keeps_last_known_good(reg: Reg, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    cache = tmp_path / "c"
    with StaticServer(reg.root) as running:
        url = running.url
        assert make_client(reg, url, cache).fetch().ok
    result = make_client(reg, url, cache).fetch()
    assert_kept(result, reg, "transport")
    assert "cannot fetch" in (result.error or "")
    # Offline long after the manifest expired: the installed model stays usable.
    offline = make_client(reg, url, cache, clock=later(365)).fetch()
    assert_kept(offline, reg, "transport")
    # Nothing listening at all.
    nobody = make_client(reg, f"http://127.0.0.1:{free_port()}/", tmp_path / "fresh").fetch()
    assert nobody.error_code == "transport"
    assert nobody.path is None


def test_redirects_are_followed(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    path = reg.manifest().stable.path  # type: ignore[union-attr]
    server.state.redirects["manifests/digits/high.json"] = "/mirror/manifests/digits/high.json"
    server.state.redirects[path] = f"{server.url}mirror/{path}"
    (reg.root / "mirror").symlink_to(reg.root)
    result = make_client(reg, server.url, tmp_path / "c").fetch()
    assert result.ok, result.error
    assert_installed(result, reg.blob("1.0.0"), "1.0.0")


def test_server_error_and_unknown_tier(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    result = make_client(reg, server.url, tmp_path / "c", tier="mid").fetch()
    # Not a blip to retry: the model or tier does not exist there (exit 2 from pull).
    assert result.error_code == "not-found"
    assert result.exception is not None
    assert result.exception.exit_code == 2
    assert result.exception is not None
    assert "404" in result.error
    assert not result.exception.retryable  # type: ignore[attr-defined]


def test_disk_full_keeps_last_known_good(
    reg: Reg, server: StaticServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    install_then_publish(reg, server.url, cache)
    real_write = os.write

    def full_disk(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".part"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    result = make_client(reg, server.url, cache).fetch()
    assert_kept(result, reg, "cache")
    assert "No space left on device" in (result.error or "")
    assert no_partial_files(cache)
    monkeypatch.setattr(os, "write", real_write)
    healed = make_client(reg, server.url, cache).fetch()
    assert healed.ok
    assert healed.version == "1.1.0"
    assert healed.updated


def test_unwritable_part_file_keeps_last_known_good(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    install_then_publish(reg, server.url, cache)
    digest = hashlib.sha256(reg.blob("1.1.0")).hexdigest()
    (cache / "blobs" / f"{digest}.part").mkdir()  # the .part path cannot be written
    result = make_client(reg, server.url, cache).fetch()
    assert_kept(result, reg, "cache")


def test_cache_hit_downloads_nothing(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    cache = tmp_path / "c"
    assert make_client(reg, server.url, cache).fetch().ok
    server.state.reset_counts()
    # App update: a new client on the same cache; another device id; lost bookkeeping.
    again = make_client(reg, server.url, cache, device_id="other-device").fetch()
    (cache / "installed.json").unlink()
    for state in (cache / "state").rglob("*.json"):
        state.unlink()
    reinstall = make_client(reg, server.url, cache).fetch()
    for result in (again, reinstall):
        assert result.ok
        assert result.downloaded_bytes == 0
        assert_installed(result, reg.blob("1.0.0"), "1.0.0")
    assert server.state.body_bytes("blobs/") == 0
    assert reinstall.updated  # nothing was installed after the bookkeeping was lost


# --- edgereg pull ---------------------------------------------------------------


def write_public_key(reg: Reg, tmp_path: Path) -> Path:
    path = tmp_path / "registry.pub.pem"
    path.write_bytes(reg.signer.public_pem())
    return path


def test_pull_command(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    key = write_public_key(reg, tmp_path)
    args = ["digits", "--registry", server.url, "--device-id", "d1", "--tier", "low"]
    args += ["--trusted-key", str(key), "--out", str(tmp_path / "out")]
    text = CliRunner().invoke(pull_command, args)
    assert text.exit_code == 0, text.output
    assert "digits 1.0.0 variant int8 for tier low (stable)" in text.output
    as_json = CliRunner().invoke(pull_command, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["version"] == "1.0.0"
    assert data["downloaded_bytes"] == 0
    assert Path(data["path"]).read_bytes() == reg.blob("1.0.0", "low")


def test_pull_without_a_self_test_fetches_no_probe(tmp_path: Path) -> None:
    """The golden probe is for the self-test: a client that runs none does not download it."""
    kit = Kit(tmp_path / "registry")
    entry = kit.entry("digits", "1.0.0", probe=True)
    kit.publish("digits", entry)
    assert entry.probe is not None
    key = tmp_path / "publisher.pem"
    key.write_bytes(kit.signer.public_pem())
    args = ["digits", "--device-id", "d1", "--tier", "high", "--trusted-key", str(key)]
    with StaticServer(kit.root) as server:
        result = CliRunner().invoke(
            pull_command, [*args, "--registry", server.url, "--out", str(tmp_path / "a"), "--json"]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["members"]["digits"]["probe_path"] is None
        fetched = [r.path for r in server.state.requests]
        assert entry.path in fetched
        assert entry.probe.path not in fetched
        assert data["downloaded_bytes"] == entry.size
        assert not (tmp_path / "a" / entry.probe.path).exists()
        # Unchanged on the next check, and no probe then either.
        server.state.reset_counts()
        again = CliRunner().invoke(
            pull_command, [*args, "--registry", server.url, "--out", str(tmp_path / "a"), "--json"]
        )
        assert json.loads(again.stdout)["version"] == "1.0.0"
        assert [r.path for r in server.state.requests] == ["manifests/digits/high.json"]
        # With --self-test the same release needs its probe (here a broken one: refused).
        server.state.reset_counts()
        checked = CliRunner().invoke(
            pull_command,
            [*args, "--registry", server.url, "--out", str(tmp_path / "b"), "--self-test"],
        )
        assert entry.probe.path in [r.path for r in server.state.requests], checked.output


@pytest.mark.parametrize(("ram_mb", "tier"), [("64000", "high"), ("1000", "low")])
def test_pull_resolves_the_tier_from_models_toml(
    reg: Reg, server: StaticServer, tmp_path: Path, small_toml: str, ram_mb: str, tier: str
) -> None:
    reg.publish("1.0.0", promote=True)
    toml = tmp_path / "models.toml"
    toml.write_text(small_toml, encoding="utf-8")  # tiers high (6 GB, 8 cores), mid, low
    args = ["digits", "--registry", server.url, "--device-id", "d1", "--config", str(toml)]
    args += ["--trusted-key", str(write_public_key(reg, tmp_path)), "--out", str(tmp_path / "o")]
    args += ["--ram-mb", ram_mb, "--cpu-cores", "8", "--json"]
    result = CliRunner().invoke(pull_command, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tier"] == tier
    assert Path(data["path"]).read_bytes() == reg.blob("1.0.0", tier)


def test_pull_without_tier_needs_the_device_profile(reg: Reg, tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    key.write_bytes(reg.signer.public_pem())
    args = ["digits", "--registry", "file:///nowhere", "--device-id", "d"]
    args += ["--trusted-key", str(key), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(pull_command, args)
    assert result.exit_code == 2
    assert "--ram-mb and --cpu-cores" in result.output


def test_pull_needs_keys_and_warns_on_trust_on_first_use(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0", promote=True)
    args = ["digits", "--registry", server.url, "--device-id", "d", "--tier", "high"]
    args += ["--out", str(tmp_path / "out")]
    refused = CliRunner().invoke(pull_command, args)
    assert refused.exit_code == 2
    assert "--unsafe-trust-registry-keys" in refused.output
    tofu = CliRunner().invoke(pull_command, [*args, "--unsafe-trust-registry-keys"])
    assert tofu.exit_code == 0, tofu.output
    assert "WARNING" in tofu.stderr
    assert "trust on first use" in tofu.stderr
    assert "digits 1.0.0 variant fp32" in tofu.stdout


def test_pull_exit_code_on_failure(reg: Reg, server: StaticServer, tmp_path: Path) -> None:
    reg.publish("1.0.0", promote=True)
    other = tmp_path / "other.pem"
    other.write_bytes(new_signer().public_pem())
    args = ["digits", "--registry", server.url, "--device-id", "d", "--tier", "high"]
    args += ["--trusted-key", str(other), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(pull_command, args)
    assert result.exit_code == 5
    assert "update failed (unknown-key)" in result.stderr


def test_blob_path_matches_registry_layout(reg: Reg) -> None:
    reg.publish("1.0.0", promote=True)
    entry = reg.manifest().stable
    assert entry is not None
    assert entry.path == blob_path(entry.sha256)
    assert (reg.root / entry.path).read_bytes() == reg.blob("1.0.0")


# --- through `edgereg serve` ----------------------------------------------------


def test_through_edgereg_serve_happy_path_304_and_resume(tmp_path: Path) -> None:
    import servekit

    fake = servekit.make_registry(tmp_path / "registry", models=("digits",))
    trusted = TrustedKeys([fake.signer.public_key])
    manifest = fake.registry.read_manifest("digits", "high")
    outside = device_in_cohort(manifest, False)
    inside = device_in_cohort(manifest, True)
    size = len(fake.blob("digits", "1.0.0", "high").data)

    def client(url: str, cache: Path, device_id: str) -> Client:
        return Client(
            url, trusted, cache, model="digits", device=device(device_id), tier="high", timeout=5
        )

    with servekit.serve(fake.root) as base_url:
        port = int(base_url.rsplit(":", 1)[1].strip("/"))
        canary = client(base_url, tmp_path / "in", inside).fetch()
        assert canary.ok, canary.error
        assert canary.is_candidate
        assert canary.version == "1.1.0"
        assert canary.path is not None
        assert canary.path.read_bytes() == fake.blob("digits", "1.1.0", "high").data

        cache = tmp_path / "out"
        with TcpProxy(port, cut_after=100_000) as proxy:
            cut = client(proxy.url, cache, outside).fetch()
            assert cut.error_code == "transport", cut.error
            (part,) = cache.rglob("*.part")
            have = part.stat().st_size
            assert 0 < have < size
            resumed = client(proxy.url, cache, outside).fetch()
        assert resumed.ok, resumed.error
        assert resumed.version == "1.0.0"
        assert not resumed.is_candidate
        assert resumed.downloaded_bytes == size - have
        assert resumed.path is not None
        assert resumed.path.read_bytes() == fake.blob("digits", "1.0.0", "high").data

        again = client(base_url, cache, outside).fetch()
        assert again.ok
        assert again.not_modified
        assert again.downloaded_bytes == 0


def avoiding_i8mm(tmp_path: Path) -> tuple[Any, ManifestEntry, ManifestEntry]:
    """A registry whose high stable avoids i8mm and names mid's variant instead.

    Returns the published registry, high's and mid's stable entries.
    """
    import servekit

    from edgereg.registry import manifest_key
    from edgereg.wire import sign_document

    fake = servekit.make_registry(tmp_path / "registry", models=("digits",))
    assert fake.root is not None
    high = fake.registry.read_manifest("digits", "high")
    mid = fake.registry.read_manifest("digits", "mid")
    assert isinstance(high.stable, ManifestEntry)
    assert isinstance(mid.stable, ManifestEntry)
    # The high variant avoids i8mm (MNN's int8 kernel fault); the mid variant of the
    # same release is what such a device installs instead.
    stable = high.stable.model_copy(update={"avoid_cpu": ["i8mm"], "instead": mid.stable})
    signed = high.model_copy(
        update={"stable": stable, "candidate": None, "percent": None, "salt": None}
    )
    (fake.root / manifest_key("digits", "high")).write_bytes(sign_document(signed, [fake.signer]))
    return fake, high.stable, mid.stable


@pytest.mark.parametrize(
    ("features", "tier_blob", "substitute"),
    [
        ({"dotprod", "fp16", "i8mm"}, "mid", "cpu-unsupported"),  # a Cortex-A710 class CPU
        ({"dotprod", "fp16"}, "high", None),  # a Cortex-A76 class CPU
        (None, "high", None),  # features not said: rule (e) skipped
    ],
    ids=["i8mm", "no-i8mm", "not-said"],
)
def test_through_edgereg_serve_a_device_with_an_avoided_cpu_feature_installs_instead(
    tmp_path: Path, features: set[str] | None, tier_blob: str, substitute: str | None
) -> None:
    import servekit

    fake, high, mid = avoiding_i8mm(tmp_path)
    with servekit.serve(fake.root) as base_url:
        result = Client(
            base_url,
            TrustedKeys([fake.signer.public_key]),
            tmp_path / "cache",
            model="digits",
            device=device("d1"),
            tier="high",
            cpu_features=features,
            timeout=5,
        ).fetch()
    assert result.ok, result.error
    assert (result.version, result.substitute, result.fallback) == ("1.0.0", substitute, None)
    chosen = mid if tier_blob == "mid" else high
    assert (result.variant, result.sha256) == (chosen.variant, chosen.sha256)
    assert result.path is not None
    assert result.path.read_bytes() == fake.blob("digits", "1.0.0", tier_blob).data


def test_pull_says_the_cpu_features_and_the_memory_budget(tmp_path: Path) -> None:
    import servekit

    fake, high, mid = avoiding_i8mm(tmp_path)
    key = tmp_path / "registry.pub.pem"
    key.write_bytes(fake.signer.public_pem())
    with servekit.serve(fake.root) as base_url:
        args = ["digits", "--registry", base_url, "--device-id", "d1", "--tier", "high"]
        args += ["--trusted-key", str(key), "--no-report"]

        def pull(out: str, *more: str) -> Any:
            return CliRunner().invoke(pull_command, [*args, "--out", str(tmp_path / out), *more])

        text = pull("a", "--cpu-features", "dotprod, fp16,i8mm")
        assert text.exit_code == 0, text.output
        assert f"variant {mid.variant} for tier high (stable, the variant named for this" in (
            text.output
        )
        data = json.loads(pull("b", "--cpu-features", "none", "--json").stdout)
        assert (data["variant"], data["substitute"]) == (high.variant, None)
        bad = pull("c", "--cpu-features", "I8MM")
        assert bad.exit_code == 2
        assert "not a feature name" in bad.output
        fits = pull("d", "--memory-budget-mb", "64", "--json")
        assert fits.exit_code == 0, fits.output  # no peak_memory_mb published: (d) skipped
        assert pull("e", "--memory-budget-mb", "0").exit_code == 2


# --- finding 3 and 10: a server with no key cannot crash or hold the client ----------------


class HostileServer:
    """A raw TCP server on loopback answering every request the way ``behave`` says.

    ``behave(sock)`` gets the connection after the request was read; it writes
    whatever it likes (slowly, forever, nothing) until the client goes away.
    """

    def __init__(self, behave: Callable[[Any], None]) -> None:
        import socket

        self.behave = behave
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn:
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                self.behave(conn)
            except OSError:
                pass  # the client gave up: what these tests want

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=2)


def _body(data: bytes, *, length: bool = True) -> Callable[[Any], None]:
    def behave(conn: Any) -> None:
        head = b"HTTP/1.1 200 OK\r\n"
        if length:
            head += b"Content-Length: %d\r\n" % len(data)
        conn.sendall(head + b"Connection: close\r\n\r\n" + data)

    return behave


def _trickle_body(conn: Any) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    for _ in range(10_000):
        conn.sendall(b"[")
        time.sleep(0.05)


def _trickle_headers(conn: Any) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for _ in range(10_000):
        conn.sendall(b"X")
        time.sleep(0.05)


def _fast_enough_forever(conn: Any) -> None:
    # 2 KB/s: above the minimum rate, under the manifest limit for ~30 s.
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    for _ in range(100_000):
        conn.sendall(b" " * 200)
        time.sleep(0.1)


def _silence(conn: Any) -> None:
    time.sleep(30)


HOSTILE = [
    # id, server behaviour, client limits, expected error code, fragment, at most seconds
    ("deeply-nested-manifest", _body(b"[" * 60_000), {}, "malformed", "nested 60000", 3),
    (
        "deeply-nested-payload",
        None,  # a signed envelope whose payload nests 60,000 deep: built below
        {},
        "malformed",
        "nested",
        3,
    ),
    (
        "huge-manifest-without-length",
        _body(b" " * 200_000, length=False),
        {},
        "malformed",
        "more than the limit",
        3,
    ),
    ("trickled-body", _trickle_body, {"timeout": 0.5}, "transport", "slower than the minimum", 3),
    (
        "trickled-headers",
        _trickle_headers,
        {"timeout": 0.5},
        "transport",
        "the response headers took longer than 0.5 s",
        3,
    ),
    ("silent-server", _silence, {"timeout": 0.5}, "transport", "took longer than 0.5 s", 3),
    (
        "whole-fetch-deadline",
        _fast_enough_forever,
        {"timeout": 5, "deadline": 1.0},
        "transport",
        "the fetch took longer than its deadline of 1 s",
        4,
    ),
]


def _deep_payload_envelope(signer: Signer) -> bytes:
    from edgereg.signing import sign_envelope

    # Small enough for the 64 KiB limit once in base64: only the depth check stops it.
    return sign_envelope(b"[" * 20_000 + b"]" * 20_000, Manifest.payload_type, [signer])


@pytest.mark.parametrize(
    ("behave", "limits", "code", "fragment", "seconds"),
    [pytest.param(*row[1:], id=row[0]) for row in HOSTILE],
)
def test_a_hostile_server_gets_a_reason_code_never_a_crash_or_a_hang(
    tmp_path: Path,
    behave: Callable[[Any], None] | None,
    limits: dict[str, float],
    code: str,
    fragment: str,
    seconds: float,
) -> None:
    signer = new_signer()
    if behave is None:
        behave = _body(_deep_payload_envelope(signer))
    with HostileServer(behave) as hostile:
        client = Client(
            hostile.url,
            TrustedKeys([signer.public_key]),
            tmp_path / "cache",
            model="digits",
            device=device(),
            tier="high",
            **limits,  # type: ignore[arg-type]
        )
        started = time.monotonic()
        result = client.fetch()  # documented never to raise
        took = time.monotonic() - started
    assert (result.error_code, result.path) == (code, None), result.error
    assert result.error is not None
    assert fragment in result.error
    assert took < seconds, f"held for {took:.1f}s"


def test_pull_against_a_hostile_server_prints_a_reason_not_a_traceback(tmp_path: Path) -> None:
    signer = new_signer()
    key = tmp_path / "registry.pub.pem"
    key.write_bytes(signer.public_pem())
    with HostileServer(_body(b"[" * 60_000)) as hostile:
        result = CliRunner().invoke(
            pull_command,
            [
                "digits",
                "--registry",
                hostile.url,
                "--device-id",
                "d",
                "--tier",
                "high",
                "--trusted-key",
                str(key),
                "--out",
                str(tmp_path / "out"),
                "--timeout",
                "2",
            ],
        )
    assert result.exit_code == 5, result.output
    assert "Traceback" not in result.output
    assert "update failed (malformed)" in result.stderr


def test_a_corrupt_client_state_refuses_instead_of_forgetting_rollback_protection(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0")
    cache = tmp_path / "c"
    assert make_client(reg, server.url, cache).fetch().ok
    sequence_file = cache / "state" / "digits" / "sequence.json"
    assert json.loads(sequence_file.read_text()) == {"highest_sequence": 1}
    for damage in (b"{not json", b'{"highest_sequence": "7"}', b"[]"):
        sequence_file.write_bytes(damage)
        result = make_client(reg, server.url, cache).fetch()
        assert result.error_code == "cache", result.error
        assert "corrupt" in (result.error or "")
        assert str(sequence_file) in (result.error or "")
        assert result.version == "1.0.0"  # the installed model stays
    sequence_file.unlink()
    assert make_client(reg, server.url, cache).fetch().ok  # deleting it is the way out


def test_the_highest_sequence_is_per_model_so_a_new_tier_accepts_no_older_manifest(
    reg: Reg, server: StaticServer, tmp_path: Path
) -> None:
    reg.publish("1.0.0")
    old_low = reg.manifest_bytes(tier="low")  # sequence 1
    reg.publish("1.1.0", percent=5.0)
    cache = tmp_path / "c"
    assert make_client(reg, server.url, cache, tier="high").fetch().ok  # sequence 2 seen
    server.state.overrides["manifests/digits/low.json"] = old_low
    moved = make_client(reg, server.url, cache, tier="low").fetch()  # the device moved tier
    assert moved.error_code == "rollback", moved.error


def test_pull_with_a_tier_models_toml_does_not_declare_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        '[toolchain]\nmnn = "3.6.1"\nonnx = "1.17.0"\nonnxruntime = "1.20.1"\n'
        "[tiers.high]\nmin_ram_mb = 4096\n[tiers.low]\n",
        encoding="utf-8",
    )
    key = tmp_path / "k.pub.pem"
    key.write_bytes(new_signer().public_pem())
    result = CliRunner().invoke(
        pull_command,
        [
            "digits",
            "--registry",
            f"file://{tmp_path}",
            "--device-id",
            "d",
            "--tier",
            "mid",
            "--config",
            str(config),
            "--trusted-key",
            str(key),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "'mid' is not a tier of" in result.output
