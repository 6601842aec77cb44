"""How far an accuracy figure can be trusted, and two models compared on the same images.

A figure's 95% interval (Wilson), and McNemar's exact test on the images only one of two
models got right.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tfopt.artifacts import VariantResult

Z_95 = 1.959963984540054


def wilson_interval(accuracy: float, images: int) -> tuple[float, float] | None:
    """The Wilson score 95% interval of an accuracy measured on `images` images (None: none)."""
    if images <= 0:
        return None
    centre = accuracy + Z_95 ** 2 / (2 * images)
    spread = Z_95 * math.sqrt(accuracy * (1 - accuracy) / images + Z_95 ** 2 / (4 * images ** 2))
    scale = 1 + Z_95 ** 2 / images
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def mcnemar_p_value(only_first: int, only_second: int) -> float:
    """The exact two-sided McNemar p-value of the images only one of two models got right.

    How likely so uneven a split of those images is when both models are equally accurate.
    """
    discordant = only_first + only_second
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(only_first, only_second) + 1))
    return min(1.0, 2.0 * tail / 2.0 ** discordant)


def paired_comparison(first: VariantResult, second: VariantResult, labels: Path | None,
                      split: Literal["test", "val"] = "test") -> dict[str, Any] | None:
    """`first` against `second` on the same images of `split` (None: predictions not kept).

    Returns:
        The images, how many only each got right, and McNemar's exact p-value.
    """
    first_predicted, second_predicted = (
        (first.predictions, second.predictions) if split == "test"
        else (first.val_predictions, second.val_predictions))
    if labels is None or first_predicted is None or second_predicted is None:
        return None
    try:
        truth = np.load(labels)
        first_right = np.load(first_predicted) == truth
        second_right = np.load(second_predicted) == truth
    except (OSError, ValueError):
        return None
    if first_right.shape != second_right.shape:
        return None
    only_first = int(np.sum(first_right & ~second_right))
    only_second = int(np.sum(second_right & ~first_right))
    return {"first": first.name, "second": second.name, "images": int(truth.size),
            "only_first_right": only_first, "only_second_right": only_second,
            "mcnemar_p_value": round(mcnemar_p_value(only_first, only_second), 4)}
