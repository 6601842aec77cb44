"""Keras 3 models translated into tf_keras, layer by layer, for tensorflow-model-optimization.

tfmot wraps tf_keras layers only and has no Keras 3 plan (tensorflow/model-optimization#1119).
A functional or sequential Keras 3 model is rebuilt in tf_keras: each layer from its config
(cleaned of what tf_keras does not read: initializers, dtype policies, Keras 3-only options),
wired as the Keras 3 graph wires it, holding the same weights. Activations whose tf_keras
namesake computes something else, or that tf_keras lacks (``hard_sigmoid``, ``hard_swish``,
``relu6``), Keras 3 operations on tensors (``x + 3.0``, ``ops.multiply``) and layers tf_keras
computes by other kernels (nearest ``UpSampling2D``) become the TensorFlow ops tf_keras records
as layers. `verify` then compares both models' logits on real
inputs: a translation is only used once it agrees.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tfopt.models.keras_io import flavor_of, is_layer_graph, keras_module

_BASE_LAYER_KEYS = frozenset({"name", "trainable", "dtype", "dynamic", "input_dim", "input_shape",
                              "batch_input_shape", "batch_size", "weights",
                              "activity_regularizer", "autocast", "implementation"})
"""Keys tf_keras' Layer takes through ``**kwargs``."""


def _hard_sigmoid(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.relu6(x + 3.0) / 6.0


def _hard_swish(x: tf.Tensor) -> tf.Tensor:
    return x * _hard_sigmoid(x)


_ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "hard_sigmoid": _hard_sigmoid,  # tf_keras' is 0.2 x + 0.5, Keras 3's relu6(x + 3) / 6
    "hard_swish": _hard_swish,
    "hard_silu": _hard_swish,
    "relu6": tf.nn.relu6,
    "silu": tf.nn.silu,
    "leaky_relu": tf.nn.leaky_relu,
}
"""Keras 3 activations tf_keras has not, or has with another formula, as TensorFlow ops."""

_OPS: dict[str, Callable[..., tf.Tensor]] = {
    "Add": tf.add, "Subtract": tf.subtract, "Multiply": tf.multiply, "Divide": tf.divide,
    "TrueDivide": tf.divide, "Maximum": tf.maximum, "Minimum": tf.minimum,
    "Negative": tf.negative, "Absolute": tf.abs, "Abs": tf.abs, "Sqrt": tf.sqrt,
    "Square": tf.square, "Exp": tf.exp, "Relu": tf.nn.relu, "Relu6": tf.nn.relu6,
    "Sigmoid": tf.sigmoid, "Tanh": tf.tanh, "Silu": tf.nn.silu,
    "HardSigmoid": _hard_sigmoid, "HardSilu": _hard_swish,
}
"""Keras 3's stateless operations on tensors, as the TensorFlow ops tf_keras records as layers."""


def _as_ops(layer: Any) -> Callable[[Any], Any] | None:
    """TensorFlow ops computing a Keras 3 layer as Keras 3 does (None: a tf_keras layer does).

    Keras 3's nearest `UpSampling2D` repeats rows, then columns (TILE and RESHAPE once
    converted); tf_keras' resizes the image (``RESIZE_NEAREST_NEIGHBOR``): the same numbers by
    another kernel, so a technique's model would be timed on other ops than the file's.
    """
    if (type(layer).__name__ == "UpSampling2D" and layer.interpolation == "nearest"
            and layer.data_format == "channels_last"):
        rows, columns = layer.size
        return lambda x: tf.repeat(tf.repeat(x, rows, axis=1), columns, axis=2)
    return None


class UntranslatableError(ValueError):
    """A Keras 3 model, or one of its layers, has no tf_keras twin (the message names it)."""


@dataclass(frozen=True)
class Translation:
    """A tf_keras twin of a Keras 3 model and how closely it agreed with it.

    Attributes:
        model: The tf_keras model.
        keras_version: The Keras that built the original.
        max_abs_diff: Largest absolute difference of the two models' outputs on the check
            inputs.
        top1_agreement: Share of check inputs whose top class both models agree on.
        examples: How many inputs were compared.
    """

    model: keras.Model
    keras_version: str
    max_abs_diff: float
    top1_agreement: float
    examples: int

    def params(self) -> dict[str, str | int]:
        """What to log with the technique that used the translation."""
        return {"translated_from": f"Keras {self.keras_version}",
                "translation_check_examples": self.examples}

    def metrics(self) -> dict[str, float]:
        """The translation's check, as metrics."""
        return {"translation_max_abs_diff": self.max_abs_diff,
                "translation_top1_agreement": self.top1_agreement}


@dataclass
class _Twins:
    """The tf_keras twin of every Keras 3 layer met so far (a shared layer is translated once).

    Attributes:
        layers: By the Keras 3 layer's id: the layer, its tf_keras twin, and an activation
            applied after the twin (None: none).
        models: By a nested Keras 3 model's id: its tf_keras translation.
    """

    layers: dict[int, tuple[Any, keras.layers.Layer, Callable[[Any], Any] | None]] = field(
        default_factory=dict)
    models: dict[int, keras.Model] = field(default_factory=dict)


def translate(model: Any) -> keras.Model:
    """A tf_keras model with the Keras 3 model's architecture and weights (not yet verified).

    Raises:
        UntranslatableError: A subclassed model, or a layer or operation without a tf_keras
            twin, named.
    """
    if flavor_of(model) != "keras3":
        raise UntranslatableError(f"{model.name} is not a Keras 3 model")
    if not is_layer_graph(model):
        raise UntranslatableError(
            f"{model.name} is a subclassed Keras 3 model ({type(model).__name__}): its layers are "
            "wired in Python code, so no tf_keras twin can be rebuilt from it")
    twins = _Twins()
    translated = _translate_graph(model, twins)
    for original, twin, _ in twins.layers.values():
        try:
            twin.set_weights(original.get_weights())
        except ValueError as error:
            raise UntranslatableError(
                f"layer {original.name} ({type(original).__name__}): its weights do not fit the "
                f"tf_keras layer: {error}") from error
    return translated


def _translate_graph(model: Any, twins: _Twins) -> keras.Model:
    """Rebuild a functional or sequential Keras 3 model in tf_keras (its layers in `twins`)."""
    k3 = keras_module("keras3")
    if isinstance(model, k3.Sequential):
        (source,) = model.inputs
        inputs = keras.Input(tuple(source.shape[1:]), dtype=source.dtype, name=source.name)
        outputs = inputs
        for layer in model.layers:
            outputs = _apply(layer, (outputs,), {}, twins)
        return keras.Model(inputs, outputs, name=model.name)
    tensors: dict[int, Any] = {}
    inputs = []
    for source in model.inputs:
        twin_input = keras.Input(tuple(source.shape[1:]), dtype=source.dtype, name=source.name)
        tensors[id(source)] = twin_input
        inputs.append(twin_input)
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            operation = node.operation
            if isinstance(operation, k3.layers.InputLayer):
                continue
            args = tf.nest.map_structure(lambda v: _mapped(v, tensors), node.arguments.args)
            kwargs = tf.nest.map_structure(lambda v: _mapped(v, tensors),
                                           dict(node.arguments.kwargs))
            result = _apply(operation, args, kwargs, twins)
            for original, twin in zip(node.outputs, tf.nest.flatten(result), strict=True):
                tensors[id(original)] = twin
    outputs = tf.nest.map_structure(lambda t: tensors[id(t)], model._outputs_struct)
    return keras.Model(inputs if len(inputs) > 1 else inputs[0], outputs, name=model.name)


def _mapped(value: Any, tensors: dict[int, Any]) -> Any:
    """A Keras 3 symbolic tensor's tf_keras twin; any other argument as it is."""
    return tensors.get(id(value), value) if _is_symbolic(value) else value


def _is_symbolic(value: Any) -> bool:
    return type(value).__name__ == "KerasTensor"


def _apply(operation: Any, args: Any, kwargs: dict, twins: _Twins) -> Any:
    """Call the tf_keras twin of a Keras 3 layer, model or operation on tf_keras tensors."""
    k3 = keras_module("keras3")
    if isinstance(operation, k3.Model):
        if id(operation) not in twins.models:
            twins.models[id(operation)] = _translate_graph(operation, twins)
        return twins.models[id(operation)](*args, **kwargs)
    if not isinstance(operation, k3.layers.Layer):
        kind = type(operation).__name__
        function = _OPS.get(kind)
        if function is None:
            raise UntranslatableError(
                f"operation {operation.name} ({kind}) has no tf_keras twin (Keras 3 ops tfopt "
                f"translates: {', '.join(sorted(_OPS))})")
        return function(*args, **kwargs)
    as_ops = _as_ops(operation)
    if as_ops is not None:
        return as_ops(*args)
    if id(operation) not in twins.layers:
        twins.layers[id(operation)] = (operation, *_layer_twin(operation))
    _, layer, after = twins.layers[id(operation)]
    result = layer(*args, **{k: v for k, v in kwargs.items() if k != "training"})
    return after(result) if after else result


def _layer_twin(layer: Any) -> tuple[keras.layers.Layer, Callable[[Any], Any] | None]:
    """The tf_keras layer of the same class and settings, and an activation to apply after it.

    Raises:
        UntranslatableError: tf_keras has no layer of that class, or refuses its settings.
    """
    kind = type(layer).__name__
    cls = getattr(keras.layers, kind, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
        raise UntranslatableError(
            f"layer {layer.name} ({type(layer).__module__}.{kind}) has no tf_keras twin")
    config = _cleaned(layer.get_config(), cls)
    after = None
    activation = config.get("activation")
    if isinstance(activation, str) and activation in _ACTIVATIONS:
        after, config["activation"] = _ACTIVATIONS[activation], "linear"
    try:
        return cls.from_config(config), after
    except (TypeError, ValueError) as error:
        raise UntranslatableError(
            f"layer {layer.name} ({kind}): tf_keras refuses its settings: {error}") from error


def _cleaned(config: dict[str, Any], cls: type) -> dict[str, Any]:
    """A Keras 3 layer config as tf_keras' `cls` reads it.

    Initializers are dropped (the weights are copied), a dtype policy becomes its name, nested
    objects (regularizers, constraints) lose Keras 3's module keys, and keys `cls` does not
    take are dropped.
    """
    accepted = set(inspect.signature(cls.__init__).parameters) | _BASE_LAYER_KEYS
    cleaned: dict[str, Any] = {}
    for key, value in config.items():
        if key.endswith("_initializer") or key not in accepted:
            continue
        if key == "dtype" and isinstance(value, dict):
            value = value.get("config", {}).get("name", "float32")
        cleaned[key] = _plain(value)
    return cleaned


def _plain(value: Any) -> Any:
    """A nested Keras 3 serialized object without the keys tf_keras does not know."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("module", "registered_name")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _joined(outputs: Any) -> np.ndarray:
    """A model's outputs as one array: several (a dict or list) flattened per example, joined."""
    if isinstance(outputs, dict):
        outputs = [outputs[name] for name in sorted(outputs)]
    if isinstance(outputs, list | tuple):
        return np.concatenate([np.asarray(o, np.float64).reshape(len(o), -1) for o in outputs],
                              axis=1)
    return np.asarray(outputs, np.float64)


def verify(original: Any, twin: keras.Model, inputs: np.ndarray | dict[str, np.ndarray],
           tolerance: float = 1e-3) -> tuple[float, float]:
    """Compare both models' outputs on `inputs`: the largest difference, the top-1 agreement.

    `inputs` are images, or named arrays (array data); a model of several outputs is compared
    on all of them.

    Raises:
        UntranslatableError: The outputs differ by more than `tolerance` times the largest
            output magnitude (at least 1), naming the difference.
    """
    expected = _joined(original.predict(inputs, batch_size=64, verbose=0))
    got = _joined(twin.predict(inputs, batch_size=64, verbose=0))
    if expected.shape != got.shape:
        raise UntranslatableError(f"the tf_keras twin answers {got.shape}, not {expected.shape}")
    diff = float(np.max(np.abs(expected - got))) if expected.size else 0.0
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    agreement = float(np.mean(expected.argmax(-1) == got.argmax(-1))) if expected.ndim > 1 \
        else 1.0
    if diff > tolerance * scale:
        raise UntranslatableError(
            f"the tf_keras twin disagrees with the Keras 3 model: max |difference| {diff:.3g} "
            f"(tolerance {tolerance * scale:.3g}) on {len(expected)} inputs, top-1 agreement "
            f"{agreement:.3f}")
    return diff, agreement


def tf_keras_twin(model: Any, inputs: np.ndarray | dict[str, np.ndarray],
                  tolerance: float = 1e-3) -> Translation:
    """Translate a Keras 3 model into tf_keras and check it on `inputs` before handing it out.

    Raises:
        UntranslatableError: It cannot be translated, or the translation disagrees.
    """
    twin = translate(model)
    diff, agreement = verify(model, twin, inputs, tolerance)
    examples = len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)
    return Translation(model=twin, keras_version=keras_module("keras3").__version__,
                       max_abs_diff=diff, top1_agreement=agreement, examples=examples)
