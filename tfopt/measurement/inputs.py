"""The benchmark's inputs: the test split decoded once, the float model's outputs on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tfopt.artifacts import BenchmarkInputs, DatasetArtifact, VariantSpec
from tfopt.config import BenchmarkConfig, InputScale
from tfopt.data.pipeline import load_split
from tfopt.fileio import atomic_write_json
from tfopt.measurement.floor import build_floor_models
from tfopt.runtimes import load_runner
from tfopt.runtimes.base import predict_batched

INPUTS_INDEX = "inputs.json"
INPUTS_ARTIFACT = "benchmark-inputs"
"""Where a pipeline's MLflow run keeps its benchmark inputs (`BenchmarkConfig.share_inputs`)."""


def _save_array(path: Path, values: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.npy")
    np.save(tmp, values)
    tmp.replace(path)


def prepare_inputs(reference: VariantSpec | None, dataset: DatasetArtifact, out_dir: Path,
                   batch_size: int, input_scale: InputScale) -> BenchmarkInputs:
    """Save the decoded test split and the reference model's logits on it (see the task).

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
        floor_models=build_floor_models(images.shape[1:], out_dir / "harness-floor")
        if images.ndim == 4 and images.shape[1] == images.shape[2] else {},
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
