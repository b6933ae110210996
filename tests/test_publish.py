"""`edgereg keys generate` and `edgereg publish`: what a release manager does first.

Real builds of the tiny project (tests/buildkit.py, built once per session),
real signing, a real directory registry and a real S3-protocol server (moto in
server mode on loopback). Every refused command must leave the registry
byte-for-byte as it was.

The shared helpers and fixtures (the built project, :class:`Site`, snapshots)
live in tests/registrykit.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import stat
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import buildkit
import pytest
from registrykit import (
    KEY_FILE,
    MODEL,
    OTHER,
    PINNED_DIR,
    PUBLIC_KEY_FILE,
    TIERS,
    VERSION,
    Site,
    assert_refused,
    cli,
    dir_files,
    ok,
    s3_site,
    write_key,
)
from s3server import MotoServer, make_client

from edgereg.build.outputs import CONTRACT, HOST_BENCHMARK, METRICS, PROBE, PROVENANCE
from edgereg.errors import ExitCode, TrustError
from edgereg.protocol._json import canonical_json
from edgereg.protocol.contract import BlobRef, IOContract
from edgereg.protocol.probe import GoldenProbe
from edgereg.protocol.wire import from_bytes, to_bytes
from edgereg.registry import Registry
from edgereg.registry._manifests import build_manifests
from edgereg.signing import key_id, load_public_key, read_private_key_file, read_trusted_keys
from edgereg.storage._local import LocalStorage
from edgereg.wire import Manifest, ReleaseRecord, RolloutState, verify_document

CLASSES = {
    buildkit.IMAGE_MODEL: buildkit.IMAGE_CLASSES,
    buildkit.TENSOR_MODEL: buildkit.TENSOR_CLASSES,
}


def _fresh_project(site: Site) -> None:
    """The project as before its first `keys generate`: no key, none pinned."""
    shutil.rmtree(site.root / ".edgereg")
    shutil.rmtree(site.root / PINNED_DIR)


def test_keys_generate_writes_a_private_key_0600_pins_and_publishes_the_public_key(
    site: Site,
) -> None:
    _fresh_project(site)
    result = ok(cli("keys", "generate", "--out", "secrets/release.pem"))
    private = site.root / "secrets/release.pem"
    public = site.root / "secrets/release.pub.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    keyid = key_id(load_public_key(public.read_bytes()))
    assert keyid in result.stdout
    assert b"PRIVATE" not in result.stderr_bytes + result.stdout_bytes
    # Pinned in the project (what every registry command verifies against) ...
    assert (site.root / PINNED_DIR / f"{keyid}.pem").read_bytes() == public.read_bytes()
    # ... and published: the registry of models.toml holds the public key only.
    assert site.objects() == {f"keys/{keyid}.pem": public.read_bytes()}
    assert b"PRIVATE" not in b"".join(site.snapshot().values())

    first = private.read_bytes()
    before = site.snapshot()
    again = cli("keys", "generate", "--out", "secrets/release.pem")
    assert_refused(again, 1, "already exists", "--force")
    assert private.read_bytes() == first
    assert site.snapshot() == before


def _pinned(site: Site) -> list[str]:
    return sorted(path.name for path in (site.root / PINNED_DIR).iterdir())


def _planted_key_in_registry(site: Site) -> None:
    shutil.rmtree(site.root / PINNED_DIR)
    write_key(site.root / "planted.pem")
    pem = (site.root / "planted.pub.pem").read_bytes()
    registry_keys = site.root / "registry" / "keys"
    registry_keys.mkdir(parents=True)
    (registry_keys / f"{key_id(load_public_key(pem))}.pem").write_bytes(pem)


def _nothing_more(site: Site) -> None:
    pass


# Finding 5: a second key is never added without a word. Issue #22: a private key is
# refused inside every configured registry, with --add and --no-publish too.
SECOND_KEY = [
    # id, setup, arguments after `keys generate`, exit code, what the message must say
    (
        "pinned-key-exists",
        _nothing_more,
        ["--out", "k2.pem"],
        1,
        ["already exists", "--add", "keys.md"],
    ),
    (
        "force-does-not-add-a-key",
        _nothing_more,
        ["--out", KEY_FILE, "--force"],
        1,
        ["already exists", "--add"],
    ),
    (
        "registry-has-a-key",
        _planted_key_in_registry,
        ["--out", "k2.pem"],
        1,
        ["published in", "--add"],
    ),
    (
        "out-inside-registry",
        _fresh_project,
        ["--out", "registry/keys/x.pem"],
        1,
        ["inside the registry"],
    ),
    (
        "add-out-inside-registry",
        _nothing_more,
        ["--add", "--out", "registry/keys/oops.pem"],
        1,
        ["inside the registry"],
    ),
    (
        "no-publish-out-inside-registry",
        _nothing_more,
        ["--add", "--no-publish", "--out", "registry/keys/oops.pem"],
        1,
        ["inside the registry"],
    ),
    (
        "out-inside-registry-option",
        _nothing_more,
        ["--add", "--registry", "elsewhere", "--out", "elsewhere/keys/oops.pem"],
        1,
        ["inside the registry"],
    ),
    (
        "out-inside-registry-not-yet-created",
        _fresh_project,
        ["--no-publish", "--out", "registry/oops.pem"],
        1,
        ["inside the registry"],
    ),
    (
        "out-inside-pinned-keys",
        _fresh_project,
        ["--out", f"{PINNED_DIR}/x.pem"],
        1,
        ["inside the pinned publisher keys"],
    ),
]


@pytest.mark.parametrize(
    ("setup", "args", "exit_code", "fragments"),
    [pytest.param(*row[1:], id=row[0]) for row in SECOND_KEY],
)
def test_keys_generate_refuses(
    site: Site,
    setup: Callable[[Site], None],
    args: list[str],
    exit_code: int,
    fragments: list[str],
) -> None:
    setup(site)
    before = dir_files(site.root)
    assert_refused(cli("keys", "generate", *args), exit_code, *fragments)
    assert dir_files(site.root) == before


def test_keys_generate_add_pins_a_second_key_for_rotation(site: Site) -> None:
    (old,) = _pinned(site)
    result = ok(cli("keys", "generate", "--add", "--out", "next.pem", "--json"))
    new_id = json.loads(result.stdout)["key_id"]
    assert _pinned(site) == sorted([old, f"{new_id}.pem"])
    assert f"keys/{new_id}.pem" in site.objects()


def test_keys_generate_no_publish_leaves_the_registry_alone(site: Site) -> None:
    ok(cli("keys", "generate", "--add", "--out", "offline.pem", "--no-publish"))
    assert (site.root / "offline.pem").exists()
    assert site.snapshot() == {}


def test_keys_generate_publishes_to_s3(s3site: Site) -> None:
    _fresh_project(s3site)
    ok(s3site.run("keys generate", "--out", "s3key.pem"))
    public = (s3site.root / "s3key.pub.pem").read_bytes()
    assert s3site.objects() == {f"keys/{key_id(load_public_key(public))}.pem": public}


# --- publish: layout, signatures, manifests ----------------------------------------------


def check_published(
    site: Site,
    *,
    model: str = MODEL,
    version: str = VERSION,
    percent: float,
    full: bool = False,
) -> None:
    """The registry holds exactly DESIGN.md's layout for one release, all of it verified."""
    objects = site.objects()
    config = site.project.load()
    trusted = site.public_keys()  # the key file, not the registry's own keys/
    (keyid,) = trusted
    variants = buildkit.VARIANTS[model]
    artifacts = {v: site.artifact(model, v) for v in variants}
    digests = {v: hashlib.sha256(data).hexdigest() for v, data in artifacts.items()}
    # Each variant's golden probe ships as a blob next to its artifact.
    probes = {v: (site.project.out_dir(model, v) / PROBE).read_bytes() for v in variants}
    probe_digests = {v: hashlib.sha256(data).hexdigest() for v, data in probes.items()}

    assert sorted(objects) == sorted(
        [f"blobs/sha256/{digest}" for digest in digests.values()]
        + [f"blobs/sha256/{digest}" for digest in probe_digests.values()]
        + [
            f"models/{model}/releases/{version}.json",
            f"models/{model}/state.json",
            *(f"manifests/{model}/{tier}.json" for tier in TIERS),
            f"keys/{keyid}.pem",
        ]
    )
    assert objects[f"keys/{keyid}.pem"] == (site.root / PUBLIC_KEY_FILE).read_bytes()
    for variant, digest in digests.items():
        assert objects[f"blobs/sha256/{digest}"] == artifacts[variant]

    record = verify_document(
        ReleaseRecord, objects[f"models/{model}/releases/{version}.json"], trusted
    )
    assert (record.model, record.version) == (model, version)
    assert record.tiers == {tier: name for tier, (name, _) in config.tier_variants(model).items()}
    for variant in variants:
        entry = record.variants[variant]
        out = site.project.out_dir(model, variant)
        assert entry.tier == config.models[model].variants[variant].tier
        assert (entry.sha256, entry.size) == (digests[variant], len(artifacts[variant]))
        # metrics.json, plus the build host's benchmark labelled as host figures, and
        # the measured peak memory the manifest entries announce.
        host = json.loads((out / HOST_BENCHMARK).read_text())
        assert entry.metrics == {
            **json.loads((out / METRICS).read_text()),
            "host_benchmark": {
                key: value
                for key, value in host.items()
                if key not in ("latency", "artifact_sha256", "recipe_sha256")
            },
            "peak_memory_mb": round(host["memory_peak_mb"], 2),
        }
        assert entry.metrics["host_benchmark"]["figures"] == "host"
        assert entry.provenance == json.loads((out / PROVENANCE).read_text())
        assert entry.min_mnn_runtime == entry.provenance["min_mnn_runtime"]
        assert entry.runtime == config.models[model].variants[variant].runtime.hints
        # Self-describing: the contract and the probe the build wrote, the probe by digest.
        assert entry.contract == IOContract.model_validate(json.loads((out / CONTRACT).read_text()))
        assert entry.contract.labels == list(CLASSES[model])
        assert entry.probe == BlobRef.of(probe_digests[variant], len(probes[variant]))
        assert objects[entry.probe.path] == probes[variant]
        probe = from_bytes(GoldenProbe, objects[entry.probe.path])
        assert probe.artifact_sha256 == digests[variant]
    assert record.requires == config.models[model].requires

    state = verify_document(RolloutState, objects[f"models/{model}/state.json"], trusted)
    assert [event.action for event in state.history] == ["publish"]
    if full:
        # A first release published --full is stable for every device: no rollout.
        assert (state.model, state.candidate, state.stable) == (model, None, version)
        assert (state.percent, state.salt, state.full) == (None, None, False)
    else:
        assert (state.model, state.candidate, state.stable) == (model, version, None)
        assert state.percent == percent
        assert state.salt is not None
        assert len(state.salt) >= 8

    for tier in TIERS:
        manifest = verify_document(Manifest, objects[f"manifests/{model}/{tier}.json"], trusted)
        variant = record.tiers[tier]
        assert (manifest.model, manifest.tier) == (model, tier)
        assert manifest.sequence == state.sequence
        assert manifest.expires == state.expires
        if full:
            assert manifest.candidate is None
            entry = manifest.stable
        else:
            assert manifest.stable is None  # a first canary: devices outside get no model yet
            entry = manifest.candidate
        assert entry is not None
        assert entry.version == version
        assert entry.variant == variant
        assert entry.sha256 == digests[variant]
        assert entry.size == len(artifacts[variant])
        assert entry.path == f"blobs/sha256/{digests[variant]}"
        assert entry.runtime == config.models[model].variants[variant].runtime.hints
        # The peak the build measured, so a device can refuse what it cannot hold.
        assert entry.peak_memory_mb == record.variants[variant].metrics["peak_memory_mb"]
        assert entry.peak_memory_mb is not None
        assert entry.peak_memory_mb > 0
        assert manifest.percent == (None if full else percent)
        assert manifest.salt == state.salt
        assert not manifest.paused


def test_publish_canary_writes_the_documented_layout(any_site: Site) -> None:
    result = ok(any_site.run("publish", MODEL, "--canary", "5%", "--actor", "rm@example"))
    assert "5% of devices" in result.stdout
    check_published(any_site, percent=5.0)
    assert any_site.state().history[0].actor == "rm@example"
    report = ok(any_site.run("verify", "--json"))
    assert json.loads(report.stdout) == {
        "ok": True,
        "checked": 1 + 1 + 3 + 3 + 3,  # state, record, artifacts, probes, manifests
        "errors": [],
        "warnings": [],
    }


def test_publish_full(any_site: Site) -> None:
    ok(any_site.run("publish", MODEL, "--full"))
    check_published(any_site, percent=100.0, full=True)


def test_publishing_again_uploads_nothing_and_changes_nothing(any_site: Site) -> None:
    first = json.loads(ok(any_site.run("publish", MODEL, "--canary", "5%", "--json")).stdout)
    assert first["uploaded_blobs"] == 3 + 3  # artifacts and their probes
    assert first["uploaded_bytes"] == sum(
        len(any_site.artifact(MODEL, v))
        + (any_site.project.out_dir(MODEL, v) / PROBE).stat().st_size
        for v in buildkit.VARIANTS[MODEL]
    )
    before = any_site.objects()
    again = json.loads(ok(any_site.run("publish", MODEL, "--canary", "5%", "--json")).stdout)
    assert again == {**first, "already_published": True, "uploaded_blobs": 0, "uploaded_bytes": 0}
    assert any_site.objects() == before


def test_the_same_version_with_other_content_is_refused(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    # A rebuilt variant with another recipe: a different artifact under the same version.
    site.project.edit_table(f"models.{MODEL}.variants.w8", "threads = 1", "threads = 3")
    site.project.build(MODEL, "w8")
    before = site.snapshot()
    assert_refused(
        site.run("publish", MODEL, "--canary", "5%"),
        8,
        f"{MODEL} {VERSION} is already published with other content",
        "--version",
    )
    assert site.snapshot() == before
    # Under a new version it goes out (once the first canary is stable or withdrawn).
    ok(site.run("rollback", MODEL))
    ok(site.run("publish", MODEL, "--canary", "5%", "--version", "1.0.1"))
    assert site.state().candidate == "1.0.1"


def test_version_override(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "12.5%", "--version", "2.3.4-rc.1"))
    check_published(site, version="2.3.4-rc.1", percent=12.5)


def test_status_history_and_verify(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%", "--actor", "alice"))
    ok(site.run("publish", OTHER, "--full", "--actor", "bob"))

    statuses = json.loads(ok(site.run("status", "--json")).stdout)
    assert [s["model"] for s in statuses] == sorted([MODEL, OTHER])
    vision = next(s for s in statuses if s["model"] == MODEL)
    assert vision["candidate"] == VERSION
    assert vision["stable"] is None
    assert vision["percent"] == 5.0
    assert vision["paused"] is False
    assert vision["sequence"] == 1
    assert vision["last_change"].endswith("publish by alice")
    assert [t["tier"] for t in vision["tiers"]] == list(TIERS)  # models.toml order, best first
    assert {t["tier"]: t["candidate_variant"] for t in vision["tiers"]} == {
        "high": "fp32",
        "mid": "int8",
        "low": "w8",
    }
    assert {t["tier"]: t["candidate_size"] for t in vision["tiers"]} == {
        tier: len(site.artifact(MODEL, v))
        for tier, v in (("high", "fp32"), ("mid", "int8"), ("low", "w8"))
    }
    # The first canary has no stable under it: status says loudly who gets nothing.
    assert vision["warnings"] == [
        f"{MODEL}: tiers high, mid, low: 95% of devices (outside the candidate's cohort) get "
        f"no model; there is no stable release (edgereg rollout {MODEL} --next, then promote)"
    ]
    one = json.loads(ok(site.run("status", OTHER, "--json")).stdout)
    assert [s["model"] for s in one] == [OTHER]
    # A first release published --full is stable for everyone at once.
    assert (one[0]["stable"], one[0]["candidate"], one[0]["percent"]) == (VERSION, None, None)
    assert one[0]["warnings"] == []

    shown = ok(site.run("status"))
    table = shown.stdout
    for word in (MODEL, OTHER, VERSION, "5%", "high", "mid", "low", "fp32", "w8"):
        assert word in table
    assert "WARNING: vision: tiers high, mid, low: 95% of devices" in shown.stderr
    assert_refused(site.run("status", "nomodel"), 1, "'nomodel' has no release")

    events = json.loads(ok(site.run("history", MODEL, "--json")).stdout)
    assert [(e["sequence"], e["action"], e["actor"]) for e in events] == [(1, "publish", "alice")]
    assert events[0]["after"] == {
        "stable": None,
        "candidate": VERSION,
        "percent": 5.0,
        "paused": False,
    }
    human = ok(site.run("history", MODEL)).stdout
    assert "publish" in human
    assert "alice" in human
    assert f"{VERSION} @ 5%" in human
    assert_refused(site.run("history", "nomodel"), 1, "'nomodel' has no release")

    report = json.loads(ok(site.run("verify", "--json")).stdout)
    assert report["ok"]
    assert report["errors"] == []
    assert report["warnings"] == []
    assert report["checked"] == 2 * (1 + 1 + 3 + 3 + 3)  # probes are checked too
    assert "22 objects checked, ok" in ok(site.run("verify")).stdout
    assert "22 objects checked, ok" in ok(site.run("verify", "--shallow")).stdout


def test_status_of_an_empty_registry(site: Site) -> None:
    # Before the first publish the registry directory does not exist: an error, not "empty".
    assert_refused(site.run("status"), 6, "does not exist", "edgereg publish")
    (site.root / "registry").mkdir()
    assert json.loads(ok(site.run("status", "--json")).stdout) == []
    assert "no models" in ok(site.run("status")).stdout


# --- keys decide who may publish ---------------------------------------------------------


def test_a_new_key_signs_only_once_it_is_pinned_on_purpose(site: Site) -> None:
    """Commands trust the keys pinned in the project; a publish never adds another one quietly.

    Apps trust a fixed set of keys. A release signed by a key outside that set
    would be rejected by every app, so a stray key is refused, even when its
    public key sits in the registry's keys/; rotating to a new key starts with
    pinning it (`keys generate --add` does).
    """
    ok(site.run("publish", MODEL, "--full"))
    write_key(site.root / "intruder.pem")
    intruder = (site.root / "intruder.pub.pem").read_bytes()
    (site.root / "registry" / "keys" / f"{key_id(load_public_key(intruder))}.pem").write_bytes(
        intruder
    )
    before = site.snapshot()
    assert_refused(
        site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0", "--key", "intruder.pem"),
        5,
        "not one of the publisher keys pinned in the project",
        "keys generate --add",
    )
    assert_refused(site.run("rollout", MODEL, "--to", "1%", "--key", "intruder.pem"), 5)
    assert site.snapshot() == before
    (site.root / "registry" / "keys" / f"{key_id(load_public_key(intruder))}.pem").unlink()

    # Rotation: generate the new key (pinned, and its public key goes into keys/), sign with it.
    ok(cli("keys", "generate", "--add", "--out", "next.pem"))
    ok(site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0", "--key", "next.pem"))
    assert site.registry().verify().ok  # the pinned keys: both
    # An app (or `verify --trusted-key`) that still trusts only the old key rejects it.
    pinned = site.run("verify", "--json", "--trusted-key", PUBLIC_KEY_FILE)
    assert pinned.exit_code == 9
    errors = json.loads(pinned.stdout)["errors"]
    assert any(e.startswith(f"models/{MODEL}/state.json:") for e in errors), errors
    both = site.run(
        "verify", "--json", "--trusted-key", PUBLIC_KEY_FILE, "--trusted-key", "next.pub.pem"
    )
    assert json.loads(ok(both).stdout)["ok"]


def test_signing_with_the_old_and_the_new_key_during_a_rotation(site: Site) -> None:
    """Documents signed by both keys verify for apps that trust either one."""
    ok(site.run("publish", MODEL, "--canary", "5%"))
    ok(cli("keys", "generate", "--add", "--out", "next.pem"))
    ok(site.run("rollout", MODEL, "--to", "25%", "--force", "--key", KEY_FILE, "--key", "next.pem"))
    old_only = site.public_keys(PUBLIC_KEY_FILE)
    new_only = site.public_keys("next.pub.pem")
    for trusted in (old_only, new_only):
        registry = site.registry(trusted=trusted)
        state, _ = registry.read_state(MODEL)
        assert state is not None
        assert state.percent == 25.0
        for tier in TIERS:
            assert registry.read_manifest(MODEL, tier).sequence == state.sequence
    # Once every app trusts the new key, sign with it alone.
    ok(site.run("rollout", MODEL, "--to", "50%", "--force", "--key", "next.pem"))
    new_state, _ = site.registry(trusted=new_only).read_state(MODEL)
    assert new_state is not None
    assert new_state.percent == 50.0
    with pytest.raises(TrustError):
        site.registry(trusted=old_only).read_state(MODEL)


# --- bad input: a clear error, and the registry exactly as before ----------------------


def _no_build(site: Site) -> None:
    shutil.rmtree(site.root / "build")


def _stale_build(site: Site) -> None:
    site.project.edit_table(f"models.{MODEL}.variants.w8", "threads = 1", "threads = 3")


def _rebuilt(site: Site) -> None:
    _stale_build(site)
    site.project.build(MODEL, "w8")


def _failed_gate(site: Site) -> None:
    path = site.project.out_dir(MODEL, "int8") / METRICS
    metrics = json.loads(path.read_text())
    metrics["gates"]["max_accuracy_drop"] = False
    path.write_text(json.dumps(metrics))


def _provenance_without_min_runtime(site: Site) -> None:
    path = site.project.out_dir(MODEL, "int8") / PROVENANCE
    provenance = json.loads(path.read_text())
    del provenance["min_mnn_runtime"]
    path.write_text(json.dumps(provenance))


def _provenance_threads_as_float(site: Site) -> None:
    path = site.project.out_dir(MODEL, "int8") / PROVENANCE
    provenance = json.loads(path.read_text())
    provenance["runtime"]["threads"] = 4.0
    path.write_text(json.dumps(provenance))


def _built_before_probes(site: Site) -> None:
    # What a build made before contracts and probes left: no contract.json, probe.json.
    out = site.project.out_dir(MODEL, "int8")
    provenance = json.loads((out / PROVENANCE).read_text())
    del provenance["contract"], provenance["probe"]
    (out / PROVENANCE).write_text(json.dumps(provenance))
    (out / CONTRACT).unlink()
    (out / PROBE).unlink()


def _probe_edited(site: Site) -> None:
    path = site.project.out_dir(MODEL, "w8") / PROBE
    probe = json.loads(path.read_text())
    probe["tolerance"]["min_cosine"] = -1.0  # a probe anything passes
    path.write_text(json.dumps(probe))


def _no_key(site: Site) -> None:
    shutil.rmtree(site.root / ".edgereg")


def _key_readable_by_others(site: Site) -> None:
    (site.root / KEY_FILE).chmod(0o644)


def _other_key(site: Site) -> None:
    write_key(site.root / "other.pem")


def _nothing(site: Site) -> None:
    pass


def _unpinned(site: Site) -> None:
    shutil.rmtree(site.root / PINNED_DIR)


BAD_PUBLISH = [
    # id, arguments after `publish`, setup, exit code, what the message must say
    ("canary-0", [MODEL, "--canary", "0%"], _nothing, 2, ["--canary", "greater than 0", "'0%'"]),
    ("canary-150", [MODEL, "--canary", "150%"], _nothing, 2, ["at most 100", "'150%'"]),
    ("canary-abc", [MODEL, "--canary", "abc"], _nothing, 2, ["percentage", "'abc'"]),
    ("no-canary-no-full", [MODEL], _nothing, 2, ["--canary PERCENT", "--full"]),
    ("canary-and-full", [MODEL, "--canary", "5%", "--full"], _nothing, 2, ["--full", "not both"]),
    ("unknown-model", ["digits", "--canary", "5%"], _nothing, 2, ["no model 'digits'", MODEL]),
    ("bad-version", [MODEL, "--canary", "5%", "--version", "1.x"], _nothing, 2, ["semantic"]),
    ("no-build", [MODEL, "--canary", "5%"], _no_build, 8, ["not built", "dvc repro"]),
    ("stale-build", [MODEL, "--canary", "5%"], _stale_build, 8, [f"{MODEL}/w8: stale"]),
    ("failed-gate", [MODEL, "--canary", "5%"], _failed_gate, 8, ["int8: failed gates"]),
    (
        "provenance-without-min-runtime",
        [MODEL, "--canary", "5%"],
        _provenance_without_min_runtime,
        8,
        ["int8: build outputs unreadable", "provenance.json: min_mnn_runtime"],
    ),
    (
        "provenance-threads-as-float",
        [MODEL, "--canary", "5%"],
        _provenance_threads_as_float,
        8,
        ["provenance.json: runtime.threads"],
    ),
    (
        "built-before-probes",
        [MODEL, "--canary", "5%"],
        _built_before_probes,
        8,
        ["int8: built before I/O contracts and golden probes existed", "dvc repro"],
    ),
    (
        "probe-edited-after-the-build",
        [MODEL, "--canary", "5%"],
        _probe_edited,
        8,
        ["w8: ", "probe.json differs from the one its provenance records"],
    ),
    ("missing-key", [MODEL, "--canary", "5%", "--key", "nope.pem"], _nothing, 5, ["nope.pem"]),
    ("no-key", [MODEL, "--canary", "5%"], _no_key, 5, ["no signing key", "keys generate"]),
    ("key-0644", [MODEL, "--canary", "5%"], _key_readable_by_others, 5, ["0644", "chmod 600"]),
    ("wrong-key", [MODEL, "--canary", "5%", "--key", "other.pem"], _other_key, 5, ["not one of"]),
    ("unpinned", [MODEL, "--canary", "5%"], _unpinned, 5, ["no publisher key is pinned"]),
    ("url-ftp", [MODEL, "--canary", "5%", "--registry", "ftp://x"], _nothing, 6, ["ftp://x"]),
    ("url-garbage", [MODEL, "--canary", "5%", "--registry", "s3://"], _nothing, 6, ["bucket"]),
    (
        "lower-than-stable",
        [MODEL, "--canary", "5%", "--version", "0.8.0"],
        _nothing,
        7,
        ["0.8.0 is not greater than the stable version 0.9.0"],
    ),
    (
        "same-version-other-content",
        [MODEL, "--canary", "5%", "--version", "0.9.0"],
        _rebuilt,
        8,
        ["0.9.0 is already published with other content"],
    ),
]


@pytest.mark.parametrize(
    ("args", "setup", "exit_code", "fragments"),
    [pytest.param(*row[1:], id=row[0]) for row in BAD_PUBLISH],
)
def test_bad_publish_is_refused_and_changes_nothing(
    site: Site,
    args: list[str],
    setup: Callable[[Site], None],
    exit_code: int,
    fragments: list[str],
) -> None:
    # A registry with history: 0.9.0 published to everyone (a first --full is stable).
    ok(site.run("publish", MODEL, "--full", "--version", "0.9.0"))
    setup(site)
    before = site.snapshot()
    assert_refused(cli("publish", *args), exit_code, *fragments)
    assert site.snapshot() == before


def test_a_header_stripped_key_in_the_environment_is_never_echoed(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    pem = (site.root / KEY_FILE).read_text()
    body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
    shutil.rmtree(site.root / ".edgereg")
    monkeypatch.setenv("EDGEREG_SIGNING_KEY", body)
    for verbose in ((), ("--verbose",)):
        result = cli(*verbose, "publish", MODEL, "--canary", "5%")
        assert result.exit_code == 5, result.output
        assert "without a PEM header" in result.stderr
        assert body[:16] not in result.output, "secret bytes in the output"
    assert site.snapshot() == {}


def test_the_same_key_twice_signs_once(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%", "--key", KEY_FILE, "--key", KEY_FILE))
    envelope = json.loads(site.objects()[f"models/{MODEL}/state.json"])
    assert len(envelope["signatures"]) == 1


def test_bad_publish_into_an_empty_registry_creates_nothing(site: Site) -> None:
    for args in ([MODEL, "--canary", "0%"], ["digits", "--full"]):
        result = cli("publish", *args)
        assert result.exit_code == ExitCode.USAGE, result.output
    _stale_build(site)
    assert cli("publish", MODEL, "--full").exit_code == 8
    assert not (site.root / "registry").exists()


@pytest.mark.parametrize("case", ["wrong-key", "lower-than-stable", "stale-build"])
def test_bad_publish_to_s3_changes_nothing(s3site: Site, case: str) -> None:
    ok(s3site.run("publish", MODEL, "--full", "--version", "0.9.0"))
    _, args, setup, exit_code, fragments = next(row for row in BAD_PUBLISH if row[0] == case)
    setup(s3site)
    before = s3site.snapshot()
    assert_refused(s3site.run("publish", *args), exit_code, *fragments)
    assert s3site.snapshot() == before


def test_s3_unreachable_fails_within_seconds(s3site: Site, closed_port: int) -> None:
    ok(s3site.run("publish", MODEL, "--canary", "5%"))
    before = s3site.snapshot()
    endpoint = f"http://127.0.0.1:{closed_port}"
    started = time.monotonic()
    result = cli(
        "publish", MODEL, "--canary", "5%", "--registry", s3site.url, "--endpoint-url", endpoint
    )
    elapsed = time.monotonic() - started
    assert_refused(result, 6, f"could not reach S3 endpoint {endpoint}", "--endpoint-url")
    assert elapsed < 10, f"took {elapsed:.1f}s"
    assert s3site.snapshot() == before


def test_s3_unknown_bucket(s3site: Site, moto_endpoint: str) -> None:
    ok(s3site.run("publish", MODEL, "--canary", "5%"))
    before = s3site.snapshot()
    result = cli(
        "publish",
        MODEL,
        "--canary",
        "5%",
        "--version",
        "1.1.0",
        "--registry",
        "s3://no-such-bucket-here/reg",
        "--endpoint-url",
        moto_endpoint,
    )
    assert_refused(result, 6, "bucket 'no-such-bucket-here' does not exist", "bucket name")
    assert s3site.snapshot() == before


@pytest.fixture
def auth_server(s3_env: None) -> Iterator[str]:
    """A moto server of its own, whose authentication a test may switch on."""
    with MotoServer() as endpoint:
        yield endpoint


def _enforce_auth(endpoint: str, on: bool) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=b"0" if on else b"inf",
        method="POST",
        headers={"Content-Type": "text/plain"},  # a form body would be parsed away
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def test_s3_access_denied(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, auth_server: str
) -> None:
    make_client(auth_server).create_bucket(Bucket="locked")
    site = s3_site(built, tmp_path, monkeypatch, auth_server, "locked")
    ok(site.run("publish", MODEL, "--canary", "5%"))
    import boto3  # type: ignore[import-untyped]

    iam = boto3.session.Session().client("iam", endpoint_url=auth_server, region_name="us-east-1")
    iam.create_user(UserName="nobody")  # a real identity with no S3 permission at all
    access = iam.create_access_key(UserName="nobody")["AccessKey"]
    before = site.snapshot()

    _enforce_auth(auth_server, on=True)
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", access["SecretAccessKey"])
        monkeypatch.delenv("AWS_SESSION_TOKEN")
        denied = site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
        unknown = site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0")
    finally:
        _enforce_auth(auth_server, on=False)
    assert_refused(denied, 6, "access to S3 bucket 'locked' was denied", "credentials")
    assert_refused(unknown, 6, "was denied", "InvalidAccessKeyId")
    assert site.snapshot() == before


def test_make_clean_never_deletes_the_signing_key_or_the_pinned_keys() -> None:
    root = Path(__file__).resolve().parent.parent
    commands = subprocess.run(
        ["make", "-n", "clean"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert ".edgereg" not in commands
    assert not any(word.startswith((".edgereg/signing-key", "publisher-keys")) for word in commands)


def test_an_artifact_rewritten_after_it_was_checked_is_not_published(site: Site) -> None:
    # finding 9: publish hashed an artifact, then uploaded whatever the file held later.
    from datetime import datetime, timezone

    from edgereg.registry._release import ReleaseError, prepare_release
    from edgereg.signing import read_private_key_file

    config = site.project.load()
    prepared = prepare_release(
        config, MODEL, site.project.out_root, version="1.0.0", now=datetime.now(timezone.utc)
    )
    artifact = site.project.out_dir(MODEL, "w8") / "model.mnn"
    artifact.write_bytes(artifact.read_bytes() + b"rebuilt meanwhile")
    before = site.snapshot()
    with pytest.raises(ReleaseError) as caught:
        site.registry().publish(
            prepared,
            signer=read_private_key_file(site.root / KEY_FILE),
            percent=5.0,
            full=False,
            actor="test",
            expires_days=30,
        )
    assert "changed while it was being published" in caught.value.message
    assert "nothing was uploaded" in caught.value.message
    assert site.snapshot() == before


def test_a_large_class_list_ships_as_a_labels_blob(site: Site) -> None:
    from datetime import datetime, timezone

    from edgereg.build.outputs import LABELS
    from edgereg.registry._release import prepare_release
    from edgereg.signing import read_private_key_file

    # Four long class names: their JSON is larger than what a contract inlines.
    names = [f"{name}-" + "x" * 600 for name in buildkit.IMAGE_CLASSES]
    site.project.edit(
        "classes = " + json.dumps(list(buildkit.IMAGE_CLASSES)),
        "classes = " + json.dumps(names),
    )
    for variant in buildkit.VARIANTS[MODEL]:
        site.project.build(MODEL, variant)
    prepared = prepare_release(
        site.project.load(),
        MODEL,
        site.project.out_root,
        version="1.0.0",
        now=datetime.now(timezone.utc),
    )
    labels = site.project.out_dir(MODEL, "fp32") / LABELS
    digest = hashlib.sha256(labels.read_bytes()).hexdigest()
    for variant in prepared.record.variants.values():
        assert variant.contract is not None
        assert variant.contract.labels is None
        assert variant.contract.labels_blob == BlobRef.of(digest, labels.stat().st_size)
    assert digest in prepared.blobs
    site.registry().publish(
        prepared,
        signer=read_private_key_file(site.root / KEY_FILE),
        percent=5.0,
        full=False,
        actor="test",
        expires_days=30,
    )
    assert json.loads(site.objects()[f"blobs/sha256/{digest}"]) == names


def test_replacing_a_manifest_that_does_not_verify_is_logged(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    registry_root = Path(site.url.removeprefix("file://"))
    broken = registry_root / "manifests" / MODEL / "high.json"
    broken.write_bytes(b"not a manifest")
    with caplog.at_level(logging.INFO, logger="edgereg.registry"):
        ok(site.run("rollout", MODEL, "--to", "25%", "--force"))
    replaced = [
        record
        for record in caplog.records
        if record.name == "edgereg.registry._registry" and "does not verify" in record.message
    ]
    assert len(replaced) == 1
    assert replaced[0].levelno == logging.WARNING
    assert f"manifests/{MODEL}/high.json" in replaced[0].message
    assert site.manifests()["high"].sequence == site.state().sequence


class _RacingStorage(LocalStorage):
    """A real local registry where another writer rewrites one key just after it is read."""

    def __init__(self, root: Path, key: str) -> None:
        super().__init__(root)
        self.race_key = key
        self.raced = False

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        data, token = super().get_versioned(key)
        if key == self.race_key and not self.raced:
            self.raced = True
            self.put_if_unchanged(key, b"another writer's bytes", token)
        return data, token


def test_a_compare_and_swap_retry_is_logged(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    key = f"manifests/{MODEL}/high.json"
    root = Path(site.url.removeprefix("file://"))
    (root / key).write_bytes(b"not a manifest")  # stale: the next command rewrites it
    storage = _RacingStorage(root, key)
    registry = Registry(storage, trusted=read_trusted_keys([site.root / PINNED_DIR]))
    signer = read_private_key_file(site.root / KEY_FILE)
    with caplog.at_level(logging.INFO, logger="edgereg.registry"):
        assert registry.repair_manifests(MODEL, signer)
    assert storage.raced
    messages = [r.message for r in caplog.records if r.name == "edgereg.registry._registry"]
    retried = [m for m in messages if "changed while writing" in m]
    assert len(retried) == 1
    assert key in retried[0]
    assert "attempt 1 of 5" in retried[0]
    # Both the broken manifest and the racing writer's bytes were replaced, each logged.
    assert sum("does not verify" in m for m in messages) == 2
    assert site.manifests()["high"].sequence == site.state().sequence


def _ships_around(site: Site) -> None:
    """vision/int8's build as ARM verification leaves it when it avoids i8mm for w8."""
    path = site.project.out_dir(MODEL, "int8") / METRICS
    metrics = json.loads(path.read_text())
    metrics["arm"] = {"mnn": "3.6.1", "avoid_cpu": ["i8mm"], "instead": "w8", "classes": {}}
    path.write_text(json.dumps(metrics))


def test_publish_ships_the_builds_avoid_cpu_and_instead_as_fields_of_the_variant(
    site: Site,
) -> None:
    _ships_around(site)
    ok(site.run("publish", MODEL, "--full"))
    record = site.registry().read_release(MODEL, VERSION)
    assert isinstance(record, ReleaseRecord)
    int8 = record.variants["int8"]
    assert (int8.avoid_cpu, int8.instead) == (["i8mm"], "w8")
    assert all(record.variants[v].avoid_cpu is None for v in ("fp32", "w8"))
    manifests = site.manifests()
    mid = manifests["mid"].stable
    assert mid is not None
    assert mid.avoid_cpu == ["i8mm"]
    assert mid.instead == manifests["low"].stable
    assert manifests["high"].stable is not None
    assert manifests["high"].stable.avoid_cpu is None


def test_a_record_from_before_the_fields_keeps_its_manifests_byte_for_byte(site: Site) -> None:
    # Publishers between ARM verification and the typed fields carried avoid_cpu
    # and instead only inside metrics["arm"]; their signed records are read still.
    _ships_around(site)
    ok(site.run("publish", MODEL, "--full"))
    registry = site.registry()
    record = registry.read_release(MODEL, VERSION)
    assert isinstance(record, ReleaseRecord)
    legacy = record.model_copy(
        update={
            "variants": {
                name: variant.model_copy(update={"avoid_cpu": None, "instead": None})
                for name, variant in record.variants.items()
            }
        }
    )
    written = json.loads(to_bytes(legacy))["variants"]["int8"]
    assert "avoid_cpu" not in written
    assert "instead" not in written
    assert written["metrics"]["arm"]["avoid_cpu"] == ["i8mm"]
    state = site.state()
    now_written = build_manifests(state, {VERSION: record})
    from_legacy = build_manifests(state, {VERSION: legacy})
    assert {t: to_bytes(m) for t, m in from_legacy.items()} == {
        t: to_bytes(m) for t, m in now_written.items()
    }
    assert from_legacy["mid"].stable is not None
    assert from_legacy["mid"].stable.avoid_cpu == ["i8mm"]
    # And they are the bytes the registry serves (what `edgereg verify` compares).
    for tier, manifest in now_written.items():
        assert registry.read_manifest(MODEL, tier) == manifest


def test_a_build_whose_arm_record_is_malformed_is_refused(site: Site) -> None:
    path = site.project.out_dir(MODEL, "int8") / METRICS
    metrics = json.loads(path.read_text())
    metrics["arm"] = {"avoid_cpu": ["I8MM"], "instead": "w8"}
    path.write_text(json.dumps(metrics))
    before = site.snapshot()
    assert_refused(
        site.run("publish", MODEL, "--full"),
        ExitCode.NOT_PUBLISHABLE,
        "vision/int8: build outputs unreadable (metrics.json: arm.avoid_cpu.0",
    )
    assert site.snapshot() == before


def test_publish_writes_a_variants_try_set_as_its_entrys_runtime_trials(site: Site) -> None:
    """runtime.try (decision 0008) travels to the entry without a rebuild: not in the recipe."""
    toml = site.root / "models.toml"
    text = toml.read_text(encoding="utf-8")
    declared = 'runtime = { threads = 4, backends = ["opencl", "cpu"] }\n'
    tried = (
        'runtime = { threads = 4, backends = ["opencl", "cpu"], '
        'try = { threads = [4, 2, 1], backends = ["cpu", "opencl"], max_total_ms = 1500 } }\n'
    )
    assert text.count(declared) == 2  # vision's fp32 and sensor's fp16
    toml.write_text(text.replace(declared, tried, 1), encoding="utf-8")
    ok(site.run("publish", MODEL, "--full"))
    record = site.registry().read_release(MODEL, VERSION)
    assert isinstance(record, ReleaseRecord)
    fp32 = record.variants["fp32"]
    assert fp32.runtime_trials is not None
    assert fp32.runtime.model_dump() == {
        "threads": 4,
        "backends": ["opencl", "cpu"],
        "precision": "normal",
    }
    manifests = site.manifests()
    high = manifests["high"].stable
    assert high is not None
    assert high.runtime == fp32.runtime  # the declared runtime: what devices use
    trials = high.runtime_trials
    assert trials == fp32.runtime_trials
    assert trials is not None
    assert [(s.backend, s.threads) for s in trials.settings] == [
        ("cpu", 1),
        ("cpu", 2),
        ("cpu", 4),
        ("opencl", 1),
        ("opencl", 2),
        ("opencl", 4),
    ]
    assert (trials.max_runs_per_setting, trials.max_total_ms) == (5, 1500)
    body = trials.model_dump(mode="json", exclude={"id"})
    assert trials.id == hashlib.sha256(canonical_json(body)).hexdigest()[:8]
    # The other tiers' variants declare no try-set: their entries carry none, and the
    # manifest bytes say nothing of it (left off the wire while unset).
    for tier in ("mid", "low"):
        entry = manifests[tier].stable
        assert entry is not None
        assert entry.runtime_trials is None
        assert b"runtime_trials" not in to_bytes(manifests[tier])
    assert b'"runtime_trials":{"id":"' + trials.id.encode() in to_bytes(manifests["high"])
