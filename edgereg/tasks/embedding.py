"""Embeddings compared by cosine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric, minimums


class EmbeddingTask(TaskConfig):
    """Embeddings compared by cosine: agreement and nearest neighbours over the set."""

    kind: Literal["embedding"]
    k: int = Field(default=5, ge=1, description="Neighbours considered by neighbour_recall.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "embedding_cosine",
            "reference",
            True,
            "the worst sample's cosine similarity with the reference embedding",
            (-1.0, 1.0),
            label="embedding cosine",
        ),
        TaskMetric(
            "neighbour_agreement",
            "reference",
            True,
            "share of samples whose nearest neighbour in the set is the reference's",
            label="neighbour agreement",
            percent=True,
        ),
        TaskMetric(
            "neighbour_recall",
            "reference",
            True,
            "share of samples whose reference nearest neighbour is among the variant's `k` nearest",
            label="neighbour recall",
            percent=True,
        ),
        TaskMetric(
            "label_neighbour_accuracy",
            "labels",
            True,
            "share of samples whose nearest neighbour has the same label",
            label="neighbour accuracy (labels)",
            percent=True,
        ),
    )
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = minimums(
        "neighbour_agreement", 0.98, 0.97, 0.95, 0.95
    )
    HEADLINE: ClassVar[tuple[str, ...]] = ("neighbour_agreement",)
    EVALUATOR: ClassVar[str] = "edgereg.tasks.embedding_eval"
    PURPOSE: ClassVar[str] = "sentence or image embeddings compared by cosine"
    LABELS: ClassVar[tuple[str, str]] = (
        "a group id per sample (paraphrases, one identity)",
        "`(N,)` int64",
    )
