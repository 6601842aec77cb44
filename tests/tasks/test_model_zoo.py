"""The zoo: tf_keras.applications networks built flat on tfopt's input, nothing downloaded."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import tf_keras as keras

from flows.parameters import PipelineConfig
from tfopt.models.config import APPLICATION_ARCHITECTURES, Architecture, ModelConfig
from tfopt.models.zoo import APPLICATIONS, ARCHITECTURES, FROM_SCRATCH_BN_MOMENTUM, build_model


def test_the_config_offers_every_zoo_network():
    assert set(typing.get_args(Architecture)) == set(ARCHITECTURES) - {"small_student"}
    assert tuple(APPLICATIONS) == APPLICATION_ARCHITECTURES


@pytest.mark.parametrize("architecture", list(APPLICATIONS))
def test_an_application_is_one_flat_model_from_images_to_logits(architecture):
    model = build_model(architecture, 32, 3)
    assert model.input.name.startswith("images") and model.output_shape == (None, 3)
    assert model.layers[-1].name == "logits"
    assert not any(isinstance(layer, keras.Model) for layer in model.layers), (
        "nested models hide their layers from pruning and quantization")
    assert model(np.random.default_rng(0).random((2, 32, 32, 3), np.float32)).shape == (2, 3)


def test_nchw_runs_every_convolution_channels_first():
    model = build_model("mobilenet_v2", 32, 3, data_format="channels_first")
    convolutions = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convolutions and all(c.data_format == "channels_first" for c in convolutions)
    assert model.layers[1].name == "to_nchw"
    assert keras.backend.image_data_format() == "channels_last", "the global format is restored"
    assert model(np.zeros((1, 32, 32, 3), np.float32)).shape == (1, 3)


def test_batch_norm_statistics_follow_training_from_scratch_but_not_from_weights(tmp_path):
    def momenta(model):
        return {layer.momentum for layer in model.layers
                if isinstance(layer, keras.layers.BatchNormalization)}

    assert momenta(build_model("mobilenet_v2", 32, 3)) == {FROM_SCRATCH_BN_MOMENTUM}
    keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, include_top=False,
                                   weights=None).save_weights(tmp_path / "no_top.h5")
    assert momenta(build_model("mobilenet_v2", 32, 3, weights=tmp_path / "no_top.h5")) == {0.999}


@pytest.mark.parametrize("input_scale", ["unit", "symmetric", "raw"])
def test_efficientnets_stem_takes_the_pixels_it_is_fed_to_0_1(input_scale, tmp_path):
    # Its Rescaling(1/255) on 0..1 pixels left the stem's outputs a 255th of their range:
    # QAT's 8-bit fake quantization rounded them all to one value (chance accuracy).
    from tfopt.models.config import ModelConfig
    from tfopt.models.sources import build_configured

    unit = np.random.default_rng(0).random((2, 32, 32, 3), np.float32)
    fed = {"unit": unit, "symmetric": unit * 2.0 - 1.0, "raw": unit * 255.0}[input_scale]
    model = build_configured(ModelConfig(architecture="efficientnet_b0",
                                         input_scale=input_scale), 32, 3)
    (stem,) = [layer for layer in model.layers if isinstance(layer, keras.layers.Rescaling)]
    np.testing.assert_allclose(stem(fed).numpy(), unit, atol=1e-5)
    model.save(tmp_path / "model.keras")
    again = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(again(fed).numpy(), model(fed).numpy(), atol=1e-5)


def test_a_local_weights_file_is_where_training_starts(tmp_path):
    base = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35,
                                          include_top=False, weights=None)
    base.save_weights(tmp_path / "no_top.h5")
    model = build_model("mobilenet_v2", 32, 3, weights=tmp_path / "no_top.h5")
    np.testing.assert_array_equal(model.get_layer("Conv1").kernel.numpy(),
                                  base.get_layer("Conv1").kernel.numpy())
    small = build_model("small_cnn", 16, 3, width=4)
    small.save_weights(tmp_path / "small.weights.h5")
    again = build_model("small_cnn", 16, 3, width=4, weights=tmp_path / "small.weights.h5")
    for mine, theirs in zip(again.get_weights(), small.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_bad_input_zoo_settings_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"resnet50 needs images of at least 32x32 .* is 16"):
        PipelineConfig.model_validate({"model": {"architecture": "resnet50"},
                                       "data": {"image_size": 16}})
    with pytest.raises(ValueError, match=r"model\.weights is used with model\.source=zoo"):
        ModelConfig(source="builder", builder="x.py:build", weights=tmp_path / "w.h5")
