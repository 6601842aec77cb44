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

import tensorflow as tf
import tf_keras as keras


class Distiller(keras.Model):
    """Trains `student` on labels and on the teacher's temperature-softened outputs."""

    def __init__(self, student: keras.Model, teacher: keras.Model, alpha: float,
                 temperature: float) -> None:
        super().__init__()
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.alpha = alpha
        self.temperature = temperature
        self.student_loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.distillation_loss_fn = keras.losses.KLDivergence()
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.student_loss_tracker = keras.metrics.Mean(name="student_loss")
        self.distillation_loss_tracker = keras.metrics.Mean(name="distillation_loss")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Metrics reset at each epoch."""
        return [self.loss_tracker, self.student_loss_tracker, self.distillation_loss_tracker,
                self.accuracy]

    def distillation_loss(self, teacher_logits: tf.Tensor, student_logits: tf.Tensor) -> tf.Tensor:
        """KL divergence of the softened distributions, scaled by T^2 (Hinton et al.)."""
        t = self.temperature
        return self.distillation_loss_fn(
            tf.nn.softmax(teacher_logits / t), tf.nn.softmax(student_logits / t)
        ) * (t * t)

    def train_step(self, data: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        """One step on the combined label and distillation loss."""
        images, labels = data
        teacher_logits = self.teacher(images, training=False)
        with tf.GradientTape() as tape:
            student_logits = self.student(images, training=True)
            student_loss = self.student_loss_fn(labels, student_logits)
            distill_loss = self.distillation_loss(teacher_logits, student_logits)
            loss = self.alpha * student_loss + (1.0 - self.alpha) * distill_loss
        variables = self.student.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        self.loss_tracker.update_state(loss)
        self.student_loss_tracker.update_state(student_loss)
        self.distillation_loss_tracker.update_state(distill_loss)
        self.accuracy.update_state(labels, student_logits)
        return {metric.name: metric.result() for metric in self.metrics}

    def test_step(self, data: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Validation judges the student alone, on labels (its ``loss`` is the student's)."""
        images, labels = data
        student_logits = self.student(images, training=False)
        self.student_loss_tracker.update_state(self.student_loss_fn(labels, student_logits))
        self.accuracy.update_state(labels, student_logits)
        return {"loss": self.student_loss_tracker.result(),
                "student_loss": self.student_loss_tracker.result(),
                "accuracy": self.accuracy.result()}

    def call(self, images: tf.Tensor, training: bool = False) -> tf.Tensor:
        """The student's logits."""
        return self.student(images, training=training)


def compiled_distiller(student: keras.Model, teacher: keras.Model, alpha: float,
                       temperature: float,
                       learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
                       ) -> Distiller:
    """A `Distiller` of `student` from `teacher`, compiled with Adam at `learning_rate`."""
    distiller = Distiller(student, teacher, alpha, temperature)
    distiller.compile(optimizer=keras.optimizers.Adam(learning_rate))
    return distiller


class OutputDistiller(keras.Model):
    """Trains `student` on its own loss against ``y`` and on the teacher's outputs, any shape.

    The loss is ``alpha * loss(y, student) + (1 - alpha) * MSE(teacher, student)``, the squared
    error averaged over each output's values, then over the outputs (matched in order: the
    student is the teacher rebuilt smaller, with the same outputs). Its own loss is the one it
    is compiled with (a model file's compiled loss, or ``train.loss``). Validation judges the
    student alone on its own loss; calling it calls the student.
    """

    def __init__(self, student: keras.Model, teacher: keras.Model, alpha: float) -> None:
        super().__init__()
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.alpha = alpha
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.student_loss_tracker = keras.metrics.Mean(name="student_loss")
        self.distillation_loss_tracker = keras.metrics.Mean(name="distillation_loss")

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Metrics reset at each epoch."""
        return [self.loss_tracker, self.student_loss_tracker, self.distillation_loss_tracker]

    def train_step(self, data: tuple) -> dict[str, tf.Tensor]:
        """One step on the combined loss."""
        inputs, truth = data
        taught = tf.nest.flatten(self.teacher(inputs, training=False))
        with tf.GradientTape() as tape:
            outputs = self.student(inputs, training=True)
            own = self.compiled_loss(truth, outputs, regularization_losses=self.student.losses)
            matched = tf.add_n([
                tf.reduce_mean(tf.square(tf.cast(t, tf.float32) - tf.cast(s, tf.float32)))
                for t, s in zip(taught, tf.nest.flatten(outputs), strict=True)]) / len(taught)
            loss = self.alpha * own + (1.0 - self.alpha) * matched
        variables = self.student.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        self.loss_tracker.update_state(loss)
        self.student_loss_tracker.update_state(own)
        self.distillation_loss_tracker.update_state(matched)
        return {metric.name: metric.result() for metric in self.metrics}

    def test_step(self, data: tuple) -> dict[str, tf.Tensor]:
        """The student alone, on its own loss (its ``loss`` is the student's)."""
        inputs, truth = data
        own = self.compiled_loss(truth, self.student(inputs, training=False),
                                 regularization_losses=self.student.losses)
        self.student_loss_tracker.update_state(own)
        return {"loss": self.student_loss_tracker.result(),
                "student_loss": self.student_loss_tracker.result()}

    def call(self, inputs: tf.Tensor, training: bool = False) -> tf.Tensor:
        """The student's outputs."""
        return self.student(inputs, training=training)


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
