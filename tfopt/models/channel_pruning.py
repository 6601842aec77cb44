"""Structured (channel) pruning: remove whole filters and rebuild a thinner functional model.

tensorflow-model-optimization prunes weights, which buys zipped size but no time on the
runtimes here. Removing filters makes every tensor thinner, so each runtime does less work.

Channels that must agree are pruned together. Each tensor's channels are tracked as a list of
``(group, index)`` pairs: a convolution or a dense layer starts a new group with its filters;
batch normalization, activations, pooling, padding, dropout, a depthwise convolution,
element-wise TensorFlow ops on one tensor (hard-swish's ``x + 3``) and a squeeze-and-excitation
``Reshape`` to ``(1, 1, C)`` pass their input's channels on; the inputs of an ``Add`` (or
``Multiply``, ``Maximum``, ``Average``, ...) are merged into one group; a ``Concatenate`` puts
its inputs' lists one after the other. A layer
the pruner does not know keeps its input channels and its own (its groups are frozen), so
any functional model can be thinned where it is understood; the model's input and output
channels are never removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfopt.models.functional_graph import (
    LayerGraphError,
    as_functional,
    functional_config,
    layer_inputs,
    output_names,
)

SEARCHED_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
"""The shares of each channel group's filters a search may remove, weakest first (channel
pruning's ``fraction: auto`` and the thinner distillation student's ``thinner: auto``)."""

SOURCE_CLASSES = ("Conv2D", "Dense")
"""Layers whose output channels are their own filters (a new channel group)."""

FOLLOWER_CLASSES = (
    "BatchNormalization", "ReLU", "Activation", "LeakyReLU", "ELU", "Softmax", "Dropout",
    "SpatialDropout2D", "MaxPooling2D", "AveragePooling2D", "GlobalAveragePooling2D",
    "GlobalMaxPooling2D", "ZeroPadding2D", "Cropping2D", "UpSampling2D", "DepthwiseConv2D",
    "GaussianNoise", "GaussianDropout", "ActivityRegularization", "Rescaling", "Identity",
)
"""Layers whose output channels are their input's, one for one."""

ELEMENTWISE_OPS = frozenset({
    "__operators__.add", "__operators__.sub", "math.add", "math.subtract", "math.multiply",
    "math.truediv", "math.divide", "nn.relu", "nn.relu6", "nn.silu", "nn.swish", "math.sigmoid",
    "math.tanh", "nn.gelu", "nn.elu", "nn.leaky_relu", "nn.softplus", "math.maximum",
    "math.minimum", "clip_by_value",
})
"""TensorFlow ops (tf_keras ``TFOpLambda`` layers) that act per element: with one tensor input
(a constant as the other operand, e.g. MobileNetV3's hard-swish ``x + 3``) they pass their
input's channels on."""

SPATIAL_OPS = frozenset({"repeat"})
"""TensorFlow ops that pass their input's channels on when their output is as wide as it (a
translated Keras 3 ``UpSampling2D`` repeats rows and columns)."""

MERGE_CLASSES = ("Add", "Subtract", "Maximum", "Minimum", "Average", "Multiply")
"""Layers whose inputs' channels must agree, one for one (one group)."""


class ChannelPruningError(LayerGraphError):
    """The model cannot be channel-pruned (the message names the layer and why)."""


@dataclass
class _UnionFind:
    parent: dict[int, int] = field(default_factory=dict)

    def find(self, group: int) -> int:
        root = group
        while self.parent.setdefault(root, root) != root:
            root = self.parent[root]
        return root

    def union(self, first: int, second: int) -> None:
        self.parent[self.find(first)] = self.find(second)


@dataclass
class ChannelGraph:
    """How each layer's channels depend on the others' (see the module docstring).

    Attributes:
        channels: Each layer's output channels as ``(group, index)`` pairs.
        inputs: Each layer's input layers, in call order.
        sources: Each group's source layers (the layers that make its filters).
        frozen: Groups that keep all their channels, with the layer that freezes them.
        sizes: Each group's channel count.
        groups: Which groups were merged (an ``Add``'s inputs): `_UnionFind.find` names one.
    """

    channels: dict[str, list[tuple[int, int]]]
    inputs: dict[str, list[str]]
    sources: dict[int, list[str]]
    frozen: dict[int, str]
    sizes: dict[int, int]
    groups: _UnionFind

    def group_of(self, layer: str) -> int:
        """The (merged) group of a source layer's filters."""
        return self.groups.find(self.channels[layer][0][0])

    def prunable_groups(self) -> dict[int, list[str]]:
        """Each prunable group (merged, not frozen) with its source layers."""
        merged: dict[int, list[str]] = {}
        for group, layers in self.sources.items():
            merged.setdefault(self.groups.find(group), []).extend(layers)
        frozen = {self.groups.find(group) for group in self.frozen}
        return {group: layers for group, layers in merged.items() if group not in frozen}


def channel_graph(model: Any) -> ChannelGraph:
    """Trace how channels flow through a functional tf_keras model.

    Raises:
        ChannelPruningError: Not a functional tf_keras model, or a shared layer
            (`tfopt.models.functional_graph.functional_config`).
    """
    model = as_functional(model)
    config = functional_config(model, "channel pruning", ChannelPruningError)
    by_name = {layer.name: layer for layer in model.layers}
    if any(getattr(layer, "data_format", None) == "channels_first" for layer in model.layers):
        raise ChannelPruningError("a channels-first (NCHW) model: the pruner follows channels on "
                                  "the last axis")
    groups, channels, inputs = _UnionFind(), {}, {}
    sources: dict[int, list[str]] = {}
    frozen: dict[int, str] = {}
    sizes: dict[int, int] = {}

    def new_group(size: int) -> list[tuple[int, int]]:
        group = len(sizes)
        sizes[group] = size
        groups.find(group)
        return [(group, index) for index in range(size)]

    def frozen_group(size: int, name: str) -> list[tuple[int, int]]:
        pairs = new_group(size)
        frozen[pairs[0][0] if pairs else len(sizes) - 1] = name  # a scalar output: no channel
        return pairs

    for layer_config in config["layers"]:
        name = layer_config["name"]
        layer = by_name[name]
        kind = type(layer).__name__
        inputs[name] = layer_inputs(layer_config)
        incoming = [channels[source] for source in inputs[name]]
        width = int(_output_channels(layer))
        if kind == "InputLayer" or not incoming:
            channels[name] = frozen_group(width, name)
        elif kind in SOURCE_CLASSES and len(incoming) == 1 and getattr(layer, "groups", 1) == 1:
            channels[name] = new_group(width)
            sources[channels[name][0][0]] = [name]
        elif len(incoming) == 1 and _passes_channels_on(layer, layer_config, incoming[0],
                                                         width):
            channels[name] = list(incoming[0])
        elif kind in MERGE_CLASSES and _aligned(incoming):
            for pairs in incoming[1:]:
                for (first, _), (second, _) in zip(incoming[0], pairs, strict=True):
                    groups.union(first, second)
            channels[name] = list(incoming[0])
        elif kind == "Concatenate" and layer.axis in (-1, 3):
            channels[name] = [pair for pairs in incoming for pair in pairs]
        else:  # not understood: keep everything around it
            for pairs in incoming:
                for group, _ in pairs:
                    frozen.setdefault(group, name)
            channels[name] = frozen_group(width, name)
    for output in output_names(config):
        for group, _ in channels[output]:
            frozen.setdefault(group, f"{output} (the model's output)")
    return ChannelGraph(channels, inputs, sources, frozen, sizes, groups)


def _output_channels(layer: Any) -> int:
    shape = layer.output.shape if hasattr(layer, "output") else layer.output_shape
    return int(shape[-1]) if shape and shape[-1] is not None else 0


def _passes_channels_on(layer: Any, layer_config: dict[str, Any],
                        incoming: list[tuple[int, int]], width: int) -> bool:
    """Does a one-input layer output its input's channels, one for one?"""
    kind = type(layer).__name__
    if width != len(incoming):
        return False
    if kind == "DepthwiseConv2D":
        return layer.depth_multiplier == 1
    if kind == "TFOpLambda":
        return layer_config["config"].get("function") in ELEMENTWISE_OPS | SPATIAL_OPS
    if kind == "Reshape":  # (C,) -> (1, 1, C) in squeeze-and-excitation blocks
        return int(np.prod(layer.target_shape[:-1])) == 1
    return kind in FOLLOWER_CLASSES


def _aligned(incoming: list[list[tuple[int, int]]]) -> bool:
    """Inputs of a merge that can be unified: one whole group each, of one width."""
    widths = {len(pairs) for pairs in incoming}
    return len(widths) == 1 and all(
        len({group for group, _ in pairs}) == 1 and [index for _, index in pairs]
        == list(range(len(pairs))) for pairs in incoming)


def filter_importance(model: Any, graph: ChannelGraph, group: int,
                      layers: list[str]) -> np.ndarray:
    """Each channel of a group's importance: |batch-norm scale| x the filter's L1 norm, summed.

    The scale is that of the batch normalization right after the source (1 without one);
    the criterion is Network Slimming's and Li et al.'s, as distillation's start uses. Each
    source's figures are divided by its largest, so the convolutions of a merged group weigh
    alike.
    """
    by_name = {layer.name: layer for layer in model.layers}
    importance = np.zeros(graph.sizes[group], dtype=np.float64)
    for source in layers:
        scale = next((by_name[name].get_weights()[0]
                      for name, feeding in graph.inputs.items()
                      if feeding == [source]
                      and type(by_name[name]).__name__ == "BatchNormalization"), None)
        weighted = filter_scores(by_name[source].get_weights()[0], scale)
        importance += weighted / max(float(weighted.max()), 1e-12)
    return importance


def filter_scores(kernel: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """Each filter's importance: |batch-norm scale| x the filter's L1 norm.

    Network Slimming's and Li et al.'s criterion, the one rule channel pruning and the distilled
    student's start (`techniques.distill.inherit_filters`) rank filters by.

    Args:
        kernel: A convolution's or dense layer's kernel, output channels last.
        scale: The batch normalization's scale (gamma) after it; None: no normalization (1).
    """
    l1 = np.abs(kernel).reshape(-1, kernel.shape[-1]).sum(axis=0)
    return l1 if scale is None else np.abs(scale) * l1


def kept_channels(model: Any, graph: ChannelGraph, fraction: float,
                  min_channels: int = 8) -> dict[int, np.ndarray]:
    """The channels to keep per prunable group: the most important ``1 - fraction`` of them.

    A group keeps at least `min_channels` (or all it has, if fewer). Counts are not rounded to
    a multiple of 8: XNNPACK's int8 files ran no faster for it (docs/measurements.md).
    """
    kept = {}
    for group, layers in graph.prunable_groups().items():
        size = graph.sizes[group]
        keep = max(min(size, min_channels), round(size * (1.0 - fraction)))
        ranking = np.argsort(-filter_importance(model, graph, group, layers), kind="stable")
        kept[group] = np.sort(ranking[:keep])
    return kept


def _positions(pairs: list[tuple[int, int]], graph: ChannelGraph,
               keep_sets: dict[int, set[int]]) -> np.ndarray:
    """Which of a tensor's channels stay (their positions in it)."""
    return np.array([position for position, (group, index) in enumerate(pairs)
                     if index in keep_sets.get(graph.groups.find(group), {index})],
                    dtype=np.int64)


@dataclass(frozen=True)
class ThinnedModel:
    """A channel-pruned model and what was removed.

    Attributes:
        model: The thinner model (weights copied from the original's kept channels).
        kept: Each pruned source layer's kept and original filter counts.
        frozen: Layers that kept their channels, with the reason.
    """

    model: Any
    kept: dict[str, tuple[int, int]]
    frozen: dict[str, str]


def thin_model(model: Any, fraction: float, min_channels: int = 8) -> ThinnedModel:
    """Remove `fraction` of each prunable group's filters and rebuild the model thinner.

    Args:
        model: A functional (or built Sequential) tf_keras model (left unchanged).
        fraction: The share of filters to remove per group, in [0, 1).
        min_channels: The fewest channels a group keeps.

    Returns:
        The thinner model with the original's kept weights.

    Raises:
        ChannelPruningError: The model cannot be traced, or nothing in it can be pruned (the
            message names the layers that froze its channels).
    """
    import tf_keras as keras

    if not 0.0 <= fraction < 1.0:
        raise ChannelPruningError(f"fraction {fraction} is not in [0, 1)")
    model = as_functional(model)
    graph = channel_graph(model)
    if not graph.prunable_groups():
        reasons = sorted(set(graph.frozen.values()))
        raise ChannelPruningError(
            "no channel can be removed: every convolution's channels meet a layer the pruner "
            f"cannot follow or the model's output ({', '.join(reasons[:5])})")
    kept = kept_channels(model, graph, fraction, min_channels)
    keep_sets = {group: set(indices.tolist()) for group, indices in kept.items()}
    config = model.get_config()
    by_name = {layer.name: layer for layer in model.layers}
    widths = {}
    sources = _source_names(graph)
    for layer_config in config["layers"]:
        name = layer_config["name"]
        if name in sources:
            group = graph.group_of(name)
            if group in kept:
                key = "filters" if "filters" in layer_config["config"] else "units"
                layer_config["config"][key] = len(kept[group])
                widths[name] = (len(kept[group]), graph.sizes[group])
        elif type(by_name[name]).__name__ == "Reshape" and layer_config["config"]["target_shape"]:
            shape = list(layer_config["config"]["target_shape"])
            shape[-1] = len(_positions(graph.channels[name], graph, keep_sets))
            layer_config["config"]["target_shape"] = tuple(shape)
    thinner = keras.Model.from_config(config)
    for layer in thinner.layers:
        _copy_kept_weights(by_name[layer.name], layer, graph, keep_sets)
    frozen = {name: "its channels meet a layer the pruner cannot follow or the output"
              for name in sources if name not in widths}
    return ThinnedModel(thinner, widths, frozen)


def _source_names(graph: ChannelGraph) -> set[str]:
    return {name for layers in graph.sources.values() for name in layers}


def _copy_kept_weights(original: Any, thinner: Any, graph: ChannelGraph,
                       keep_sets: dict[int, set[int]]) -> None:
    """Copy `original`'s weights into `thinner`, sliced to the kept channels."""
    weights = original.get_weights()
    if not weights:
        return
    name, kind = original.name, type(original).__name__
    incoming = [graph.channels[source] for source in graph.inputs[name]]
    inputs_kept = _positions(incoming[0], graph, keep_sets) if len(incoming) == 1 else None
    outputs_kept = _positions(graph.channels[name], graph, keep_sets)
    if kind in SOURCE_CLASSES and inputs_kept is not None:
        kernel = np.take(weights[0], inputs_kept, axis=-2)
        sliced = [np.take(kernel, outputs_kept, axis=-1)]
        sliced += [np.take(bias, outputs_kept, axis=-1) for bias in weights[1:]]
    elif kind == "DepthwiseConv2D":
        sliced = [np.take(weights[0], outputs_kept, axis=-2)]
        sliced += [np.take(bias, outputs_kept, axis=-1) for bias in weights[1:]]
    elif kind == "BatchNormalization":
        sliced = [np.take(weight, outputs_kept, axis=-1) for weight in weights]
    else:
        sliced = weights
    thinner.set_weights(sliced)
