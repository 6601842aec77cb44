"""Techniques on a model of array data: a Keras file fine-tuned with its own loss, judged by the
run's metric on the held-out split, its model a SavedModel of its own signature."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compress import plan
from flows.parameters import PipelineConfig
from tasks.write_tfrecords import write_tfrecords
from techniques.base import NotApplicable
from techniques.channel_prune import ChannelPruneConfig, channel_prune_model
from techniques.cluster import ClusterConfig, cluster_model
from techniques.cqat import CqatConfig, cluster_preserving_qat
from techniques.depth_prune import DepthPruneConfig, depth_prune_model
from techniques.distill import DistillConfig, distill_model
from techniques.pqat import PqatConfig, prune_preserving_qat
from techniques.prune import PruneConfig, prune_model
from techniques.qat import QatConfig, quantize_aware_train
from techniques.width_depth import WidthDepthConfig, width_depth_model
from tfopt.artifacts import TrainingData, VariantSpec
from tfopt.config import DataConfig, EvalConfig, InputConfig
from tfopt.data.arrays import load_split_feeds
from tfopt.models.baseline import array_targets
from tfopt.models.config import ModelConfig
from tfopt.models.importing import fine_tuning_loss, import_array_model
from tfopt.runtimes import build_here, load_runner, plan_variant
from tfopt.runtimes.base import BuildSources, outputs_batched
from tfopt.runtimes.litert import int8_kernel_stats


def _regression(rows: int, seed: int) -> dict[str, np.ndarray]:
    """Numbers and a category id in, a target made from both."""
    rng = np.random.default_rng(seed)
    numbers = rng.normal(size=(rows, 6)).astype(np.float32)
    ids = rng.integers(0, 5, size=(rows, 1)).astype(np.int32)
    y = numbers @ np.linspace(-1.0, 1.0, 6) + np.sin(numbers[:, 0]) + 0.5 * ids[:, 0]
    # In tens: its error is above 1, so an oriented score (-mae) below -1 must still count.
    return {"numbers": numbers, "ids": ids, "y": (10.0 * y).astype(np.float32)}


def _their_keras3_file(path: Path, data: dict[str, np.ndarray], loss: str | None,
                       join: str = "concatenate") -> Path:
    """A two-input Keras 3 regressor trained outside tfopt (compiled with `loss`, or not).

    Its inputs are joined by a Concatenate, or (`join` ``add``) each through its own Dense
    layer and added; ``residual``: joined, then two residual blocks.
    """
    import keras

    keras.utils.set_random_seed(3)
    numbers = keras.Input((6,), name="numbers")
    ids = keras.Input((1,), dtype="int32", name="ids")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(5, 3)(ids))
    if join == "residual":  # two residual blocks of two Dense layers each
        hidden = keras.layers.Dense(32, activation="relu")(
            keras.layers.Concatenate()([numbers, embedded]))
        for _ in range(2):
            branch = keras.layers.Dense(32, activation="relu")(hidden)
            hidden = keras.layers.Add()([hidden, keras.layers.Dense(32)(branch)])
    elif join == "add":
        hidden = keras.layers.Activation("relu")(keras.layers.Add()(
            [keras.layers.Dense(48)(numbers), keras.layers.Dense(48)(embedded)]))
    else:
        hidden = keras.layers.Dense(48, activation="relu")(
            keras.layers.Concatenate()([numbers, embedded]))
    model = keras.Model({"numbers": numbers, "ids": ids}, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="adam", loss=loss or "mse")
    model.fit({"numbers": data["numbers"], "ids": data["ids"]}, data["y"], epochs=30,
              batch_size=32, verbose=0)
    if loss is None:
        model.compile(optimizer="adam")  # saved without a loss
    model.save(path)
    return path


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """The sharded data, the baseline taken in from the Keras file, and the run's training data."""
    tmp = tmp_path_factory.mktemp("arrays")
    (tmp / "data").mkdir()
    data = _regression(500, 1)
    np.savez(tmp / "data" / "rows.npz", **data)
    dataset = write_tfrecords.fn(DataConfig(source_dir=tmp / "data", source_format="npz",
                                            val_fraction=0.2, shard_size_mb=0.01), tmp / "work")
    model_cfg = ModelConfig(source="file", path=_their_keras3_file(tmp / "theirs.keras", data,
                                                                   "mse"))
    judged = EvalConfig(metric="mae").settled(1.0, class_scores=False)
    baseline = import_array_model(model_cfg, dataset, tmp / "models", judged)
    training = TrainingData(dataset=dataset, batch_size=32, seed=1, input=InputConfig(),
                            judged_by=judged, loss=fine_tuning_loss(model_cfg, None))
    return baseline, _with_targets(training, baseline), tmp


def _with_targets(data: TrainingData, baseline) -> TrainingData:
    """`data` with the held-out and file targets the flow sets from the baseline's figures."""
    recover_to, file_target = array_targets(baseline, data)
    return data.model_copy(update={"recover_to": recover_to, "file_target": file_target})


def test_a_keras_file_of_array_data_is_pruned_with_its_loss_and_judged_by_the_metric(
        regression, tmp_path):
    baseline, data, _ = regression
    assert baseline.format == "savedmodel" and baseline.keras_file.suffix == ".keras"
    assert data.loss == "mse", "the loss the file was compiled with"
    # Judged against the file's own held-out MAE less the budget (1% of it), as a score.
    assert data.recover_to == pytest.approx(-1.01 * baseline.metrics["val_mae"], rel=1e-5)

    pruned = prune_model.fn(baseline, PruneConfig(target_sparsity=0.3, epochs=4,
                                                  learning_rate=2e-3), data, tmp_path)

    assert pruned.format == "savedmodel" and pruned.keras_file.is_file()
    assert pruned.metrics["sparsity"] >= 0.28
    assert pruned.params["translated_from"].startswith("Keras 3.")
    curves = pruned.history
    assert len(curves["val_mae"]) == 4 and "val_loss" in curves
    assert np.allclose(curves["val_score"], [-v for v in curves["val_mae"]])
    assert pruned.params["kept_epoch"] >= 3, "a candidate once the sparsity ramp has ended"
    # Its stop was judged against the budget (1% of the baseline's held-out MAE by default).
    assert isinstance(pruned.params["recovered"], bool), pruned.params
    assert pruned.params["stopped_by"] in ("recovered", "cap"), pruned.params
    mae, baseline_mae = _served_test_mae(pruned, baseline, data)
    assert mae == pytest.approx(pruned.metrics["test_mae"], rel=1e-4)
    assert mae < 1.5 * baseline_mae, "back near the baseline without 30% of its weights"


def _served_test_mae(variant, baseline, data) -> tuple[float, float]:
    """The test MAE of `variant` (a SavedModel, or a file built) and the baseline's, by name.

    The variant answers under the baseline's output names.
    """
    def runner(model):
        if isinstance(model, VariantSpec):
            return load_runner(model)
        return load_runner(VariantSpec(name=model.name, source=model.name, format="savedmodel",
                                       precision="fp32", path=model.path))

    served, reference = runner(variant), runner(baseline)
    assert [o.name for o in served.outputs] == [o.name for o in reference.outputs]
    test = load_split_feeds(data.dataset, "test")
    feeds = {"numbers": test["numbers"], "ids": test["ids"]}

    def test_mae(opened) -> float:
        return float(np.mean(np.abs(next(iter(outputs_batched(opened, feeds).values())).ravel()
                                    - test["y"])))

    return test_mae(served), test_mae(reference)


def test_a_keras_file_of_array_data_is_channel_pruned_thinner_and_relearns_with_its_loss(
        regression, tmp_path):
    baseline, data, _ = regression

    thinned = channel_prune_model.fn(baseline, ChannelPruneConfig(
        enabled=True, fraction=0.5, epochs=6, learning_rate=2e-3), data, tmp_path)

    assert thinned.format == "savedmodel" and thinned.keras_file.is_file()
    metrics = thinned.metrics
    assert metrics["params_after"] < 0.6 * metrics["params_before"], "48 hidden units to 24"
    assert metrics["flops_ratio"] < 0.6
    assert thinned.params["learned_from"] == "y"
    assert len(thinned.history["val_mae"]) == thinned.params["epochs_run"]
    assert metrics["test_mae"] < metrics["test_mae_before_fine_tuning"], "it relearned"
    mae, baseline_mae = _served_test_mae(thinned, baseline, data)
    assert mae == pytest.approx(metrics["test_mae"], rel=1e-4)
    assert mae < 1.5 * baseline_mae


def test_a_thinner_model_of_array_data_learns_from_y_and_the_model_before_it(regression,
                                                                           tmp_path):
    """``teacher_alpha`` below 1: its loss on ``y`` and the squared error to the baseline's
    outputs, not a classifier's softened class scores."""
    baseline, data, _ = regression

    thinned = channel_prune_model.fn(baseline, ChannelPruneConfig(
        enabled=True, fraction=0.5, epochs=4, learning_rate=2e-3, teacher_alpha=0.5), data,
        tmp_path)

    curves = thinned.history
    assert thinned.params["teacher_alpha"] == 0.5
    assert len(curves["distillation_loss"]) == thinned.params["epochs_run"]
    assert curves["distillation_loss"][-1] < curves["distillation_loss"][0]
    assert len(curves["val_mae"]) == thinned.params["epochs_run"], "judged by the metric"
    metrics = thinned.metrics
    assert metrics["test_mae"] < metrics["test_mae_before_fine_tuning"], "it relearned"
    mae, _ = _served_test_mae(thinned, baseline, data)
    assert mae == pytest.approx(metrics["test_mae"], rel=1e-4)


def test_residual_blocks_of_a_model_of_array_data_are_ranked_on_its_inputs_and_removed(
        regression, tmp_path):
    """Depth pruning, and width with depth, on a regressor of two inputs and two blocks."""
    _, data, tmp = regression
    baseline = import_array_model(ModelConfig(source="file", path=_their_keras3_file(
        tmp / "residual.keras", _regression(500, 1), "mse", join="residual")), data.dataset,
        tmp_path / "models", data.judged_by)
    data = _with_targets(data, baseline)

    shallower = depth_prune_model.fn(baseline, DepthPruneConfig(
        enabled=True, share=0.5, epochs=20, learning_rate=5e-3), data, tmp_path / "depth")
    both = width_depth_model.fn(baseline, WidthDepthConfig(
        enabled=True, fraction=0.5, share=0.5, epochs=20, learning_rate=5e-3), data,
        tmp_path / "both")

    for smaller in (shallower, both):
        assert smaller.format == "savedmodel" and smaller.params["learned_from"] == "y"
        assert smaller.metrics["blocks_removed"] == 1.0 and smaller.params["removed_blocks"]
        assert len(smaller.history["val_mae"]) == smaller.params["epochs_run"]
        mae, baseline_mae = _served_test_mae(smaller, baseline, data)
        assert mae == pytest.approx(smaller.metrics["test_mae"], rel=1e-4)
        assert mae < 0.3 * smaller.metrics["test_mae_before_fine_tuning"], "it relearned"
        assert mae < 2.5 * baseline_mae, "near the baseline with a block (and filters) fewer"
    assert both.metrics["params_after"] < shallower.metrics["params_after"]


@pytest.fixture(scope="module")
def added(regression):
    """The regressor with its inputs added (tfmot's QAT keeps their order), and its data."""
    _, data, tmp = regression
    baseline = import_array_model(ModelConfig(source="file", path=_their_keras3_file(
        tmp / "added.keras", _regression(500, 1), "mse", join="add")), data.dataset,
        tmp / "added-models", data.judged_by)
    return baseline, _with_targets(data, baseline)


def _int8_file(model, data, out_dir):
    """`model`'s int8 TFLite file, converted as a run converts it."""
    built = build_here(plan_variant(model.name, "tflite", "int8"), BuildSources(
        model=model, savedmodel=model, dataset=data.dataset, out_dir=out_dir),
        PipelineConfig().convert)
    assert built.status == "ok", built.error
    return built


def test_a_thinner_student_of_array_data_is_distilled_and_judged_against_its_controls(
        regression, tmp_path):
    """compress.distill's thinner student: its own loss on y and the teacher's outputs; its
    controls (from scratch, the same start alone) trained as long, gains in the metric."""
    baseline, data, _ = regression

    student = distill_model.fn(baseline, DistillConfig(
        enabled=True, student="thinner", thinner=0.5, epochs=6, alpha=0.5), data, tmp_path)

    assert student.name == "distilled-thinner-50" and student.format == "savedmodel"
    assert student.params["learned_from"] == "y"
    assert len(student.history["distillation_loss"]) == student.params["epochs_run"]
    metrics = student.metrics
    for key in ("test_mae", "scratch_test_mae", "scratch_val_mae", "same_start_test_mae"):
        assert metrics[key] > 0.0, key
    # Gains in MAE, positive where the distilled student's error is the lower.
    assert metrics["distillation_gain"] == pytest.approx(
        metrics["scratch_test_mae"] - metrics["test_mae"])
    assert metrics["teacher_outputs_gain"] == pytest.approx(
        metrics["same_start_test_mae"] - metrics["test_mae"])
    assert metrics["test_mae"] < metrics["scratch_test_mae"], "the teacher's start pays"
    mae, _ = _served_test_mae(student, baseline, data)
    assert mae == pytest.approx(metrics["test_mae"], rel=1e-4)


def test_a_keras_file_of_array_data_is_trained_quantization_aware_and_its_int8_file_serves(
        regression, added, tmp_path):
    concatenated, data, _ = regression
    # tfmot rebuilds this model's Concatenate with its inputs swapped: refused, not trained.
    with pytest.raises(NotApplicable, match=r"reorders the inputs of .*model-optimization#1061"):
        quantize_aware_train.fn(concatenated, QatConfig(epochs=1), data, tmp_path / "refused")
    baseline, data = added

    qat = quantize_aware_train.fn(baseline, QatConfig(epochs=2), data, tmp_path)

    assert qat.format == "savedmodel" and qat.params["learned_from"] == "y"
    assert qat.params["ranges_calibrated"] > 0, "ranges set from the training split's inputs"
    assert len(qat.history["val_mae"]) == qat.params["epochs_run"]
    # Its int8 file, converted as a run converts it, answers under the baseline's names.
    mae, baseline_mae = _served_test_mae(_int8_file(qat, data, tmp_path), baseline, data)
    assert mae < 1.5 * baseline_mae, (mae, baseline_mae, qat.metrics["test_mae"])


def test_pqat_and_pcqat_of_array_data_keep_the_zeros_in_their_int8_files(
        added, tmp_path):
    """PQAT of the pruned model, PCQAT of its clustered one, with the model's own loss: their
    int8 files keep the zeros and serve as well as the models they started from."""
    baseline, data = added
    pruned = prune_model.fn(baseline, PruneConfig(target_sparsity=0.5, epochs=2), data,
                            tmp_path)
    clustered = cluster_model.fn(pruned, ClusterConfig(enabled=True, clusters=8, epochs=1,
                                                       preserve_sparsity=True), data, tmp_path)

    pqat = prune_preserving_qat.fn(pruned, PqatConfig(enabled=True, epochs=1), data, tmp_path)
    pcqat = cluster_preserving_qat.fn(clustered, CqatConfig(enabled=True, epochs=1), data,
                                      tmp_path)

    assert pqat.params["scheme"] == "Default8BitPrunePreserveQuantizeScheme"
    assert pcqat.params["scheme"].endswith("(preserve_sparsity=True)")
    for quantized, start in ((pqat, pruned), (pcqat, clustered)):
        assert quantized.format == "savedmodel" and quantized.params["learned_from"] == "y"
        assert len(quantized.history["val_mae"]) == quantized.params["epochs_run"]
        built = _int8_file(quantized, data, tmp_path)
        read_back = int8_kernel_stats(built.path)
        sparsity = [v for k, v in read_back.items() if k.startswith("int8_sparsity.")]
        assert sparsity and max(sparsity) >= 0.45, read_back
        mae, _ = _served_test_mae(built, baseline, data)
        assert mae < 1.2 * start.metrics["test_mae"], "int8 as good as the model it started from"


def test_a_keras_file_of_array_data_is_clustered_with_its_loss(regression, tmp_path):
    baseline, data, _ = regression

    clustered = cluster_model.fn(baseline, ClusterConfig(enabled=True, clusters=8, epochs=2),
                                 data, tmp_path)

    assert clustered.format == "savedmodel" and clustered.keras_file.is_file()
    assert clustered.params["learned_from"] == "y"
    unique = {k: v for k, v in clustered.metrics.items() if k.startswith("unique_weights.")}
    assert unique and max(unique.values()) <= 8, unique
    mae, baseline_mae = _served_test_mae(clustered, baseline, data)
    assert mae == pytest.approx(clustered.metrics["test_mae"], rel=1e-4)
    assert mae < 1.5 * baseline_mae


def test_techniques_refuse_what_array_data_cannot_have_in_one_line(
        regression, tmp_path):
    baseline, data, tmp = regression
    config = PipelineConfig.model_validate({"compress": {
        "prune": {"enabled": True}, "qat": {"enabled": True}, "distill": {"enabled": True}}})
    refusals = {planned.technique.name: planned.refusal for planned in plan(config, baseline)}
    assert refusals["prune"] is None
    assert refusals["qat"] is None
    assert refusals["distill"] is None
    with pytest.raises(NotApplicable, match="the small student is an image CNN"):
        distill_model.fn(baseline, DistillConfig(), data, tmp_path)
    unknown = data.model_copy(update={"loss": None})
    with pytest.raises(NotApplicable, match=r"not compiled with one loss.*train\.loss"):
        prune_model.fn(baseline, PruneConfig(epochs=2), unknown, tmp_path)
    uncompiled = ModelConfig(source="file", path=_their_keras3_file(
        tmp / "uncompiled.keras", _regression(50, 2), None))
    assert fine_tuning_loss(uncompiled, None) is None
    assert fine_tuning_loss(uncompiled, "huber") == "huber", "train.loss names it"


def test_y_for_one_of_several_outputs_is_refused_in_one_line(regression, tmp_path):
    """y is the judged output's truth: the others would have nothing to learn from."""
    import keras

    _, data, _ = regression
    numbers, ids = keras.Input((6,), name="numbers"), keras.Input((1,), name="ids")
    hidden = keras.layers.Dense(16, activation="relu")(numbers)
    model = keras.Model({"numbers": numbers, "ids": ids},
                        {"value": keras.layers.Dense(1, name="value")(hidden),
                         "spread": keras.layers.Dense(1, name="spread")(hidden)})
    model.compile(optimizer="adam", loss="mse")
    model.save(tmp_path / "two.keras")
    judged = EvalConfig(metric="mae", output="value").settled(1.0, class_scores=False)
    baseline = import_array_model(ModelConfig(source="file", path=tmp_path / "two.keras"),
                                  data.dataset, tmp_path / "models", judged)
    two = _with_targets(data.model_copy(update={"judged_by": judged, "loss": "mse"}), baseline)

    with pytest.raises(NotApplicable, match=r"a model of 2 outputs learning y .* not built yet"):
        channel_prune_model.fn(baseline, ChannelPruneConfig(enabled=True, fraction=0.5,
                                                            epochs=1), two, tmp_path)


def test_inputs_without_labels_are_pruned_against_the_baselines_own_outputs(regression, tmp_path):
    """Self-distillation: no ``y``, a fidelity metric, the baseline's outputs the targets."""
    baseline, data, _ = regression
    (tmp_path / "inputs").mkdir()
    np.savez(tmp_path / "inputs" / "rows.npz",
             **{k: v for k, v in _regression(500, 1).items() if k != "y"})
    unlabelled = write_tfrecords.fn(DataConfig(source_dir=tmp_path / "inputs",
                                               source_format="npz", val_fraction=0.2,
                                               shard_size_mb=0.01), tmp_path / "work")
    judged = EvalConfig(metric="fidelity").settled(1.0, class_scores=False)
    baseline = import_array_model(ModelConfig(source="file", path=baseline.keras_file),
                                  unlabelled, tmp_path / "models", judged)
    assert baseline.metrics["val_snr_db"] > 100.0, "the file against its own outputs: the cap"
    blind = _with_targets(data.model_copy(update={"dataset": unlabelled, "judged_by": judged,
                                                  "loss": None}), baseline)
    assert blind.recover_to == pytest.approx(30.0), "the 30 dB floor"

    pruned = prune_model.fn(baseline, PruneConfig(target_sparsity=0.3, epochs=3,
                                                  learning_rate=2e-3), blind, tmp_path / "out")

    with pytest.raises(NotApplicable, match=r"compress\.channel_prune's self-distillation"):
        distill_model.fn(baseline, DistillConfig(student="thinner"), blind, tmp_path / "distill")
    assert pruned.params["learned_from"] == "the baseline's outputs (self-distillation)"
    assert len(pruned.history["val_snr_db"]) == 3
    assert pruned.metrics["test_snr_db"] > 15.0, "its outputs follow the baseline's closely"
    assert isinstance(pruned.params["recovered"], bool), "judged against the 30 dB floor"
