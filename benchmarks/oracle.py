"""How good is the schedule? A run's champion beside the exhaustive sweep, timed side by side.

Usage: .venv/bin/python benchmarks/oracle.py --summary SUMMARY.json [--config configs/demo.yaml]
                                             [--set KEY=VALUE ...] [--rounds 12] [--out DIR]

Takes a finished `tfopt run` (its summary JSON and the config and ``--set`` values it ran with)
and, from that run's own baseline (the finished training its checkpoint folder keeps: nothing
is trained again), makes what the schedule could have made with no time limit: the baseline's
forms, and every enabled technique fine-tuned to its epoch cap (no stop once back within the
budget), a searched strength at every point of its grid (a joint one at every combination),
each model built in every form the config asks of a compressed model. A technique continuing
from another starts from the strongest of that one's models within the budget.

Every file is scored on the run's own decoded validation and test splits; those within the
accuracy budget on validation (the champion's rule) and the run's own ``baseline-tflite-int8``
and champion files are then timed in one process, in alternating rounds (the run-off's
`measure_runoff`, pinned as the run's benchmark settings say). TensorFlow's forms (graph,
SavedModel, XLA) are scored but not timed here: XLA's auto-clustering needs a process of its
own, and on the models tried they are the slowest forms (docs/measurements.md).

Prints each file's accuracies and speed-up over ``baseline-tflite-int8``, the sweep's best
within the budget (on validation; and on test), and the run's champion's speed-up as a share of
the best: the schedule's score (the aim: 0.9 or more).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import tfopt  # noqa: F401  (environment before TensorFlow)
from cli.main import parse_overrides
from compress import apply_here
from flows.optimize_model import _checkpoint_dir
from flows.parameters import PipelineConfig, load_pipeline_config
from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from techniques import registry
from tfopt.artifacts import BenchmarkInputs, ModelArtifact, TrainingData, VariantSpec
from tfopt.config import resolve_cpus
from tfopt.measurement.inputs import read_inputs_index
from tfopt.measurement.worker import measure_runoff
from tfopt.models.baseline import recovery_target, selection_examples
from tfopt.models.serving_export import export_serving_savedmodel
from tfopt.runtimes import build_here, load_runner, plan_forms, runtime_of, settings_of
from tfopt.runtimes.base import BuildSources, PlanRequest, predict_batched
from tfopt.search import Joint, Knob

UNTIMED_FORMATS = frozenset({"graph", "savedmodel", "xla"})
"""TensorFlow's forms: scored, not timed side by side (see the module's docstring)."""


def grid(knob: Knob | Joint) -> list[dict[str, float]]:
    """Every point of a searched strength: each value of a knob, each combination of a joint."""
    knobs = knob.knobs if isinstance(knob, Joint) else (knob,)
    return [dict(zip((k.field for k in knobs), values, strict=True))
            for values in itertools.product(*(k.values for k in knobs))]


def build_all(specs: list[VariantSpec], sources: BuildSources,
              config: PipelineConfig) -> list[VariantSpec]:
    """Build planned variants in this process, those converting another variant last."""
    built: dict[str, VariantSpec] = {}
    ordered = sorted(specs, key=lambda s: runtime_of(s.format).builds_from(s) is not None)
    for spec in ordered:
        if spec.status != "ok":
            continue
        here = sources.model_copy(update={"built": {**sources.built, **built}})
        try:
            built[spec.name] = build_here(spec, here, settings_of(runtime_of(spec.format),
                                                                  config))
        except Exception as error:  # one form failing leaves the others
            print(f"  {spec.name}: not built: {type(error).__name__}: {error}"[:300],
                  flush=True)
    return [built[s.name] for s in specs if s.name in built and built[s.name].status == "ok"]


def forms_of(model: ModelArtifact, request: PlanRequest, config: PipelineConfig,
             data: TrainingData, out: Path) -> list[VariantSpec]:
    """A model's planned forms, built."""
    savedmodel = model if model.format == "savedmodel" else export_serving_savedmodel(model, out)
    sources = BuildSources(model=model, savedmodel=savedmodel, dataset=data.dataset,
                           out_dir=out, calibration_examples=config.convert.calibration_examples,
                           accuracy_budget_points=config.benchmark.accuracy_budget_points,
                           threads=config.benchmark.threads)
    return build_all(plan_forms(request, config), sources, config)


def sweep(config: PipelineConfig, baseline: ModelArtifact, data: TrainingData, out: Path,
          ) -> list[VariantSpec]:
    """The baseline's forms and every technique's models at every point, built.

    A technique continuing from another starts from the strongest of that one's models back
    within the budget on the split trainings choose on (`recovery_target`, the run's rule).
    """
    target = recovery_target(baseline, config.benchmark.accuracy_budget_points,
                             selection_examples(data)) or 0.0
    files = forms_of(baseline, PlanRequest(source="baseline", kind="keras"), config, data,
                     out / "baseline")
    made: dict[str, list[ModelArtifact]] = {}
    for name, technique in registry().items():
        cfg = getattr(config.compress, name).fitted_to(baseline)
        if not cfg.enabled:
            continue
        parent = technique.starts_from(cfg) if callable(technique.starts_from) else (
            technique.starts_from)
        start = baseline if parent is None else kept(made.get(parent, []), target)
        if start is None:
            print(f"{name}: not made: {parent} made no model within the budget", flush=True)
            continue
        refused = technique.refusal(start)
        if refused:
            print(f"{name}: not applicable: {refused}", flush=True)
            continue
        points = grid(technique.knob) if technique.searched(cfg) else [None]
        for point in points:
            at = cfg if point is None else technique.at(cfg, point)
            folder = out / name / ("as-set" if point is None else "-".join(
                f"{value:g}" for value in point.values()))
            try:
                model = apply_here(name, start, at, data, folder)
            except Exception as error:  # a point that fails says so; the sweep goes on
                print(f"{name} {point or ''}: failed: {type(error).__name__}: {error}"[:300],
                      flush=True)
                continue
            made.setdefault(name, []).append(model)
            print(f"{model.name}: {model.params.get('epochs_run')} epochs, best held-out "
                  f"accuracy {best_val(model):.4f} (back within the budget at {target:.4f})",
                  flush=True)
            request = technique.request(at, config, "baseline" if start is baseline
                                        else start.name)
            files += forms_of(model, request, config, data, folder)
    return files


def best_val(model: ModelArtifact) -> float:
    """The best held-out accuracy its training read (0 when it has no curve)."""
    return max(model.history.get("val_accuracy") or [0.0])


def kept(models: list[ModelArtifact], target: float) -> ModelArtifact | None:
    """The last (strongest) of a technique's models whose training read `target` or more."""
    within = [model for model in models if best_val(model) >= target]
    return within[-1] if within else None


def scores(spec: VariantSpec, inputs: BenchmarkInputs) -> tuple[float, float]:
    """A file's accuracy on the run's validation and test splits."""
    runner = load_runner(spec, 1)
    assert inputs.images is not None and inputs.selection_images is not None
    result = []
    for images, labels in ((inputs.selection_images, inputs.selection_labels),
                           (inputs.images, inputs.labels)):
        predicted = np.argmax(predict_batched(runner, np.load(images)), axis=1)
        result.append(float(np.mean(predicted == np.load(labels))))
    return result[0], result[1]


def run_file(run_dir: Path, variant: dict[str, Any]) -> VariantSpec:
    """One of the run's own files (named ``auto:<name>`` beside the sweep's)."""
    found = sorted((run_dir / "variants").glob(f"{variant['name']}.*"))
    if not found:
        raise SystemExit(f"{variant['name']}'s file is not in {run_dir / 'variants'}")
    return VariantSpec(name=f"auto:{variant['name']}", source=variant["source"],
                       format=variant["format"], precision=variant["precision"], path=found[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, required=True, help="the run's summary JSON")
    parser.add_argument("--config", type=Path, default=Path("configs/demo.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="the overrides the run had")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    summary = json.loads(args.summary.read_text())
    run_dir = Path(summary["report"]).parent.parent
    config = load_pipeline_config(args.config, parse_overrides(args.set))
    work_dir = config.work_dir.resolve()
    out = args.out or Path(tempfile.mkdtemp(prefix="tfopt-oracle-"))
    dataset = write_tfrecords.fn(config.data, work_dir, config.scale)
    data = TrainingData(dataset=dataset, batch_size=summary["training_batch_size"],
                        seed=config.train.seed, input=config.input,
                        input_scale=config.model.input_scale)
    checkpoints = _checkpoint_dir(config, data, work_dir)
    if not (checkpoints / "trained.keras").exists():
        raise SystemExit(f"the run's baseline is not in {checkpoints}: pass the config and the "
                         "--set values the run had")
    baseline = train_model.fn(data, config.model, config.train, out / "baseline",
                              checkpoint_dir=checkpoints)
    results = {v["name"]: v for v in summary["variants"]}
    reference = next(v for v in summary["variants"]
                     if v["status"] == "ok" and v["source"] == "baseline")
    points = config.benchmark.accuracy_budget_points
    val_target = reference["val_accuracy"] - points / 100.0
    test_target = reference["accuracy"] - points / 100.0
    print(f"baseline ({reference['name']}): validation {reference['val_accuracy']:.4f}, test "
          f"{reference['accuracy']:.4f}; within the budget: validation >= {val_target:.4f}",
          flush=True)
    files = sweep(config, baseline, data, out)
    inputs, _ = read_inputs_index(run_dir / "benchmark-inputs")
    scored = {spec.name: (spec, *scores(spec, inputs)) for spec in files}
    contenders = [run_file(run_dir, results["baseline-tflite-int8"])]
    champion = summary.get("champion")
    if champion and results[champion]["format"] in UNTIMED_FORMATS:
        print(f"the run's champion {champion} is a TensorFlow form: not timed here", flush=True)
    elif champion and champion != "baseline-tflite-int8":
        contenders.append(run_file(run_dir, results[champion]))
    contenders += [spec for spec, val, _ in scored.values()
                   if val >= val_target - 1e-9 and spec.format not in UNTIMED_FORMATS
                   and runtime_of(spec.format).shares_process]
    protocol = config.benchmark.as_protocol()
    cpus = resolve_cpus(protocol.cpus)
    if cpus:
        os.sched_setaffinity(0, cpus)
    print(f"timing {len(contenders)} files side by side, {args.rounds} alternating rounds",
          flush=True)
    runoff = measure_runoff(contenders, inputs, protocol, args.rounds)
    anchor = contenders[0].name
    speedup = {spec.name: runoff.ratio(anchor, spec.name) for spec in contenders}
    print(f"\n{'file':44s} {'val':>7s} {'test':>7s} {'speed-up':>9s}")
    for name, (_spec, val, test) in sorted(scored.items(),
                                           key=lambda kv: -speedup.get(kv[0], 0.0)):
        mark = "" if val >= val_target - 1e-9 else "  (over the budget on validation)"
        shown = f"{speedup[name]:8.2f}x" if name in speedup else f"{'-':>9s}"
        print(f"{name:44s} {val:7.4f} {test:7.4f} {shown}{mark}")
    best = max(((speedup[name], name) for name, (_s, val, _t) in scored.items()
                if name in speedup), default=None)
    best_on_test = max(((speedup[name], name) for name, (_s, _v, test) in scored.items()
                        if name in speedup and test >= test_target - 1e-9), default=None)
    auto = speedup.get(f"auto:{champion}")
    if auto is None:
        print(f"\nthe run's champion {champion} was not timed here: no share")
        return 0
    print(f"\nthe run's champion {champion}: {auto:.2f}x over baseline-tflite-int8 "
          f"(side by side here; the run said "
          f"{(summary.get('champion_speedup_over_int8') or {}).get('ratio')}x)")
    if best:
        print(f"the sweep's best within the budget on validation: {best[1]} {best[0]:.2f}x; "
              f"the champion's share of it: {auto / best[0]:.2f}")
    if best_on_test:
        print(f"the sweep's best within the budget on test too: {best_on_test[1]} "
              f"{best_on_test[0]:.2f}x; the champion's share: {auto / best_on_test[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
