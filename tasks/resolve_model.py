"""Prefect task: find a model to benchmark (a registered version, a run's variant, a file)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tfopt.artifacts import VariantSpec
from tfopt.models.references import resolve_reference
from tfopt.orchestration import retry_if_transient


@task(
    name="resolve_model",
    tags=["benchmark"],
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_if_transient,
)
def resolve_model(
    model: str, fmt: str, precision: str, tracking_uri: str, download_dir: Path
) -> VariantSpec:
    """Turn a model reference into a variant to benchmark, downloading registered models.

    Args:
        model: ``models:/<name>@<alias>``, ``models:/<name>/<version>``,
            ``runs:/<run id>/<artifact path>`` (a pipeline's variant) or a local path.
        fmt: The format, or ``auto`` to detect it (the run's ``format`` says XLA, and its
            ``runner.*`` params how to run it).
        precision: The precision, or ``auto`` (the registered run's param, else fp32).
        tracking_uri: MLflow server holding the registry.
        download_dir: Where registered models are downloaded.

    Returns:
        The variant, named after the registered version or the file.

    Raises:
        ValueError: The reference matches no model.
    """
    return resolve_reference(model, fmt, precision, tracking_uri, download_dir)
