"""Commands that start fast (issue 32): `edgereg pull` against curl, `edgereg status` against 0.3 s.

In one run, alternating round by round (the machine is shared: a burst of
load elsewhere hits every command alike), each command in a fresh process
as a user runs it, with a bytecode cache as an installed package has:

1. a cold install: `edgereg pull MODEL --registry URL --tier high --out NEW_DIR`
   (fetch and verify the manifest, download and verify the model, install it)
   against `curl` fetching the same two files (manifest and model) in one
   process, both from one `edgereg serve` on loopback. Target: pull <= 10x curl;
2. `edgereg status MODEL` in a project (its models.toml names the registry and
   the pinned key), and with `--registry URL --trusted-key FILE` outside one.
   Target: <= 0.3 s;
3. the floors beside them: `python -c pass` and `edgereg --version`.

Wall and CPU seconds (medians) are printed with the load average before and
after. What is left of each command's time is shown as a profile: the sum
of ``-X importtime``'s top-level imports and the largest of them, against
the command's wall time. ``--baseline REV`` runs the edgereg package of an
older revision the same way in the same rounds, for a now/then ratio.

Usage: .venv/bin/python benchmarks/startup.py [--rounds 9] [--baseline REV] [--json]
(needs `curl`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from servekit import make_registry  # noqa: E402

PULL_TARGET = 10.0  # x curl of the same two files
STATUS_TARGET = 0.3  # seconds
MODEL = "digits"
DEVICE = "startup-bench"
ENTRY = "from edgereg.cli import main; main()"  # what the console script runs


def child_env(tree: Path, pycache: Path) -> dict[str, str]:
    """The environment of a child running the edgereg package in ``tree``, bytecode cached."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(
    command: list[str], *, cwd: Path, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process; exits on its failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def edgereg_serve(registry: Path, workdir: Path) -> Iterator[str]:
    port = free_port()
    env = child_env(ROOT, workdir / "pycache-server")
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "serve", "--registry", str(registry), "--port", str(port)],
        cwd=workdir,  # no models.toml here: no report store
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("edgereg serve did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def extract_revision(revision: str, workdir: Path) -> Path:
    """The ``edgereg`` package as of a git revision, in a directory to put on PYTHONPATH."""
    target = workdir / "baseline"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "edgereg"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def project(workdir: Path, registry: Path, key: Path) -> Path:
    """The repository's models.toml, its registry and pinned key pointed at the bench's."""
    folder = workdir / "project"
    folder.mkdir()
    text = (ROOT / "models.toml").read_text()
    text, found = re.subn(
        r'(?m)^url = "file://registry".*$',
        f'url = "file://{registry}"\ntrusted_keys = ["{key}"]',
        text,
    )
    if found != 1:
        sys.exit("cannot find [registry] url in models.toml")
    (folder / "models.toml").write_text(text)
    (folder / ".git").mkdir()  # the repository root: the search for models.toml stops here
    return folder


def import_profile(
    args: list[str], *, cwd: Path, env: dict[str, str], top: int = 6
) -> dict[str, Any]:
    """``-X importtime`` of one run: the sum of top-level imports and the largest of them."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", ENTRY, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    top_level: dict[str, int] = {}
    for line in done.stderr.splitlines():
        fields = line.split("|")
        if not line.startswith("import time:") or len(fields) != 3:
            continue
        if fields[2][1:2] == " " or not fields[1].strip().isdigit():
            continue  # indented: imported by another module, counted in its parent
        name = fields[2].strip()
        top_level[name] = top_level.get(name, 0) + int(fields[1])
    largest = sorted(top_level.items(), key=lambda item: -item[1])[:top]
    return {
        "imports_s": sum(top_level.values()) / 1e6,
        "largest": [(name, us / 1e6) for name, us in largest],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (medians)")
    parser.add_argument("--baseline", metavar="REV", help="also run this revision's edgereg")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    curl = shutil.which("curl")
    if curl is None:
        sys.exit("curl is not installed (apt-get install -y curl)")

    workdir = Path(tempfile.mkdtemp(prefix="edgereg-bench-startup-"))
    try:
        made = make_registry(workdir / "registry", models=(MODEL, "sensor"))
        key = workdir / "publisher.pem"
        key.write_bytes(made.signer.public_pem())
        folder = project(workdir, workdir / "registry", key)
        trees = {"this tree": ROOT}
        if args.baseline:
            trees[args.baseline] = extract_revision(args.baseline, workdir)
        envs = {label: child_env(tree, workdir / f"pycache-{i}") for i, (label, tree) in
                enumerate(trees.items())}  # fmt: skip
        results: dict[str, Any] = {"rounds": args.rounds, "trees": list(trees)}
        with edgereg_serve(workdir / "registry", workdir) as url:
            pull_args = [
                "pull", MODEL, "--registry", url, "--device-id", DEVICE, "--tier", "high",
                "--trusted-key", str(key), "--json",
            ]  # fmt: skip
            status_project = ["status", MODEL]
            status_flags = ["status", MODEL, "--registry", f"file://{workdir / 'registry'}"]
            status_flags += ["--trusted-key", str(key)]
            # Warm every bytecode cache (and learn the digest this device installs).
            for env in envs.values():
                done = subprocess.run(
                    [sys.executable, "-c", ENTRY, *pull_args, "--out", str(workdir / "warm")],
                    cwd=workdir, env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                shutil.rmtree(workdir / "warm")
                subprocess.run([sys.executable, "-c", ENTRY, *status_project], cwd=folder,
                               env=env, capture_output=True, check=True)  # fmt: skip
            installed = json.loads(done.stdout)
            digest = installed["sha256"]
            files = [f"{url}/manifests/{MODEL}/high.json", f"{url}/blobs/sha256/{digest}"]
            curl_cmd = [curl, "-sS", "--fail"]
            for index, file_url in enumerate(files):
                curl_cmd += ["-o", str(workdir / f"curl-{index}"), file_url]

            runs: dict[str, list[tuple[float, float]]] = {"python -c pass": [], "curl": []}
            results["load_average_before"] = os.getloadavg()
            for round_ in range(args.rounds):
                runs["python -c pass"].append(timed([sys.executable, "-c", "pass"], cwd=workdir))
                runs["curl"].append(timed(curl_cmd, cwd=workdir))
                for label, env in envs.items():
                    out = workdir / f"cache-{round_}-{len(runs)}"
                    for name, command, cwd in (
                        ("version", ["--version"], workdir),
                        ("pull", [*pull_args, "--out", str(out)], workdir),
                        ("status", status_project, folder),
                        ("status --registry", status_flags, workdir),
                    ):
                        key_ = f"{name} [{label}]"
                        runs.setdefault(key_, []).append(
                            timed([sys.executable, "-c", ENTRY, *command], cwd=cwd, env=env)
                        )
                    shutil.rmtree(out)
            results["load_average_after"] = os.getloadavg()
            results["bytes"] = {
                "curl": sum((workdir / f"curl-{i}").stat().st_size for i in range(len(files))),
                "pull_downloaded": installed["downloaded_bytes"],
            }
            results["profiles"] = {
                "pull": import_profile(
                    [*pull_args, "--out", str(workdir / "profiled")],
                    cwd=workdir,
                    env=envs["this tree"],
                ),
                "status": import_profile(status_project, cwd=folder, env=envs["this tree"]),
            }
        results["medians"] = {
            name: {
                "wall_s": statistics.median(w for w, _ in values),
                "cpu_s": statistics.median(c for _, c in values),
            }
            for name, values in runs.items()
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    medians = results["medians"]
    pull_ratio = medians["pull [this tree]"]["wall_s"] / medians["curl"]["wall_s"]
    status_s = medians["status [this tree]"]["wall_s"]
    results["targets"] = {
        "pull_vs_curl": {"value": pull_ratio, "target": PULL_TARGET, "pass": pull_ratio <= 10},
        "status_s": {
            "value": status_s,
            "target": STATUS_TARGET,
            "pass": status_s <= STATUS_TARGET,
        },
    }
    passed = all(t["pass"] for t in results["targets"].values())
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if passed else 1

    loads = [
        "/".join(f"{v:.1f}" for v in results[k])
        for k in ("load_average_before", "load_average_after")
    ]
    print(
        f"medians of {args.rounds} alternating rounds, fresh processes, bytecode cached; "
        f"{os.cpu_count()} cores; load average (1, 5, 15 min) {loads[0]} before, {loads[1]} after"
    )
    print(f"{'':34}{'wall s':>10}{'cpu s':>10}")
    for name, found in medians.items():
        print(f"{name:34}{found['wall_s']:>10.3f}{found['cpu_s']:>10.3f}")
    print(
        f"bytes: curl {results['bytes']['curl']:,}, pull downloaded "
        f"{results['bytes']['pull_downloaded']:,} (and the manifest)"
    )
    for name, profile in results["profiles"].items():
        largest = ", ".join(f"{module} {s * 1000:.0f} ms" for module, s in profile["largest"])
        wall = medians[f"{name} [this tree]"]["wall_s"]
        print(
            f"profile of {name}: imports {profile['imports_s']:.3f} s of {wall:.3f} s wall "
            f"({100 * profile['imports_s'] / wall:.0f} %); largest: {largest}"
        )
    if args.baseline:
        for name in ("pull", "status", "status --registry", "version"):
            now = medians[f"{name} [this tree]"]["wall_s"]
            then = medians[f"{name} [{args.baseline}]"]["wall_s"]
            print(f"{name}: now / {args.baseline} = {now / then:.2f} ({now:.3f} s / {then:.3f} s)")
    verdict = results["targets"]
    print(
        f"target pull <= {PULL_TARGET:g}x curl of the same two files: "
        f"{verdict['pull_vs_curl']['value']:.1f}x "
        f"{'PASS' if verdict['pull_vs_curl']['pass'] else 'FAIL'}"
    )
    print(
        f"target status for one model <= {STATUS_TARGET} s: {verdict['status_s']['value']:.3f} s "
        f"{'PASS' if verdict['status_s']['pass'] else 'FAIL'}"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
