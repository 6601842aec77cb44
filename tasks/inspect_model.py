"""Prefect task: open the configured model once and check it against the data."""

from __future__ import annotations

from prefect import task

from tfopt.artifacts import DatasetArtifact, ModelFacts
from tfopt.logs import step_logger
from tfopt.models.config import ModelConfig
from tfopt.models.importing import inspect_array_model
from tfopt.models.inspection import INSPECT_STEP
from tfopt.models.inspection import inspect_model as inspect
from tfopt.native import run_native


@task(name="inspect_model", tags=["model"])
def inspect_model(model_cfg: ModelConfig, dataset: DatasetArtifact,
                  output: str | None = None) -> ModelFacts:
    """Find what the model is and refuse one that does not fit the data, before any training.

    Its kind, the Keras that builds it (tf_keras or Keras 3), its image channels (the readers
    decode the shards to them: 1 is grayscale), what its output is (logits, or a softmax whose
    input tfopt takes as the logits) and, with ``model.head: replace``, the classification layer
    that is swapped for the data's classes. The model is opened in a child process
    (`tfopt.native`): a model that crashes TensorFlow fails this task in one line, not the run.

    With array data, its inputs are matched to the arrays by name and `output` (the one its
    metric scores; None: logits, else its first) must be one of its outputs.

    Args:
        model_cfg: Where the model comes from.
        dataset: The data's image size and classes, or its arrays.
        output: ``eval.output``.

    Returns:
        The model's facts.
    """
    facts = (run_native(INSPECT_STEP, inspect_array_model, model_cfg, dataset.arrays, output)
             if dataset.arrays else
             run_native(INSPECT_STEP, inspect, model_cfg, dataset.image_size, dataset.class_names))
    step_logger().info("model: %s", ", ".join(f"{k} {v}" for k, v in facts.params().items()))
    return facts
