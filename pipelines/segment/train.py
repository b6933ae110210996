"""Train the ``segment`` example model and export it with its datasets.

A small semantic segmenter whose memory is its activations: a full-resolution
first layer, an encoder down to 1/8 scale (BatchNorm, folded on export, ReLU),
a dilated context layer, two decoder steps with skip connections, a 1x1 head at
half resolution and bilinear upsampling to the input size, all inside the graph.
It is fully convolutional: trained on 96x96 tiles, exported at 512x512 (the
high and mid tiers) and at 256x256 (the low tier, whose memory ceiling a
512x512 float variant exceeds). The pictures are synthetic: a finely grated
background with flat discs, striped boxes and a few thin crosses, the tail
class (under 1 % of the pixels), in random colours.

Outputs, written next to this script (or to ``--out``):

- ``model.onnx``: input ``image`` float32 (N, 3, 512, 512) RGB, output
  ``logits`` float32 (N, 4, 512, 512): one score per class and pixel
  (``background``, ``disc``, ``box``, ``cross``). Dynamic batch, opset 17,
  weights embedded.
- ``model-256.onnx``: the same weights at (N, 3, 256, 256) -> (N, 4, 256, 256).
- ``calibration.npz``: ``image`` uint8 (N, 512, 512, 3) RGB HWC and
  ``labels`` uint8 (N, 512, 512) class indices, from the training split.
- ``evaluation.npz``: held-out pictures at 512x512, same keys.
- ``evaluation-256.npz``: held-out pictures at 256x256, same keys.

Preprocessing contract (applied by the consumer, not inside the graph):
``(image - 127.5) / 127.5`` per channel, then HWC -> CHW.
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

SEED = 20240929
CLASSES = ("background", "disc", "box", "cross")
TILE = 96
SIZE = 512
LOW_SIZE = 256
TRAIN_TILES = 1200
CALIB_IMAGES = 6
EVAL_IMAGES = 10
LOW_EVAL_IMAGES = 24
OPSET = 17
EPOCHS = 6
BATCH = 16
#: Per-class IoU each class must reach on the held-out set (fp32, ONNX Runtime). The
#: crosses are 2 to 4 pixels wide: a pixel off at each edge halves their IoU.
TARGET = (0.9, 0.8, 0.8, 0.35)


def seed_everything(seed: int) -> None:
    """Make every random source and kernel choice deterministic."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _colour(rng: np.random.Generator, away_from: np.ndarray) -> np.ndarray:
    """A random RGB colour at least 60 levels from ``away_from`` in some channel."""
    while True:
        colour = rng.uniform(0, 255, size=3)
        if np.max(np.abs(colour - away_from)) >= 60:
            return colour


def _waves(rng: np.random.Generator, xx: np.ndarray, yy: np.ndarray, period: float) -> np.ndarray:
    """A sinusoidal grating of ``period`` pixels at a random angle and phase, in -1..1."""
    angle = rng.uniform(0, np.pi)
    phase = rng.uniform(0, 2 * np.pi)
    along = xx * np.cos(angle) + yy * np.sin(angle)
    waves: np.ndarray = np.sin(2 * np.pi * along / period + phase)
    return waves


def render(
    rng: np.random.Generator, size: int, crosses: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """One RGB uint8 (size, size, 3) picture and its uint8 (size, size) class map.

    The background is a fine grating (a period of 3 to 5 pixels) over a colour
    gradient; discs are flat colour; boxes are coarse stripes (8 to 12
    pixels); crosses are thin flat plus signs. Objects keep their absolute
    pixel sizes at any picture size: a larger picture holds more of them
    (``crosses`` per 64x64 area on average; training tiles get more).
    """
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    area = (size / 64.0) ** 2
    base = rng.uniform(50, 205, size=3)
    ramp = np.linspace(-1, 1, size)
    slope = rng.uniform(-25, 25, size=(2, 3))
    picture = base + slope[0] * ramp[:, None, None] + slope[1] * ramp[None, :, None]
    picture += rng.uniform(15, 30) * _waves(rng, xx, yy, rng.uniform(3, 5))[..., None]
    labels = np.zeros((size, size), np.uint8)
    kinds = [1] * rng.poisson(0.8 * area) + [2] * rng.poisson(0.8 * area)
    kinds += [3] * rng.poisson(crosses * area)
    for kind in rng.permutation(np.array(kinds, np.int64)).tolist():
        cx, cy = rng.uniform(0, size, size=2)
        colour = _colour(rng, base)
        if kind == 1:  # a flat disc
            mask = np.hypot(xx - cx, yy - cy) < rng.uniform(6, 24)
            picture[mask] = colour
        elif kind == 2:  # a striped box, axis-aligned or turned
            half = rng.uniform(6, 24, size=2)
            angle = rng.choice([0.0, rng.uniform(0, np.pi / 2)])
            u = (xx - cx) * np.cos(angle) + (yy - cy) * np.sin(angle)
            v = -(xx - cx) * np.sin(angle) + (yy - cy) * np.cos(angle)
            mask = (np.abs(u) < half[0]) & (np.abs(v) < half[1])
            stripes = _waves(rng, xx, yy, rng.uniform(8, 12))
            picture[mask] = colour + 45 * stripes[mask][:, None]
        else:  # a thin flat cross: the tail class
            arm, width = rng.uniform(4, 8), rng.uniform(1.2, 2.2)
            dx, dy = np.abs(xx - cx), np.abs(yy - cy)
            mask = ((dx < width) & (dy < arm)) | ((dy < width) & (dx < arm))
            picture[mask] = colour
        labels[mask] = kind
    picture += rng.normal(0.0, 1.5, size=picture.shape)
    return np.clip(np.round(picture), 0, 255).astype(np.uint8), labels


def synthesize(
    count: int, size: int, rng: np.random.Generator, crosses: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` pictures uint8 (N, size, size, 3) and class maps uint8 (N, size, size)."""
    pairs = [render(rng, size, crosses) for _ in range(count)]
    return np.stack([p for p, _ in pairs]), np.stack([m for _, m in pairs])


def preprocess(images: np.ndarray) -> np.ndarray:
    """Apply the model contract: uint8 HWC RGB -> normalised float32 NCHW."""
    x = (images.astype(np.float32) - 127.5) / 127.5
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def conv_bn(c_in: int, c_out: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    """3x3 convolution, BatchNorm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, dilation, dilation=dilation, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


def fuse(c_in: int, c_out: int) -> nn.Sequential:
    """1x1 convolution, BatchNorm and ReLU: a decoder step over the concatenated features."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class Segmenter(nn.Module):
    """Full-resolution stem, encoder to 1/8, dilated context, two skip-connected decoder steps."""

    def __init__(self) -> None:
        super().__init__()
        self.scale1 = conv_bn(3, 16)  # 1/1: the largest activation
        self.scale2 = conv_bn(16, 16, 2)  # 1/2
        self.scale4 = conv_bn(16, 32, 2)  # 1/4
        self.scale8 = nn.Sequential(conv_bn(32, 48, 2), conv_bn(48, 48, dilation=2))  # 1/8
        self.up4 = fuse(48 + 32, 32)
        self.up2 = fuse(32 + 16, 16)
        self.head = nn.Conv2d(16, len(CLASSES), 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        half = self.scale2(self.scale1(image))
        quarter = self.scale4(half)
        deep = self.scale8(quarter)
        up = functional.interpolate(deep, scale_factor=2.0, mode="nearest")
        x = self.up4(torch.cat([up, quarter], dim=1))
        up = functional.interpolate(x, scale_factor=2.0, mode="nearest")
        x = self.head(self.up2(torch.cat([up, half], dim=1)))
        full: torch.Tensor = functional.interpolate(
            x, scale_factor=2.0, mode="bilinear", align_corners=False
        )
        return full


def train(model: Segmenter, x: torch.Tensor, labels: torch.Tensor) -> None:
    """Train in place on class-weighted cross-entropy with AdamW, one-cycle schedule."""
    gen = torch.Generator().manual_seed(SEED)
    counts = torch.bincount(labels.reshape(-1), minlength=len(CLASSES)).double()
    # The rare classes weigh more (inverse square root of their frequency).
    weight = (counts.sum() / counts).sqrt()
    weight = (weight / weight.mean()).float()
    print(
        "pixel share per class: "
        + ", ".join(
            f"{c} {n:.2%}" for c, n in zip(CLASSES, (counts / counts.sum()).tolist(), strict=True)
        )
    )
    steps = EPOCHS * ((len(x) + BATCH - 1) // BATCH)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=steps)
    model.train()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for start in range(0, len(x), BATCH):
            idx = order[start : start + BATCH]
            loss = functional.cross_entropy(model(x[idx]), labels[idx], weight=weight)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1:3d}  loss {total / len(x):.4f}")


def class_iou(logits: np.ndarray, labels: np.ndarray) -> list[float]:
    """IoU of each class over every pixel of the set (argmax of the scores)."""
    pred = np.argmax(logits, axis=1)
    result = []
    for label in range(len(CLASSES)):
        inter = np.sum((pred == label) & (labels == label))
        union = np.sum((pred == label) | (labels == label))
        result.append(float(inter / union) if union else 1.0)
    return result


def export(model: nn.Module, path: Path, size: int) -> None:
    """Export to a single self-contained ONNX file at ``size`` with a dynamic batch."""
    model.eval()
    # The TorchScript exporter is deprecated, but it writes opset 17 directly
    # (the dynamo exporter builds opset 18 and fails to convert down) and
    # needs no onnxscript.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, size, size),),
            str(path),
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def check(path: Path, images: np.ndarray, labels: np.ndarray) -> list[float]:
    """Per-class IoU of the exported model under ONNX Runtime, one picture at a time."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = preprocess(images)
    logits = np.concatenate(
        [session.run(["logits"], {"image": x[i : i + 1]})[0] for i in range(len(x))]
    )
    ious = class_iou(logits, labels)
    shown = ", ".join(f"{c} {v:.4f}" for c, v in zip(CLASSES, ious, strict=True))
    mean = float(np.mean(ious))
    print(f"{path.name}: onnxruntime fp32 held-out IoU per class: {shown}; mean {mean:.4f}")
    for name, value, target in zip(CLASSES, ious, TARGET, strict=True):
        if value < target:
            raise SystemExit(f"{path.name}: {name} IoU {value:.4f} is below its {target} target")
    return ious


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(SEED)

    rng = np.random.default_rng(SEED + 1)
    # Three times the crosses of the held-out pictures: the tail class needs examples.
    train_images, train_labels = synthesize(TRAIN_TILES, TILE, rng, crosses=1.5)
    calib_images, calib_labels = synthesize(CALIB_IMAGES, SIZE, rng)
    eval_images, eval_labels = synthesize(EVAL_IMAGES, SIZE, rng)
    low_images, low_labels = synthesize(LOW_EVAL_IMAGES, LOW_SIZE, rng)

    model = Segmenter()
    print(f"parameters: {sum(p.numel() for p in model.parameters())}")
    train(
        model,
        torch.from_numpy(preprocess(train_images)),
        torch.from_numpy(train_labels.astype(np.int64)),
    )
    model.eval()

    export(model, out / "model.onnx", SIZE)
    export(model, out / "model-256.onnx", LOW_SIZE)
    np.savez_compressed(out / "calibration.npz", image=calib_images, labels=calib_labels)
    np.savez_compressed(out / "evaluation.npz", image=eval_images, labels=eval_labels)
    np.savez_compressed(out / "evaluation-256.npz", image=low_images, labels=low_labels)
    check(out / "model.onnx", eval_images, eval_labels)
    check(out / "model-256.onnx", low_images, low_labels)
    print(
        f"wrote model.onnx, model-256.onnx, calibration.npz ({CALIB_IMAGES}), "
        f"evaluation.npz ({EVAL_IMAGES}), evaluation-256.npz ({LOW_EVAL_IMAGES})"
    )


if __name__ == "__main__":
    main()
