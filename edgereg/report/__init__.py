"""The build report: one self-contained HTML page per project.

Per model: a table of variants (tier, size, accuracy and its change against
the ONNX baseline, host latency at each benchmarked thread count, gates), a
chart of size against accuracy with latency as marker size, per-class recall
change bars so a damaged class stands out, and every artifact's provenance.
It reads what builds wrote under ``build/<model>/<variant>/`` and works
offline: no script, font or stylesheet comes from the network.
"""

from __future__ import annotations

from pathlib import Path

from edgereg.config import Config
from edgereg.report._data import ModelData, ReportData, VariantData, collect
from edgereg.report._html import render_html

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
