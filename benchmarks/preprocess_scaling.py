"""TFRecord preprocessing on Dask: 1 worker vs 2 workers, side by side, on 20,000 JPEGs.

Usage: .venv/bin/python benchmarks/preprocess_scaling.py [--images 20000] [--size 64]
       [--rounds 3] [--shard-mb 1] [--work DIR]

Writes the images once (scikit-learn's digits, upscaled, each varied), then shards them with
tfopt's own writer (`write_tfrecords` with `scale.task_runner: dask`) on two running local Dask
clusters, one of 1 worker and one of 2 (processes, one thread each), and in this process alone
(`sequential`, the reference). Each round runs the three in rotating order, each into a fresh
folder (nothing resumed). The clusters start, and their workers import TensorFlow, before any
timing: a pipeline pays that once per run, here it would only blur the ratio. Every manifest must
equal the sequential writer's (same shards, same checksums).

Prints images/s per round and the median ratio 2 workers / 1 worker with its range.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import tfopt  # noqa: F401
from tasks.write_tfrecords import write_tfrecords
from tfopt.config import DataConfig, ScaleConfig
from tfopt.demo_data import write_varied_digit_jpegs
from tfopt.scaling import local_cluster


def timed_write(cfg: DataConfig, work: Path, scale: ScaleConfig | None) -> tuple[float, str]:
    """Seconds to shard `cfg`'s folder into the fresh folder `work`, and the manifest."""
    started = time.perf_counter()
    dataset = write_tfrecords.fn(cfg, work, scale)
    return time.perf_counter() - started, dataset.manifest_path.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard-mb", type=float, default=1.0,
                        help="shard size: small enough that every worker gets shards")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    from distributed import Client

    logging.getLogger("distributed").setLevel(logging.WARNING)
    with ExitStack() as stack:
        root = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        source = root / "jpegs"
        if not source.exists():
            write_varied_digit_jpegs(source, args.images, args.size)
        cfg = DataConfig(source_dir=source, image_size=args.size, shard_size_mb=args.shard_mb)
        modes: dict[str, ScaleConfig | None] = {"sequential": None}
        for workers in (1, 2):
            cluster = stack.enter_context(local_cluster(workers))
            client = stack.enter_context(Client(cluster))
            client.run(importlib.import_module, "tasks.write_tfrecords")
            client.run(importlib.import_module, "tensorflow")
            modes[f"dask-{workers}"] = ScaleConfig(task_runner="dask",
                                                   dask_address=cluster.scheduler_address)
        seconds: dict[str, list[float]] = {name: [] for name in modes}
        manifests = set()
        names = list(modes)
        for round_index in range(args.rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for name in order:
                elapsed, manifest = timed_write(cfg, root / f"out-{round_index}-{name}",
                                                modes[name])
                seconds[name].append(elapsed)
                manifests.add(manifest)
            print(f"round {round_index + 1}: " + ", ".join(
                f"{name} {args.images / seconds[name][-1]:,.0f} images/s" for name in names))
    if len(manifests) != 1:
        print("FAIL: the manifests differ between writers")
        return 1
    ratios = [one / two for one, two in zip(seconds["dask-1"], seconds["dask-2"], strict=True)]
    versus = [seq / two for seq, two in zip(seconds["sequential"], seconds["dask-2"], strict=True)]
    print(f"\n{args.images} JPEGs of {args.size}x{args.size} px, shards of {args.shard_mb} MB, "
          f"{args.rounds} rounds; every manifest identical")
    for name in names:
        rate = args.images / statistics.median(seconds[name])
        print(f"  {name:<11} median {rate:>8,.0f} images/s")
    print(f"2 Dask workers / 1 Dask worker: median {statistics.median(ratios):.2f}x "
          f"[{min(ratios):.2f}, {max(ratios):.2f}]")
    print(f"2 Dask workers / sequential:     median {statistics.median(versus):.2f}x "
          f"[{min(versus):.2f}, {max(versus):.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
