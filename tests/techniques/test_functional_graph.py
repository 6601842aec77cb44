"""Both pruners read a model's layer graph alike (`tfopt.models.functional_graph`): the same
models taken, the same ones refused, each in its own words."""

from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from tfopt.models.channel_pruning import ChannelPruningError, thin_model
from tfopt.models.depth_pruning import DepthPruningError, residual_blocks, shallower_model


def _shared_layer_model() -> keras.Model:
    inputs = keras.Input((8, 8, 3))
    conv = keras.layers.Conv2D(3, 3, padding="same", name="shared")
    x = keras.layers.Add(name="add")([inputs, conv(conv(inputs))])
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))


@pytest.mark.parametrize("technique", ["channel pruning", "depth pruning"])
def test_both_pruners_refuse_what_they_cannot_rebuild_in_their_own_words(technique):
    error = ChannelPruningError if technique == "channel pruning" else DepthPruningError
    rebuild = ((lambda model: thin_model(model, 0.5)) if technique == "channel pruning"
               else residual_blocks)
    with pytest.raises(error, match=f"a shared layer\\): {technique} rebuilds"):
        rebuild(_shared_layer_model())
    never_built = keras.Sequential([keras.layers.Conv2D(3, 3)])
    with pytest.raises(error, match=f"not a functional model: {technique}"):
        rebuild(never_built)


def test_a_built_sequential_model_is_thinned_through_its_functional_view():
    model = keras.Sequential([
        keras.Input((12, 12, 3)), keras.layers.Conv2D(16, 3, name="c1"),
        keras.layers.BatchNormalization(name="bn"), keras.layers.ReLU(name="relu"),
        keras.layers.Conv2D(16, 3, name="c2"), keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(4, name="logits")])
    thinner = thin_model(model, 0.5).model
    assert thinner.get_layer("c1").filters == thinner.get_layer("c2").filters == 8
    assert thinner.output_shape == model.output_shape
    with pytest.raises(DepthPruningError, match="no residual block"):
        shallower_model(model, 0.5, np.zeros((2, 12, 12, 3), np.float32))
