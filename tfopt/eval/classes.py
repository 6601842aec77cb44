"""A classifier judged class by class: per-class accuracy, the confusion matrix, the classes lost.

One accuracy figure hides a class a compressed model gave up: 0.6 points below the baseline may
be one class at half its accuracy. These are the numbers per class on the same test images
(the labels and each variant's predicted classes the measurement kept).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClassResults:
    """One variant's predictions on a labelled split, class by class.

    Attributes:
        names: The class names, in label order.
        confusion: ``[true class, predicted class]`` counts.
    """

    names: tuple[str, ...]
    confusion: np.ndarray

    @property
    def images(self) -> np.ndarray:
        """The images of each class."""
        return self.confusion.sum(axis=1)

    @property
    def accuracies(self) -> np.ndarray:
        """Each class's share of its images predicted right (NaN for a class without images)."""
        images = self.images
        right = np.diag(self.confusion).astype(np.float64)
        return np.divide(right, images, out=np.full(len(images), np.nan), where=images > 0)

    def as_json(self) -> dict[str, Any]:
        """The numbers: per class its images and accuracy, and the confusion matrix."""
        return {"classes": [{"name": name, "images": int(images),
                             "accuracy": None if np.isnan(accuracy) else round(float(accuracy), 4)}
                            for name, images, accuracy in zip(self.names, self.images,
                                                              self.accuracies, strict=True)],
                "confusion": self.confusion.tolist(),
                "rows": "true class", "columns": "predicted class"}


def per_class(labels: np.ndarray, predicted: np.ndarray,
              names: list[str] | tuple[str, ...]) -> ClassResults:
    """The confusion matrix of `predicted` classes against `labels`, over the classes `names`.

    Raises:
        ValueError: The two differ in length, or a class index lies outside `names`.
    """
    labels, predicted = np.asarray(labels).ravel(), np.asarray(predicted).ravel()
    count = len(names)
    if labels.shape != predicted.shape:
        raise ValueError(f"{len(predicted)} predictions for {len(labels)} labels")
    if labels.size and (min(labels.min(), predicted.min()) < 0
                        or max(labels.max(), predicted.max()) >= count):
        raise ValueError(f"class indices outside the {count} classes")
    confusion = np.bincount(labels * count + predicted, minlength=count * count)
    return ClassResults(tuple(names), confusion.reshape(count, count))


def lost_most(variant: ClassResults, baseline: ClassResults,
              count: int = 3) -> list[dict[str, Any]]:
    """The classes `variant` lost most against `baseline` (accuracy points), worst first.

    Only classes it got worse on; ties go to the class with more images.
    """
    drops = (variant.accuracies - baseline.accuracies) * 100.0
    order = sorted((index for index in range(len(drops)) if drops[index] < 0),
                   key=lambda index: (drops[index], -variant.images[index]))
    return [{"class": variant.names[index], "images": int(variant.images[index]),
             "accuracy": round(float(variant.accuracies[index]), 4),
             "baseline_accuracy": round(float(baseline.accuracies[index]), 4),
             "delta_points": round(float(drops[index]), 2)}
            for index in order[:count]]


def metric_key(name: str) -> str:
    """A class's MLflow metric name: ``class_accuracy.<name>`` (characters MLflow refuses: _)."""
    return "class_accuracy." + re.sub(r"[^A-Za-z0-9_.\- /]", "_", name)


def read_class_results(labels: Path | None, predictions: Path | None,
                       names: list[str] | tuple[str, ...]) -> ClassResults | None:
    """`per_class` from the files the measurement kept (None: not kept, or not readable)."""
    if labels is None or predictions is None or not names:
        return None
    try:
        return per_class(np.load(labels), np.load(predictions), names)
    except (OSError, ValueError):
        return None
