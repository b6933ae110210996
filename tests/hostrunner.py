"""The host model runner: real MNN on this machine, for any client's self-test, over JSON lines.

An app gives its client a model runner (MNN on the phone); the device
programs of every client (docs/reference/device-program.md) give theirs this
process instead, so the golden-probe check runs on real MNN outputs whatever
the client's language::

    python tests/hostrunner.py [--faulty BACKEND]... [--unavailable BACKEND]... [--log FILE]
                               [--api module|session]

Requests and answers, one JSON object per line:

- ``{"op": "load", "model": PATH, "backend": "cpu", "threads": 4, "precision": "normal"}``
  -> ``{"session": ID, "input_shapes": {name: shape}}``, ``{"error": ..., "unavailable": true}``
  or ``{"error": ...}``;
- ``{"op": "run", "session": ID, "inputs": {name: {"dtype", "shape", "data"}}}``
  -> ``{"outputs": {name: {"dtype", "shape", "data"}}}`` or ``{"error": ...}``
  (``data``: base64 of the little-endian bytes, C order);
- ``{"op": "close", "session": ID}`` -> ``{}``.

Every backend runs on MNN's CPU (this host has no GPU): a ``--faulty``
backend's outputs are perturbed well past any probe tolerance (a
miscomputing driver), an ``--unavailable`` one answers that it does not
exist. ``--log FILE`` appends one line per load and run (``load opencl``,
``run opencl``), so a test sees which backends a client really tried.

MNN prints from C++ to file descriptor 1: fd 1 is pointed at stderr and
the answers go to a private copy of stdout.

``--api`` picks the MNN API the runner calls: ``module`` (the default,
:class:`~edgereg.client.MnnRunner`: every artifact) or ``session``
(:class:`~edgereg.client.SessionRunner`, what MNN's Android Java API and
most iOS code call: an artifact with control-flow subgraphs fails there).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script by any client's device program
    sys.path.insert(0, str(ROOT))

from edgereg.client._selftest import MnnRunner, ModelSession, SessionRunner  # noqa: E402
from edgereg.protocol.fields import RuntimeHints  # noqa: E402

DTYPES: Mapping[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "int8": "i1",
    "uint8": "u1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "?",
}


def decode(tensor: Mapping[str, Any]) -> np.ndarray:
    """A request's tensor as an array."""
    raw = base64.b64decode(tensor["data"], validate=True)
    return np.frombuffer(raw, dtype=np.dtype(DTYPES[tensor["dtype"]])).reshape(tensor["shape"])


def encode(array: np.ndarray) -> dict[str, Any]:
    """An array as an answer's tensor (float64 and other dtypes MNN returns go as float32)."""
    value = np.asarray(array)
    dtype = value.dtype.name if value.dtype.name in DTYPES else "float32"
    data = np.ascontiguousarray(value, dtype=DTYPES[dtype]).tobytes()
    return {"dtype": dtype, "shape": list(value.shape), "data": base64.b64encode(data).decode()}


def perturb(array: np.ndarray) -> np.ndarray:
    """What a miscomputing GPU returns: every value off by far more than any tolerance."""
    value = np.asarray(array, dtype=np.float32)
    offset = float(np.abs(value).max(initial=0.0)) + 1.0
    signs = np.where(np.arange(value.size) % 2 == 0, 1.0, -1.0).reshape(value.shape)
    return (value + signs * offset).astype(np.float32)


class HostRunner:
    """The sessions of one runner process."""

    def __init__(
        self,
        faulty: Sequence[str],
        unavailable: Sequence[str],
        log: Path | None = None,
        api: str = "module",
    ) -> None:
        self.faulty = set(faulty)
        self.unavailable = set(unavailable)
        self.log = log
        self.backends: dict[str, str] = {}
        self.mnn: MnnRunner | SessionRunner = SessionRunner() if api == "session" else MnnRunner()
        self.sessions: dict[str, tuple[ModelSession, bool]] = {}
        self.counter = 0

    def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "load":
            return self.load(request)
        if op == "run":
            return self.run(request)
        if op == "close":
            self.sessions.pop(str(request.get("session")), None)
            return {}
        return {"error": f"unknown op {op!r}"}

    def note(self, line: str) -> None:
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def load(self, request: Mapping[str, Any]) -> dict[str, Any]:
        backend = str(request.get("backend"))
        self.note(f"load {backend}")
        if backend in self.unavailable:
            return {"error": f"no {backend} backend on this device", "unavailable": True}
        try:
            hints = RuntimeHints(
                threads=int(request.get("threads") or 1),
                precision=request.get("precision") or "normal",
                backends=["cpu"],
            )
            # Every backend name runs on MNN's CPU here: this host has no GPU.
            session = self.mnn.load(Path(str(request["model"])), "cpu", hints, [], [])
        except Exception as exc:  # every load failure is an answer, never a crash
            return {"error": f"MNN could not load it: {exc}"}
        self.counter += 1
        name = f"s{self.counter}"
        self.sessions[name] = (session, backend in self.faulty)
        self.backends[name] = backend
        shapes = {k: list(v) for k, v in session.input_shapes().items()}
        return {"session": name, "input_shapes": shapes}

    def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        found = self.sessions.get(str(request.get("session")))
        if found is None:
            return {"error": f"no session {request.get('session')!r}"}
        session, faulty = found
        self.note(f"run {self.backends[str(request.get('session'))]}")
        try:
            feeds = {str(k): decode(v) for k, v in dict(request["inputs"]).items()}
            outputs = session.run(feeds)
        except Exception as exc:  # a forward that raises is an answer too
            return {"error": f"MNN could not run it: {exc}"}
        return {
            "outputs": {
                name: encode(perturb(value) if faulty else value) for name, value in outputs.items()
            }
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faulty", action="append", default=[], metavar="BACKEND")
    parser.add_argument("--unavailable", action="append", default=[], metavar="BACKEND")
    parser.add_argument("--log", type=Path, default=None, metavar="FILE")
    parser.add_argument("--api", choices=("module", "session"), default="module")
    args = parser.parse_args(argv)
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    runner = HostRunner(args.faulty, args.unavailable, args.log, args.api)
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            answer = (
                runner.handle(request)
                if isinstance(request, dict)
                else {"error": "a request is a JSON object"}
            )
        except ValueError as exc:
            answer = {"error": f"not JSON: {exc}"}
        out.write(json.dumps(answer).encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
