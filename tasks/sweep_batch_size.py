"""Choose the training batch size by measurement: throughput, step latency and memory."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tasks.input_pipeline import load_split
from tasks.keras_models import baseline_factory
from tasks.step_timing import tile_batch, time_train_steps
from tfopt.artifacts import BatchSweepResult, DatasetArtifact, SweepPoint
from tfopt.config import InputConfig, ModelConfig
from tfopt.logs import step_logger


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


@task(name="sweep_batch_size", tags=["input-pipeline"])
def sweep_batch_size(
    dataset: DatasetArtifact, model_cfg: ModelConfig, cfg: InputConfig, out_dir: Path
) -> BatchSweepResult:
    """Measure training-step throughput, latency and memory per batch size; apply the rule.

    A model tfopt does not train (a SavedModel, .tflite or .onnx file) is not swept: the result
    says so and holds the first configured batch size.

    Args:
        dataset: Real training examples fill the measured batches.
        model_cfg: The network being trained.
        cfg: Batch sizes, steps, tolerance and memory budget.
        out_dir: Folder for the plot.

    Returns:
        Every point, the chosen batch size, the rule, and the plot's path.
    """
    logger = step_logger()
    if model_cfg.kind != "keras":
        rule = (f"not measured: a {model_cfg.kind} model is not trained here; batch "
                f"{cfg.sweep_batch_sizes[0]} measures the readers")
        logger.info("batch-size sweep %s", rule)
        return BatchSweepResult(points=[], chosen_batch_size=cfg.sweep_batch_sizes[0], rule=rule)
    images, labels = load_split(dataset, "train", max(cfg.sweep_batch_sizes))
    make_model = baseline_factory(model_cfg, dataset.image_size, dataset.num_classes,
                                  dataset.class_names)
    points = []
    for batch_size in sorted(set(cfg.sweep_batch_sizes)):
        batch_images, batch_labels = tile_batch(images, labels, batch_size)
        timing = time_train_steps(make_model, batch_images, batch_labels, cfg.sweep_steps)
        points.append(SweepPoint(batch_size=batch_size, examples_per_s=timing.examples_per_s,
                                 step_ms=timing.step_ms, peak_extra_mb=timing.peak_extra_mb))
        logger.info("batch %d: %.0f examples/s, %.1f ms/step, +%.0f MB", batch_size,
                    timing.examples_per_s, timing.step_ms, timing.peak_extra_mb)
    max_batch = max(1, dataset.splits["train"].examples // cfg.min_steps_per_epoch)
    chosen, rule = choose_batch_size(points, cfg.sweep_tolerance, cfg.memory_budget_mb,
                                     max_batch)
    logger.info("chosen batch size: %s", rule)
    plot = plot_sweep(points, chosen, out_dir / "batch_size_sweep.png")
    return BatchSweepResult(points=points, chosen_batch_size=chosen, rule=rule, plot_path=plot)
