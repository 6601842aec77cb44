"""Depth pruning: remove whole residual blocks and rebuild a shallower functional model.

A residual block adds a branch to its input (``Add([branch, skip])``); without the branch the
block passes its input on, so the model stays whole with fewer layers. Thinning buys little
where a network's time goes to its number of layers rather than their width (EfficientNetB0 at
64 px: docs/measurements.md); removing blocks buys what thinning does not.

The blocks removed first are those that change their input least on training images: block
influence, ``1 - cos(input, output)`` averaged over the images (ShortGPT's measure; NVIDIA's
Minitron removes depth by the same kind of ranking).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tfopt.models.functional_graph import (
    LayerGraphError,
    as_functional,
    functional_config,
    layer_inputs,
    output_names,
    references,
)

DEPTH_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
"""The shares of a model's removable residual blocks a search may remove, weakest first."""
INFLUENCE_IMAGES = 64
"""Training examples each block's influence is measured on."""


class DepthPruningError(LayerGraphError):
    """The model cannot be depth-pruned (the message says why)."""


@dataclass(frozen=True)
class ResidualBlock:
    """A residual block: its ``Add``, the layer its skip comes from, and its branch's layers.

    Attributes:
        add: The ``Add`` layer that ends the block.
        skip: The layer whose output is the block's input (what the block passes on without
            its branch).
        branch: The branch's layers (removed with the block).
    """

    add: str
    skip: str
    branch: frozenset[str]


def _ancestors(inputs: dict[str, list[str]], name: str) -> set[str]:
    found: set[str] = set()
    stack = [name]
    while stack:
        for parent in inputs[stack.pop()]:
            if parent not in found:
                found.add(parent)
                stack.append(parent)
    return found


def _blocks_of(config: dict[str, Any]) -> list[ResidualBlock]:
    inputs = {layer["name"]: layer_inputs(layer) for layer in config["layers"]}
    consumers: dict[str, set[str]] = {name: set() for name in inputs}
    for name, parents in inputs.items():
        for parent in parents:
            consumers[parent].add(name)
    outputs = set(output_names(config))
    blocks = []
    for layer in config["layers"]:
        parents = inputs[layer["name"]]
        if layer["class_name"] != "Add" or len(parents) != 2 or parents[0] == parents[1]:
            continue
        for skip, end in (parents, parents[::-1]):
            upstream = _ancestors(inputs, end)
            if skip not in upstream:
                continue
            branch = (upstream | {end}) - _ancestors(inputs, skip) - {skip}
            closed = all(consumers[name] <= branch | {layer["name"]} for name in branch)
            if closed and not branch & outputs:
                blocks.append(ResidualBlock(layer["name"], skip, frozenset(branch)))
            break
    return blocks


def residual_blocks(model: Any) -> list[ResidualBlock]:
    """The residual blocks of a functional tf_keras model that can be removed, in model order.

    A block is an ``Add`` of two inputs where one (the skip) feeds the other (the branch),
    and nothing outside the branch reads the branch's layers. A projection shortcut (a
    convolution on the skip path, ResNet's first block of a stage) is not a block here: its
    add's inputs do not feed each other.

    Raises:
        DepthPruningError: Not a functional tf_keras model, or a shared layer.
    """
    return _blocks_of(functional_config(model, "depth pruning", DepthPruningError))


def block_influence(model: Any, blocks: list[ResidualBlock],
                    images: np.ndarray | dict[str, np.ndarray]) -> dict[str, float]:
    """How much each block changes its input on `images`: ``1 - cos(input, output)``, averaged.

    Args:
        model: The functional model the blocks are in.
        blocks: Its blocks (`residual_blocks`).
        images: A batch of its inputs (images, one array or named arrays).

    Returns:
        Each block's influence by its ``Add`` layer's name (0: the block passes its input on).
    """
    import tf_keras as keras

    if not blocks:
        return {}
    tensors = [t for block in blocks
               for t in (model.get_layer(block.skip).output, model.get_layer(block.add).output)]
    values = keras.Model(model.inputs, tensors)(images, training=False)
    influence = {}
    for index, block in enumerate(blocks):
        before, after = (np.asarray(v) for v in (values[2 * index], values[2 * index + 1]))
        before, after = before.reshape(len(before), -1), after.reshape(len(after), -1)
        norms = np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1)
        cosine = np.sum(before * after, axis=1) / np.maximum(norms, 1e-12)
        influence[block.add] = float(1.0 - np.mean(cosine))
    return influence


def _rewire(config: dict[str, Any], old: str, new: str) -> None:
    """Point every reference to layer `old`'s output at layer `new`'s."""
    for ref in references([layer.get("inbound_nodes") for layer in config["layers"]]) + (
            references(config["output_layers"])):
        if ref[0] == old:
            ref[0] = new


@dataclass(frozen=True)
class ShallowerModel:
    """A depth-pruned model and what was removed.

    Attributes:
        model: The shallower model (the original's weights in the layers it kept).
        removed: The removed blocks' ``Add`` layers, least influential first.
        blocks: How many removable blocks the original had.
        influence: Each block's influence (`block_influence`).
    """

    model: Any
    removed: list[str]
    blocks: int
    influence: dict[str, float]


def blocks_to_remove(share: float, blocks: int) -> int:
    """How many of `blocks` removable blocks a `share` removes (at least one, half rounded up)."""
    return min(blocks, max(1, int(share * blocks + 0.5)))


def shallower_model(model: Any, share: float,
                    images: np.ndarray | dict[str, np.ndarray]) -> ShallowerModel:
    """Remove `share` of the model's residual blocks, the least influential first.

    Args:
        model: A functional (or built Sequential) tf_keras model (left unchanged).
        share: The share of its removable residual blocks to remove, in (0, 1].
        images: Training examples the blocks' influence is measured on (images, or a model of
            array data's inputs: one array or named arrays).

    Returns:
        The shallower model, rebuilt from the original's config with the blocks' branches
        left out and their inputs passed on, and the original's weights in every kept layer.

    Raises:
        DepthPruningError: The model cannot be traced, or has no removable residual block.
    """
    import tf_keras as keras

    if not 0.0 < share <= 1.0:
        raise DepthPruningError(f"share {share} is not in (0, 1]")
    model = as_functional(model)
    config = functional_config(model, "depth pruning", DepthPruningError)
    blocks = _blocks_of(config)
    if not blocks:
        raise DepthPruningError("no residual block can be removed: no Add whose one input "
                                "feeds the other through layers nothing else reads")
    influence = block_influence(model, blocks, images)
    ranked = sorted(blocks, key=lambda block: influence[block.add])
    removed = ranked[:blocks_to_remove(share, len(blocks))]
    passed_on: dict[str, str] = {}
    for block in removed:
        skip = block.skip
        while skip in passed_on:  # the block before it was removed too
            skip = passed_on[skip]
        _rewire(config, block.add, skip)
        passed_on[block.add] = skip
    gone = {name for block in removed for name in block.branch | {block.add}}
    config["layers"] = [layer for layer in config["layers"] if layer["name"] not in gone]
    shallower = keras.Model.from_config(config)
    for layer in shallower.layers:
        layer.set_weights(model.get_layer(layer.name).get_weights())
    return ShallowerModel(shallower, [block.add for block in removed], len(blocks), influence)
