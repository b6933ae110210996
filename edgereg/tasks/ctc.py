"""CTC sequence recognition: greedy decoding over a character list."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._budgets import MetricBudget
from edgereg.config._inputs import PinnedFile
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric, minimums


class CtcTask(TaskConfig):
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
            label="line match",
            percent=True,
        ),
        TaskMetric(
            "cer",
            "reference",
            False,
            "character error rate against the reference's decoding",
            label="CER",
            percent=True,
        ),
        TaskMetric(
            "label_line_accuracy",
            "labels",
            True,
            "share of lines decoded exactly as labelled",
            label="line accuracy",
            percent=True,
        ),
        TaskMetric(
            "label_cer",
            "labels",
            False,
            "character error rate against the labels",
            label="CER (labels)",
            percent=True,
        ),
    )
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = minimums(
        "line_match", 0.98, 0.95, 0.9, 0.85
    )
    LABEL_DROPS: ClassVar[tuple[str, ...]] = ("label_line_accuracy",)
    HEADLINE: ClassVar[tuple[str, ...]] = ("label_line_accuracy", "line_match")
    EVALUATOR: ClassVar[str] = "edgereg.tasks.ctc_eval"
    PURPOSE: ClassVar[str] = "sequence recognition with CTC (text lines, speech)"
    LABELS: ClassVar[tuple[str, str]] = (
        "the text of each line, a unicode string array",
        "`(N,)` `<U16`",
    )

    def pinned_files(self) -> dict[str, PinnedFile]:
        """The charset."""
        return {"charset": self.charset}

    def contract_labels(
        self, classes: Sequence[str] | None, charset: Sequence[str] | None
    ) -> list[str] | None:
        """The characters, blank excluded."""
        return list(charset or [])
