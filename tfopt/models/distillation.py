"""Knowledge distillation's training step: a student learns from labels and a teacher's outputs.

The loss is ``alpha * CE(labels, student) + (1 - alpha) * T^2 * KL(softmax(teacher / T) ||
softmax(student / T))`` (Hinton et al.). tensorflow-model-optimization has no distillation API:
`techniques.distill` trains its students with it, and the channel and depth pruners their
fine-tuning (`techniques.base.fine_tune_rebuilt`: the model before pruning teaches the one after).

A model of array data's outputs need not be class scores (a regressor's values, a segmenter's
pixel scores, a detector's boxes): `OutputDistiller` weighs its own loss against the data's ``y``
with the squared error to the teacher's outputs instead.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras


class _Distillation(keras.Model):
    """A student trained on its own loss and on a teacher's outputs, weighted `alpha`.

    The step is the same whatever the outputs: ``alpha * own_loss(truth, student) + (1 -
    alpha) * distillation_loss(teacher, student)``, gradients to the student alone. Validation
    judges the student alone on its own loss (its ``loss`` is the student's), with `judging`'s
    metrics; calling it calls the student. Subclasses say what the two losses are.
    """

    def __init__(self, student: keras.Model, teacher: keras.Model, alpha: float,
                 judging: tuple[keras.metrics.Metric, ...] = ()) -> None:
        super().__init__()
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.alpha = alpha
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.student_loss_tracker = keras.metrics.Mean(name="student_loss")
        self.distillation_loss_tracker = keras.metrics.Mean(name="distillation_loss")
        self.judging = list(judging)

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Metrics reset at each epoch."""
        return [self.loss_tracker, self.student_loss_tracker, self.distillation_loss_tracker,
                *self.judging]

    def own_loss(self, truth: Any, outputs: Any) -> tf.Tensor:
        """The student's loss against the data's truth."""
        raise NotImplementedError

    def distillation_loss(self, taught: Any, outputs: Any) -> tf.Tensor:
        """The student's loss against the teacher's outputs."""
        raise NotImplementedError

    def train_step(self, data: tuple) -> dict[str, tf.Tensor]:
        """One step on the combined loss."""
        inputs, truth = data
        taught = self.teacher(inputs, training=False)
        with tf.GradientTape() as tape:
            outputs = self.student(inputs, training=True)
            own = self.own_loss(truth, outputs)
            distilled = self.distillation_loss(taught, outputs)
            loss = self.alpha * own + (1.0 - self.alpha) * distilled
        variables = self.student.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        self.loss_tracker.update_state(loss)
        self.student_loss_tracker.update_state(own)
        self.distillation_loss_tracker.update_state(distilled)
        for metric in self.judging:
            metric.update_state(truth, outputs)
        return {metric.name: metric.result() for metric in self.metrics}

    def test_step(self, data: tuple) -> dict[str, tf.Tensor]:
        """The student alone, on its own loss and `judging`'s metrics."""
        inputs, truth = data
        outputs = self.student(inputs, training=False)
        self.student_loss_tracker.update_state(self.own_loss(truth, outputs))
        for metric in self.judging:
            metric.update_state(truth, outputs)
        return {"loss": self.student_loss_tracker.result(),
                "student_loss": self.student_loss_tracker.result(),
                **{metric.name: metric.result() for metric in self.judging}}

    def call(self, inputs: Any, training: bool = False) -> Any:
        """The student's outputs."""
        return self.student(inputs, training=training)


class Distiller(_Distillation):
    """Trains `student` on labels and on the teacher's temperature-softened outputs."""

    def __init__(self, student: keras.Model, teacher: keras.Model, alpha: float,
                 temperature: float) -> None:
        super().__init__(student, teacher, alpha,
                         (keras.metrics.SparseCategoricalAccuracy(name="accuracy"),))
        self.temperature = temperature
        self.student_loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.distillation_loss_fn = keras.losses.KLDivergence()

    def own_loss(self, truth: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """Cross-entropy of the labels and the student's logits."""
        return self.student_loss_fn(truth, outputs)

    def distillation_loss(self, taught: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """KL divergence of the softened distributions, scaled by T^2 (Hinton et al.)."""
        t = self.temperature
        return self.distillation_loss_fn(
            tf.nn.softmax(taught / t), tf.nn.softmax(outputs / t)
        ) * (t * t)


def compiled_distiller(student: keras.Model, teacher: keras.Model, alpha: float,
                       temperature: float,
                       learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
                       ) -> Distiller:
    """A `Distiller` of `student` from `teacher`, compiled with Adam at `learning_rate`."""
    distiller = Distiller(student, teacher, alpha, temperature)
    distiller.compile(optimizer=keras.optimizers.Adam(learning_rate))
    return distiller


class OutputDistiller(_Distillation):
    """Trains `student` on its own loss against ``y`` and on the teacher's outputs, any shape.

    The loss is ``alpha * loss(y, student) + (1 - alpha) * MSE(teacher, student)``, the squared
    error averaged over each output's values, then over the outputs (matched in order: the
    student is the teacher rebuilt smaller, with the same outputs). Its own loss is the one it
    is compiled with (a model file's compiled loss, or ``train.loss``).
    """

    def own_loss(self, truth: Any, outputs: Any) -> tf.Tensor:
        """The compiled loss, with the student's regularization."""
        return self.compiled_loss(truth, outputs, regularization_losses=self.student.losses)

    def distillation_loss(self, taught: Any, outputs: Any) -> tf.Tensor:
        """The squared error to the teacher's outputs, averaged per output, then over them."""
        taught = tf.nest.flatten(taught)
        return tf.add_n([
            tf.reduce_mean(tf.square(tf.cast(t, tf.float32) - tf.cast(s, tf.float32)))
            for t, s in zip(taught, tf.nest.flatten(outputs), strict=True)]) / len(taught)


def compiled_output_distiller(
    student: keras.Model, teacher: keras.Model, alpha: float, loss: object,
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
) -> OutputDistiller:
    """An `OutputDistiller` of `student` from `teacher`, compiled with Adam at `learning_rate`.

    `loss`: the student's own (a tf_keras loss, or its name).
    """
    distiller = OutputDistiller(student, teacher, alpha)
    distiller.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss)
    return distiller
