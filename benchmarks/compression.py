"""Accuracy and zipped size of every compressed variant against the fp32 TFLite baseline.

Usage: .venv/bin/python benchmarks/compression.py [--config configs/demo.yaml] [--work DIR]

Runs tfopt's own steps (as plain functions, no servers) on the demo data: shard, train the
baseline, prune, distill (with the scratch control), quantization-aware training, and TFLite
conversions; then evaluates every TFLite variant on the same test split with LiteRT and prints
its accuracy delta (points) and gzip-size ratio against `baseline-tflite-fp32`. Goals: pruned
(80%) + int8 at least 8x smaller zipped than the fp32 TFLite baseline; QAT int8 within 1 point
of the float baseline; the distilled student at least as accurate as the student from scratch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import tfopt  # noqa: F401
from tasks.convert_tflite import convert_tflite
from tasks.export_savedmodel import export_savedmodel
from tasks.input_pipeline import load_split
from tasks.runners import TFLiteRunner, predict_batched
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques.distill import distill_model
from techniques.prune import prune_model
from techniques.qat import quantize_aware_train
from tfopt.artifacts import TrainingData
from tfopt.config import load_config
from tfopt.demo_data import write_demo_images
from tfopt.fileio import gzip_size_bytes
from tfopt.variants import plan_variant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    config = load_config(args.config)
    if config.data.source_dir == Path("data/demo"):
        write_demo_images(config.data.source_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="tfopt-compression-"))
    cfg = config.compress
    dataset = write_tfrecords.fn(config.data, work)
    data = TrainingData(dataset=dataset, batch_size=config.train.batch_size or 64,
                        seed=config.train.seed, input=config.input)
    baseline = train_model.fn(data, config.model, config.train, work / "models")
    pruned = prune_model.fn(baseline, cfg.prune, data, work / "models")
    distilled = distill_model.fn(baseline, cfg.distill, data, work / "models")
    qat = quantize_aware_train.fn(baseline, cfg.qat, data, work / "models")

    variants = {}
    for source, precisions in ((baseline, ("fp32", "dynamic", "float16", "int8")),
                               (pruned, ("fp32", "int8")), (distilled, ("fp32", "int8"))):
        savedmodel = export_savedmodel.fn(source, work / "models")
        for precision in precisions:
            planned = plan_variant(source.name, "tflite", precision)
            spec = convert_tflite.fn(savedmodel, planned, dataset, config.convert, work / "v")
            variants[spec.name] = spec.path
    qat_int8 = plan_variant(qat.name, "tflite", "int8")
    variants[qat_int8.name] = convert_tflite.fn(qat, qat_int8, dataset, config.convert,
                                                work / "v").path

    images, labels = load_split(dataset, "test", scale=config.model.input_scale)
    float_accuracy = baseline.metrics["test_accuracy"]
    reference_zip = gzip_size_bytes(variants["baseline-tflite-fp32"])
    print(f"demo test split: {len(labels)} images; float baseline accuracy {float_accuracy:.4f}")
    print(f"{'variant':30s} {'accuracy':>9s} {'Δ pts':>7s} {'gzip KB':>9s} {'zip ratio':>10s}")
    accuracy = {}
    for name, path in variants.items():
        logits = predict_batched(TFLiteRunner(path, threads=2), images)
        accuracy[name] = float(np.mean(np.argmax(logits, 1) == labels))
        zipped = gzip_size_bytes(path)
        print(f"{name:30s} {accuracy[name]:9.4f} {(accuracy[name] - float_accuracy) * 100:+7.2f} "
              f"{zipped / 1024:9.1f} {reference_zip / zipped:9.1f}x")
    pruned_int8 = plan_variant(pruned.name, "tflite", "int8").name
    zip_gain = reference_zip / gzip_size_bytes(variants[pruned_int8])
    qat_drop = (float_accuracy - accuracy[qat_int8.name]) * 100
    student, scratch = (distilled.metrics["test_accuracy"],
                        distilled.metrics["scratch_test_accuracy"])
    print()
    print(f"sparsity reached: {pruned.metrics['sparsity']:.3f} "
          f"(target {pruned.params['target_sparsity']})")
    print(f"goal {pruned_int8} >= 8x smaller zipped: {zip_gain:.1f}x "
          f"({'met' if zip_gain >= 8 else 'missed'})")
    print(f"goal QAT int8 within 1 point of float: {qat_drop:+.2f} points lost "
          f"({'met' if qat_drop <= 1 else 'missed'})")
    print(f"goal distilled >= scratch student: {student:.4f} vs {scratch:.4f} "
          f"({'met' if student >= scratch else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
