"""Train the ``embed`` example model and export it with its datasets.

A tiny sentence-embedding transformer with token-id inputs, shaped like the
MiniLM-style encoders apps ship: token and learned positional embeddings, two
pre-norm encoder blocks written by hand (LayerNorm, 2-head self-attention
with the padding masked out, tanh-GELU MLP), a final LayerNorm, mean pooling
over the real tokens and L2 normalisation. The sentences are synthetic: a
vocabulary of 200 ids (0 is padding), shared "function words" and five
topics whose word distributions overlap. Training uses a cosine-similarity
topic classifier on the embedding, a head that is dropped at export, so that
sentences of one topic embed close together.

Outputs, written next to this script (or to ``--out``):

- ``model.onnx``: inputs ``input_ids`` int64 (N, 16) and ``attention_mask``
  int64 (N, 16) (1 for a real token, 0 for padding); output ``embedding``
  float32 (N, 32), unit length. Dynamic batch, opset 17, weights embedded.
- ``calibration.npz``: ``input_ids``, ``attention_mask`` int64 (N, 16) and
  ``labels`` int64 (N,), the topic of each sentence, from the training split.
- ``evaluation.npz``: held-out sentences, same keys.

Preprocessing contract: none; sentences of 4 to 16 tokens are padded at the
end with id 0 and mask 0.
"""

from __future__ import annotations

import argparse
import math
import random
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn
from torch.nn import functional

SEED = 20240606
VOCAB = 200
TOKENS = 16
MIN_TOKENS = 4
DIM = 32
TOPICS = 5
COMMON_WORDS = 60  # ids 1..59 are shared by every topic
TOPIC_WORDS = 40  # each topic's own window of ids, overlapping its neighbours'
TOPIC_SHARE = 0.5  # chance that a token is a topic word
TRAIN_SENTENCES = 4000
CALIB_SENTENCES = 100
EVAL_SENTENCES = 500
OPSET = 17
EPOCHS = 30
BATCH = 64
TARGET = 0.80
# Masked scores get this added: exp() of it is 0 in float32 and float16,
# and unlike -inf it cannot turn a fully masked row into NaN.
MASKED = -1.0e4


def seed_everything(seed: int) -> None:
    """Make every random source and kernel choice deterministic."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _zipf(size: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** exponent
    return weights / weights.sum()


def synthesize(count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``count`` padded sentences with their topics, in the dataset layout."""
    stride = (VOCAB - COMMON_WORDS) // TOPICS  # 28 < 40: neighbouring topics share ids
    world = np.random.default_rng(SEED)
    topic_ids = [
        world.permutation(
            COMMON_WORDS + (t * stride + np.arange(TOPIC_WORDS)) % (VOCAB - COMMON_WORDS)
        )
        for t in range(TOPICS)
    ]
    common_ids = world.permutation(np.arange(1, COMMON_WORDS))
    ids = np.zeros((count, TOKENS), np.int64)
    mask = np.zeros((count, TOKENS), np.int64)
    labels = rng.integers(0, TOPICS, size=count).astype(np.int64)
    for row, topic in enumerate(labels):
        length = int(rng.integers(MIN_TOKENS, TOKENS + 1))
        from_topic = rng.random(length) < TOPIC_SHARE
        ids[row, :length] = np.where(
            from_topic,
            rng.choice(topic_ids[topic], size=length, p=_zipf(TOPIC_WORDS, 0.7)),
            rng.choice(common_ids, size=length, p=_zipf(COMMON_WORDS - 1, 1.0)),
        )
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _gelu() -> nn.Module:
    # The tanh form: MNN 3.6.1 fuses the exported erf form into its own GELU,
    # which differs from ONNX Runtime by ~5e-4 per layer (see sensor/train.py).
    return nn.GELU(approximate="tanh")


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block with explicit, masked attention ops."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.norm1 = nn.LayerNorm(dim)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), _gelu(), nn.Linear(hidden, dim))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # -1 keeps the batch dimension dynamic in the exported Reshape.
        return x.reshape(-1, TOKENS, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self._split(self.query(h)), self._split(self.key(h)), self._split(self.value(h))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = torch.matmul(torch.softmax(scores + key_bias, dim=-1), v)
        x = x + self.proj(att.transpose(1, 2).reshape(-1, TOKENS, self.heads * self.head_dim))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class SentenceEncoder(nn.Module):
    """Token ids and mask -> unit-length sentence embedding (N, 32)."""

    def __init__(self, blocks: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.position = nn.Parameter(torch.randn(1, TOKENS, DIM) * 0.02)
        self.blocks = nn.ModuleList(EncoderBlock(DIM, heads, 2 * DIM) for _ in range(blocks))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        # (N, 1, 1, T): no query attends to padding.
        key_bias = ((1.0 - mask) * MASKED)[:, None, None, :]
        x = self.tokens(input_ids) + self.position
        for block in self.blocks:
            x = block(x, key_bias)
        weights = mask[:, :, None]
        pooled = (self.norm(x) * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        embedding: torch.Tensor = pooled / torch.sqrt(
            (pooled * pooled).sum(dim=1, keepdim=True) + 1e-12
        )
        return embedding


class TopicHead(nn.Module):
    """Cosine classifier over topic prototypes, for training only."""

    def __init__(self, scale: float = 12.0) -> None:
        super().__init__()
        self.prototypes = nn.Parameter(torch.randn(TOPICS, DIM))
        self.scale = scale

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = (
            self.scale * embedding @ functional.normalize(self.prototypes, dim=1).T
        )
        return logits


def train(model: SentenceEncoder, head: TopicHead, data: dict[str, torch.Tensor]) -> None:
    """Train in place with AdamW and a one-cycle learning-rate schedule."""
    gen = torch.Generator().manual_seed(SEED)
    count = len(data["labels"])
    steps = EPOCHS * ((count + BATCH - 1) // BATCH)
    params = [*model.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    model.train()
    for epoch in range(EPOCHS):
        order = torch.randperm(count, generator=gen)
        total = 0.0
        for start in range(0, count, BATCH):
            idx = order[start : start + BATCH]
            embedding = model(data["input_ids"][idx], data["attention_mask"][idx])
            loss = functional.cross_entropy(head(embedding), data["labels"][idx])
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:3d}  loss {total / count:.4f}")


def neighbour_agreement(embedding: np.ndarray, labels: np.ndarray) -> float:
    """Share of sentences whose nearest other sentence (cosine) has the same topic."""
    unit = embedding / np.linalg.norm(embedding, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return float((labels[similarity.argmax(axis=1)] == labels).mean())


def export(model: nn.Module, path: Path) -> None:
    """Export to a single self-contained ONNX file with a dynamic batch."""
    model.eval()
    # The TorchScript exporter is deprecated, but it writes opset 17 directly
    # (the dynamo exporter builds opset 18 and fails to convert down) and
    # needs no onnxscript.
    sample = torch.ones(2, TOKENS, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (sample, sample),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": {0: "batch"},
                "attention_mask": {0: "batch"},
                "embedding": {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(SEED)

    rng = np.random.default_rng(SEED + 1)
    training = synthesize(TRAIN_SENTENCES, rng)
    evaluation = synthesize(EVAL_SENTENCES, rng)

    model, head = SentenceEncoder(), TopicHead()
    print(
        f"parameters: {sum(p.numel() for p in model.parameters())} (+{TOPICS * DIM} in the "
        "training-only head)"
    )
    train(model, head, {k: torch.from_numpy(v) for k, v in training.items()})
    model.eval()

    onnx_path = out / "model.onnx"
    export(model, onnx_path)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (embedding,) = session.run(
        ["embedding"],
        {"input_ids": evaluation["input_ids"], "attention_mask": evaluation["attention_mask"]},
    )
    agreement = neighbour_agreement(embedding, evaluation["labels"])
    print(
        f"onnxruntime fp32 held-out nearest-neighbour topic agreement: {agreement:.4f} "
        f"({EVAL_SENTENCES} sentences)"
    )
    if agreement < TARGET:
        raise SystemExit(f"neighbour agreement {agreement:.4f} is below the {TARGET} target")

    np.savez_compressed(
        out / "calibration.npz", **{k: v[:CALIB_SENTENCES] for k, v in training.items()}
    )
    np.savez_compressed(out / "evaluation.npz", **evaluation)
    print(
        f"wrote {onnx_path}, calibration.npz ({CALIB_SENTENCES}), evaluation.npz ({EVAL_SENTENCES})"
    )


if __name__ == "__main__":
    main()
