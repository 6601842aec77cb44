"""Prefect task: one trial of a technique's search (its model, its files' p50s)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.states import Completed, State

from compress import make_trial
from techniques.base import NotApplicable, TechniqueSection
from tfopt.artifacts import BenchmarkInputs, ModelArtifact, TrainingData
from tfopt.config import MeasurementProtocol
from tfopt.native import NativeStep, run_native
from tfopt.schedule.prices import learn_cost
from tfopt.search import Point, Trial, time_files
from tfopt.tracking import RunRef, log_trial


@task(name="search_trial", task_run_name="trial-{technique}-{setting}", tags=["compression"])
def run_trial(technique: str, point: Point, setting: str, start: ModelArtifact,
              cfg: TechniqueSection,
              data: TrainingData, out_dir: Path, convert: Any, forms: tuple[str, ...],
              inputs: BenchmarkInputs, protocol: MeasurementProtocol,
              parent: RunRef) -> Trial | State:
    """Make the technique's model at `point`, fine-tune, convert to TFLite, time it, log it.

    The model is made in a child process (`tfopt.native`: a crash fails this trial only),
    fine-tuned until back within the accuracy budget or stopped by the study's pruner
    (`data.trial`); its TFLite files (`forms`) are timed holding the machine's benchmark
    slot (those within the budget side by side with `data.speedup_reference`) and their
    validation accuracy checked against `data.file_target`. The trial is a nested MLflow run
    of the pipeline's run, a crashed or failed one (FAILED, its error a tag) and a refused one
    included; a model the technique does not apply to ends the task run Completed, named
    "Skipped".

    Args:
        technique: The technique searched.
        point: The strengths tried (each searched field's value).
        setting: The point as the task run's name reads it (``0.5``, ``0.5-0.25``).
        start: The model it starts from.
        cfg: The technique's settings (its knob ``auto``).
        data: The run's training data, with the recovery target and the trial to report to.
        out_dir: The trial's folder (its model and files).
        convert: The ``convert`` section (int8 calibration).
        forms: The TFLite precisions of its files (`techniques.trial_forms`).
        inputs: The benchmark inputs (the run's test split).
        protocol: The run's benchmark protocol (shortened for a trial).
        parent: The pipeline's MLflow run.

    Returns:
        The trial: its model, validation accuracy, its fastest file's p50 and status.
    """
    step = NativeStep(f"search_trial ({technique} {setting})",
                      f"the {technique} trial's fine-tuning and conversion",
                      "the search goes on without this setting")
    name = f"{technique} " + " ".join(f"{field}={value:g}" for field, value in point.items())
    started = time.monotonic()
    metric = data.metric() if data.dataset.arrays else None
    try:
        made = run_native(step, make_trial, technique, point, start, cfg, data, out_dir, convert,
                          data.recover_to, forms)
        timed = time_files(made, inputs, protocol, data.file_target, data.speedup_reference)
        learn_cost(technique, cfg, data, timed.model, time.monotonic() - started,
                   files=len(timed.files) + (timed.speedup is not None))
    except NotApplicable as refusal:
        refused = Trial(params=point, status="not_applicable", error=str(refusal))
        log_trial(parent, name, {"technique": technique, **refused.summary()}, metric)
        return Completed(name="Skipped", message=f"{technique} does not apply: {refusal}",
                         data=refused)
    except Exception as error:  # a crash, or any error of the trial's: its run says which
        failed = Trial(params=point, status="failed",
                       error=f"{type(error).__name__}: {error}"[:500])
        log_trial(parent, name, {"technique": technique, **failed.summary()}, metric)
        raise
    log_trial(parent, name, {"technique": technique, **timed.summary()}, metric)
    return timed
