"""The float model's test-split outputs: the reference every variant's agreement is measured by."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import task

from tasks.input_pipeline import load_split_arrays
from tasks.runners import SavedModelRunner, predict_batched
from tfopt.artifacts import DatasetArtifact, ModelArtifact


@task(name="compute_reference", tags=["benchmark"])
def compute_reference(savedmodel: ModelArtifact, dataset: DatasetArtifact, out_dir: Path) -> Path:
    """Run the float SavedModel over the whole test split and save its logits.

    Args:
        savedmodel: The float model of a source (e.g. the baseline).
        dataset: The data set whose test split is the benchmark input.
        out_dir: Folder for ``<name>-reference-logits.npy``.

    Returns:
        The saved array's path.
    """
    images, _ = load_split_arrays(dataset.splits["test"].files, dataset.image_size)
    logits = predict_batched(SavedModelRunner(savedmodel.path), images)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{savedmodel.name}-reference-logits.npy"
    tmp = path.with_name(f".{path.stem}.tmp.npy")
    np.save(tmp, logits)
    tmp.replace(path)
    return path
