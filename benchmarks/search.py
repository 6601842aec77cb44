"""The searched channel-pruning strength against the hand-set one, and the search's wall time.

Usage: .venv/bin/python benchmarks/search.py [--config configs/demo.yaml] [--hand 0.5]
                                             [--seeds 1] [--workers 1,2] [--work DIR]

Per seed, with tfopt's own steps (plain functions, no servers): train the baseline (until its
plateau), channel-prune it at the hand-set share (``--hand``, what the config used before
``fraction: auto``) and fine-tune it until back within the accuracy budget, then run the search
(`tfopt.search`: Optuna study, bisection, pruned hopeless trials) with its trials on a Dask cluster
of 1, then 2 worker processes, timing each trial's int8 and fp32 files in this process one at a
time (as the pipeline holds the benchmark slot) and judging them on the validation split as the
pipeline does (the test split is only read for the figures printed). The baseline's and the
hand-set int8 files and each search's chosen file are then evaluated on the test split and timed
with a bare LiteRT loop in alternating rounds, so the speed-ups are measured side by side in one
run. Prints per seed:
each choice's share, accuracy against the float baseline (points) and speed-up over ``baseline-
tflite-int8``; the search's trials, and its wall time per worker count.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from channel_pruning import int8_file, speedup
from harness_overhead import bare_p50, bare_tflite

import tfopt  # noqa: F401
from compress import make_trial
from flows.parameters import PipelineConfig, load_pipeline_config
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques.channel_prune import KNOB, channel_prune_model
from tfopt.artifacts import DatasetArtifact, ModelArtifact, TrainingData, VariantSpec
from tfopt.data.pipeline import load_split
from tfopt.demo_data import write_demo_images
from tfopt.models.baseline import kept_val_accuracy, recovery_target, selection_examples
from tfopt.runtimes.base import predict_batched
from tfopt.runtimes.litert import TFLiteRunner
from tfopt.search import Search, TimedFile, Trial, choose, search_line, with_timed_files

RUNS = 200


Split = tuple[np.ndarray, np.ndarray]


def run_search(config: PipelineConfig, baseline: ModelArtifact, data: TrainingData,
               workers: int, folder: Path, splits: dict[str, Split]) -> tuple[Search, float]:
    """The search on a Dask cluster of `workers` processes; its wall time in seconds.

    Each trial's files (int8 and fp32) are timed with the bare loop and judged on the
    validation split as the pipeline judges them (`with_timed_files`); their test accuracy is
    only reported.
    """
    from distributed import Client

    from tfopt.scaling import local_cluster

    cfg = config.compress.channel_prune.model_copy(update={"enabled": True, "fraction": "auto"})
    search = Search(KNOB, folder, f"search-{workers}", data.recover_to, data.file_target,
                    seed=data.seed)
    singles = [image[None] for image in splits["test"][0][:64]]
    started = time.perf_counter()
    with local_cluster(workers) as cluster, Client(cluster) as client:
        while opened := search.next_trials(workers):
            futures = [client.submit(
                make_trial, "channel_prune", point, baseline, cfg,
                data.model_copy(update={"trial": ref}), search.trial_folder(point),
                config.convert, data.recover_to, pure=False) for point, ref in opened]
            for future in futures:
                trial = future.result()
                timed = [TimedFile(name=spec.name, p50_ms=bare_p50(
                    bare_tflite(Path(spec.path), config.benchmark.threads), singles, RUNS,
                    warmup=30), val_accuracy=accuracy_of(Path(spec.path), *splits["val"]),
                    test_accuracy=accuracy_of(Path(spec.path), *splits["test"]))
                    for spec in trial.files if spec.status == "ok" and spec.path is not None]
                if timed and trial.status != "pruned":
                    trial = with_timed_files(trial, timed, data.file_target)
                search.finish(trial)
    return search, time.perf_counter() - started


def chosen_file_of(chosen: Trial | None) -> VariantSpec | None:
    """The file whose figures a chosen trial reports (its fastest within the budget)."""
    if chosen is None:
        return None
    return next((spec for spec in chosen.files if spec.name == chosen.file), None)


def accuracy_of(path: Path, images: np.ndarray, labels: np.ndarray) -> float:
    """A TFLite file's top-1 accuracy on `images`."""
    logits = predict_batched(TFLiteRunner(path, threads=2), images)
    return float(np.mean(np.argmax(logits, 1) == labels))


def measure_seed(config: PipelineConfig, dataset: DatasetArtifact, seed: int, hand: float,
                 workers: list[int], work: Path) -> None:
    out = work / f"seed-{seed}"
    data = TrainingData(dataset=dataset, batch_size=config.train.batch_size or 64, seed=seed,
                        input=config.input, input_scale=config.model.input_scale)
    baseline = train_model.fn(data, config.model, config.train, out)
    print(f"seed {seed}: baseline {baseline.params['stop_reason']}, test accuracy "
          f"{baseline.metrics['test_accuracy']:.4f}", flush=True)
    budget = config.benchmark.accuracy_budget_points
    data = data.model_copy(update={
        "recover_to": recovery_target(baseline, budget, selection_examples(data)),
        "file_target": kept_val_accuracy(baseline, budget)})
    splits = {split: load_split(dataset, split, scale=config.model.input_scale)
              for split in ("val", "test")}
    images, labels = splits["test"]
    singles = [image[None] for image in images[:64]]
    files = {"baseline": int8_file(baseline, config, dataset, out)}
    hand_cfg = config.compress.channel_prune.model_copy(update={"enabled": True,
                                                                "fraction": hand})
    hand_model = channel_prune_model.fn(baseline, hand_cfg, data, out / "hand")
    files[f"hand-set {hand:g}"] = int8_file(hand_model, config, dataset, out / "hand")
    walls = {}
    for count in workers:
        search, walls[count] = run_search(config, baseline, data, count,
                                          out / f"search-{count}-workers", splits)
        print(f"seed {seed}, {count} Dask worker(s): {search_line(search)}; wall "
              f"{walls[count]:.0f} s, {len(search.trials())} trials", flush=True)
        chosen = choose(search.trials(), KNOB)
        chosen_file = chosen_file_of(chosen)
        if chosen_file is not None:
            files[f"searched {chosen.params[KNOB.field]:g} {chosen_file.precision} "
                  f"({count}w)"] = Path(
                chosen_file.path)
    float_accuracy = baseline.metrics["test_accuracy"]
    for name, path in files.items():
        accuracy = accuracy_of(path, images, labels)
        rounds = speedup(path, files["baseline"], singles, config.benchmark.threads)
        print(f"seed {seed}: {name:22s} accuracy {accuracy:.4f} "
              f"({(accuracy - float_accuracy) * 100:+.2f} pts vs float {float_accuracy:.4f}) "
              f"speed-up over baseline-tflite-int8 {np.median(rounds):.2f}x "
              f"(rounds {min(rounds):.2f}-{max(rounds):.2f})", flush=True)
    if len(walls) > 1:
        print(f"seed {seed}: search wall time " + ", ".join(
            f"{count} worker(s) {wall:.0f} s" for count, wall in walls.items())
              + f" ({walls[workers[0]] / walls[workers[-1]]:.2f}x)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--hand", type=float, default=0.5)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config)
    if not config.data.source_dir.is_dir():
        write_demo_images(config.data.source_dir)
    work = args.work or Path(tempfile.mkdtemp(prefix="tfopt-search-bench-"))
    dataset = write_tfrecords.fn(config.data, work)
    for seed in (int(s) for s in args.seeds.split(",")):
        measure_seed(config, dataset, seed, args.hand,
                     [int(w) for w in args.workers.split(",")], work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
