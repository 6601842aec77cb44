"""The main pipeline: image folder -> TFRecords -> training -> variants -> benchmarks -> summary.

`optimize_model` reads like docs/pipeline.md's diagram: prepare the data, train the baseline, build
its variants and the compressed ones, benchmark them all, pick a champion, report. Each step
logs its result to MLflow through `tfopt.tracking`'s typed functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from compress import all_failed, plan, planned_counts
from flows.common import (
    build_forms,
    build_sources,
    error_of,
    sharded_data,
)
from flows.compress_model import compress_model
from flows.measurements import Measurements, in_plan_order
from flows.parameters import PipelineConfig
from tasks.confirm_slowdowns import confirm_slowdowns
from tasks.continue_training import continue_training
from tasks.decide_amx import decide_amx_setting
from tasks.export_bundle import export_bundle
from tasks.export_savedmodel import export_savedmodel
from tasks.import_model import import_model
from tasks.inspect_model import inspect_model
from tasks.measure_data_layout import measure_data_layout
from tasks.measure_input_pipeline import measure_input_pipeline
from tasks.package_models import package_models
from tasks.pick_champion import pick_champion
from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
from tasks.runoff import run_off
from tasks.sweep_batch_size import sweep_batch_size
from tasks.train_model import train_model
from tasks.write_report import write_report
from tfopt import tracking
from tfopt.artifacts import (
    BatchSweepResult,
    BenchmarkInputs,
    Compressed,
    Cut,
    DatasetArtifact,
    InputPipelineResult,
    LayoutResult,
    ModelArtifact,
    ModelFacts,
    Runoff,
    TrainingData,
    VariantResult,
    VariantSpec,
)
from tfopt.config import resolve_cpus
from tfopt.fileio import atomic_write_json, path_size_bytes
from tfopt.measurement.amx import AmxDecision, with_decided_amx
from tfopt.measurement.champion import (
    ChampionChoice,
    accuracy_verdict,
    baseline_accuracy,
    champion_speedup,
    over_one_call_forms,
)
from tfopt.measurement.inputs import INPUTS_ARTIFACT, write_inputs_index
from tfopt.models.baseline import (
    array_targets,
    children_beating,
    epoch_seconds,
    kept_val_accuracy,
    recovery_target,
    selection_examples,
)
from tfopt.models.health import verdicts_note
from tfopt.models.importing import fine_tuning_loss
from tfopt.models.sources import source_stamp
from tfopt.models.step_timing import DEFAULT_BATCH_SIZE, unswept
from tfopt.native import contain_native_steps, read_record
from tfopt.orchestration import LateSteps, claim_flow_run
from tfopt.prefect_artifacts import (
    emit_regression_event,
    publish_comparison,
    publish_prefect_artifacts,
)
from tfopt.preflight import check_paths
from tfopt.provenance import environment, mlflow_tracking_uri
from tfopt.report.compare import compare, settle, to_confirm
from tfopt.report.markdown import run_description
from tfopt.report.summary import baseline_training, build_summary, champion_card
from tfopt.runtimes import (
    int8_only,
    plan_forms,
    plan_variant,
    registry,
    runtime_of,
    settings_of,
)
from tfopt.runtimes.base import BuildSources, PlanRequest
from tfopt.scaling import task_runner
from tfopt.schedule.budget import (
    Budget,
    Cuts,
    FinishWatch,
    ModelSizes,
    budget_cuts,
    confirmation_cuts,
)
from tfopt.schedule.learned_costs import costs_key, load_costs, record_finish
from tfopt.search import baseline_int8


@dataclass(frozen=True)
class _Measured:
    """The data and what was measured about it before training."""

    data: TrainingData
    sweep: BatchSweepResult
    pipeline: InputPipelineResult | None
    """None for array data: nothing is decoded (`tfopt.data.arrays`)."""
    layout: LayoutResult | None
    facts: ModelFacts


@flow(
    name="optimize_model",
    flow_run_name="{config.name}-{config.model.label}",
    log_prints=True,
)
def optimize_model(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008
    """Turn a folder of labelled images into a trained model and benchmarked, optimized variants.

    Every step is a Prefect task; every result is logged to MLflow under one parent run with a
    child run per variant. A variant that fails to build or to benchmark is recorded as failed
    and the others go on.

    Args:
        config: All parameters of the run (data, model, training, conversions, benchmark).

    Returns:
        The run summary (the JSON contract in DESIGN.md).
    """
    claim_flow_run()
    tracking.use_retry_seconds(config.services.retry_seconds)
    check_paths(config)
    resolve_cpus(config.benchmark.cpus)
    work_dir = config.work_dir.resolve()
    tags = {"prefect.flow_run_id": str(flow_run.id), "tfopt.config": config.name}
    with tracking.tracked_run(
        mlflow_tracking_uri(), config.experiment, flow_run.name or config.name,
        params=config.model_dump(mode="json"), tags={**tags, "tfopt.role": "pipeline"},
    ) as run:
        get_run_logger().info("MLflow run: %s", run.url)
        run_dir = work_dir / "runs" / f"{config.name}-{run.run_id[:12]}"
        crashes = contain_native_steps(run_dir)
        budget = _planned_budget(config)
        measured = _prepare_data(config, work_dir, run_dir, run, budget)
        baseline, savedmodel = _baseline(config, measured.data, work_dir, run_dir, run, budget)
        inputs = _benchmark_inputs(config, savedmodel or baseline, measured.data, run_dir)
        variants, budget = _baseline_variants(config, measured.data, (baseline, savedmodel),
                                              inputs, run_dir, run, budget)
        config, amx = _amx_decided(config, baseline_int8(variants, baseline.name), inputs, run)
        bench = Measurements(config, budget)
        del budget  # from here on, the run's budget is `bench.budget` (one copy)
        measured_baseline = bench.baseline_first(baseline, variants, inputs, measured.data.costs)
        compressed = _compressed_variants(bench, measured.data, baseline, run_dir, run, inputs,
                                          variants)
        held = _baseline_holds(config, measured.data, _Held(baseline, savedmodel, inputs, variants),
                               compressed, run_dir, run, bench.budget)
        baseline, inputs, technique_models = held.baseline, held.inputs, compressed.models
        _share_inputs(config, run, inputs)
        results = _measured(bench, (variants, measured_baseline), held, compressed.variants)
        late, finish = LateSteps(), FinishWatch()
        runoff, packaged, run_ids = _child_runs(config, run, tags, measured.data, results,
                                                inputs, [baseline, *technique_models], run_dir,
                                                late)
        summary = _summarize(config, run, measured, results, run_ids,
                             [baseline, *technique_models], runoff, read_record(crashes),
                             held.note, inputs, amx, late)
        summary = {**summary, "search": compressed.searches}
        summary = late.run("comparison with the last run", lambda: _since_last_run(
            config, run, summary, run_dir, (results, inputs), bench.budget, finish),
            {**summary, "since_last_run": None, "champion_history": []})
        summary = _write_outputs(_with_budget(summary, bench.budget, [*compressed.cuts,
                                              *bench.cuts], _learned(measured.data, baseline)),
                                 results, run_dir, run, late)
    late.run("the finish's time for the next run", lambda: record_finish(
        measured.data.costs, finish.seconds() - bench.budget.package_s * len(packaged)), None)
    return _said_done(summary)


def _child_runs(
    config: PipelineConfig, run: tracking.TrackedRun, tags: dict[str, str], data: TrainingData,
    results: list[VariantResult], inputs: BenchmarkInputs, models: list[ModelArtifact],
    run_dir: Path, late: LateSteps,
) -> tuple[Runoff | None, dict[str, Path], dict[str, str]]:
    """The run-off, then every variant as an MLflow model and a child run (`late` steps each).

    Returns:
        The run-off (None: none, or it failed), the packaged models and the child runs' ids.
    """
    runoff = late.run("run-off", lambda: run_off(results, inputs, config.benchmark), None)
    packaged = late.run("MLflow models", lambda: package_models(
        results, inputs, data.dataset.class_names, data.input_scale, run_dir / "mlflow-models",
        config.benchmark.threads, runoff), {})
    run_ids = late.run("MLflow child runs", lambda: tracking.log_variants(
        run, results, {m.name: m for m in models}, tags, packaged, inputs.labels,
        data.dataset.class_names), {})
    return runoff, packaged, run_ids


def _said_done(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary, its variants and champion said in one line."""
    failures = sum(1 for v in summary["variants"] if v["status"] == "failed")
    get_run_logger().info("%d variants benchmarked, %d failed; champion: %s",
                          len(summary["variants"]), failures, summary["champion"] or "none")
    return summary


def _share_inputs(config: PipelineConfig, run: tracking.TrackedRun,
                  inputs: BenchmarkInputs) -> None:
    """Log the benchmark inputs with the run, for other machines to measure on them too."""
    if config.benchmark.share_inputs:
        tracking.log_file(run, write_inputs_index(inputs, config.benchmark).parent,
                          INPUTS_ARTIFACT)


def _prepare_data(
    config: PipelineConfig, work_dir: Path, run_dir: Path, run: tracking.TrackedRun,
    budget: Budget,
) -> _Measured:
    """Shard the data, sweep the batch size, measure the readers and the data layouts.

    Within a time budget the sweep and the layout measurement stop at its measuring deadline
    (the layout is not measured when that has passed). The budget's plan is said first.
    """
    get_run_logger().info(budget.plan_line())
    dataset = sharded_data(config.data, work_dir, config.scale)
    tracking.log_dataset(run, dataset)
    facts = inspect_model(config.model, dataset, config.eval.output)
    tracking.log_model_facts(run, facts)
    costs = load_costs(work_dir, costs_key(config.model, config.data.image_size))
    if dataset.arrays:
        batch_size = config.train.batch_size or DEFAULT_BATCH_SIZE
        data = TrainingData(dataset=dataset, batch_size=batch_size, seed=config.train.seed,
                            input=config.input, input_scale=config.model.input_scale,
                            costs=costs, judged_by=config.eval.settled(
                                config.benchmark.accuracy_budget_points, class_scores=False),
                            loss=fine_tuning_loss(config.model, config.train.loss))
        sweep = BatchSweepResult(points=[], chosen_batch_size=batch_size, rule=(
            "not measured: a model file taken as it is with array data trains on nothing"))
        return _Measured(data, sweep, None, None, facts)
    dataset = dataset.model_copy(update={"channels": facts.channels})
    sweep = _swept(config, dataset, run_dir, budget.measuring_deadline)
    batch_size = config.train.batch_size or sweep.chosen_batch_size
    tracking.log_sweep(run, sweep, batch_size)
    pipeline = measure_input_pipeline(dataset, sweep.chosen_batch_size, config.input)
    tracking.log_input_pipeline(run, pipeline)
    layout = None
    in_time = budget.measuring_deadline is None or time.time() < budget.measuring_deadline
    if config.input.measure_layouts and config.model.kind == "keras" and in_time:
        measuring = measure_data_layout(dataset, config.model, batch_size,
                                        config.input.sweep_steps, return_state=True)
        layout = measuring.result() if measuring.is_completed() else None
        if layout is not None:
            tracking.log_layout(run, layout)
        else:
            get_run_logger().warning("the layout measurement failed; the run goes on without "
                                     "it: %s", error_of(measuring))
    data = TrainingData(dataset=dataset, batch_size=batch_size, seed=config.train.seed,
                        input=config.input, input_scale=config.model.input_scale, costs=costs)
    return _Measured(data, sweep, pipeline, layout, facts)


def _swept(config: PipelineConfig, dataset: DatasetArtifact, run_dir: Path,
           deadline: float | None) -> BatchSweepResult:
    """The batch-size sweep; one that fails leaves the configured or the default batch size."""
    sweeping = sweep_batch_size(dataset, config.model, config.input, run_dir / "report",
                                deadline, return_state=True)
    if sweeping.is_completed():
        return sweeping.result()
    get_run_logger().warning("the batch-size sweep failed; the run goes on: %s",
                             error_of(sweeping))
    return unswept(config.train.batch_size, error_of(sweeping))


def _checkpoint_dir(config: PipelineConfig, data: TrainingData, work_dir: Path) -> Path:
    """A training folder named after the data and the training settings, not after the run.

    A rerun after a crash therefore finds the last epoch's backup, and a rerun after a finished
    training its baseline; a user's model or builder file that changed gets a new folder.
    """
    key = json.dumps([data.dataset.manifest_path.read_text(),
                      config.model.model_dump(mode="json"), config.train.model_dump(mode="json"),
                      data.batch_size, source_stamp(config.model)], sort_keys=True)
    return work_dir / "checkpoints" / f"baseline-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _baseline(
    config: PipelineConfig, data: TrainingData, work_dir: Path, run_dir: Path,
    run: tracking.TrackedRun, budget: Budget,
) -> tuple[ModelArtifact, ModelArtifact | None]:
    """Train the baseline (until its plateau, within the budget) and export its SavedModel.

    A non-Keras model file, and any model file with array data, is taken in as it is.

    Returns:
        The baseline, and the SavedModel conversions start from (None for .tflite and .onnx).
    """
    models_dir = run_dir / "models"
    if config.model.kind != "keras" or data.dataset.arrays:
        baseline = import_model(config.model, data.dataset, models_dir, data.judged_by)
        tracking.log_training(run, baseline)
        return baseline, baseline if baseline.format == "savedmodel" else None
    baseline = train_model(data, config.model, config.train, models_dir,
                           checkpoint_dir=_checkpoint_dir(config, data, work_dir),
                           deadline=budget.baseline_deadline)
    tracking.log_training(run, baseline)
    savedmodel = export_savedmodel(baseline, models_dir)
    tracking.log_file(run, savedmodel.path, f"models/{savedmodel.name}-savedmodel")
    return baseline, savedmodel


def _benchmark_inputs(
    config: PipelineConfig, model: ModelArtifact, data: TrainingData, run_dir: Path
) -> BenchmarkInputs:
    """The decoded test split and the reference model's logits on it (every variant's input).

    The reference is the float SavedModel, or a .tflite or .onnx baseline itself; every
    variant is scored by ``eval.metric`` on them.
    """
    reference = plan_variant(model.name, model.format, model.precision, path=model.path)
    inputs = prepare_benchmark_inputs(reference, data.dataset, run_dir / "benchmark-inputs",
                                      data.batch_size, model.input_scale)
    return inputs.model_copy(update={"judged_by": config.eval})


def _baseline_variants(
    config: PipelineConfig, data: TrainingData,
    models: tuple[ModelArtifact, ModelArtifact | None], inputs: BenchmarkInputs, run_dir: Path,
    run: tracking.TrackedRun, budget: Budget,
) -> tuple[list[VariantSpec], Budget]:
    """Every runtime's forms of the baseline (`tfopt.runtimes.plan_forms`), built in plan order.

    What a model kind cannot give (a Keras graph from a plain SavedModel, anything but itself
    from a .tflite or .onnx file) is listed as skipped with the reason. Runtimes that ship a
    bundle (TensorRT's ONNX + trtexec) then export it as an artifact. The conversions' time
    resizes the budget's plan (`Budget.with_builds`), with the sizes its measurements take.
    """
    baseline, savedmodel = models
    planned = plan_forms(PlanRequest(source=baseline.name, kind=baseline.format,
                                     precision=baseline.precision), config)
    sources = build_sources(baseline, savedmodel, data, config, run_dir / "variants")
    started = time.monotonic()
    variants = build_forms(planned, sources, config)
    test_inputs = inputs.images or inputs.feeds  # feeds not written yet when generated
    budget = budget.with_builds(time.monotonic() - started, len(planned), ModelSizes(
        model_bytes=path_size_bytes((savedmodel or baseline).path),
        input_bytes=path_size_bytes(test_inputs) if test_inputs else 0,
        tensorflow_variants=sum(runtime_of(spec.format).name == "tensorflow"
                                for spec in planned)))
    get_run_logger().info("resized by the baseline's conversions: %s", budget.plan_line())
    _export_bundles(sources.model_copy(update={"built": {v.name: v for v in variants}}),
                    config, run_dir, run)
    return variants, budget


def _amx_decided(config: PipelineConfig, reference: VariantSpec | None, inputs: BenchmarkInputs,
                 run: tracking.TrackedRun) -> tuple[PipelineConfig, AmxDecision]:
    """`config` with ``benchmark.amx`` decided (`tfopt.measurement.amx`), logged to the run."""
    decision = decide_amx_setting(config.benchmark, reference, inputs)
    tracking.log_amx_decision(run, decision.setting, decision.reason, decision.denied_speedup)
    benchmark = with_decided_amx(config.benchmark, decision)
    return config.model_copy(update={"benchmark": benchmark}), decision


def _export_bundles(sources: BuildSources, config: PipelineConfig, run_dir: Path,
                    run: tracking.TrackedRun) -> None:
    """Each exporting runtime's bundle as an artifact; a failure is only logged."""
    for runtime in registry().values():
        if not runtime.exports:
            continue
        state = export_bundle(runtime.name, sources, settings_of(runtime, config),
                              run_dir / "export", return_state=True)
        if not state.is_completed():
            get_run_logger().warning("%s bundle failed: %s", runtime.name, error_of(state))
        elif state.result() is not None:
            tracking.log_file(run, state.result(), f"export/{state.result().name}")


def _compressed_variants(
    bench: Measurements, data: TrainingData, baseline: ModelArtifact, run_dir: Path,
    run: tracking.TrackedRun, inputs: BenchmarkInputs, baseline_variants: list[VariantSpec],
) -> Compressed:
    """The compression subflow on the configured task runner, its models' metrics logged.

    Every fine-tuning stops once back within the accuracy budget of the baseline's accuracy on
    the split trainings choose on, give or take two of its images (`recovery_target`); a
    search's trial must also keep a file within the budget of the baseline's validation
    accuracy, read on images no training chose on, the champion's
    rule (`kept_val_accuracy`), and is timed side by side with the baseline's int8 file
    (`baseline_int8`). On array data both are the run's metric's budget of the baseline's own
    figures on those splits (`array_targets`). If the subflow fails as a whole (e.g. its Dask
    cluster), every planned compressed variant is marked failed and the baseline variants
    still go on. `bench` holds the config (its compressed forms narrowed or not) and prices a
    trial's files.
    """
    config, budget = bench.config, bench.budget
    budget_points = config.benchmark.accuracy_budget_points
    recover_to, file_target = array_targets(baseline, data) if data.dataset.arrays else (
        recovery_target(baseline, budget_points, selection_examples(data)),
        kept_val_accuracy(baseline, budget_points))
    tuning = data.model_copy(update={"recover_to": recover_to, "file_target": file_target,
                                     "speedup_reference": baseline_int8(baseline_variants,
                                                                        baseline.name),
                                     "deadline": budget.compression_deadline,
                                     "variant_tail_s": budget.compressed_variant_s,
                                     "file_s": bench.file_s(),
                                     "epoch_s": epoch_seconds(baseline)})
    compressing = compress_model.with_options(task_runner=task_runner(config.scale))(
        config, baseline, tuning, run_dir, inputs, run.ref, return_state=True)
    if not compressing.is_completed():
        error = f"compress_model failed: {error_of(compressing)}"
        get_run_logger().warning(error)
        return Compressed(variants=all_failed(plan(config, baseline), error), models=[])
    compressed = compressing.result()
    for model in compressed.models:
        tracking.log_technique(run, model)
    return compressed


@dataclass(frozen=True)
class _Held:
    """The baseline every verdict is judged against, its forms, and why it may not hold."""

    baseline: ModelArtifact
    savedmodel: ModelArtifact | None
    inputs: BenchmarkInputs
    variants: list[VariantSpec]
    note: str | None = None


def _baseline_holds(
    config: PipelineConfig, data: TrainingData, made: _Held, compressed: Compressed,
    run_dir: Path, run: tracking.TrackedRun, budget: Budget,
) -> _Held:
    """The parent is not beaten by its children: train it further, or say the verdicts do not hold.

    When a compressed model beats the baseline on validation beyond the budget
    (`children_beating`), the baseline goes on training (its SavedModel, the benchmark inputs
    and its variants are made again) if the time budget leaves room for it and its epochs are
    not fixed (``train.stop: fixed``) and it was trained here at all (a model taken as it is,
    ``train.epochs: 0``, never is); else every verdict is marked as judged against an
    unconverged baseline. A failure while training it further keeps the baseline as it was,
    with the failure in the note: the run's measurements are not lost for it.
    """
    baseline = made.baseline
    beating = children_beating(baseline, compressed.models,
                               config.benchmark.accuracy_budget_points,
                               selection_examples(data))
    if not beating or baseline.format != "keras":
        return made
    beaten = f"beaten by {'; '.join(beating)}"
    why_not = _not_trained_further(config, baseline, budget)
    if why_not is not None:
        get_run_logger().warning("compressed models beat the baseline: %s; %s",
                                 "; ".join(beating), why_not)
        return replace(made, note=f"{beaten} ({why_not})")
    get_run_logger().warning("compressed models beat the baseline on validation beyond the "
                             "budget (%s): training it further", "; ".join(beating))
    try:
        return _trained_further(config, data, made, beaten, run_dir, run, budget)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        get_run_logger().warning("training the baseline further failed (%s): the verdicts are "
                                 "judged against it as it was", reason)
        return replace(made, note=f"{beaten}; training it further failed: {reason}")


def _not_trained_further(config: PipelineConfig, baseline: ModelArtifact,
                         budget: Budget) -> str | None:
    """Why a beaten baseline is not trained further (None: it is)."""
    if config.train.epochs == 0:
        return "taken as it is (train.epochs: 0): never trained further"
    if config.train.stop == "fixed":
        return "train.stop: fixed trains it no further"
    deadline = budget.further_training_deadline
    if deadline is not None and deadline - time.time() < 2.0 * float(
            baseline.metrics.get("train_seconds", 0.0)):
        return "no time left to train it further"
    return None


def _trained_further(
    config: PipelineConfig, data: TrainingData, made: _Held, beaten: str, run_dir: Path,
    run: tracking.TrackedRun, budget: Budget,
) -> _Held:
    """The baseline trained further, with its SavedModel, benchmark inputs and variants anew.

    Its forms and inputs go to a folder of their own (``continued/``), beside the first ones.
    """
    further = continue_training(made.baseline, data, config.train, run_dir / "models",
                                budget.further_training_deadline)
    tracking.log_continued_training(run, further)
    if further.path == made.baseline.path:
        return replace(made, baseline=further, note=(
            f"{beaten}, even after {further.params['continued_epochs']} more epochs of its "
            "training"))
    savedmodel = export_savedmodel(further, run_dir / "models")
    inputs = _benchmark_inputs(config, savedmodel, data, run_dir / "continued")
    variants, _ = _baseline_variants(config, data, (further, savedmodel), inputs,
                                     run_dir / "continued", run, budget)
    return _Held(further, savedmodel, inputs, variants, note=None)


def _measured(bench: Measurements,
              first: tuple[list[VariantSpec], list[VariantResult]], held: _Held,
              compressed: list[VariantSpec]) -> list[VariantResult]:
    """Every variant's row, in plan order: the baseline's forms, then the compressed ones.

    `first` is the baseline's forms and those measured before the compression; the compressed
    variants come next, then the baseline's forms that waited (`Measurements.later`). A
    baseline trained further has its new forms measured first instead (its old ones waiting
    are dropped).
    """
    variants, measured = first
    if held.variants is not variants:
        bench.waiting = []
        measured = bench.measure(held.variants, held.inputs)
    bench.finish_for(measured, compressed)
    rows = [*measured, *bench.measure(compressed, held.inputs), *bench.later(held.inputs)]
    return in_plan_order([*held.variants, *compressed], rows)


def _summarize(
    config: PipelineConfig, run: tracking.TrackedRun, measured: _Measured,
    results: list[VariantResult], run_ids: dict[str, str], models: list[ModelArtifact],
    runoff: Runoff | None, crashes: list[dict[str, Any]], baseline_note: str | None,
    inputs: BenchmarkInputs, amx: AmxDecision, late: LateSteps,
) -> dict[str, Any]:
    """Pick and register the champion; assemble the summary JSON.

    `models`: the baseline, then the techniques'; `crashes`: the contained ones; `baseline_note`:
    why the verdicts are against an unconverged baseline; `inputs`: for the paired test. What
    fails on the way (MLflow, the choice itself) is one of the `late` steps' failures.
    """
    bench, baseline, technique_models = config.benchmark, models[0], models[1:]
    late.run("MLflow crash record", lambda: tracking.log_native_crashes(run, crashes), None)
    training = baseline_training(baseline)
    late.run("MLflow baseline health",
             lambda: tracking.log_baseline_health(run, training["health"]), None)
    baseline_note = verdicts_note(baseline_note, training["health"])
    budget = inputs.budget(bench.accuracy_budget_points)
    choice = late.run("champion choice", lambda: pick_champion(
        results, bench.accuracy_budget_points, bench.objective, runoff, config.eval,
        class_scores=inputs.images is not None),
        ChampionChoice(name=None, reason="its choice failed (late_failures)",
                       baseline_accuracy=baseline_accuracy(results)))
    speedup = champion_speedup(choice.name, results, runoff)
    champion_model = _registered(config, run, choice, results, run_ids, speedup,
                                 (measured.data.dataset, baseline_note), late)
    tf_threads = next((r.tf_intra_op_threads for r in results
                       if r.tf_intra_op_threads is not None), None)
    return build_summary(
        tracking_uri=run.tracking_uri, experiment_id=run.experiment_id, run_id=run.run_id,
        flow_run_id=str(flow_run.id), dataset=measured.data.dataset,
        input_pipeline=measured.pipeline, results=results, champion=choice.name,
        champion_reason=choice.reason, baseline_accuracy=choice.baseline_accuracy,
        budget=budget, tied=list(choice.tied_with),
        techniques={m.name: {"params": m.params, "metrics": m.metrics} for m in technique_models},
        runoff=runoff,
        extras={
            "config_name": config.name,
            "accuracy_budget_points": bench.accuracy_budget_points,
            "mlflow_run_url": run.url,
            "environment": environment(bench.threads, tf_threads, resolve_cpus(bench.cpus),
                                       bench.amx),
            "amx_decision": amx.model_dump(mode="json"),
            "champion_model": champion_model,
            "champion_speedup": speedup,
            "accuracy_verdict": accuracy_verdict(choice, results, inputs, budget,
                                                  measured.data.dataset.class_names),
            **over_one_call_forms(choice.name, results, runoff),
            "batch_size_sweep": measured.sweep.model_dump(mode="json"),
            "training_batch_size": measured.data.batch_size,
            "model_facts": measured.facts.params(),
            "data_layout": measured.layout.model_dump(mode="json") if measured.layout else None,
            "input_cache": None if measured.pipeline is None else {
                "mode": measured.pipeline.cache_mode, "reason": measured.pipeline.cache_reason},
            "native_crashes": crashes,
            "baseline_training": {**training,
                                  "verdicts_against_unconverged_baseline": baseline_note},
        },
    )


def _registered(
    config: PipelineConfig, run: tracking.TrackedRun, choice: ChampionChoice,
    results: list[VariantResult], run_ids: dict[str, str], speedup: dict[str, Any] | None,
    context: tuple[DatasetArtifact, str | None], late: LateSteps,
) -> dict[str, Any] | None:
    """The champion tagged on the run and registered (a `late` step); None without one.

    A champion without its child run (their logging failed) cannot be registered.
    """
    if choice.name not in run_ids:
        return None
    dataset, baseline_note = context
    budget_points = config.benchmark.accuracy_budget_points
    winner = next(r for r in results if r.name == choice.name)
    tags, description = champion_card(winner, choice.reason, budget_points, run.url, dataset,
                                      baseline_note, speedup)
    model_name = f"tfopt-{config.name}" if config.benchmark.register_champion else None
    return late.run("champion registration", lambda: tracking.log_champion(
        run, choice.name, run_ids[choice.name], model_name, tags, description), None)


def _with_budget(summary: dict[str, Any], budget: Budget, cuts: list[Cut],
                 learned: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The summary with the budget: planned, used and what it cut (the measurements' `cuts` too).

    Its use is taken here, at the end: the checks since the last run are inside the budget.
    `learned`: the techniques' prices this run took from earlier runs (`_learned`).
    """
    ledger = Cuts([*cuts, *budget_cuts(summary["baseline_training"], summary["techniques"]),
                   *confirmation_cuts(summary.get("since_last_run"))])
    return {**summary, "budget": {**budget.summary(ledger), "learned_costs": learned}}


def _planned_budget(config: PipelineConfig) -> Budget:
    """The run's budget as planned at its start, from the variants its config plans.

    The baseline's training is priced as if the compressed models were narrowed to their int8
    files (`Budget.least_compressed_variants`), the finish as this machine's earlier runs of the
    model took it (`tfopt.schedule.learned_costs.record_finish`).
    """
    learned = load_costs(config.work_dir.resolve(),
                         costs_key(config.model, config.data.image_size))
    return Budget.planned(config.budget.minutes, planned_counts(config), config.benchmark,
                          least_compressed=planned_counts(int8_only(config))[1],
                          learned_finish_s=learned.finish_s)


def _learned(data: TrainingData, baseline: ModelArtifact) -> dict[str, dict[str, float]]:
    """Each technique's fixed part in seconds and epoch share as this run priced them.

    Learned on this machine for this model (`tfopt.schedule.learned_costs`); a technique not
    named, or a number missing, was priced at `tfopt.schedule.prices.STARTUP_S` and
    `WRAPPED_EPOCH_SHARE`.
    """
    return data.costs.summary(epoch_seconds(baseline)) if data.costs is not None else {}


def _since_last_run(config: PipelineConfig, run: tracking.TrackedRun, summary: dict[str, Any],
                    run_dir: Path, measured: tuple[list[VariantResult], BenchmarkInputs],
                    budget: Budget, finish: FinishWatch) -> dict[str, Any]:
    """Compare with the config's last finished run: the report's section, tag and event.

    A slowdown beyond the run-to-run noise is timed again side by side with the previous run's
    file (`confirm_slowdowns`) while the time budget lasts (not counted in the `finish` the
    next run keeps time for). A regression (a slowdown so
    confirmed, lower accuracy, a newly failing variant) tags the run ``tfopt.regression``,
    emits the Prefect event of that name and is said on the registered champion's version.
    """
    previous = tracking.previous_summary(run, config.name, run_dir / "previous-run")
    since = None
    if previous:
        since = compare(previous, summary, tracking.variant_p50_history(run, config.name),
                        config.benchmark.regression_min_change)
        with finish.excluding():
            checks = confirm_slowdowns(to_confirm(since), since["previous_run_id"],
                                       run.tracking_uri, *measured, config.benchmark,
                                       run_dir / "previous-run", budget.deadline(1.0),
                                       2.0 * budget.measure_s)
        since = settle(since, checks)
        tracking.note_regressions(run, summary.get("champion_model"), since)
    champion = next((v for v in summary["variants"] if v["name"] == summary["champion"]), None)
    history = tracking.champion_history(run, config.name)
    if champion is not None:
        history.append({"run_id": run.run_id, "champion": champion["name"],
                        "p50_ms": champion["latency_ms"]["p50"],
                        "accuracy": champion["accuracy"]})
    tracking.log_comparison(run, since, champion, summary.get("champion_speedup"),
                            summary.get("champion_speedup_over_int8"),
                            summary.get("champion_speedup_over_peers"))
    if since is not None:
        emit_regression_event(config.name, run.url, since)
    publish_comparison(since)
    if since and since["regressions"]:
        get_run_logger().warning("regressions since the last run of %s: %s", config.name,
                                 ", ".join(sorted({r["variant"] for r in since["regressions"]})))
    return {**summary, "since_last_run": since, "champion_history": history}


def _write_outputs(
    summary: dict[str, Any], results: list[VariantResult], run_dir: Path,
    run: tracking.TrackedRun, late: LateSteps,
) -> dict[str, Any]:
    """The summary JSON and the report files, to the run folder, MLflow and Prefect.

    The summary is written first and again last, with every late step's failure
    (``late_failures``): a report or an upload that fails loses none of the figures.

    Returns:
        The summary with the report's path (None when it could not be written).
    """
    summary_path = run_dir / "summary.json"
    summary = {**summary, "report": None, "late_failures": late.failures}
    atomic_write_json(summary_path, summary)
    written = late.run("report", lambda: write_report(summary, results, run_dir / "report"), [])
    if written:
        summary = {**summary, "report": str(run_dir / "report" / "report.md")}
    late.run("MLflow report files", lambda: [tracking.log_file(run, path, "report")
                                             for path in written], None)
    late.run("MLflow run description", lambda: tracking.describe_run(
        run, run_description(summary, tracking.DESCRIPTION_LIMIT)), None)
    late.run("Prefect artifacts", lambda: publish_prefect_artifacts(summary), None)
    run_log = os.environ.get("TFOPT_RUN_LOG")  # set by `tfopt run` (tfopt.logs)
    late.run("MLflow summary and log", lambda: [
        tracking.log_file(run, path, folder) for path, folder in (
            (summary_path, "report"), (Path(run_log or ""), "logs")) if path.is_file()], None)
    summary = {**summary, "late_failures": late.failures}
    atomic_write_json(summary_path, summary)
    return summary
