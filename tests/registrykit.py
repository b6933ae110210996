"""Shared by the registry test modules (publish, rollout commands, safety).

The tiny project built once per session (tests/buildkit.py), :class:`Site`
(a project copy as the current directory plus the registry its commands
use), snapshots, and the fixtures ``built``, ``site``, ``s3site`` and
``any_site`` (registered by tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import buildkit
import pytest
from buildkit import Project
from click.testing import CliRunner, Result
from s3server import make_client

from edgereg.build.outputs import ARTIFACT
from edgereg.cli import main
from edgereg.registry import Registry
from edgereg.signing import TrustedKeys, generate_key, key_id, load_public_key, read_trusted_keys
from edgereg.storage import open_storage
from edgereg.wire import Manifest, RolloutState

MODEL = buildkit.IMAGE_MODEL  # "vision": three variants, one per tier
OTHER = buildkit.TENSOR_MODEL  # "sensor"
TIERS = ("high", "mid", "low")
VERSION = "1.0.0"  # models.toml's version of both models
KEY_FILE = ".edgereg/signing-key.pem"  # the CLI's default key, relative to the project
PUBLIC_KEY_FILE = ".edgereg/signing-key.pub.pem"
PINNED_DIR = "publisher-keys"  # models.toml's default [registry] trusted_keys
_DONE = ".built-for-registry-tests"


# --- the built project, shared by the registry test modules --------------------------


def build_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny project with every variant built and a signing key, made once per session.

    Kept under the session's base temp directory, so it is built once per
    test session whichever module asks first.
    """
    root = tmp_path_factory.getbasetemp() / "registry-built-project"
    if not (root / _DONE).exists():
        shutil.rmtree(root, ignore_errors=True)
        project = buildkit.write_project(root)
        for model, variants in buildkit.VARIANTS.items():
            for variant in variants:
                project.build(model, variant)
        pin_key(root, write_key(root / KEY_FILE), root / PUBLIC_KEY_FILE)
        (root / _DONE).touch()
    return root


def write_key(path: Path) -> str:
    """Write a fresh private key (mode 0600) and its .pub.pem next to it; return its id."""
    private_pem, public_pem = generate_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_pem)
    path.with_name(path.stem + ".pub.pem").write_bytes(public_pem)
    return key_id(load_public_key(public_pem))


def pin_key(project_root: Path, keyid: str, public_key_file: Path) -> Path:
    """Pin a public key in the project, as `edgereg keys generate` does."""
    pinned = project_root / PINNED_DIR / f"{keyid}.pem"
    pinned.parent.mkdir(parents=True, exist_ok=True)
    pinned.write_bytes(public_key_file.read_bytes())
    return pinned


def copy_project(built: Path, dest: Path) -> Project:
    """A private copy of the built project (build outputs and key included)."""
    shutil.copytree(built, dest, ignore=shutil.ignore_patterns(_DONE))
    return Project(dest)


def cli(*args: str) -> Result:
    """Run edgereg in-process, as a user would in the current directory."""
    return CliRunner().invoke(main, list(args))


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}:\n{result.output}"
    return result


def assert_refused(result: Result, exit_code: int, *fragments: str) -> str:
    """A clean refusal: the exit code, one paragraph on stderr naming the problem."""
    assert result.exit_code == exit_code, (
        f"exit {result.exit_code}, not {exit_code}:\n{result.output}"
    )
    assert "Traceback" not in result.output
    message = result.stderr.strip()
    assert message.startswith("error: "), message
    assert "\n\n" not in message, f"not one paragraph:\n{message}"
    for fragment in fragments:
        assert fragment.lower() in message.lower(), f"{fragment!r} not in:\n{message}"
    return message


@dataclass
class Site:
    """A project copy (the current directory) and the registry its commands use.

    Attributes:
        project: The copy; its models.toml and build/ are what commands read.
        url: The registry URL.
        flags: What every registry command gets (--registry, --endpoint-url).
        endpoint: The S3 endpoint, for S3 registries.
        s3: A plain boto3 client on that endpoint, to inspect the bucket.
    """

    project: Project
    url: str
    flags: tuple[str, ...] = ()
    endpoint: str | None = None
    s3: Any = None

    @property
    def root(self) -> Path:
        return self.project.root

    def run(self, command: str, *args: str) -> Result:
        """``edgereg COMMAND ARGS`` against this site's registry."""
        return cli(*command.split(), *args, *self.flags)

    def registry(self, trusted: TrustedKeys | None = None) -> Registry:
        """The registry, verifying against ``trusted`` (default: the keys pinned in the project)."""
        if trusted is None:
            trusted = read_trusted_keys([self.root / PINNED_DIR])
        return Registry(open_storage(self.url, endpoint_url=self.endpoint), trusted=trusted)

    def public_keys(self, *files: str) -> TrustedKeys:
        """The public keys in these files of the project (default: the signing key)."""
        return TrustedKeys.from_pems(
            (self.root / name).read_bytes() for name in (files or (PUBLIC_KEY_FILE,))
        )

    def snapshot(self) -> dict[str, bytes]:
        """Every object of the registry, with its bytes (local: every file, dotfiles too)."""
        if self.s3 is not None:
            bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
            return s3_objects(self.s3, bucket, prefix)
        return dir_files(Path(self.url.removeprefix("file://")))

    def objects(self) -> dict[str, bytes]:
        """The registry's objects without the local backend's bookkeeping files."""
        return {
            key: data
            for key, data in self.snapshot().items()
            if not key.rsplit("/", 1)[-1].startswith((".lock-", ".tmp-"))
        }

    def state(self, model: str = MODEL) -> RolloutState:
        state, _ = self.registry().read_state(model)
        assert state is not None
        return state

    def manifests(self, model: str = MODEL) -> dict[str, Manifest]:
        registry = self.registry()
        return {tier: registry.read_manifest(model, tier) for tier in TIERS}

    def artifact(self, model: str, variant: str) -> bytes:
        return (self.project.out_dir(model, variant) / ARTIFACT).read_bytes()


def dir_files(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def s3_objects(client: Any, bucket: str, prefix: str = "") -> dict[str, bytes]:
    root = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
        for item in page.get("Contents", ()):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            found[item["Key"][len(root) :]] = body
    return found


def enter(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work in the project directory, with no signing key or actor from the environment."""
    monkeypatch.chdir(project.root)
    for name in ("EDGEREG_SIGNING_KEY", "EDGEREG_SIGNING_KEY_FILE", "EDGEREG_ACTOR"):
        monkeypatch.delenv(name, raising=False)


def local_site(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    """A project copy as the current directory, with its default registry (./registry)."""
    project = copy_project(built, tmp_path / "project")
    enter(project, monkeypatch)
    return Site(project, f"file://{project.root / 'registry'}")


def s3_site(
    built: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    endpoint: str,
    bucket: str,
) -> Site:
    """A project copy as the current directory, publishing to s3://BUCKET/reg."""
    project = copy_project(built, tmp_path / "project")
    enter(project, monkeypatch)
    url = f"s3://{bucket}/reg"
    return Site(
        project,
        url,
        ("--registry", url, "--endpoint-url", endpoint),
        endpoint=endpoint,
        s3=make_client(endpoint),
    )


def add_table(project: Project, text: str) -> None:
    """Append TOML tables (like [rollout]) to models.toml."""
    project.config_path.write_text(project.toml() + "\n" + text.strip() + "\n", encoding="utf-8")


# --- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(tmp_path_factory)


@pytest.fixture
def site(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    return local_site(built, tmp_path, monkeypatch)


@pytest.fixture
def s3site(
    built: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    moto_endpoint: str,
    s3_bucket: str,
) -> Site:
    return s3_site(built, tmp_path, monkeypatch, moto_endpoint, s3_bucket)


@pytest.fixture(params=["local", "s3"])
def any_site(request: pytest.FixtureRequest) -> Site:
    site: Site = request.getfixturevalue("site" if request.param == "local" else "s3site")
    return site


# --- keys ----------------------------------------------------------------------------
