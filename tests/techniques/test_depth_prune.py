"""Depth pruning: residual blocks found right, the least influential removed, the rest kept."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
import tf_keras as keras

from tfopt.models.depth_pruning import (
    DepthPruningError,
    blocks_to_remove,
    residual_blocks,
    shallower_model,
)


def _residual_stack(blocks: int = 3) -> keras.Model:
    """A stem and `blocks` residual blocks in a row, then a projection shortcut and a head."""
    inputs = keras.Input((10, 10, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    for index in range(blocks):
        branch = keras.layers.Conv2D(8, 3, padding="same", activation="relu",
                                     name=f"b{index}_conv")(x)
        branch = keras.layers.Conv2D(8, 1, name=f"b{index}_project")(branch)
        x = keras.layers.Add(name=f"b{index}_add")([x, branch])
    shortcut = keras.layers.Conv2D(16, 1, name="shortcut")(x)
    widened = keras.layers.Conv2D(16, 3, padding="same", name="widen")(x)
    x = keras.layers.Add(name="projected_add")([shortcut, widened])
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(4, name="logits")(x))


def _images(model: keras.Model, count: int = 6) -> np.ndarray:
    return np.random.default_rng(1).random((count, *model.input_shape[1:]), dtype=np.float32)


def _silence(model: keras.Model, block: int) -> None:
    """Block `block`'s branch adds nothing: its last convolution's weights are zero."""
    project = model.get_layer(f"b{block}_project")
    project.set_weights([np.zeros_like(weight) for weight in project.get_weights()])


def test_residual_blocks_are_the_adds_whose_skip_feeds_their_branch_not_projections():
    blocks = residual_blocks(_residual_stack())
    assert [block.add for block in blocks] == ["b0_add", "b1_add", "b2_add"]
    assert blocks[0].skip == "stem" and blocks[1].skip == "b0_add"
    assert blocks[1].branch == {"b1_conv", "b1_project"}


def test_a_block_that_adds_nothing_goes_first_and_the_outputs_stay_the_same():
    model = _residual_stack()
    _silence(model, 1)
    images = _images(model)
    shallower = shallower_model(model, 1 / 3, images)
    assert shallower.removed == ["b1_add"] and shallower.blocks == 3
    assert shallower.influence["b1_add"] == pytest.approx(0.0, abs=1e-6)
    assert min(shallower.influence["b0_add"], shallower.influence["b2_add"]) > 1e-4
    names = {layer.name for layer in shallower.model.layers}
    assert not names & {"b1_add", "b1_conv", "b1_project"}
    np.testing.assert_allclose(shallower.model(images), model(images), rtol=1e-5, atol=1e-5)


def test_blocks_in_a_row_removed_together_pass_the_first_ones_input_on():
    model = _residual_stack()
    for block in range(3):
        _silence(model, block)
    images = _images(model)
    shallower = shallower_model(model, 1.0, images)
    assert sorted(shallower.removed) == ["b0_add", "b1_add", "b2_add"]
    assert len(shallower.model.layers) == len(model.layers) - 9
    np.testing.assert_allclose(shallower.model(images), model(images), rtol=1e-5, atol=1e-5)


def test_shares_round_to_whole_blocks_and_remove_at_least_one():
    assert [blocks_to_remove(share, 9) for share in (0.05, 0.25, 0.5, 0.875, 1.0)] == [
        1, 2, 5, 8, 9]


def test_a_model_without_residual_blocks_is_refused_with_the_reason():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(x)))
    with pytest.raises(DepthPruningError, match="no residual block"):
        shallower_model(model, 0.5, _images(model, 2))


def _silence_branches(model: keras.Model) -> None:
    """Each block's branch ends in a batch norm made to output zero: it passes its input on."""
    for block in residual_blocks(model):
        end = next(name for name in _inbound_names(model, block.add) if name in block.branch)
        layer = model.get_layer(end)
        while not isinstance(layer, keras.layers.BatchNormalization):
            layer = layer.inbound_nodes[0].inbound_layers
        gamma, beta, mean, var = layer.get_weights()
        layer.set_weights([gamma * 0.0, beta * 0.0, mean, var])


def _inbound_names(model: keras.Model, name: str) -> list[str]:
    return [layer.name for layer in model.get_layer(name).inbound_nodes[0].inbound_layers]


@pytest.mark.parametrize(("build", "count"), [
    (lambda: keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=4), 10),
    (lambda: keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=4,
                                                 include_preprocessing=False), 6),
    (lambda: keras.applications.EfficientNetB0(input_shape=(32, 32, 3), weights=None,
                                               classes=4), 9),
], ids=["mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0"])
def test_the_zoos_residual_blocks_are_found_and_removed_exactly(build, count):
    model = build()
    images = _images(model, 2)
    assert len(residual_blocks(model)) == count
    half = shallower_model(model, 0.5, images)
    assert len(half.removed) == blocks_to_remove(0.5, count)
    assert half.model.count_params() < model.count_params()
    _silence_branches(model)
    none_left = shallower_model(model, 1.0, images)
    assert len(none_left.removed) == count
    np.testing.assert_allclose(none_left.model(images), model(images), rtol=1e-4, atol=1e-5)


def _residual_baseline(tiny_data, tmp_path, filters: int = 8):
    """A stem and four residual blocks on the tiny data set, saved as the run's baseline."""
    from tfopt.artifacts import ModelArtifact
    from tfopt.models.keras_io import keras_model_path, save_keras_model

    dataset = tiny_data.dataset
    inputs = keras.Input((dataset.image_size, dataset.image_size, dataset.channels))
    x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name="stem")(inputs)
    for index in range(4):
        branch = keras.layers.Conv2D(filters, 3, padding="same", activation="relu",
                                     name=f"b{index}_conv")(x)
        x = keras.layers.Add(name=f"b{index}_add")([x, branch])
    x = keras.layers.GlobalAveragePooling2D()(x)
    net = keras.Model(inputs, keras.layers.Dense(dataset.num_classes, name="logits")(x))
    path = keras_model_path(tmp_path, "residual")
    save_keras_model(net, path)
    start = ModelArtifact(name="baseline", path=path, format="keras",
                          image_size=dataset.image_size, num_classes=dataset.num_classes,
                          channels=dataset.channels)
    return net, path, start


def test_the_technique_removes_blocks_fine_tunes_and_can_follow_channel_pruning(
        tiny_data, tmp_path):
    from compress import plan
    from flows.parameters import PipelineConfig
    from techniques import registry
    from techniques.base import NotApplicable
    from techniques.depth_prune import DepthPruneConfig, depth_prune_model
    from tfopt.artifacts import ModelArtifact
    from tfopt.models.keras_io import save_keras_model

    dataset = tiny_data.dataset
    net, path, start = _residual_baseline(tiny_data, tmp_path)

    made = depth_prune_model.fn(start, DepthPruneConfig(enabled=True, share=0.5, epochs=1),
                                tiny_data, tmp_path)
    assert made.name == "depth-50" and made.path.exists()
    assert made.metrics["blocks_removed"] == 2 and made.metrics["blocks_removable"] == 4
    assert made.metrics["layers_after"] == made.metrics["layers_before"] - 4
    assert made.metrics["flops_ratio"] < 1.0 and 0.0 <= made.metrics["test_accuracy"] <= 1.0
    assert made.params["epochs_run"] == 1 and made.params["starts_from"] == "baseline"

    flat = ModelArtifact(name="flat", path=path, format="keras", image_size=dataset.image_size,
                         num_classes=dataset.num_classes, channels=dataset.channels)
    flat_inputs = keras.Input(net.input_shape[1:])
    save_keras_model(keras.Model(flat_inputs, keras.layers.Dense(dataset.num_classes)(
        keras.layers.Flatten()(flat_inputs))), path)
    with pytest.raises(NotApplicable, match="no residual block"):
        depth_prune_model.fn(flat, DepthPruneConfig(enabled=True, epochs=1), tiny_data, tmp_path)

    chained = PipelineConfig.model_validate({"compress": {
        "channel_prune": {"enabled": True, "fraction": 0.5},
        "depth_prune": {"enabled": True, "share": "auto", "after_channel_prune": True},
        "tflite": ["int8"]}})
    planned = {p.technique.name: p for p in plan(chained, start)}
    assert planned["depth_prune"].starts_from == "channel_prune"
    assert planned["depth_prune"].variants[0].derived_from.startswith("channels-50-")
    assert list(registry()).index("depth_prune") > list(registry()).index("channel_prune")
    alone = chained.model_copy(update={"compress": chained.compress.model_copy(update={
        "channel_prune": chained.compress.channel_prune.model_copy(update={"enabled": False})})})
    refused = {p.technique.name: p for p in plan(alone, start)}["depth_prune"]
    assert "enable compress.channel_prune" in str(refused.refusal)


def test_width_and_depth_cut_together_in_one_model_fine_tuned_once(tiny_data, tmp_path):
    from compress import plan
    from techniques import registry
    from techniques.depth_prune import DepthPruneConfig, depth_prune_model
    from techniques.width_depth import WidthDepthConfig, width_depth_model
    from tfopt.search import Joint

    _, _, start = _residual_baseline(tiny_data, tmp_path, filters=16)
    both = width_depth_model.fn(start, WidthDepthConfig(enabled=True, fraction=0.5, share=0.5,
                                                        epochs=1), tiny_data, tmp_path)
    depth = depth_prune_model.fn(start, DepthPruneConfig(enabled=True, share=0.5, epochs=1),
                                 tiny_data, tmp_path)
    assert both.name == "width-50-depth-50" and both.path.exists()
    assert both.metrics["blocks_removed"] == 2 and both.params["epochs_run"] == 1
    assert both.metrics["flops_ratio"] < 0.5 * depth.metrics["flops_ratio"], (
        "half the filters of what depth pruning left")
    assert (both.params["fraction"], both.params["share"]) == (0.5, 0.5)
    with pytest.raises(ValueError, match="searched together"):
        WidthDepthConfig(fraction="auto", share=0.5)
    technique = registry()["width_depth"]
    assert isinstance(technique.knob, Joint) and technique.knob.field == "fraction+share"
    searched = WidthDepthConfig(enabled=True)
    assert technique.searched(searched) and technique.source_name(searched) == (
        "width-depth-auto")
    from flows.parameters import PipelineConfig

    config = PipelineConfig.model_validate({"compress": {"width_depth": {"enabled": True},
                                                         "tflite": ["int8"]}})
    planned = {p.technique.name: p for p in plan(config, start)}["width_depth"]
    assert planned.refusal is None and planned.starts_from is None


def test_searches_from_the_baseline_run_before_the_techniques_submitted_beside_them(
        tiny_baseline):
    from compress import plan
    from compress.planner import searches_first
    from flows.parameters import PipelineConfig

    minimal = PipelineConfig.model_validate({"name": "minimal"})
    assert minimal.compress.channel_prune.fraction == "auto"
    assert minimal.compress.depth_prune.share == "auto"
    config = PipelineConfig.model_validate({"name": "both", "compress": {
        **{name: {"enabled": True} for name in ("distill", "qat")},
        "channel_prune": {"enabled": True, "fraction": "auto"},
        "depth_prune": {"enabled": True, "share": "auto"}}})
    planned = [p.technique.name for p in plan(config, tiny_baseline)]
    assert planned.index("depth_prune") > planned.index("qat"), "run order: its possible bases"
    first = [p.technique.name for p in searches_first(plan(config, tiny_baseline))]
    assert first[:2] == ["depth_prune", "channel_prune"], "its strongest share tried first"
    assert sorted(first[2:]) == sorted(set(planned) - {"channel_prune", "depth_prune"})


def test_a_technique_the_budget_cuts_or_whose_start_was_skipped_ends_completed_as_skipped(
        tiny_baseline, tiny_data, tmp_path):
    from compress import contained, plan
    from compress.planner import searched_from_baseline
    from flows.parameters import PipelineConfig
    from techniques.base import Skipped
    from tfopt.schedule.budget import CUT_BY_BUDGET

    config = PipelineConfig.model_validate({"name": "cut", "compress": {
        **{name: {"enabled": True} for name in ("distill", "qat")},
        "channel_prune": {"enabled": True, "fraction": "auto"}}})
    after = [p for p in plan(config, tiny_baseline)
             if p.refusal is None and not searched_from_baseline(p)]
    qat = next(p for p in after if p.technique.name == "qat")
    short = tiny_data.model_copy(update={"deadline": time.time() + 30.0, "epoch_s": 10.0})
    state = contained("qat").fn(tiny_baseline, qat.cfg, short, tmp_path)
    assert state.is_completed() and state.name == "Skipped", "no red in the Prefect UI"
    cut = state.result()
    assert isinstance(cut, Skipped) and cut.kind == "cut"
    assert re.match(rf"qat: {CUT_BY_BUDGET}: .* s were left for qat's fine-tuning, less than "
                    r"its shortest run \(45.0 s\)", cut.line())
    assert state.message == cut.line()
    after_it = contained("qat").fn(cut, qat.cfg, tiny_data, tmp_path).result()
    assert after_it.kind == "upstream" and after_it.line().startswith(
        "qat continues from the qat technique's model, which was skipped: qat: cut")


def test_a_model_the_technique_does_not_apply_to_ends_its_search_at_the_first_trial(tmp_path):
    from compress.planner import refusal_of
    from techniques.depth_prune import KNOB
    from tfopt.search import Search, Trial

    search = Search(KNOB, tmp_path / "study", "refused", target=0.9)
    assert refusal_of(search) is None
    assert [point for point, _ in search.next_trials()] == [{"share": 1.0}]
    search.finish(Trial(params={"share": 1.0}, status="not_applicable",
                        error="no residual block to remove"))
    assert refusal_of(search) == "no residual block to remove"
    other = Search(KNOB, tmp_path / "other", "crashed", target=0.9)
    other.next_trials()
    other.finish(Trial(params={"share": 1.0}, status="failed",
                       error="NativeCrashError: SIGSEGV"))
    assert refusal_of(other) is None, "a crash is that setting's, not the model's"


def test_each_fine_tuning_gets_its_shortest_run_then_its_epochs_share_of_the_rest(tiny_data):
    from tfopt.schedule.prices import own_deadline

    now = time.time()
    queued = tiny_data.model_copy(update={"deadline": now + 100.0,
                                          "queued": ((10.0, 20.0), (30.0, 10.0))})
    first = own_deadline(queued, 20, 10.0)
    assert first.deadline - now == pytest.approx(10.0 + 60.0 * 20 / 30, abs=1.0)
    assert first.queued == (), "its own, not shared on"
    tight = queued.model_copy(update={"deadline": now + 30.0})
    assert own_deadline(tight, 20, 10.0).deadline == tight.deadline, (
        "the one after it cannot have its shortest run behind it: it keeps none")
    three = queued.model_copy(update={"deadline": now + 60.0,
                                      "queued": ((10.0, 20.0), (15.0, 5.0), (40.0, 5.0))})
    assert own_deadline(three, 20, 10.0).deadline - now == pytest.approx(
        10.0 + (60.0 - 25.0) * 20 / 25, abs=1.0), "the second's shortest run kept, the third's not"
    last = queued.model_copy(update={"queued": ((10.0, 2.0),)})
    assert own_deadline(last, 2, 10.0).deadline == queued.deadline, "the last takes what is left"
    assert own_deadline(tiny_data, 20, 10.0) == tiny_data, "no budget: no deadline"


def test_a_distilled_student_can_lack_the_teachers_least_influential_blocks_too(
        tiny_data, tmp_path):
    from techniques.base import NotApplicable
    from techniques.distill import DistillConfig, distill_model, shallower_teacher
    from tfopt.models.keras_io import load_keras_model

    _, _, start = _residual_baseline(tiny_data, tmp_path, filters=16)
    cfg = DistillConfig(enabled=True, student="thinner", thinner=0.5, shallower=0.5, epochs=1)
    made = distill_model.fn(start, cfg, tiny_data, tmp_path / "both")
    thinner = distill_model.fn(start, cfg.model_copy(update={"shallower": 0.0}), tiny_data,
                               tmp_path / "thinner")
    assert (made.name, thinner.name) == ("distilled-thinner-50-depth-50", "distilled-thinner-50")
    assert len(load_keras_model(made.path).layers) == (
        len(load_keras_model(thinner.path).layers) - 4), "two of four blocks, two layers each"
    assert made.params["shallower"] == 0.5 and "50% of residual blocks" in made.params["student"]
    assert "scratch_test_accuracy" in made.metrics, "its controls have its architecture"

    flat = keras.Sequential([keras.Input((tiny_data.dataset.image_size,) * 2 + (3,)),
                             keras.layers.Conv2D(4, 3), keras.layers.Flatten(),
                             keras.layers.Dense(tiny_data.dataset.num_classes)])
    with pytest.raises(NotApplicable, match="cannot be made shallower: no residual block"):
        shallower_teacher(flat, 0.5, tiny_data)
    with pytest.raises(ValueError, match="student: thinner"):
        DistillConfig(shallower=0.5)


def test_a_fine_tuning_runs_the_epochs_its_deadline_holds_so_its_ramp_ends_before_it(tiny_data):
    from techniques.prune import PruneConfig, first_sparse_epoch
    from tfopt.artifacts import LearnedCosts
    from tfopt.schedule.prices import within_deadline

    cfg = PruneConfig(epochs=10)
    paced = tiny_data.model_copy(update={"epoch_s": 2.0, "costs": None})
    assert within_deadline("prune", cfg, paced) == cfg, "no deadline: its cap"
    # guessed price: 5 s start, each epoch twice the baseline's (4 s): 33 s hold 7 epochs
    held = within_deadline("prune", cfg, paced.model_copy(update={"deadline": time.time() + 33.5}))
    assert held.epochs == 7
    assert first_sparse_epoch(held, 10, held.epochs) < held.epochs - 1, "recovery after the ramp"
    assert within_deadline("prune", cfg, paced.model_copy(
        update={"deadline": time.time() + 3.0})).epochs == 2, "never below its shortest run"
    assert within_deadline("prune", cfg, paced.model_copy(
        update={"deadline": time.time() + 500.0})) == cfg, "all fit: unchanged"
    assert within_deadline("prune", cfg, paced.model_copy(
        update={"deadline": time.time() + 33.5, "epoch_s": 0.0})) == cfg, "no pace: its cap"
    learned = paced.model_copy(update={"costs": LearnedCosts(
        path=Path("unused"), key="k", startup_epochs={"prune": 1.0},
        epoch_shares={"prune": 1.0})})
    assert within_deadline("prune", cfg, learned.model_copy(
        update={"deadline": time.time() + 13.5})).epochs == 5, "priced as learned: 2 s + 2 s each"


def test_a_training_that_ran_the_epochs_its_deadline_held_was_ended_by_the_budget(
        tiny_baseline, tiny_data):
    from compress import cut_short
    from tfopt.schedule.prices import ended_by_deadline

    ran = tiny_baseline.model_copy(update={
        "history": {"val_accuracy": [0.5, 0.6, 0.7]},
        "params": {"stopped_by": "cap", "epochs_run": 3, "kept_epoch": 3}})
    ended = ended_by_deadline(ran, 10)
    assert ended.params["stopped_by"] == "budget"
    assert ended.params["stop_reason"] == "budget: the 3 of its 10 epochs its deadline held"
    assert cut_short(ended, tiny_data.model_copy(update={"recover_to": 0.95}), 0.01), (
        "far from back: its forms not worth building")
    recovered = ran.model_copy(update={"params": {**ran.params, "stopped_by": "recovered"}})
    assert ended_by_deadline(recovered, 10) == recovered, "back before its lowered cap"
