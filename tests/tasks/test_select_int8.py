"""Selective int8: a layer with an outlier range is found first and kept in float."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.export_savedmodel import export_savedmodel
from tests.steps import build
from tfopt.models.keras_io import load_keras_model, save_keras_model
from tfopt.runtimes import ConvertConfig, plan_variant
from tfopt.runtimes._litert_selective import (
    NoQuantizableLayerError,
    channel_error,
    rank_layers,
)
from tfopt.runtimes.litert import TFLiteRunner

CFG = ConvertConfig(calibration_examples=50, selective_max_float_layers=4)


def _planned():
    return plan_variant("baseline", "tflite", "int8", form="tflite-selective",
                        derived_from="baseline-tflite-int8")


@pytest.fixture(scope="module")
def digits_baseline(tmp_path_factory):
    """A small CNN trained on all ten digits, with a validation split large enough to judge."""
    from tasks.train_model import train_model
    from tasks.write_tfrecords import write_tfrecords
    from tests.conftest import write_digit_folder
    from tests.steps import training_data
    from tfopt.config import DataConfig, TrainConfig
    from tfopt.models.config import ModelConfig

    work = tmp_path_factory.mktemp("digits10")
    folder = write_digit_folder(work / "images", classes=10, per_class=30)
    dataset = write_tfrecords.fn(DataConfig(source_dir=folder, image_size=16, val_fraction=0.2,
                                            test_fraction=0.1, shard_size_mb=0.05), work)
    data = training_data(dataset, seed=42)
    return dataset, train_model.fn(data, ModelConfig(width=8),
                                   TrainConfig(epochs=15, batch_size=16), work / "models")


@pytest.fixture(scope="module")
def outlier_savedmodel(digits_baseline, tmp_path_factory):
    """The baseline with one `fc` unit turned into a huge constant the logits ignore.

    The float model loses that unit only; per-tensor int8 of `fc`'s output gets a step so wide
    that every other unit rounds to zero.
    """
    dataset, baseline = digits_baseline
    model = load_keras_model(baseline.path)
    fc, logits = model.get_layer("fc"), model.get_layer("logits")
    kernel, bias = fc.get_weights()
    out_kernel, out_bias = logits.get_weights()
    unit = int(np.argmin(np.abs(out_kernel).sum(axis=1)))
    kernel[:, unit], bias[unit] = np.abs(kernel).max(), 3000.0
    out_kernel[unit, :] = 0.0
    fc.set_weights([kernel, bias])
    logits.set_weights([out_kernel, out_bias])
    folder = tmp_path_factory.mktemp("outlier")
    path = folder / "baseline.keras"
    save_keras_model(model, path)
    return dataset, export_savedmodel.fn(baseline.model_copy(update={"path": path}), folder)


def test_the_outlier_layer_is_ranked_first_and_kept_in_float_until_within_budget(
    outlier_savedmodel, tmp_path
):
    dataset, savedmodel = outlier_savedmodel
    variant = build(_planned(), savedmodel, dataset, CFG, tmp_path, budget_points=3.0)
    params = variant.params
    assert variant.status == "ok", variant.error
    assert variant.name == "baseline-tflite-selective-int8"
    assert "/fc/" in params["ranked_layers"].split(";")[0], params["ranked_layers"]
    assert params["float_layers"].split(";")[0] == params["ranked_layers"].split(";")[0]
    assert params["float_val_accuracy"] >= 0.6, "the baseline learned the digits"
    assert params["full_int8_val_accuracy"] < params["float_val_accuracy"] - 0.3, "collapsed"
    assert 1 <= params["float_layer_count"] <= CFG.selective_max_float_layers
    assert params["steps"].count("ms") == params["float_layer_count"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{variant.name}.tflite"]
    runner = TFLiteRunner(variant.path)
    types = {str(d["dtype"]) for d in runner.interpreter.get_tensor_details()}
    assert "<class 'numpy.int8'>" in types, "the rest stays int8"


def test_a_model_that_quantizes_well_is_not_selected(tiny_savedmodel, tiny_dataset, tmp_path):
    cfg = CFG.model_copy(update={"selective_float_stem": False})
    variant = build(_planned(), tiny_savedmodel, tiny_dataset, cfg, tmp_path,
                    budget_points=100.0)
    assert variant.status == "skipped" and "not needed: full int8 loses" in variant.error
    assert not list(tmp_path.glob("*.tflite"))


def test_the_quick_speedup_pairs_each_round_so_a_drift_or_one_slow_round_does_not_decide():
    """The machine halves its speed for two rounds and one file has a stray slow round."""
    full = [0.30, 0.60, 0.30, 0.60, 0.30]
    stem = [0.25, 0.50, 0.25, 0.50, 0.90]
    from tfopt.artifacts import Runoff

    timed = Runoff(rounds=5, round_p50_ms={"full": full, "stem": stem})
    assert timed.ratio("full", "stem") == pytest.approx(1.2)
    assert np.median(full) / np.median(stem) == pytest.approx(0.6)


@pytest.mark.parametrize("gain", [-1.0, 1.0])
def test_within_budget_the_first_convolution_is_kept_in_float_only_when_faster(
        tiny_savedmodel, tiny_dataset, tmp_path, gain):
    """The quick timing decides: a gain of -100% takes any timing, +100% none."""
    from tests.steps import sources_for
    from tfopt.data.pipeline import load_split
    from tfopt.runtimes._litert_files import representative_inputs, serving_converter
    from tfopt.runtimes._litert_selective import (
        StartingFiles,
        float_stem_if_faster,
        int8_with_float_nodes,
    )

    scale = tiny_savedmodel.input_scale
    validation = load_split(tiny_dataset, "val", None, scale)

    def calibration():
        return representative_inputs(tiny_dataset, CFG.calibration_examples, scale)

    full_int8 = int8_with_float_nodes(tiny_savedmodel, calibration, [])
    starting = StartingFiles(serving_converter(tiny_savedmodel.path).convert(), full_int8,
                             1.0, 1.0, 0.0)
    variant = float_stem_if_faster(
        tiny_savedmodel, _planned(), calibration, starting, validation,
        sources_for(tiny_savedmodel, tiny_dataset, tmp_path, CFG, budget_points=100.0),
        "not needed: full int8 loses nothing", min_gain=gain)
    if gain > 0:
        assert variant.status == "skipped", variant
        assert variant.error.startswith("not needed: full int8 loses nothing; quick p50 with")
        assert "not 100% faster" in variant.error
        assert not list(tmp_path.glob("*.tflite"))
        return
    assert variant.status == "ok", variant.error
    params = variant.params
    assert params["float_layer_count"] == 1 and "first convolution" in params["method"]
    stem = params["float_layers"]
    dtypes = {t["name"]: np.dtype(t["dtype"])
              for t in TFLiteRunner(variant.path).interpreter.get_tensor_details()}
    assert dtypes[stem] == np.float32, "the stem's output stays float"
    assert np.dtype(np.int8) in dtypes.values(), "the rest stays int8"
    assert [p.name for p in tmp_path.glob("*.tflite")] == [f"{variant.name}.tflite"]
    full = tmp_path / "full.tflite"
    full.write_bytes(full_int8)
    full_dtypes = {t["name"]: np.dtype(t["dtype"])
                   for t in TFLiteRunner(full).interpreter.get_tensor_details()}
    assert full_dtypes.get(stem) == np.int8, "in full int8 the same tensor is int8"


def test_a_budget_no_float_layer_count_reaches_fails_with_the_steps(outlier_savedmodel,
                                                                     tmp_path):
    dataset, savedmodel = outlier_savedmodel
    cfg = CFG.model_copy(update={"selective_max_float_layers": 1})
    variant = build(_planned(), savedmodel, dataset, cfg, tmp_path, budget_points=0.0)
    assert variant.status == "failed"
    assert "after keeping 1 layers in float" in variant.error and "val " in variant.error


def test_a_compressed_model_s_layers_are_not_searched_only_its_first_convolution_tried(
        outlier_savedmodel, tmp_path):
    """Its full int8 collapses (an outlier in `fc`); the float stem does not save it: skipped."""
    from tfopt.runtimes.litert import FLOAT_STEM_ONLY

    dataset, savedmodel = outlier_savedmodel
    planned = _planned().model_copy(update={"params": {FLOAT_STEM_ONLY: True}})
    variant = build(planned, savedmodel, dataset, CFG, tmp_path, budget_points=3.0)
    assert variant.status == "skipped", variant
    assert "(a compressed model's layers are not searched)" in variant.error
    assert "the first convolution in float loses" in variant.error
    assert not list(tmp_path.glob("*.tflite"))


def test_ranking_refuses_an_empty_debugger_run_and_measures_relative_channel_error():
    with pytest.raises(NoQuantizableLayerError, match="no quantizable layer"):
        rank_layers("op_name,tensor_idx,channel_error,scale,zero_point,tensor_name\n", {})
    values = np.array([[1.0, 2.0, 0.0]], np.float32)
    exact = np.array([[10, 20, 0]], np.int8)
    assert channel_error(values, exact, 0.1, 0) == pytest.approx(0.0, abs=1e-6)
    assert channel_error(values, np.zeros_like(exact), 0.1, 0) == pytest.approx(1.0)
