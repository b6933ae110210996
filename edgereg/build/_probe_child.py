"""Child process of the build's probe stage: the reference client's self-test on the host CPU.

Run as ``python -m edgereg.build._probe_child REQUEST.json`` by
:func:`edgereg.build.probe.check_on_host`. MNN runs in this process, not in
the build's: a model that crashes MNN fails the stage instead of the build.
The request names the artifact, the probe blob, the contract and the MNN API
(``session`` or ``module``) the entry tells the app to use; the result file
gets the trial (:func:`edgereg.client._selftest.try_backend`), exactly
what a device's self-test on its CPU backend would conclude.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from edgereg.client._selftest import MnnRunner, SessionRunner, try_backend
from edgereg.protocol.contract import IOContract
from edgereg.protocol.fields import RuntimeHints
from edgereg.protocol.probe import GoldenProbe
from edgereg.protocol.wire import from_bytes


def main(argv: list[str]) -> int:
    """Run the request in ``argv[1]``; 0 when the result file was written."""
    request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    probe = from_bytes(GoldenProbe, Path(request["probe"]).read_bytes())
    # The tensors too large to inline, read back as a client reads them.
    data = Path(request["probe_data"]).read_bytes() if request.get("probe_data") else None
    probe = probe.resolved(data)
    contract = IOContract.model_validate(request["contract"])
    runner = SessionRunner() if request.get("api") == "session" else MnnRunner()
    trial = try_backend(
        runner,
        Path(request["artifact"]),
        "cpu",
        RuntimeHints(threads=int(request["threads"])),
        probe,
        contract,
    )
    result = {
        "outcome": trial.outcome,
        "detail": trial.detail,
        "verdict": None if trial.verdict is None else dataclasses.asdict(trial.verdict),
    }
    target = Path(request["result"])
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
