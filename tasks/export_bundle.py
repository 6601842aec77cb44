"""Prefect task: a runtime's export bundle (e.g. TensorRT's ONNX + trtexec line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from tfopt.native import run_native
from tfopt.runtimes import BUNDLE_STEP, export_bundle_here
from tfopt.runtimes.base import BuildSources


@task(name="export_bundle", task_run_name="bundle-{runtime}", tags=["export"])
def export_bundle(runtime: str, sources: BuildSources, settings: Any, out_dir: Path) -> Path | None:
    """Assemble what a runtime ships beside the variants, for an engine built elsewhere.

    Args:
        runtime: The runtime's name (``tensorrt``: ``model.onnx``, ``saved_model/``,
            ``trtexec.sh`` with a dynamic-batch shape profile, ``bundle.json``).
        sources: The baseline, its SavedModel and its variants built so far.
        settings: The runtime's config section.
        out_dir: Folder to create the bundle in.

    Returns:
        The bundle's folder, or None when the runtime ships nothing for this model.
    """
    return run_native(BUNDLE_STEP, export_bundle_here, runtime, sources, settings, out_dir)
