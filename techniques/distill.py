"""Knowledge distillation: a small student learns from the baseline (the teacher).

tensorflow-model-optimization has no distillation API, so the student trains in a Keras model
with its own `train_step` (`tfopt.models.distillation.Distiller`): the loss is ``alpha *
CE(labels, student) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))``.
The same student trained from scratch with the same budget is the control, so the gain (or
loss) from the teacher is visible.

The recipe was picked by measurement (benchmarks/distillation.py, figures in
docs/measurements.md). Both students' learning rate decays to zero along a cosine by default:
at a constant rate each ends wherever its last epochs happen to land, and no recipe can be
told from another. Temperature 1: a small student cannot follow the teacher's softened logits,
only its plain probabilities.

What makes the student beat its control is where it starts (`student_init: teacher`): from the
teacher's most important filters of each convolution the two share by name (width pruning of
the teacher, then distillation, as NVIDIA's Minitron recipe does). What the student lacks is
mostly in the teacher's weights; its outputs add a little on top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, NamedTuple

import numpy as np
import tf_keras as keras
from prefect import task
from pydantic import Field, model_validator

from techniques.base import (
    KERAS_ONLY,
    LABELS,
    NotApplicable,
    Technique,
    TechniqueSection,
    Tuning,
    array_fine_tuning,
    resolved,
    tfmot_model,
    tuning_of,
)
from techniques.depth_prune import blocks_cut
from tfopt.artifacts import ModelArtifact, TrainingData
from tfopt.logs import step_logger
from tfopt.models.channel_pruning import (
    SEARCHED_SHARES,
    ChannelPruningError,
    filter_scores,
    thin_model,
)
from tfopt.models.config import SETTLE_EPOCHS
from tfopt.models.distillation import Distiller, OutputDistiller, compiled_output_distiller
from tfopt.models.distillation import compiled_distiller as distiller_of
from tfopt.models.keras_io import keras_model_path, load_keras_model, save_keras_model
from tfopt.models.training import (
    Fitted,
    LearningRate,
    epochs_run,
    fit,
    fit_compiled,
    recovery,
    scheduled_learning_rate,
)
from tfopt.models.zoo import build_model
from tfopt.schedule.budget import Clock
from tfopt.search import Knob

if TYPE_CHECKING:
    from tfopt.models.translate import Translation


class DistillConfig(TechniqueSection):
    """Knowledge distillation into a small student; the same student from scratch is its control."""

    student_width: int = Field(
        8, ge=4, le=256, description="Filters in the student's first layer."
    )
    alpha: float = Field(
        0.5, ge=0.0, le=1.0,
        description="Weight of the label loss; 1 - alpha weighs the teacher's softened outputs.",
    )
    temperature: float = Field(
        1.0, ge=1.0, le=100.0, description="Softmax temperature of the distillation loss."
    )
    epochs: int = Field(10, ge=1, le=1000, description="Epochs of both students.")
    learning_rate: float = Field(
        2e-3, gt=0.0, le=1.0, description="Adam learning rate of both students (its start)."
    )
    learning_rate_schedule: Literal["cosine", "constant"] = Field(
        "cosine",
        description=(
            "Both students' learning rate over their epochs: cosine (decays to zero, so both "
            "end converged and their comparison is not decided by where the last epoch landed) "
            "or constant."
        ),
    )
    student: Literal["small", "thinner"] = Field(
        "small",
        description=(
            "The student: small (tfopt's small CNN of student_width filters; it starts from "
            "the teacher's filters only where they share convolutions, i.e. the small_cnn) or "
            "thinner (the teacher's own architecture with a share `thinner` of each channel "
            "group's filters removed, as compress.channel_prune removes them: any functional "
            "teacher can pass its most important filters on)."
        ),
    )
    thinner: Annotated[float, Field(ge=0.05, le=0.9)] | Literal["auto"] = Field(
        0.5,
        description="With student thinner: the share of the teacher's filters it lacks; auto: "
                    "the share whose distilled student's int8 file is fastest within the "
                    "accuracy budget, searched among 25% to 87.5% (tfopt.search; its controls "
                    "are trained once, for the share chosen).",
    )
    shallower: float = Field(
        0.0, ge=0.0, le=1.0,
        description="With student thinner: the share of the teacher's residual blocks the "
                    "student lacks too (depth pruning's cut, the least influential blocks "
                    "first), removed before its filters are thinned: width and depth pruned, "
                    "then distilled, as NVIDIA's Minitron recipe does. 0: as deep as the "
                    "teacher; a teacher without a removable residual block makes distillation "
                    "not applicable, said as such.",
    )
    student_init: Literal["teacher", "random"] = Field(
        "teacher",
        description=(
            "Where the distilled student starts: from the teacher's most important filters of "
            "the convolutions they share by name (random where they share none; what made the "
            "distilled student beat its control on the demo: docs/measurements.md), or random "
            "like its control."
        ),
    )
    require_gain: bool = Field(
        False,
        description=(
            "Keep the distilled student only where it beats its control (the same student "
            "trained on labels alone) on the validation split: else its variants are skipped "
            "as not paying (the automatic plan's choice)."
        ),
    )

    @property
    def trainings(self) -> int:
        """The models a run trains for `epochs`: the student and its controls.

        The scratch student, and the thinner student's same start on labels alone.
        """
        return 3 if self.student == "thinner" and self.student_init == "teacher" else 2

    @model_validator(mode="after")
    def _auto_width_needs_the_thinner_student(self) -> DistillConfig:
        if self.thinner == "auto" and self.student != "thinner":
            raise ValueError("thinner: auto searches the thinner student's width: set "
                             "student: thinner")
        if self.shallower and self.student != "thinner":
            raise ValueError("shallower removes the teacher's residual blocks from the thinner "
                             "student: set student: thinner")
        return self


KNOB = Knob("thinner", SEARCHED_SHARES, unit="%")
"""What ``thinner: auto`` searches, weakest first."""

STUDENT_ARCHITECTURE = "small_student"


def students_learning_rate(cfg: DistillConfig, data: TrainingData) -> LearningRate:
    """The learning rate both students train with (the distilled one and its control)."""
    return scheduled_learning_rate(data, cfg.epochs, cfg.learning_rate,
                                   cfg.learning_rate_schedule)


def compiled_distiller(teacher: keras.Model, student: keras.Model, cfg: DistillConfig,
                       data: TrainingData) -> Distiller:
    """A `Distiller` of `student` from `teacher`, compiled with the students' learning rate."""
    return distiller_of(student, teacher, cfg.alpha, cfg.temperature,
                        students_learning_rate(cfg, data))


def distill(
    teacher: keras.Model, student: keras.Model, cfg: DistillConfig, data: TrainingData,
    tuning: Tuning = LABELS,
) -> Fitted:
    """Train `student` against `teacher` in place on the run's pipeline.

    On array data (`tuning`) with its own loss on ``y`` and the squared error to the teacher's
    outputs (`OutputDistiller`: its outputs need not be class scores; no temperature).

    A cosine rate runs to its end (the time budget may still stop it): stopped once back on
    the split trainings choose on (a few hundred images, where a student reaches the baseline
    less the margin well before it does on validation), the student keeps an epoch at a high
    rate, short of the budget where the whole schedule brings it within (docs/measurements.md).
    A constant rate ends once back and settled, as the other fine-tunings do.
    """
    settle = cfg.epochs if cfg.learning_rate_schedule == "cosine" else SETTLE_EPOCHS
    distiller: Distiller | OutputDistiller = (
        compiled_output_distiller(student, teacher, cfg.alpha, tuning.loss,
                                  students_learning_rate(cfg, data))
        if tuning.arrays else compiled_distiller(teacher, student, cfg, data))
    return fit_compiled(distiller, data, epochs=cfg.epochs,
                        callbacks=recovery(data, settle=settle))


def inherit_filters(student: keras.Model, teacher: keras.Model) -> list[str]:
    """Start `student` from the teacher's most important filters, convolution by convolution.

    For each of the student's convolutions, in order, whose name the teacher shares (with a
    batch normalization after it, ``*_conv`` and ``*_bn``), the student takes the teacher's
    filters ranked highest by `filter_scores` (``|gamma|`` times the filter's L1 norm, the rule
    channel pruning ranks by), restricted to the input channels kept in the layer before, and their
    batch-normalization parameters. It stops at the first convolution the teacher lacks or
    cannot fill (fewer filters, another kernel); the rest keep their random initialization.

    Args:
        student: The student, changed in place.
        teacher: The trained teacher, left unchanged.

    Returns:
        The names of the convolutions the student took from the teacher (empty when the teacher
        shares none, e.g. another architecture).
    """
    teachers = {layer.name: layer for layer in teacher.layers}
    students = {layer.name: layer for layer in student.layers}
    inherited: list[str] = []
    kept_inputs: np.ndarray | None = None
    for name, layer in students.items():
        if not isinstance(layer, keras.layers.Conv2D):
            continue
        norm_name = name.removesuffix("_conv") + "_bn"
        if name not in teachers or norm_name not in teachers or norm_name not in students:
            break
        kernels, norm = teachers[name].get_weights(), teachers[norm_name].get_weights()
        shapes = [weight.shape for weight in layer.get_weights()]
        if len(kernels) != 1 or len(shapes) != 1 or len(norm) != 4:
            break
        kernel = kernels[0] if kept_inputs is None else kernels[0][:, :, kept_inputs, :]
        if kernel.shape[:3] != shapes[0][:3] or kernel.shape[3] < shapes[0][3]:
            break
        importance = filter_scores(kernel, norm[0])
        kept_inputs = np.sort(np.argsort(-importance, kind="stable")[:shapes[0][3]])
        layer.set_weights([kernel[..., kept_inputs]])
        students[norm_name].set_weights([weight[kept_inputs] for weight in norm])
        inherited.append(name)
    return inherited


def start_student(student: keras.Model, teacher: keras.Model, cfg: DistillConfig) -> list[str]:
    """Give the distilled student the start `cfg.student_init` asks for.

    Returns:
        The convolutions taken from the teacher (`inherit_filters`); empty for a random start.
    """
    return inherit_filters(student, teacher) if cfg.student_init == "teacher" else []


def student_name(cfg: DistillConfig) -> str:
    """The distilled student's name, the source of its variants.

    ``distilled-small``, or ``distilled-thinner-<percent of filters removed>``, followed by
    ``-depth-<percent of residual blocks removed>`` for a shallower student.
    """
    if cfg.student == "thinner":
        share = "auto" if cfg.thinner == "auto" else round(cfg.thinner * 100)
        depth = f"-depth-{round(cfg.shallower * 100)}" if cfg.shallower else ""
        return f"distilled-thinner-{share}{depth}"
    return "distilled-small"


@dataclass
class Students:
    """The distilled student before training, and how to make its controls.

    Attributes:
        student: The student to distill (its start already given).
        inherited: The teacher's layers whose filters it starts from (empty: a random start).
        architecture: What the student is, for the run's params.
        scratch: Makes the control from random weights.
        same_start: Makes the control from the student's own start (trained on labels alone),
            when that start is the teacher's.
    """

    student: keras.Model
    inherited: list[str]
    architecture: str
    scratch: Callable[[], keras.Model]
    same_start: Callable[[], keras.Model] | None = None


def small_students(teacher: keras.Model, model: ModelArtifact, cfg: DistillConfig,
                   data: TrainingData) -> Students:
    """The small CNN as the student; the control is the same CNN from random weights."""
    def new_student() -> keras.Model:
        keras.utils.set_random_seed(data.seed)
        return build_model(STUDENT_ARCHITECTURE, data.dataset.image_size,
                           data.dataset.num_classes, channels=model.channels,
                           width=cfg.student_width)

    student = new_student()
    inherited = start_student(student, teacher, cfg)
    if cfg.student_init == "teacher" and not inherited:
        step_logger().info("the teacher shares no convolution with the student: random start")
    return Students(student, inherited, STUDENT_ARCHITECTURE, new_student)


def thinner_students(teacher: keras.Model, cfg: DistillConfig, data: TrainingData) -> Students:
    """The teacher made thinner (its most important filters kept) as the student.

    Controls: the same architecture from random weights (scratch), and the same start trained
    on labels alone (what the teacher's outputs add to its weights).

    Raises:
        NotApplicable: The teacher cannot be thinned (the layers in the way are named), or
            made shallower as `cfg.shallower` asks.
    """
    start = shallower_teacher(teacher, cfg.shallower, data) if cfg.shallower else teacher
    try:
        thinned = thin_model(start, cfg.thinner)
    except ChannelPruningError as error:
        raise NotApplicable(f"the teacher cannot be made thinner: {error}") from error
    config = thinned.model.get_config()
    weights = thinned.model.get_weights()

    def random_start() -> keras.Model:
        keras.utils.set_random_seed(data.seed)
        return keras.Model.from_config(config)

    def same_start() -> keras.Model:
        twin = keras.Model.from_config(config)
        twin.set_weights(weights)
        return twin

    student = same_start() if cfg.student_init == "teacher" else random_start()
    inherited = sorted(thinned.kept) if cfg.student_init == "teacher" else []
    depth = f", {cfg.shallower:.0%} of residual blocks" if cfg.shallower else ""
    return Students(student, inherited, f"thinner teacher ({cfg.thinner:.0%} of filters"
                    f"{depth} removed)", random_start, same_start if inherited else None)


def shallower_teacher(teacher: keras.Model, share: float, data: TrainingData) -> keras.Model:
    """The teacher without `share` of its residual blocks (`blocks_cut`).

    Raises:
        NotApplicable: The teacher has no removable residual block (or cannot be traced).
    """
    shallower = blocks_cut(teacher, share, data, "the student cannot be made shallower: ")
    step_logger().info("the student lacks %d of the teacher's %d residual blocks (%s)",
                       len(shallower.removed), shallower.blocks, ", ".join(shallower.removed))
    return shallower.model


def teacher_and_students(model: ModelArtifact, cfg: DistillConfig,
                         data: TrainingData) -> tuple[keras.Model, Translation | None, Students]:
    """The teacher as distillation takes it, its translation (a Keras 3 teacher) and students."""
    if cfg.student == "thinner":
        teacher, translation = tfmot_model(model, data)
        return teacher, translation, thinner_students(teacher, cfg, data)
    teacher = load_keras_model(model.path)
    return teacher, None, small_students(teacher, model, cfg, data)


@task(name="distill_model", tags=["compression"])
def distill_model(
    model: ModelArtifact, cfg: DistillConfig, data: TrainingData, out_dir: Path
) -> ModelArtifact:
    """Distill the model (the teacher) into a small student; train its control from scratch.

    The distilled student starts from the teacher's filters (`cfg.student_init` teacher, where
    the two share convolutions); the control is the same student from random weights, trained
    with the same budget on labels alone. A search trial (`data.trial`) trains the student
    alone: the controls of the width chosen are trained after the search (`distill_controls`).

    A Keras file of array data (`ModelArtifact.keras_file`) has the thinner student, which
    learns its own loss on ``y`` and the teacher's outputs (`distill`), judged by the run's
    metric; it becomes a SavedModel of its own signature.

    Args:
        model: The trained teacher (left unchanged).
        cfg: Student width, alpha, temperature, epochs and learning rate (both students).
        data: The run's training data and input settings (both students); the test split
            measures both.
        out_dir: Folder for ``distilled-small.keras``.

    Returns:
        The distilled student, with its test accuracy and (not in a trial) its controls' and
        the gains in points.

    Raises:
        NotApplicable: `cfg.require_gain` and the student does not beat its control, or a
            teacher that cannot be made thinner; on array data the small (image) student, or
            no ``y``.
    """
    resolved(cfg, KNOB)
    name = student_name(cfg)
    refuse_on_arrays(model, cfg, data)
    teacher, translation, students = teacher_and_students(model, cfg, data)
    tuning = tuning_of(model, teacher, data, name)
    student = students.student
    trial = data.trial is not None
    fitted = distill(teacher, student, cfg, data if trial else student_share(data, students),
                     tuning)
    judged = {} if trial else against_controls(
        students, Figures(tuning.figure(student, data, "val"),
                          tuning.figure(student, data, "test")), cfg, data,
        epochs_run(fitted), tuning)
    path = keras_model_path(out_dir, name)
    save_keras_model(student, path)
    return tuning.variant(
        model, student, name, path, out_dir, fitted, data,
        params={"technique": "distillation", "student": students.architecture,
                "student_width": cfg.student_width, "alpha": cfg.alpha,
                "temperature": cfg.temperature, "epochs": cfg.epochs,
                "learning_rate": cfg.learning_rate,
                "learning_rate_schedule": cfg.learning_rate_schedule,
                "student_init": cfg.student_init,
                **({"thinner": cfg.thinner, "shallower": cfg.shallower}
                   if cfg.student == "thinner" else {}),
                "inherited_layers": ",".join(students.inherited)[:5000] or "none",
                "student_parameters": int(student.count_params()),
                "teacher_parameters": int(teacher.count_params())},
        translation=translation,
        metrics=judged,
    )


def refuse_on_arrays(model: ModelArtifact, cfg: DistillConfig, data: TrainingData) -> None:
    """Refuse what distillation does not do on a Keras file of array data, before any work.

    Raises:
        NotApplicable: The small student (an image CNN), or data without ``y`` (the thinner
            student learning the teacher's outputs alone is channel pruning's
            self-distillation: `compress.channel_prune`).
    """
    if model.keras_file is None:
        return
    if cfg.student != "thinner":
        raise NotApplicable("the small student is an image CNN: on array data the student is "
                            "the teacher made thinner (student: thinner)")
    if array_fine_tuning(data)[1]:
        raise NotApplicable("without y (or judged by fidelity) the thinner student would learn "
                            "the teacher's outputs alone: that is compress.channel_prune's "
                            "self-distillation on this data")


@task(name="distill_controls", tags=["compression"])
def distill_controls(model: ModelArtifact, cfg: DistillConfig, data: TrainingData,
                     out_dir: Path, made: ModelArtifact) -> ModelArtifact:
    """The controls of the width a search chose, trained as long as its student was.

    A search's trials train the distilled student alone; this trains the chosen one's controls
    once (`against_controls`), so it is judged as an unsearched student is.

    Args:
        model: The trained teacher (left unchanged).
        cfg: The settings at the chosen width.
        data: The run's training data (the controls have no deadline of their own).
        out_dir: The technique's folder (the controls leave no file).
        made: The chosen trial's distilled student.

    Returns:
        `made` with its controls' test accuracies and the gains in points.

    Raises:
        NotApplicable: `cfg.require_gain` and the student does not beat its control.
    """
    del out_dir
    teacher, _, students = teacher_and_students(model, cfg, data)
    tuning = tuning_of(model, teacher, data, made.name)
    student = load_keras_model(made.keras_file or made.path)
    distilled = Figures(tuning.figure(student, data, "val"),
                        made.metrics[f"test_{tuning.figure_name(data)}"])
    judged = against_controls(students, distilled, cfg, data, int(made.params["epochs_run"]),
                              tuning)
    return made.model_copy(update={"metrics": {**made.metrics, **judged}})


class Figures(NamedTuple):
    """A student's figure on the validation split (decides) and on the test split (reported).

    Top-1 accuracy, or the run's metric on array data (`Tuning.figure`).
    """

    val: float
    test: float
    seconds: float = 0.0
    """Its training's seconds (a control's: they price distillation's next run here)."""


def against_controls(students: Students, distilled: Figures, cfg: DistillConfig,
                     data: TrainingData, epochs: int,
                     tuning: Tuning = LABELS) -> dict[str, float]:
    """Train the distilled student's controls for its `epochs`; their figures and the gains.

    Whether distillation pays (`cfg.require_gain`) is decided on the validation split; the
    gains on test are reported (``distillation_gain_points``, on array data
    ``distillation_gain`` in the metric's units, positive: better), never chosen on.

    Raises:
        NotApplicable: `cfg.require_gain` and the student does not beat its scratch control
            on validation.
    """
    figures = {"scratch": _trained_alone(students.scratch(), cfg, data, epochs, tuning)}
    if students.same_start is not None:
        figures["same_start"] = _trained_alone(students.same_start(), cfg, data, epochs, tuning)
    name, unit = tuning.figure_name(data), "" if tuning.arrays else "_points"
    shown = f"{name} (positive: better)" if tuning.arrays else "points"
    gain = tuning.gain(distilled.test, figures["scratch"].test, data)
    val_gain = tuning.gain(distilled.val, figures["scratch"].val, data)
    step_logger().info(
        "student %s, validation / test: distilled %.4f / %.4f, from scratch %.4f / %.4f "
        "(%+.4g / %+.4g %s)%s", name, distilled.val, distilled.test, figures["scratch"].val,
        figures["scratch"].test, val_gain, gain, shown,
        f", same start on its own loss {figures['same_start'].val:.4f} / "
        f"{figures['same_start'].test:.4f}" if "same_start" in figures else "")
    if cfg.require_gain and val_gain <= 0.0:
        raise NotApplicable(f"distillation does not pay here: on validation the distilled "
                            f"student reached {name} {distilled.val:.4f}, its control trained "
                            f"alone {figures['scratch'].val:.4f} ({val_gain:+.4g} {shown})")
    judged = {f"scratch_test_{name}": figures["scratch"].test,
              f"scratch_val_{name}": figures["scratch"].val,
              f"distillation_gain{unit}": gain, f"distillation_val_gain{unit}": val_gain,
              "controls_fit_seconds": round(sum(f.seconds for f in figures.values()), 3)}
    if "same_start" in figures:
        judged |= {f"same_start_test_{name}": figures["same_start"].test,
                   f"teacher_outputs_gain{unit}":
                       tuning.gain(distilled.test, figures["same_start"].test, data)}
    return judged


def student_share(data: TrainingData, students: Students) -> TrainingData:
    """`data` with the distilled student's share of the time left to its deadline.

    Its controls then train as many epochs as it did, with no deadline of their own (their
    comparison needs the same epochs), so the student ends early enough for them to fit.
    """
    if data.deadline is None:
        return data
    trainings = 2 if students.same_start is None else 3
    clock = Clock(deadline=data.deadline).share(0.0, 0.0, 1.0 / trainings)
    return data.model_copy(update={"deadline": clock.deadline})


def _trained_alone(student: keras.Model, cfg: DistillConfig, data: TrainingData, epochs: int,
                   tuning: Tuning) -> Figures:
    """A control: `student` trained without the teacher for `epochs`; its figures.

    On labels, or with its own loss on ``y`` (array data).
    """
    fitted = fit(student, data, epochs=epochs, learning_rate=students_learning_rate(cfg, data),
                 loss=tuning.loss)
    return Figures(tuning.figure(student, data, "val"), tuning.figure(student, data, "test"),
                   fitted.seconds)


TECHNIQUE = Technique(
    name="distill", section=DistillConfig, accepts=KERAS_ONLY, source_name=student_name,
    apply=distill_model, knob=KNOB, after_search=distill_controls, reshapes=True,
    on_arrays=True,
)
