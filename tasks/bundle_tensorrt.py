"""A TensorRT-ready export bundle: ONNX, the SavedModel, and a ready trtexec command line.

TF-TRT is not part of TensorFlow >= 2.18 builds, so the path to TensorRT is ONNX: TensorRT's
`trtexec` builds an engine from ``model.onnx`` on the target machine with the shape profile
written here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prefect import task

from tfopt.artifacts import ModelArtifact, VariantSpec
from tfopt.fileio import atomic_write_text, replace_dir, staging_dir_for
from tfopt.serving import INPUT_NAME, SIGNATURE_KEY


def tftrt_unavailable_reason() -> str | None:
    """Why TF-TRT cannot run here, or None when this TensorFlow was built with TensorRT."""
    import tensorflow as tf

    if tf.sysconfig.get_build_info().get("is_tensorrt_build"):
        return None
    return (
        f"TensorFlow {tf.__version__} is not built with TensorRT (TF-TRT was removed from "
        "TensorFlow >= 2.18 builds); use the ONNX bundle with trtexec instead"
    )


def trtexec_command(image_size: int, max_batch: int) -> str:
    """The trtexec line that builds an engine with a dynamic-batch shape profile."""
    opt_batch = max(1, max_batch // 4)
    shape = f"{image_size}x{image_size}x3"
    return (
        "trtexec --onnx=model.onnx --saveEngine=model.plan "
        f"--minShapes={INPUT_NAME}:1x{shape} --optShapes={INPUT_NAME}:{opt_batch}x{shape} "
        f"--maxShapes={INPUT_NAME}:{max_batch}x{shape} --fp16"
    )


@task(name="bundle_tensorrt", tags=["export"])
def bundle_tensorrt(
    savedmodel: ModelArtifact, onnx: VariantSpec, max_batch: int, out_dir: Path
) -> Path:
    """Assemble ``<name>-tensorrt-bundle/`` for building a TensorRT engine elsewhere.

    Args:
        savedmodel: The SavedModel the ONNX file came from.
        onnx: The checked ONNX variant.
        max_batch: Largest batch of the engine's shape profile.
        out_dir: Folder to create the bundle in.

    Returns:
        The bundle folder: ``model.onnx``, ``saved_model/``, ``trtexec.sh``, ``bundle.json``.
    """
    final = out_dir / f"{savedmodel.name}-tensorrt-bundle"
    staging = staging_dir_for(final)
    staging.mkdir()
    shutil.copy2(onnx.path, staging / "model.onnx")
    shutil.copytree(savedmodel.path, staging / "saved_model")
    command = trtexec_command(savedmodel.image_size, max_batch)
    atomic_write_text(
        staging / "trtexec.sh",
        "#!/usr/bin/env bash\n# Build a TensorRT engine from model.onnx on a machine with "
        "TensorRT.\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n" + command + "\n",
    )
    (staging / "trtexec.sh").chmod(0o755)
    atomic_write_text(staging / "bundle.json", json.dumps({
        "onnx": "model.onnx",
        "saved_model": "saved_model",
        "signature": SIGNATURE_KEY,
        "input": {"name": INPUT_NAME, "dtype": "float32",
                  "shape": [-1, savedmodel.image_size, savedmodel.image_size, 3]},
        "outputs": ["logits", "probabilities"],
        "opset": onnx.params.get("opset"),
        "onnx_vs_savedmodel_max_abs_diff": onnx.params.get("check_max_abs_diff"),
        "trtexec": command,
        "tftrt": tftrt_unavailable_reason() or "available",
    }, indent=2) + "\n")
    replace_dir(staging, final)
    return final
