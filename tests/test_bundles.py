"""Bundles: models that ship together, released and rolled out as one unit.

The tiny project (tests/buildkit.py, built once per session) with its two
models declared as one bundle ``kit``; real signing, a real directory
registry, a real S3-protocol server (moto on loopback) and real
``edgereg publish`` processes killed at random moments. What devices get is
decided by the protocol's own :func:`~edgereg.protocol.decision.decide` on
the manifests as stored.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from registrykit import KEY_FILE, MODEL, OTHER, TIERS, Site, add_table, assert_refused, ok
from test_registry_safety import EDGEREG, _timed, child_env, verify_json

from edgereg.protocol.contract import BlobRef
from edgereg.protocol.decision import decide
from edgereg.protocol.wire import BundleEntry, BundleRecord, Manifest, ReleaseRecord, ReleaseVariant
from edgereg.registry import (
    PreparedBundle,
    ReleaseError,
    build_manifests,
    entry_for,
    manifest_key,
    prepare_bundle_release,
    utcnow,
)
from edgereg.signing import read_private_key_file
from edgereg.wire import RolloutState

BUNDLE = "kit"
MEMBERS = (MODEL, OTHER)  # vision, sensor
BUNDLE_TABLE = f"""
[bundles.{BUNDLE}]
version = "1.0.0"
models = ["{MODEL}", "{OTHER}"]
"""
#: sensor's high-tier variant: removing it makes sensor's high tier fall back to int8.
SENSOR_HIGH = """[models.sensor.variants.fp16]
tier = "high"
precision = "fp16"
runtime = { threads = 4, backends = ["opencl", "cpu"] }
"""


@pytest.fixture
def kit(site: Site) -> Site:
    add_table(site.project, BUNDLE_TABLE)
    return site


@pytest.fixture
def s3kit(s3site: Site) -> Site:
    add_table(s3site.project, BUNDLE_TABLE)
    return s3site


def bundle_manifests(site: Site) -> dict[str, Manifest]:
    registry = site.registry()
    return {tier: registry.read_manifest(BUNDLE, tier) for tier in TIERS}


def next_member_version(site: Site, model: str, version: str) -> None:
    """Give one member a new version in models.toml (its build stays current)."""
    site.project.edit_table(f"models.{model}", 'version = "1.0.0"', f'version = "{version}"')


def members_of(site: Site, version: str) -> dict[str, str]:
    """The member versions of one bundle version, from its signed release record."""
    record = site.registry().read_release(BUNDLE, version)
    assert isinstance(record, BundleRecord)
    return {name: member.version for name, member in record.members.items()}


def devices_get(site: Site, tier: str, count: int) -> list[BundleEntry | None]:
    """What ``count`` devices of ``tier`` install, as the protocol's decide() says."""
    data = site.registry().storage.get(manifest_key(BUNDLE, tier))
    chosen = []
    for index in range(count):
        decision = decide(
            data,
            trusted=site.public_keys(),
            model=BUNDLE,
            tier=tier,
            device_id=f"device-{index:03d}",
            app_mnn_runtime="3.6.1",
            highest_seen_sequence=None,
            now=utcnow(),
            bundle=True,
        )
        assert decision.entry is None or isinstance(decision.entry, BundleEntry)
        chosen.append(decision.entry)
    return chosen


# --- publish and what devices get ----------------------------------------------------


def test_a_bundle_canary_gives_every_device_one_version_of_every_member(kit: Site) -> None:
    first = json.loads(ok(kit.run("publish", BUNDLE, "--full", "--json")).stdout)
    assert first["bundle"] is True
    assert first["members"] == {OTHER: "1.0.0", MODEL: "1.0.0"}
    next_member_version(kit, MODEL, "1.1.0")
    result = ok(kit.run("publish", BUNDLE, "--canary", "50%", "--version", "2.0.0"))
    assert f"bundle {BUNDLE} 2.0.0: {OTHER} 1.0.0, {MODEL} 1.1.0" in result.stdout

    state = kit.state(BUNDLE)
    assert (state.stable, state.candidate, state.percent) == ("1.0.0", "2.0.0", 50.0)
    # One rollout unit: no state or manifest of its own for a member.
    registry = kit.registry()
    assert registry.models() == [BUNDLE]
    assert registry.manifest_tiers(MODEL) == []
    record = registry.read_release(BUNDLE, "2.0.0")
    assert isinstance(record, BundleRecord)
    member_versions = {version: members_of(kit, version) for version in ("1.0.0", "2.0.0")}
    devices = 48
    arms: dict[str, list[str]] = {}
    for tier in TIERS:
        for index, entry in enumerate(devices_get(kit, tier, devices)):
            assert entry is not None
            got = {name: member.version for name, member in entry.members.items()}
            assert got == member_versions[entry.version], f"device {index} of {tier}: a mix"
            arms.setdefault(tier, []).append(entry.version)
    # One salt for the bundle: a device is in or out of the cohort on every tier.
    assert arms["high"] == arms["mid"] == arms["low"]
    assert {"1.0.0", "2.0.0"} == set(arms["high"])
    assert verify_json(kit)["errors"] == []


def test_rollout_pause_resume_promote_rollback_move_the_bundle_as_one(kit: Site) -> None:
    ok(kit.run("publish", BUNDLE, "--full"))
    next_member_version(kit, OTHER, "1.2.0")
    ok(kit.run("publish", BUNDLE, "--canary", "5%", "--version", "1.1.0"))
    ok(kit.run("rollout", BUNDLE, "--to", "25%", "--force"))
    assert {m.percent for m in bundle_manifests(kit).values()} == {25.0}

    ok(kit.run("pause", BUNDLE))
    for manifest in bundle_manifests(kit).values():
        assert manifest.paused
        assert manifest.is_bundle
    assert {entry.version for entry in devices_get(kit, "mid", 20) if entry} == {"1.0.0"}
    ok(kit.run("resume", BUNDLE))

    ok(kit.run("promote", BUNDLE))
    for manifest in bundle_manifests(kit).values():
        assert manifest.candidate is None
        assert isinstance(manifest.stable, BundleEntry)
        assert manifest.stable.version == "1.1.0"
        assert manifest.stable.members[OTHER].version == "1.2.0"

    ok(kit.run("rollback", BUNDLE, "--to-version", "1.0.0"))
    state = kit.state(BUNDLE)
    assert (state.stable, state.candidate) == ("1.0.0", None)
    for manifest in bundle_manifests(kit).values():
        assert isinstance(manifest.stable, BundleEntry)
        assert {m.version for m in manifest.stable.members.values()} == {"1.0.0"}
        assert manifest.sequence == state.sequence
    actions = [event.action for event in state.history]
    assert actions == ["publish", "publish", "rollout", "pause", "resume", "promote", "rollback"]

    history = ok(kit.run("history", BUNDLE)).stdout
    assert f"bundle {BUNDLE} 1.1.0: {OTHER} 1.2.0, {MODEL} 1.0.0" in history
    status = json.loads(ok(kit.run("status", BUNDLE, "--json")).stdout)[0]
    assert status["bundle"] is True
    assert status["members"] == [
        {"name": OTHER, "stable": "1.0.0", "candidate": None},
        {"name": MODEL, "stable": "1.0.0", "candidate": None},
    ]
    assert {(row["tier"], row["member"]) for row in status["tiers"]} == {
        (tier, member) for tier in TIERS for member in MEMBERS
    }
    table = ok(kit.run("status")).stdout
    assert f"{BUNDLE} (bundle)" in table
    assert f"{OTHER} 1.0.0" in table
    report = verify_json(kit)
    assert (report["errors"], report["warnings"]) == ([], []), report


def test_each_member_falls_back_to_a_lower_tier_on_its_own(kit: Site) -> None:
    kit.project.edit(SENSOR_HIGH, "")
    ok(kit.run("publish", BUNDLE, "--canary", "5%"))
    high = kit.registry().read_manifest(BUNDLE, "high").candidate
    assert isinstance(high, BundleEntry)
    assert (high.members[MODEL].variant, high.members[OTHER].variant) == ("fp32", "int8")
    low = kit.registry().read_manifest(BUNDLE, "low").candidate
    assert isinstance(low, BundleEntry)
    assert {m.variant for m in low.members.values()} == {"w8"}


def test_publishing_the_same_bundle_again_changes_nothing(kit: Site) -> None:
    ok(kit.run("publish", BUNDLE, "--canary", "5%"))
    before = kit.objects()
    again = json.loads(ok(kit.run("publish", BUNDLE, "--canary", "5%", "--json")).stdout)
    assert again["already_published"] is True
    assert (again["uploaded_blobs"], again["uploaded_bytes"]) == (0, 0)
    assert kit.objects() == before


def test_bundle_and_member_requires_and_the_report_url_reach_every_manifest(kit: Site) -> None:
    kit.project.edit_table(
        f"bundles.{BUNDLE}", 'version = "1.0.0"', 'version = "1.0.0"\nrequires = { app = ">=2.0" }'
    )
    kit.project.edit_table(
        f"models.{OTHER}", 'version = "1.0.0"', 'version = "1.0.0"\nrequires = { android = ">=29" }'
    )
    add_table(kit.project, '[reports]\nurl = "v1/reports"')
    ok(kit.run("publish", BUNDLE, "--canary", "5%"))
    assert kit.state(BUNDLE).report_url == "v1/reports"
    for manifest in bundle_manifests(kit).values():
        assert manifest.report_url == "v1/reports"
        entry = manifest.candidate
        assert isinstance(entry, BundleEntry)
        assert entry.requires is not None
        assert entry.requires.app == ">=2.0"
        assert entry.members[OTHER].requires is not None
        assert entry.members[OTHER].requires.android == ">=29"
        assert entry.members[MODEL].requires is None
    # A later command signs the current [reports] url in; its manifests follow.
    kit.project.edit('url = "v1/reports"', 'url = "https://collector.example/v1/reports"')
    ok(kit.run("rollout", BUNDLE, "--to", "10%", "--force"))
    assert {m.report_url for m in bundle_manifests(kit).values()} == {
        "https://collector.example/v1/reports"
    }
    assert verify_json(kit)["errors"] == []


def test_a_bad_report_url_is_refused_before_anything_is_written(kit: Site) -> None:
    add_table(kit.project, '[reports]\nurl = "not a url"')
    assert_refused(kit.run("publish", BUNDLE, "--canary", "5%"), 2, "reports.url", "not a url")
    assert kit.objects() == {}


# --- refusals ------------------------------------------------------------------------------


def test_a_member_is_not_published_alone(kit: Site) -> None:
    for command in (("publish", MODEL, "--canary", "5%"), ("rollout", OTHER, "--next")):
        assert_refused(kit.run(*command), 2, f"ships in bundle '{BUNDLE}'", "edgereg publish kit")
    assert kit.objects() == {}


def test_a_model_published_alone_before_it_joined_a_bundle_keeps_its_rollout(site: Site) -> None:
    ok(site.run("publish", MODEL, "--full"))
    add_table(site.project, BUNDLE_TABLE)
    ok(site.run("resign", MODEL))  # its devices' manifests must not expire
    assert_refused(site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"), 2, BUNDLE)


def test_an_unknown_bundle_is_refused(kit: Site) -> None:
    assert_refused(kit.run("publish", "ocr", "--canary", "5%"), 2, "no model 'ocr'", "bundles: kit")


def test_a_bundle_with_members_not_built_lists_every_one(kit: Site) -> None:
    ok(kit.run("publish", BUNDLE, "--full"))
    before = kit.objects()
    shutil.rmtree(kit.project.out_dir(OTHER, "w8"))
    shutil.rmtree(kit.project.out_dir(MODEL, "int8"))
    message = assert_refused(
        kit.run("publish", BUNDLE, "--canary", "5%", "--version", "1.1.0"),
        8,
        "cannot publish bundle kit",
        f"{OTHER}/w8: not built",
        f"{MODEL}/int8: not built",
    )
    assert "Traceback" not in message
    assert kit.objects() == before


def test_a_model_name_cannot_become_a_bundle_in_the_same_registry(site: Site) -> None:
    ok(site.run("publish", MODEL, "--full"))
    before = site.objects()
    add_table(site.project, BUNDLE_TABLE)
    prepared = prepare_bundle_release(
        site.project.load(), BUNDLE, site.project.out_root, version="2.0.0", now=utcnow()
    )
    # A bundle record under the model's name (a models.toml that turned the model
    # into a bundle): apps that asked for the model would refuse its manifests.
    renamed = PreparedBundle(
        record=prepared.record.model_copy(update={"bundle": MODEL}), blobs=prepared.blobs
    )
    with pytest.raises(ReleaseError, match=f"'{MODEL}' is a model in registry"):
        site.registry().publish(
            renamed,
            signer=read_private_key_file(site.root / KEY_FILE),
            percent=5.0,
            full=False,
            actor="test",
            expires_days=30,
        )
    assert site.objects() == before


# --- verify --------------------------------------------------------------------------------


def test_verify_catches_a_deleted_member_blob(kit: Site) -> None:
    ok(kit.run("publish", BUNDLE, "--canary", "5%"))
    record = kit.registry().read_release(BUNDLE, "1.0.0")
    assert isinstance(record, BundleRecord)
    digest = record.members[OTHER].variants["int8"].sha256
    (Path(kit.url.removeprefix("file://")) / "blobs/sha256" / digest).unlink()
    report = verify_json(kit)
    assert not report["ok"]
    assert any(
        f"member {OTHER} variant int8" in error and "is missing" in error
        for error in report["errors"]
    ), report


def test_manifest_entries_copy_contract_probe_and_requires_from_the_release() -> None:
    probe = BlobRef.of("a" * 64, 123)
    variant = ReleaseVariant(
        tier="low",
        sha256="b" * 64,
        size=10,
        min_mnn_runtime="3.0.0",
        runtime={"threads": 1},
        probe=probe,
    )
    record = ReleaseRecord(
        model="m",
        version="1.0.0",
        created=utcnow(),
        variants={"w8": variant},
        tiers={"low": "w8"},
        requires={"app": ">=2"},
    )
    entry = entry_for(record, "low")
    assert entry is not None
    assert entry.probe == probe
    assert entry.requires is not None
    assert entry.requires.app == ">=2"
    now = utcnow()
    state = RolloutState(
        model="m", sequence=1, expires=now + timedelta(days=1), stable="1.0.0", report_url="v1/r"
    )
    manifest = build_manifests(state, {"1.0.0": record})["low"]
    assert manifest.report_url == "v1/r"
    assert manifest.stable == entry
    # Every blob a release ships is checked by verify: the probe too.
    assert ("variant w8", probe) in record.blob_refs()


# --- crashes and S3 -------------------------------------------------------------------------


def test_killing_a_bundle_publish_at_random_moments_never_breaks_the_registry(kit: Site) -> None:
    publish = [str(EDGEREG), "publish", BUNDLE, "--canary", "5%"]
    scratch = ["--registry", f"file://{kit.root / 'scratch'}"]
    full = before_writes = float("inf")
    for _ in range(2):
        shutil.rmtree(kit.root / "scratch", ignore_errors=True)
        took, code = _timed([*publish, *scratch], kit.root)
        assert code == 0
        full = min(full, took)
        took, code = _timed([*publish, "--version", "0.0.1", *scratch], kit.root)
        assert code == 7
        before_writes = min(before_writes, took)

    rng = random.Random(20240612)
    runs = 8
    plan = [(0.0, (i + rng.random()) / (runs // 2)) for i in range(runs // 2)]
    plan += [(0.9 * before_writes, rng.random()) for _ in range(runs // 2)]
    killed = 0
    for run, (start, fraction) in enumerate(plan):
        if run % 4 == 0:
            shutil.rmtree(kit.root / "registry", ignore_errors=True)
            ok(kit.run("publish", BUNDLE, "--full", "--version", "0.1.0"))
        delay = start + (full - start) * fraction
        version = f"1.{run}.0"
        process = subprocess.Popen(
            [*publish, "--version", version],
            cwd=kit.root,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started = time.monotonic()
        try:
            code = process.wait(timeout=delay)
            full = min(full, time.monotonic() - started)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(timeout=30)
        killed += code == -9
        assert code in (0, -9), f"run {run}: exit {code}"
        report = verify_json(kit)
        assert report["errors"] == [], f"run {run}, killed after {delay:.3f}s: {report}"
        ok(kit.run("publish", BUNDLE, "--canary", "5%", "--version", version))
        report = verify_json(kit)
        assert (report["errors"], report["warnings"]) == ([], []), report
        state = kit.state(BUNDLE)
        for manifest in bundle_manifests(kit).values():
            assert manifest.sequence == state.sequence
            assert manifest.candidate is not None
            assert manifest.candidate.version == version
    assert killed >= runs // 4, f"only {killed} of {runs} runs were killed"


def test_a_bundle_publishes_to_s3(s3kit: Site) -> None:
    ok(s3kit.run("publish", BUNDLE, "--canary", "50%"))
    objects = s3kit.objects()
    assert f"models/{BUNDLE}/state.json" in objects
    assert {f"manifests/{BUNDLE}/{tier}.json" for tier in TIERS} <= set(objects)
    record = s3kit.registry().read_release(BUNDLE, "1.0.0")
    assert isinstance(record, BundleRecord)
    digests = {ref.sha256 for _, ref in record.blob_refs()}
    assert {f"blobs/sha256/{d}" for d in digests} <= set(objects)
    # No stable yet: the cohort gets the whole bundle, the others nothing.
    got = {entry.version if entry else None for entry in devices_get(s3kit, "mid", 40)}
    assert got == {"1.0.0", None}
    report = verify_json(s3kit)
    assert (report["errors"], report["warnings"]) == ([], []), report


def test_the_status_page_shows_a_bundle_with_its_members(kit: Site) -> None:
    from edgereg.serve._status_page import render_status_page

    ok(kit.run("publish", BUNDLE, "--full"))
    next_member_version(kit, MODEL, "1.1.0")
    ok(kit.run("publish", BUNDLE, "--canary", "5%", "--version", "1.1.0"))
    registry = kit.registry()
    page = render_status_page(registry.storage, trusted=registry.trusted_keys)
    assert "Cannot show" not in page
    assert "bundle of 2:" in page
    assert f"<b>{MODEL}</b> stable 1.0.0 → candidate 1.1.0" in page
    assert f"<b>{OTHER}</b> stable 1.0.0 → candidate 1.0.0" in page
    assert "<th>member</th>" in page
    for member in MEMBERS:
        assert f'<td class="name">{member}</td>' in page
    # The page and `edgereg status --html` are the same page.
    ok(kit.run("status", "--html", "page.html"))
    assert "bundle of 2:" in (kit.root / "page.html").read_text(encoding="utf-8")
