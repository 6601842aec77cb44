"""A functional tf_keras model's layer graph, read from its config alike for every rebuilder.

Channel pruning and depth pruning both rebuild a model from its config. Each layer's
``inbound_nodes`` hold ``[layer, node, tensor, kwargs]`` references to the layers feeding it: a
list of them, or one flat reference for a ``TFOpLambda`` (a TensorFlow op), whose keyword
arguments may hold more (``tf.math.add(x, y=t)``). The references are returned as the config's
own lists, so a technique can point them elsewhere and rebuild the model from the config.
"""

from __future__ import annotations

from typing import Any


class LayerGraphError(ValueError):
    """The model cannot be rebuilt from its layer graph (the message names the layer and why).

    Each rebuilding technique raises its own subclass.
    """


def as_functional(model: Any) -> Any:
    """The model as a functional one: a built ``Sequential`` model's own layers on its input.

    The layers are the model's (no copy): rebuilding from this view's config gives a functional
    model with the same layer names, whose weights can be copied from the original's.
    """
    import tf_keras as keras

    if isinstance(model, keras.Sequential) and getattr(model, "inputs", None):
        return keras.Model(model.inputs, model.outputs, name=model.name)
    return model


def functional_config(model: Any, technique: str,
                      error: type[LayerGraphError] = LayerGraphError) -> dict[str, Any]:
    """The model's config, checked to be one `technique` can rebuild the model from.

    A built ``Sequential`` model is read as its functional view (`as_functional`: callers that
    look its layers up by name take that view too).

    Raises:
        error: Not a functional model (a subclassed one, or a ``Sequential`` one never built
            on an input shape), a Keras 3 model's config, or a layer called more than once (a
            shared layer).
    """
    config = as_functional(model).get_config()
    if "layers" not in config or "output_layers" not in config:
        raise error(f"{type(model).__name__} is not a functional model: {technique} rebuilds "
                    "functional and built Sequential tf_keras models from their layer graph")
    for layer_config in config["layers"]:
        nodes = layer_config.get("inbound_nodes") or []
        if nodes and isinstance(nodes[0], dict):
            raise error(f"a Keras 3 model: {technique} reads tf_keras models (tfopt translates "
                        "Keras 3 models first)")
        if len(nodes) > 1:
            raise error(f"layer {layer_config['name']} is called {len(nodes)} times (a shared "
                        f"layer): {technique} rebuilds each layer for one call")
    return config


def references(value: Any) -> list[list[Any]]:
    """Every ``[layer, node, tensor, ...]`` reference in an inbound-node structure, in call order.

    A reference's keyword arguments' references follow it.
    """
    if isinstance(value, list) and len(value) >= 3 and isinstance(value[0], str) and (
            isinstance(value[1], int) and isinstance(value[2], int)):
        return [value, *references(value[3] if len(value) > 3 else None)]
    if isinstance(value, list):
        return [ref for item in value for ref in references(item)]
    if isinstance(value, dict):
        return [ref for item in value.values() for ref in references(item)]
    return []


def layer_inputs(layer_config: dict[str, Any]) -> list[str]:
    """The names of the layers feeding one layer, in call order (repeated when fed twice)."""
    return [ref[0] for ref in references(layer_config.get("inbound_nodes") or [])]


def output_names(config: dict[str, Any]) -> list[str]:
    """The names of the layers whose outputs are the model's."""
    return [ref[0] for ref in references(config["output_layers"])]
