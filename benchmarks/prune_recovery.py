"""Does a pruned model recover faster learning from the model before pruning? Paired over seeds.

Usage: .venv/bin/python benchmarks/prune_recovery.py --config CONFIG [--work DIR]
                                                     [--technique channel_prune|depth_prune]
                                                     [--value 0.5] [--alphas 1.0,0.5]
                                                     [--cool-downs 3] [--seeds 1,2,3]
                                                     [--full-cap]

Trains the config's baseline once (or reuses it: give the ``--work`` folder of a run of the same
config, its checkpoint is taken as it is), then prunes it at ``--value`` and fine-tunes it as a
search trial does (``compress.<technique>``'s epochs as the cap, stopping once back within the
accuracy budget of the baseline's validation accuracy), once per ``teacher_alpha`` (1.0: labels
alone; below it the baseline's outputs teach the rest), ``cool_down_epochs`` (0: it ends after
3 epochs without a gain instead) and seed. The settings share each seed's batches. Prints per
seed and setting whether it recovered, the epochs and seconds it took, its best validation and
its test accuracy; then, per setting, the mean and range over seeds and the paired difference
to the first setting. With ``--full-cap`` every fine-tune runs its whole cap
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
from tfopt.models.baseline import recovery_target, selection_examples


def _spread(values: list[float], fmt: str) -> str:
    return f"{np.mean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def _label(alpha: float, cool: int) -> str:
    return f"teacher_alpha {alpha:g}, cool_down_epochs {cool}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path(".tfopt/prune-recovery"))
    parser.add_argument("--technique", choices=("channel_prune", "depth_prune"),
                        default="channel_prune")
    parser.add_argument("--value", type=float, default=0.5, help="the share pruned")
    parser.add_argument("--alphas", default="1.0,0.5", help="teacher_alpha values, first is "
                        "the reference")
    parser.add_argument("--cool-downs", default="3", help="cool_down_epochs values")
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
    target = recovery_target(baseline, budget, selection_examples(data))
    test_target = baseline.metrics["test_accuracy"] - budget / 100.0
    print(f"baseline: val {baseline.metrics.get('best_val_accuracy'):.4f} test "
          f"{baseline.metrics['test_accuracy']:.4f}; recover to held-out {target:.4f}, the test "
          f"split's budget {test_target:.4f}", flush=True)
    technique = registry()[args.technique]
    section = getattr(config.compress, args.technique).model_copy(update={"enabled": True})
    settings = [(float(alpha), int(cool)) for alpha in args.alphas.split(",")
                for cool in args.cool_downs.split(",")]
    rows: dict[str, list[dict[str, float]]] = {_label(*setting): [] for setting in settings}
    first = _label(*settings[0])
    for seed in (int(seed) for seed in args.seeds.split(",")):
        tuning = data.model_copy(update={"seed": seed,
                                         "recover_to": None if args.full_cap else target})
        for alpha, cool in settings:
            cfg = technique.at(section.model_copy(update={"teacher_alpha": alpha,
                                                          "cool_down_epochs": cool}), args.value)
            started = time.monotonic()
            model = technique.apply.fn(baseline, cfg, tuning,
                                       args.work / f"trial-{seed}-{alpha:g}-{cool}")
            row = {"recovered": float(bool(model.params.get("recovered"))),
                   "epochs": float(model.params["epochs_run"]),
                   "seconds": time.monotonic() - started,
                   "val": max(model.history["val_accuracy"]),
                   "test": model.metrics["test_accuracy"]}
            row["test_within"] = float(row["test"] >= test_target)
            rows[_label(alpha, cool)].append(row)
            print(f"seed {seed} {_label(alpha, cool)}: recovered {bool(row['recovered'])} "
                  f"in {row['epochs']:.0f} epochs, {row['seconds']:.0f} s; val {row['val']:.4f} "
                  f"test {row['test']:.4f} ({'within' if row['test_within'] else 'over'} the "
                  "budget)", flush=True)
    print(f"\n{args.technique} {args.value:g}, {args.config}, {len(rows[first])} seeds: "
          "mean [range]")
    for label, measured in rows.items():
        column = {key: [row[key] for row in measured] for key in measured[0]}
        paired = [row["test"] - reference["test"]
                  for row, reference in zip(measured, rows[first], strict=True)]
        print(f"{label}: recovered {sum(column['recovered']):.0f}, test within "
              f"{sum(column['test_within']):.0f} of {len(column['test'])}; epochs "
              f"{_spread(column['epochs'], '.1f')}, seconds {_spread(column['seconds'], '.0f')}, "
              f"val {_spread(column['val'], '.4f')}, test {_spread(column['test'], '.4f')}, "
              f"test - ({first}) {_spread([p * 100 for p in paired], '+.2f')} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
