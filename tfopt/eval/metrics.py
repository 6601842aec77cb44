"""What a model is judged by: a metric with its direction, and a compressed model's budget on it.

A `Metric` scores a model's outputs on a split against the truth: the labels (or targets), or,
for the fidelity metrics, the baseline's own outputs on the same inputs (no labels needed).
Built-ins: classification (``accuracy``: top-1; ``top5``, any ``top<k>``), regression (``mae``,
``rmse``), segmentation (``mean_iou``), binary scores (``auc``), fidelity (``fidelity``: top-1
``agreement`` for class scores, ``snr_db`` for other tensors; ``relative_error``); or the user's
``"file.py:function"`` (``(y_true, y_pred) -> float``, with whether higher is better).

A `MetricBudget` is how much of the baseline's figure a compressed model may give up: an amount
in the metric's own units, or a share of the baseline's value.

Numbers only: no TensorFlow here, so every process (and the tests) can score outputs cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from tfopt.user_code import CodeNotAllowedError, import_code

_ROUNDING = 1e-9
"""Slack in every budget comparison, relative to the figure kept: scores read back in float32
(Keras' accuracies) can sit a hair off a budget's edge they are exactly at."""

Unit = Literal["share", "value", "dB"]
"""How a metric's figure reads: a share of examples (shown as %, budgets in points), a value in
the targets' own units, or decibels."""


class MetricError(ValueError):
    """Outputs that a metric cannot score, or a score that is no number (one line, naming it)."""


@dataclass(frozen=True)
class Metric:
    """One way of judging a model's outputs against the truth.

    Attributes:
        name: What it is called in the terminal, the report and MLflow (``accuracy``, ``mae``,
            the user function's name).
        higher_is_better: Its direction.
        needs_labels: False for the fidelity metrics, whose truth is the baseline's outputs.
        unit: How its figure reads (`Unit`).
        score_fn: ``(truth, outputs) -> float`` over a whole split.
        per_example_fn: ``(truth, outputs) -> [N]`` when the score is the mean of one value per
            example (intervals and paired comparisons need them); None when it is not.
        counted: The score is the share of examples that are right (top-k, agreement): Wilson
            intervals and McNemar's test apply.
        bound: For a metric of agreement with a reference whose own figure is the metric's
            cap (an SNR, a relative error): a budget on it is the worst figure a variant keeps
            (`MetricBudget.bound`), by default this one; None: a budget is an allowance.
    """

    name: str
    higher_is_better: bool
    needs_labels: bool
    unit: Unit
    score_fn: Callable[[np.ndarray, np.ndarray], float] = field(repr=False, compare=False)
    per_example_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = field(
        default=None, repr=False, compare=False)
    counted: bool = False
    bound: float | None = None

    def oriented(self, value: float) -> float:
        """`value` with higher better (an error negated), or such a score turned back."""
        return value if self.higher_is_better else -value

    def score(self, truth: np.ndarray, outputs: np.ndarray) -> float:
        """The metric on a split: `outputs` (batch first) against `truth` (the same examples).

        Raises:
            MetricError: The two do not fit each other or the metric, the metric raised, or it
                returned something that is not a finite number.
        """
        if len(truth) != len(outputs):
            raise MetricError(f"{self.name}: {len(outputs)} outputs for {len(truth)} "
                              f"{'labels' if self.needs_labels else 'reference outputs'}")
        if len(outputs) == 0:
            raise MetricError(f"{self.name}: no examples to score")
        try:
            value = self.score_fn(truth, outputs)
        except MetricError as error:
            raise MetricError(f"{self.name}: {error}") from None
        except Exception as error:
            raise MetricError(f"{self.name} raised {type(error).__name__}: {error}") from error
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise MetricError(f"{self.name} returned {type(value).__name__}, not a number"
                              ) from None
        if not math.isfinite(number):
            raise MetricError(f"{self.name} returned {number} on {len(outputs)} examples")
        return number

    def per_example(self, truth: np.ndarray, outputs: np.ndarray) -> np.ndarray | None:
        """Each example's share of the score (their mean is `score`); None: it is no mean."""
        if self.per_example_fn is None:
            return None
        return np.asarray(self.per_example_fn(truth, outputs), dtype=np.float64)

    def better(self, value: float, than: float) -> bool:
        """Whether `value` is strictly better than `than` in this metric's direction."""
        return value > than if self.higher_is_better else value < than

    def gain(self, value: float, over: float) -> float:
        """How much better `value` is than `over` (negative: worse), in the metric's units."""
        return value - over if self.higher_is_better else over - value

    def shown(self, value: float) -> str:
        """The figure as people read it: a share as a percentage, a value with 4 figures."""
        if self.unit == "share":
            return f"{100 * value:.2f}%"
        return f"{value:.4g}{' dB' if self.unit == 'dB' else ''}"

    def shown_gain(self, gain: float) -> str:
        """A `gain` as people read it: points for a share, signed values otherwise."""
        if self.unit == "share":
            return f"{100 * gain:+.2f} points"
        return f"{gain:+.4g}{' dB' if self.unit == 'dB' else ''} {self.name}"


@dataclass(frozen=True)
class MetricBudget:
    """How much of the baseline's figure a compressed model may give up on `metric`.

    `amount` is in the metric's units (a share for a share metric: 0.01 is one point), or, with
    `relative`, a share of the baseline's value (0.02: 2% of it). With `bound`, `amount` is the
    worst figure kept itself (a floor of 30 dB for an SNR against the baseline's own outputs,
    whose own figure is the metric's cap: "within X of the cap" would say nothing).
    """

    metric: Metric
    amount: float
    relative: bool = False
    bound: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.amount) or (self.amount < 0 and not self.bound):
            raise ValueError(f"a metric budget is a finite amount >= 0, not {self.amount}")
        if self.bound and self.relative:
            raise ValueError("a bound on a metric is a figure, not a share of the baseline's")

    def allowance(self, baseline: float) -> float:
        """What may be given up from `baseline`, in the metric's units."""
        if self.bound:
            return max(0.0, self.metric.gain(baseline, self.amount))
        return self.amount * abs(baseline) if self.relative else self.amount

    def kept(self, baseline: float) -> float:
        """The worst figure still within the budget of `baseline`."""
        allowance = self.allowance(baseline)
        return baseline - allowance if self.metric.higher_is_better else baseline + allowance

    def within(self, value: float, baseline: float) -> bool:
        """Whether `value` gives up at most the budget from `baseline` (float rounding aside)."""
        kept = self.kept(baseline)
        slack = _ROUNDING * max(1.0, abs(kept))
        return value >= kept - slack if self.metric.higher_is_better else value <= kept + slack

    def points(self) -> float | None:
        """The budget in points (0-100) for an absolute budget on a share, else None."""
        if self.relative or self.bound or self.metric.unit != "share":
            return None
        return 100.0 * self.amount

    def described(self) -> str:
        """The budget in words, as the terminal and the report say it."""
        if self.bound:
            least = "at least" if self.metric.higher_is_better else "at most"
            return f"{self.metric.name} {least} {self.metric.shown(self.amount)}"
        if self.relative:
            return f"{100 * self.amount:g}% {self.metric.name}"
        if self.metric.unit == "share":
            points = 100 * self.amount
            return f"{points:g} {self.metric.name} point{'' if points == 1 else 's'}"
        return f"{self.amount:g} of {self.metric.name}"

    def clause(self) -> str:
        """What a variant within the budget is, as a reason says it.

        "within 1 accuracy point of the baseline"; for a bound "with snr_db at least 30 dB".
        """
        if self.bound:
            return f"with {self.described()}"
        return f"within {self.described()} of the baseline"


def accuracy_budget(points: float) -> MetricBudget:
    """``benchmark.accuracy_budget_points`` as a budget on top-1 accuracy (1 point: 0.01)."""
    return MetricBudget(TOP1, points / 100.0)


def _classes(truth: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Class indices from labels: integers as they are, one-hot rows or scores by their argmax."""
    truth = np.asarray(truth)
    if truth.shape == (*outputs.shape[:-1], 1):
        truth = truth[..., 0]  # [N, 1] labels
    elif truth.shape == outputs.shape:
        return np.argmax(truth, axis=-1)
    if truth.shape != outputs.shape[:-1]:
        raise MetricError(f"labels of shape {list(truth.shape)} do not fit class scores of "
                          f"shape {list(outputs.shape)} (one class index per score row, or "
                          "one-hot rows)")
    if not np.issubdtype(truth.dtype, np.integer) and np.any(truth != np.round(truth)):
        raise MetricError(f"labels are class indices, not {truth.dtype} values like "
                          f"{truth.flat[0]:g} (targets want a metric such as mae or rmse)")
    return truth.astype(np.int64)


def _scores(outputs: np.ndarray) -> np.ndarray:
    outputs = np.asarray(outputs)
    if outputs.ndim < 2 or outputs.shape[-1] < 2:
        raise MetricError(f"class scores [N, ..., classes >= 2] are needed, not outputs of "
                          f"shape {list(outputs.shape)}")
    return outputs


def _per_example_mean(values: np.ndarray) -> np.ndarray:
    """One figure per example: the mean over every axis but the batch."""
    return values.reshape(len(values), -1).mean(axis=1)


def _top_k_correct(k: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def correct(truth: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        scores = _scores(outputs)
        classes = _classes(truth, scores)
        if k == 1:
            hit = np.argmax(scores, axis=-1) == classes
        else:
            if scores.shape[-1] < k:
                raise MetricError(f"at least {k} classes are needed, the outputs have "
                                  f"{scores.shape[-1]}")
            # A class is in the top k when fewer than k classes score strictly above it.
            own = np.take_along_axis(scores, classes[..., None], axis=-1)
            hit = np.sum(scores > own, axis=-1) < k
        return _per_example_mean(hit.astype(np.float64))
    return correct


def _regression_pair(truth: np.ndarray, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    truth = np.asarray(truth, dtype=np.float64)
    outputs = np.asarray(outputs, dtype=np.float64)
    if truth.shape != outputs.shape and truth.size == outputs.size:
        truth = truth.reshape(outputs.shape)  # [N] targets for [N, 1] outputs
    if truth.shape != outputs.shape:
        raise MetricError(f"targets of shape {list(truth.shape)} do not fit outputs "
                          f"of shape {list(outputs.shape)}")
    return truth, outputs


def _absolute_errors(truth: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    truth, outputs = _regression_pair(truth, outputs)
    return _per_example_mean(np.abs(outputs - truth))


def _rmse(truth: np.ndarray, outputs: np.ndarray) -> float:
    truth, outputs = _regression_pair(truth, outputs)
    return float(np.sqrt(np.mean((outputs - truth) ** 2)))


def _mean_iou(truth: np.ndarray, outputs: np.ndarray) -> float:
    """Mean over the classes present (in the truth or the prediction) of their IoU."""
    scores = _scores(outputs)
    classes = _classes(truth, scores).ravel()
    predicted = np.argmax(scores, axis=-1).ravel()
    count = scores.shape[-1]
    if classes.size and (classes.min() < 0 or classes.max() >= count):
        raise MetricError(f"labels outside the {count} classes of the outputs")
    both = np.bincount(classes * count + predicted, minlength=count * count).reshape(count, count)
    intersection = np.diag(both).astype(np.float64)
    union = both.sum(axis=0) + both.sum(axis=1) - intersection
    present = union > 0
    return float(np.mean(intersection[present] / union[present]))


def _auc(truth: np.ndarray, outputs: np.ndarray) -> float:
    """The area under the ROC curve of binary scores (ties counted half: Mann-Whitney)."""
    scores = np.asarray(outputs, dtype=np.float64)
    if scores.ndim == 2 and scores.shape[1] == 2:
        scores = scores[:, 1]
    scores = scores.reshape(len(scores), -1)
    if scores.shape[1] != 1:
        raise MetricError(f"one score per example (or two class scores) is needed, not "
                          f"outputs of shape {list(np.shape(outputs))}")
    labels = np.asarray(truth).reshape(-1)
    if labels.size != len(scores) or not np.isin(labels, (0, 1)).all():
        raise MetricError("one 0/1 label per example is needed")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise MetricError("examples of both labels (0 and 1) are needed")
    ranks = _average_ranks(scores[:, 0])
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2)
                 / (positives * negatives))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing their average rank."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.r_[0, np.flatnonzero(np.diff(ordered)) + 1]
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + end + 1) / 2
    return ranks


def _relative_error(truth: np.ndarray, outputs: np.ndarray) -> float:
    """||outputs - reference|| / ||reference|| over the split."""
    reference, outputs = _regression_pair(truth, outputs)
    norm = np.linalg.norm(reference)
    if norm == 0:
        raise MetricError("the reference outputs are all zero")
    return float(np.linalg.norm(outputs - reference) / norm)


def _snr_db(truth: np.ndarray, outputs: np.ndarray) -> float:
    """The reference's power over the error's, in decibels."""
    reference, outputs = _regression_pair(truth, outputs)
    signal = float(np.sum(reference ** 2))
    if signal == 0:
        raise MetricError("the reference outputs are all zero")
    # No error below float32's resolution can be told apart (identical outputs: about 138 dB).
    noise = max(float(np.sum((outputs - reference) ** 2)),
                signal * float(np.finfo(np.float32).eps) ** 2)
    return 10 * math.log10(signal / noise)


def _mean_of(per_example: Callable[[np.ndarray, np.ndarray], np.ndarray],
             ) -> Callable[[np.ndarray, np.ndarray], float]:
    return lambda truth, outputs: float(np.mean(per_example(truth, outputs)))


def top_k(k: int, name: str | None = None) -> Metric:
    """Top-k accuracy: the share of examples whose class is among their k best scores."""
    correct = _top_k_correct(k)
    return Metric(name or f"top{k}", True, True, "share", _mean_of(correct), correct,
                  counted=True)


TOP1 = top_k(1, "accuracy")
AGREEMENT = replace(TOP1, name="agreement", needs_labels=False)
"""Top-1 agreement with the baseline's class scores (a class index per row or pixel)."""

BUILT_IN: dict[str, Metric] = {
    metric.name: metric for metric in (
        TOP1, top_k(5),
        Metric("mae", False, True, "value", _mean_of(_absolute_errors), _absolute_errors),
        Metric("rmse", False, True, "value", _rmse),
        Metric("mean_iou", True, True, "share", _mean_iou),
        Metric("auc", True, True, "share", _auc),
        AGREEMENT,
        Metric("relative_error", False, False, "value", _relative_error, bound=0.03),
        Metric("snr_db", True, False, "dB", _snr_db, bound=30.0),
    )
}
"""The metrics named without code (any ``top<k>`` too, and ``fidelity``)."""

FIDELITY = "fidelity"
"""Agreement with the reference model's outputs, as suits them (`fidelity`)."""


def fidelity(class_scores: bool) -> Metric:
    """``fidelity`` for a model's outputs: top-1 agreement for class scores, else the SNR."""
    return AGREEMENT if class_scores else BUILT_IN["snr_db"]


def built_in(name: str) -> Metric | None:
    """The built-in metric called `name` (``top<k>`` for any k >= 1), None when there is none.

    ``fidelity`` is the classifier's, top-1 agreement (`fidelity` chooses by the outputs).
    """
    if name in BUILT_IN:
        return BUILT_IN[name]
    if name == FIDELITY:
        return AGREEMENT
    if name.startswith("top") and name[3:].isdigit() and int(name[3:]) >= 1:
        return top_k(int(name[3:]))
    return None


def counted(name: str) -> bool:
    """Whether the metric called `name` is a share of examples right (`Metric.counted`)."""
    found = built_in(name)
    return found is not None and found.counted


def user_metric(spec: str, higher_is_better: bool, field_name: str = "eval.metric") -> Metric:
    """The user's ``"file.py:function"`` (or ``"package.module:function"``) as a metric.

    The function takes ``(y_true, y_pred)``, NumPy arrays batch first (the labels or targets,
    and the model's output), and returns a float.

    Raises:
        MetricError: No such file or function, its module fails to import, or its code lies
            outside the folders this machine runs code from (one line each).
    """
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise MetricError(f"{field_name}: {spec!r} is neither a built-in metric "
                          f"({', '.join(BUILT_IN)}, {FIDELITY}, top<k>) nor "
                          "'file.py:function'")
    if target.endswith(".py") and not Path(target).is_file():
        raise MetricError(f"{field_name}: {target} does not exist")
    try:
        module = import_code(spec, field_name)
    except CodeNotAllowedError as error:
        raise MetricError(str(error)) from error
    except Exception as error:
        raise MetricError(f"{field_name}: importing {target} failed: "
                          f"{type(error).__name__}: {error}") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise MetricError(f"{field_name}: {target} has no function {name!r}")
    return Metric(name, higher_is_better, True, "value", function)


def metric_named(spec: str, higher_is_better: bool | None = None,
                 class_scores: bool = True) -> Metric:
    """A built-in metric by name, or the user's function (`user_metric`).

    ``fidelity`` is top-1 agreement for `class_scores` (an image classifier's), else the SNR.

    Raises:
        MetricError: An unknown name, a user function without its direction, or one that
            cannot be loaded.
    """
    if spec == FIDELITY:
        return fidelity(class_scores)
    found = built_in(spec)
    if found is not None:
        return found
    if ":" in spec and higher_is_better is None:
        raise MetricError(f"eval.higher_is_better: say whether a higher {spec} is better "
                          "(true or false)")
    return user_metric(spec, bool(higher_is_better))
