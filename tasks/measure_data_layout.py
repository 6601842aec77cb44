"""Measure NHWC against NCHW training steps on this device."""

from __future__ import annotations

from prefect import task

from tasks.input_pipeline import load_split
from tasks.keras_models import baseline_factory
from tasks.step_timing import tile_batch, time_train_steps
from tfopt.artifacts import DatasetArtifact, LayoutResult
from tfopt.config import ModelConfig
from tfopt.logs import step_logger
from tfopt.provenance import cpu_model


@task(name="measure_data_layout", tags=["input-pipeline"])
def measure_data_layout(
    dataset: DatasetArtifact, model_cfg: ModelConfig, batch_size: int, steps: int
) -> LayoutResult:
    """Time the same network's training step built NHWC and NCHW, on the same batch.

    TensorFlow's default is NHWC; NCHW is what cuDNN prefers on GPUs. On a CPU build NCHW may
    be unsupported for some ops, or slower: the result says which, for this device. A user's
    model (file or builder) has its layout built in: only its own layout is measured, and the
    note says so.

    Args:
        dataset: Real training examples fill the batch.
        model_cfg: The network (its data_format is overridden for each measurement).
        batch_size: Batch size of the measured steps.
        steps: Timed steps per layout.

    Returns:
        Both throughputs (NCHW None when unsupported), the faster layout and a note.
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
