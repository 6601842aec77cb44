"""Accuracy-driven selective int8: keep the layers that quantize worst in float until in budget.

When full-integer int8 loses more than the accuracy budget on the validation split, LiteRT's
``QuantizationDebugger`` measures every quantized layer, the layers are ranked, and the worst
ones are kept in float (``denylisted_nodes``) one at a time until the model is within budget.
Each step's validation accuracy and batch-1 latency are recorded, so the report says what each
float layer bought and cost.

The ranking: a layer whose output range is set by a few outlier channels quantizes the others
below one step and destroys them, the classic int8 failure. The debugger's own statistics
compare each quantized op with a float op fed the *same quantized inputs*, so an error made
upstream shows again in every layer after it. The first key is therefore the layer's own
grid against its true float values: the share of its channels whose root-mean-square, in the
float model on the debug images, is below one quantization step. Ties (layers that crush
nothing) are broken by the debugger's per-layer error: the mean over channels of the error's
RMS relative to the float value's RMS.

When full int8 is within the budget already, one float layer may still pay for speed: the first
convolution sees the image's few input channels at full resolution, where some CPUs' int8
kernels are slower than their float ones (docs/measurements.md). That file is built when a quick
timing, alternating with full int8's, finds it `STEM_GAIN` faster and within the budget; the
benchmark then measures it beside every other variant like any.
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfopt.artifacts import ModelArtifact, Runoff, VariantSpec
from tfopt.data.pipeline import load_split
from tfopt.fileio import atomic_write_bytes
from tfopt.logs import step_logger
from tfopt.runtimes._litert_files import (
    STEM_GAIN,
    TFLiteRunner,
    representative_inputs,
    serving_converter,
)
from tfopt.runtimes.base import BuildSources
from tfopt.variants import QUICK_SPEEDUP, built, failed, skipped

DEBUG_EXAMPLES = 64
_STEM_ROUNDS = 5
_TIMED_RUNS = 300
_MIN_TIMED_RUNS = 20
_WARMUP_RUNS = 50
_QUICK_S = 1.0
_LIVE = 1e-6


class NoQuantizableLayerError(ValueError):
    """The debugger found no quantized layer to rank."""


@dataclass(frozen=True)
class LayerError:
    """One quantized layer's ranking keys."""

    tensor: str
    op: str
    below_step: float
    channel_error: float


@dataclass(frozen=True)
class Step:
    """The model after keeping one more layer in float."""

    float_layer: str
    val_accuracy: float
    p50_ms: float


def channel_error(float_values: np.ndarray, quantized: np.ndarray, scale: float,
                  zero_point: int) -> float:
    """Mean over channels of RMS(quantized - float) / RMS(float), dead channels left out.

    A ``layer_direct_compare_metrics`` function of the debugger (channels on the last axis).
    """
    values = np.asarray(float_values, np.float32)
    values = values.reshape(-1, values.shape[-1]) if values.ndim else values.reshape(1, 1)
    restored = (np.asarray(quantized, np.float32).reshape(values.shape) - zero_point) * scale
    signal = np.sqrt(np.mean(values**2, axis=0))
    noise = np.sqrt(np.mean((restored - values) ** 2, axis=0))
    live = signal > _LIVE
    return float(np.mean(noise[live] / signal[live])) if live.any() else 0.0


def float_channel_rms(float_model: bytes, images: np.ndarray) -> dict[str, np.ndarray]:
    """Per tensor of the float TFLite model, the RMS of each channel over `images`."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=float_model, experimental_preserve_all_tensors=True)
    interpreter.allocate_tensors()
    image_input = interpreter.get_input_details()[0]
    tensors = [(t["name"], t["index"]) for t in interpreter.get_tensor_details()
               if np.dtype(t["dtype"]) == np.float32 and len(t["shape"]) >= 2]
    squares: dict[str, list[np.ndarray]] = {}
    for image in images:
        interpreter.set_tensor(image_input["index"], image[np.newaxis])
        interpreter.invoke()
        for name, index in tensors:
            try:
                value = interpreter.get_tensor(index)
            except ValueError:  # a constant or a tensor the runtime did not keep
                continue
            flat = value.reshape(-1, value.shape[-1])
            squares.setdefault(name, []).append(np.mean(flat**2, axis=0))
    return {name: np.sqrt(np.mean(rows, axis=0)) for name, rows in squares.items()}


def share_below_step(rms: np.ndarray | None, scale: float) -> float:
    """The share of live channels whose float RMS is below one quantization step."""
    if rms is None:
        return 0.0
    live = rms > _LIVE
    return float(np.mean(rms[live] < scale)) if live.any() else 0.0


def rank_layers(statistics_csv: str, rms: dict[str, np.ndarray]) -> list[LayerError]:
    """The debugger's layers, worst first (see the module docstring).

    Args:
        statistics_csv: ``QuantizationDebugger.layer_statistics_dump`` output, with a
            ``channel_error`` column.
        rms: `float_channel_rms` of the float model.

    Raises:
        NoQuantizableLayerError: The dump lists no layer.
    """
    layers = [
        LayerError(tensor=row["tensor_name"], op=row["op_name"],
                   below_step=share_below_step(rms.get(row["tensor_name"]), float(row["scale"])),
                   channel_error=float(row["channel_error"]))
        for row in csv.DictReader(io.StringIO(statistics_csv))
    ]
    if not layers:
        raise NoQuantizableLayerError("the model has no quantizable layer: int8 changes nothing")
    return sorted(layers, key=lambda layer: (-layer.below_step, -layer.channel_error))


def _accuracy_and_p50(content: bytes, images: np.ndarray, labels: np.ndarray, threads: int,
                      scratch: Path, timed: bool = True) -> tuple[float, float]:
    """Accuracy on `images` and a quick batch-1 p50 (bare invoke loop; NaN untimed) of a file."""
    atomic_write_bytes(scratch, content)
    try:
        runner = TFLiteRunner(scratch, threads)
        accuracy = float(np.mean(np.argmax(runner.predict(images), 1) == labels))
        p50 = _quick_p50(runner, images[:1]) if timed else float("nan")
    finally:
        scratch.unlink(missing_ok=True)
    return accuracy, p50


def _quick_p50(runner: TFLiteRunner, image: np.ndarray) -> float:
    """The median ms of `_TIMED_RUNS` bare invokes on one image, after `_WARMUP_RUNS`.

    A large model's runs stop after `_QUICK_S` seconds each (at least `_MIN_TIMED_RUNS`
    timed): a quick figure, not the benchmark's.
    """
    prepared = runner.prepare(image)[0]
    deadline = time.perf_counter() + _QUICK_S
    for _ in range(_WARMUP_RUNS):
        runner.invoke(prepared)
        if time.perf_counter() > deadline:
            break
    times: list[float] = []
    deadline = time.perf_counter() + _QUICK_S
    while len(times) < _TIMED_RUNS and (len(times) < _MIN_TIMED_RUNS
                                        or time.perf_counter() < deadline):
        start = time.perf_counter()
        runner.invoke(prepared)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def _ms(p50: float) -> str:
    return "" if math.isnan(p50) else f" ({p50:.3f} ms)"


def first_convolution(float_model: bytes) -> str | None:
    """The output tensor of the graph's first ``CONV_2D`` in execution order (None: none)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=float_model)
    names = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    for op in interpreter._get_ops_details():  # no public API lists the ops
        if op["op_name"] == "CONV_2D":
            return names[op["outputs"][0]]
    return None


def int8_with_float_nodes(savedmodel: ModelArtifact,
                          calibration: Callable[[], Iterator[list[np.ndarray]]],
                          nodes: list[str]) -> bytes:
    """Full int8 with the ops writing `nodes` (tensor names) kept in float.

    Built as ``QuantizationDebugger.get_nondebug_quantized_model`` builds it (a calibrated
    model quantized with a deny list), without opening the debugger's deprecated interpreter.
    """
    from tensorflow.lite.python import convert  # the debugger's own quantizer: no public API

    converter = serving_converter(savedmodel.path)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = calibration
    converter.experimental_mlir_quantizer = True
    converter._experimental_calibrate_only = True  # as the debugger sets it
    return convert.mlir_quantize(
        converter.convert(),
        disable_per_channel=converter._experimental_disable_per_channel,
        denylisted_nodes=list(nodes))


def _alternating_p50s(files: dict[str, bytes], image: np.ndarray, threads: int,
                      scratch: Path) -> Runoff:
    """Each file's quick p50 in each of `_STEM_ROUNDS` rounds, the files alternating.

    Each file is written and loaded once; the rounds alternate which goes first. Read as the
    run-off is (`Runoff.ratio`: paired round by round, so a drift of the machine's speed between
    rounds reaches both files alike).
    """
    paths = {name: scratch.with_name(f"{scratch.name}.{name}") for name in files}
    rounds: dict[str, list[float]] = {name: [] for name in files}
    try:
        for name, content in files.items():
            atomic_write_bytes(paths[name], content)
        runners = {name: TFLiteRunner(path, threads) for name, path in paths.items()}
        for index in range(_STEM_ROUNDS):
            for name in (list(files) if index % 2 == 0 else list(reversed(files))):
                rounds[name].append(_quick_p50(runners[name], image))
    finally:
        for path in paths.values():
            path.unlink(missing_ok=True)
    return Runoff(rounds=_STEM_ROUNDS, round_p50_ms=rounds)


def _full_int8(savedmodel: ModelArtifact,
               calibration: Callable[[], Iterator[list[np.ndarray]]]) -> bytes:
    """The model quantized as the debugger quantizes it, without the debugger (float fallback)."""
    converter = serving_converter(savedmodel.path)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = calibration
    return converter.convert()


def _debugger(savedmodel: ModelArtifact, debug_images: Callable[[], Iterator[list[np.ndarray]]],
              calibration: Callable[[], Iterator[list[np.ndarray]]]
              ) -> tf.lite.experimental.QuantizationDebugger:
    converter = serving_converter(savedmodel.path)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = calibration
    options = tf.lite.experimental.QuantizationDebugOptions(
        layer_direct_compare_metrics={"channel_error": channel_error})
    return tf.lite.experimental.QuantizationDebugger(
        converter=converter, debug_dataset=debug_images, debug_options=options)


def select_int8_layers(savedmodel: ModelArtifact, variant: VariantSpec, sources: BuildSources,
                       max_float_layers: int, float_stem: bool = True,
                       search: bool = True) -> VariantSpec:
    """Int8 with the fewest float layers that keeps validation accuracy within the budget.

    When full int8 is within the budget already (or without `search`, a compressed model's):
    with `float_stem`, full int8 with its first convolution in float when that is faster and
    within the budget (`float_stem_if_faster`); else skipped.

    Args:
        savedmodel: The exported SavedModel (left unchanged).
        variant: The planned selective int8 variant.
        sources: Calibration images (training split), the accuracy check (validation split),
            the accuracy budget against the float model, the threads of each step's quick
            latency figure, and the folder for ``<variant name>.tflite``.
        max_float_layers: The most layers to keep in float.
        float_stem: Try the first convolution in float when full int8 is within budget.
        search: Search the layers to keep in float when full int8 misses the budget.

    Returns:
        The variant built; skipped when full int8 is within budget already (and no faster
        with its first convolution in float) or nothing is quantizable; failed when the most
        float layers allowed do not bring it within budget.
    """
    logger = step_logger()
    dataset, budget_points, threads = (sources.dataset, sources.accuracy_budget_points,
                                       sources.threads)
    out_dir = sources.out_dir
    scale = savedmodel.input_scale
    images, labels = load_split(dataset, "val", None, scale)
    debug_images, _ = load_split(dataset, "train", DEBUG_EXAMPLES, scale)
    scratch = out_dir / f".{variant.name}.step.tflite"
    out_dir.mkdir(parents=True, exist_ok=True)
    float_model = serving_converter(savedmodel.path).convert()
    # Without the search only the float stem's own alternating timing is read.
    float_accuracy, float_p50 = _accuracy_and_p50(float_model, images, labels, threads, scratch,
                                                  timed=search)
    def calibration() -> Iterator[list[np.ndarray]]:
        return representative_inputs(dataset, sources.calibration_examples, scale)

    full_int8 = _full_int8(savedmodel, calibration)
    full_accuracy, full_p50 = _accuracy_and_p50(full_int8, images, labels, threads, scratch,
                                                timed=search)
    loss = (float_accuracy - full_accuracy) * 100.0
    logger.info("val accuracy: float %.4f%s, full int8 %.4f%s: %.2f points lost, budget %.2f",
                float_accuracy, _ms(float_p50), full_accuracy, _ms(full_p50), loss,
                budget_points)
    if loss <= budget_points or not search:
        not_needed = (f"not needed: full int8 loses {loss:.2f} points on the validation split, "
                      f"within the {budget_points} budget" if loss <= budget_points else
                      f"full int8 loses {loss:.2f} points on the validation split, more than "
                      f"the {budget_points} budget (a compressed model's layers are not searched)")
        if not float_stem:
            return skipped(variant, not_needed)
        return float_stem_if_faster(
            savedmodel, variant, calibration,
            StartingFiles(float_model, full_int8, float_accuracy, full_accuracy, float_p50),
            (images, labels), sources, not_needed)
    # Only now: LiteRT's debugger opens the deprecated tf.lite.Interpreter inside LiteRT.
    debugger = _debugger(
        savedmodel, lambda: ([image[np.newaxis]] for image in debug_images), calibration)
    debugger.run()
    dump = io.StringIO()
    debugger.layer_statistics_dump(dump)
    try:
        ranked = rank_layers(dump.getvalue(), float_channel_rms(float_model, debug_images))
    except NoQuantizableLayerError as error:
        return skipped(variant, str(error))
    logger.info("layers by quantization damage: %s", "; ".join(
        f"{layer.tensor} ({layer.op}, {layer.below_step:.0%} channels below a step, "
        f"error {layer.channel_error:.3f})" for layer in ranked[:10]))
    denied: list[str] = []
    steps: list[Step] = []
    content = b""
    for layer in ranked[:max_float_layers]:
        denied.append(layer.tensor)
        debugger.options = tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=list(denied))
        content = debugger.get_nondebug_quantized_model()
        accuracy, p50 = _accuracy_and_p50(content, images, labels, threads, scratch)
        steps.append(Step(layer.tensor, accuracy, p50))
        logger.info("float %s: val accuracy %.4f, p50 %.3f ms", layer.tensor, accuracy, p50)
        if (float_accuracy - accuracy) * 100.0 <= budget_points:
            break
    record = _record(ranked, steps, float_accuracy, full_accuracy, float_p50, full_p50)
    if (float_accuracy - steps[-1].val_accuracy) * 100.0 > budget_points:
        return failed(variant, f"still {(float_accuracy - steps[-1].val_accuracy) * 100:.2f} "
                               f"points below the float model after keeping {len(steps)} "
                               f"layers in float (convert.selective_max_float_layers): "
                               f"{record['steps']}")
    path = out_dir / f"{variant.name}.tflite"
    atomic_write_bytes(path, content)
    return built(variant, path, **record)


class StartingFiles(NamedTuple):
    """The float and full int8 files, and what selective int8 measured of them."""

    model: bytes
    full_int8: bytes
    val_accuracy: float
    full_int8_val_accuracy: float
    p50_ms: float


def float_stem_if_faster(savedmodel: ModelArtifact, variant: VariantSpec,
                         calibration: Callable[[], Iterator[list[np.ndarray]]],
                         measured: StartingFiles, validation: tuple[np.ndarray, np.ndarray],
                         sources: BuildSources, not_needed: str,
                         min_gain: float = STEM_GAIN) -> VariantSpec:
    """Full int8 with its first convolution in float, if faster than full int8 and in budget.

    Both files are timed in alternating quick rounds (`_alternating_p50s`, batch 1, the run's
    threads); the one with the float stem is kept when its p50 is at least `min_gain` lower,
    paired by round (`Runoff.ratio`), and its validation accuracy within the budget of the
    float model's. Else the variant is
    skipped with `not_needed` and the timing that decided it (or the quantizer's refusal: the
    form is an option, never a failure of the run's).
    """
    stem = first_convolution(measured.model)
    if stem is None:
        return skipped(variant, f"{not_needed}; no convolution to keep in float")
    images, labels = validation
    try:
        stem_file = int8_with_float_nodes(savedmodel, calibration, [stem])
    except (ValueError, RuntimeError) as error:  # the quantizer's own refusals
        return skipped(variant, f"{not_needed}; keeping the first convolution ({stem}) in "
                                f"float did not convert: {type(error).__name__}: "
                                f"{str(error)[:300]}")
    scratch = sources.out_dir / f".{variant.name}.step.tflite"
    stem_accuracy, _ = _accuracy_and_p50(stem_file, images, labels, sources.threads, scratch,
                                         timed=False)
    rounds = _alternating_p50s({"full": measured.full_int8, "stem": stem_file},
                               images[:1], sources.threads, scratch)
    p50 = {name: rounds.p50(name) for name in ("full", "stem")}
    speedup = rounds.ratio("full", "stem")
    timing = (f"quick p50 with the first convolution ({stem}) in float {p50['stem']:.3f} ms, "
              f"full int8 {p50['full']:.3f} ms, {speedup:.2f}x paired over {_STEM_ROUNDS} "
              f"alternating rounds")
    step_logger().info("%s; val accuracy %.4f", timing, stem_accuracy)
    loss = (measured.val_accuracy - stem_accuracy) * 100.0
    if speedup * (1.0 - min_gain) < 1.0 or loss > sources.accuracy_budget_points:
        return skipped(variant, f"{not_needed}; {timing}: not {min_gain:.0%} faster"
                       if loss <= sources.accuracy_budget_points else
                       f"{not_needed}; the first convolution in float loses {loss:.2f} points")
    path = sources.out_dir / f"{variant.name}.tflite"
    atomic_write_bytes(path, stem_file)
    return built(variant, path, **{
        "method": "first convolution in float, faster than full int8 in a quick timing",
        "float_layers": stem, "float_layer_count": 1, "ranked_layers": "",
        "float_val_accuracy": round(measured.val_accuracy, 4),
        "full_int8_val_accuracy": round(measured.full_int8_val_accuracy, 4),
        **({} if math.isnan(measured.p50_ms) else
           {"float_p50_ms_quick": round(measured.p50_ms, 4)}),
        "full_int8_p50_ms_quick": round(p50["full"], 4),
        QUICK_SPEEDUP: round(speedup, 3),
        "steps": f"+{stem}: val {stem_accuracy:.4f}, {p50['stem']:.3f} ms"})


def _record(ranked: list[LayerError], steps: list[Step], float_accuracy: float,
            full_accuracy: float, float_p50: float, full_p50: float
            ) -> dict[str, str | int | float | bool]:
    """The selection as variant parameters (flat values, as MLflow takes them)."""
    return {
        "method": "QuantizationDebugger ranking, denylisted_nodes",
        "float_layers": ";".join(step.float_layer for step in steps),
        "float_layer_count": len(steps),
        "ranked_layers": ";".join(layer.tensor for layer in ranked[:10]),
        "float_val_accuracy": round(float_accuracy, 4),
        "full_int8_val_accuracy": round(full_accuracy, 4),
        "float_p50_ms_quick": round(float_p50, 4),
        "full_int8_p50_ms_quick": round(full_p50, 4),
        "steps": " | ".join(f"+{step.float_layer}: val {step.val_accuracy:.4f}, "
                            f"{step.p50_ms:.3f} ms" for step in steps),
    }
