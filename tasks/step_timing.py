"""Timing training steps on a fixed batch, with the memory they take. Not a task."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras


@dataclass(frozen=True)
class StepTiming:
    """Steady-state training-step speed at one batch size."""

    examples_per_s: float
    step_ms: float
    peak_extra_mb: float


def resident_mb() -> float:
    """This process's current resident memory (VmRSS) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


class _PeakSampler:
    """Polls VmRSS on a thread and keeps the highest value seen."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.peak = resident_mb()
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_mb())
            time.sleep(self._interval)

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_mb())


def tile_batch(
    images: np.ndarray, labels: np.ndarray, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Repeat real examples until there are `batch_size` of them."""
    reps = -(-batch_size // len(images))
    tiled_images = np.concatenate([images] * reps)[:batch_size]
    return tiled_images, np.concatenate([labels] * reps)[:batch_size]


def time_train_steps(
    build: Callable[[], keras.Model],
    images: np.ndarray,
    labels: np.ndarray,
    steps: int,
    warmup: int = 3,
) -> StepTiming:
    """Build a model, then time `steps` training steps on one fixed batch after `warmup` steps.

    A fixed, already-decoded batch isolates the training step from the input pipeline. Memory
    is the peak resident size during build, warm-up and steps, over the level just before:
    allocators keep freed memory, so after a larger batch the next figure is a lower bound.

    Args:
        build: Returns a fresh, uncompiled Keras model.
        images: The batch (float32 ``[B, S, S, 3]``).
        labels: Its labels.
        steps: Timed steps.
        warmup: Untimed steps first (tracing, allocation).

    Returns:
        Examples per second, milliseconds per step, extra peak memory in MB.
    """
    before = resident_mb()
    with _PeakSampler() as sampler:
        model = build()
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = tf.constant(images), tf.constant(labels)
        for _ in range(warmup):
            model.train_on_batch(x, y)
        started = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(x, y)
        elapsed = time.perf_counter() - started
    keras.backend.clear_session()
    return StepTiming(
        examples_per_s=steps * len(images) / elapsed,
        step_ms=elapsed / steps * 1000.0,
        peak_extra_mb=max(0.0, sampler.peak - before),
    )
