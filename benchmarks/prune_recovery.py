"""Does a pruned model recover faster learning from the model before pruning? Paired over seeds.

Usage: .venv/bin/python benchmarks/prune_recovery.py --config CONFIG [--work DIR]
                                                     [--technique channel_prune|depth_prune]
                                                     [--value 0.5] [--alphas 1.0,0.5]
                                                     [--seeds 1,2,3] [--full-cap]

Trains the config's baseline once (or reuses it: give the ``--work`` folder of a run of the same
config, its checkpoint is taken as it is), then prunes it at ``--value`` and fine-tunes it as a
search trial does (``compress.<technique>``'s epochs as the cap, stopping once back within the
accuracy budget of the baseline's validation accuracy), once per ``teacher_alpha`` (1.0: labels
alone; below it the baseline's outputs teach the rest) and seed. The alphas share each seed's
batches. Prints per seed and alpha whether it recovered, the epochs and seconds it took, its
best validation and its test accuracy; then, per alpha, the mean and range over seeds and the
paired difference to the first alpha. With ``--full-cap`` every fine-tune runs its whole cap
(best validation epoch kept), to see what stopping once back within the budget costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import tfopt  # noqa: F401
from flows.parameters import load_pipeline_config
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques import registry
from tfopt.artifacts import TrainingData
from tfopt.models.baseline import kept_test_accuracy, recovery_target


def _spread(values: list[float], fmt: str) -> str:
    return f"{np.mean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path(".tfopt/prune-recovery"))
    parser.add_argument("--technique", choices=("channel_prune", "depth_prune"),
                        default="channel_prune")
    parser.add_argument("--value", type=float, default=0.5, help="the share pruned")
    parser.add_argument("--alphas", default="1.0,0.5", help="teacher_alpha values, first is "
                        "the reference")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--full-cap", action="store_true",
                        help="no stop once back within the budget: the whole cap")
    args = parser.parse_args(argv)
    config = load_pipeline_config(args.config)
    dataset = write_tfrecords.fn(config.data, args.work)
    data = TrainingData(dataset=dataset, batch_size=args.batch_size, seed=config.train.seed,
                        input=config.input)
    checkpoints = sorted((args.work / "checkpoints").glob("baseline-*"))
    baseline = train_model.fn(data, config.model, config.train, args.work / "baseline",
                              checkpoints[0] if checkpoints else args.work / "checkpoints"
                              / "baseline-benchmark")
    budget = config.benchmark.accuracy_budget_points
    target = recovery_target(baseline, budget, dataset.splits["val"].examples)
    test_target = kept_test_accuracy(baseline, budget)
    print(f"baseline: val {baseline.metrics.get('best_val_accuracy'):.4f} test "
          f"{baseline.metrics['test_accuracy']:.4f}; recover to val {target:.4f}, the test "
          f"split's budget {test_target:.4f}", flush=True)
    technique = registry()[args.technique]
    section = getattr(config.compress, args.technique).model_copy(update={"enabled": True})
    alphas = [float(alpha) for alpha in args.alphas.split(",")]
    rows: dict[float, list[dict[str, float]]] = {alpha: [] for alpha in alphas}
    for seed in (int(seed) for seed in args.seeds.split(",")):
        tuning = data.model_copy(update={"seed": seed,
                                         "recover_to": None if args.full_cap else target})
        for alpha in alphas:
            cfg = technique.at(section.model_copy(update={"teacher_alpha": alpha}), args.value)
            started = time.monotonic()
            model = technique.apply.fn(baseline, cfg, tuning,
                                       args.work / f"trial-{seed}-{alpha:g}")
            row = {"recovered": float(bool(model.params.get("recovered"))),
                   "epochs": float(model.params["epochs_run"]),
                   "seconds": time.monotonic() - started,
                   "val": max(model.history["val_accuracy"]),
                   "test": model.metrics["test_accuracy"]}
            row["test_within"] = float(row["test"] >= test_target)
            rows[alpha].append(row)
            print(f"seed {seed} teacher_alpha {alpha:g}: recovered {bool(row['recovered'])} "
                  f"in {row['epochs']:.0f} epochs, {row['seconds']:.0f} s; val {row['val']:.4f} "
                  f"test {row['test']:.4f} ({'within' if row['test_within'] else 'over'} the "
                  "budget)", flush=True)
    print(f"\n{args.technique} {args.value:g}, {args.config}, {len(rows[alphas[0]])} seeds: "
          "mean [range]")
    for alpha in alphas:
        column = {key: [row[key] for row in rows[alpha]] for key in rows[alpha][0]}
        paired = [row["test"] - first["test"] for row, first in zip(rows[alpha], rows[alphas[0]],
                                                                     strict=True)]
        print(f"teacher_alpha {alpha:g}: recovered {sum(column['recovered']):.0f}, test within "
              f"{sum(column['test_within']):.0f} of {len(column['test'])}; epochs "
              f"{_spread(column['epochs'], '.1f')}, seconds {_spread(column['seconds'], '.0f')}, "
              f"val {_spread(column['val'], '.4f')}, test {_spread(column['test'], '.4f')}, "
              f"test - alpha {alphas[0]:g} {_spread([p * 100 for p in paired], '+.2f')} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
