"""Accuracy intervals and the paired comparison of two classifiers on the same images."""

from pathlib import Path

import numpy as np
import pytest

from tfopt.artifacts import BenchmarkInputs, LatencyStats, VariantResult
from tfopt.eval.metrics import accuracy_budget
from tfopt.measurement.accuracy_stats import mcnemar_p_value, paired_comparison, wilson_interval
from tfopt.measurement.champion import accuracy_verdict, budget_rule, choose_champion
from tfopt.report.summary import accuracy_sentence

ONE_POINT = accuracy_budget(1.0)


def _result(name: str, source: str, val: float | None, test: float, p50: float,
            predictions: Path | None = None) -> VariantResult:
    return VariantResult(name=name, source=source, format="tflite", precision="int8",
                         status="ok", accuracy=test, val_accuracy=val, predictions=predictions,
                         latency_ms=LatencyStats(p50=p50, p90=p50, p99=p50, mean=p50, std=0.0,
                                                 min=p50, max=p50))


def test_the_wilson_interval_holds_the_figure_and_narrows_with_more_images():
    low, high = wilson_interval(0.9, 100)
    assert low < 0.9 < high and high - low == pytest.approx(0.12, abs=0.01)
    wide, narrow = wilson_interval(0.9, 100), wilson_interval(0.9, 10_000)
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 5
    assert wilson_interval(1.0, 50)[1] == 1.0 and wilson_interval(1.0, 50)[0] < 1.0
    assert wilson_interval(0.5, 0) is None


def test_mcnemar_is_exact_and_symmetric():
    assert mcnemar_p_value(0, 0) == 1.0
    assert mcnemar_p_value(3, 3) == 1.0
    assert mcnemar_p_value(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_p_value(1, 9) == mcnemar_p_value(9, 1) == pytest.approx(22 / 1024)


def test_the_paired_comparison_counts_the_images_only_one_got_right(tmp_path):
    labels = np.array([0, 1, 2, 3, 4, 5, 6, 7])
    np.save(tmp_path / "labels.npy", labels)
    np.save(tmp_path / "a.npy", np.array([0, 1, 2, 3, 4, 5, 0, 0]))
    np.save(tmp_path / "b.npy", np.array([0, 1, 2, 3, 0, 0, 0, 7]))
    first = _result("a", "channels-50", 0.9, 0.75, 1.0, tmp_path / "a.npy")
    second = _result("b", "baseline", 0.9, 0.625, 2.0, tmp_path / "b.npy")
    paired = paired_comparison(first, second, tmp_path / "labels.npy")
    assert (paired["only_first_right"], paired["only_second_right"]) == (2, 1)
    assert paired["images"] == 8 and paired["mcnemar_p_value"] == pytest.approx(1.0)
    assert paired_comparison(first, second.model_copy(update={"predictions": None}),
                             tmp_path / "labels.npy") is None
    assert paired_comparison(first, second, tmp_path / "labels.npy", "val") is None, (
        "no validation predictions kept")
    on_validation = paired_comparison(
        first.model_copy(update={"val_predictions": tmp_path / "b.npy"}),
        second.model_copy(update={"val_predictions": tmp_path / "a.npy"}),
        tmp_path / "labels.npy", "val")
    assert (on_validation["only_first_right"], on_validation["only_second_right"]) == (1, 2)


def test_the_budget_is_judged_on_validation_and_the_test_figures_only_reported(tmp_path):
    np.save(tmp_path / "labels.npy", np.arange(200) % 10)
    baseline = _result("baseline-tflite-int8", "baseline", 0.95, 0.96, 2.0)
    lucky_on_test = _result("channels-80-tflite-int8", "channels-80", 0.90, 0.97, 0.5)
    within_on_val = _result("channels-50-tflite-int8", "channels-50", 0.945, 0.93, 1.0)
    choice = choose_champion([baseline, lucky_on_test, within_on_val], ONE_POINT)
    assert choice.name == "channels-50-tflite-int8", "validation decides, not test"
    assert (choice.judged_on, choice.reference) == ("validation", "baseline-tflite-int8")
    assert "on validation" in choice.reason
    inputs = BenchmarkInputs(images=tmp_path / "images.npy", labels=tmp_path / "labels.npy",
                             reference_logits=None, examples=200)
    verdict = accuracy_verdict(choice, [baseline, lucky_on_test, within_on_val], inputs, ONE_POINT)
    assert verdict["test_images"] == 200 and verdict["champion"]["test_accuracy"] == 0.93
    assert verdict["paired"] is None, "no predictions kept: no paired comparison"
    assert verdict["paired_on_validation"] is None
    sentence = accuracy_sentence(verdict)
    assert "judged on the validation split" in sentence and "held-out test images" in sentence
    without_val = [r.model_copy(update={"val_accuracy": None}) for r in (baseline, lucky_on_test)]
    assert budget_rule(without_val, ONE_POINT).split == "test", "no validation figures: test it is"
    assert choose_champion(without_val, ONE_POINT).name == "channels-80-tflite-int8"
