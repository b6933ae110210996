"""The build report: one self-contained HTML page per project.

Per model: a table of variants (tier, size, the task's headline metric and
its change against the fp32 ONNX baseline, the worst output's cosine and SNR
against ONNX Runtime, host latency at the variant's own thread count, every
gate with its measured number and budget, and the host thread sweep, said to
be the build host's and never shipped), a chart of size against the
headline metric with latency as marker size, for classifiers per-class recall
change bars so a damaged class stands out, and every artifact's provenance.
A variant that failed a gate shows "failed: <the gate>" and all its numbers.
It reads what builds wrote under ``build/<model>/<variant>/`` and works
offline: no script, font or stylesheet comes from the network.
"""

from __future__ import annotations

from pathlib import Path

from edgereg.buildreport._data import ModelData, ReportData, VariantData, collect
from edgereg.buildreport._html import render_html
from edgereg.config import Config

__all__ = [
    "ModelData",
    "ReportData",
    "VariantData",
    "collect",
    "render_html",
    "write_report",
]


def write_report(config: Config, out_root: Path, target: Path, *, generated: str) -> ReportData:
    """Render the report of ``config``'s builds under ``out_root`` into ``target``.

    The file is written atomically (a temporary file, then a rename).

    Returns:
        What the report shows.
    """
    from edgereg._files import atomic_write

    data = collect(config, out_root, generated=generated)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, render_html(data))
    return data
