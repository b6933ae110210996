"""CTC sequence recognition: greedy decoding over a character list."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._inputs import PinnedFile
from edgereg.tasks._spec import TaskMetric, _Task


class CtcTask(_Task):
    """Sequence recognition with CTC: greedy decoding over a character list."""

    kind: Literal["ctc"]
    charset: PinnedFile = Field(
        description="UTF-8 text file, one character per line, in class order (the blank "
        "class is not listed)."
    )
    blank: int = Field(default=0, ge=0, description="Index of the CTC blank class.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "line_match",
            "reference",
            True,
            "share of lines decoded exactly as the reference decodes them",
        ),
        TaskMetric(
            "cer", "reference", False, "character error rate against the reference's decoding"
        ),
        TaskMetric(
            "label_line_accuracy", "labels", True, "share of lines decoded exactly as labelled"
        ),
        TaskMetric("label_cer", "labels", False, "character error rate against the labels"),
    )
