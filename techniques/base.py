"""The technique contract: what every compression technique declares, in one place.

A technique module defines its config section (a `TechniqueSection`), a Prefect task
``(model, cfg, data, out_dir) -> ModelArtifact`` that never changes its input model, and a
module-level ``TECHNIQUE = Technique(...)`` naming its section, the model kinds it accepts,
the model it continues from, and the forms its model asks the runtimes for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import numpy as np
from prefect import Task
from pydantic import BaseModel, ConfigDict, Field

from tfopt.artifacts import (
    KERAS_FILE,
    ModelArtifact,
    ModelFormat,
    Precision,
    TrainingData,
    VariantSpec,
)
from tfopt.config import Section
from tfopt.logs import step_logger
from tfopt.runtimes import FLOAT_STEM, compressed_forms, plan_forms
from tfopt.runtimes.base import PlanRequest
from tfopt.schedule.prices import cooling_epochs
from tfopt.search import Knob, Point, Space

if TYPE_CHECKING:
    from tfopt.models.training import Fitted
    from tfopt.models.translate import Translation

KERAS_ONLY: frozenset[str] = frozenset({"keras"})


class TechniqueSection(Section):
    """A compression technique's own settings (one section under ``compress`` per technique).

    Each technique module declares its section; the registry assembles ``compress`` from them.
    """

    enabled: bool = Field(True, description="Apply this technique to the baseline.")

    def fitted_to(self, baseline: ModelArtifact) -> Self:
        """This section as it runs on `baseline` (its ``auto`` settings that need one, resolved)."""
        return self


def kernels(model: object) -> Iterator[tuple[str, np.ndarray]]:
    """Each layer's kernel (the weights pruning and clustering act on), with the layer's name."""
    for layer in model.layers:
        for weight in layer.weights:
            if weight.name.split("/")[-1].split(":")[0] in ("kernel", "depthwise_kernel"):
                yield layer.name, weight.numpy()


def derived_model(
    model: ModelArtifact, name: str, path: Path, fitted: Fitted, *,
    params: dict[str, Any], metrics: dict[str, float], fmt: ModelFormat = "keras",
    translation: Translation | None = None,
) -> ModelArtifact:
    """The model a technique made from `model`: the same input, classes and scaling.

    Its training's curves become its history; the epoch it kept, the epochs it ran, whether it
    recovered (came back within the budget: `tfopt.models.training.recovery`) and the reader
    settings it trained with join `params` (``epochs_run`` and ``recovered`` the metrics too,
    the training's seconds ``fit_seconds`` and its median epoch after the first
    ``steady_epoch_seconds``, which price the technique's next run on this machine
    (`tfopt.schedule.prices.learn_cost`), and the batch-norm re-estimation's figures at the
    kept epoch, `kept_epoch_figures`);
    a Keras 3 model's translation (`tfmot_model`) and its check join the params and metrics.
    """
    from tfopt.models.batch_norm import kept_epoch_figures
    from tfopt.models.training import epochs_run, kept_epoch

    if translation is not None:
        params, metrics = ({**params, **translation.params()},
                           {**metrics, **translation.metrics()})
    ran = {"epochs_run": epochs_run(fitted)}
    if "recovered" in fitted.stop:
        ran["recovered"] = bool(fitted.stop["recovered"])
    steady = fitted.steady_epoch_seconds()
    return model.model_copy(update=dict(
        name=name, path=path, format=fmt,
        params={**params, "kept_epoch": kept_epoch(fitted), **ran,
                **({key: fitted.stop[key] for key in ("stopped_by", "stop_reason")}
                   if fitted.stop else {}),
                **fitted.reader},
        metrics={**metrics, **{key: float(value) for key, value in ran.items()},
                 "fit_seconds": round(fitted.seconds, 3),
                 **({} if steady is None else {"steady_epoch_seconds": round(steady, 3)}),
                 **kept_epoch_figures(fitted.curves, fitted.best_epoch)},
        history=fitted.curves,
    ))


def fine_tune_rebuilt(model: Any, cfg: Any, data: TrainingData, teacher: Any,
                      tuning: Tuning) -> Fitted:
    """Fine-tune a rebuilt model (thinner, shallower) in place, as channel and depth pruning do.

    `cfg`'s ``epochs`` are the cap, its ``learning_rate`` follows its
    ``learning_rate_schedule``; it stops once back within the budget
    (`tfopt.models.training.recovery`), keeping its best validation epoch: a cosine rate then
    cools down to zero over its ``cool_down_epochs`` first (`CosineCoolDown`). Given the model it
    was rebuilt from (`teacher`) and a ``teacher_alpha`` below 1, it learns from the teacher's
    outputs too (`tfopt.models.distillation.Distiller`, temperature 1), weighted
    ``1 - teacher_alpha``. Rebuilt models are tf_keras models (`tfmot_model`). A model of array
    data learns as `tuning` says (its loss; the teacher's outputs alone without ``y``); with
    ``y``, a ``teacher_alpha`` below 1 weighs its loss with the squared error to the teacher's
    outputs (`tfopt.models.distillation.OutputDistiller`).
    """
    from tfopt.models.distillation import compiled_distiller, compiled_output_distiller
    from tfopt.models.training import (
        CosineCoolDown,
        KeepBestWeights,
        fit,
        fit_compiled,
        recovery,
        scheduled_learning_rate,
        steps_per_epoch,
    )

    cool_down = None
    if cooling_epochs(cfg) and data.recover_to is not None:
        per_epoch = steps_per_epoch(data)
        cool_down = CosineCoolDown(cfg.learning_rate, cfg.epochs * per_epoch, per_epoch,
                                   cfg.cool_down_epochs)
    learning_rate = cfg.learning_rate if cool_down else scheduled_learning_rate(
        data, cfg.epochs, cfg.learning_rate, cfg.learning_rate_schedule)
    callbacks = recovery(data, cool_down=cool_down)
    best = KeepBestWeights(monitor=data.held_out_key())
    if teacher is None or cfg.teacher_alpha >= 1.0 or tuning.teacher is not None:
        return fit(model, data, epochs=cfg.epochs, learning_rate=learning_rate,
                   callbacks=callbacks, best=best, loss=tuning.loss, teacher=tuning.teacher)
    distiller = (compiled_output_distiller(model, teacher, cfg.teacher_alpha, tuning.loss,
                                           learning_rate) if tuning.arrays else
                 compiled_distiller(model, teacher, cfg.teacher_alpha, 1.0, learning_rate))
    return fit_compiled(distiller, data, epochs=cfg.epochs, callbacks=callbacks, best=best)


def cool_down_field() -> Any:
    """The ``cool_down_epochs`` field of the techniques that rebuild the model and fine-tune it."""
    from tfopt.models.config import COOL_DOWN_EPOCHS, SETTLE_EPOCHS

    return Field(
        COOL_DOWN_EPOCHS, ge=0, le=100,
        description="Once back within the accuracy budget, epochs a cosine learning rate takes "
                    "straight down to zero before the fine-tuning ends. 0: it ends after "
                    f"{SETTLE_EPOCHS} epochs without a validation gain instead.")


def teacher_alpha_field() -> Any:
    """The ``teacher_alpha`` field of the techniques that rebuild the model and fine-tune it."""
    return Field(
        1.0, ge=0.0, le=1.0,
        description="Weight of the labels in the fine-tuning; the model before the rebuild "
                    "teaches the rest (knowledge distillation at temperature 1, as "
                    "compress.distill). 1: labels alone.")


REBUILT_EPOCHS = 12
"""A rebuilt model's fine-tuning cap unless set, and the least ``epochs: auto`` gives."""
EPOCHS_PER_BASELINE_EPOCH = 2
"""``epochs: auto``: a rebuilt model's cap per epoch the baseline trained. A model made
thinner relearns the data about as long as its baseline first learned it, or longer
(docs/measurements.md)."""


class RebuiltSection(TechniqueSection):
    """The fine-tuning settings of the techniques that rebuild the model smaller.

    Channel pruning, depth pruning and both together; their own fields follow these.
    """

    epochs: Annotated[int, Field(ge=1, le=1000)] | Literal["auto"] = Field(
        REBUILT_EPOCHS,
        description="Most fine-tuning epochs of the rebuilt model: it stops sooner once back "
                    "within the accuracy budget and no longer improving (best epoch kept). "
                    f"auto: {EPOCHS_PER_BASELINE_EPOCH} per epoch the baseline trained, at "
                    f"least {REBUILT_EPOCHS} ({REBUILT_EPOCHS} for a model taken as it is).")
    learning_rate: float = Field(
        1e-3, gt=0.0, le=1.0, description="Adam learning rate of the fine-tuning (its start).")
    learning_rate_schedule: Literal["cosine", "constant"] = Field(
        "cosine",
        description="The fine-tuning's learning rate over its epochs: cosine (decays to zero, "
                    "so the rebuilt model ends settled, not wherever its last epoch landed) or "
                    "constant.")
    teacher_alpha: float = teacher_alpha_field()
    cool_down_epochs: int = cool_down_field()

    def fitted_to(self, baseline: ModelArtifact) -> Self:
        """This section with an ``auto`` epoch cap made a number from `baseline`'s training."""
        if self.epochs != "auto":
            return self
        trained = int(baseline.params.get("epochs_run") or 0)
        return self.model_copy(update={
            "epochs": max(REBUILT_EPOCHS, EPOCHS_PER_BASELINE_EPOCH * trained)})

    def fine_tuning_params(self) -> dict[str, Any]:
        """These fields as a rebuilt model's run parameters."""
        return self.model_dump(include=set(RebuiltSection.model_fields) - {"enabled"})


def rebuilt_metrics(base: Any, rebuilt: Any, flops: tuple[float, float],
                    before_tuning: dict[str, float]) -> dict[str, float]:
    """What rebuilding `base` smaller changed: FLOPs, parameters, and its figure before tuning.

    Args:
        base: The model it was rebuilt from.
        rebuilt: The rebuilt model.
        flops: The FLOPs of `base` and of `rebuilt`.
        before_tuning: The rebuilt model's test figure before its fine-tuning
            (`Tuning.test_figures` with the suffix ``_before_fine_tuning``); the one after is
            the variant's (`Tuning.variant`).
    """
    before, after = flops
    return {"flops_before": before, "flops_after": after,
            "flops_ratio": after / before if before else 1.0,
            "params_before": float(base.count_params()),
            "params_after": float(rebuilt.count_params()), **before_tuning}


BEFORE_TUNING = "_before_fine_tuning"
"""The suffix of a rebuilt model's test figure before its fine-tuning."""


TRANSLATION_CHECK_EXAMPLES = 256
"""Test images a Keras 3 model's tf_keras translation is checked on."""


def tfmot_model(model: ModelArtifact, data: TrainingData) -> tuple[Any, Translation | None]:
    """The model as tensorflow-model-optimization takes it: a tf_keras model.

    A tf_keras file is loaded as it is. A Keras 3 model is translated into tf_keras
    (`tfopt.models.translate`) and the translation's logits are compared with the Keras 3
    model's on the test split before anything uses it.

    Returns:
        The tf_keras model, and the translation (None for a tf_keras file).

    Raises:
        NotApplicable: A Keras 3 model with no tf_keras twin (a subclassed model, a layer
            tf_keras lacks: named), or whose twin disagrees with it.
    """
    from tfopt.data.pipeline import load_split
    from tfopt.models.keras_io import flavor_of, load_keras_model
    from tfopt.models.translate import UntranslatableError, tf_keras_twin

    loaded = load_keras_model(model.keras_file or model.path)
    if flavor_of(loaded) == "tf_keras":
        return loaded, None
    if data.dataset.arrays:
        from tfopt.models.training import split_inputs

        images, _ = split_inputs(data.dataset, "test", limit=TRANSLATION_CHECK_EXAMPLES)
    else:
        images, _ = load_split(data.dataset, "test", TRANSLATION_CHECK_EXAMPLES,
                               scale=data.input_scale)
    try:
        translation = tf_keras_twin(loaded, images)
    except UntranslatableError as error:
        raise NotApplicable(f"tfmot needs tf_keras and the Keras 3 model {model.name} cannot be "
                            f"translated: {error}") from error
    step_logger().info(
        "%s: Keras %s model translated into tf_keras for tfmot; on %d test inputs the outputs "
        "agree within %.3g (top-1 agreement %.3f)", model.name, translation.keras_version,
        translation.examples, translation.max_abs_diff, translation.top1_agreement)
    return translation.model, translation


SELF_DISTILLATION_LOSS = "mse"
"""What a fine-tuning against the baseline's own outputs minimizes: the squared error of every
output (logits, boxes, any tensor) against the baseline's."""


def array_fine_tuning(data: TrainingData) -> tuple[Any, bool]:
    """The tf_keras loss a model of array data is fine-tuned with, and whether it distills.

    With ``y`` and a metric of it: the model's own loss (`TrainingData.loss`). Without ``y``,
    or judged by a fidelity metric (against the baseline's outputs): `SELF_DISTILLATION_LOSS`
    on the baseline's own outputs (self-distillation).

    Raises:
        NotApplicable: With ``y``, no loss known, or one tf_keras does not have.
    """
    from tfopt.data.arrays import TRUTH
    from tfopt.models.keras_io import tf_keras_loss

    metric = data.metric()
    if TRUTH not in data.dataset.arrays or not metric.needs_labels:
        return tf_keras_loss(SELF_DISTILLATION_LOSS), True
    if data.loss is None:
        raise NotApplicable("the model file was not compiled with one loss for one output: "
                            "name it in train.loss (mse, mae, huber, ...)")
    try:
        return tf_keras_loss(data.loss), False
    except ValueError as error:
        raise NotApplicable(f"{error}: name another in train.loss") from error


@dataclass(frozen=True)
class Tuning:
    """How a technique's fine-tuning learns: from labels, or a model of array data's own way.

    Attributes:
        loss: A model of array data's tf_keras loss (`array_fine_tuning`); None: the labels'
            cross-entropy (images).
        teacher: The model whose outputs it learns and is judged against (self-distillation:
            no ``y``, or a fidelity metric); None: the data's labels or ``y``.
        arrays: It fine-tunes a model of array data (judged by the run's metric, saved as a
            SavedModel of its own signature: `Tuning.variant`).
    """

    loss: Any = None
    teacher: Any = None
    arrays: bool = False

    def params(self) -> dict[str, str]:
        """What it learned from, as run parameters (``learned_from``; none on images)."""
        if not self.arrays:
            return {}
        return {"learned_from": "the baseline's outputs (self-distillation)"
                if self.teacher is not None else "y"}

    def figure_name(self, data: TrainingData) -> str:
        """What its figures are: ``accuracy`` (top-1), or the run's metric on array data."""
        return data.metric().name if self.arrays else "accuracy"

    def figure(self, keras_model: Any, data: TrainingData, split: str) -> float:
        """`keras_model`'s figure on a whole split (`figure_name`).

        On array data against the teacher's outputs where it learned from them.
        """
        from tfopt.models.training import evaluate_split_accuracy, evaluate_split_metric

        if not self.arrays:
            return evaluate_split_accuracy(keras_model, data, split)
        return evaluate_split_metric(keras_model, data, split, self.teacher)

    def gain(self, figure: float, other: float, data: TrainingData) -> float:
        """How far `figure` is ahead of `other` (positive: better).

        Accuracy points, or the metric's own units on array data (an error's sign turned).
        """
        if not self.arrays:
            return (figure - other) * 100.0
        metric = data.metric()
        return metric.oriented(figure) - metric.oriented(other)

    def test_figures(self, keras_model: Any, data: TrainingData,
                     suffix: str = "") -> dict[str, float]:
        """`keras_model`'s figure on the test split: ``test_accuracy``, or ``test_<metric>``.

        `suffix` follows the name (``_before_fine_tuning``).
        """
        return {f"test_{self.figure_name(data)}{suffix}": self.figure(keras_model, data, "test")}

    def variant(self, model: ModelArtifact, keras_model: Any, name: str, keras_path: Path,
                out_dir: Path, fitted: Fitted, data: TrainingData, *, params: dict[str, Any],
                metrics: dict[str, float], translation: Translation | None) -> ModelArtifact:
        """The technique's model (`derived_model`), with its test figure (`test_figures`).

        On array data a SavedModel of its own signature (`own_signature_savedmodel`) beside its
        Keras file (``keras_file``), with what it learned from.
        """
        metrics = {**metrics, **self.test_figures(keras_model, data)}
        if not self.arrays:
            return derived_model(model, name, keras_path, fitted, params=params,
                                 metrics=metrics, translation=translation)
        saved = own_signature_savedmodel(keras_model, model, out_dir / f"{name}-savedmodel")
        return derived_model(model, name, saved, fitted, fmt="savedmodel",
                             translation=translation, metrics=metrics,
                             params={**params, KERAS_FILE: str(keras_path), **self.params()})


LABELS = Tuning()
"""A fine-tuning on labelled images (cross-entropy of the labels, top-1 accuracy)."""


def own_signature_savedmodel(keras_model: Any, baseline: ModelArtifact, final: Path) -> Path:
    """A fine-tuned model of array data as a SavedModel of its own signature.

    Every variant's outputs are matched to the baseline's by name: a model of one output names
    it as the baseline's SavedModel does; several keep their layers' names (a Keras 3 model's
    dict outputs: its keys).
    """
    import tensorflow as tf

    from tfopt.models.serving_export import save_own_signature

    signatures = tf.saved_model.load(str(baseline.path)).signatures
    names = list(next(iter(signatures.values())).structured_outputs) if signatures else []
    save_own_signature(keras_model, final,
                       names if len(names) == len(keras_model.outputs) == 1 else None)
    return final


def tuning_of(model: ModelArtifact, base: Any, data: TrainingData, name: str) -> Tuning:
    """How `base` (the tf_keras model of `model`) is fine-tuned.

    Images: from labels. A model of array data (`ModelArtifact.keras_file`): with its loss, or
    against the baseline's own outputs (`array_fine_tuning`); where it stops (the data's
    `TrainingData.recover_to`, a score of the run's metric) is said in the log under the
    model's `name`.

    Raises:
        NotApplicable: Array data with ``y`` and no loss known, or ``y`` for a model of
            several outputs (``y`` is one output's truth: one loss per output is not built).
    """
    if model.keras_file is None:
        return LABELS
    loss, distilled = array_fine_tuning(data)
    if not distilled and len(base.outputs) > 1:
        raise NotApplicable(
            f"a model of {len(base.outputs)} outputs learning y (one output's truth) is not "
            "built yet: judge it by fidelity (eval.metric) to fine-tune it against the "
            "baseline's outputs")
    tuning = Tuning(loss=loss, teacher=base if distilled else None, arrays=True)
    if data.recover_to is not None:
        metric = data.metric()
        step_logger().info("%s: %sback within the budget at held-out %s %s %s", name,
                           "learning the baseline's own outputs (self-distillation); "
                           * distilled, metric.name, ">=" if metric.higher_is_better else "<=",
                           metric.shown(metric.oriented(data.recover_to)))
    return tuning


def resolved(cfg: TechniqueSection, knob: Space) -> None:
    """Refuse to apply a technique whose strength is still ``auto`` (the search sets it).

    Raises:
        ValueError: A knob is ``auto``.
    """
    for field in knob.fields:
        if getattr(cfg, field) == "auto":
            raise ValueError(f"{field}: auto is set by the search before the technique runs "
                             "(tfopt.search)")


class NotApplicable(Exception):  # noqa: N818 - a verdict about the model, not a failure
    """The technique cannot work on this model's layers: its variants are skipped, not failed.

    Raised by a technique's task when tfmot refuses the model (e.g. layers its quantization
    scheme has no rule for), so the summary says why instead of reporting a failure.
    """


class Skipped(BaseModel):
    """A technique that made no model, and why: a typed outcome, never parsed back from text.

    A technique's task returns it in a Completed state named "Skipped" (`techniques.skipped_state`),
    so the Prefect UI shows no red for what was never a failure; a technique that continues from
    it receives it in place of a model and is skipped in turn.
    """

    model_config = ConfigDict(frozen=True)

    technique: str
    reason: str
    kind: Literal["not_applicable", "cut", "upstream"]
    """Why: the model is not one it works on, the time budget cut it, or the technique it
    continues from was skipped."""

    def line(self) -> str:
        """How its variants' reason reads (``qat does not apply: ...``, ``distill: cut ...``)."""
        if self.kind == "not_applicable":
            return f"{self.technique} does not apply: {self.reason}"
        if self.kind == "cut":
            return f"{self.technique}: {self.reason}"
        return self.reason


@dataclass(frozen=True)
class Technique:
    """One optimization technique, declared by its module as ``TECHNIQUE``.

    Attributes:
        name: Its section under ``compress`` in the config (``compress.<name>``).
        section: That section's class, declared in the technique's module: its own epochs,
            learning rate, settings.
        accepts: The model kinds (a `ModelArtifact`'s format) it can work on.
        source_name: The name of the model it makes, from its settings (``pruned-80``); its
            variants are named after it.
        apply: The Prefect task ``(model, cfg, data, out_dir) -> ModelArtifact``.
        yields_graph: Its model is a Keras model (benchmarked as a TensorFlow graph too, and
            exported to ONNX); else a SavedModel (QAT's fake-quantized model).
        precisions: The precisions its model is built at on every runtime asked for forms of
            compressed models (QAT's: int8); None: the ones the config asks
            (`tfopt.runtimes.compressed_forms`).
        sparse_tflite: Also a ``<source>-tflite-sparse`` variant when fp32 TFLite is built: fp32
            converted with ``Optimize.EXPERIMENTAL_SPARSITY`` (sparse weight encoding), derived
            from the dense fp32 file, so the benchmark shows whether sparsity buys latency and
            not only size.
        starts_from: The technique whose model it continues from (``prune`` for
            pruning-preserving QAT), whose section must then be enabled; None: the baseline.
            A function of its settings when they decide (sparsity-preserving clustering
            continues from the pruned model). The run order follows from it.
        reshapes: Its model has fewer or thinner layers than the baseline (channel and depth
            pruning, distillation, and what continues from them): its int8 file gets the form
            with the first convolution in float too where the run asks (``compress.
            float_stem``). A model of the baseline's shape (zeros, clusters, QAT) runs that
            form at the speed of the baseline's own, which already stands for it.
        knob: The strength ``auto`` searches (its field and candidates, weakest first), or
            the strengths that compose, searched jointly (`tfopt.search.Joint`), if any: the
            compression flow tries settings and keeps the fastest within the budget.
        after_search: A searched technique's last step, on the chosen trial's model: the
            Prefect task ``(model, cfg, data, out_dir, made) -> ModelArtifact`` (`cfg` at
            the chosen strength, `made` that trial's model). Distillation trains its controls
            there, once, where each trial trained its student alone. None: the chosen
            trial's model is the technique's.
        on_arrays: It fine-tunes a model of array data (a Keras file's, with its loss, judged
            by the run's metric: `ModelArtifact.keras_file`), its model then a SavedModel of
            its own signature.
    """

    name: str
    section: type[TechniqueSection]
    accepts: frozenset[str]
    source_name: Callable[[Any], str]
    apply: Task
    yields_graph: bool = True
    precisions: tuple[Precision, ...] | None = None
    sparse_tflite: bool = False
    starts_from: str | Callable[[Any], str | None] | None = None
    reshapes: bool = False
    knob: Space | None = None
    after_search: Task | None = None
    on_arrays: bool = False

    def searched(self, cfg: TechniqueSection) -> bool:
        """Whether its strength is ``auto`` in `cfg`: a search finds it (`tfopt.search`)."""
        return self.knob is not None and all(
            getattr(cfg, field) == "auto" for field in self.knob.fields) and not (
            getattr(cfg, "structured_2_4", False))

    def at(self, cfg: TechniqueSection, point: Point) -> TechniqueSection:
        """`cfg` with its searched strengths set to `point`'s (an int knob stays an int)."""
        assert self.knob is not None
        return cfg.model_copy(update={knob.field: _kind(knob)(point[knob.field])
                                      for knob in self.knob.knobs})

    def base_of(self, cfg: TechniqueSection) -> str | None:
        """The technique whose model it continues from with settings `cfg` (None: baseline)."""
        return self.starts_from(cfg) if callable(self.starts_from) else self.starts_from

    def request(self, cfg: TechniqueSection, config: Any, start: str,
                arrays: bool = False) -> PlanRequest:
        """What its model asks the runtimes for: the forms the config asks of compressed models.

        Each form derives from the same form of the model named `start` (``pruned-80-tflite-
        int8`` from ``baseline-tflite-int8``): that is what its speed and size are judged
        against. The forms are the one rule's (`tfopt.runtimes.compressed_forms`), at the
        technique's own precisions where it has them. On `arrays` its model is a SavedModel
        of its own signature (no Keras graph form).
        """
        asked = {fmt: self.precisions if self.precisions is not None else precisions
                 for fmt, precisions in compressed_forms(config).items()
                 if self.reshapes or fmt != FLOAT_STEM}
        return PlanRequest(source=self.source_name(cfg),
                           kind="keras" if self.yields_graph and not arrays else "savedmodel",
                           start=start,
                           asked=asked, sparse=self.sparse_tflite)

    def variants(self, cfg: TechniqueSection, config: Any, start: str,
                 arrays: bool = False) -> list[VariantSpec]:
        """The variants it yields from the model named `start` (not built yet)."""
        return plan_forms(self.request(cfg, config, start, arrays), config)

    def refusal(self, model: ModelArtifact) -> str | None:
        """Why it cannot work on `model`, or None when it can."""
        if model.keras_file is not None:
            return None if self.on_arrays else (
                f"{self.name} of a model of array data is not built yet")
        if model.format in self.accepts:
            return None
        kinds = ", ".join(sorted(self.accepts))
        return f"{self.name} works on {kinds} models, not on a {model.format} model"


def _kind(knob: Knob) -> type:
    """How a knob's value is set: an int when every candidate is whole (clusters)."""
    return int if all(float(v).is_integer() for v in knob.values) else float
