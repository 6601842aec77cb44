"""An MLflow pyfunc model that serves an OpenVINO model (``model.xml`` + ``model.bin``).

MLflow copies this file into every OpenVINO variant's model folder ("models from code"), so
loading the model needs numpy, MLflow and openvino, not tfopt: it imports nothing from tfopt on
purpose. Inputs are float32 images ``[N, H, W, C]``, as every variant of a run takes them, or a
model of array data's inputs by name (every output answered by its name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel


class OpenVINOModel(PythonModel):
    """The model compiled for the CPU; `predict` returns its ``output`` tensor as float32."""

    def load_context(self, context: Any) -> None:
        """Compile the logged model folder's ``model.xml`` (and ``model.bin``) for the CPU."""
        import openvino as ov

        config = context.model_config or {}
        settings: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if config.get("precision_hint"):
            settings["INFERENCE_PRECISION_HINT"] = config["precision_hint"]
        core = ov.Core()
        model = core.read_model(str(Path(context.artifacts["model"]) / "model.xml"))
        self._compiled = core.compile_model(model, "CPU", settings)
        names = [port.get_names() for port in self._compiled.outputs]
        wanted = config.get("output")
        self._output = next((i for i, found in enumerate(names) if wanted in found), 0)

    # No type hint on model_input: MLflow reads it as a schema and would warn on any hint that
    # is not list[...]; the logged tensor signature is the schema.
    def predict(self, context, model_input, params=None):
        """Run a float32 batch ``[N, H, W, C]`` and return the float32 outputs.

        Named inputs (a dict) answer every output by name.
        """
        if isinstance(model_input, dict):
            ports = {port.get_any_name(): (index, port.get_element_type().to_dtype())
                     for index, port in enumerate(self._compiled.inputs)}
            answers = self._compiled.create_infer_request().infer({
                ports[name][0]: np.ascontiguousarray(values, dtype=ports[name][1])
                for name, values in model_input.items()})
            return {port.get_any_name(): np.array(answers[index])
                    for index, port in enumerate(self._compiled.outputs)}
        images = np.asarray(model_input, dtype=np.float32)
        return np.array(self._compiled.create_infer_request().infer({0: images})[self._output])


set_model(OpenVINOModel())
