"""Decode the test split once and record the float model's outputs on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prefect import task

from tasks.harness_floor import build_floor_models
from tasks.input_pipeline import load_split
from tasks.runners import load_runner, predict_batched
from tfopt.artifacts import BenchmarkInputs, DatasetArtifact, VariantSpec
from tfopt.config import BenchmarkConfig, InputScale
from tfopt.fileio import atomic_write_json

INPUTS_INDEX = "inputs.json"
INPUTS_ARTIFACT = "benchmark-inputs"
"""Where a pipeline's MLflow run keeps its benchmark inputs (`BenchmarkConfig.share_inputs`)."""


def _save_array(path: Path, values: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.npy")
    np.save(tmp, values)
    tmp.replace(path)


@task(name="prepare_benchmark_inputs", tags=["benchmark"])
def prepare_benchmark_inputs(
    reference: VariantSpec | None,
    dataset: DatasetArtifact,
    out_dir: Path,
    batch_size: int = 32,
    input_scale: InputScale = "unit",
) -> BenchmarkInputs:
    """Save the decoded test split and the reference model's logits on it as ``.npy`` files.

    Every variant is then benchmarked on the very same arrays (no decoding differences between
    runs or backends), and its agreement is measured against the same reference.

    Args:
        reference: The model whose outputs are the reference (the float baseline's SavedModel in
            the pipeline), or None: each variant is its own reference and no model is opened
            here (the benchmark-only flow opens a user's file only in its measuring process).
        dataset: The data set whose test split is the benchmark input.
        out_dir: Folder for ``test-images.npy``, ``test-labels.npy``,
            ``<name>-reference-logits.npy`` and the harness's floor models.
        batch_size: Batch size of the throughput measurement (besides batch 1).
        input_scale: The pixels the models expect (the same for every variant of a run).

    Returns:
        The files, the number of examples, and the floor models (square RGB inputs only).

    Raises:
        ValueError: The test split is empty.
    """
    images, labels = load_split(dataset, "test", scale=input_scale)
    if len(images) == 0:
        raise ValueError("the test split is empty: nothing to benchmark on")
    out_dir.mkdir(parents=True, exist_ok=True)
    reference_logits = None
    if reference is not None:
        reference_logits = out_dir / f"{reference.name}-reference-logits.npy"
        _save_array(reference_logits, predict_batched(load_runner(reference), images))
    inputs = BenchmarkInputs(
        images=out_dir / "test-images.npy",
        labels=out_dir / "test-labels.npy",
        reference_logits=reference_logits,
        examples=len(images),
        batch_size=batch_size,
        floor_models=build_floor_models(images.shape[1], out_dir / "harness-floor")
        if images.shape[1:] == (images.shape[1], images.shape[1], 3) else {},
    )
    _save_array(inputs.images, images)
    _save_array(inputs.labels, labels)
    return inputs


def write_inputs_index(inputs: BenchmarkInputs, protocol: BenchmarkConfig) -> Path:
    """Describe the inputs folder and the benchmark protocol, so another machine can repeat it.

    The pipeline logs the folder to MLflow; `read_inputs_index` on a machine that downloaded it
    gives the same arrays and the protocol the pipeline measured with. Paths are stored relative
    to the folder.

    Returns:
        The index file (in the folder of ``inputs.images``).
    """
    folder = inputs.images.parent

    def relative(path: Path) -> str:
        return str(path.relative_to(folder))

    index = {
        "images": relative(inputs.images), "labels": relative(inputs.labels),
        "reference_logits": (relative(inputs.reference_logits)
                             if inputs.reference_logits else None),
        "examples": inputs.examples, "batch_size": inputs.batch_size,
        "floor_models": {kind: relative(path) for kind, path in inputs.floor_models.items()},
        "protocol": protocol.model_dump(mode="json"),
    }
    atomic_write_json(folder / INPUTS_INDEX, index)
    return folder / INPUTS_INDEX


def read_inputs_index(folder: Path) -> tuple[BenchmarkInputs, BenchmarkConfig]:
    """The inputs and the protocol `write_inputs_index` described, found under `folder`.

    Raises:
        FileNotFoundError: `folder` holds no index (not a pipeline's benchmark inputs).
    """
    index = json.loads((folder / INPUTS_INDEX).read_text(encoding="utf-8"))
    inputs = BenchmarkInputs(
        images=folder / index["images"], labels=folder / index["labels"],
        reference_logits=folder / index["reference_logits"] if index["reference_logits"]
        else None,
        examples=index["examples"], batch_size=index["batch_size"],
        floor_models={kind: folder / path for kind, path in index["floor_models"].items()},
    )
    return inputs, BenchmarkConfig.model_validate(index["protocol"])
