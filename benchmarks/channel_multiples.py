"""Thinned int8 files with their kept channels as they fall, or rounded up to a multiple: speed.

Usage: .venv/bin/python benchmarks/channel_multiples.py MODEL.keras DATA.npz
                                                        [--fractions 0.25,0.5] [--multiple 8]
                                                        [--threads 2] [--rounds 7]
                                                        [--deny-amx]

A channel-pruned model's speed is judged as its int8 file's (the search's and the champion's
rule). XNNPACK's int8 kernels work on tiles of channels: a layer left with 12 channels may cost
what 16 do, or more. For a Keras file and its inputs (``x`` of the ``.npz``), each fraction of
filters is removed (`tfopt.models.channel_pruning.thin_model`, weights as they are: speed does
not depend on them) with the kept counts as they fall and rounded up to ``--multiple``; each model
is converted to LiteRT full-integer int8 (calibrated on 64 inputs) and timed with a bare loop
(batch 1) in rounds that alternate with the baseline's own int8 file. Prints, per file, its kept
channels, its FLOPs against the baseline's and its speed-up (the baseline's p50 over its p50):
the median over rounds and their range. ``--deny-amx`` first forbids AMX to this process, as a
run does where AMX slowed its int8 file (`benchmark.amx`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from harness_overhead import bare_p50, bare_tflite

import tfopt  # noqa: F401
from tfopt.models.channel_pruning import thin_model
from tfopt.models.flops import keras_flops
from tfopt.models.keras_io import load_keras_model
from tfopt.models.translate import tf_keras_twin


def int8_file(model, inputs: np.ndarray, path: Path) -> Path:
    """`model` as a full-integer int8 LiteRT file calibrated on `inputs` (float in and out)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([row[None]] for row in inputs)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    path.write_bytes(converter.convert())
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--fractions", default="0.25,0.5")
    parser.add_argument("--multiple", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--deny-amx", action="store_true")
    args = parser.parse_args()
    if args.deny_amx:
        from tfopt.cpu_features import deny_amx

        deny_amx()
    inputs = np.load(args.data)["x"][:64].astype(np.float32)
    base = tf_keras_twin(load_keras_model(args.model), inputs).model
    work = Path(tempfile.mkdtemp(prefix="channel-multiples-"))
    files = {"baseline": (int8_file(base, inputs, work / "baseline.tflite"), "-", 1.0)}
    for fraction in (float(f) for f in args.fractions.split(",")):
        for multiple in (1, args.multiple):
            thinned = thin_model(base, fraction, min_channels=1, multiple=multiple)
            name = f"channels-{round(fraction * 100)} x{multiple}"
            kept = ",".join(str(kept) for kept, _ in thinned.kept.values())
            files[name] = (int8_file(thinned.model, inputs, work / f"{name}.tflite"), kept,
                           keras_flops(thinned.model) / keras_flops(base))
    calls = {name: bare_tflite(path, args.threads) for name, (path, _, _) in files.items()}
    singles = [np.ascontiguousarray(inputs[i:i + 1]) for i in range(len(inputs))]
    ratios: dict[str, list[float]] = {name: [] for name in files if name != "baseline"}
    for _ in range(args.rounds):
        for name in ratios:
            reference = bare_p50(calls["baseline"], singles, args.runs, 20)
            ratios[name].append(reference / bare_p50(calls[name], singles, args.runs, 20))
    print(f"{args.model.name}: int8 files, bare LiteRT loop, batch 1, {args.threads} threads, "
          f"{args.rounds} alternating rounds{', AMX denied' * args.deny_amx}")
    print(f"{'file':<18} {'kept channels':<28} {'FLOPs':>6} {'speed-up (median, range)':>26}")
    for name, values in ratios.items():
        _, kept, flops = files[name]
        print(f"{name:<18} {kept:<28} {flops:>6.2f} {np.median(values):>11.2f}x "
              f"({min(values):.2f}-{max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
