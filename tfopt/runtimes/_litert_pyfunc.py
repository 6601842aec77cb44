"""An MLflow pyfunc model that serves a ``.tflite`` file with LiteRT.

MLflow copies this file into every TFLite variant's model folder ("models from code"), so
loading the model needs numpy, MLflow and ai-edge-litert, not tfopt. It imports nothing from
tfopt on purpose. Inputs are float32 images as the model's float variants take them, or a
model of array data's inputs by name (every output answered by its name); a model with integer
input and output is quantized and dequantized here with its own scales, so every variant of a
run answers the same request with comparable outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel


class TFLiteModel(PythonModel):
    """The model's serving signature; `predict` returns its ``output`` tensor as float32."""

    def load_context(self, context: Any) -> None:
        """Open the interpreter on the logged ``.tflite`` artifact."""
        from ai_edge_litert.interpreter import Interpreter

        config = context.model_config or {}
        interpreter = Interpreter(model_path=context.artifacts["tflite"],
                                  num_threads=int(config.get("threads", 1)))
        self._runner = interpreter.get_signature_runner(config.get("signature"))
        inputs = self._runner.get_input_details()
        outputs = self._runner.get_output_details()
        self._input_name = config.get("input") if config.get("input") in inputs else next(
            iter(inputs))
        self._output_name = config.get("output") if config.get("output") in outputs else next(
            iter(outputs))
        self._input = inputs[self._input_name]
        self._output = outputs[self._output_name]

    # No type hint on model_input: MLflow reads it as a schema and would warn on any hint that
    # is not list[...]; the logged tensor signature is the schema.
    def predict(self, context, model_input, params=None):
        """Run a float32 batch ``[N, H, W, C]`` and return the float32 outputs.

        Named inputs (a dict) answer every output by name.
        """
        if isinstance(model_input, dict):
            inputs, outputs = self._runner.get_input_details(), self._runner.get_output_details()
            answers = self._runner(**{name: _quantize(np.asarray(values), inputs[name])
                                      for name, values in model_input.items()})
            return {name: _dequantize(values, outputs[name]) for name, values in answers.items()}
        images = np.asarray(model_input, dtype=np.float32)
        outputs = self._runner(**{self._input_name: _quantize(images, self._input)})
        return _dequantize(outputs[self._output_name], self._output)


def _quantize(values: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if detail["dtype"] == np.float32 or not scale:  # a float, or an integer taken as it is
        return values.astype(detail["dtype"], copy=False)
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(values / scale + zero_point), info.min, info.max).astype(
        detail["dtype"])


def _dequantize(values: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if values.dtype == np.float32 or not scale:
        return values
    return (values.astype(np.float32) - zero_point) * scale


set_model(TFLiteModel())
