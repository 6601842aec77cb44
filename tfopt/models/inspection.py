"""What the baseline's model is, checked against the data before anything is trained on it.

The model's kind, the Keras that builds it, its image channels (which the readers decode to),
what its output is (logits, or a softmax tfopt looks behind) and, with ``model.head: replace``,
the classification layer it swaps out. Every refusal names the field and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfopt.artifacts import ModelFacts
from tfopt.models.config import ModelConfig
from tfopt.models.importing import inspect_model_file
from tfopt.models.keras_io import flavor_of
from tfopt.models.sources import baseline_factory
from tfopt.native import NativeStep

INSPECT_STEP = NativeStep("inspect_model",
                          "the model opened or built by TensorFlow to find what it is")


def inspect_model(model_cfg: ModelConfig, image_size: int,
                  class_names: Sequence[str]) -> ModelFacts:
    """Make or open the configured model once and check it against the data.

    A zoo network is built by tfopt for the data (RGB, logits) and is not opened here.

    Raises:
        ModelSourceError: The model cannot be made or opened, or does not fit the data.
    """
    if model_cfg.source == "zoo":
        return ModelFacts(kind="keras", keras="tf_keras")
    if model_cfg.kind != "keras":
        return inspect_model_file(Path(str(model_cfg.path)), image_size, class_names)
    maker = baseline_factory(model_cfg, image_size, len(class_names), class_names)
    return ModelFacts(kind="keras", keras=flavor_of(maker()), channels=maker.channels,
                      output=maker.output_kind, head_replaced=maker.head_replaced)
