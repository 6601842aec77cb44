"""An MLflow pyfunc model that serves a SavedModel's signature by its inputs' names.

For a model of array data (named inputs of any shape and type, every output answered by its
name), which MLflow's TensorFlow flavor does not serve: it calls a module on one tensor. MLflow
copies this file into the model folder ("models from code"), so loading the model needs numpy,
MLflow and TensorFlow, not tfopt: it imports nothing from tfopt on purpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel


class SavedModelSignature(PythonModel):
    """The SavedModel's ``signature`` (from the model config); `predict` takes a dict."""

    def load_context(self, context: Any) -> None:
        """Load the logged SavedModel folder and pick its signature."""
        import tensorflow as tf

        self._tf = tf
        self._loaded = tf.saved_model.load(context.artifacts["savedmodel"])
        self._signature = self._loaded.signatures[(context.model_config or {})["signature"]]
        self._dtypes = {name: spec.dtype for name, spec
                        in self._signature.structured_input_signature[1].items()}

    # No type hint on model_input: MLflow reads it as a schema and would warn on any hint that
    # is not list[...]; the logged tensor signature is the schema.
    def predict(self, context, model_input, params=None):
        """Call the signature on the named inputs; every output by its name."""
        answers = self._signature(**{name: self._tf.constant(np.asarray(values),
                                                             self._dtypes[name])
                                     for name, values in model_input.items()})
        return {name: value.numpy() for name, value in answers.items()}


set_model(SavedModelSignature())
