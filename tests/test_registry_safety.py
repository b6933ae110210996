"""The registry stays valid: crashes, kills, concurrent publishers, tampering.

* A publish that dies at any point (a crash injected before every write, and
  real SIGKILLs of `edgereg publish` at random moments) leaves a registry that
  `edgereg verify` accepts, and running the command again finishes the job.
* Two publishers at once (real processes, local directory and S3): exactly
  one state update wins, the other exits 6 asking to run again, and no
  history event is lost.
* Any change to a signed object or blob fails verification naming the object;
  a manifest left behind the state is a warning (a crash leaves that).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from registrykit import (
    KEY_FILE,
    MODEL,
    Site,
    assert_refused,
    ok,
    s3_site,
    write_key,
)

from edgereg.errors import TrustError
from edgereg.registry import Registry, prepare_release, utcnow
from edgereg.registry._transitions import set_percent
from edgereg.signing import read_private_key_file
from edgereg.storage._local import LocalStorage
from edgereg.wire import Manifest, ReleaseRecord, RolloutState, sign_document, verify_document

EDGEREG = Path(sys.executable).with_name("edgereg")


def child_env() -> dict[str, str]:
    """The environment of an edgereg child process: this venv first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{EDGEREG.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def verify_json(site: Site) -> dict[str, Any]:
    result = site.run("verify", "--json")
    report: dict[str, Any] = json.loads(result.stdout)
    assert result.exit_code == (0 if report["ok"] else 9), result.output
    return report


def assert_finished(site: Site, version: str) -> None:
    """The publish of ``version`` is complete: verify is clean, manifests current."""
    report = verify_json(site)
    assert (report["errors"], report["warnings"]) == ([], []), report
    state = site.state()
    assert state.candidate == version
    for manifest in site.manifests().values():
        assert manifest.sequence == state.sequence
        assert manifest.candidate is not None
        assert manifest.candidate.version == version


# --- a crash before every single write ---------------------------------------------------


class Crash(BaseException):
    """The process dies here: nothing after it runs, no handler catches it."""


class CrashingStorage(LocalStorage):
    """The local backend, dying before its N-th write (counting from 0)."""

    def __init__(self, root: Path, crash_before: int | None) -> None:
        super().__init__(root)
        self.crash_before = crash_before
        self.writes: list[str] = []

    def _count(self, key: str) -> None:
        if len(self.writes) == self.crash_before:
            raise Crash(key)
        self.writes.append(key)

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        self._count(key)
        return super()._put_if_absent(key, data)

    def _put_file_if_absent(self, key: str, path: Path) -> bool:
        self._count(key)
        return super()._put_file_if_absent(key, path)

    def _put_if_unchanged(self, key: str, data: bytes, token: str | None) -> str:
        self._count(key)
        return super()._put_if_unchanged(key, data, token)

    def _put(self, key: str, data: bytes) -> None:
        self._count(key)
        super()._put(key, data)


def _publish(site: Site, storage: LocalStorage, version: str) -> None:
    prepared = prepare_release(
        site.project.load(), MODEL, site.project.out_root, version=version, now=utcnow()
    )
    Registry(storage).publish(
        prepared,
        signer=read_private_key_file(site.root / KEY_FILE),
        percent=5.0,
        full=False,
        actor="crash-test",
        expires_days=30,
    )


def _rollout(site: Site, storage: LocalStorage) -> None:
    Registry(storage).change(
        MODEL,
        lambda state, now, expires: set_percent(
            state,
            MODEL,
            25.0,
            policy=site.project.load().rollout,
            now=now,
            expires=expires,
            actor="crash-test",
            force=True,
        ),
        signer=read_private_key_file(site.root / KEY_FILE),
        expires_days=30,
    )


def _first_publish(site: Site) -> None:
    pass


def _later_publish(site: Site) -> None:
    ok(site.run("publish", MODEL, "--full", "--version", "0.9.0"))
    # A rebuilt variant, so the new release brings a new blob too.
    site.project.edit_table(f"models.{MODEL}.variants.w8", "threads = 1", "threads = 3")
    site.project.build(MODEL, "w8")


def _canary(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))


@pytest.mark.parametrize(
    ("setup", "operation", "writes"),
    [
        # key, 3 artifacts, 3 golden probes, record, state, 3 manifests
        pytest.param(_first_publish, "publish", 12, id="first-publish"),
        pytest.param(_later_publish, "publish", 12, id="next-publish"),
        pytest.param(_canary, "rollout", 4, id="rollout"),  # state, 3 manifests
    ],
)
def test_a_crash_before_any_write_leaves_a_valid_registry(
    site: Site, tmp_path: Path, setup: Callable[[Site], None], operation: str, writes: int
) -> None:
    setup(site)
    root = site.root / "registry"
    base = tmp_path / "base"
    if root.exists():
        shutil.copytree(root, base)

    def run(crash_before: int | None) -> CrashingStorage:
        storage = CrashingStorage(root, crash_before)
        if operation == "publish":
            _publish(site, storage, "1.0.0")
        else:
            _rollout(site, storage)
        return storage

    complete = run(None)
    assert len(complete.writes) == writes, complete.writes
    for crash_before in range(writes):
        shutil.rmtree(root)
        if base.exists():
            shutil.copytree(base, root)
        with pytest.raises(Crash):
            run(crash_before)
        if not root.exists():
            # Nothing was written, so there is no registry: verify says so (exit 6).
            assert_refused(site.run("verify"), 6, "does not exist")
        else:
            report = verify_json(site)
            assert report["errors"] == [], f"crash before {complete.writes[crash_before]}: {report}"
            behind_or_missing = [w for w in report["warnings"] if "manifests/" in w]
            if crash_before > writes - 4:  # the state is written, some manifests are not
                assert behind_or_missing, report
        if operation == "publish":
            ok(site.run("publish", MODEL, "--canary", "5%"))
            assert_finished(site, "1.0.0")
        else:
            again = site.run("rollout", MODEL, "--to", "25%", "--force")
            if again.exit_code != 0:
                # The state says 25% already: the rerun is refused, but like every
                # command it first brought the lagging manifests up to the state.
                assert_refused(again, 7, "already at 25%")
            report = verify_json(site)
            assert (report["errors"], report["warnings"]) == ([], [])
            assert {m.percent for m in site.manifests().values()} == {25.0}


# --- SIGKILL at random moments -------------------------------------------------------------


def _timed(args: list[str], cwd: Path) -> tuple[float, int]:
    started = time.monotonic()
    done = subprocess.run(args, cwd=cwd, env=child_env(), capture_output=True, check=False)
    return time.monotonic() - started, done.returncode


def test_killing_publish_at_random_moments_never_breaks_the_registry(site: Site) -> None:
    publish = [str(EDGEREG), "publish", MODEL, "--canary", "5%"]
    scratch = ["--registry", f"file://{site.root / 'scratch'}"]
    # How long a publish takes, and when its writes begin (a refused publish does
    # everything up to them: imports, reading the build and the registry). The
    # fastest of a few runs: a busy machine only makes later runs slower, which
    # moves the kills earlier, never past the end.
    full = before_writes = float("inf")
    for _ in range(3):
        shutil.rmtree(site.root / "scratch", ignore_errors=True)
        took, code = _timed([*publish, *scratch], site.root)
        assert code == 0
        full = min(full, took)
        took, code = _timed([*publish, "--version", "0.0.1", *scratch], site.root)
        assert code == 7
        before_writes = min(before_writes, took)

    rng = random.Random(20240611)
    runs = 16
    # Half the kills at a random fraction of the whole run, half within the writes.
    fractions = [(i + rng.random()) / (runs // 2) for i in range(runs // 2)]
    writes = [rng.random() for _ in range(runs // 2)]
    plan = [("whole", f) for f in fractions] + [("writes", f) for f in writes]
    killed = warned = 0
    for run, (where, fraction) in enumerate(plan):
        if run % 4 == 0:
            shutil.rmtree(site.root / "registry", ignore_errors=True)  # keys and blobs again
            # A stable under the canaries: a canary may replace another only then.
            ok(site.run("publish", MODEL, "--full", "--version", "0.1.0"))
        start = 0.9 * before_writes if where == "writes" else 0.0
        delay = start + (full - start) * fraction
        version = f"1.{run}.0"
        started = time.monotonic()
        process = subprocess.Popen(
            [*publish, "--version", version],
            cwd=site.root,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            code = process.wait(timeout=delay)
            full = min(full, time.monotonic() - started)  # it was faster than thought
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(timeout=30)
        killed += code == -9
        assert code in (0, -9), f"run {run}: exit {code}"

        report = verify_json(site)
        assert report["errors"] == [], f"run {run}, killed after {delay:.3f}s: {report}"
        warned += bool(report["warnings"])
        ok(site.run("publish", MODEL, "--canary", "5%", "--version", version))
        assert_finished(site, version)
    assert killed >= runs // 4, f"only {killed} of {runs} runs were killed"
    print(f"{killed}/{runs} publishes killed ({warned} left warnings); a publish takes {full:.2f}s")


# --- two publishers at once ------------------------------------------------------------------

RACER = """
import os, sys, time
from pathlib import Path

from edgereg.storage import Storage

gate = Path(os.environ["RACE_DIR"])
me = os.environ["RACE_NAME"]
after = os.environ.get("RACE_AFTER")  # write the state only after this racer did
compare_and_swap = Storage.put_if_unchanged


def wait(condition, what):
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"racer {me}: gave up waiting for {what}")
        time.sleep(0.005)


def gated(self, key, data, token):
    if not key.endswith("/state.json"):
        return compare_and_swap(self, key, data, token)
    # Both racers have read the state (and its version) before either writes it.
    (gate / f"{me}.ready").touch()
    wait(lambda: len(list(gate.glob("*.ready"))) >= 2, "the other racer")
    if after:
        wait(lambda: (gate / f"{after}.done").exists(), after)
    try:
        return compare_and_swap(self, key, data, token)
    finally:
        (gate / f"{me}.done").touch()


Storage.put_if_unchanged = gated
from edgereg.cli import main

main(prog_name="edgereg")
"""


def _race(
    site: Site, racer: Path, gate: Path, versions: tuple[str, str], ordered: bool
) -> dict[str, tuple[int, str]]:
    """Publish two versions at once; with ``ordered`` the first one writes the state first."""
    gate.mkdir()
    processes = {}
    for version in versions:  # each racer is named by its version
        env = {**child_env(), "RACE_DIR": str(gate), "RACE_NAME": version}
        if ordered and version == versions[1]:
            env["RACE_AFTER"] = versions[0]
        processes[version] = subprocess.Popen(
            [
                sys.executable,
                str(racer),
                "publish",
                MODEL,
                "--canary",
                "5%",
                "--version",
                version,
                *site.flags,
            ],
            cwd=site.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for name, process in processes.items():
        _, err = process.communicate(timeout=90)
        results[name] = (process.returncode, err)
    return results


def _check_races(site: Site, tmp_path: Path, rounds: list[tuple[str, str, bool]]) -> None:
    racer = tmp_path / "racer.py"
    racer.write_text(RACER, encoding="utf-8")
    published: list[str] = []
    # A stable under the racing canaries: a canary may replace another only then.
    ok(site.run("publish", MODEL, "--full", "--version", "0.1.0"))
    for number, (low, high, ordered) in enumerate(rounds):
        results = _race(site, racer, tmp_path / f"gate-{number}", (low, high), ordered)
        winners = [v for v, (code, _) in results.items() if code == 0]
        assert len(winners) == 1, results
        (winner,) = winners
        (loser,) = {low, high} - {winner}
        if ordered:
            assert winner == low
        code, err = results[loser]
        assert code == 6, results
        assert "changed while this command ran" in err, err
        assert "Run the command again" in err, err
        published.append(winner)
        assert verify_json(site)["errors"] == []

        again = site.run("publish", MODEL, "--canary", "5%", "--version", loser)
        if loser == high:
            ok(again)
            published.append(loser)
        else:  # the winner is newer: the loser's version is refused, not lost silently
            assert_refused(again, 7, f"{loser} is not greater than the candidate version {high}")

    state = site.state()
    assert [
        e.after.candidate for e in state.history if e.action == "publish" and e.after.candidate
    ] == published
    assert [e.sequence for e in state.history] == list(range(1, state.sequence + 1))
    assert_finished(site, published[-1])


def test_two_publishers_at_once_on_a_directory(site: Site, tmp_path: Path) -> None:
    _check_races(
        site,
        tmp_path,
        [
            ("1.0.0", "1.0.1", False),
            ("1.1.0", "1.1.1", True),  # the older version wins; the newer retries
            ("1.2.0", "1.2.1", False),
            ("1.3.0", "1.3.1", False),
        ],
    )


def test_two_publishers_at_once_on_s3(
    built: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    moto_endpoint: str,
    s3_bucket: str,
) -> None:
    site = s3_site(built, tmp_path, monkeypatch, moto_endpoint, s3_bucket)
    _check_races(
        site,
        tmp_path,
        [("1.0.0", "1.0.1", False), ("1.1.0", "1.1.1", True), ("1.2.0", "1.2.1", False)],
    )


# --- tampering -------------------------------------------------------------------------------


def flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    index = len(data) // 2 if at is None else at
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def rolled(site: Site) -> tuple[Site, dict[str, bytes]]:
    """vision 1.0.0 published at 5% (sequence 1), then rolled out to 25% (sequence 2).

    Returns the site and the registry's objects as they were at sequence 1.
    """
    ok(site.run("publish", MODEL, "--canary", "5%"))
    older = site.objects()
    ok(site.run("rollout", MODEL, "--to", "25%", "--force"))
    return site, older


def _blob(site: Site, variant: str) -> str:
    data = site.artifact(MODEL, variant)
    return f"blobs/sha256/{hashlib.sha256(data).hexdigest()}"


STATE = f"models/{MODEL}/state.json"
RELEASE = f"models/{MODEL}/releases/1.0.0.json"
MID = f"manifests/{MODEL}/mid.json"


def _flip_blob(site: Site, older: dict[str, bytes]) -> list[str]:
    key = _blob(site, "w8")
    flip(site.root / "registry" / key)
    return [f"{RELEASE}: variant w8: {key} content does not match its sha256"]


def _truncate_blob(site: Site, older: dict[str, bytes]) -> list[str]:
    key = _blob(site, "int8")
    path = site.root / "registry" / key
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-1])
    return [f"{RELEASE}: variant int8: {key} is {size - 1} bytes, the record says {size}"]


def _delete_blob(site: Site, older: dict[str, bytes]) -> list[str]:
    key = _blob(site, "fp32")
    (site.root / "registry" / key).unlink()
    return [f"{RELEASE}: variant fp32: {key} is missing"]


def _flip_release(site: Site, older: dict[str, bytes]) -> list[str]:
    flip(site.root / "registry" / RELEASE)
    return [f"{RELEASE}: ", f"{STATE}: candidate 1.0.0 has no valid release record"]


def _delete_release(site: Site, older: dict[str, bytes]) -> list[str]:
    (site.root / "registry" / RELEASE).unlink()
    return [f"{STATE}: candidate 1.0.0 has no valid release record"]


def _flip_state(site: Site, older: dict[str, bytes]) -> list[str]:
    flip(site.root / "registry" / STATE)
    return [f"{STATE}: "]


def _replay_state(site: Site, older: dict[str, bytes]) -> list[str]:
    (site.root / "registry" / STATE).write_bytes(older[STATE])
    return [f"{MID}: sequence 2 is ahead of the state's 1"]


def _flip_manifest(site: Site, older: dict[str, bytes]) -> list[str]:
    flip(site.root / "registry" / MID)
    return [f"{MID}: "]


def _other_tier_manifest(site: Site, older: dict[str, bytes]) -> list[str]:
    shutil.copy(
        site.root / "registry" / f"manifests/{MODEL}/high.json", site.root / "registry" / MID
    )
    return [f"{MID}: does not match the rollout state"]


def _manifest_of_another_key(site: Site, older: dict[str, bytes]) -> list[str]:
    write_key(site.root / "forger.pem")
    manifest = site.registry().read_manifest(MODEL, "mid")
    forged = sign_document(manifest, [read_private_key_file(site.root / "forger.pem")])
    (site.root / "registry" / MID).write_bytes(forged)
    return [f"{MID}: no signature by a trusted key"]


def _planted_key(site: Site, older: dict[str, bytes]) -> list[str]:
    keyid = write_key(site.root / "planted.pem")
    (site.root / "registry" / "keys" / f"{keyid}.pem").write_bytes(
        (site.root / "planted.pub.pem").read_bytes()
    )
    return [f"keys/{keyid}.pem: key {keyid[:12]} is not pinned in the project"]


def _private_key_in_keys(site: Site, older: dict[str, bytes]) -> list[str]:
    shutil.copy(site.root / KEY_FILE, site.root / "registry" / "keys" / "oops.pem")
    return ["keys/oops.pem: holds a PRIVATE key"]


def _not_a_key_in_keys(site: Site, older: dict[str, bytes]) -> list[str]:
    (site.root / "registry" / "keys" / "junk.pem").write_text("hello\n")
    return ["keys/junk.pem: not a PEM public key"]


def _state_deleted(site: Site, older: dict[str, bytes]) -> list[str]:
    (site.root / "registry" / STATE).unlink()
    return [f"{STATE}: missing, but manifests of {MODEL} exist"]


TAMPERING = [
    pytest.param(_flip_blob, id="blob-flipped"),
    pytest.param(_truncate_blob, id="blob-truncated"),
    pytest.param(_delete_blob, id="blob-deleted"),
    pytest.param(_flip_release, id="release-flipped"),
    pytest.param(_delete_release, id="release-deleted"),
    pytest.param(_flip_state, id="state-flipped"),
    pytest.param(_replay_state, id="state-replayed"),
    pytest.param(_flip_manifest, id="manifest-flipped"),
    pytest.param(_other_tier_manifest, id="manifest-of-another-tier"),
    pytest.param(_manifest_of_another_key, id="manifest-signed-by-another-key"),
    pytest.param(_planted_key, id="key-planted-in-keys"),
    pytest.param(_private_key_in_keys, id="private-key-in-keys"),
    pytest.param(_not_a_key_in_keys, id="junk-in-keys"),
    pytest.param(_state_deleted, id="state-deleted"),
]


@pytest.mark.parametrize("tamper", TAMPERING)
def test_tampering_fails_verify_naming_the_object(
    rolled: tuple[Site, dict[str, bytes]], tamper: Callable[[Site, dict[str, bytes]], list[str]]
) -> None:
    site, older = rolled
    expected = tamper(site, older)
    result = site.run("verify", "--json")
    assert result.exit_code == 9, result.output
    errors = json.loads(result.stdout)["errors"]
    for fragment in expected:
        assert any(error.startswith(fragment) or fragment in error for error in errors), (
            f"{fragment!r} not in {errors}"
        )
    human = site.run("verify")
    assert human.exit_code == 9
    assert f"{len(errors)} problem(s)" in human.stdout
    assert all(f"error: {error}" in human.stdout for error in errors)


def test_a_replayed_older_manifest_is_reported_as_behind(
    rolled: tuple[Site, dict[str, bytes]],
) -> None:
    """An older, validly signed manifest is what a crash between state and manifests leaves.

    verify cannot tell the two apart, so it warns (exit 0) and names the fix;
    apps refuse it anyway once they have seen a higher sequence.
    """
    site, older = rolled
    (site.root / "registry" / MID).write_bytes(older[MID])
    report = verify_json(site)
    assert report["ok"] is True
    assert report["errors"] == []
    assert report["warnings"] == [
        f"{MID}: sequence 1 is behind the state's 2 (an interrupted command?); run it "
        f"again or `edgereg resign {MODEL}`"
    ]
    assert "warning: " + MID in site.run("verify").stdout
    (site.root / "registry" / f"manifests/{MODEL}/low.json").unlink()
    report = verify_json(site)
    assert (
        f"manifests/{MODEL}/low.json: missing; run `edgereg resign {MODEL}` to write it"
        in (report["warnings"])
    )
    ok(site.run("resign", MODEL))
    assert verify_json(site)["warnings"] == []


def test_flipping_any_byte_of_a_signed_document_fails_verification(
    rolled: tuple[Site, dict[str, bytes]],
) -> None:
    site, _ = rolled
    trusted = site.public_keys()
    objects = site.objects()
    rng = random.Random(7)
    for key, kind in ((STATE, RolloutState), (RELEASE, ReleaseRecord), (MID, Manifest)):
        data = objects[key]
        verify_document(kind, data, trusted)  # the original verifies
        positions = {0, len(data) - 1, *rng.sample(range(len(data)), 60)}
        for position in sorted(positions):
            tampered = bytearray(data)
            tampered[position] ^= rng.randrange(1, 256)
            with pytest.raises(TrustError):
                verify_document(kind, bytes(tampered), trusted)


GARBAGE: dict[str, Callable[[Site], bytes]] = {
    "not-json": lambda site: b"\x00garbage",
    "unsigned": lambda site: json.dumps(site.state().model_dump(mode="json")).encode(),
    "another-key": lambda site: sign_document(
        site.state(), [read_private_key_file(site.root / "forger.pem")]
    ),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_an_untrustworthy_state_is_a_trust_error(site: Site, kind: str) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    write_key(site.root / "forger.pem")
    (site.root / "registry" / STATE).write_bytes(GARBAGE[kind](site))
    before = site.snapshot()
    for command in (
        ["status"],
        ["history", MODEL],
        ["rollout", MODEL, "--to", "25%", "--force"],
        ["publish", MODEL, "--canary", "5%", "--version", "2.0.0"],
    ):
        assert_refused(site.run(*command), 5, "envelope" if kind != "another-key" else "trusted")
    assert site.snapshot() == before
    report = verify_json(site)
    assert report["ok"] is False
    assert [e for e in report["errors"] if e.startswith(f"{STATE}: ")]


@pytest.mark.parametrize("damage", ["deleted", "tampered"])
def test_a_command_refuses_before_writing_a_state_whose_release_is_damaged(
    site: Site, damage: str
) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    path = site.root / "registry" / RELEASE
    if damage == "deleted":
        path.unlink()
    else:
        # Alter the signed payload but keep the envelope well-formed, so the
        # failure is the signature whatever bytes this run's record holds.
        envelope = json.loads(path.read_bytes())
        payload = base64.b64decode(envelope["payload"]).replace(b'"1.0.0"', b'"1.0.1"', 1)
        envelope["payload"] = base64.b64encode(payload).decode()
        path.write_text(json.dumps(envelope))
    before = site.snapshot()
    for command in (["rollout", MODEL, "--to", "25%", "--force"], ["pause", MODEL]):
        result = site.run(*command)
        assert result.exit_code in (5, 6), result.output
        assert_refused(result, result.exit_code, RELEASE if damage == "deleted" else "signature")
    assert site.snapshot() == before


# Finding 1: keys/ lives in the storage the docs call untrusted. A key planted
# there, with a state signed by it, must pass no command, and no command may
# re-sign it with the real key.
LAUNDERING = [
    # id, command, exit code, what the message must say
    ("status", ["status"], 5, [f"{STATE}: no signature by a trusted key"]),
    ("status-of-the-model", ["status", MODEL], 5, ["no signature by a trusted key"]),
    ("history", ["history", MODEL], 5, ["no signature by a trusted key"]),
    ("resign", ["resign", MODEL], 5, ["no signature by a trusted key"]),
    ("resign-with-the-planted-key", ["resign", MODEL, "--key", "forger.pem"], 5, ["not one of"]),
    ("rollout", ["rollout", MODEL, "--to", "50%", "--force"], 5, ["no signature by a trusted"]),
    ("promote", ["promote", MODEL, "--force"], 5, ["no signature by a trusted key"]),
    ("rollback", ["rollback", MODEL], 5, ["no signature by a trusted key"]),
    ("pause", ["pause", MODEL], 5, ["no signature by a trusted key"]),
    (
        "publish",
        ["publish", MODEL, "--canary", "5%", "--version", "1.1.0"],
        5,
        ["no signature by a trusted key"],
    ),
]


@pytest.fixture
def laundered(site: Site) -> Site:
    """A registry where someone with write access planted a key and re-signed the state."""
    ok(site.run("publish", MODEL, "--full"))
    ok(site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    keyid = write_key(site.root / "forger.pem")
    forger = read_private_key_file(site.root / "forger.pem")
    (site.root / "registry" / "keys" / f"{keyid}.pem").write_bytes(forger.public_pem())
    state = site.state().model_copy(update={"percent": 100.0})
    (site.root / "registry" / STATE).write_bytes(sign_document(state, [forger]))
    return site


@pytest.mark.parametrize(
    ("command", "exit_code", "fragments"),
    [pytest.param(*row[1:], id=row[0]) for row in LAUNDERING],
)
def test_a_planted_key_passes_no_command(
    laundered: Site, command: list[str], exit_code: int, fragments: list[str]
) -> None:
    before = laundered.snapshot()
    assert_refused(laundered.run(*command), exit_code, *fragments)
    assert laundered.snapshot() == before


def test_verify_names_the_planted_key_and_what_it_signed(laundered: Site) -> None:
    result = laundered.run("verify", "--json")
    assert result.exit_code == 9, result.output
    errors = json.loads(result.stdout)["errors"]
    assert any("is not pinned in the project" in e for e in errors), errors
    assert any(e.startswith(f"{STATE}: no signature by a trusted key") for e in errors), errors
    assert_refused(laundered.run("verify", "--trusted-key", "nope.pem"), 5, "nope.pem")


def test_verify_names_what_does_not_belong_in_keys_on_s3(s3site: Site) -> None:
    ok(s3site.run("publish", MODEL, "--full"))
    bucket = s3site.url.removeprefix("s3://").split("/", 1)[0]
    keyid = write_key(s3site.root / "planted.pem")
    planted = (s3site.root / "planted.pub.pem").read_bytes()
    s3site.s3.put_object(Bucket=bucket, Key=f"reg/keys/{keyid}.pem", Body=planted)
    s3site.s3.put_object(
        Bucket=bucket, Key="reg/keys/oops.pem", Body=(s3site.root / KEY_FILE).read_bytes()
    )
    result = s3site.run("verify", "--json")
    assert result.exit_code == 9, result.output
    errors = json.loads(result.stdout)["errors"]
    assert any(e.startswith(f"keys/{keyid}.pem: key {keyid[:12]} is not pinned") for e in errors)
    assert any(e.startswith("keys/oops.pem: holds a PRIVATE key") for e in errors), errors
    assert b"PRIVATE" not in result.stdout_bytes.replace(b"a PRIVATE key", b"")


def test_the_status_page_does_not_launder_a_planted_key(laundered: Site) -> None:
    from registrykit import PINNED_DIR

    from edgereg.serve._status_page import render_status_page
    from edgereg.signing import read_trusted_keys

    storage = laundered.registry().storage
    pinned = read_trusted_keys([laundered.root / PINNED_DIR])
    verified = render_status_page(storage, trusted=lambda: pinned)
    assert "no signature by a trusted key" in verified
    assert "Unverified" not in verified
    # Without pinned keys the page still renders, and says it is unverified.
    unverified = render_status_page(storage)
    assert "Unverified: no pinned publisher keys" in unverified


# Issue #22: a deleted state.json must not restart the history at sequence 1.
LOST_STATE_COMMANDS = [
    ("publish", MODEL, "--full", "--version", "0.0.1"),
    ("publish", MODEL, "--canary", "5%", "--version", "2.0.0"),
    ("rollout", MODEL, "--to", "50%", "--force"),
    ("promote", MODEL, "--force"),
    ("rollback", MODEL),
    ("resign", MODEL),
    ("pause", MODEL),
]


@pytest.mark.parametrize("command", LOST_STATE_COMMANDS, ids=lambda c: "-".join(c[:1] + c[2:3]))
def test_a_write_over_a_lost_state_is_refused_with_the_repair_command(
    rolled: tuple[Site, dict[str, bytes]], command: tuple[str, ...]
) -> None:
    site, _ = rolled
    (site.root / "registry" / STATE).unlink()
    before = site.snapshot()
    assert_refused(
        site.run(*command), 7, f"{STATE} is missing", "sequence 1", "edgereg rebuild-state"
    )
    assert site.snapshot() == before


def _manifests(site: Site) -> dict[str, Manifest]:
    registry = site.registry()
    return {
        key: verify_document(Manifest, data, registry.trusted_keys())
        for key, data in site.objects().items()
        if key.startswith(f"manifests/{MODEL}/")
    }


def test_rebuild_state_restores_the_rollout_above_every_manifest(
    rolled: tuple[Site, dict[str, bytes]],
) -> None:
    site, _ = rolled
    lost, _ = site.registry().read_state(MODEL)
    assert lost is not None
    (site.root / "registry" / STATE).unlink()
    result = ok(site.run("rebuild-state", MODEL, "--json"))
    assert json.loads(result.stdout)["sequence"] == lost.sequence + 1
    state, _ = site.registry().read_state(MODEL)
    assert state is not None
    assert state.snapshot() == lost.snapshot()
    assert state.salt == lost.salt  # the same devices stay in the cohort
    assert [event.action for event in state.history] == ["rebuild"]
    assert {m.sequence for m in _manifests(site).values()} == {lost.sequence + 1}
    ok(site.run("verify"))
    ok(site.run("promote", MODEL, "--force"))
    # A second rebuild has nothing to do.
    before = site.snapshot()
    assert_refused(site.run("rebuild-state", MODEL), 7, "exists", "nothing to rebuild")
    assert site.snapshot() == before


def test_rebuild_state_without_manifests_needs_an_explicit_recorded_reset(
    rolled: tuple[Site, dict[str, bytes]],
) -> None:
    site, _ = rolled
    highest = max(m.sequence for m in _manifests(site).values())
    (site.root / "registry" / STATE).unlink()
    shutil.rmtree(site.root / "registry" / "manifests" / MODEL)
    before = site.snapshot()
    assert_refused(site.run("publish", MODEL, "--full", "--version", "0.0.1"), 7, "rebuild-state")
    assert_refused(site.run("rebuild-state", MODEL), 7, "no manifest", "--reset --sequence")
    assert_refused(site.run("rebuild-state", MODEL, "--reset"), 7, "--sequence N")
    assert site.snapshot() == before
    ok(site.run("rebuild-state", MODEL, "--reset", "--sequence", str(highest + 10)))
    state, _ = site.registry().read_state(MODEL)
    assert state is not None
    assert state.stable is None
    assert state.candidate is None
    assert state.sequence == highest + 10
    assert [event.action for event in state.history] == ["reset"]
    ok(site.run("publish", MODEL, "--full", "--version", "2.0.0"))
    assert {m.sequence for m in _manifests(site).values()} == {highest + 11}


# Issue #30: a state.json restored from before a rollback must not bring the candidate back.
STALE_STATE_COMMANDS = [
    ("rollout", MODEL, "--to", "50%", "--force"),
    ("rollout", MODEL, "--to", "100%", "--force"),
    ("rollout", MODEL, "--next", "--force"),
    ("promote", MODEL, "--force"),
    ("rollback", MODEL),
    ("pause", MODEL),
    ("resign", MODEL),
    ("publish", MODEL, "--canary", "5%", "--version", "2.0.0"),
]


@pytest.fixture
def stale(site: Site) -> tuple[Site, bytes]:
    """Stable 0.9.0 with candidate 1.0.0 rolled back, then state.json restored from before.

    Returns the site and the stale state's bytes (sequence 3, candidate 1.0.0 at 25%),
    while the manifests say sequence 4 (no candidate).
    """
    ok(site.run("publish", MODEL, "--full", "--version", "0.9.0"))
    ok(site.run("publish", MODEL, "--canary", "5%"))
    ok(site.run("rollout", MODEL, "--to", "25%", "--force"))
    backup = (site.root / "registry" / STATE).read_bytes()
    ok(site.run("rollback", MODEL))
    (site.root / "registry" / STATE).write_bytes(backup)
    return site, backup


@pytest.mark.parametrize(
    "command", STALE_STATE_COMMANDS, ids=lambda c: "-".join(c[:1] + c[2:4]).replace("%", "")
)
def test_a_write_from_a_stale_state_is_refused_naming_both_sequences(
    stale: tuple[Site, bytes], command: tuple[str, ...]
) -> None:
    site, _ = stale
    before = site.snapshot()
    assert_refused(
        site.run(*command),
        7,
        f"{STATE} is at sequence 3",
        "behind sequence 4",
        "edgereg rebuild-state",
    )
    assert site.snapshot() == before
    assert all(m.candidate is None for m in _manifests(site).values())


def test_rebuild_state_replaces_a_stale_state_and_the_rollback_holds(
    stale: tuple[Site, bytes],
) -> None:
    site, _ = stale
    result = ok(site.run("rebuild-state", MODEL, "--json"))
    assert json.loads(result.stdout)["sequence"] == 5
    state, _ = site.registry().read_state(MODEL)
    assert state is not None
    assert (state.stable, state.candidate) == ("0.9.0", None)
    assert [event.action for event in state.history] == ["publish", "publish", "rollout", "rebuild"]
    assert "state at sequence 3 was stale" in (state.history[-1].note or "")
    ok(site.run("verify"))
    # The rolled-back candidate stays gone: there is none to move.
    refused = site.run("rollout", MODEL, "--to", "50%", "--force")
    assert_refused(refused, 7, "no rollout in progress")
    # A state that is current has nothing to rebuild.
    assert_refused(site.run("rebuild-state", MODEL), 7, "exists", "nothing to rebuild")


def test_an_interrupted_first_publish_can_still_be_run_again(site: Site) -> None:
    """Its own release record without a state is no lost history."""
    ok(site.run("publish", MODEL, "--canary", "5%"))
    shutil.rmtree(site.root / "registry" / "manifests" / MODEL)
    (site.root / "registry" / STATE).unlink()
    ok(site.run("publish", MODEL, "--canary", "5%"))
