"""The metrics a model is judged by, checked against scikit-learn's, and their budgets."""

import math

import numpy as np
import pytest
from sklearn import metrics as sk

from tfopt.eval.metrics import (
    BUILT_IN,
    TOP1,
    MetricBudget,
    MetricError,
    accuracy_budget,
    built_in,
    fidelity,
    metric_named,
)

RNG = np.random.default_rng(0)
SCORES = RNG.normal(size=(300, 7)).astype(np.float32)
LABELS = RNG.integers(0, 7, size=300)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_top_k_is_scikit_learns(k):
    expected = sk.top_k_accuracy_score(LABELS, SCORES, k=k, labels=range(7))
    assert built_in(f"top{k}").score(LABELS, SCORES) == pytest.approx(expected)
    assert np.mean(built_in(f"top{k}").per_example(LABELS, SCORES)) == pytest.approx(expected)


def test_top1_takes_one_hot_and_column_labels_as_class_indices():
    one_hot = np.eye(7)[LABELS]
    assert TOP1.score(one_hot, SCORES) == TOP1.score(LABELS, SCORES) \
        == TOP1.score(LABELS[:, None], SCORES)


def test_regression_metrics_are_scikit_learns():
    truth = RNG.normal(size=(200, 3))
    predicted = truth + RNG.normal(scale=0.3, size=truth.shape)
    assert BUILT_IN["mae"].score(truth, predicted) == pytest.approx(
        sk.mean_absolute_error(truth, predicted))
    assert BUILT_IN["rmse"].score(truth, predicted) == pytest.approx(
        math.sqrt(sk.mean_squared_error(truth, predicted)))
    # [N] targets for a model's [N, 1] output
    assert BUILT_IN["mae"].score(truth[:, 0], predicted[:, :1]) == pytest.approx(
        sk.mean_absolute_error(truth[:, 0], predicted[:, 0]))


def test_mean_iou_is_scikit_learns_macro_jaccard():
    masks = RNG.integers(0, 4, size=(6, 16, 16))
    scores = RNG.normal(size=(6, 16, 16, 4)) + 2.0 * np.eye(4)[masks]
    predicted = np.argmax(scores, -1)
    expected = sk.jaccard_score(masks.ravel(), predicted.ravel(), average="macro")
    assert BUILT_IN["mean_iou"].score(masks, scores) == pytest.approx(expected)


def test_auc_is_scikit_learns_with_ties():
    labels = RNG.integers(0, 2, size=400)
    scores = np.round(labels * 0.5 + RNG.normal(size=400), 1)  # rounded: many ties
    expected = sk.roc_auc_score(labels, scores)
    assert BUILT_IN["auc"].score(labels, scores) == pytest.approx(expected)
    assert BUILT_IN["auc"].score(labels, np.stack([-scores, scores], 1)) == pytest.approx(expected)


def test_fidelity_needs_no_labels():
    assert built_in("fidelity") is BUILT_IN["agreement"] is fidelity(class_scores=True)
    assert fidelity(class_scores=False) is BUILT_IN["snr_db"]
    noisy = SCORES + RNG.normal(scale=0.5, size=SCORES.shape).astype(np.float32)
    assert not BUILT_IN["agreement"].needs_labels
    assert BUILT_IN["agreement"].score(SCORES, noisy) == pytest.approx(
        np.mean(SCORES.argmax(1) == noisy.argmax(1)))
    assert BUILT_IN["agreement"].score(SCORES, SCORES) == 1.0
    error = np.linalg.norm(noisy - SCORES) / np.linalg.norm(SCORES)
    assert BUILT_IN["relative_error"].score(SCORES, noisy) == pytest.approx(error, rel=1e-5)
    assert BUILT_IN["snr_db"].score(SCORES, noisy) == pytest.approx(-20 * math.log10(error),
                                                                   rel=1e-5)
    assert math.isfinite(BUILT_IN["snr_db"].score(SCORES, SCORES))


def test_the_budget_follows_the_metrics_direction():
    accuracy = MetricBudget(TOP1, 0.01)
    assert accuracy.kept(0.95) == pytest.approx(0.94)
    assert accuracy.within(0.941, 0.95) and not accuracy.within(0.939, 0.95)
    assert accuracy.described() == "1 accuracy point" and accuracy.points() == 1.0
    assert accuracy_budget(1.0) == accuracy and accuracy_budget(2.5).described() == (
        "2.5 accuracy points")
    error = MetricBudget(BUILT_IN["mae"], 0.05, relative=True)
    assert error.kept(2.0) == pytest.approx(2.1)
    assert error.within(2.09, 2.0) and not error.within(2.11, 2.0)
    assert BUILT_IN["mae"].gain(1.9, 2.0) == pytest.approx(0.1)
    assert BUILT_IN["mae"].better(1.9, 2.0) and not TOP1.better(0.9, 0.95)
    with pytest.raises(ValueError):
        MetricBudget(TOP1, -1)


def test_a_budget_against_the_baselines_own_outputs_is_the_worst_figure_kept():
    from tfopt.config import EvalConfig

    snr = EvalConfig(metric="fidelity").metric_budget(1.0, class_scores=False)
    assert snr.metric.name == "snr_db" and snr.bound and snr.amount == 30.0
    cap = BUILT_IN["snr_db"].score(SCORES, SCORES)  # the baseline against itself
    assert snr.kept(cap) == pytest.approx(30.0) and snr.allowance(cap) == pytest.approx(cap - 30)
    assert snr.within(30.5, cap) and not snr.within(29.5, cap)
    assert snr.described() == "snr_db at least 30 dB" and snr.points() is None
    error = EvalConfig(metric="relative_error", budget=0.1).metric_budget(1.0)
    assert error.kept(0.0) == pytest.approx(0.1) and not error.within(0.11, 0.0)
    assert error.described() == "relative_error at most 0.1"
    agreement = EvalConfig(metric="fidelity").metric_budget(1.0)  # a classifier's: points
    assert agreement.metric.name == "agreement" and not agreement.bound
    assert agreement.kept(1.0) == pytest.approx(0.99)
    with pytest.raises(ValueError, match="worst figure a variant keeps"):
        EvalConfig(metric="snr_db", budget=0.1, budget_relative=True)


def test_outputs_that_do_not_fit_are_one_line_errors():
    with pytest.raises(MetricError, match="do not fit class scores"):
        TOP1.score(np.zeros((300, 2)), SCORES)
    with pytest.raises(MetricError, match=r"^accuracy: labels are class indices, not float64"):
        TOP1.score(LABELS + 0.5, SCORES)
    with pytest.raises(MetricError, match=r"^accuracy: class scores \[N, ..., classes >= 2\]"):
        TOP1.score(LABELS, SCORES[:, :1])
    with pytest.raises(MetricError, match="299 outputs for 300 labels"):
        TOP1.score(LABELS, SCORES[:299])
    with pytest.raises(MetricError, match="targets of shape"):
        BUILT_IN["mae"].score(np.zeros((300, 2)), SCORES)
    with pytest.raises(MetricError, match=r"^auc: examples of both labels"):
        BUILT_IN["auc"].score(np.ones(300), SCORES[:, 0])


def test_a_users_metric_that_raises_or_returns_nan_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(
        "import numpy as np\n"
        "def score(y_true, y_pred):\n    return float(np.mean(y_true == y_pred.argmax(1)))\n"
        "def broken(y_true, y_pred):\n    raise KeyError('boxes')\n"
        "def nan(y_true, y_pred):\n    return float('nan')\n")
    mine = metric_named("mine.py:score", higher_is_better=True)
    assert mine.name == "score" and mine.score(LABELS, SCORES) == TOP1.score(LABELS, SCORES)
    with pytest.raises(MetricError, match=r"^broken raised KeyError: 'boxes'$"):
        metric_named("mine.py:broken", higher_is_better=True).score(LABELS, SCORES)
    with pytest.raises(MetricError, match=r"^nan returned nan on 300 examples$"):
        metric_named("mine.py:nan", higher_is_better=False).score(LABELS, SCORES)
    with pytest.raises(MetricError, match=r"eval\.higher_is_better"):
        metric_named("mine.py:score")
    with pytest.raises(MetricError, match="has no function 'missing'"):
        metric_named("mine.py:missing", higher_is_better=True)
    with pytest.raises(MetricError, match="does not exist"):
        metric_named("other.py:score", higher_is_better=True)
    with pytest.raises(MetricError, match="neither a built-in metric"):
        metric_named("f1")
