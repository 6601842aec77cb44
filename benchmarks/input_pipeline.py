"""Naive vs tuned vs cached tf.data readers on >= 20,000 generated JPEGs in several shards.

Usage: .venv/bin/python benchmarks/input_pipeline.py [--images 20000] [--size 64]
       [--json PATH] [--work DIR]

The images are scikit-learn's digits, upscaled, each with its own random shift, contrast and
noise (so no two files are equal), written as RGB JPEGs in a class-per-folder tree and sharded
by tfopt's own writer. The readers run side by side on the same shards, in one process, in
alternating rounds; the ratios are what matter (absolute rates move with the machine's load).

- naive: sequential, per-example parsing, no parallelism, no prefetch, no cache;
- tuned, no cache: parallel shard readers, batch parsing and decoding, prefetch;
- tuned (cache rule): the same with the cache the rule allows, over all passes including the
  one that fills the cache (what training's epochs see);
- cached ceiling: decoded images served from a filled cache;
- decode ceiling: the JPEG bytes already in memory, decoded in parallel batches on all cores (no
  file reads, no parsing): the limit of any reader that decodes every pass.

Goals on 2 cores: tuned (cache rule) >= 3x naive; tuned without cache >= 0.8x the decode ceiling.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import tensorflow as tf

import tfopt  # noqa: F401
from tasks.write_tfrecords import write_tfrecords
from tfopt.config import DataConfig
from tfopt.data.pipeline import (
    ReaderOptions,
    decode_ceiling_dataset,
    naive_dataset,
    plan_cache,
    tuned_dataset,
)
from tfopt.data.throughput import examples_per_second
from tfopt.demo_data import write_varied_digit_jpegs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=64, help="side of the generated JPEGs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3,
                        help="passes (epochs) per reader and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, readers alternating; the median round is reported")
    parser.add_argument("--shard-mb", type=float, default=4.0)
    parser.add_argument("--cache-budget-mb", type=float, default=1024.0)
    parser.add_argument("--work", type=Path, default=None, help="reuse this folder's data")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="tfopt-input-bench-"))
    source = work / f"jpegs-{args.images}-{args.size}"
    if not (source / ".complete").exists():
        started = time.perf_counter()
        write_varied_digit_jpegs(source, args.images, args.size)
        (source / ".complete").write_text("ok\n")
        print(f"wrote {args.images} JPEGs in {time.perf_counter() - started:.1f} s")
    cfg = DataConfig(source_dir=source, image_size=args.size, shard_size_mb=args.shard_mb,
                     val_fraction=0.0, test_fraction=0.01)
    dataset = write_tfrecords.fn(cfg, work / "work")
    files = [f for info in dataset.splits.values() for f in info.files]
    examples = sum(info.examples for info in dataset.splits.values())
    print(f"{examples} examples in {len(files)} shards; batch {args.batch_size}, "
          f"{args.passes} pass(es) per reader and round")

    size, batch = args.size, args.batch_size
    decision = plan_cache(examples, size, sum(f.stat().st_size for f in files),
                          args.cache_budget_mb, random_crops=False)
    base = ReaderOptions()
    print(f"cache rule: {decision.mode} ({decision.reason})")

    def readers() -> dict[str, tf.data.Dataset]:
        return {
            "naive": naive_dataset(files, size, batch),
            "uncached": tuned_dataset(files, size, batch, options=base),
            # Built anew each round: its first pass fills the cache, as training's first epoch.
            "tuned": tuned_dataset(files, size, batch, options=replace(base, cache=decision.mode),
                                   examples_hint=examples),
        }

    ceiling = tuned_dataset(files, size, batch, options=replace(base, cache="decoded"),
                            examples_hint=examples)
    examples_per_second(ceiling)  # fills the cache: the ceiling is read from memory
    decoding = decode_ceiling_dataset(files, size, batch)
    samples: dict[str, list[float]] = {name: [] for name in ("naive", "uncached", "tuned",
                                                              "cached", "decode")}
    for _ in range(args.rounds):
        for name, reader in readers().items():
            samples[name].append(examples_per_second(reader, args.passes)[0])
        samples["cached"].append(examples_per_second(ceiling, args.passes)[0])
        samples["decode"].append(examples_per_second(decoding, args.passes)[0])
    rates = {name: float(np.median(values)) for name, values in samples.items()}
    spread = {name: f"{min(v):,.0f}-{max(v):,.0f}" for name, v in samples.items()}
    print(f"median of {args.rounds} rounds of {args.passes} passes (range in brackets)")
    naive = rates["naive"]
    for name, label in (("naive", "naive"), ("uncached", "tuned, no cache"),
                        ("tuned", "tuned (cache rule)"), ("cached", "cached ceiling"),
                        ("decode", "decode ceiling")):
        print(f"{label:19s} {rates[name]:10,.0f} examples/s   [{spread[name]}]   "
              f"{rates[name] / naive:5.2f}x naive   {rates[name] / rates['cached']:.2f}x cached"
              f"   {rates[name] / rates['decode']:.2f}x decode ceiling")
    over_naive, over_decode = rates["tuned"] / naive, rates["uncached"] / rates["decode"]
    print(f"goals: tuned / naive {over_naive:.2f} (>= 3: {'met' if over_naive >= 3 else 'missed'});"
          f" tuned without cache / decode ceiling {over_decode:.2f} "
          f"(>= 0.8: {'met' if over_decode >= 0.8 else 'missed'})")
    if args.json:
        args.json.write_text(json.dumps({
            "naive_examples_per_s": rates["naive"],
            "tuned_examples_per_s": rates["tuned"],
            "cached_examples_per_s": rates["cached"],
            "tuned_uncached_examples_per_s": rates["uncached"],
            "decode_ceiling_examples_per_s": rates["decode"],
            "tuned_uncached_over_decode_ceiling": over_decode,
            "tuned_over_naive": rates["tuned"] / rates["naive"],
            "tuned_over_cached": rates["tuned"] / rates["cached"],
            "images": examples, "shards": len(files), "image_size": size, "batch_size": batch,
            "passes": args.passes, "cache": decision.mode,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
