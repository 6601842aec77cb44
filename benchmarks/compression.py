"""Accuracy, zipped size and latency of every compressed variant against fp32 TFLite, over seeds.

Usage: .venv/bin/python benchmarks/compression.py [--config configs/demo.yaml] [--seeds 1,2,3]
                                                   [--work DIR]

Runs tfopt's own steps (as plain functions, no servers) on the demo data for each seed: shard
(once), train the baseline, prune, cluster, sparsity-preserving clustering of the pruned model,
distill (with the scratch control; the config's student, `thinner` on configs/bench.yaml),
channel pruning (when the config enables it), QAT, PQAT, CQAT, PCQAT, TFLite conversions (16x8
and selective int8 included), the ONNX export and ONNX Runtime's static int8; then evaluates every
variant on the same test split and times it with a bare runtime loop in rounds that alternate
with the seed's `baseline-tflite-fp32` (so a drifting machine moves both alike). It prints, per
variant, the accuracy delta against the float baseline (points), the gzip-size ratio and the
batch-1 latency ratio against `baseline-tflite-fp32`, each as the mean over seeds with its
range. Goals: pruned-80 within 1 point of the baseline; pruned-80 + int8 and clustered + int8
each at least 8x smaller zipped than fp32 TFLite; QAT int8 within 1 point; the distilled student
at least as accurate as the student from scratch (mean gain >= 0) and within 2 points of its
teacher; selective int8 within budget whenever full int8 is not; ONNX Runtime static int8 within
1 point; the channel-pruned int8 variant >= 1.5x faster than `baseline-tflite-int8` (paired per
seed) within 1 point of the baseline. benchmarks/channel_pruning.py measures the last two alone,
in a fraction of the time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from harness_overhead import bare_onnx, bare_p50, bare_tflite

import tfopt  # noqa: F401
from flows.parameters import PipelineConfig, load_pipeline_config
from tasks.build_variant import build_variant
from tasks.export_savedmodel import export_savedmodel
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques.channel_prune import channel_prune_model
from techniques.cluster import cluster_model
from techniques.cqat import cluster_preserving_qat
from techniques.distill import distill_model
from techniques.pqat import prune_preserving_qat
from techniques.prune import prune_model
from techniques.qat import quantize_aware_train
from tfopt.artifacts import DatasetArtifact, ModelArtifact, TrainingData, VariantSpec
from tfopt.data.pipeline import load_split
from tfopt.demo_data import write_demo_images
from tfopt.fileio import gzip_size_bytes
from tfopt.runtimes import plan_variant, runtime_of, settings_of
from tfopt.runtimes.base import BuildSources, predict_batched
from tfopt.runtimes.litert import TFLiteRunner, int8_kernel_stats
from tfopt.runtimes.onnxruntime import OnnxRunner

REFERENCE = "baseline-tflite-fp32"
LATENCY_ROUNDS = 5
RUNS_PER_ROUND = 400


def build(spec: VariantSpec, savedmodel: ModelArtifact, config: PipelineConfig,
          dataset: DatasetArtifact, out: Path,
          built: dict[str, VariantSpec] | None = None) -> VariantSpec:
    """A planned variant of `savedmodel` built by its runtime, as the pipeline builds it."""
    sources = BuildSources(model=savedmodel, savedmodel=savedmodel, dataset=dataset,
                           out_dir=out, built=built or {},
                           calibration_examples=config.convert.calibration_examples,
                           accuracy_budget_points=config.benchmark.accuracy_budget_points,
                           threads=config.benchmark.threads)
    return build_variant.fn(spec, sources, settings_of(runtime_of(spec.format), config))


def build_variants(config: PipelineConfig, dataset: DatasetArtifact, seed: int,
                   work: Path) -> tuple[dict[str, Path], dict[str, dict[str, float]]]:
    """One seed's TFLite variants, and each technique's model metrics (accuracy, sparsity ...)."""
    cfg = config.compress
    data = TrainingData(dataset=dataset, batch_size=config.train.batch_size or 64, seed=seed,
                        input=config.input)
    models = work / f"seed-{seed}"
    baseline = train_model.fn(data, config.model, config.train, models)
    pruned = prune_model.fn(baseline, cfg.prune, data, models)
    distilled = distill_model.fn(baseline, cfg.distill, data, models)
    qat = quantize_aware_train.fn(baseline, cfg.qat, data, models)
    cluster_cfg = cfg.cluster.model_copy(update={"enabled": True, "preserve_sparsity": False})
    clustered = cluster_model.fn(baseline, cluster_cfg, data, models)
    pruned_clustered = cluster_model.fn(
        pruned, cluster_cfg.model_copy(update={"preserve_sparsity": True}), data, models)
    pqat = prune_preserving_qat.fn(pruned, cfg.pqat, data, models)
    cqat = cluster_preserving_qat.fn(clustered, cfg.cqat, data, models / "cqat")
    pcqat = cluster_preserving_qat.fn(pruned_clustered, cfg.cqat, data, models / "pcqat")
    thinner = (channel_prune_model.fn(baseline, cfg.channel_prune, data, models)
               if cfg.channel_prune.enabled else None)
    variants, out = {}, models / "v"
    savedmodels = {}
    sources = [(baseline, ("fp32", "dynamic", "float16", "int8", "int16x8")),
               (pruned, ("fp32", "int8")), (clustered, ("fp32", "int8")),
               (pruned_clustered, ("fp32", "int8")), (distilled, ("fp32", "int8"))]
    for source, precisions in sources + ([(thinner, ("fp32", "int8"))] if thinner else []):
        savedmodels[source.name] = export_savedmodel.fn(source, models)
        for precision in precisions:
            planned = plan_variant(source.name, "tflite", precision)
            variants[planned.name] = build(planned, savedmodels[source.name], config,
                                           dataset, out).path
    for model, name in ((qat, "qat"), (pqat, "pqat"), (cqat, "cqat"), (pcqat, "pcqat")):
        planned = plan_variant(name, "tflite", "int8")
        variants[planned.name] = build(planned, model, config, dataset, out).path
    onnx = build(plan_variant("baseline", "onnx"), savedmodels["baseline"], config, dataset, out)
    onnx_int8 = build(plan_variant("baseline", "onnx", "int8", derived_from=onnx.name),
                      savedmodels["baseline"], config, dataset, out, {onnx.name: onnx})
    variants[onnx.name], variants[onnx_int8.name] = onnx.path, onnx_int8.path
    selective = build(plan_variant("baseline", "tflite", "int8", form="tflite-selective"),
                      savedmodels["baseline"], config, dataset, out)
    if selective.status == "ok":
        variants[selective.name] = selective.path
    else:
        print(f"seed {seed}: {selective.name} {selective.status}: {selective.error}")
    techniques = {model.name: dict(model.metrics)
                  for model in (baseline, pruned, clustered, pruned_clustered, distilled, qat,
                                pqat, *([thinner] if thinner else []))}
    techniques["cqat"], techniques["pcqat"] = dict(cqat.metrics), dict(pcqat.metrics)
    for name in ("pqat", "cqat", "pcqat"):  # what the flow reads back from the same files
        techniques[name].update(int8_kernel_stats(variants[f"{name}-tflite-int8"]))
    return variants, techniques


def _bare(path: Path, threads: int) -> Callable[[np.ndarray], object]:
    return (bare_onnx if path.suffix == ".onnx" else bare_tflite)(path, threads)


def latency_ratio(path: Path, reference: Path, images: list[np.ndarray], threads: int) -> float:
    """Median over alternating rounds of (p50 of `path`) / (p50 of `reference`), bare loops."""
    call, reference_call = _bare(path, threads), bare_tflite(reference, threads)
    ratios = []
    for _ in range(LATENCY_ROUNDS):
        ratios.append(bare_p50(call, images, RUNS_PER_ROUND, warmup=50)
                      / bare_p50(reference_call, images, RUNS_PER_ROUND, warmup=50))
    return float(np.median(ratios))


def measure_seed(config: PipelineConfig, dataset: DatasetArtifact, seed: int,
                 work: Path) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per variant: accuracy delta (points), zip ratio and latency ratio against the reference."""
    variants, techniques = build_variants(config, dataset, seed, work)
    images, labels = load_split(dataset, "test", scale=config.model.input_scale)
    singles = [image[None] for image in images[:64]]
    float_accuracy = techniques["baseline"]["test_accuracy"]
    reference_zip = gzip_size_bytes(variants[REFERENCE])
    rows = {}
    for name, path in variants.items():
        runner = (OnnxRunner if path.suffix == ".onnx" else TFLiteRunner)(path, threads=2)
        logits = predict_batched(runner, images)
        accuracy = float(np.mean(np.argmax(logits, 1) == labels))
        rows[name] = {
            "accuracy_delta_points": (accuracy - float_accuracy) * 100.0,
            "zip_ratio": reference_zip / gzip_size_bytes(path),
            "latency_ratio": latency_ratio(path, variants[REFERENCE], singles,
                                           config.benchmark.threads),
        }
        print(f"seed {seed}: {name:30s} accuracy {accuracy:.4f} "
              f"({rows[name]['accuracy_delta_points']:+.2f} pts) "
              f"zip {rows[name]['zip_ratio']:.1f}x latency {rows[name]['latency_ratio']:.2f}x",
              flush=True)
    return rows, techniques


def _spread(values: list[float], fmt: str) -> str:
    return f"{np.mean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def print_table(per_seed: list[dict[str, dict[str, float]]]) -> None:
    """Each variant's mean over seeds and range, one line per variant."""
    print(f"\n{'variant':30s} {'accuracy Δ pts, mean [range]':>30s} {'zip ratio':>10s} "
          f"{'latency ratio, mean [range]':>30s}")
    names = list(dict.fromkeys(name for rows in per_seed for name in rows))
    for name in names:  # a variant only some seeds built (selective int8) over those seeds
        seeds = [rows[name] for rows in per_seed if name in rows]
        column = {key: [row[key] for row in seeds] for key in seeds[0]}
        print(f"{name:30s} {_spread(column['accuracy_delta_points'], '+.2f'):>30s} "
              f"{np.mean(column['zip_ratio']):9.1f}x "
              f"{_spread(column['latency_ratio'], '.2f'):>30s}")


def print_goals(per_seed: list[dict[str, dict[str, float]]],
                techniques: list[dict[str, dict[str, float]]], pruned: str,
                clustered: str) -> None:
    """The issue's goals, each judged on the mean over seeds, with the range beside it."""
    def column(name: str, key: str) -> list[float]:
        return [rows[name][key] for rows in per_seed]

    pruned_drop = [t[pruned]["test_accuracy"] * 100 - t["baseline"]["test_accuracy"] * 100
                   for t in techniques]
    distilled = next(name for name in techniques[0] if name.startswith("distilled-"))
    gains = [t[distilled]["distillation_gain_points"] for t in techniques]
    to_teacher = [(t[distilled]["test_accuracy"] - t["baseline"]["test_accuracy"]) * 100
                  for t in techniques]
    zip_gain = column(f"{pruned}-tflite-int8", "zip_ratio")
    cluster_zip = column(f"{clustered}-tflite-int8", "zip_ratio")
    qat = column("qat-tflite-int8", "accuracy_delta_points")
    onnx_int8 = column("baseline-onnx-int8", "accuracy_delta_points")
    full_int8 = column("baseline-tflite-int8", "accuracy_delta_points")
    goals = [
        (f"{pruned} within 1 point of the baseline", pruned_drop, np.mean(pruned_drop) >= -1),
        (f"{pruned}-tflite-int8 >= 8x smaller zipped", zip_gain, np.mean(zip_gain) >= 8),
        (f"{clustered}-tflite-int8 >= 8x smaller zipped", cluster_zip,
         np.mean(cluster_zip) >= 8),
        (f"pruned-{clustered}-tflite-int8 (sparsity-preserving) >= 8x smaller zipped",
         column(f"pruned-{clustered}-tflite-int8", "zip_ratio"),
         np.mean(column(f"pruned-{clustered}-tflite-int8", "zip_ratio")) >= 8),
        ("QAT int8 within 1 point of float", qat, np.mean(qat) >= -1),
        (f"{distilled} >= scratch student (gain, points)", gains, np.mean(gains) >= 0),
        (f"{distilled} within 2 points of its teacher", to_teacher, np.mean(to_teacher) >= -2),
        ("ONNX Runtime static int8 within 1 point of float", onnx_int8, np.mean(onnx_int8) >= -1),
        ("full int8 within budget (else selective int8 is built and judged)", full_int8,
         np.mean(full_int8) >= -1),
    ]
    selective = [rows["baseline-tflite-selective-int8"]["accuracy_delta_points"]
                 for rows in per_seed if "baseline-tflite-selective-int8" in rows]
    if selective:
        goals.append((f"selective int8 within 1 point ({len(selective)} seeds needed it)",
                      selective, np.mean(selective) >= -1))
    goals += channel_pruning_goals(per_seed)
    print()
    for label, values, met in goals:
        print(f"goal {label}: {_spread(values, '+.2f')} ({'met' if met else 'missed'})")


def channel_pruning_goals(per_seed: list[dict[str, dict[str, float]]],
                          ) -> list[tuple[str, list[float], bool]]:
    """The channel-pruned int8 variant's speed-up over baseline int8 (paired) and accuracy."""
    names = [name for name in per_seed[0]
             if name.startswith("channels-") and name.endswith("-tflite-int8")]
    goals = []
    for name in names:
        speedups = [rows["baseline-tflite-int8"]["latency_ratio"] / rows[name]["latency_ratio"]
                    for rows in per_seed]
        accuracy = [rows[name]["accuracy_delta_points"] for rows in per_seed]
        goals.append((f"{name} >= 1.5x faster than baseline-tflite-int8 (x)", speedups,
                      np.mean(speedups) >= 1.5))
        goals.append((f"{name} within 1 point of the baseline", accuracy,
                      np.mean(accuracy) >= -1))
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated training seeds")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config)
    if config.data.source_dir == Path("data/demo"):
        write_demo_images(config.data.source_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="tfopt-compression-"))
    dataset = write_tfrecords.fn(config.data, work)
    per_seed, techniques = [], []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows, models = measure_seed(config, dataset, seed, work)
        per_seed.append(rows)
        techniques.append(models)
    pruned = next(name for name in techniques[0] if name.startswith("pruned-"))
    clustered = next(name for name in techniques[0] if name.startswith("clustered-"))
    for name in ("pqat", "cqat", "pcqat"):
        kept = {k: _spread([t[name][k] for t in techniques], ".2f")
                for k in techniques[0][name] if k.startswith("int8_")}
        print(f"{name}: read back from its int8 file: {kept}")
    sparsity = [models[pruned]["sparsity"] for models in techniques]
    print(f"\n{len(per_seed)} seeds; {pruned} sparsity reached {_spread(sparsity, '.3f')}")
    print_table(per_seed)
    print_goals(per_seed, techniques, pruned, clustered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
