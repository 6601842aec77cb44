"""A classifier judged class by class: the confusion matrix, per-class accuracy, the classes a
compressed model lost, as MLflow and the report show them."""

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix

from tfopt.eval.classes import lost_most, metric_key, per_class, read_class_results
from tfopt.report.summary import classes_sentence

NAMES = ("cat", "dog", "bird")
LABELS = np.array([0] * 10 + [1] * 10 + [2] * 5)


def test_the_confusion_matrix_is_scikit_learns():
    predicted = np.random.default_rng(0).integers(0, 3, size=LABELS.size)
    results = per_class(LABELS, predicted, NAMES)
    assert (results.confusion == confusion_matrix(LABELS, predicted, labels=[0, 1, 2])).all()
    assert list(results.images) == [10, 10, 5]
    assert results.accuracies == pytest.approx(np.diag(results.confusion) / [10, 10, 5])
    numbers = results.as_json()
    assert [c["name"] for c in numbers["classes"]] == list(NAMES)
    assert numbers["confusion"] == results.confusion.tolist()


def test_the_classes_lost_most_are_the_largest_drops_worst_first():
    baseline = per_class(LABELS, LABELS, NAMES)
    worse = LABELS.copy()
    worse[:4] = 1      # cat: 6 of 10 right
    worse[20:22] = 0   # bird: 3 of 5 right
    lost = lost_most(per_class(LABELS, worse, NAMES), baseline)
    assert [(c["class"], c["delta_points"], c["images"]) for c in lost] == [
        ("cat", -40.0, 10), ("bird", -40.0, 5)], "a tie goes to the class of more images"
    assert lost_most(baseline, baseline) == [], "nothing lost"
    verdict = {"champion": {"name": "int8"}, "baseline": {"name": "fp32"},
               "classes_lost_most": lost}
    assert classes_sentence(verdict).startswith(
        "Classes int8 lost most against fp32 on test: cat -40.00 points (0.6000 vs 1.0000, "
        "10 images); bird -40.00 points")
    assert "no worse than fp32 on any class" in classes_sentence({**verdict,
                                                                  "classes_lost_most": []})
    assert classes_sentence({**verdict, "classes_lost_most": None}) == ""


def test_class_names_become_mlflow_metric_names_and_bad_files_are_no_figures(tmp_path):
    assert metric_key("7") == "class_accuracy.7"
    assert metric_key("Pomeranian (toy)!") == "class_accuracy.Pomeranian _toy__"
    with pytest.raises(ValueError, match="outside the 3 classes"):
        per_class(LABELS, LABELS + 1, NAMES)
    np.save(tmp_path / "labels.npy", LABELS)
    np.save(tmp_path / "short.npy", LABELS[:5])
    assert read_class_results(tmp_path / "labels.npy", tmp_path / "short.npy", NAMES) is None
    assert read_class_results(tmp_path / "labels.npy", None, NAMES) is None


def test_the_confusion_matrix_picture_is_written(tmp_path):
    from tfopt.report.files import confusion_figure

    path = confusion_figure(per_class(LABELS, LABELS[::-1], NAMES), "test", tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
