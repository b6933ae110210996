"""Train the ``textrec`` example model and export it with its datasets.

A tiny CRNN-style CTC text-line recogniser: four small convolution stages
(BatchNorm, folded on export, ReLU, max pooling) reduce a 32x128 grey line to
32 time steps of features, two convolutions over time give each step context,
and a 1x1 convolution scores every step over the characters and the CTC blank.
The lines are synthetic: strings of 3 to 8 characters drawn from a 5x7 bitmap
font defined below, scaled, jittered, on light noisy backgrounds.

Outputs, written next to this script (or to ``--out``):

- ``model.onnx``: input ``image`` float32 (N, 1, 32, 128), output ``logits``
  float32 (N, 32, 21): 32 time steps, class 0 the CTC blank, class i the i-th
  character of ``charset.txt``. Dynamic batch, opset 17, weights embedded.
- ``charset.txt``: the 20 characters, UTF-8, one per line.
- ``calibration.npz``: ``image`` uint8 (N, 32, 128, 1) grey and ``labels``
  ``<U8`` (N,), the true line, from the training split.
- ``evaluation.npz``: held-out lines, same keys.

Preprocessing contract (applied by the consumer, not inside the graph):
``(image - 127.5) / 127.5``, then HWC -> CHW.
"""

from __future__ import annotations

import argparse
import random
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn
from torch.nn import functional

SEED = 20240603
HEIGHT = 32
WIDTH = 128
STEPS = 32
MEAN = 127.5
STD = 127.5
CHARSET = "0123456789ACEHKLPRTX"
MIN_CHARS = 3
MAX_CHARS = 8
TRAIN_LINES = 8000
CALIB_LINES = 64
EVAL_LINES = 160
OPSET = 17
EPOCHS = 14
BATCH = 64
TARGET = 0.90

# 5x7 bitmap font: 7 rows of 5 columns per character, "#" is ink. Defined
# here so that nothing depends on fonts installed on the machine.
FONT = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
    "A": (".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"),
    "C": (".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."),
    "E": ("#####", "#....", "#....", "####.", "#....", "#....", "#####"),
    "H": ("#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"),
    "K": ("#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"),
    "L": ("#....", "#....", "#....", "#....", "#....", "#....", "#####"),
    "P": ("####.", "#...#", "#...#", "####.", "#....", "#....", "#...."),
    "R": ("####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"),
    "T": ("#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."),
    "X": ("#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"),
}
GLYPHS = {
    c: np.array([[p == "#" for p in row] for row in rows], np.float64) for c, rows in FONT.items()
}


def seed_everything(seed: int) -> None:
    """Make every random source and kernel choice deterministic."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _interp_matrix(size_out: int, size_in: int, start: float, length: float) -> np.ndarray:
    """Bilinear weights placing ``size_in`` source cells over ``[start, start+length)``."""
    centres = (np.arange(size_out) + 0.5 - start) * (size_in / length) - 0.5
    lo = np.floor(centres).astype(int)
    frac = centres - lo
    weights = np.zeros((size_out, size_in))
    for i in range(size_out):
        for j, w in ((lo[i], 1.0 - frac[i]), (lo[i] + 1, frac[i])):
            if 0 <= j < size_in:
                weights[i, j] += w
    return weights


def draw_text(
    canvas_h: int,
    canvas_w: int,
    text: str,
    x: float,
    y: float,
    h: float,
    w: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Ink coverage (0..1, ``canvas_h`` x ``canvas_w``) of ``text`` in the box (x, y, w, h)."""
    # One spare row lets each glyph sit one font row higher or lower.
    cols = [np.zeros((8, 1))]
    for char in text:
        glyph = np.zeros((8, 5))
        shift = int(rng.integers(0, 2))
        glyph[shift : shift + 7] = GLYPHS[char]
        cols += [glyph, np.zeros((8, 1 + int(rng.integers(0, 2) == 0 and rng.random() < 0.3)))]
    bitmap = np.concatenate(cols, axis=1)
    rows = _interp_matrix(canvas_h, bitmap.shape[0], y, h)
    columns = _interp_matrix(canvas_w, bitmap.shape[1], x, w)
    coverage: np.ndarray = np.clip(rows @ bitmap @ columns.T, 0.0, 1.0)
    return coverage


def render_line(text: str, rng: np.random.Generator) -> np.ndarray:
    """One grey uint8 (32, 128) picture of ``text`` with jitter and noise."""
    cells = 6 * len(text) + 1
    h = rng.uniform(13.0, 24.0)
    w = cells * (h / 8.0) * rng.uniform(0.75, 1.25)
    if w > WIDTH - 2:
        h, w = h * (WIDTH - 2) / w, WIDTH - 2.0
    x = rng.uniform(0.0, WIDTH - w)
    y = rng.uniform(0.0, HEIGHT - h)
    ink = draw_text(HEIGHT, WIDTH, text, x, y, h, w, rng)
    ink = np.clip(ink * rng.uniform(1.0, 1.6), 0.0, 1.0)  # stroke weight
    background = rng.uniform(150.0, 245.0) + rng.uniform(-25.0, 25.0) * np.linspace(-1, 1, WIDTH)
    colour = rng.uniform(0.0, 90.0)
    picture = background * (1.0 - ink) + colour * ink
    picture += rng.normal(0.0, rng.uniform(2.0, 12.0), size=picture.shape)
    return np.clip(np.round(picture), 0, 255).astype(np.uint8)


def synthesize(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` lines: uint8 images (N, 32, 128, 1) and their texts ``<U8`` (N,)."""
    texts = [
        "".join(rng.choice(list(CHARSET), size=int(rng.integers(MIN_CHARS, MAX_CHARS + 1))))
        for _ in range(count)
    ]
    images = np.stack([render_line(t, rng) for t in texts])[..., None]
    return images, np.array(texts, dtype=f"<U{MAX_CHARS}")


def preprocess(images: np.ndarray) -> np.ndarray:
    """Apply the model contract: uint8 HWC grey -> normalised float32 NCHW."""
    x = (images.astype(np.float32) - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def conv_bn(c_in: int, c_out: int, kernel: tuple[int, int] = (3, 3)) -> nn.Sequential:
    """Convolution, BatchNorm and ReLU, size-preserving."""
    pad = (kernel[0] // 2, kernel[1] // 2)
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, 1, pad, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()
    )


class TinyCrnn(nn.Module):
    """Convolutions down to one row of 32 steps, then convolutions over time."""

    def __init__(self, classes: int = len(CHARSET) + 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(1, 8),
            nn.MaxPool2d(2),  # 16x64
            conv_bn(8, 16),
            nn.MaxPool2d(2),  # 8x32
            conv_bn(16, 32),
            nn.MaxPool2d((2, 1)),  # 4x32
            conv_bn(32, 48),
            nn.Conv2d(48, 64, (4, 1)),  # 1x32: the whole height into one step
            nn.ReLU(),
            conv_bn(64, 64, (1, 3)),
            conv_bn(64, 64, (1, 3)),
        )
        self.classifier = nn.Conv2d(64, classes, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        scores = self.classifier(self.features(image))  # (N, C, 1, T)
        logits: torch.Tensor = scores.squeeze(2).transpose(1, 2)
        return logits


def greedy_decode(logits: np.ndarray) -> list[str]:
    """Best path: argmax per step, merge repeats, drop blanks (class 0)."""
    lines = []
    for best in logits.argmax(-1):
        chars = [CHARSET[k - 1] for i, k in enumerate(best) if k and (i == 0 or k != best[i - 1])]
        lines.append("".join(chars))
    return lines


def encode(texts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated class targets and their lengths, for ``ctc_loss``."""
    targets = [CHARSET.index(c) + 1 for t in texts for c in t]
    return torch.tensor(targets), torch.tensor([len(t) for t in texts])


def train(model: nn.Module, x: torch.Tensor, texts: np.ndarray) -> None:
    """Train in place with CTC loss, AdamW and a one-cycle learning-rate schedule."""
    gen = torch.Generator().manual_seed(SEED)
    steps = EPOCHS * ((len(x) + BATCH - 1) // BATCH)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    model.train()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for start in range(0, len(x), BATCH):
            idx = order[start : start + BATCH]
            targets, lengths = encode(texts[idx.numpy()])
            log_probs = functional.log_softmax(model(x[idx]), dim=-1).transpose(0, 1)
            steps_per_line = torch.full((len(idx),), STEPS, dtype=torch.long)
            loss = functional.ctc_loss(
                log_probs, targets, steps_per_line, lengths, zero_infinity=True
            )
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1:3d}  loss {total / len(x):.4f}")


def export(model: nn.Module, path: Path) -> None:
    """Export to a single self-contained ONNX file with a dynamic batch."""
    model.eval()
    # The TorchScript exporter is deprecated, but it writes opset 17 directly
    # (the dynamo exporter builds opset 18 and fails to convert down) and
    # needs no onnxscript.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(2, 1, HEIGHT, WIDTH),),
            str(path),
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
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
    train_images, train_texts = synthesize(TRAIN_LINES, rng)
    eval_images, eval_texts = synthesize(EVAL_LINES, rng)

    model = TinyCrnn()
    print(f"parameters: {sum(p.numel() for p in model.parameters())}")
    train(model, torch.from_numpy(preprocess(train_images)), train_texts)
    model.eval()
    x_eval = preprocess(eval_images)
    with torch.no_grad():
        torch_lines = greedy_decode(model(torch.from_numpy(x_eval)).numpy())
    print(f"torch fp32 held-out line accuracy: {np.mean(np.array(torch_lines) == eval_texts):.4f}")

    onnx_path = out / "model.onnx"
    export(model, onnx_path)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"image": x_eval})
    accuracy = float(np.mean(np.array(greedy_decode(logits)) == eval_texts))
    print(
        f"onnxruntime fp32 held-out exact-line accuracy: {accuracy:.4f} ({len(eval_texts)} lines)"
    )
    if accuracy < TARGET:
        raise SystemExit(f"line accuracy {accuracy:.4f} is below the {TARGET} target")

    (out / "charset.txt").write_text("".join(f"{c}\n" for c in CHARSET), encoding="utf-8")
    np.savez_compressed(
        out / "calibration.npz", image=train_images[:CALIB_LINES], labels=train_texts[:CALIB_LINES]
    )
    np.savez_compressed(out / "evaluation.npz", image=eval_images, labels=eval_texts)
    print(
        f"wrote {onnx_path}, charset.txt, calibration.npz ({CALIB_LINES}), "
        f"evaluation.npz ({len(eval_texts)})"
    )


if __name__ == "__main__":
    main()
