"""A baseline's health is checked before anything is judged against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfopt.artifacts import ModelArtifact
from tfopt.models.health import baseline_health, health_line, verdicts_note
from tfopt.report.summary import baseline_training


def _baseline(val: float | None, train: list[float] | None = None,
              loss: list[float] | None = None, classes: int = 10, **params) -> ModelArtifact:
    trained = train is not None
    return ModelArtifact(
        name="baseline", path=Path("baseline.keras"), format="keras", image_size=32,
        num_classes=classes,
        params={**({"epochs_run": len(train), "kept_epoch": len(train), "converged": True,
                    "stop_reason": "plateau"} if trained else {}), **params},
        metrics={} if val is None else {"best_val_accuracy": val},
        history={**({"accuracy": train} if trained else {}),
                 **({"loss": loss} if loss else {})})


def test_a_trained_baseline_that_generalizes_is_healthy_and_converged():
    baseline = _baseline(0.97, train=[0.6, 0.9, 0.99], loss=[1.5, 0.3, 0.05])
    training = baseline_training(baseline)
    assert training["health"]["status"] == "healthy" and training["converged"]
    assert health_line(training["health"]).startswith("healthy (validation 0.970")


def test_stale_batch_norm_statistics_show_as_a_gap_and_the_baseline_is_not_converged():
    baseline = _baseline(0.18, train=[0.7, 0.98, 1.0], loss=[1.0, 0.1, 0.01])
    training = baseline_training(baseline)
    health = training["health"]
    assert health["status"] == "unhealthy" and not training["converged"]
    assert any("training accuracy 1.000 against validation 0.180" in r for r in health["reasons"])
    assert verdicts_note(None, health).startswith("unhealthy baseline: ")
    assert verdicts_note("beaten by qat", health).startswith("beaten by qat; unhealthy")


@pytest.mark.parametrize(("classes", "val", "at_chance"),
                         [(10, 0.18, True), (10, 0.20, False), (2, 0.54, True), (2, 0.56, False)])
def test_at_chance_depends_on_the_number_of_classes(classes, val, at_chance):
    reasons = baseline_health(_baseline(val, classes=classes))["reasons"]
    assert any("at chance" in r for r in reasons) == at_chance


def test_a_model_taken_as_it_is_at_chance_is_told_its_classes_may_not_be_the_folders():
    health = baseline_health(_baseline(0.06, classes=7))
    assert health["status"] == "unhealthy"
    assert "its classes may not be this folder's" in health["reasons"][0]


def test_a_diverged_loss_is_named_and_no_validation_is_not_judged():
    reasons = baseline_health(_baseline(0.1, train=[0.1, 0.1],
                                        loss=[2.3, float("nan")]))["reasons"]
    assert any("diverged" in r for r in reasons)
    assert baseline_health(_baseline(None))["status"] == "not_judged"
