"""Channel pruning: channel groups found right, a thinner model that keeps what it keeps."""

from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from tfopt.models.channel_pruning import ChannelPruningError, channel_graph, thin_model
from tfopt.models.flops import keras_flops


def _residual_depthwise_concat() -> keras.Model:
    """A residual block, a depthwise block and a concatenate, as the networks people use."""
    inputs = keras.Input((12, 12, 3))
    stem = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(inputs)
    stem = keras.layers.BatchNormalization(name="stem_bn")(stem)
    stem = keras.layers.ReLU(name="stem_relu")(stem)
    branch = keras.layers.Conv2D(16, 3, padding="same", name="res_conv")(stem)
    branch = keras.layers.BatchNormalization(name="res_bn")(branch)
    added = keras.layers.Add(name="res_add")([stem, branch])
    depthwise = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(added)
    depthwise = keras.layers.BatchNormalization(name="dw_bn")(depthwise)
    left = keras.layers.Conv2D(16, 1, name="left")(depthwise)
    right = keras.layers.Conv2D(32, 1, name="right")(depthwise)
    joined = keras.layers.Concatenate(name="concat")([left, right])
    head = keras.layers.Conv2D(24, 1, activation="relu", name="head")(joined)
    pooled = keras.layers.GlobalAveragePooling2D(name="gap")(head)
    outputs = keras.layers.Dense(5, name="logits")(pooled)
    return keras.Model(inputs, outputs)


def _with_random_norms(model: keras.Model, seed: int = 0) -> keras.Model:
    """Batch norms with random statistics, so a wrong slice shows in the outputs."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 1.5, var.shape)])
    return model


def _images(model: keras.Model, count: int = 4) -> np.ndarray:
    return np.random.default_rng(1).random((count, *model.input_shape[1:]), dtype=np.float32)


def test_channel_groups_follow_residual_adds_depthwise_convolutions_and_concatenates():
    model = _residual_depthwise_concat()
    graph = channel_graph(model)
    assert graph.group_of("stem") == graph.group_of("res_conv"), "an add's inputs are one group"
    assert graph.channels["dw"] == graph.channels["res_add"], "depthwise follows its input"
    concat = graph.channels["concat"]
    assert len(concat) == 48 and concat[:16] == graph.channels["left"]
    assert concat[16:] == graph.channels["right"]
    groups = graph.prunable_groups()
    assert sorted(sorted(layers) for layers in groups.values()) == [
        ["head"], ["left"], ["res_conv", "stem"], ["right"]], "the logits are the output's"


def test_nothing_removed_leaves_the_outputs_as_they_were():
    model = _with_random_norms(_residual_depthwise_concat())
    same = thin_model(model, 0.0, min_channels=1)
    images = _images(model)
    np.testing.assert_allclose(same.model(images), model(images), rtol=1e-5, atol=1e-6)


def test_half_the_filters_go_from_every_group_and_the_flops_drop_with_them():
    model = _with_random_norms(_residual_depthwise_concat())
    thinned = thin_model(model, 0.5, min_channels=1)
    assert thinned.kept == {"stem": (8, 16), "res_conv": (8, 16), "left": (8, 16),
                            "right": (16, 32), "head": (12, 24)}
    layers = {layer.name: layer for layer in thinned.model.layers}
    assert layers["dw"].depthwise_kernel.shape[2] == 8
    assert layers["head"].kernel.shape[2] == 24, "the concatenate's kept channels feed it"
    assert layers["logits"].kernel.shape == (12, 5)
    # Convolutions between thinned groups do a quarter of the work; the stem (3 input
    # channels kept) and the depthwise convolution half.
    ratio = keras_flops(thinned.model) / keras_flops(model)
    assert 0.25 < ratio < 0.5, ratio
    assert thinned.model(_images(model)).shape == (4, 5)


def test_filters_that_contribute_nothing_are_removed_without_changing_the_outputs():
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="a")(inputs)
    x = keras.layers.BatchNormalization(name="a_bn")(x)
    x = keras.layers.ReLU(name="a_relu")(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="b")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inputs, keras.layers.Dense(3, name="logits")(x))
    _with_random_norms(model)
    dead = [1, 4, 6, 7]
    norm = model.get_layer("a_bn")
    gamma, beta, mean, var = norm.get_weights()
    gamma[dead], beta[dead] = 0.0, 0.0  # these channels are always 0 after the ReLU
    norm.set_weights([gamma, beta, mean, var])
    conv_b = model.get_layer("b")
    kernel, bias = conv_b.get_weights()
    kernel[..., [0, 3, 5, 6]] = 0.0  # and these filters are 0 apart from their bias
    conv_b.set_weights([kernel, bias * 0.0])
    thinned = thin_model(model, 0.5, min_channels=1)
    assert thinned.kept == {"a": (4, 8), "b": (4, 8)}
    images = _images(model)
    np.testing.assert_allclose(thinned.model(images), model(images), rtol=1e-5, atol=1e-6)


def test_a_regressor_ending_in_one_scalar_per_example_has_its_hidden_units_thinned():
    """A Dense head reshaped to a scalar (a regressor's ``Reshape(())``): no channel to keep."""
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    target = keras.layers.Dense(1, name="target")(hidden)
    model = keras.Model(inputs, keras.layers.Reshape((), name="scalar")(target))
    thinned = thin_model(model, 0.5, min_channels=1)
    assert thinned.kept == {"hidden": (16, 32)}
    assert thinned.model.output_shape == (None,)
    rows = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    assert thinned.model(rows).shape == (4,)


def test_a_model_whose_channels_all_meet_a_layer_it_cannot_follow_names_that_layer():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, name="conv")(inputs)
    x = keras.layers.Flatten(name="flatten")(x)
    model = keras.Model(inputs, keras.layers.Dense(4, name="logits")(x))
    with pytest.raises(ChannelPruningError, match="flatten"):
        thin_model(model, 0.5, min_channels=1)


def test_a_subclassed_model_is_refused_with_the_reason():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv = keras.layers.Conv2D(4, 3)

        def call(self, inputs):
            return self.conv(inputs)

    net = Net()
    net(np.zeros((1, 8, 8, 3), np.float32))
    with pytest.raises(ChannelPruningError, match="not a functional model"):
        thin_model(net, 0.5)


def test_mobilenet_v3s_squeeze_excite_and_hard_swish_blocks_are_thinned_exactly():
    model = _with_random_norms(keras.applications.MobileNetV3Small(
        input_shape=(32, 32, 3), weights=None, classes=4, include_preprocessing=False))
    images = _images(model, 2)
    same = thin_model(model, 0.0, min_channels=1)
    np.testing.assert_allclose(same.model(images), model(images), rtol=1e-4, atol=1e-5)
    thinned = thin_model(model, 0.5)
    assert len(thinned.kept) > 30, "the SE blocks' Multiply and Reshape do not stop it"
    assert keras_flops(thinned.model) < 0.5 * keras_flops(model)
    assert thinned.model(images).shape == (2, 4)
