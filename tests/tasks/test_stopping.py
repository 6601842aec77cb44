"""Trainings end when more epochs would not pay: the baseline on its plateau, a fine-tuning once
its accuracy is back within the budget, any of them at its deadline."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tf_keras as keras

from tfopt.artifacts import ModelArtifact
from tfopt.models.training import StopWhenDone


def _run(judge: StopWhenDone, accuracies: list[float], rate: float = 1e-3,
         losses: list[float] | None = None) -> list[float]:
    """Feed `judge` one epoch's validation accuracy (and loss) at a time; the rate each epoch."""
    model = SimpleNamespace(stop_training=False,
                            optimizer=SimpleNamespace(learning_rate=keras.backend.variable(rate)))
    judge.set_model(model)
    rates = []
    for epoch, value in enumerate(accuracies):
        judge.on_epoch_begin(epoch)
        judge.on_epoch_end(epoch, {"val_accuracy": value,
                                   **({"val_loss": losses[epoch]} if losses else {})})
        rates.append(float(keras.backend.get_value(model.optimizer.learning_rate)))
        if model.stop_training:
            break
    return rates


def test_a_plateau_halves_the_rate_then_ends_the_training_converged():
    judge = StopWhenDone(patience=4, min_delta=0.01)
    rates = _run(judge, [0.5, 0.7, 0.8, 0.805, 0.79, 0.8, 0.81, 0.9, 0.95])
    assert len(rates) == 7, "four epochs without a gain of 0.01 after epoch 3"
    assert rates[4] == pytest.approx(5e-4), "halved after half the patience"
    outcome = judge.outcome(cap=50)
    assert outcome["converged"] and outcome["stop_reason"].startswith("plateau")
    assert (outcome["epochs_run"], outcome["best_epoch"]) == (7, 7)


def test_a_saturated_split_reads_the_loss_before_it_calls_a_plateau():
    # The demo baseline's selection split (191 images): every image right from epoch 5 while
    # its loss still fell by a quarter an epoch.
    accuracies = [0.9372, 0.9372, 0.9791, 0.9634, 1.0, 0.9948, 1.0, 0.9948, 1.0, 1.0, 1.0, 1.0]
    losses = [0.697, 0.364, 0.161, 0.136, 0.0592, 0.049, 0.047, 0.0312, 0.0259, 0.0186, 0.017,
              0.0182]
    on_accuracy = StopWhenDone(patience=4, min_delta=0.002)
    assert len(_run(on_accuracy, accuracies)) == 9, "blind past epoch 5 without the loss"
    with_loss = StopWhenDone(patience=4, min_delta=0.002)
    flat = [0.0182, 0.0181, 0.0183, 0.0182]  # the loss wavers: a plateau after all
    assert len(_run(with_loss, accuracies + [1.0] * 4, losses=losses + flat)) == 15
    assert with_loss.outcome(cap=50)["stop_reason"] == (
        "plateau: no held-out accuracy gain of 0.002 (nor a held-out loss 1% lower at the same "
        "accuracy) for 4 epochs")
    # A lower loss at a lower accuracy is no gain.
    worse = StopWhenDone(patience=2, min_delta=0.0)
    assert len(_run(worse, [0.9, 0.8, 0.8], losses=[0.5, 0.3, 0.2])) == 3


def test_back_within_the_budget_the_rate_cools_down_to_zero_then_the_training_ends():
    from tfopt.models.training import CosineCoolDown

    per_epoch = 4
    cool = CosineCoolDown(1e-3, steps=10 * per_epoch, steps_per_epoch=per_epoch, epochs=2)
    model = SimpleNamespace(stop_training=False,
                            optimizer=SimpleNamespace(learning_rate=keras.backend.variable(1e-3)))
    judge = StopWhenDone(target=0.9, settle=3, cool_down=cool)
    cool.set_model(model)
    judge.set_model(model)
    rates = []
    for epoch, value in enumerate([0.5, 0.92, 0.95, 0.96, 0.97, 0.98]):
        judge.on_epoch_begin(epoch)
        for batch in range(per_epoch):
            cool.on_train_batch_begin(batch)
            rates.append(float(keras.backend.get_value(model.optimizer.learning_rate)))
        judge.on_epoch_end(epoch, {"val_accuracy": value})
        if model.stop_training:
            break
    assert judge.outcome(cap=10)["epochs_run"] == 4, "back at epoch 2, then 2 epochs cooling"
    assert judge.reason.endswith("then 2 epochs cooling down"), judge.reason
    assert rates[:8] == pytest.approx([cool.rate(step) for step in range(8)])
    assert rates[4] < rates[0] and rates[8] == pytest.approx(cool.rate(8)), "the cosine, then"
    cooling = rates[8:]
    assert all(later < earlier for earlier, later in itertools.pairwise(cooling))
    assert cooling[-1] == pytest.approx(cooling[0] / (2 * per_epoch)), "straight down to zero"


def _run_batches(callbacks: list, accuracies: list[float], per_epoch: int,
                 rate: float = 1e-3) -> list[float]:
    """Like `_run`, batch by batch: the learning rate of every batch."""
    model = SimpleNamespace(stop_training=False,
                            optimizer=SimpleNamespace(learning_rate=keras.backend.variable(rate)))
    for callback in callbacks:
        callback.set_model(model)
    rates = []
    for epoch, value in enumerate(accuracies):
        for callback in callbacks:
            callback.on_epoch_begin(epoch)
        for batch in range(per_epoch):
            for callback in callbacks:
                callback.on_train_batch_begin(batch)
            rates.append(float(keras.backend.get_value(model.optimizer.learning_rate)))
        for callback in callbacks:
            callback.on_epoch_end(epoch, {"val_accuracy": value})
        if model.stop_training:
            break
    return rates


def test_on_its_plateau_the_baseline_takes_its_rate_to_zero_before_it_ends():
    from tfopt.models.training import CoolDown

    per_epoch = 4
    cool = CoolDown(per_epoch, epochs=2)
    judge = StopWhenDone(patience=2, min_delta=0.01, cool_down=cool)
    rates = _run_batches([cool, judge], [0.5, 0.8, 0.8, 0.8, 0.9, 0.8, 0.8], per_epoch)
    outcome = judge.outcome(cap=50)
    assert outcome["epochs_run"] == 6, "on the plateau after epoch 4, then 2 epochs cooling down"
    assert outcome["converged"] and outcome["stop_reason"] == (
        "plateau: no held-out accuracy gain of 0.01 for 2 epochs, then 2 epochs cooling down")
    assert outcome["best_epoch"] == 5, "a gain while cooling counts for the kept epoch"
    assert rates[:12] == pytest.approx([1e-3] * 12)
    assert rates[12:16] == pytest.approx([5e-4] * 4), "halved after half the patience"
    cooling = rates[16:]
    assert cooling[0] == pytest.approx(5e-4), "from the rate it had"
    assert all(later < earlier for earlier, later in itertools.pairwise(cooling))
    assert cooling[-1] == pytest.approx(5e-4 / (2 * per_epoch)), "straight down to zero"

    late = StopWhenDone(patience=2, min_delta=0.01, deadline=time.time() - 1,
                        cool_down=CoolDown(per_epoch, epochs=5))
    _run_batches([late], [0.5], per_epoch)
    assert late.outcome(cap=50)["stop_reason"].startswith("budget"), "not yet on a plateau"
    assert late.outcome(cap=50)["stopped_by"] == "budget"
    cut = StopWhenDone(patience=1, min_delta=0.01, cool_down=CoolDown(per_epoch, epochs=5))
    _run_batches([cut], [0.5, 0.5], per_epoch)
    cut._deadline = time.time() - 1  # the plateau reached, then the deadline while cooling
    _run_batches([cut], [0.5, 0.5], per_epoch)
    assert cut.outcome(cap=50)["converged"], cut.reason
    assert cut.reason.endswith("cooling down (the time planned for this training was used)")
    assert cut.outcome(cap=50)["stopped_by"] == "budget_cooling"
    capped = StopWhenDone(patience=1, min_delta=0.01, cool_down=CoolDown(per_epoch, epochs=5))
    _run_batches([capped], [0.5, 0.5, 0.5], per_epoch)  # train.epochs: 3 ends it while cooling
    assert capped.outcome(cap=3)["converged"] and capped.outcome(cap=3)["stopped_by"] == "plateau"
    assert capped.outcome(cap=3)["stop_reason"] == (
        "plateau: no held-out accuracy gain of 0.01 for 1 epoch, then 1 epoch cooling down "
        "(cap: 3 epochs run)")


def test_the_cap_is_not_convergence():
    judge = StopWhenDone(patience=3, min_delta=0.0)
    _run(judge, [0.5, 0.6, 0.7, 0.8])
    outcome = judge.outcome(cap=4)
    assert not outcome["converged"]
    assert outcome["stop_reason"] == "cap: 4 epochs run, still improving"


def test_a_fine_tuning_ends_once_back_within_the_budget_and_no_longer_improving():
    judge = StopWhenDone(target=0.9, from_epoch=2)
    _run(judge, [0.95, 0.96, 0.85, 0.92, 0.93, 0.93, 0.97])
    outcome = judge.outcome(cap=10)
    assert outcome["epochs_run"] == 6, "the ramp's epochs do not count; 0.93 did not improve"
    assert outcome["recovered"] and outcome["converged"]
    assert outcome["stop_reason"].startswith("recovered: held-out accuracy 0.9300")

    settled = StopWhenDone(target=0.9, settle=3)
    _run(settled, [0.85, 0.92, 0.91, 0.94, 0.93, 0.93, 0.94, 0.95])
    assert settled.outcome(cap=10)["epochs_run"] == 7, "three epochs without a gain on 0.94"

    hopeless = StopWhenDone(target=0.9)
    _run(hopeless, [0.5, 0.6, 0.6, 0.7])
    assert not hopeless.outcome(cap=4)["recovered"], "never back within the budget"


def test_a_deadline_ends_a_training_before_an_epoch_would_pass_it():
    judge = StopWhenDone(patience=10, deadline=time.time() + 3600)
    _run(judge, [0.5, 0.6])
    assert judge.reason == ""
    late = StopWhenDone(patience=10, deadline=time.time() - 1)
    _run(late, [0.5, 0.6, 0.7])
    ended = late.outcome(cap=50)
    assert ended["stop_reason"].startswith("budget") and ended["epochs_run"] == 1
    assert ended["stopped_by"] == "budget" and not ended["converged"]


def test_a_deadline_passed_within_a_long_epoch_ends_it_at_that_batch_validation_still_run():
    class SlowSteps(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            SlowSteps.batches += 1
            time.sleep(0.05)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    images = np.random.default_rng(0).normal(size=(200, 4)).astype("float32")
    labels = np.arange(200) % 3
    judge = StopWhenDone(patience=10, deadline=time.time() + 0.5)
    history = model.fit(images, labels, batch_size=2, epochs=3, verbose=0,
                        validation_data=(images[:20], labels[:20]),
                        callbacks=[SlowSteps(), judge])
    assert SlowSteps.batches < 50, "100 batches of 50 ms an epoch: stopped within the first"
    assert len(history.history["val_accuracy"]) == 1, "the cut epoch still validated"
    ended = judge.outcome(cap=3)
    assert ended["stopped_by"] == "budget" and ended["epochs_run"] == 1


def test_the_baseline_trains_until_its_plateau_and_says_so(tiny_data, tmp_path):
    from tasks.train_model import train_model
    from tfopt.config import TrainConfig
    from tfopt.models.config import ModelConfig

    baseline = train_model.fn(tiny_data.model_copy(update={"seed": 3}), ModelConfig(width=8),
                              TrainConfig(epochs=60, patience=2, learning_rate=0.01),
                              tmp_path)
    params = baseline.params
    assert params["converged"] is True and params["stop_reason"].startswith("plateau"), params
    assert params["epochs_run"] < 60 and params["kept_epoch"] <= params["epochs_run"]
    assert baseline.metrics["best_val_accuracy"] == max(baseline.history["val_accuracy"])


def test_a_technique_stops_once_recovered_and_logs_it(tiny_baseline, tiny_data, tmp_path):
    from techniques.qat import QatConfig, quantize_aware_train
    from tfopt.models.training import SETTLE_EPOCHS

    # n validation images give n + 1 accuracies, so at most n + 1 gains, each followed by fewer
    # than SETTLE_EPOCHS epochs without one, then SETTLE_EPOCHS without: the recovery stops it
    # by epoch (n + 1) * SETTLE_EPOCHS + 1 however the tiny baseline came out (CI's read val 0.2
    # and its QAT kept gaining for all of a 10-epoch cap).
    accuracies = tiny_data.dataset.splits["val"].examples + 1
    cap = accuracies * SETTLE_EPOCHS + 2
    made = quantize_aware_train.fn(tiny_baseline, QatConfig(epochs=cap),
                                   tiny_data.model_copy(update={"recover_to": 0.0}), tmp_path)
    assert made.params["recovered"] is True and made.metrics["recovered"] == 1.0
    assert made.params["epochs_run"] == made.metrics["epochs_run"] < cap, made.params
    assert made.params["stop_reason"].startswith("recovered"), made.params["stop_reason"]


@pytest.fixture(scope="module")
def ten_digits(tmp_path_factory: pytest.TempPathFactory):
    """All ten digits: the three-class set's nine validation images can all be right after one
    epoch (CI read val 1.0 at 1e-5), leaving nothing to train further for."""
    from tasks.write_tfrecords import write_tfrecords
    from tests.conftest import write_digit_folder
    from tests.steps import training_data
    from tfopt.config import DataConfig

    folder = write_digit_folder(tmp_path_factory.mktemp("ten_digits"), classes=10)
    config = DataConfig(source_dir=folder, image_size=16, val_fraction=0.2, test_fraction=0.2,
                        shard_size_mb=0.004)
    return training_data(write_tfrecords.fn(config, tmp_path_factory.mktemp("ten_work")))


def test_a_baseline_its_children_beat_trains_further_from_its_weights(ten_digits, tmp_path):
    from tasks.continue_training import continue_training
    from tasks.train_model import train_model
    from tfopt.config import TrainConfig
    from tfopt.models.baseline import children_beating
    from tfopt.models.config import ModelConfig

    short = TrainConfig(epochs=1, batch_size=16, stop="fixed", learning_rate=1e-5)
    under = train_model.fn(ten_digits, ModelConfig(width=8), short, tmp_path / "first")
    assert under.metrics["best_val_accuracy"] < 0.5, "one slow epoch on ten classes"
    best = under.metrics["best_val_accuracy"]
    val_examples = ten_digits.dataset.splits["val"].examples
    margin = max(0.01, 2.0 / val_examples)  # the budget's point, or two validation images
    child = under.model_copy(update={"name": "thinner",
                                     "history": {"val_accuracy": [best + margin + 0.01]}})
    level = under.model_copy(update={"name": "level",
                                     "history": {"val_accuracy": [best + margin]}})
    assert children_beating(under, [level], 1.0, val_examples) == []
    (beating,) = children_beating(under, [child, level], 1.0, val_examples)
    assert beating.startswith("thinner")

    longer = TrainConfig(epochs=8, batch_size=16, learning_rate=0.02)  # a quarter of it
    further = continue_training.fn(under, ten_digits, longer, tmp_path / "further")
    ran = further.params["continued_epochs"]
    assert 1 <= ran <= 8
    assert further.path != under.path, "one epoch left room to gain"
    assert further.metrics["best_val_accuracy"] > best
    assert len(further.history["val_accuracy"]) == len(under.history["val_accuracy"]) + ran
    assert further.params["stop_reason"].startswith("continued after compression")
    assert further.params["epochs_run"] == under.params["epochs_run"] + ran


def test_a_fine_tuning_is_back_within_two_validation_images_and_a_file_within_the_budget():
    # configs/bench.yaml: the baseline's best epoch read 1.0 on 157 validation images and 0.9909
    # on the test split; one image either way on validation is noise, not a verdict.
    from tfopt.models.baseline import (
        children_beating,
        kept_val_accuracy,
        recovery_target,
        validation_margin,
    )

    baseline = ModelArtifact(name="baseline", path=Path("unused"), format="keras",
                             image_size=16, num_classes=10,
                             metrics={"best_val_accuracy": 1.0, "test_accuracy": 0.9909})
    assert validation_margin(1.0, 157) == pytest.approx(2 / 157)
    assert validation_margin(1.0, 1000) == pytest.approx(0.01), "the budget, on a large split"
    assert validation_margin(1.0, 0) == pytest.approx(0.01)
    assert recovery_target(baseline, 1.0, 157) == pytest.approx(155 / 157, abs=1e-5)
    assert kept_val_accuracy(baseline, 1.0) == pytest.approx(0.99, abs=1e-5), (
        "the champion's rule, on validation: the test split is never chosen on")
    assert recovery_target(baseline.model_copy(update={"metrics": {}}), 1.0, 157) is None
    read_by_keras = baseline.model_copy(update={"metrics": {
        "best_val_accuracy": float(np.float32(155 / 157)), "test_accuracy": 0.9909}})
    assert float(np.float32(153 / 157)) >= recovery_target(read_by_keras, 1.0, 157), (
        "two images below the baseline, both read in float32 as Keras reports them: within")
    weaker = baseline.model_copy(update={"metrics": {
        "best_val_accuracy": float(np.float32(142 / 157))}})
    two_more = baseline.model_copy(update={"name": "thinner", "history": {"val_accuracy": [
        float(np.float32(144 / 157))]}})
    assert children_beating(weaker, [two_more], 1.0, 157) == [], (
        "two images above the baseline, in float32, is not beyond the margin")


def test_with_a_selection_split_trainings_choose_on_it_and_files_are_judged_on_validation(
        ten_digits, tmp_path):
    from tasks.train_model import train_model
    from tasks.write_tfrecords import write_tfrecords
    from tests.conftest import write_digit_folder
    from tfopt.config import DataConfig, TrainConfig
    from tfopt.models.baseline import kept_val_accuracy, recovery_target, selection_examples
    from tfopt.models.config import ModelConfig
    from tfopt.models.keras_io import load_keras_model
    from tfopt.models.training import evaluate_split_accuracy, training_data

    folder = write_digit_folder(tmp_path / "ten_digits", classes=10)
    config = DataConfig(source_dir=folder, image_size=16,
                        val_fraction=0.2, test_fraction=0.2, select_fraction=0.2,
                        shard_size_mb=0.004)
    data = ten_digits.model_copy(update={"dataset": write_tfrecords.fn(config, tmp_path)})
    dataset = data.dataset
    assert dataset.selection_split == "select" and dataset.examples("select") > 0
    assert dataset.examples("val") == ten_digits.dataset.examples("val"), (
        "carved from training: the validation split is the same files")
    _, held_out, _ = training_data(data)
    assert sum(len(labels) for _, labels in held_out) == dataset.examples("select")

    fixed = TrainConfig(epochs=2, batch_size=16, stop="fixed", learning_rate=0.02)
    baseline = train_model.fn(data, ModelConfig(width=8), fixed, tmp_path / "baseline")
    assert baseline.metrics["select_accuracy"] == max(baseline.history["val_accuracy"])
    model = load_keras_model(baseline.path)
    assert baseline.metrics["best_val_accuracy"] == pytest.approx(
        evaluate_split_accuracy(model, data, "val")), "read once on validation, not the curve"
    assert selection_examples(data) == dataset.examples("select")
    budget = 1.0
    assert recovery_target(baseline, budget, selection_examples(data)) == pytest.approx(
        baseline.metrics["select_accuracy"] - max(0.01, 2 / dataset.examples("select")),
        abs=1e-5)
    assert kept_val_accuracy(baseline, budget) == pytest.approx(
        baseline.metrics["best_val_accuracy"] - 0.01, abs=1e-5)


def test_a_trainings_steady_epoch_leaves_out_the_first_and_one_the_budget_ended():
    from tfopt.models.training import Fitted

    assert Fitted({}, 9.0, epoch_seconds=[5.0, 2.0, 2.2, 1.8]).steady_epoch_seconds() == 2.0
    assert Fitted({}, 5.0, epoch_seconds=[5.0]).steady_epoch_seconds() is None, "graph only"
    ended = Fitted({}, 8.0, stop={"stopped_by": "budget"}, epoch_seconds=[5.0, 2.0, 0.4])
    assert ended.steady_epoch_seconds() == 2.0, "the epoch the deadline cut is not one"
