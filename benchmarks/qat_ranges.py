"""QAT's int8 accuracy with and without its activation ranges calibrated first, side by side.

Usage: .venv/bin/python benchmarks/qat_ranges.py [--config configs/demo.yaml]
           [--builder benchmarks/models/residual_bn.py:build] [--image-size 64]
           [--baseline-epochs 20] [--epochs 2] [--seeds 1,2,3]

Trains one baseline (the builder's network on the config's data, tfopt's own training), then per
seed fine-tunes two fake-quantized copies of it as `techniques.qat` does (tfmot's 8-bit scheme,
Adam, the run's pipeline, the same seed): one with tfmot's ranges as they start ([-6, 6]), one
with them calibrated from training images first (`tfopt.models.quantization_ranges`). Each is
converted to an int8 TFLite file by tfopt's converter and scored on the validation and test
splits; printed beside the float baseline's accuracy, with the ranges each fine-tuning ended
with.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from compression import build

import tfopt  # noqa: F401
from flows.parameters import load_pipeline_config
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques.base import tfmot_model
from techniques.qat import make_quantization_aware
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.data.pipeline import load_split
from tfopt.models.quantization_ranges import (
    CALIBRATION_IMAGES,
    calibrate_ranges,
    moving_average_ranges,
)
from tfopt.models.serving_export import save_serving_savedmodel
from tfopt.models.training import fit
from tfopt.runtimes import plan_variant
from tfopt.runtimes.base import predict_batched
from tfopt.runtimes.litert import TFLiteRunner


def int8_accuracies(qat: object, baseline: ModelArtifact, data: TrainingData, config: object,
                    out: Path, name: str) -> tuple[float, float]:
    """The validation and test accuracy of `qat`'s int8 TFLite file, converted as tfopt does."""
    path = out / f"{name}-savedmodel"
    save_serving_savedmodel(qat, baseline.image_size, path, baseline.class_names,
                            baseline.channels)
    savedmodel = baseline.model_copy(update={"name": name, "path": path, "format": "savedmodel"})
    spec = plan_variant(name, "tflite", "int8")
    built = build(spec, savedmodel, config, data.dataset, out)
    if built.status != "ok" or built.path is None:
        raise RuntimeError(f"{spec.name}: {built.error}")
    runner = TFLiteRunner(built.path, threads=2)
    scores = []
    for split in ("val", "test"):
        images, labels = load_split(data.dataset, split, scale=data.input_scale)
        scores.append(float(np.mean(np.argmax(predict_batched(runner, images), 1) == labels)))
    return scores[0], scores[1]


def ranges_line(qat: object) -> str:
    """The moving-average ranges' spread: their lowest minimum and highest maximum, their mean."""
    ranges = moving_average_ranges(qat)
    lows = [float(np.min(r.low)) for r in ranges]
    highs = [float(np.max(r.high)) for r in ranges]
    return (f"{len(lows)} ranges, min [{min(lows):.2f}, {max(lows):.2f}], "
            f"max [{min(highs):.2f}, {max(highs):.2f}]")


def main(argv: list[str] | None = None) -> int:
    import tf_keras as keras

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--builder", default="benchmarks/models/residual_bn.py:build")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--baseline-epochs", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--work", type=Path, default=Path(".tfopt/qat-ranges"))
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config, {
        "data.image_size": args.image_size, "model.source": "builder",
        "model.builder": args.builder, "train.epochs": args.baseline_epochs})
    dataset = write_tfrecords.fn(config.data, args.work)
    data = TrainingData(dataset=dataset, batch_size=config.train.batch_size or 64, seed=1,
                        input=config.input)
    baseline = train_model.fn(data, config.model, config.train, args.work / "baseline")
    print(f"{args.builder}: baseline val {baseline.metrics.get('best_val_accuracy', 0):.4f} "
          f"test {baseline.metrics['test_accuracy']:.4f}; QAT {args.epochs} epochs, "
          f"{dataset.splits['train'].examples} training images, batch {data.batch_size}, "
          f"ranges calibrated from {CALIBRATION_IMAGES}")
    train_images, _ = load_split(dataset, "train", CALIBRATION_IMAGES, data.input_scale)
    print("seed  ranges      int8 val  int8 test  ranges after the fine-tuning")
    rows: dict[str, list[tuple[float, float]]] = {"as tfmot": [], "calibrated": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        seeded = data.model_copy(update={"seed": seed})
        for kind in rows:
            keras.utils.set_random_seed(seed)
            base, _ = tfmot_model(baseline, seeded)
            qat, _ = make_quantization_aware(base)
            if kind == "calibrated":
                calibrate_ranges(qat, base, train_images)
            fit(qat, seeded, epochs=args.epochs, learning_rate=args.learning_rate)
            with tempfile.TemporaryDirectory() as out:
                val, test = int8_accuracies(qat, baseline, seeded, config, Path(out),
                                            f"qat-{seed}")
            rows[kind].append((val, test))
            print(f"{seed:4d}  {kind:10s}  {val:8.4f}  {test:9.4f}  {ranges_line(qat)}",
                  flush=True)
    for kind, scores in rows.items():
        vals, tests = zip(*scores, strict=True)
        print(f"{kind:10s}: int8 val mean {np.mean(vals):.4f} [{min(vals):.4f}, {max(vals):.4f}]"
              f", test mean {np.mean(tests):.4f} [{min(tests):.4f}, {max(tests):.4f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
