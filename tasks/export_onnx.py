"""Export a SavedModel to ONNX with tf2onnx and check it against the SavedModel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from prefect import task

from tasks.input_pipeline import load_split
from tasks.runners import OnnxRunner, SavedModelRunner, predict_batched, softmax
from tfopt.artifacts import DatasetArtifact, ModelArtifact, VariantSpec
from tfopt.config import ConvertConfig
from tfopt.logs import step_logger
from tfopt.serving import SIGNATURE_KEY, write_labels
from tfopt.variants import built

CHECK_EXAMPLES = 256


class OnnxMismatchError(RuntimeError):
    """The ONNX model's outputs differ from the SavedModel's beyond the tolerance."""


def run_tf2onnx(savedmodel_dir: Path, output: Path, opset: int) -> None:
    """Convert the SavedModel's serving signature to ONNX in a separate process.

    Raises:
        RuntimeError: tf2onnx failed; the message holds the end of its log.
    """
    tmp = output.with_name(f".{output.name}.tmp")
    command = [
        sys.executable, "-m", "tf2onnx.convert",
        "--saved-model", str(savedmodel_dir), "--signature_def", SIGNATURE_KEY,
        "--opset", str(opset), "--output", str(tmp),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"tf2onnx failed ({completed.returncode}): {completed.stderr[-2000:]}")
    tmp.replace(output)


def max_probability_difference(
    reference: np.ndarray, candidate: np.ndarray
) -> tuple[float, float]:
    """Largest absolute difference of softmax outputs, and the share of equal top-1 classes."""
    ref, cand = softmax(reference), softmax(candidate)
    return (
        float(np.max(np.abs(ref - cand))),
        float(np.mean(np.argmax(ref, 1) == np.argmax(cand, 1))),
    )


@task(name="export_onnx", tags=["export"])
def export_onnx(
    savedmodel: ModelArtifact,
    variant: VariantSpec,
    dataset: DatasetArtifact,
    cfg: ConvertConfig,
    out_dir: Path,
) -> VariantSpec:
    """Write ``<source>.onnx`` from the serving signature and check it with ONNX Runtime.

    The check runs both models on real test examples (a batch of several, so the dynamic batch
    dimension is exercised) and requires the probabilities to agree within ``cfg.onnx_atol``.

    Args:
        savedmodel: The exported SavedModel (left unchanged).
        variant: The planned ONNX variant.
        dataset: Source of the check inputs (test split).
        cfg: Opset and tolerance.
        out_dir: Folder to write into.

    Returns:
        The ONNX variant, with the measured difference in its params.

    Raises:
        OnnxMismatchError: The outputs disagree beyond the tolerance.
    """
    logger = step_logger()
    path = out_dir / f"{savedmodel.name}.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_labels(out_dir, dataset.class_names)
    run_tf2onnx(savedmodel.path, path, cfg.onnx_opset)
    images, _ = load_split(dataset, "test", CHECK_EXAMPLES, savedmodel.input_scale)
    reference = predict_batched(SavedModelRunner(savedmodel.path), images, 32)
    candidate = predict_batched(OnnxRunner(path), images, 32)
    max_diff, agreement = max_probability_difference(reference, candidate)
    logger.info("ONNX vs SavedModel on %d test inputs: max |Δp| %.2e, top-1 agreement %.4f",
                len(images), max_diff, agreement)
    if max_diff > cfg.onnx_atol:
        raise OnnxMismatchError(
            f"ONNX differs from the SavedModel by {max_diff:.3e} > onnx_atol {cfg.onnx_atol}"
        )
    return built(variant, path, opset=cfg.onnx_opset, check_max_abs_diff=max_diff,
                 check_examples=len(images))
