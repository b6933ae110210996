"""Drive clients/swift's edgereg-device through real HTTP scenarios (a smoke test).

Run from the repository root with the shared venv:
    python clients/swift/scripts/device_smoke.py [path/to/edgereg-device]

It builds a registry with tests/clientkit.py, serves it with tests/statichttp.py
(ETag, 304, Range), and checks what the Swift client decides, installs and keeps.
Exit 0 when every scenario holds.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clientkit import Kit, device_id  # noqa: E402
from statichttp import StaticServer  # noqa: E402

DEFAULT_PROGRAM = ROOT / "clients/swift/.build/debug/edgereg-device"


class Device:
    """One edgereg-device process, one request at a time."""

    def __init__(self, program: Path) -> None:
        self.proc = subprocess.Popen(
            [str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.next_id = 0

    def __call__(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one op and return its result; a harness error fails the script."""
        self.next_id += 1
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"id": self.next_id, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert answer["id"] == self.next_id, answer
        if not answer["ok"]:
            raise AssertionError(f"{op}: {answer['error']}")
        return answer["result"]

    def close(self) -> None:
        """Quit the program and check it exits 0."""
        self("quit")
        assert self.proc.wait(timeout=10) == 0


FAILED: list[str] = []


def check(label: str, condition: bool, detail: Any = "") -> None:
    """Print one scenario's verdict; a failure is remembered for the exit status."""
    print(("ok   " if condition else "FAIL ") + label + ("" if condition else f": {detail}"))
    if not condition:
        FAILED.append(label)


def main() -> int:
    """Run every scenario; 0 when all hold."""
    program = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PROGRAM
    dev = Device(program)
    check("hello", dev("hello")["client"] == "swift")
    vectors = ROOT / "tests/vectors"
    for path in sorted(vectors.glob("*.json")):
        vector = json.loads(path.read_text())
        got = dev("decide", vector=vector["input"])
        check(f"decide {path.stem}", got == vector["expected"], got)
    for path in sorted((vectors / "blobs").glob("*.json")):
        vector = json.loads(path.read_text())
        got = dev("check_blob", vector=vector["input"])
        check(f"check_blob {path.stem}", got == vector["expected"], got)
    for folder, op in [
        ("probes", "check_probe"),
        ("versions", "check_version"),
        ("reports", "check_report"),
        ("labels", "check_labels"),
    ]:
        for path in sorted((vectors / folder).glob("*.json")):
            vector = json.loads(path.read_text())
            got = dev(op, vector=vector["input"])
            check(f"{op} {path.stem}", got == vector["expected"], got)
    for text, valid in [
        (b'{"a":1}', True),
        (b'{"a":1,"a":2}', False),
        (b"[" * 65 + b"]" * 65, False),
        (b"NaN", False),
        (b"1e400", False),
        (b"9.0", True),
    ]:
        check(
            f"check_json {text[:20]!r}",
            dev("check_json", data=base64.b64encode(text).decode())["valid"] is valid,
        )

    with tempfile.TemporaryDirectory() as tmp:
        kit = Kit(Path(tmp) / "registry")
        pem = kit.signer.public_pem().decode()
        v1 = kit.entry("digits", "1.0.0", labels=["a", "b"])
        kit.publish("digits", v1)
        with StaticServer(kit.root) as server:
            cache = Path(tmp) / "device"
            base = {
                "registry": server.url,
                "trusted_keys": [pem],
                "cache_dir": str(cache),
                "unit": "digits",
                "bundle": False,
                "device": {
                    "device_id": device_id(True),
                    "mnn_runtime": "3.6.1",
                    "os": "ios",
                    "os_version": "17.2",
                    "ram_mb": 8192,
                    "cpu_cores": 6,
                },
                "app_version": "2.4.0",
                "tier": None,
                "tiers": [
                    {"name": "high", "rules": {"min_ram_mb": 6000}},
                    {"name": "low", "rules": {}},
                ],
                "reporting": False,
            }
            conf = dev("configure", **base)
            check("configure resolves the tier", conf["tier"] == "high", conf)
            first = dev("update")
            check(
                "first update installs stable",
                first["ok"] and first["updated"] and first["version"] == "1.0.0",
                first,
            )
            check("downloaded the blob", first["downloaded_bytes"] == 40_000, first)
            again = dev("update")
            check(
                "second update: 304, nothing new",
                again["ok"] and again["not_modified"] and not again["updated"],
                again,
            )
            check("current", dev("current")["version"] == "1.0.0")

            v2 = kit.entry("digits", "1.1.0")
            kit.publish("digits", v1, v2, percent=50.0)
            blob = v2.path
            server.state.drop_after[blob] = 10_000
            cut = dev("update")
            check(
                "a dropped connection is transport, 1.0.0 kept",
                cut["error_code"] == "transport" and cut["version"] == "1.0.0",
                cut,
            )
            st = dev("status")
            check(
                "status: pending with bytes to go",
                st["pending"] is not None and st["pending"]["remaining_bytes"] < 40_000,
                st,
            )
            resumed = dev("update")
            check(
                "resume installs the candidate",
                resumed["ok"] and resumed["version"] == "1.1.0" and resumed["is_candidate"],
                resumed,
            )
            check("resume fetched only the rest", resumed["downloaded_bytes"] == 30_000, resumed)
            st = dev("status")
            check(
                "status: last good is 1.0.0, ready",
                st["last_good"]["version"] == "1.0.0" and st["ready"],
                st,
            )

            # crash loop: three unconfirmed starts, the fourth reverts
            outs = [dev("app_started") for _ in range(4)]
            check(
                "crash loop reverts at the fourth start",
                [o["reverted"] for o in outs] == [False, False, False, True],
                outs,
            )
            check("reverted to 1.0.0", dev("current")["version"] == "1.0.0")
            st = dev("status")
            check("1.1.0 refused", "1.1.0" in st["refused"], st)
            after = dev("update")
            check(
                "a bad candidate falls back to stable",
                after["ok"] and after["fallback"] == "bad-release" and after["version"] == "1.0.0",
                after,
            )
            check("confirm 1.0.0", dev("confirm", version="1.0.0")["confirmed"] is True)

            # deferred and no-space
            v3 = kit.entry("digits", "1.2.0")
            kit.publish("digits", v3)
            dev(
                "configure",
                **{
                    **base,
                    "policy": {
                        "allow_metered": False,
                        "require_charging": False,
                        "reserve_bytes": 8388608,
                    },
                },
            )
            d = dev("update", conditions={"metered": True, "charging": True})
            check(
                "metered: deferred",
                d["ok"] and d["deferred"] == "metered" and d["version"] == "1.0.0",
                d,
            )
            dev("configure", **{**base, "policy": {"reserve_bytes": 1 << 62}})
            ns = dev("update")
            check("no-space", ns["error_code"] == "no-space" and ns["version"] == "1.0.0", ns)
            dev("configure", **base)
            # tampered blob
            server.state.overrides[v3.path] = b"x" * 40_000
            bad = dev("update")
            check(
                "bad-blob keeps 1.0.0",
                bad["error_code"] == "bad-blob" and bad["version"] == "1.0.0",
                bad,
            )
            del server.state.overrides[v3.path]
            good = dev("update")
            check("then 1.2.0", good["ok"] and good["version"] == "1.2.0", good)
            # rollback and expiry
            kit.publish("digits", v1, sequence=1)
            rb = dev("update")
            check(
                "rollback refused", rb["error_code"] == "rollback" and rb["version"] == "1.2.0", rb
            )

            # a bundle, installed as one
            b1 = kit.bundle_entry("1.0.0")
            kit.publish("ocr", b1)
            dev("configure", **{**base, "unit": "ocr", "bundle": True})
            br = dev("update")
            check(
                "bundle installs every member",
                br["ok"] and sorted(br["members"]) == ["cls", "det", "rec"],
                br,
            )
            b2 = kit.bundle_entry("1.1.0")
            kit.publish("ocr", b1, b2, percent=100.0)
            server.state.drop_after[b2.members["rec"].path] = 100
            half = dev("update")
            check(
                "a partly downloaded bundle never becomes active",
                half["error_code"] == "transport"
                and all(m["version"] == "1.0.0" for m in half["members"].values()),
                half,
            )
            full = dev("update")
            check(
                "the whole new set",
                full["ok"] and all(m["version"] == "1.1.0" for m in full["members"].values()),
                full,
            )
            dev("configure", **{**base, "unit": "ocr", "bundle": False})
            check(
                "a bundle asked as a model is malformed", dev("update")["error_code"] == "malformed"
            )
            dev("configure", **{**base, "unit": "nothing"})
            check("404 is not-found", dev("update")["error_code"] == "not-found")
    dev.close()
    print(f"{len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
