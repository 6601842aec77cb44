"""Prefect task: build one planned variant with its runtime (a conversion, an export, a copy)."""

from __future__ import annotations

from typing import Any

from prefect import task

from tfopt.artifacts import VariantSpec
from tfopt.native import run_native
from tfopt.runtimes import build_here, build_step
from tfopt.runtimes.base import BuildSources


@task(name="build_variant", task_run_name="build-{spec.name}", tags=["conversion"])
def build_variant(spec: VariantSpec, sources: BuildSources, settings: Any) -> VariantSpec:
    """Convert a model into one planned variant with the runtime that measures its format.

    TFLite files are converted from the serving SavedModel (int8 calibrated on training
    images), ONNX is exported with tf2onnx and checked against the SavedModel, and so on for
    each runtime (see `tfopt.runtimes`). The model itself is never changed.

    Args:
        spec: The planned variant (its name, source, format, precision and form).
        sources: The model, its SavedModel, the data set, the output folder and the variants
            of the same model built before (a quantized ONNX file needs the float one).
        settings: The runtime's config section.

    Returns:
        The variant, built; or skipped or failed when the conversion itself decides so (e.g.
        selective int8 when full int8 is within the accuracy budget).
    """
    return run_native(build_step(spec), build_here, spec, sources, settings)
