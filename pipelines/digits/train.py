"""Train the ``digits`` example model and export it with its datasets.

A MobileNet-style classifier (depthwise-separable convolutions, BatchNorm,
ReLU6, global average pooling, linear head) trained on scikit-learn's bundled
``load_digits`` images, upscaled from 8x8 grey to 32x32 RGB.

Outputs, written next to this script (or to ``--out``):

- ``model.onnx``: input ``image`` float32 (N, 3, 32, 32), output ``logits``
  (N, 10), dynamic batch, opset 17, weights embedded.
- ``calibration.npz``: ``image`` uint8 (N, 32, 32, 3) RGB and ``labels``
  int64 (N,), class-balanced samples of the training split.
- ``evaluation.npz``: the whole held-out split, same keys.

Preprocessing contract (applied by the consumer, not inside the graph):
``(image - 127.5) / 127.5`` per channel, then HWC -> CHW.

Nothing is downloaded: ``load_digits`` ships with scikit-learn.
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
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional

SEED = 20240601
SIZE = 32
MEAN = 127.5
STD = 127.5
OPSET = 17
EPOCHS = 40
BATCH = 64
CALIB_PER_CLASS = 20


def seed_everything(seed: int) -> None:
    """Make every random source and kernel choice deterministic."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def load_images() -> tuple[np.ndarray, np.ndarray]:
    """Return digits as uint8 (N, 32, 32, 3) RGB and int64 labels."""
    digits = load_digits()
    grey = torch.from_numpy(digits.images.astype(np.float32) * (255.0 / 16.0))
    big = functional.interpolate(
        grey[:, None], size=(SIZE, SIZE), mode="bilinear", align_corners=False
    )
    big_u8 = big.round().clamp(0, 255).to(torch.uint8)[:, 0].numpy()
    rgb = np.repeat(big_u8[..., None], 3, axis=-1)
    return np.ascontiguousarray(rgb), digits.target.astype(np.int64)


def preprocess(images: np.ndarray) -> np.ndarray:
    """Apply the model contract: uint8 HWC RGB -> normalised float32 NCHW."""
    x = (images.astype(np.float32) - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    """Convolution, BatchNorm and ReLU6."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU6(inplace=True),
    )


def separable(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    """Depthwise 3x3 followed by pointwise 1x1 convolution."""
    return nn.Sequential(conv_bn(c_in, c_in, 3, stride, groups=c_in), conv_bn(c_in, c_out, 1, 1))


class TinyMobileNet(nn.Module):
    """A few-tens-of-thousands-parameter MobileNet-style classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(3, 16, 3, 1),
            separable(16, 32, 2),  # 16x16
            separable(32, 64, 2),  # 8x8
            separable(64, 128, 2),  # 4x4
            separable(128, 128, 1),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(128, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(torch.flatten(self.pool(self.features(image)), 1))
        return logits


def augment(x: torch.Tensor, gen: torch.Generator, shift: int = 2) -> torch.Tensor:
    """Shift each image by up to ``shift`` pixels, filling with background."""
    padded = functional.pad(x, (shift, shift, shift, shift), value=(0.0 - MEAN) / STD)
    offsets = torch.randint(0, 2 * shift + 1, (x.shape[0], 2), generator=gen).tolist()
    return torch.stack(
        [padded[i, :, dy : dy + SIZE, dx : dx + SIZE] for i, (dy, dx) in enumerate(offsets)]
    )


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Train in place with Adam and a cosine learning-rate schedule."""
    gen = torch.Generator().manual_seed(SEED)
    steps = EPOCHS * ((len(x) + BATCH - 1) // BATCH)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    model.train()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for start in range(0, len(x), BATCH):
            idx = order[start : start + BATCH]
            loss = functional.cross_entropy(model(augment(x[idx], gen)), y[idx])
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
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
            (torch.zeros(2, 3, SIZE, SIZE),),
            str(path),
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def balanced_sample(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Indices of up to ``per_class`` samples of each class, in sorted order."""
    rng = np.random.default_rng(seed)
    picks = [
        rng.choice(np.flatnonzero(labels == c), size=per_class, replace=False)
        for c in np.unique(labels)
    ]
    return np.sort(np.concatenate(picks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(SEED)

    images, labels = load_images()
    idx_train, idx_eval = train_test_split(
        np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=SEED
    )
    idx_train, idx_eval = np.sort(idx_train), np.sort(idx_eval)
    x_train = torch.from_numpy(preprocess(images[idx_train]))
    y_train = torch.from_numpy(labels[idx_train])

    model = TinyMobileNet()
    print(f"parameters: {sum(p.numel() for p in model.parameters())}")
    train(model, x_train, y_train)
    model.eval()
    x_eval = preprocess(images[idx_eval])
    with torch.no_grad():
        torch_pred = model(torch.from_numpy(x_eval)).argmax(1).numpy()
    print(f"torch fp32 held-out top-1: {(torch_pred == labels[idx_eval]).mean():.4f}")

    onnx_path = out / "model.onnx"
    export(model, onnx_path)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"image": x_eval})
    accuracy = float((logits.argmax(1) == labels[idx_eval]).mean())
    print(f"onnxruntime fp32 held-out top-1: {accuracy:.4f} ({len(idx_eval)} samples)")
    if accuracy < 0.95:
        raise SystemExit(f"accuracy {accuracy:.4f} is below the 0.95 target")

    calib = idx_train[balanced_sample(labels[idx_train], CALIB_PER_CLASS, SEED)]
    np.savez_compressed(out / "calibration.npz", image=images[calib], labels=labels[calib])
    np.savez_compressed(out / "evaluation.npz", image=images[idx_eval], labels=labels[idx_eval])
    print(f"wrote {onnx_path}, calibration.npz ({len(calib)}), evaluation.npz ({len(idx_eval)})")


if __name__ == "__main__":
    main()
