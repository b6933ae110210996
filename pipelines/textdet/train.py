"""Train the ``textdet`` example model and export it with its datasets.

A tiny DBNet-style dense-map text detector: a two-level convolutional
encoder (BatchNorm, folded on export, ReLU), one decoder step with a skip
connection, a 1x1 head at half resolution, bilinear upsampling
to the input size and a sigmoid, all inside the graph. The pictures are
synthetic: light noisy backgrounds with one to three dark text lines drawn
from a 5x7 bitmap font defined below, at random positions and sizes, plus
non-text distractors (strokes, rings, boxes, blobs).

Outputs, written next to this script (or to ``--out``):

- ``model.onnx``: input ``image`` float32 (N, 3, 64, 64) RGB, output ``prob``
  float32 (N, 1, 64, 64), the probability that a pixel is text. Dynamic batch,
  opset 17, weights embedded.
- ``calibration.npz``: ``image`` uint8 (N, 64, 64, 3) RGB HWC and ``labels``
  uint8 (N, 1, 64, 64) 0/1 text masks, from the training split.
- ``evaluation.npz``: held-out pictures, same keys.

Preprocessing contract (applied by the consumer, not inside the graph):
``(image - mean) / std`` per channel with the ImageNet statistics
``mean = [123.675, 116.28, 103.53]``, ``std = [58.395, 57.12, 57.375]``
(RGB order), then HWC -> CHW.
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

SEED = 20240604
SIZE = 64
MEAN = np.array([123.675, 116.28, 103.53], np.float32)
STD = np.array([58.395, 57.12, 57.375], np.float32)
CHARSET = "0123456789ACEHKLPRTX"
TRAIN_IMAGES = 2500
CALIB_IMAGES = 32
EVAL_IMAGES = 48
OPSET = 17
EPOCHS = 16
BATCH = 32
THRESHOLD = 0.5
TARGET = 0.70

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


def draw_text(text: str, x: float, y: float, h: float, w: float) -> np.ndarray:
    """Ink coverage (0..1, 64 x 64) of ``text`` filling the box (x, y, w, h)."""
    cols = []
    for i, char in enumerate(text):
        cols += [np.zeros((7, 1))] if i else []
        cols.append(GLYPHS[char])
    bitmap = np.concatenate(cols, axis=1)
    rows = _interp_matrix(SIZE, bitmap.shape[0], y, h)
    columns = _interp_matrix(SIZE, bitmap.shape[1], x, w)
    coverage: np.ndarray = np.clip(rows @ bitmap @ columns.T, 0.0, 1.0)
    return coverage


def _distractor(rng: np.random.Generator) -> np.ndarray:
    """Ink coverage of one non-text shape: a stroke, a ring, a box outline or a blob."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) + 0.5
    kind = int(rng.integers(0, 4))
    cx, cy = rng.uniform(0, SIZE, size=2)
    if kind == 0:  # a straight stroke at any angle
        angle = rng.uniform(0, np.pi)
        dist = np.abs((xx - cx) * np.sin(angle) - (yy - cy) * np.cos(angle))
        along = np.abs((xx - cx) * np.cos(angle) + (yy - cy) * np.sin(angle))
        return np.clip(rng.uniform(0.8, 2.0) - dist, 0, 1) * (along < rng.uniform(8, 40))
    if kind == 1:  # a ring
        radius = rng.uniform(4, 14)
        return np.clip(rng.uniform(0.8, 1.8) - np.abs(np.hypot(xx - cx, yy - cy) - radius), 0, 1)
    if kind == 2:  # a box outline
        half_w, half_h = rng.uniform(4, 16, size=2)
        edge = np.maximum(np.abs(xx - cx) / half_w, np.abs(yy - cy) / half_h)
        return np.clip(1.0 - np.abs(edge - 1.0) * min(half_w, half_h), 0, 1)
    radius = rng.uniform(2, 7)  # a filled blob
    return np.clip(radius - np.hypot((xx - cx) * rng.uniform(0.6, 1.6), yy - cy), 0, 1)


def render(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One RGB uint8 (64, 64, 3) picture and its uint8 (1, 64, 64) text mask."""
    mask = np.zeros((SIZE, SIZE), np.uint8)
    ink = np.zeros((SIZE, SIZE))
    for _ in range(int(rng.integers(1, 4))):
        for _attempt in range(20):
            text = "".join(rng.choice(list(CHARSET), size=int(rng.integers(2, 8))))
            h = rng.uniform(7.0, 14.0)
            w = (6 * len(text) - 1) * (h / 7.0) * rng.uniform(0.8, 1.2)
            if w > SIZE - 2:
                continue
            x, y = rng.uniform(1, SIZE - 1 - w), rng.uniform(1, SIZE - 1 - h)
            box = (slice(int(y), int(np.ceil(y + h))), slice(int(x), int(np.ceil(x + w))))
            # Keep lines apart by a pixel so that each stays its own region.
            grown = (
                slice(max(box[0].start - 2, 0), box[0].stop + 2),
                slice(max(box[1].start - 2, 0), box[1].stop + 2),
            )
            if mask[grown].any():
                continue
            coverage = draw_text(text, x, y, h, w)
            ink = np.maximum(ink, coverage)
            mask[coverage > 0.3] = 1  # the pixels the line covers ...
            rows, cols = np.nonzero(coverage > 0.3)
            mask[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1] = 1  # ... as a box
            break
    clutter = np.zeros((SIZE, SIZE))
    for _ in range(int(rng.integers(0, 4))):
        clutter = np.maximum(clutter, _distractor(rng))
    clutter *= mask == 0  # distractors never cover text
    ramp = np.linspace(-1, 1, SIZE)
    slope = rng.uniform(-20, 20, size=2)
    background = (
        rng.uniform(170, 250, size=3) + (slope[0] * ramp[:, None] + slope[1] * ramp)[..., None]
    )
    colour = rng.uniform(0, 90, size=3)
    shade = rng.uniform(0, 110, size=3)
    picture = background * (1 - ink[..., None]) + colour * ink[..., None]
    picture = picture * (1 - clutter[..., None]) + shade * clutter[..., None]
    picture += rng.normal(0.0, rng.uniform(2.0, 8.0), size=picture.shape)
    return np.clip(np.round(picture), 0, 255).astype(np.uint8), mask[None]


def synthesize(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` pictures uint8 (N, 64, 64, 3) and masks uint8 (N, 1, 64, 64)."""
    pairs = [render(rng) for _ in range(count)]
    return np.stack([p for p, _ in pairs]), np.stack([m for _, m in pairs])


def preprocess(images: np.ndarray) -> np.ndarray:
    """Apply the model contract: uint8 HWC RGB -> normalised float32 NCHW."""
    x = (images.astype(np.float32) - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def conv_bn(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """3x3 convolution, BatchNorm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()
    )


class TinyTextDetector(nn.Module):
    """Encoder at 1/2 and 1/4 scale, one skip-connected decoder step, sigmoid map."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 16, 2), conv_bn(16, 16))  # 32x32
        self.down = nn.Sequential(conv_bn(16, 32, 2), conv_bn(32, 32), conv_bn(32, 32))  # 16x16
        self.fuse = conv_bn(48, 16)
        self.head = nn.Conv2d(16, 1, 1)

    def logits(self, image: torch.Tensor) -> torch.Tensor:
        """Text logits at the input resolution (the map before the sigmoid)."""
        skip = self.stem(image)
        deep = functional.interpolate(self.down(skip), scale_factor=2.0, mode="nearest")
        half = self.head(self.fuse(torch.cat([deep, skip], dim=1)))
        full: torch.Tensor = functional.interpolate(
            half, scale_factor=2.0, mode="bilinear", align_corners=False
        )
        return full

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(image))


def train(model: TinyTextDetector, x: torch.Tensor, masks: torch.Tensor) -> None:
    """Train in place on BCE plus soft-Dice loss with AdamW, one-cycle schedule."""
    gen = torch.Generator().manual_seed(SEED)
    steps = EPOCHS * ((len(x) + BATCH - 1) // BATCH)
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=4e-3, total_steps=steps)
    model.train()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for start in range(0, len(x), BATCH):
            idx = order[start : start + BATCH]
            logits, target = model.logits(x[idx]), masks[idx]
            prob = torch.sigmoid(logits)
            dice = 1 - (2 * (prob * target).sum() + 1) / (prob.sum() + target.sum() + 1)
            loss = functional.binary_cross_entropy_with_logits(logits, target) + dice
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        if epoch % 4 == 3 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:3d}  loss {total / len(x):.4f}")


def iou(prob: np.ndarray, masks: np.ndarray) -> tuple[float, float]:
    """Pooled IoU over all pixels and mean per-picture IoU, map binarised at 0.5."""
    pred, truth = prob >= THRESHOLD, masks.astype(bool)
    inter = (pred & truth).sum(axis=(1, 2, 3))
    union = (pred | truth).sum(axis=(1, 2, 3))
    per_image = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
    return float(inter.sum() / union.sum()), float(per_image.mean())


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
            (torch.zeros(2, 3, SIZE, SIZE),),
            str(path),
            input_names=["image"],
            output_names=["prob"],
            dynamic_axes={"image": {0: "batch"}, "prob": {0: "batch"}},
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
    train_images, train_masks = synthesize(TRAIN_IMAGES, rng)
    eval_images, eval_masks = synthesize(EVAL_IMAGES, rng)

    model = TinyTextDetector()
    print(f"parameters: {sum(p.numel() for p in model.parameters())}")
    train(
        model,
        torch.from_numpy(preprocess(train_images)),
        torch.from_numpy(train_masks.astype(np.float32)),
    )
    model.eval()
    x_eval = preprocess(eval_images)
    with torch.no_grad():
        torch_prob = model(torch.from_numpy(x_eval)).numpy()
    print(f"torch fp32 held-out IoU: {iou(torch_prob, eval_masks)[0]:.4f}")

    onnx_path = out / "model.onnx"
    export(model, onnx_path)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (prob,) = session.run(["prob"], {"image": x_eval})
    pooled, mean = iou(prob, eval_masks)
    print(
        f"onnxruntime fp32 held-out IoU at {THRESHOLD}: {pooled:.4f} pooled over pixels, "
        f"{mean:.4f} mean per picture ({len(eval_images)} pictures)"
    )
    if pooled < TARGET:
        raise SystemExit(f"IoU {pooled:.4f} is below the {TARGET} target")

    np.savez_compressed(
        out / "calibration.npz",
        image=train_images[:CALIB_IMAGES],
        labels=train_masks[:CALIB_IMAGES],
    )
    np.savez_compressed(out / "evaluation.npz", image=eval_images, labels=eval_masks)
    print(
        f"wrote {onnx_path}, calibration.npz ({CALIB_IMAGES}), evaluation.npz ({len(eval_images)})"
    )


if __name__ == "__main__":
    main()
