"""The one module that writes to MLflow.

Every function takes the run explicitly: MLflow's "active run" is thread-local and Prefect
runs tasks on worker threads, so nothing here relies on `mlflow.active_run()`. Metrics go out
in batches (`log_batch`), never one call per value. Flows log through `tracked_run` (the run's
lifecycle) and one typed function per result type (`log_dataset`, `log_sweep`, ...), so one
fact has one metric name in every flow.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tfopt.artifacts import (
    BatchSweepResult,
    DatasetArtifact,
    InputPipelineResult,
    LayoutResult,
    ModelArtifact,
    ModelFacts,
    VariantResult,
)
from tfopt.provenance import git_commit, mlflow_tracking_uri
from tfopt.services import ServiceError, left_by_dead_process, process_identity, redact

_BATCH_METRICS = 1000
_BATCH_PARAMS = 100
_PARAM_VALUE_LIMIT = 6000
_TAG_VALUE_LIMIT = 8000
T = TypeVar("T")


def client(tracking_uri: str) -> MlflowClient:
    """Return a client for the tracking server at `tracking_uri`."""
    return MlflowClient(tracking_uri=tracking_uri)


class TrackingUnavailableError(ServiceError):
    """The MLflow server did not answer within the retry bound."""


def with_retries(call: Callable[[], T], within_s: float | None = None,
                 first_delay_s: float = 1.0) -> T:
    """Run `call`, retrying with backoff while the tracking server cannot be reached.

    This is the only retry loop around MLflow: MLflow's own HTTP retries are switched off
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``, set by the tfopt package), so an outage costs at
    most `within_s`, not retries times retries.

    Args:
        call: The MLflow operation.
        within_s: How long to keep trying (default: `retry_seconds`).
        first_delay_s: Wait before the second try; doubled after each failure, at most 15 s.

    Returns:
        What `call` returns.

    Raises:
        TrackingUnavailableError: The server did not answer in time, naming its address.
    """
    bound = retry_seconds() if within_s is None else within_s
    deadline, delay = time.monotonic() + bound, first_delay_s
    while True:
        try:
            return call()
        except (MlflowException, OSError) as error:
            if not _is_transient(error):
                raise
            if time.monotonic() + delay > deadline:
                raise TrackingUnavailableError(
                    f"MLflow at {redact(mlflow_tracking_uri())} did not answer for {bound:.0f} s "
                    f"({type(error).__name__}); start it with `tfopt up` and run again: "
                    "finished steps (shards, the trained baseline) are reused"
                ) from error
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


_retry_seconds: float | None = None


def use_retry_seconds(seconds: float | None) -> None:
    """Set this process's retry bound (a run's ``services.retry_seconds``; None: the default)."""
    global _retry_seconds
    _retry_seconds = seconds


def retry_seconds() -> float:
    """Seconds tfopt keeps retrying a service that does not answer.

    ``services.retry_seconds`` of the running flow, else ``TFOPT_SERVICE_RETRY_SECONDS``, else 60.
    """
    if _retry_seconds is not None:
        return _retry_seconds
    return float(os.environ.get("TFOPT_SERVICE_RETRY_SECONDS", "60"))


def _is_transient(error: Exception) -> bool:
    if isinstance(error, OSError):
        return True
    text = str(error).lower()
    return any(word in text for word in ("connection", "timed out", "max retries", "503", "502"))


def flatten_params(tree: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """Flatten nested parameters to dotted keys with string values (MLflow's param shape)."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{dotted}."))
        else:
            flat[dotted] = str(value)[:_PARAM_VALUE_LIMIT]
    return flat


# Marks the experiment as model training ("custom model development") for MLflow 3's UI; the
# view it opens in is chosen by the address (see `experiment_url`).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def ensure_experiment(mlflow: MlflowClient, name: str) -> str:
    """Return the id of experiment `name`, creating it if needed, tagged as model training."""
    existing = with_retries(lambda: mlflow.get_experiment_by_name(name))
    if existing is not None:
        experiment_id = existing.experiment_id
    else:
        try:
            experiment_id = mlflow.create_experiment(name, tags=EXPERIMENT_KIND)
        except MlflowException:
            # Another process created it between our look-up and our create.
            experiment_id = mlflow.get_experiment_by_name(name).experiment_id
    if existing is None or existing.tags.get("mlflow.experimentKind") is None:
        for key, value in EXPERIMENT_KIND.items():
            with_retries(lambda key=key, value=value: mlflow.set_experiment_tag(
                experiment_id, key, value))
    return experiment_id


def start_run(
    mlflow: MlflowClient,
    experiment_id: str,
    run_name: str,
    params: Mapping[str, object] | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
) -> str:
    """Create a run (a child run when `parent_run_id` is given) and log its params and tags.

    Returns:
        The new run's id.
    """
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = with_retries(
        lambda: mlflow.create_run(experiment_id, run_name=run_name, tags=all_tags)
    )
    if params:
        log_params(mlflow, run.info.run_id, params)
    return run.info.run_id


def log_params(mlflow: MlflowClient, run_id: str, params: Mapping[str, object]) -> None:
    """Log (nested) parameters in batches."""
    items = [Param(key, value) for key, value in flatten_params(params).items()]
    for start in range(0, len(items), _BATCH_PARAMS):
        chunk = items[start : start + _BATCH_PARAMS]
        with_retries(lambda chunk=chunk: mlflow.log_batch(run_id, params=chunk))


def set_tags(mlflow: MlflowClient, run_id: str, tags: Mapping[str, str]) -> None:
    """Set tags on a run in one batch."""
    batch = [RunTag(key, str(value)) for key, value in tags.items()]
    with_retries(lambda: mlflow.log_batch(run_id, tags=batch))


def log_metrics(
    mlflow: MlflowClient, run_id: str, metrics: Mapping[str, float], step: int = 0,
    model_id: str | None = None,
) -> None:
    """Log a set of scalar metrics at one step, in batches (linked to a LoggedModel if given)."""
    now = int(time.time() * 1000)
    log_metric_points(
        mlflow, run_id,
        (Metric(k, float(v), now, step, model_id=model_id) for k, v in metrics.items()))


def log_metric_history(
    mlflow: MlflowClient, run_id: str, history: Mapping[str, Iterable[float]]
) -> None:
    """Log per-step series (e.g. training curves: one value per epoch) in batches."""
    now = int(time.time() * 1000)
    points = (
        Metric(name, float(value), now, step)
        for name, values in history.items()
        for step, value in enumerate(values)
    )
    log_metric_points(mlflow, run_id, points)


def log_metric_points(mlflow: MlflowClient, run_id: str, points: Iterable[Metric]) -> None:
    """Send metric points in batches of at most 1,000 (MLflow's limit per call)."""
    batch: list[Metric] = []
    for point in points:
        batch.append(point)
        if len(batch) == _BATCH_METRICS:
            _send_metrics(mlflow, run_id, batch)
            batch = []
    if batch:
        _send_metrics(mlflow, run_id, batch)


def _send_metrics(mlflow: MlflowClient, run_id: str, batch: list[Metric]) -> None:
    with_retries(lambda: mlflow.log_batch(run_id, metrics=batch))


def log_artifact(
    mlflow: MlflowClient, run_id: str, path: Path, artifact_path: str | None = None
) -> None:
    """Upload a file or a whole folder to the run's artifacts."""
    if path.is_dir():
        with_retries(lambda: mlflow.log_artifacts(run_id, str(path), artifact_path))
    else:
        with_retries(lambda: mlflow.log_artifact(run_id, str(path), artifact_path))


def download_run_artifacts(tracking_uri: str, run_id: str, artifact_path: str,
                           dst: Path) -> Path:
    """Download a run's artifact (file or folder) under `dst`, retried; return its local path."""
    import mlflow.artifacts

    return Path(with_retries(lambda: mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=artifact_path, dst_path=str(dst),
        tracking_uri=tracking_uri)))


def end_run(mlflow: MlflowClient, run_id: str, status: str = "FINISHED") -> None:
    """Mark a run FINISHED, FAILED or KILLED."""
    with_retries(lambda: mlflow.set_terminated(run_id, status=status))


# MLflow 3's UI opens an experiment in its GenAI view unless the address asks for model training.
_TRAINING_VIEW = "workflowType=machine_learning"


def experiment_url(tracking_uri: str, experiment_id: str) -> str:
    """Address of an experiment's runs table in the MLflow UI (its model-training view)."""
    return (f"{redact(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs?"
            f"{_TRAINING_VIEW}")


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Address of a run in the MLflow UI (its model-training view)."""
    return (f"{redact(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
            f"?{_TRAINING_VIEW}")


def variant_metrics(result: object) -> dict[str, float]:
    """Flatten a benchmarked variant's numbers into MLflow metric names."""
    data = result.model_dump(exclude={"samples_ms"})  # type: ignore[attr-defined]
    metrics = {
        key: float(data[key])
        for key in ("accuracy", "size_bytes", "gzip_bytes", "throughput_per_s", "timed_runs",
                    "load_seconds", "first_inference_ms", "peak_rss_mb", "top1_agreement",
                    "max_abs_diff", "batch_throughput_per_s", "background_cores_before",
                    "background_cores", "under_load", "harness_floor_ms", "gflops_per_inference",
                    "offline_examples_per_s", "server_qps_within_budget", "server_p99_ms")
        if data.get(key) is not None
    }
    for threads, p50 in (data.get("p50_ms_by_threads") or {}).items():
        metrics[f"latency_p50_ms_{threads}_threads"] = float(p50)
    for api, stats in (data.get("latency_ms_by_api") or {}).items():
        metrics[f"latency_p50_ms_{api}"] = float(stats["p50"])
    for key, value in (data.get("latency_ms") or {}).items():
        if key == "p50_ci95":
            if value is not None:
                metrics["latency_p50_ci95_low_ms"], metrics["latency_p50_ci95_high_ms"] = value
            continue
        name = key if key in ("cv", "stable") else f"latency_{key}_ms"
        metrics[name] = float(value)
    return metrics


def log_variant_run(
    mlflow: MlflowClient,
    experiment_id: str,
    parent_run_id: str,
    result: object,
    tags: Mapping[str, str] | None = None,
    log_model_files: bool = True,
    source_params: Mapping[str, object] | None = None,
    source_metrics: Mapping[str, float] | None = None,
    mlflow_model: Path | None = None,
    run_name: str | None = None,
) -> str:
    """Create a child run for one benchmarked variant with its params, metrics and model.

    Args:
        mlflow: Tracking client.
        experiment_id: Experiment of the parent run.
        parent_run_id: The pipeline's run.
        result: A `VariantResult`.
        tags: Extra tags (e.g. the Prefect flow run id).
        log_model_files: Upload the variant's model as the ``model`` artifact: its MLflow
            Model folder if given, else its model file or folder as it is.
        source_params: Parameters of the technique that made the variant's model.
        source_metrics: Metrics of that technique (e.g. sparsity reached), logged as
            ``source.<name>``.
        mlflow_model: The variant packaged as an MLflow Model folder.
        run_name: The child run's name (default: the variant's).

    Returns:
        The child run's id.
    """
    data = result.model_dump(exclude={"samples_ms"})  # type: ignore[attr-defined]
    run_id = start_run(
        mlflow,
        experiment_id,
        run_name=run_name or data["name"],
        params={
            **{key: data[key] for key in ("name", "source", "format", "precision")},
            **{f"source.{key}": value for key, value in (source_params or {}).items()},
            **{f"runner.{key}": value for key, value in (data.get("runner_params") or {}).items()},
        },
        tags={
            **(tags or {}),
            "tfopt.variant": data["name"],
            "tfopt.status": data["status"],
            **({"tfopt.error": str(data["error"])[:5000]} if data["error"] else {}),
        },
        parent_run_id=parent_run_id,
    )
    model_id = None
    if data["status"] == "ok" and log_model_files and mlflow_model is not None and (
            mlflow_model.exists()):
        model_id = log_variant_model(mlflow, experiment_id, run_id, result, mlflow_model,
                                     source_params or {})
    if source_metrics:
        log_metrics(mlflow, run_id, {f"source.{k}": v for k, v in source_metrics.items()},
                    model_id=model_id)
    if data["status"] == "ok":
        log_metrics(mlflow, run_id, variant_metrics(result), model_id=model_id)
        path = mlflow_model or (Path(data["path"]) if data.get("path") else None)
        if log_model_files and path is not None and path.exists():
            log_artifact(mlflow, run_id, path, "model")
        for extra in data.get("extra_files") or []:
            log_artifact(mlflow, run_id, Path(extra), "extra")
    end_run(mlflow, run_id, "FINISHED" if data["status"] != "failed" else "FAILED")
    return run_id


VARIANT_MODEL_TYPE = "tfopt-variant"
"""The LoggedModels' ``model_type``: MLflow's Models tab filters and compares by it."""


def log_variant_model(mlflow: MlflowClient, experiment_id: str, run_id: str, result: object,
                      folder: Path, source_params: Mapping[str, object]) -> str:
    """Log a variant's MLflow Model folder as an MLflow 3 LoggedModel of its child run.

    The experiment's Models tab then lists every variant with its parameters (source, runtime,
    format, precision, derived_from, the technique's settings) and the metrics logged with its
    id (accuracy, p50 and interval, p99, throughput, sizes, load scenarios), so the variants
    compare there side by side; the champion is registered from it.

    Returns:
        The LoggedModel's id.
    """
    from tfopt.runtimes import runtime_of

    data = result.model_dump(exclude={"samples_ms"})  # type: ignore[attr-defined]
    params = {
        "source": data["source"], "runtime": runtime_of(data["format"]).name,
        "format": data["format"], "precision": data["precision"],
        "derived_from": data.get("derived_from") or "none",
        **{f"source.{key}": value for key, value in source_params.items()},
        **{f"runner.{key}": value for key, value in (data.get("runner_params") or {}).items()},
    }
    model = with_retries(lambda: mlflow.create_logged_model(
        experiment_id, name=data["name"], source_run_id=run_id, model_type=VARIANT_MODEL_TYPE,
        params={key: str(value)[:6000] for key, value in params.items()},
        tags={"tfopt.variant": data["name"], "tfopt.runtime": params["runtime"]}))
    with_retries(lambda: mlflow.log_model_artifacts(model.model_id, str(folder)))
    with_retries(lambda: mlflow.finalize_logged_model(model.model_id, "READY"))
    set_tags(mlflow, run_id, {"tfopt.model_id": model.model_id})
    return model.model_id


REGISTERED_MODEL_DESCRIPTION = (
    "Champions of tfopt pipeline runs: each version is the variant (runtime, format, precision) "
    "that won its run's benchmark within the accuracy budget; its description says why and its "
    "tags hold its figures. The alias `champion` points at the newest.")


def register_champion(
    mlflow: MlflowClient, model_name: str, run_id: str, alias: str = "champion",
    tags: Mapping[str, str] | None = None, description: str = "",
) -> str:
    """Register a child run's model as a new model version and point `alias` at it.

    The version comes from the variant's LoggedModel where it has one (its ``tfopt.model_id``
    tag), else from the run's ``model`` artifact; it carries `tags` and `description`, and the
    registered model is described once, when it is created.

    Returns:
        The new version number.
    """
    try:
        with_retries(lambda: mlflow.create_registered_model(
            model_name, description=REGISTERED_MODEL_DESCRIPTION))
    except MlflowException as error:
        if "already exists" not in str(error).lower() and "RESOURCE_ALREADY_EXISTS" not in str(
            error
        ):
            raise
    run = with_retries(lambda: mlflow.get_run(run_id))
    model_id = run.data.tags.get("tfopt.model_id")
    source = f"models:/{model_id}" if model_id else f"{run.info.artifact_uri}/model"
    version = with_retries(lambda: mlflow.create_model_version(
        model_name, source=source, run_id=run_id, model_id=model_id,
        tags={key: str(value) for key, value in (tags or {}).items()},
        description=description or None))
    with_retries(lambda: mlflow.set_registered_model_alias(model_name, alias, version.version))
    set_tags(mlflow, run_id, {"tfopt.champion": "true"})
    return str(version.version)


@dataclass(frozen=True)
class TrackedRun:
    """An open MLflow run and where it lives."""

    client: MlflowClient
    tracking_uri: str
    experiment_id: str
    run_id: str

    @property
    def url(self) -> str:
        """The run's address in the MLflow UI."""
        return run_url(self.tracking_uri, self.experiment_id, self.run_id)


@contextmanager
def tracked_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, object],
    tags: Mapping[str, str],
) -> Iterator[TrackedRun]:
    """An MLflow run for the length of a block: FINISHED when it ends, FAILED when it raises.

    The run is created with the params, the tags and the code's git commit; an error in the
    block marks it FAILED and is raised on.

    Args:
        tracking_uri: The MLflow server.
        experiment: Experiment name (created if missing).
        run_name: The run's name.
        params: Nested parameters (flattened to dotted keys).
        tags: Tags, e.g. the Prefect flow run id and the run's role.
    """
    mlflow = client(tracking_uri)
    experiment_id = ensure_experiment(mlflow, experiment)
    run_id = start_run(mlflow, experiment_id, run_name, params=params,
                       tags={**tags, "mlflow.source.git.commit": git_commit(),
                             **process_identity()})
    try:
        yield TrackedRun(mlflow, tracking_uri, experiment_id, run_id)
    except TrackingUnavailableError:
        raise  # the run cannot be marked now; the next `tfopt run` reconciles it
    except BaseException:
        end_run(mlflow, run_id, "FAILED")
        raise
    end_run(mlflow, run_id, "FINISHED")


def reconcile_orphans(tracking_uri: str) -> list[dict[str, str]]:
    """Mark KILLED every RUNNING run whose tfopt process on this machine is gone.

    A run killed with its process (or cut off by an outage) stays RUNNING in MLflow forever;
    the next `tfopt run` calls this. Runs of other machines, and of live processes, are left
    alone.

    Returns:
        The runs marked, with their Prefect flow run ids (to mark those crashed too).
    """
    mlflow = client(tracking_uri)
    host = process_identity()["tfopt.host"]
    experiments = [e.experiment_id for e in with_retries(lambda: mlflow.search_experiments())]
    running = with_retries(lambda: mlflow.search_runs(
        experiments, filter_string=f"attributes.status = 'RUNNING' and tags.`tfopt.host` = "
                                   f"'{host}'", max_results=1000)) if experiments else []
    marked = []
    for run in running:
        if not left_by_dead_process(run.data.tags):
            continue
        set_tags(mlflow, run.info.run_id,
                 {"tfopt.reconciled": f"process {run.data.tags['tfopt.pid']} was gone"})
        end_run(mlflow, run.info.run_id, "KILLED")
        marked.append({"run_id": run.info.run_id, "name": run.info.run_name or "",
                       "flow_run_id": run.data.tags.get("prefect.flow_run_id", "")})
    return marked


def log_file(run: TrackedRun, path: Path, artifact_path: str | None = None) -> None:
    """Upload a file or folder to the run's artifacts."""
    log_artifact(run.client, run.run_id, path, artifact_path)


def log_dataset(run: TrackedRun, dataset: DatasetArtifact) -> None:
    """Examples per split, shards and skipped records, the manifest, and the run's input.

    The input fills MLflow's Datasets panel: source folder, manifest digest, counts.
    """
    log_metrics(run.client, run.run_id, {
        **{f"dataset_{split}_examples": info.examples for split, info in dataset.splits.items()},
        "dataset_shards": dataset.shards,
        "dataset_skipped_records": dataset.skipped_records,
    })
    log_file(run, dataset.manifest_path, "dataset")
    digest = hashlib.sha256(dataset.manifest_path.read_bytes()).hexdigest()[:16]
    profile = {"classes": dataset.num_classes, "shards": dataset.shards,
               "skipped_records": dataset.skipped_records,
               **{f"{split}_examples": info.examples for split, info in dataset.splits.items()}}
    entity = Dataset(name=dataset.root.name, digest=digest, source_type="local",
                     source=json.dumps({"uri": str(dataset.root)}), profile=json.dumps(profile))
    inputs = [DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")])]
    try:
        with_retries(lambda: run.client.log_inputs(run.run_id, datasets=inputs))
    except MlflowException as error:
        # The server looks a data set up, then inserts it: two runs logging the same data set at
        # once (PostgreSQL store) both insert, one fails. Logged again, it is found and linked.
        if "already exists" not in str(error):
            raise
        with_retries(lambda: run.client.log_inputs(run.run_id, datasets=inputs))


def describe_run(run: TrackedRun, markdown: str) -> None:
    """Set the run's description (the MLflow UI's Description box), cut to MLflow's limit."""
    note = markdown if len(markdown) <= _TAG_VALUE_LIMIT else (
        markdown[: _TAG_VALUE_LIMIT - 60] + "\n\n... (cut; the whole report is in report/)")
    set_tags(run.client, run.run_id, {"mlflow.note.content": note})


def log_sweep(run: TrackedRun, sweep: BatchSweepResult, training_batch_size: int) -> None:
    """The batch-size sweep as curves over the batch size, its rule, plot and the batch used."""
    now = int(time.time() * 1000)
    log_metric_points(run.client, run.run_id, (
        Metric(name, value, now, point.batch_size)
        for point in sweep.points
        for name, value in (("sweep_examples_per_s", point.examples_per_s),
                            ("sweep_step_ms", point.step_ms),
                            ("sweep_peak_extra_mb", point.peak_extra_mb))
    ))
    if sweep.plot_path:
        log_file(run, sweep.plot_path, "report")
    log_params(run.client, run.run_id, {
        "batch_sweep.rule": sweep.rule, "training_batch_size": training_batch_size,
    })


def log_input_pipeline(run: TrackedRun, pipeline: InputPipelineResult) -> None:
    """Naive, tuned and cached reader throughput, and the cache rule's decision."""
    log_metrics(run.client, run.run_id, {
        "input_naive_examples_per_s": pipeline.naive_examples_per_s,
        "input_tuned_examples_per_s": pipeline.tuned_examples_per_s,
        "input_cached_examples_per_s": pipeline.cached_examples_per_s,
        "input_tuned_speedup": pipeline.tuned_examples_per_s / pipeline.naive_examples_per_s,
        "chosen_batch_size": pipeline.chosen_batch_size,
    })
    log_params(run.client, run.run_id, {
        "input.cache_decision": f"{pipeline.cache_mode}: {pipeline.cache_reason}",
    })


def log_layout(run: TrackedRun, layout: LayoutResult) -> None:
    """NHWC and NCHW training throughput and which was faster on this device."""
    log_metrics(run.client, run.run_id, {
        "layout_nhwc_examples_per_s": layout.nhwc_examples_per_s,
        **({"layout_nchw_examples_per_s": layout.nchw_examples_per_s}
           if layout.nchw_examples_per_s else {}),
    })
    log_params(run.client, run.run_id, {
        "layout.faster": layout.faster, "layout.device": layout.device, "layout.note": layout.note,
    })


def log_training(run: TrackedRun, model: ModelArtifact) -> None:
    """The baseline's per-epoch curves (``train_<name>``), final metrics and build params."""
    log_metric_history(run.client, run.run_id, {
        f"train_{name}": values for name, values in model.history.items()
    })
    log_metrics(run.client, run.run_id, model.metrics)
    log_params(run.client, run.run_id, {model.name: model.params})


def log_model_facts(run: TrackedRun, facts: ModelFacts) -> None:
    """What the baseline's model was found to be (``model_facts.kind``, ``.channels`` ...)."""
    log_params(run.client, run.run_id, {"model_facts": facts.params()})


def log_technique(run: TrackedRun, model: ModelArtifact) -> None:
    """A technique's metrics and curves, prefixed with the model's name (``pruned-80.``)."""
    log_metrics(run.client, run.run_id,
                {f"{model.name}.{key}": value for key, value in model.metrics.items()})
    log_metric_history(run.client, run.run_id, {
        f"{model.name}.train_{key}": values for key, values in model.history.items()
    })


def log_variants(
    run: TrackedRun,
    results: list[VariantResult],
    sources: Mapping[str, ModelArtifact],
    tags: Mapping[str, str],
    mlflow_models: Mapping[str, Path] | None = None,
) -> dict[str, str]:
    """A child run per variant, with the params and metrics of the model it was made from.

    A variant packaged in `mlflow_models` is logged as that MLflow Model, so it loads with
    ``mlflow.pyfunc.load_model("runs:/<child run>/model")``; others as their file.

    Returns:
        Variant name to child run id.
    """
    run_ids = {}
    for result in results:
        source = sources.get(result.source)
        run_ids[result.name] = log_variant_run(
            run.client, run.experiment_id, run.run_id, result, tags=tags,
            source_params=source.params if source else None,
            source_metrics=source.metrics if source else None,
            mlflow_model=(mlflow_models or {}).get(result.name),
        )
    return run_ids


def log_champion(
    run: TrackedRun, champion: str, child_run_id: str, model_name: str | None,
    version_tags: Mapping[str, str] | None = None, description: str = "",
) -> dict[str, Any] | None:
    """Tag the run with its champion; register the champion's model as `model_name` if given.

    Args:
        run: The pipeline's run.
        champion: The champion variant's name.
        child_run_id: Its child run.
        model_name: The registered model (None: do not register).
        version_tags: The new version's tags (variant, runtime, figures, provenance).
        description: The new version's description (why it won).

    Returns:
        The registered model's name, version, alias and URI (None when not registered).
    """
    set_tags(run.client, run.run_id, {"tfopt.champion": champion})
    if model_name is None:
        return None
    version = register_champion(run.client, model_name, child_run_id, tags=version_tags,
                                description=description)
    return {"name": model_name, "version": version, "alias": "champion",
            "uri": f"models:/{model_name}@champion"}


def _finished_runs_of(run: TrackedRun, config_name: str, limit: int = 50) -> list[Any]:
    """The experiment's finished pipeline runs of `config_name` other than `run`, newest first."""
    found = with_retries(lambda: run.client.search_runs(
        [run.experiment_id],
        filter_string=(f"tags.`tfopt.config` = '{config_name}' and tags.`tfopt.role` = "
                       "'pipeline' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=limit + 1))
    return [each for each in found if each.info.run_id != run.run_id][:limit]


def previous_summary(run: TrackedRun, config_name: str, scratch: Path) -> dict[str, Any] | None:
    """The summary JSON of the last finished run of the same config, or None (first run).

    A run whose summary cannot be read (deleted artifacts) is passed over for the one before.
    """
    for earlier in _finished_runs_of(run, config_name, limit=5):
        try:
            local = download_run_artifacts(run.tracking_uri, earlier.info.run_id,
                                           "report/summary.json", scratch / earlier.info.run_id)
            return json.loads(local.read_text())
        except (MlflowException, OSError, ValueError):
            continue
    return None


def champion_history(run: TrackedRun, config_name: str) -> list[dict[str, Any]]:
    """The champion's p50 and accuracy of the config's earlier finished runs, oldest first."""
    points = []
    for earlier in reversed(_finished_runs_of(run, config_name)):
        metrics = earlier.data.metrics
        if "champion_p50_ms" in metrics:
            points.append({"run_id": earlier.info.run_id,
                           "start_time": earlier.info.start_time,
                           "champion": earlier.data.tags.get("tfopt.champion", ""),
                           "p50_ms": metrics["champion_p50_ms"],
                           "accuracy": metrics.get("champion_accuracy")})
    return points


def log_comparison(run: TrackedRun, since: dict[str, Any] | None,
                   champion: dict[str, Any] | None) -> None:
    """Tag the run with its regressions since the last run; log its champion's figures.

    ``tfopt.regression`` is ``true`` when a variant got slower or less accurate beyond the
    noise or started failing (``tfopt.regression.variants`` names them), else ``false``;
    ``champion_p50_ms`` and ``champion_accuracy`` are what the next run's history plots.
    """
    regressions = (since or {}).get("regressions") or []
    set_tags(run.client, run.run_id, {
        "tfopt.regression": "true" if regressions else "false",
        **({"tfopt.regression.variants": ", ".join(sorted({r["variant"] for r in regressions}))
            [:5000]} if regressions else {}),
    })
    if champion and champion.get("latency_ms", {}).get("p50") is not None:
        log_metrics(run.client, run.run_id, {
            "champion_p50_ms": champion["latency_ms"]["p50"],
            **({"champion_accuracy": champion["accuracy"]}
               if champion.get("accuracy") is not None else {})})
