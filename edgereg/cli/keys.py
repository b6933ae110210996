"""`edgereg keys generate`: a signing key pair, pinned and published."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edgereg import config as config_module
from edgereg._files import atomic_write
from edgereg.cli._common import (
    DEFAULT_KEY_FILE,
    default_key_file,
    handle_errors,
    open_registry,
    optional_config,
    print_note,
    print_result,
    registry_read_options,
    stderr,
)
from edgereg.errors import EdgeregError


@click.group()
def keys() -> None:
    """Signing keys."""


@keys.command("generate")
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Private key file to write (mode 0600); the public key goes next to it. "
    f"Default: {DEFAULT_KEY_FILE} beside models.toml.",
)
@click.option(
    "--add",
    is_flag=True,
    help="Add a key next to the pinned ones (rotation, a recovery key: docs/operations/keys.md).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing private key file at --out.")
@click.option("--no-publish", is_flag=True, help="Do not put the public key into the registry.")
@registry_read_options
@handle_errors
def keys_generate(
    out: Path | None,
    add: bool,
    force: bool,
    no_publish: bool,
    config_path: Path,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Create an Ed25519 key pair, pin its public key in the project and publish it."""
    from edgereg.protocol.envelope import Signer, generate_key

    config = optional_config(config_path)
    out = out if out is not None else default_key_file(config)
    registry = None
    if not no_publish and (config is not None or registry_url is not None):
        registry = open_registry(config, registry_url, endpoint_url, trusted_key_paths, create=True)
    pin_dir = _pin_directory(config)
    _refuse_key_inside(out, registry, pin_dir)
    if out.exists() and not force:
        raise EdgeregError(
            f"{out} already exists; refusing to overwrite a private key",
            hint="Use it as it is, choose another --out, or pass --force.",
        )
    if not add:
        _refuse_second_key(config, trusted_key_paths, registry)
    private_pem, public_pem = generate_key()
    signer = Signer.from_pem(private_pem)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, private_pem, mode=0o600)
    public_path = out.with_name(out.stem + ".pub.pem")
    atomic_write(public_path, public_pem)
    if not as_json:
        print_result(f"wrote private key {out} (mode 0600) and public key {public_path}")
        print_result(f"key id {signer.key_id}")
    pinned_at = None
    if pin_dir is not None:
        pinned_at = pin_dir / f"{signer.key_id}.pem"
        pin_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(pinned_at, public_pem)
        print_note(
            f"pinned the public key in {pinned_at}: commit it; registry commands verify "
            "against the keys pinned there"
        )
    elif config is None:
        stderr.print(
            f"no models.toml here, so the key is not pinned: pass --trusted-key {public_path} "
            "to registry commands",
            markup=False,
        )
    else:
        stderr.print(
            f"warning: [registry] trusted_keys of {config.path} names no directory to pin "
            f"the key in; add {public_path} to it",
            markup=False,
        )
    published_to = None
    if registry is not None:
        registry.add_public_key(signer)
        published_to = registry.storage.url
        print_note(f"published the public key to {published_to}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "key_id": signer.key_id,
                    "private_key": str(out),
                    "public_key": str(public_path),
                    "pinned": None if pinned_at is None else str(pinned_at),
                    "published_to": published_to,
                }
            )
        )


def _pin_directory(config: config_module.Config | None) -> Path | None:
    """The first directory of [registry] trusted_keys: where a new key is pinned."""
    if config is None:
        return None
    for path in config.trusted_key_paths():
        if path.is_dir() or (not path.exists() and path.suffix != ".pem"):
            return path
    return None


def _refuse_key_inside(out: Path, registry: Any, pin_dir: Path | None) -> None:
    """A private key never goes into the registry (it is served) or the pinned keys (committed)."""
    target = out.resolve()
    places = [("the pinned publisher keys", pin_dir)]
    root = getattr(registry.storage, "root", None) if registry is not None else None
    if isinstance(root, Path):
        places.append((f"the registry {registry.storage.url}", root))
    for what, place in places:
        if place is not None and target.is_relative_to(place.resolve()):
            raise EdgeregError(
                f"--out {out} is inside {what} ({place}); a private key there would be "
                "published or committed",
                hint=f"Keep the private key outside it, e.g. the default {DEFAULT_KEY_FILE}.",
            )


def _refuse_second_key(
    config: config_module.Config | None, trusted_key_paths: tuple[Path, ...], registry: Any
) -> None:
    """A second key needs --add: apps that trust the first would reject what it signs."""
    from edgereg.cli._common import pinned_keys
    from edgereg.protocol.envelope import TrustedKeys

    existing = dict(pinned_keys(config, trusted_key_paths))
    where = "pinned in the project"
    if not existing and registry is not None:
        existing = dict(registry.published_keys())
        where = f"published in {registry.storage.url}"
    if existing:
        known = ", ".join(keyid[:12] for keyid in TrustedKeys(existing.values()))
        raise EdgeregError(
            f"a publisher key already exists ({known}, {where}); a new key would sign "
            "documents that every app trusting the existing key rejects (unknown-key)",
            hint="Sign with the existing key (--key PATH). To rotate, or to make a recovery "
            "key, follow docs/operations/keys.md: `edgereg keys generate --add --out NEW.pem`.",
        )
