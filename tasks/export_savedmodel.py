"""Export a Keras model as a SavedModel with a named, dynamic-batch serving signature."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    save_serving_function(keras_model, lambda images: keras_model(images, training=False),
                          image_size, final, class_names)


def save_serving_function(
    holder: object, logits_of: Callable[[tf.Tensor], tf.Tensor], image_size: int, final: Path,
    class_names: Sequence[str] = (),
) -> None:
    """Save ``logits_of(images)`` with the fixed serving signature as a SavedModel, atomically.

    Args:
        holder: What owns the variables `logits_of` reads (a Keras model, a loaded SavedModel).
        logits_of: Float32 images ``[batch, S, S, 3]`` to logits ``[batch, classes]``.
        image_size: S.
        final: The SavedModel folder to write.
        class_names: The class order, written as ``assets/labels.txt``.
    """

    @tf.function(
        input_signature=[tf.TensorSpec([None, image_size, image_size, 3], tf.float32, INPUT_NAME)]
    )
    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = tf.cast(logits_of(images), tf.float32)
        return {OUTPUT_LOGITS: logits, OUTPUT_PROBABILITIES: tf.nn.softmax(logits)}

    module = tf.Module()
    module.model = holder
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
