"""Wall time of the compression subflow on the sequential task runner vs a local Dask cluster.

Usage: .venv/bin/python benchmarks/task_runners.py [--config configs/smoke.yaml] [--rounds 2]

Shards the config's data and trains its baseline once (plain functions), then runs the
`compress_model` subflow (pruning, distillation, QAT and their TFLite conversions) under a
temporary Prefect server, alternating the two task runners for `--rounds` rounds, and prints
each wall time and the median ratio sequential / Dask (above 1: Dask is faster). The Dask
cluster's start-up is inside its timing, as it is in a pipeline run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tfopt  # noqa: F401
from flows.compress_model import compress_model
from flows.parameters import PipelineConfig, load_pipeline_config
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from tfopt.artifacts import TrainingData
from tfopt.config import ScaleConfig
from tfopt.demo_data import write_demo_images
from tfopt.scaling import task_runner


def timed_subflow(config: PipelineConfig, scale: ScaleConfig, data: TrainingData, baseline,
                  run_dir: Path) -> float:
    """Seconds one `compress_model` run takes on the runner `scale` names; fails on any variant."""
    started = time.perf_counter()
    variants, _ = compress_model.with_options(task_runner=task_runner(scale))(
        config, baseline, data, run_dir)
    elapsed = time.perf_counter() - started
    failed = [v.name for v in variants if v.status != "ok"]
    if failed:
        raise RuntimeError(f"variants failed on {scale.task_runner}: {failed}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/smoke.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dask-workers", type=int, default=2)
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config)
    if config.data.source_dir == Path("data/demo"):
        write_demo_images(config.data.source_dir)
    work = Path(tempfile.mkdtemp(prefix="tfopt-runners-"))
    data = TrainingData(dataset=write_tfrecords.fn(config.data, work),
                        batch_size=config.train.batch_size or 64, seed=config.train.seed,
                        input=config.input, input_scale=config.model.input_scale)
    baseline = train_model.fn(data, config.model, config.train, work / "models")
    runners = {"sequential": ScaleConfig(),
               "dask": ScaleConfig(task_runner="dask", dask_workers=args.dask_workers)}

    from prefect.testing.utilities import prefect_test_harness

    seconds: dict[str, list[float]] = {name: [] for name in runners}
    with prefect_test_harness():
        for round_index in range(args.rounds):
            for name, scale in runners.items():
                run_dir = work / f"{name}-{round_index}"
                seconds[name].append(timed_subflow(config, scale, data, baseline, run_dir))
                print(f"round {round_index + 1}: {name:<10} {seconds[name][-1]:6.1f} s",
                      flush=True)
    sequential, dask = (statistics.median(seconds[name]) for name in ("sequential", "dask"))
    print(f"\ncores: {os.cpu_count()}, Dask workers: {args.dask_workers}, rounds: {args.rounds}")
    print(f"compress_model median: sequential {sequential:.1f} s, dask {dask:.1f} s")
    print(f"ratio sequential / dask: {sequential / dask:.2f} (above 1: Dask is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
