"""Uniform `predict(batch) -> logits` wrappers around every inference backend. Not a task.

The benchmark and the agreement checks call these, so every backend is fed the same numpy
inputs and judged by the same code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import tensorflow as tf

from tasks.export_savedmodel import INPUT_NAME, OUTPUT_LOGITS, SIGNATURE_KEY
from tasks.train_model import load_keras_model
from tfopt.artifacts import VariantFormat


class Runner(Protocol):
    """Runs a model on a float32 batch ``[N, S, S, 3]`` and returns logits ``[N, classes]``."""

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Return the model's logits for `images`."""
        ...


class GraphRunner:
    """A Keras model traced into a TensorFlow graph with `tf.function`."""

    def __init__(self, path: Path, jit_compile: bool = False) -> None:
        model = load_keras_model(path)
        self._call = tf.function(lambda images: model(images, training=False),
                                 jit_compile=jit_compile, reduce_retracing=True)

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Run the traced model."""
        return self._call(tf.constant(images)).numpy()


class SavedModelRunner:
    """The ``serving_default`` signature of a reloaded SavedModel."""

    def __init__(self, path: Path) -> None:
        self._signature = tf.saved_model.load(str(path)).signatures[SIGNATURE_KEY]

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Call the serving signature."""
        return self._signature(**{INPUT_NAME: tf.constant(images)})[OUTPUT_LOGITS].numpy()


class TFLiteRunner:
    """The LiteRT interpreter (``ai_edge_litert``), resizing its input to each batch size."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self._interpreter = Interpreter(model_path=str(path), num_threads=threads)
        self._interpreter.allocate_tensors()
        self._input = self._interpreter.get_input_details()[0]
        outputs = self._interpreter.get_output_details()
        self._output = next((o for o in outputs if OUTPUT_LOGITS in o["name"]), outputs[0])
        self._batch = int(self._input["shape"][0])

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Quantize the input if the model wants integers, invoke, dequantize the output."""
        if len(images) != self._batch:
            self._interpreter.resize_tensor_input(self._input["index"], list(images.shape))
            self._interpreter.allocate_tensors()
            self._batch = len(images)
            self._output = next(
                o for o in self._interpreter.get_output_details()
                if o["index"] == self._output["index"]
            )
        self._interpreter.set_tensor(self._input["index"], _quantize(images, self._input))
        self._interpreter.invoke()
        return _dequantize(self._interpreter.get_tensor(self._output["index"]), self._output)


def _quantize(values: np.ndarray, detail: dict) -> np.ndarray:
    dtype = detail["dtype"]
    if dtype == np.float32:
        return values.astype(np.float32)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale + zero_point), info.min, info.max).astype(dtype)


def _dequantize(values: np.ndarray, detail: dict) -> np.ndarray:
    if values.dtype == np.float32:
        return values
    scale, zero_point = detail["quantization"]
    return (values.astype(np.float32) - zero_point) * scale


def load_runner(fmt: VariantFormat, path: Path, threads: int = 1) -> Runner:
    """Open a model file or folder with the runner for its format.

    Raises:
        ValueError: A format with no runner.
    """
    if fmt in ("keras", "graph"):
        return GraphRunner(path)
    if fmt == "savedmodel":
        return SavedModelRunner(path)
    if fmt == "tflite":
        return TFLiteRunner(path, threads)
    raise ValueError(f"no runner for format {fmt!r}")


def predict_batched(runner: Runner, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Run `runner` over `images` in batches and stack the logits."""
    outputs = [
        runner.predict(images[start : start + batch_size])
        for start in range(0, len(images), batch_size)
    ]
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)
