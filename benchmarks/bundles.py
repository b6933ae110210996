"""Bundle benchmark: a fleet of devices against a bundle of three on a canary.

Builds the tiny project of tests/buildkit.py (its two models plus a third,
``tagger``, with a single variant that every tier falls back to), publishes
the three models as one bundle through the real publish path to a local
registry, and asks the protocol's own ``decide(..., bundle=True)`` what each
of 1,000 simulated device ids installs, for every tier, at a 5 % and then a
50 % canary of the next bundle version (every member at a new version).

For comparison the same three models are published on their own, each with
its own 5 % and 50 % canary (its own salt, as before bundles existed), and
the same devices counted.

Targets:

1. zero mixed installs with the bundle (a device has every member at the
   stable bundle's versions or every member at the candidate's);
2. the bundle's cohort is the share of the rollout (within 3 standard errors);
3. the signed manifest of a bundle of three per tier (reported, bytes),
   against the three manifests of the models on their own.

Usage: .venv/bin/python benchmarks/bundles.py [--devices 1000]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from edgereg import config as config_module  # noqa: E402
from edgereg.protocol.decision import decide  # noqa: E402
from edgereg.protocol.wire import BundleEntry, ManifestEntry  # noqa: E402
from edgereg.registry import (  # noqa: E402
    Registry,
    manifest_key,
    prepare_bundle_release,
    prepare_release,
    utcnow,
)
from edgereg.registry._transitions import set_percent  # noqa: E402
from edgereg.signing import Signer, TrustedKeys, generate_key  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

BUNDLE = "kit"
MEMBERS = ("vision", "sensor", "tagger")
TIERS = ("high", "mid", "low")
results: list[tuple[str, bool, str]] = []


def report(target: str, passed: bool, measured: str) -> None:
    results.append((target, passed, measured))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}", flush=True)


def build_project(root: Path) -> Path:
    """The tiny project, a third model (one variant for every tier), the bundle; built."""
    import buildkit

    project = buildkit.write_project(root)
    text = project.toml()
    start = text.index("[models.vision]\n")
    end = text.index("[models.vision.variants.fp32]")
    third = text[start:end].replace("[models.vision", "[models.tagger")
    third = third.replace("[[models.vision", "[[models.tagger")
    third += '[models.tagger.variants.w8]\ntier = "low"\n'
    third += 'quantization = { mode = "weight", bits = 8 }\nruntime = { threads = 1 }\n'
    bundle = f'\n[bundles.{BUNDLE}]\nversion = "1.0.0"\nmodels = {list(MEMBERS)!r}\n'
    project.config_path.write_text(text + "\n" + third + bundle.replace("'", '"'), encoding="utf-8")
    for model, variants in {**buildkit.VARIANTS, "tagger": ("w8",)}.items():
        for variant in variants:
            project.build(model, variant)
    return root


def set_member_versions(project: Path, version: str) -> config_module.Config:
    """models.toml with every member (and the bundle) at ``version``; builds stay current."""
    path = project / "models.toml"
    text = path.read_text(encoding="utf-8")
    lines = [
        f'version = "{version}"' if line.startswith("version = ") else line
        for line in text.splitlines()
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config_module.load(path)


def publish(registry: Registry, prepared: Any, signer: Signer, percent: float | None) -> None:
    """``percent`` None: published --full."""
    registry.publish(
        prepared,
        signer=signer,
        percent=percent,
        full=percent is None,
        actor="bench",
        expires_days=30,
    )


def change_percent(registry: Registry, name: str, percent: float, signer: Signer) -> None:
    registry.change(
        name,
        lambda state, now, expires: set_percent(
            state,
            name,
            percent,
            policy=config_module.RolloutPolicy(),
            now=now,
            expires=expires,
            actor="bench",
            force=True,
        ),
        signer=signer,
        expires_days=30,
    )


def decided(
    registry: Registry, trusted: TrustedKeys, name: str, tier: str, device: str, *, bundle: bool
) -> ManifestEntry | BundleEntry | None:
    data = registry.storage.get(manifest_key(name, tier))
    return decide(
        data,
        trusted=trusted,
        model=name,
        tier=tier,
        device_id=device,
        app_mnn_runtime="3.6.1",
        highest_seen_sequence=None,
        now=utcnow(),
        bundle=bundle,
    ).entry


def fleet(
    registry: Registry, trusted: TrustedKeys, devices: int, *, bundled: bool
) -> dict[str, Any]:
    """What every device of every tier installs: version sets, mixes, cohort share."""
    mixed = candidate = 0
    combos: set[tuple[str, ...]] = set()
    started = time.perf_counter()
    for tier in TIERS:
        for index in range(devices):
            device = f"device-{index:05d}"
            if bundled:
                entry = decided(registry, trusted, BUNDLE, tier, device, bundle=True)
                assert isinstance(entry, BundleEntry)
                versions = tuple(entry.members[m].version for m in MEMBERS)
            else:
                found = [decided(registry, trusted, m, tier, device, bundle=False) for m in MEMBERS]
                versions = tuple(e.version if e else "-" for e in found)
            combos.add(versions)
            mixed += len(set(versions)) > 1
            candidate += versions[0] == "2.0.0"
    took = time.perf_counter() - started
    total = devices * len(TIERS)
    return {
        "mixed": mixed,
        "combos": len(combos),
        "share": 100 * candidate / total,
        "decide_us": 1e6 * took / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        project = build_project(tmp / "project")
        print(f"tiny project (3 models) built in {time.perf_counter() - started:.1f}s")
        private_pem, public_pem = generate_key()
        signer = Signer.from_pem(private_pem)
        trusted = TrustedKeys.from_pems([public_pem])
        out = project / "build"

        bundled = Registry(open_storage(f"file://{tmp / 'bundled'}"), trusted=trusted)
        alone = Registry(open_storage(f"file://{tmp / 'alone'}"), trusted=trusted)
        config = config_module.load(project / "models.toml")
        now = utcnow()
        publish(
            bundled,
            prepare_bundle_release(config, BUNDLE, out, version="1.0.0", now=now),
            signer,
            None,
        )
        for model in MEMBERS:
            publish(
                alone, prepare_release(config, model, out, version="1.0.0", now=now), signer, None
            )
        config = set_member_versions(project, "2.0.0")
        started = time.perf_counter()
        publish(
            bundled,
            prepare_bundle_release(config, BUNDLE, out, version="2.0.0", now=now),
            signer,
            5.0,
        )
        print(f"bundle publish of 3 members: {time.perf_counter() - started:.2f}s")
        for model in MEMBERS:
            publish(
                alone, prepare_release(config, model, out, version="2.0.0", now=now), signer, 5.0
            )

        for percent in (5.0, 50.0):
            if percent != 5.0:
                change_percent(bundled, BUNDLE, percent, signer)
                for model in MEMBERS:
                    change_percent(alone, model, percent, signer)
            together = fleet(bundled, trusted, args.devices, bundled=True)
            apart = fleet(alone, trusted, args.devices, bundled=False)
            devices = args.devices * len(TIERS)
            print(
                f"\n{percent:g}% canary, {devices} device/tier pairs: bundle {together['mixed']} "
                f"mixed, {together['combos']} version combinations; models alone "
                f"{apart['mixed']} mixed ({100 * apart['mixed'] / devices:.1f}%), "
                f"{apart['combos']} combinations; decide() {together['decide_us']:.0f} us per "
                f"device for the bundle, {apart['decide_us']:.0f} us for its three models"
            )
            report(
                f"zero mixed installs at a {percent:g}% canary",
                together["mixed"] == 0,
                f"{together['mixed']} of {devices} (models alone: {apart['mixed']})",
            )
            # The tiers share the device ids: ``devices`` independent draws.
            tolerance = 300 * math.sqrt(percent / 100 * (1 - percent / 100) / args.devices)
            report(
                f"the bundle's cohort is {percent:g}% of devices (within 3 standard errors, "
                f"{tolerance:.1f} points)",
                abs(together["share"] - percent) <= tolerance,
                f"{together['share']:.1f}%",
            )

        print("\nmanifest sizes (signed envelope bytes)")
        for tier in TIERS:
            size = len(bundled.storage.get(manifest_key(BUNDLE, tier)))
            sizes = [len(alone.storage.get(manifest_key(m, tier))) for m in MEMBERS]
            report(
                f"bundle manifest of tier {tier} vs its three models' manifests",
                True,
                f"{size} bytes vs {sum(sizes)} ({' + '.join(map(str, sizes))}): "
                f"{size / sum(sizes):.2f}x",
            )

    failed = [target for target, passed, _ in results if not passed]
    print(f"\n{len(results) - len(failed)}/{len(results)} targets met")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
