"""Channel pruning against plain int8, over seeds: is the thinner model faster at the same accuracy?

Usage: .venv/bin/python benchmarks/channel_pruning.py [--config configs/bench.yaml]
                                                      [--seeds 1,2,3] [--fractions 0.5]
                                                      [--depths 0.5,1.0] [--distill]
                                                      [--then 0.25] [--work DIR]

Runs tfopt's own steps (plain functions, no servers) per seed: train the baseline, channel-prune
it at each fraction (`compress.channel_prune`'s epochs and learning rate from the config), with
``--depths`` depth-prune the baseline and the first fraction's model at each share of their
residual blocks (`compress.depth_prune`'s budget: ``depth-50`` and ``channels-50+depth-50``),
with ``--then`` prune the first fraction's fine-tuned model further (iterative pruning: each
share of its remaining filters removed and fine-tuned again) beside the same total share removed
from the baseline at once, and convert each to TFLite full-integer int8 as the pipeline does.
Every file is evaluated on the same test split, and timed with a bare LiteRT loop (batch 1,
`benchmark.threads`) in rounds that alternate with the seed's ``baseline-tflite-int8``, so a
drifting machine moves both alike. Prints each fine-tuning's held-out curve and the epoch it
first came within a point of the baseline's held-out accuracy, then per seed and, over seeds,
the mean and range of: accuracy against the float baseline (points), FLOPs ratio, and the
speed-up over ``baseline-tflite-int8`` (its p50 / the variant's). Goals (issue 32): a
channel-pruned variant >= 1.5x faster than baseline-tflite-int8, within 1 accuracy point of the
baseline; with ``--distill``, the teacher made thinner and distilled (`compress.distill`'s
budget, ``student: thinner``) within 2 points of its teacher and at least as accurate as its
scratch control.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from harness_overhead import bare_p50, bare_tflite

import tfopt  # noqa: F401
from flows.parameters import PipelineConfig, load_pipeline_config
from tasks.build_variant import build_variant
from tasks.export_savedmodel import export_savedmodel
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques.channel_prune import channel_prune_model
from techniques.depth_prune import depth_prune_model
from techniques.distill import distill_model
from tfopt.artifacts import DatasetArtifact, ModelArtifact, TrainingData, VariantSpec
from tfopt.data.pipeline import load_split
from tfopt.demo_data import write_demo_images
from tfopt.runtimes import plan_variant, runtime_of, settings_of
from tfopt.runtimes.base import BuildSources, predict_batched
from tfopt.runtimes.litert import TFLiteRunner

ROUNDS = 5
RUNS_PER_ROUND = 200


def int8_file(model: ModelArtifact, config: PipelineConfig, dataset: DatasetArtifact,
              out: Path) -> Path:
    """The model's TFLite full-integer int8 file, built as the pipeline builds it."""
    savedmodel = export_savedmodel.fn(model, out)
    spec: VariantSpec = plan_variant(model.name, "tflite", "int8")
    sources = BuildSources(model=savedmodel, savedmodel=savedmodel, dataset=dataset,
                           out_dir=out / "v", built={},
                           calibration_examples=config.convert.calibration_examples,
                           accuracy_budget_points=config.benchmark.accuracy_budget_points,
                           threads=config.benchmark.threads)
    built = build_variant.fn(spec, sources, settings_of(runtime_of("tflite"), config))
    if built.status != "ok":
        raise RuntimeError(f"{spec.name}: {built.status}: {built.error}")
    return Path(built.path)


def speedup(path: Path, reference: Path, singles: list[np.ndarray], threads: int) -> list[float]:
    """Per alternating round: the reference's p50 / the variant's p50 (bare loops)."""
    call, reference_call = bare_tflite(path, threads), bare_tflite(reference, threads)
    return [bare_p50(reference_call, singles, RUNS_PER_ROUND, warmup=30)
            / bare_p50(call, singles, RUNS_PER_ROUND, warmup=30) for _ in range(ROUNDS)]


def measure_seed(config: PipelineConfig, dataset: DatasetArtifact, seed: int,
                 fractions: list[float], work: Path, distill: bool = False,
                 teachers: dict[int, dict[str, float]] | None = None,
                 depths: tuple[float, ...] = (), then: tuple[float, ...] = (),
                 ) -> dict[str, dict[str, float]]:
    """One seed's rows: accuracy delta (points), FLOPs ratio and speed-up per variant.

    With `distill`, the teacher made thinner by the first fraction is also distilled (with its
    two controls, whose test accuracies go to `teachers[seed]`). Each of `depths` removes that
    share of the residual blocks of the baseline and of the first fraction's model. Each of
    `then` removes that share of the first fraction's model's remaining filters, beside the
    same total share removed from the baseline at once.
    """
    teachers = {} if teachers is None else teachers
    data = TrainingData(dataset=dataset, batch_size=config.train.batch_size or 64, seed=seed,
                        input=config.input)
    out = work / f"seed-{seed}"
    baseline = train_model.fn(data, config.model, config.train, out)
    files = {"baseline-tflite-int8": int8_file(baseline, config, dataset, out)}
    flops = {"baseline-tflite-int8": 1.0}
    starts = [(baseline, 1.0)]
    pruning = config.compress.channel_prune.fitted_to(baseline)
    held_out = baseline.metrics.get("select_accuracy", baseline.metrics.get("best_val_accuracy"))
    target = (held_out or 0.0) - 0.01
    for fraction in fractions:
        cfg = pruning.model_copy(update={"enabled": True, "fraction": fraction})
        thinner = channel_prune_model.fn(baseline, cfg, data, out)
        print_curve(seed, thinner.name, thinner, target)
        files[f"{thinner.name}-tflite-int8"] = int8_file(thinner, config, dataset, out)
        flops[f"{thinner.name}-tflite-int8"] = thinner.metrics["flops_ratio"]
        if len(starts) == 1:
            starts.append((thinner, thinner.metrics["flops_ratio"]))
    for share in then:
        first, first_flops = starts[1]
        total = 1.0 - (1.0 - fractions[0]) * (1.0 - share)
        for start, name in ((baseline, f"channels-{total * 100:g}-at-once"),
                            (first, f"channels-{total * 100:g}-from-{first.name}")):
            cfg = pruning.model_copy(update={
                "enabled": True, "fraction": total if start is baseline else share})
            thinner = channel_prune_model.fn(start, cfg, data, out / name)
            print_curve(seed, name, thinner, target)
            files[f"{name}-tflite-int8"] = int8_file(thinner, config, dataset, out / name)
            flops[f"{name}-tflite-int8"] = thinner.metrics["flops_ratio"] * (
                1.0 if start is baseline else first_flops)
    for share in depths:
        for start, start_flops in starts:
            cfg = config.compress.depth_prune.model_copy(update={"enabled": True, "share": share})
            shallower = depth_prune_model.fn(start, cfg, data, out / start.name)
            name = shallower.name if start is baseline else f"{start.name}+{shallower.name}"
            files[f"{name}-tflite-int8"] = int8_file(shallower, config, dataset, out / name)
            flops[f"{name}-tflite-int8"] = start_flops * shallower.metrics["flops_ratio"]
    if distill:
        cfg = config.compress.distill.model_copy(update={
            "enabled": True, "student": "thinner", "thinner": fractions[0]})
        student = distill_model.fn(baseline, cfg, data, out)
        files[f"{student.name}-tflite-int8"] = int8_file(student, config, dataset, out)
        flops[f"{student.name}-tflite-int8"] = float("nan")
        teachers[seed] = {key: value * 100.0 for key, value in student.metrics.items()
                          if key.endswith("test_accuracy")}
        teachers[seed]["teacher"] = baseline.metrics["test_accuracy"] * 100.0
        print(f"seed {seed}: {student.name}: test accuracy (%) {teachers[seed]}", flush=True)
    images, labels = load_split(dataset, "test", scale=config.model.input_scale)
    singles = [image[None] for image in images[:64]]
    float_accuracy = baseline.metrics["test_accuracy"]
    rows = {}
    for name, path in files.items():
        logits = predict_batched(TFLiteRunner(path, threads=2), images)
        accuracy = float(np.mean(np.argmax(logits, 1) == labels))
        rounds = speedup(path, files["baseline-tflite-int8"], singles, config.benchmark.threads)
        rows[name] = {"accuracy_delta_points": (accuracy - float_accuracy) * 100.0,
                      "flops_ratio": flops[name], "speedup": float(np.median(rounds))}
        print(f"seed {seed}: {name:28s} accuracy {accuracy:.4f} "
              f"({rows[name]['accuracy_delta_points']:+.2f} pts vs float {float_accuracy:.4f}) "
              f"FLOPs x{flops[name]:.2f} speed-up {rows[name]['speedup']:.2f}x "
              f"(rounds {min(rounds):.2f}-{max(rounds):.2f})", flush=True)
    return rows


def print_curve(seed: int, name: str, model: ModelArtifact, target: float) -> None:
    """A fine-tuning's held-out curve and the first epoch it reached `target`."""
    curve = model.history.get("val_accuracy") or []
    reached = next((epoch for epoch, value in enumerate(curve, 1) if value >= target), None)
    when = f"first at epoch {reached}" if reached else "not reached"
    print(f"seed {seed}: {name}: held-out {target:.4f} (a point below the baseline's) {when}; "
          f"{len(curve)} epochs: {' '.join(f'{value:.3f}' for value in curve)}", flush=True)


def _spread(values: list[float], fmt: str) -> str:
    return f"{np.mean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/bench.yaml"))
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated training seeds")
    parser.add_argument("--fractions", default="0.5", help="comma-separated shares removed")
    parser.add_argument("--depths", default="",
                        help="comma-separated shares of residual blocks removed (depth pruning)")
    parser.add_argument("--then", default="",
                        help="comma-separated shares of the first fraction's model's remaining "
                             "filters removed (iterative pruning), beside the total at once")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--distill", action="store_true",
                        help="also distill the thinner teacher (compress.distill's budget)")
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config)
    if config.data.source_dir == Path("data/demo"):
        write_demo_images(config.data.source_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="tfopt-channels-"))
    dataset = write_tfrecords.fn(config.data, work)
    fractions = [float(f) for f in args.fractions.split(",")]
    students: dict[int, dict[str, float]] = {}
    depths = tuple(float(share) for share in args.depths.split(",") if share)
    then = tuple(float(share) for share in args.then.split(",") if share)
    per_seed = [measure_seed(config, dataset, int(seed), fractions, work, args.distill, students,
                             depths, then) for seed in args.seeds.split(",")]
    print(f"\n{len(per_seed)} seeds, {args.config}: mean [range]")
    print(f"{'variant':28s} {'accuracy Δ pts':>24s} {'FLOPs ratio':>12s} {'speed-up':>22s}")
    for name in per_seed[0]:
        column = {key: [rows[name][key] for rows in per_seed] for key in per_seed[0][name]}
        print(f"{name:28s} {_spread(column['accuracy_delta_points'], '+.2f'):>24s} "
              f"{np.mean(column['flops_ratio']):11.2f} {_spread(column['speedup'], '.2f'):>22s}")
        if name != "baseline-tflite-int8":
            met = (np.mean(column["speedup"]) >= 1.5
                   and np.mean(column["accuracy_delta_points"]) >= -1.0)
            print(f"goal {name}: >= 1.5x faster than baseline-tflite-int8 within 1 point: "
                  f"{'met' if met else 'missed'}")
    if students:
        print_student_goals(students)
    return 0


def print_student_goals(students: dict[int, dict[str, float]]) -> None:
    """The thinner student against its teacher and its controls, paired by seed (points)."""
    def gaps(key: str) -> list[float]:
        return [accuracy["test_accuracy"] - accuracy[key] for accuracy in students.values()]

    to_teacher, to_scratch = gaps("teacher"), gaps("scratch_test_accuracy")
    print(f"distilled thinner student - teacher: {_spread(to_teacher, '+.2f')} points "
          f"({'met' if np.mean(to_teacher) >= -2 else 'missed'}: within 2 points)")
    print(f"distilled thinner student - scratch control: {_spread(to_scratch, '+.2f')} points "
          f"({'met' if np.mean(to_scratch) >= 0 else 'missed'}: at least as accurate)")
    if all("same_start_test_accuracy" in accuracy for accuracy in students.values()):
        print(f"distilled - same start on labels alone: "
              f"{_spread(gaps('same_start_test_accuracy'), '+.2f')} points")


if __name__ == "__main__":
    sys.exit(main())
