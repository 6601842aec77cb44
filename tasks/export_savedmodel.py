"""Export a Keras model as a SavedModel with a named, dynamic-batch serving signature."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tensorflow as tf
from prefect import task

from tasks.keras_models import load_keras_model
from tfopt.artifacts import ModelArtifact
from tfopt.fileio import replace_dir, staging_dir_for
from tfopt.serving import (
    INPUT_NAME,
    OUTPUT_LOGITS,
    OUTPUT_PROBABILITIES,
    SIGNATURE_KEY,
    write_labels,
)


def save_serving_savedmodel(
    keras_model: tf.keras.Model, image_size: int, final: Path, class_names: Sequence[str] = ()
) -> None:
    """Save `keras_model` as a SavedModel with the fixed serving signature, atomically.

    The signature takes ``images`` (float32 ``[batch, size, size, 3]``, any batch) and returns
    ``logits`` and ``probabilities``: fixed names that serving systems and converters
    (TFLite, tf2onnx, TensorRT via ONNX) can rely on. The class order goes with it, as
    ``assets/labels.txt``.
    """

    @tf.function(
        input_signature=[tf.TensorSpec([None, image_size, image_size, 3], tf.float32, INPUT_NAME)]
    )
    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = keras_model(images, training=False)
        return {OUTPUT_LOGITS: logits, OUTPUT_PROBABILITIES: tf.nn.softmax(logits)}

    module = tf.Module()
    module.model = keras_model
    module.serve = serve
    staging = staging_dir_for(final)
    tf.saved_model.save(module, str(staging), signatures={SIGNATURE_KEY: serve})
    if class_names:
        write_labels(staging / "assets", class_names)
    replace_dir(staging, final)


@task(name="export_savedmodel", tags=["export"])
def export_savedmodel(model: ModelArtifact, out_dir: Path) -> ModelArtifact:
    """Write ``<name>-savedmodel/`` with the ``serving_default`` signature.

    Args:
        model: A Keras model artifact (left unchanged).
        out_dir: Folder to write into.

    Returns:
        The SavedModel artifact.
    """
    final = out_dir / f"{model.name}-savedmodel"
    save_serving_savedmodel(load_keras_model(model.path), model.image_size, final,
                            model.class_names)
    return model.model_copy(update={"path": final, "format": "savedmodel"})
