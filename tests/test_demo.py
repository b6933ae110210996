"""What `make demo` promises in README.md and docs/quickstart.md, held (issue #30).

The demo's phones are chosen for each run's cohorts (a rollout's salt is
random), every release it publishes is a 5 % canary, and it installs only the
Debian packages ARM verification needs, not the test toolchain.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from registrykit import MODEL, OTHER, Site, ok

from edgereg.protocol.rules import in_cohort

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "pipelines" / "demo_devices.py"


def _recipe(target: str) -> str:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    return makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]


def _choose(site: Site, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=site.root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_demo_phones_are_chosen_for_this_runs_cohorts(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    ok(site.run("publish", OTHER, "--canary", "5%"))
    flagship = _choose(site, "demo-flagship", "--inside", MODEL, "--inside", OTHER)
    budget = _choose(site, "demo-budget", "--inside", OTHER, "--outside", MODEL)
    assert flagship.startswith("demo-flagship-")
    assert budget.startswith("demo-budget-")
    for unit, device, inside in (
        (MODEL, flagship, True),
        (OTHER, flagship, True),
        (OTHER, budget, True),
        (MODEL, budget, False),
    ):
        state = site.state(unit)
        assert state.salt is not None
        assert state.percent == 5
        assert in_cohort(device, state.salt, state.percent) is inside
        # What the demo's pull then prints: the device where the script put it.
        pulled = site.run(
            "pull",
            unit,
            "--registry",
            site.url,
            "--device-id",
            device,
            "--tier",
            "low",
            "--trusted-key",
            ".edgereg/signing-key.pub.pem",
            "--out",
            f"cache-{device}",
            "--explain",
        )
        ok(pulled)
        assert ("inside the cohort" if inside else "outside the cohort") in pulled.stderr
        assert ("installed" in pulled.stdout) is inside
    # The same registry, the same answer: every run of the demo shows the same.
    assert _choose(site, "demo-flagship", "--inside", MODEL, "--inside", OTHER) == flagship


def test_a_unit_without_a_candidate_has_no_cohort_to_choose_in(site: Site) -> None:
    ok(site.run("publish", MODEL, "--full"))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "demo-x", "--inside", MODEL],
        cwd=site.root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert f"{MODEL} has no candidate" in done.stderr


def test_every_demo_release_is_a_5_percent_canary_pulled_by_chosen_phones() -> None:
    recipe = _recipe("demo")
    publishes = dict(re.findall(r"edgereg publish (\S+) (.*)", recipe))
    assert list(publishes) == ["digits", "sensor", "ocr", "segment"]
    canaries = {unit: options.strip() for unit, options in publishes.items() if unit != "segment"}
    assert set(canaries.values()) == {"--canary 5%"}, publishes
    # segment goes to everyone at once: what it shows is each tier's input size.
    assert publishes["segment"].strip() == "--full"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for phone in ("FLAGSHIP", "BUDGET_PHONE"):
        value = makefile.split(f"\n{phone} = ", 1)[1].split("\n\n", 1)[0].split("\n", 2)
        assert "pipelines/demo_devices.py" in " ".join(value[:2]), phone
    # The flagship is inside every canary it pulls from, the budget phone inside ocr's.
    assert "demo-flagship --inside sensor" in makefile
    assert "--inside ocr)" in makefile
    assert "demo-budget --inside ocr" in makefile
    assert "--outside sensor)" in makefile


def test_the_readme_and_quickstart_say_what_the_demo_does() -> None:
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert "5% canaries of digits, sensor and the ocr bundle" in readme
    assert "installed as one set on both" in readme
    quickstart = " ".join((REPO / "docs" / "quickstart.md").read_text(encoding="utf-8").split())
    assert "`edgereg publish ocr --canary 5%`" in quickstart
    assert "qemu-user-static" in quickstart
    assert "debootstrap" in quickstart


def test_make_demo_installs_only_what_arm_verification_needs() -> None:
    """`arm` depended on `system-deps`: the demo apt-installed chromium, nginx, PostgreSQL..."""
    done = subprocess.run(
        ["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    installs = re.findall(r"apt-get install -y ([^)\n]+)", done.stdout)
    assert installs, done.stdout
    assert {package for line in installs for package in line.split()} == {
        "qemu-user-static",
        "debootstrap",
    }
    full = subprocess.run(
        ["make", "-n", "system-deps"], cwd=REPO, capture_output=True, text=True, check=False
    )
    for package in ("chromium", "postgresql", "junit5", "qemu-user-static"):
        assert package in full.stdout
