"""Distillation recipes against their scratch control, paired: identical batches, over seeds.

Usage: .venv/bin/python benchmarks/distillation.py [--config configs/demo.yaml]
           [--recipes T1:a0.5,T4:a0.5] [--seeds 1,2,3,4,5] [--schedule cosine|constant]
           [--epochs N] [--student-init teacher|random] [--work DIR]

Trains the config's baseline once (seed 1) as the teacher, loads the demo's splits into memory
and, for each seed, trains the student of `compress.distill` from scratch and with each recipe
(temperature T, label weight alpha; a1 trains on labels alone) on the same shuffled batches (a
seeded in-memory reader instead of the run's pipeline), keeping each training's best
validation epoch as tfopt does. Every student is built from the same seeded initial weights;
the distilled ones then start from the teacher's filters when `student_init` is teacher (as
tfopt's distilled student does), so a1 shows what that start alone is worth. It prints every
test accuracy and, per recipe, the gain over scratch in points: mean and range over the seeds.
Pairing removes the reader's and the initialisation's noise from the comparison, which one
unpaired run per seed cannot resolve.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

import tfopt  # noqa: F401
from flows.parameters import load_pipeline_config
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques.distill import (
    STUDENT_ARCHITECTURE,
    DistillConfig,
    compiled_distiller,
    start_student,
    students_learning_rate,
)
from tfopt.artifacts import TrainingData
from tfopt.data.pipeline import load_split
from tfopt.demo_data import write_demo_images
from tfopt.models.keras_io import load_keras_model
from tfopt.models.training import KeepBestWeights, compile_for_labels
from tfopt.models.zoo import build_model

Split = tuple[np.ndarray, np.ndarray]


def parse_recipes(text: str) -> list[tuple[float, float]]:
    """``"T1:a0.5,T4:a0.5"`` -> [(1.0, 0.5), (4.0, 0.5)] (temperature, alpha)."""
    recipes = []
    for item in text.split(","):
        temperature, alpha = item.split(":")
        recipes.append((float(temperature.removeprefix("T")), float(alpha.removeprefix("a"))))
    return recipes


def train_student(splits: dict[str, Split], teacher: keras.Model, cfg: DistillConfig,
                  data: TrainingData, recipe: tuple[float, float] | None, seed: int) -> float:
    """One student's test accuracy: from scratch (`recipe` None) or distilled with `recipe`.

    `cfg` gives the width, epochs, learning rate (and its schedule, as techniques.distill
    sets it) and the distilled student's start; `data` the batch size.
    """
    keras.utils.set_random_seed(seed)
    images, labels = splits["train"]
    student = build_model(STUDENT_ARCHITECTURE, images.shape[1], teacher.output_shape[-1],
                          width=cfg.student_width)
    train = (tf.data.Dataset.from_tensor_slices((images, labels))
             .shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
             .batch(data.batch_size))
    val = tf.data.Dataset.from_tensor_slices(splits["val"]).batch(256)
    if recipe is None:
        model = student
        compile_for_labels(model, students_learning_rate(cfg, data))
    else:
        temperature, alpha = recipe
        start_student(student, teacher, cfg)
        model = compiled_distiller(teacher, student, cfg.model_copy(
            update={"temperature": temperature, "alpha": alpha}), data)
    model.fit(train, validation_data=val, epochs=cfg.epochs, verbose=0,
              callbacks=[KeepBestWeights()])
    test_images, test_labels = splits["test"]
    logits = student.predict(test_images, batch_size=256, verbose=0)
    return float(np.mean(np.argmax(logits, 1) == test_labels))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--recipes", default="T1:a0.75,T1:a0.5,T2:a0.5,T1:a1")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--schedule", choices=["cosine", "constant"], default=None,
                        help="default: the config's compress.distill.learning_rate_schedule")
    parser.add_argument("--epochs", type=int, default=None,
                        help="default: the config's compress.distill.epochs")
    parser.add_argument("--student-init", choices=["teacher", "random"], default=None,
                        help="default: the config's compress.distill.student_init")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config)
    cfg = config.compress.distill.model_copy(update={
        "learning_rate_schedule": args.schedule or config.compress.distill.learning_rate_schedule,
        "epochs": args.epochs or config.compress.distill.epochs,
        "student_init": args.student_init or config.compress.distill.student_init})
    if config.data.source_dir == Path("data/demo"):
        write_demo_images(config.data.source_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="tfopt-distillation-"))
    dataset = write_tfrecords.fn(config.data, work)
    data = TrainingData(dataset=dataset, batch_size=config.train.batch_size or 64, seed=1,
                        input=config.input)
    teacher = load_keras_model(train_model.fn(data, config.model, config.train, work).path)
    splits = {name: load_split(dataset, name, scale=config.model.input_scale)
              for name in ("train", "val", "test")}
    recipes = parse_recipes(args.recipes)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    gains: dict[tuple[float, float], list[float]] = {recipe: [] for recipe in recipes}
    for seed in seeds:
        scratch = train_student(splits, teacher, cfg, data, None, seed)
        print(f"seed {seed}: scratch {scratch:.4f}", flush=True)
        for recipe in recipes:
            accuracy = train_student(splits, teacher, cfg, data, recipe, seed)
            gains[recipe].append((accuracy - scratch) * 100.0)
            print(f"seed {seed}: T{recipe[0]:g} a{recipe[1]:g} {accuracy:.4f} "
                  f"({gains[recipe][-1]:+.2f} points)", flush=True)
    print(f"\nstudent width {cfg.student_width}, {cfg.epochs} epochs, "
          f"{cfg.learning_rate_schedule} learning rate from "
          f"{cfg.learning_rate:g}, distilled students from {cfg.student_init} weights, "
          f"{len(seeds)} seeds; gain over scratch, points:")
    for (temperature, alpha), values in gains.items():
        print(f"T{temperature:g} a{alpha:g}: {np.mean(values):+.2f} "
              f"[{min(values):+.2f}, {max(values):+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
