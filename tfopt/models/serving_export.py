"""A model saved as a SavedModel with tfopt's fixed serving signature.

Every conversion starts from it (TFLite, tf2onnx, OpenVINO, TensorRT via ONNX): ``images`` in,
``logits`` and ``probabilities`` out, under ``serving_default``, the class order beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tfopt.artifacts import ModelArtifact
from tfopt.fileio import replace_dir, staging_dir_for
from tfopt.native import NativeStep
from tfopt.serving import (
    INPUT_NAME,
    OUTPUT_LOGITS,
    OUTPUT_PROBABILITIES,
    SIGNATURE_KEY,
    write_labels,
)

EXPORT_STEP = NativeStep("export_savedmodel", "tracing the Keras model into a SavedModel")


def export_serving_savedmodel(model: ModelArtifact, out_dir: Path) -> ModelArtifact:
    """A Keras model's serving SavedModel, ``<name>-savedmodel`` in `out_dir`, as an artifact."""
    from tfopt.models.keras_io import load_keras_model

    final = out_dir / f"{model.name}-savedmodel"
    save_serving_savedmodel(load_keras_model(model.path), model.image_size, final,
                            model.class_names, model.channels)
    return model.model_copy(update={"path": final, "format": "savedmodel"})


def save_serving_savedmodel(keras_model: Any, image_size: int, final: Path,
                            class_names: Sequence[str] = (), channels: int = 3) -> None:
    """Save `keras_model` as a SavedModel with the fixed serving signature, atomically.

    The signature takes ``images`` (float32 ``[batch, size, size, channels]``, any batch) and
    returns ``logits`` and ``probabilities``: fixed names that serving systems and converters
    (TFLite, tf2onnx, TensorRT via ONNX) can rely on. The class order goes with it, as
    ``assets/labels.txt``.
    """
    save_serving_function(keras_model, lambda images: keras_model(images, training=False),
                          image_size, final, class_names, channels)


def save_serving_function(
    holder: object, logits_of: Callable[[Any], Any], image_size: int, final: Path,
    class_names: Sequence[str] = (), channels: int = 3,
) -> None:
    """Save ``logits_of(images)`` with the fixed serving signature as a SavedModel, atomically.

    Args:
        holder: What owns the variables `logits_of` reads (a Keras model, a loaded SavedModel).
        logits_of: Float32 images ``[batch, S, S, C]`` to logits ``[batch, classes]``.
        image_size: S.
        final: The SavedModel folder to write.
        class_names: The class order, written as ``assets/labels.txt``.
        channels: C.
    """
    import tensorflow as tf

    @tf.function(input_signature=[
        tf.TensorSpec([None, image_size, image_size, channels], tf.float32, INPUT_NAME)])
    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = tf.cast(logits_of(images), tf.float32)
        return {OUTPUT_LOGITS: logits, OUTPUT_PROBABILITIES: tf.nn.softmax(logits)}

    staging = staging_dir_for(final)
    if _is_keras3(holder):
        from keras.export import ExportArchive

        archive = ExportArchive()
        archive.track(holder)
        archive.add_endpoint(SIGNATURE_KEY, serve)
        archive.write_out(str(staging), verbose=False)
    else:
        module = tf.Module()
        module.model = holder
        module.serve = serve
        tf.saved_model.save(module, str(staging), signatures={SIGNATURE_KEY: serve})
    if class_names:
        write_labels(staging / "assets", class_names)
    replace_dir(staging, final)


def save_own_signature(keras_model: Any, final: Path,
                       output_names: Sequence[str] | None = None) -> None:
    """Save `keras_model` as a plain SavedModel serving its own inputs and outputs, atomically.

    For a model that is no image classifier (array data): ``serving_default`` takes the model's
    inputs under their own names and returns its outputs under theirs (a Keras 3 model's by
    its own ``export``: a dict's keys, else ``output_0``...; a tf_keras model's by a dict's keys,
    else its ``output_names``, or `output_names` in their order: a fine-tuned model's named as
    its baseline's).
    """
    import tensorflow as tf

    staging = staging_dir_for(final)
    if _is_keras3(keras_model):
        keras_model.export(str(staging), format="tf_saved_model", verbose=False)
    else:
        specs = [tf.TensorSpec(tensor.shape, tensor.dtype, name)
                 for tensor, name in zip(keras_model.inputs, keras_model.input_names, strict=True)]

        @tf.function(input_signature=specs)
        def serve(*inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            outputs = keras_model(list(inputs) if len(inputs) > 1 else inputs[0],
                                  training=False)
            if isinstance(outputs, dict):  # a model of named outputs keeps their names
                return outputs
            outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
            return dict(zip(output_names or keras_model.output_names, outputs, strict=True))

        module = tf.Module()
        module.model = keras_model
        module.serve = serve
        tf.saved_model.save(module, str(staging), signatures={SIGNATURE_KEY: serve})
    replace_dir(staging, final)


def _is_keras3(holder: object) -> bool:
    """Whether `holder` is a Keras 3 model (exported with Keras 3's own ExportArchive)."""
    from tfopt.models.keras_io import flavor_of

    try:
        return flavor_of(holder) == "keras3"
    except TypeError:
        return False
