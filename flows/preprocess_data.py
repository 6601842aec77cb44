"""Preprocessing alone: shard a data folder into TFRecords with a manifest, cached by content."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.common import sharded_data
from flows.parameters import PreprocessConfig
from tfopt import tracking
from tfopt.orchestration import claim_flow_run
from tfopt.preflight import check_paths
from tfopt.provenance import mlflow_tracking_uri
from tfopt.report.summary import dataset_entry


@flow(name="preprocess_data", flow_run_name="preprocess-{config.name}", log_prints=True)
def preprocess_data(config: PreprocessConfig = PreprocessConfig()) -> dict[str, Any]:  # noqa: B008
    """Shard a folder of labelled images (or TFRecords) into TFRecord files with a manifest.

    An unchanged folder with unchanged settings is a cache hit (no file is read again); a run
    that stopped half-way resumes from the shards already written. The manifest is logged to
    MLflow.

    Args:
        config: The data folder, its splits and sharding, and the work folder.

    Returns:
        The ``dataset`` block of the run summary, with the MLflow run id and the shard folder.
    """
    claim_flow_run()
    tracking.use_retry_seconds(config.services.retry_seconds)
    check_paths(config)
    work_dir = config.work_dir.resolve()
    with tracking.tracked_run(
        mlflow_tracking_uri(), config.experiment, f"preprocess-{config.name}",
        params=config.model_dump(mode="json"),
        tags={"prefect.flow_run_id": str(flow_run.id), "tfopt.role": "preprocess"},
    ) as run:
        dataset = sharded_data(config.data, work_dir, config.scale)
        tracking.log_dataset(run, dataset)
    summary = {**dataset_entry(dataset), "root": str(dataset.root),
               "mlflow_run_id": run.run_id, "prefect_flow_run_id": str(flow_run.id)}
    create_markdown_artifact(
        key="tfopt-dataset",
        markdown=(
            f"# {config.name}: {dataset.shards} shards in `{dataset.root}`\n\n"
            f"train {summary['train_examples']}, select {summary['select_examples']}, val "
            f"{summary['val_examples']}, test {summary['test_examples']} examples; "
            f"{dataset.skipped_records} skipped.\n\n"
            f"**MLflow run:** [{run.run_id}]({run.url})"
        ),
        description="Shards and manifest, with a link to the MLflow run",
    )
    get_run_logger().info("%d shards in %s", dataset.shards, dataset.root)
    return summary
