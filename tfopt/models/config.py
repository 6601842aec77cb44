"""The ``model`` section: which model is the baseline, checked where its kinds are known.

It lives beside the models because telling a model file's kind (a Keras file, a SavedModel
folder, or a file a runtime measures as it is) asks the runtimes' registry
(`tfopt.runtimes.model_kind`), which the bottom floor (`tfopt.config`) does not import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tfopt.config import InputScale, Section
from tfopt.runtimes import model_kind

_BUILDER_PATTERN = r"^[^:]+:[A-Za-z_][A-Za-z0-9_]*$"
APPLICATION_ARCHITECTURES = ("mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
                             "efficientnet_b0", "resnet50")
"""The zoo networks tfopt/models/zoo.py builds from tf_keras.applications."""
Architecture = Literal["small_cnn", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
                       "efficientnet_b0", "resnet50"]


SETTLE_EPOCHS = 3
"""Epochs without a validation gain, once back within the budget, before a fine-tuning ends."""
COOL_DOWN_EPOCHS = 3
"""Epochs a rebuilt model's fine-tuning takes its rate to zero once back within the budget."""


class ModelConfig(Section):
    """Which model is the baseline: a zoo network, the user's trained file, or the user's code."""

    source: Literal["zoo", "file", "builder"] = Field(
        "zoo",
        description=(
            "zoo: a network of tfopt's model zoo (architecture); file: a trained tf_keras model "
            "file (path); builder: your model-building function (builder)."
        ),
    )
    path: Path | None = Field(
        None,
        description=(
            "source=file: a trained model: a Keras .keras, .h5 or .hdf5 file (tf_keras or "
            "Keras 3: goes through everything), a SavedModel folder, a .tflite or an .onnx "
            "file (docs/own-models.md: what each kind gets)."
        ),
    )
    builder: str | None = Field(
        None, pattern=_BUILDER_PATTERN,
        description=(
            'source=builder: "my_model.py:build" (a file) or "my_package.models:build" (a '
            "module), a function (image_size, num_classes) -> uncompiled tf_keras.Model."
        ),
    )
    architecture: Architecture = Field(
        "small_cnn",
        description=(
            "source=zoo: the network. small_cnn is written in tfopt; the others are "
            "tf_keras.applications built with weights=None (nothing is downloaded; images of "
            "at least 32x32)."
        ),
    )
    weights: Path | None = Field(
        None,
        description=(
            "source=zoo: a local weights file to start from (an application's feature "
            "extractor, e.g. an ImageNet 'no top' .h5; small_cnn: save_weights of the same "
            "network)."
        ),
    )
    width: int = Field(32, ge=4, le=256, description="Filters in small_cnn's first convolution.")
    alpha: float = Field(0.35, gt=0.0, le=2.0, description="The MobileNets' width multiplier.")
    data_format: Literal["channels_last", "channels_first"] = Field(
        "channels_last", description="source=zoo: layout inside the model, NHWC or NCHW."
    )
    input_scale: InputScale = Field(
        "unit",
        description=(
            "Pixels the model expects: unit (0..1), symmetric (-1..1) or raw (0..255, for "
            "models with their own rescaling layer); applied in training, calibration and "
            "benchmark inputs alike."
        ),
    )
    head: Literal["keep", "replace"] = Field(
        "keep",
        description=(
            "source=file or builder, Keras models: keep the model's classification layer, or "
            "replace it with a new one for the data's classes (a pretrained network on your "
            "classes): the new head trains alone for train.head_epochs, then everything for "
            "train.epochs."
        ),
    )

    @property
    def kind(self) -> str:
        """The kind of model the baseline is (a zoo network or a builder's is a Keras model)."""
        return model_kind(self.path) if self.source == "file" and self.path else "keras"

    @property
    def label(self) -> str:
        """The model's name in run names: the zoo network, the file's or the builder's name."""
        if self.source == "file" and self.path is not None:
            return self.path.stem or self.path.name
        if self.source == "builder" and self.builder:
            module, _, function = self.builder.partition(":")
            stem = Path(module).stem if module.endswith(".py") else module.rsplit(".", 1)[-1]
            return f"{stem}-{function}"
        return self.architecture

    @model_validator(mode="after")
    def _source_has_what_it_needs(self) -> ModelConfig:
        if self.source == "file" and self.path is None:
            raise ValueError("model.source=file needs model.path (a .keras, .h5, .hdf5, .tflite or "
                             ".onnx file or a SavedModel folder)")
        if self.source == "file":
            model_kind(self.path)
        if self.source == "builder" and not self.builder:
            raise ValueError('model.source=builder needs model.builder ("file.py:function")')
        if self.source != "file" and self.path is not None:
            raise ValueError(f"model.path is used with model.source=file, not {self.source}")
        if self.source != "builder" and self.builder:
            raise ValueError(f"model.builder is used with model.source=builder, not {self.source}")
        if self.source != "zoo" and self.weights is not None:
            raise ValueError(f"model.weights is used with model.source=zoo, not {self.source}")
        if self.head == "replace" and self.source == "zoo":
            raise ValueError("model.head: replace is for a model you bring (model.source=file "
                             "or builder); zoo networks are built for the data's classes")
        if self.head == "replace" and self.kind != "keras":
            raise ValueError(f"model.head: replace needs a Keras model to train; model.path is "
                             f"a {self.kind} model")
        return self
