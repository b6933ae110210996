"""Embeddings compared by cosine."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgereg.tasks._spec import TaskMetric, _Task


class EmbeddingTask(_Task):
    """Embeddings compared by cosine: agreement and nearest neighbours over the set."""

    kind: Literal["embedding"]
    k: int = Field(default=5, ge=1, description="Neighbours considered by neighbour_recall.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "embedding_cosine",
            "reference",
            True,
            "worst cosine similarity of an embedding with the reference's",
            (-1.0, 1.0),
        ),
        TaskMetric(
            "neighbour_agreement",
            "reference",
            True,
            "share of samples whose nearest "
            "neighbour in the set is the reference's nearest neighbour",
        ),
        TaskMetric(
            "neighbour_recall",
            "reference",
            True,
            "share of samples whose reference nearest neighbour is among the variant's k nearest",
        ),
        TaskMetric(
            "label_neighbour_accuracy",
            "labels",
            True,
            "share of samples whose nearest neighbour has the same label",
        ),
    )
