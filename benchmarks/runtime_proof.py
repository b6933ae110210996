"""Runtime proof benchmark: what proving min_mnn_runtime costs per variant.

For each variant of the repository's models.toml (converted, and quantized
for int8, into a temporary directory), on the model's whole evaluation set:

1. plain inference with the build's MNN, one sample per forward pass
   (``toolchain.run_inference(batch_size=1)``): what the proof compares
   against;
2. the proof: the same samples under the isolated MNN runtime of
   ``[toolchain] min_mnn_runtime`` (``runtimes.prove_min_runtime``: child
   start, load, forward passes, comparison);
3. the batched inference the build's verify stage already runs, for scale.

Prints per variant the median seconds of each, the ratio proof / plain
(target: <= 2.0: the old runtime does the same work plus a child start), the
largest output difference and the label agreement. Needs the runtime
installed (`make venv`).

Usage: .venv/bin/python benchmarks/runtime_proof.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgereg import config as config_mod
from edgereg import toolchain
from edgereg.build.datasets import load_dataset
from edgereg.toolchain import runtimes

ROOT = Path(__file__).resolve().parents[1]
RATIO_TARGET = 2.0
CALIBRATION_SAMPLES = 100


def _median_seconds(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _artifact(config: config_mod.Config, model: str, variant: str, out: Path) -> Path:
    spec = config.models[model]
    recipe = spec.variants[variant]
    resolved = config.resolve(model, variant)
    source = config.resolve_path(resolved.source)
    quant = recipe.quantization
    path = out / f"{model}-{variant}.mnn"
    options: dict[str, Any] = {"fp16": recipe.precision == "fp16"}
    if quant.mode == "weight":
        options.update(weight_quant_bits=quant.bits, weight_quant_asymmetric=quant.asymmetric)
    float_path = path if quant.mode != "int8" else out / f"{model}-{variant}.float.mnn"
    toolchain.convert(source, float_path, **options)
    if quant.mode == "int8":
        calibration = resolved.calibration
        assert calibration is not None
        data = load_dataset(
            config.resolve_path(calibration),
            list(resolved.inputs),
            stage="bench",
            need_labels=False,
        )
        count = min(len(data), CALIBRATION_SAMPLES)
        rows = [{n: a[i : i + 1] for n, a in data.inputs.items()} for i in range(count)]
        toolchain.quantize(
            float_path,
            path,
            inputs=[toolchain.QuantInput(i.name, i.shape) for i in resolved.inputs],
            samples=rows,
            method=quant.method,
            debug=False,
        )
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (median)")
    args = parser.parse_args()
    config = config_mod.load(ROOT / "models.toml")
    version = config.toolchain.minimum_runtime
    if not config.toolchain.needs_runtime_proof:
        print("models.toml declares no min_mnn_runtime below the converter: nothing to prove")
        return 0
    root = runtimes.runtimes_dir()
    runtimes.find_runtime(version, root=root)  # fails early, naming the install command
    load = os.getloadavg()[0]
    print(f"MNN {toolchain.installed_version('mnn')} (build) vs MNN {version} (proof)")
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs")
    header = (
        f"{'variant':<14} {'samples':>7} {'plain s':>8} {'proof s':>8} {'ratio':>6} "
        f"{'batched s':>9} {'max diff':>9} {'labels':>7}"
    )
    print(header)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="edgereg-proof-bench-") as tmp:
        for model, spec in config.models.items():
            data = load_dataset(
                config.resolve_path(spec.evaluation),
                list(spec.inputs),
                stage="bench",
                need_labels=False,
            )
            names = [i.name for i in spec.inputs]
            outputs = [o.name for o in spec.outputs]
            for variant, recipe in spec.variants.items():
                artifact = _artifact(config, model, variant, Path(tmp))
                infer = functools.partial(
                    toolchain.run_inference,
                    artifact,
                    data.inputs,
                    feeds=[toolchain.InputFeed.batched(n, data.inputs[n]) for n in names],
                    output_names=outputs,
                )
                plain_s, expected = _median_seconds(
                    functools.partial(infer, batch_size=1), args.repeat
                )
                batched_s, _ = _median_seconds(functools.partial(infer, batch_size=64), args.repeat)
                prove = functools.partial(
                    runtimes.prove_min_runtime,
                    artifact,
                    version,
                    data.inputs,
                    expected,
                    input_names=names,
                    output_names=outputs,
                    tolerance=runtimes.default_tolerance(recipe.quantization.mode),
                    root=root,
                )
                proof_s, proof = _median_seconds(prove, args.repeat)
                ratio = proof_s / plain_s
                ratios.append(ratio)
                agreement = min(
                    (o.argmax_agreement for o in proof.outputs if o.argmax_agreement is not None),
                    default=None,
                )
                labels = f"{agreement:.1%}" if agreement is not None else "-"
                print(
                    f"{model + '/' + variant:<14} {len(data):>7} {plain_s:>8.3f} "
                    f"{proof_s:>8.3f} {ratio:>6.2f} {batched_s:>9.3f} "
                    f"{proof.max_abs_diff:>9.2g} {labels:>7}"
                )
    worst = max(ratios)
    verdict = "PASS" if worst <= RATIO_TARGET else "FAIL"
    print()
    print(f"proof / plain inference of the same samples, worst variant: {worst:.2f}")
    print(f"target <= {RATIO_TARGET}: {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
