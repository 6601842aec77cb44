"""Validation accuracy with and without re-estimated batch-norm statistics, per epoch, one run.

Usage: .venv/bin/python benchmarks/batch_norm.py [--config configs/demo.yaml]
           [--builder benchmarks/models/residual_bn.py:build] [--image-size 64]
           [--epochs 8] [--learning-rate 0.002] [--batch-size 64] [--seed 1]

Trains the builder's network on the config's data with plain Keras (Adam, the run's tf.data
reader; nothing of tfopt's own stopping or re-estimation), and after every epoch scores the
validation split twice on the same weights: with the moving statistics the training left
(inference mode as it is) and with them re-estimated from 512 training images
(`tfopt.models.batch_norm.reestimate`); the training then goes on from its own statistics.
Prints both per epoch and the training accuracy beside them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tfopt  # noqa: F401
from flows.parameters import load_pipeline_config
from tasks.write_tfrecords import write_tfrecords
from tfopt.artifacts import TrainingData
from tfopt.data.pipeline import load_split
from tfopt.models.batch_norm import (
    REESTIMATION_IMAGES,
    accuracy,
    batch_norm_layers,
    moving_statistics,
    reestimate,
    restore_statistics,
)
from tfopt.models.sources import build_with
from tfopt.models.training import compile_for_labels, training_data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--builder", default="benchmarks/models/residual_bn.py:build")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=0.002)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(".tfopt/batch-norm"))
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config, {"data.image_size": args.image_size})
    dataset = write_tfrecords.fn(config.data, args.work)
    data = TrainingData(dataset=dataset, batch_size=args.batch_size, seed=args.seed,
                        input=config.input)
    model = build_with(args.builder, dataset.image_size, dataset.num_classes)
    layers = batch_norm_layers(model)
    print(f"{args.builder}: {len(layers)} batch-norm layers, {dataset.splits['train'].examples} "
          f"training images, batch {args.batch_size}")
    compile_for_labels(model, args.learning_rate)
    train, _, _ = training_data(data)
    train_images, _ = load_split(dataset, "train", REESTIMATION_IMAGES, data.input_scale)
    val_images, val_labels = load_split(dataset, "val", scale=data.input_scale)
    print("epoch  train acc  val (as trained)  val (re-estimated)")
    for epoch in range(1, args.epochs + 1):
        history = model.fit(train, epochs=1, verbose=0)
        stale = moving_statistics(layers)
        before = accuracy(model, val_images, val_labels)
        reestimate(model, layers, train_images)
        after = accuracy(model, val_images, val_labels)
        restore_statistics(layers, stale)
        print(f"{epoch:5d}  {history.history['accuracy'][-1]:9.4f}  {before:16.4f}  "
              f"{after:18.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
