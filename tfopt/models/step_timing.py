"""Timing training steps on a fixed batch, with the memory they take: batch sizes and layouts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from tfopt.artifacts import BatchSweepResult, DatasetArtifact, LayoutResult, SweepPoint
from tfopt.config import InputConfig
from tfopt.data.pipeline import load_split
from tfopt.logs import step_logger
from tfopt.models.config import ModelConfig
from tfopt.models.keras_io import keras_of
from tfopt.models.sources import baseline_factory
from tfopt.native import NativeStep
from tfopt.provenance import cpu_model

SWEEP_STEP = NativeStep(
    "sweep_batch_size", "training steps in TensorFlow's CPU kernels",
    "the run goes on at train.batch_size, or the first of input.sweep_batch_sizes")
LAYOUT_STEP = NativeStep(
    "measure_data_layout", "training steps in TensorFlow's CPU kernels",
    "the run goes on without the layout measurement (input.measure_layouts: false skips it)")


@dataclass(frozen=True)
class StepTiming:
    """Steady-state training-step speed at one batch size."""

    examples_per_s: float
    step_ms: float
    peak_extra_mb: float


def resident_mb() -> float:
    """This process's current resident memory (VmRSS) in MB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


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
        module = keras_of(model)
        model.compile(optimizer=module.optimizers.Adam(1e-3),
                      loss=module.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = tf.constant(images), tf.constant(labels)
        for _ in range(warmup):
            model.train_on_batch(x, y)
        started = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(x, y)
        elapsed = time.perf_counter() - started
    module.backend.clear_session()
    return StepTiming(
        examples_per_s=steps * len(images) / elapsed,
        step_ms=elapsed / steps * 1000.0,
        peak_extra_mb=max(0.0, sampler.peak - before),
    )


def choose_batch_size(
    points: list[SweepPoint],
    tolerance: float,
    memory_budget_mb: float,
    max_batch_size: int | None = None,
) -> tuple[int, str]:
    """The smallest batch size within `tolerance` of the best throughput among those that fit.

    A batch size fits when its step's extra memory is within `memory_budget_mb` and it is at
    most `max_batch_size` (a training set of N examples and a minimum of S steps per epoch
    allow N / S: the fastest batch is no good if an epoch is then only a few steps). Smaller
    batches generalize at least as well and leave memory to the machine, so once throughput
    has (nearly) plateaued there is no reason to go larger.

    Args:
        points: Measured batch sizes.
        tolerance: Allowed shortfall from the best throughput, as a share (0.05 = 5%).
        memory_budget_mb: Largest allowed extra memory of a training step.
        max_batch_size: Largest batch size allowed (None: no limit).

    Returns:
        The chosen batch size and the rule with the numbers it used.
    """
    limit = max_batch_size if max_batch_size is not None else max(p.batch_size for p in points)
    fitting = [p for p in points
               if p.peak_extra_mb <= memory_budget_mb and p.batch_size <= limit]
    if not fitting:
        smallest = min(points, key=lambda p: p.batch_size)
        return smallest.batch_size, (
            f"no batch size fits {memory_budget_mb:.0f} MB and <= {limit}; took the smallest, "
            f"{smallest.batch_size}"
        )
    best = max(p.examples_per_s for p in fitting)
    floor = best * (1.0 - tolerance)
    chosen = min((p for p in fitting if p.examples_per_s >= floor), key=lambda p: p.batch_size)
    return chosen.batch_size, (
        f"smallest batch size within {tolerance:.0%} of the best throughput "
        f"({best:,.0f} examples/s) among those <= {limit} whose step fits "
        f"{memory_budget_mb:.0f} MB: {chosen.batch_size}"
    )


def plot_sweep(points: list[SweepPoint], chosen: int, path: Path) -> Path:
    """Throughput and step latency against batch size, the choice marked; saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [p.batch_size for p in points]
    fig, throughput_axis = plt.subplots(figsize=(7, 4))
    throughput_axis.plot(sizes, [p.examples_per_s for p in points], "o-", color="tab:blue")
    throughput_axis.set_xscale("log", base=2)
    throughput_axis.set_xlabel("batch size")
    throughput_axis.set_ylabel("train examples / s", color="tab:blue")
    latency_axis = throughput_axis.twinx()
    latency_axis.plot(sizes, [p.step_ms for p in points], "s--", color="tab:orange")
    latency_axis.set_ylabel("step latency (ms)", color="tab:orange")
    throughput_axis.axvline(chosen, color="tab:green", linestyle=":", label=f"chosen: {chosen}")
    throughput_axis.legend(loc="upper left")
    throughput_axis.set_title("Batch-size sweep (training step, fixed decoded batch)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_batch_sizes(dataset: DatasetArtifact, model_cfg: ModelConfig, cfg: InputConfig,
                      out_dir: Path, deadline: float | None = None) -> BatchSweepResult:
    """Training-step throughput, latency and memory per batch size, and the rule's choice.

    A model tfopt does not train (a SavedModel, .tflite or .onnx file) is not swept: the result
    says so and holds the first configured batch size. Batch sizes the rule could not choose
    (fewer than ``min_steps_per_epoch`` steps per epoch) are not measured, nor those after
    `deadline` (a `time.time()` value: the run's time budget), the smallest always.
    """
    logger = step_logger()
    if model_cfg.kind != "keras":
        rule = (f"not measured: a {model_cfg.kind} model is not trained here; batch "
                f"{cfg.sweep_batch_sizes[0]} measures the readers")
        logger.info("batch-size sweep %s", rule)
        return BatchSweepResult(points=[], chosen_batch_size=cfg.sweep_batch_sizes[0], rule=rule)
    max_batch = max(1, dataset.splits["train"].examples // cfg.min_steps_per_epoch)
    sizes = sorted(set(cfg.sweep_batch_sizes))
    choosable = [size for size in sizes if size <= max_batch] or sizes[:1]
    if len(choosable) < len(sizes):
        logger.info("batch sizes %s not measured: under %d steps per epoch on %d examples",
                    [s for s in sizes if s not in choosable], cfg.min_steps_per_epoch,
                    dataset.splits["train"].examples)
    images, labels = load_split(dataset, "train", max(choosable))
    make_model = baseline_factory(model_cfg, dataset.image_size, dataset.num_classes,
                                  dataset.class_names)
    points = []
    for batch_size in choosable:
        if points and deadline is not None and time.time() > deadline:
            logger.info("batch-size sweep stopped at %d sizes: the time budget", len(points))
            break
        batch_images, batch_labels = tile_batch(images, labels, batch_size)
        timing = time_train_steps(make_model, batch_images, batch_labels, cfg.sweep_steps)
        points.append(SweepPoint(batch_size=batch_size, examples_per_s=timing.examples_per_s,
                                 step_ms=timing.step_ms, peak_extra_mb=timing.peak_extra_mb))
        logger.info("batch %d: %.0f examples/s, %.1f ms/step, +%.0f MB", batch_size,
                    timing.examples_per_s, timing.step_ms, timing.peak_extra_mb)
    chosen, rule = choose_batch_size(points, cfg.sweep_tolerance, cfg.memory_budget_mb,
                                     max_batch)
    logger.info("chosen batch size: %s", rule)
    plot = plot_sweep(points, chosen, out_dir / "batch_size_sweep.png")
    return BatchSweepResult(points=points, chosen_batch_size=chosen, rule=rule, plot_path=plot)


DEFAULT_BATCH_SIZE = 32
"""The batch a run trains at when its sweep cannot run and ``train.batch_size`` is not set."""


def unswept(batch_size: int | None, reason: str) -> BatchSweepResult:
    """The sweep's result when it could not run: `batch_size`, else `DEFAULT_BATCH_SIZE`."""
    chosen = batch_size or DEFAULT_BATCH_SIZE
    source = "train.batch_size" if batch_size else "the default"
    return BatchSweepResult(points=[], chosen_batch_size=chosen,
                            rule=f"not measured: the sweep failed ({reason[:300]}); batch "
                                 f"{chosen} ({source})")


def compare_layouts(dataset: DatasetArtifact, model_cfg: ModelConfig, batch_size: int,
                    steps: int) -> LayoutResult:
    """The same network's training step built NHWC and NCHW, timed on the same batch.

    A user's model (file or builder) has its layout built in: only its own layout is measured,
    and the note says so.

    Raises:
        RuntimeError: NHWC training itself failed.
    """
    logger = step_logger()
    images, labels = load_split(dataset, "train", batch_size)
    images, labels = tile_batch(images, labels, batch_size)
    rates: dict[str, float | None] = {"channels_first": None}
    notes = []
    if model_cfg.source != "zoo":
        notes.append(f"NCHW not measured: a model.source={model_cfg.source} model fixes its own "
                     "layout (only zoo networks are built in either layout)")
    for layout in ("channels_last", "channels_first")[: 2 if model_cfg.source == "zoo" else 1]:
        layout_cfg = model_cfg.model_copy(update={"data_format": layout})
        try:
            timing = time_train_steps(
                baseline_factory(layout_cfg, dataset.image_size, dataset.num_classes),
                images, labels, steps)
            rates[layout] = timing.examples_per_s
        except Exception as error:
            rates[layout] = None
            notes.append(f"{layout} unsupported here: {type(error).__name__}: {str(error)[:200]}")
    nhwc, nchw = rates["channels_last"], rates["channels_first"]
    if nhwc is None:
        raise RuntimeError("NHWC training failed: " + "; ".join(notes))
    faster = "NHWC" if nchw is None or nhwc >= nchw else "NCHW"
    if nchw is not None:
        notes.append(f"NCHW/NHWC throughput ratio {nchw / nhwc:.2f}")
    result = LayoutResult(device=cpu_model(), nhwc_examples_per_s=nhwc, nchw_examples_per_s=nchw,
                          faster=faster, note="; ".join(notes))
    logger.info("data layout on %s: NHWC %.0f ex/s, NCHW %s ex/s -> %s faster", result.device,
                nhwc, f"{nchw:.0f}" if nchw else "unsupported", faster)
    return result
