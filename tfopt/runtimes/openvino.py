"""OpenVINO: the serving SavedModel as an OpenVINO model, in f32, bf16 and NNCF's int8.

``<source>-openvino`` is OpenVINO's conversion of the serving SavedModel (``ov.convert_model``,
weights kept in fp32) run with an explicit f32 inference precision; ``<source>-openvino-bfloat16``
is the same files run with the CPU plugin's default precision where that is bf16 (CPUs with
AVX512-BF16 or AMX: OpenVINO computes in bf16 unless told otherwise), skipped where the CPU has
no bf16; ``<source>-openvino-int8`` is NNCF's post-training quantization of the float model
calibrated on the same training images as TFLite's int8, and, when it misses the accuracy
budget on the validation split, NNCF's accuracy-controlled quantization, which puts the layers
that cost most accuracy back in float (as `tfopt.runtimes._litert_selective` does for TFLite).

The runner compiles for the latency hint with one stream and ``benchmark.threads`` inference
threads on a static batch-1 shape (as OpenVINO's benchmark_app fixes the shape), so one request
is what a serving loop sends; other batch sizes go to a dynamic-batch compilation. Per-op times
come from the plugin's profiling counters (``PERF_COUNT``), FLOPs from the model's graph.
"""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from tfopt.artifacts import DatasetArtifact, OpProfile, VariantResult, VariantSpec
from tfopt.config import EvalConfig, InputScale
from tfopt.cpu_features import bf16_unavailable_reason, cpu_flags
from tfopt.fileio import atomic_write_text, replace_dir, staging_dir_for
from tfopt.logs import step_logger
from tfopt.measurement.profiles import PROFILED_CALLS, WARMUP_CALLS, top_ops
from tfopt.packaging import mlflow_signature, named_example, named_signature, pinned
from tfopt.runtimes.base import (
    BuildSources,
    PlanRequest,
    Runner,
    Runtime,
    RuntimeSection,
    ServingContract,
    TensorInfo,
    batch_one,
)
from tfopt.serving import INPUT_NAME, OUTPUT_LOGITS, write_labels
from tfopt.variants import built, skipped

# OpenVINO's converter and NNCF send usage telemetry unless the user opted out; the sender forks
# the process from a thread, which deadlocked a multi-threaded `tfopt run` at exit (and there is
# no network here). Without the telemetry package both fall back to their own no-op stubs.
sys.modules.setdefault("openvino_telemetry", None)

OpenVINOPrecision = Literal["fp32", "bfloat16", "int8"]
MODEL_XML = "model.xml"
PROFILE_METHOD = "OpenVINO CPU plugin's profiling counters (PERF_COUNT): time per call"
_PYFUNC = Path(__file__).with_name("_openvino_pyfunc.py")
_INFERENCE_PRECISION = {"fp32": "f32", "bfloat16": "bf16", "int8": None}
"""The inference precision hint each variant runs with (None: the plugin's default, which for
an int8 model keeps the float layers in its default float precision)."""
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


class OpenVINOSettings(RuntimeSection):
    """Which OpenVINO forms of each model to build and measure."""

    precisions: list[OpenVINOPrecision] = Field(
        default_factory=lambda: ["fp32", "bfloat16", "int8"],
        description=(
            "OpenVINO forms of the baseline: fp32 (the converted model, f32 inference "
            "precision), bfloat16 (the same files at the CPU's default precision where that is "
            "bf16; skipped on CPUs without bf16), int8 (NNCF post-training quantization, "
            "calibrated on convert.calibration_examples training images). Empty: no OpenVINO."
        ),
    )
    compressed: list[OpenVINOPrecision] = Field(
        default_factory=list,
        description=("OpenVINO forms of every compressed model (pruned, distilled, QAT ...), "
                     "each derived from the baseline's same form; the demo asks for int8."),
    )
    accuracy_control: bool = Field(
        True,
        description=(
            "When int8 loses more than benchmark.accuracy_budget_points on the validation "
            "split, rerun NNCF with accuracy control (quantize_with_accuracy_control), which "
            "keeps the layers that cost most accuracy in float."
        ),
    )


def openvino_unavailable_reason(devices: Sequence[str] | None = None) -> str | None:
    """Why OpenVINO cannot run on this machine's CPU, or None when it can.

    Args:
        devices: The devices OpenVINO lists (default: ask it).
    """
    try:
        if devices is None:
            devices = available_devices()
    except Exception as error:  # an import or plugin failure is the reason itself
        return f"OpenVINO does not load here: {type(error).__name__}: {error}"
    if "CPU" not in devices:
        return (f"OpenVINO's CPU plugin does not support this CPU (devices found: "
                f"{', '.join(devices) or 'none'}; it needs x86-64 with SSE4.2 or ARM64)")
    return None


@cache
def available_devices() -> tuple[str, ...]:
    """The devices OpenVINO's plugins find on this machine (``CPU`` where it supports it)."""
    import openvino as ov

    return tuple(ov.Core().available_devices)


def compile_config(threads: int, precision_hint: str | None, profile: bool = False,
                   ) -> dict[str, Any]:
    """The CPU plugin's settings for batch-1 latency: one stream, `threads` threads, pinned."""
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                              "INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": True}
    if precision_hint is not None:
        config["INFERENCE_PRECISION_HINT"] = precision_hint
    if profile:
        config["PERF_COUNT"] = True
    return config


def _info(port: Any) -> TensorInfo:
    shape = tuple(None if dim.is_dynamic else dim.get_length() for dim in port.get_partial_shape())
    return TensorInfo(port.get_any_name(), shape, port.get_element_type().to_dtype().name)


def batch_one_model(model: Any) -> Any:
    """A copy of `model` with every input's dynamic batch fixed to 1 (others kept)."""
    static = model.clone()
    shapes = {}
    for port in static.inputs:
        shape = port.get_partial_shape()
        if shape.rank.is_static and shape.rank.get_length() > 0 and shape[0].is_dynamic:
            shape[0] = 1
            shapes[port] = shape
    if shapes:
        static.reshape(shapes)
    return static


class OpenVINORunner(Runner):
    """An OpenVINO model compiled for the CPU plugin, one synchronous infer request.

    Attributes:
        inference_precision: The precision the plugin computes float layers in (``f32`` or
            ``bf16``), as the compiled model reports it.
    """

    def __init__(self, model_xml: Path, threads: int = 1, precision_hint: str | None = "f32",
                 ) -> None:
        import openvino as ov

        self.path = model_xml
        self.threads = threads
        self.precision_hint = precision_hint
        self._core = ov.Core()
        self.model = self._core.read_model(str(model_xml))
        self.inputs = tuple(_info(port) for port in self.model.inputs)
        self.outputs = tuple(_info(port) for port in self.model.outputs)
        self.compiled = self._core.compile_model(
            batch_one_model(self.model), "CPU", compile_config(threads, precision_hint))
        self.request = self.compiled.create_infer_request()
        self.inference_precision = self.compiled.get_property(
            "INFERENCE_PRECISION_HINT").to_string()
        self._any_batch: Any = None
        self._positions = {info.name: index for index, info in enumerate(self.inputs)}
        names = [info.name for info in self.outputs]
        self._fetch = [names.index(name) for name in self.fetched]

    def _any_batch_request(self) -> Any:
        if self._any_batch is None:
            compiled = self._core.compile_model(
                self.model, "CPU", compile_config(self.threads, self.precision_hint))
            self._any_batch = compiled.create_infer_request()
        return self._any_batch

    def _by_position(self, feeds: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
        return {self._positions[name]: np.ascontiguousarray(values, dtype=info.dtype)
                for name, values in feeds.items()
                for info in (self.inputs[self._positions[name]],)}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Any batch size, on the dynamic-batch compilation; every output, copied."""
        batch = len(next(iter(feeds.values())))
        request = self.request if batch == 1 else self._any_batch_request()
        results = request.infer(self._by_position(feeds))
        return {info.name: np.array(results[index])
                for index, info in enumerate(self.outputs)}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """Batch-1 inputs as OpenVINO tensors sharing the arrays' memory, by input position."""
        import openvino as ov

        return [[(index, ov.Tensor(values, shared_memory=True))
                 for index, values in self._by_position(feed).items()]
                for feed in batch_one(feeds)]

    def invoke(self, prepared: object) -> object:
        """Hand the input tensors to the request, infer, read the fetched outputs in place.

        ``set_input_tensor`` + ``infer()`` + ``get_output_tensor`` costs less per call than
        ``infer(inputs)``, whose Python wrapper dispatches the inputs and builds a dictionary of
        every output at each call.
        """
        request = self.request
        for index, tensor in prepared:
            request.set_input_tensor(index, tensor)
        request.infer()
        if len(self._fetch) == 1:
            return request.get_output_tensor(self._fetch[0]).data
        return [request.get_output_tensor(index).data for index in self._fetch]

    def facts(self) -> dict[str, str]:
        """The inference precision in force (f32, or bf16 on a CPU that has it)."""
        return {"inference_precision": self.inference_precision}


class OpenVINOThroughputRunner(Runner):
    """The model compiled for the throughput hint: several streams, asynchronous requests.

    A batch is split into batch-1 requests handed to an ``AsyncInferQueue`` as large as the
    plugin's optimal number of requests, so its streams work on them at once (what OpenVINO
    recommends for Offline-style work instead of one large synchronous batch).
    """

    def __init__(self, model_xml: Path, threads: int = 1, precision_hint: str | None = "f32",
                 ) -> None:
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(model_xml))
        self.inputs = tuple(_info(port) for port in model.inputs)
        self.outputs = tuple(_info(port) for port in model.outputs)
        config: dict[str, Any] = {"PERFORMANCE_HINT": "THROUGHPUT",
                                  "INFERENCE_NUM_THREADS": threads}
        if precision_hint is not None:
            config["INFERENCE_PRECISION_HINT"] = precision_hint
        self.compiled = core.compile_model(batch_one_model(model), "CPU", config)
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))
        self._queue = ov.AsyncInferQueue(
            self.compiled, int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self._positions = {info.name: index for index, info in enumerate(self.inputs)}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every example as its own asynchronous request; outputs gathered in order."""
        answers: dict[int, list[np.ndarray]] = {}

        def gather(request: Any, index: int) -> None:
            answers[index] = [np.array(request.get_output_tensor(i).data)
                              for i in range(len(self.outputs))]

        self._queue.set_callback(gather)
        examples = batch_one(feeds)
        for index, feed in enumerate(examples):
            self._queue.start_async({self._positions[name]: values
                                     for name, values in feed.items()}, index)
        self._queue.wait_all()
        return {info.name: np.concatenate([answers[i][position] for i in range(len(examples))])
                for position, info in enumerate(self.outputs)}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        return batch_one(feeds)

    def invoke(self, prepared: object) -> object:
        """One example through the queue, waited for."""
        return self._run(prepared)[self.fetched[0]]

    def facts(self) -> dict[str, str]:
        """The streams the throughput hint chose."""
        return {"offline_streams": str(self.streams)}


def convert_savedmodel(savedmodel: Path, out_dir: Path, name: str) -> Path:
    """Convert a serving SavedModel with OpenVINO; write ``<name>.openvino/model.{xml,bin}``.

    Weights stay fp32 (``ov.save_model`` halves them to fp16 unless told not to).

    Returns:
        The model's ``.xml`` file.
    """
    import openvino as ov

    model = ov.convert_model(str(savedmodel))
    return save_model(model, out_dir / f"{name}.openvino")


def save_model(model: Any, folder: Path) -> Path:
    """Write an OpenVINO model into `folder` (replaced atomically); return its ``.xml``."""
    import openvino as ov

    staging = staging_dir_for(folder)
    staging.mkdir(parents=True)
    ov.save_model(model, str(staging / MODEL_XML), compress_to_fp16=False)
    replace_dir(staging, folder)
    return folder / MODEL_XML


def model_xml(path: Path) -> Path:
    """The ``.xml`` of an OpenVINO model given as its folder or as the file itself."""
    return path if path.suffix == ".xml" else path / MODEL_XML


def has_fake_quantize(model: Any) -> bool:
    """Whether a model carries its own quantization (a QAT model's FakeQuantize ops)."""
    return any(op.get_type_name() == "FakeQuantize" for op in model.get_ordered_ops())


def _accuracy(compiled: Any, images: np.ndarray, labels: np.ndarray) -> float:
    request = compiled.create_infer_request()
    logits_port = next((i for i, port in enumerate(compiled.outputs)
                        if OUTPUT_LOGITS in port.get_names()), 0)
    correct = 0
    for start in range(0, len(images), 64):
        scores = request.infer({0: images[start : start + 64]})[logits_port]
        correct += int(np.sum(np.argmax(scores, axis=1) == labels[start : start + 64]))
    return correct / max(len(images), 1)


def _metric_controlled(model: Any, quantized: Any, calibration: Any, subset_size: int,
                       dataset: DatasetArtifact, budget: Any, output: str | None,
                       how: dict[str, str | int | float | bool]) -> Any:
    """An array model's int8, brought back within `budget` of the float model's metric.

    Both are scored by the run's metric on the validation split's arrays against their ``y``,
    or for a fidelity metric against the float model's own outputs; when int8 gives up more
    than the budget allows, NNCF's accuracy control reverts the layers that cost most to float
    (it maximises: a lower-is-better metric is handed over negated). `how` records the
    figures. Unchanged without a validation split (with ``y`` where the metric needs it).
    """
    import nncf
    import openvino as ov

    from tfopt.data.arrays import TRUTH, feeds_for, load_split_feeds

    if not dataset.examples("val") or (budget.metric.needs_labels
                                       and TRUTH not in dataset.arrays):
        return quantized
    arrays = load_split_feeds(dataset, "val")
    names = [port.get_any_name() for port in model.inputs]
    feeds = feeds_for(names, arrays)
    rows = [{name: values[row : row + 1] for name, values in feeds.items()}
            for row in range(len(next(iter(feeds.values()))))]
    sign = 1.0 if budget.metric.higher_is_better else -1.0
    core, config = ov.Core(), compile_config(1, "f32")
    float_model = core.compile_model(model, "CPU", config)

    def outputs_of(compiled: Any, chosen: list[dict[str, np.ndarray]]) -> np.ndarray:
        port = compiled.output(output) if output else compiled.outputs[0]
        return np.concatenate([compiled(feed)[port] for feed in chosen])

    truth = arrays[TRUTH] if budget.metric.needs_labels else outputs_of(float_model, rows)
    items = list(zip(rows, truth, strict=True))

    def validate(compiled: Any, chosen: Any) -> float:
        pairs = list(chosen)
        return sign * budget.metric.score(np.stack([row for _, row in pairs]),
                                          outputs_of(compiled, [feed for feed, _ in pairs]))

    float_value = sign * validate(float_model, items)
    int8_value = sign * validate(core.compile_model(quantized, "CPU", config), items)
    how.update({f"val_{budget.metric.name}_float": float_value,
                f"val_{budget.metric.name}_int8": int8_value})
    if budget.within(int8_value, float_value):
        return quantized
    step_logger().info("OpenVINO int8 gives up more than %s on validation (%s: float %.4g, int8 "
                       "%.4g): accuracy-controlled quantization", budget.described(),
                       budget.metric.name, float_value, int8_value)
    controlled = nncf.quantize_with_accuracy_control(
        model, calibration, nncf.Dataset(items), validation_fn=validate,
        max_drop=budget.allowance(float_value), drop_type=nncf.DropType.ABSOLUTE,
        subset_size=subset_size)
    how.update({"quantizer": "nncf.quantize_with_accuracy_control",
                "accuracy_controlled": True,
                f"val_{budget.metric.name}_int8": sign * validate(
                    core.compile_model(controlled, "CPU", config), items)})
    return controlled


def quantize_int8(float_xml: Path, dataset: DatasetArtifact, calibration_examples: int,
                  budget_points: float, accuracy_control: bool, scale: InputScale,
                  folder: Path, judged_by: EvalConfig | None = None,
                  ) -> tuple[Path, dict[str, str | int | float | bool]]:
    """NNCF's int8 of a float OpenVINO model; accuracy-controlled when it misses the budget.

    Both the float and the int8 model are scored on the validation split (f32 inference
    precision, so bf16 rounding does not count against int8). When int8 loses more than
    `budget_points`, `nncf.quantize_with_accuracy_control` reverts the layers that cost most
    back to float until the drop is within the budget. An array data set's int8 is judged by the
    run's metric instead (`judged_by`, `_metric_controlled`).

    Returns:
        The int8 model's ``.xml`` and how it was made.
    """
    import nncf
    import openvino as ov

    from tfopt.data.pipeline import load_split
    from tfopt.runtimes._litert_files import representative_inputs

    core = ov.Core()
    model = core.read_model(str(float_xml))
    if has_fake_quantize(model):
        return save_model(model, folder), {
            "quantizer": "the model's own FakeQuantize ops (quantization-aware training)"}
    examples = [one[0] if isinstance(one, list) else one
                for one in representative_inputs(dataset, calibration_examples, scale)]
    calibration = nncf.Dataset(examples)
    quantized = nncf.quantize(model, calibration, subset_size=len(examples))
    how: dict[str, str | int | float | bool] = {
        "quantizer": "nncf.quantize", "calibration_examples": len(examples),
        "accuracy_controlled": False}
    if dataset.arrays:
        judged_by = judged_by or EvalConfig()
        return save_model(_metric_controlled(
            model, quantized, calibration, len(examples), dataset,
            judged_by.metric_budget(budget_points, class_scores=False), judged_by.output, how)
            if accuracy_control else quantized, folder), how
    val_images, val_labels = load_split(dataset, "val", None, scale)
    config = compile_config(1, "f32")
    float_accuracy = _accuracy(core.compile_model(model, "CPU", config), val_images, val_labels)
    int8_accuracy = _accuracy(core.compile_model(quantized, "CPU", config), val_images,
                              val_labels)
    how.update(val_accuracy_float=float_accuracy, val_accuracy_int8=int8_accuracy)
    drop_points = (float_accuracy - int8_accuracy) * 100.0
    if drop_points > budget_points and accuracy_control and len(val_images):
        step_logger().info("OpenVINO int8 loses %.2f points on validation (budget %.2f): "
                           "accuracy-controlled quantization", drop_points, budget_points)
        validation = nncf.Dataset(list(zip(val_images, val_labels, strict=True)))

        def validate(compiled: Any, items: Any) -> float:
            pairs = list(items)
            return _accuracy(compiled, np.stack([image for image, _ in pairs]),
                             np.asarray([label for _, label in pairs]))

        quantized = nncf.quantize_with_accuracy_control(
            model, calibration, validation, validation_fn=validate,
            max_drop=budget_points / 100.0, drop_type=nncf.DropType.ABSOLUTE,
            subset_size=len(examples))
        how.update(quantizer="nncf.quantize_with_accuracy_control", accuracy_controlled=True,
                   val_accuracy_int8=_accuracy(core.compile_model(quantized, "CPU", config),
                                               val_images, val_labels))
    return save_model(quantized, folder), how


def openvino_flops(model: Any) -> float:
    """FLOPs per example of an OpenVINO model's convolutions and matrix products (batch 1)."""
    total = 0.0
    for op in batch_one_model(model).get_ordered_ops():
        kind = op.get_type_name()
        if kind not in ("Convolution", "GroupConvolution", "MatMul"):
            continue
        weights = op.input(1).get_partial_shape()
        output = op.get_output_partial_shape(0)
        if weights.is_dynamic or output.is_dynamic:
            continue
        weights_dims = [dim.get_length() for dim in weights]
        out_elements = float(np.prod([dim.get_length() for dim in output]))
        if kind == "Convolution":  # weights [out, in, kh, kw]
            total += 2.0 * float(np.prod(weights_dims[1:])) * out_elements
        elif kind == "GroupConvolution":  # weights [groups, out / g, in / g, kh, kw]
            total += 2.0 * float(np.prod(weights_dims[2:])) * out_elements
        else:
            data = op.input(0).get_partial_shape()
            transposed = bool(op.get_attributes().get("transpose_a"))
            inner = data[-2] if transposed else data[-1]
            if inner.is_static:
                total += 2.0 * float(inner.get_length()) * out_elements
    return total


def openvino_op_profile(runner: OpenVINORunner, prepared: Sequence[object]) -> OpProfile:
    """`PROFILED_CALLS` calls on a profiling compilation of its own; nodes ranked by time.

    Each node is named with its kernel (``Convolution (brgconv_avx512_bf16)``), which tells
    the precision each layer actually ran in.
    """
    compiled = runner._core.compile_model(
        batch_one_model(runner.model), "CPU",
        compile_config(runner.threads, runner.precision_hint, profile=True))
    request = compiled.create_infer_request()
    totals: Counter[tuple[str, str]] = Counter()
    for index in range(WARMUP_CALLS + PROFILED_CALLS):
        for position, tensor in prepared[index % len(prepared)]:
            request.set_input_tensor(position, tensor)
        request.infer()
        if index < WARMUP_CALLS:
            continue
        for counter in request.get_profiling_info():
            if counter.real_time.total_seconds() > 0:
                kind = f"{counter.node_type} ({counter.exec_type})"
                totals[(counter.node_name, kind)] += counter.real_time.total_seconds() * 1000.0
    return OpProfile(method=PROFILE_METHOD, calls=PROFILED_CALLS,
                     ops=top_ops(totals, PROFILED_CALLS, timed=True))


def floor_model(input_shape: tuple[int, ...]) -> Any:
    """An OpenVINO model slicing the first pixel out of NHWC images (the harness floor)."""
    import openvino as ov
    import openvino.opset13 as ops

    side, channels = input_shape[0], input_shape[-1]
    images = ops.parameter([-1, side, side, channels], np.float32, name=INPUT_NAME)
    pixel = ops.slice(images, np.array([0, 0]), np.array([1, 1]), np.array([1, 1]),
                      np.array([1, 2]))
    logits = ops.reshape(pixel, np.array([-1, channels]), special_zero=False)
    logits.output(0).set_names({OUTPUT_LOGITS})
    return ov.Model([logits], [images], "harness_floor")


def bundle_readme(image_size: int, files: Sequence[str]) -> str:
    """How to run the bundle's models with OpenVINO's own tool."""
    lines = ["# OpenVINO models of this run", "",
             "Each folder holds an OpenVINO model (model.xml + model.bin). Time one on this "
             "machine with OpenVINO's own tool, batch 1:", ""]
    lines += [f"    benchmark_app -m {name}/{MODEL_XML} -d CPU -hint latency "
              f"-shape [1,{image_size},{image_size},3]" for name in files]
    return "\n".join(lines) + "\n"


_SLOWER = {
    "fp32": "OpenVINO's f32 kernels are slower than its bf16 default on this CPU, or than "
            "TensorFlow's for this graph",
    "bfloat16": "bf16 halves the memory traffic but converts at every layer boundary: on a "
                "small network the reorders cost what the faster kernels save",
}


class OpenVINO(Runtime):
    """OpenVINO's CPU plugin on models converted from the serving SavedModel."""

    name = "openvino"
    formats = frozenset({"openvino"})
    section = OpenVINOSettings
    order = 35
    shares_process = True
    exports = True

    def compressed_forms(self, settings: OpenVINOSettings,
                         compress: Any) -> dict[str, tuple[str, ...]]:
        """``runtimes.openvino.compressed``: OpenVINO forms of every technique's model."""
        return {"openvino": tuple(settings.compressed)}

    def plan(self, request: PlanRequest, settings: OpenVINOSettings) -> list[VariantSpec]:
        """fp32, bf16 and int8 forms of a SavedModel (skipped where OpenVINO cannot run)."""
        source = request.source
        if request.compressed:
            precisions = list((request.asked or {}).get("openvino", ()))
            planned = [self.variant(source, "openvino", p,
                                    derived_from=self.variant_name(request.start, "openvino", p))
                       for p in precisions]
        elif request.kind not in ("keras", "savedmodel"):
            return [skipped(self.variant(source, "openvino"),
                            f"model.path is a .{request.kind} file: it is benchmarked as it is")]
        else:
            fp32 = self.variant_name(source, "openvino", "fp32")
            planned = [self.variant(source, "openvino", p,
                                    derived_from=(self.variant(source, "savedmodel").name
                                                  if p == "fp32" else fp32))
                       for p in settings.precisions]
        why_not = openvino_unavailable_reason()
        if why_not is not None:
            return [skipped(spec, why_not) for spec in planned]
        no_bf16 = bf16_unavailable_reason()
        return [skipped(spec, f"{no_bf16}; OpenVINO's default precision here is f32, which "
                              f"{self.variant_name(source, 'openvino', 'fp32')} measures")
                if spec.precision == "bfloat16" and no_bf16 else spec for spec in planned]

    def builds_from(self, spec: VariantSpec) -> str | None:
        """bf16 runs the fp32 files; int8 quantizes them."""
        if spec.precision == "fp32":
            return None
        return self.variant_name(spec.source, "openvino", "fp32")

    def build(self, spec: VariantSpec, sources: BuildSources,
              settings: OpenVINOSettings) -> VariantSpec:
        """Convert the serving SavedModel (once per model), then quantize with NNCF for int8.

        A model OpenVINO cannot convert gives a skipped variant with its reason.
        """
        if sources.savedmodel is None:
            raise ValueError(f"{sources.model.name} has no SavedModel to convert")
        float_xml = self._float_model(spec, sources)
        if isinstance(float_xml, str):
            return skipped(spec, float_xml)
        write_labels(float_xml.parent, sources.dataset.class_names)
        if spec.precision == "fp32":
            return built(spec, float_xml.parent, converter="openvino.convert_model",
                         openvino=_version())
        if spec.precision == "bfloat16":
            return built(spec, float_xml.parent, converter="openvino.convert_model",
                         openvino=_version())
        folder = sources.out_dir / f"{spec.name}.openvino"
        _, how = quantize_int8(float_xml, sources.dataset, sources.calibration_examples,
                               sources.accuracy_budget_points, settings.accuracy_control,
                               sources.savedmodel.input_scale, folder, sources.judged_by)
        write_labels(folder, sources.dataset.class_names)
        return built(spec, folder, openvino=_version(), **how)

    def _float_model(self, spec: VariantSpec, sources: BuildSources) -> Path | str:
        """The float model's ``.xml`` (built already, or converted now), or why it cannot be."""
        fp32 = sources.built.get(self.variant_name(spec.source, "openvino", "fp32"))
        if spec.precision != "fp32" and fp32 is not None and fp32.status == "ok" and fp32.path:
            return Path(fp32.path) / MODEL_XML
        try:
            return convert_savedmodel(sources.savedmodel.path, sources.out_dir,
                                      self.variant_name(spec.source, "openvino", "fp32"))
        except Exception as error:  # OpenVINO's frontends raise their own types
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return f"OpenVINO cannot convert this model: {type(error).__name__}: {first[:300]}"

    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        """The model compiled for latency with `threads` threads and its precision's hint."""
        return OpenVINORunner(model_xml(Path(spec.path)), threads,
                              _INFERENCE_PRECISION.get(spec.precision, "f32"))

    def offline_runner(self, spec: VariantSpec, threads: int = 1) -> Runner | None:
        """The throughput hint's streams fed by asynchronous requests."""
        return OpenVINOThroughputRunner(model_xml(Path(spec.path)), threads,
                                        _INFERENCE_PRECISION.get(spec.precision, "f32"))

    def flops(self, runner: Runner) -> float | None:
        """FLOPs of the graph's convolutions and matrix products."""
        return openvino_flops(runner.model)

    def op_profile(self, runner: Runner, prepared: Sequence[object],
                   threads: int) -> OpProfile | None:
        """The CPU plugin's own profiling counters."""
        return openvino_op_profile(runner, prepared)

    def floor_models(self, input_shape: tuple[int, ...], out_dir: Path) -> dict[str, Path]:
        """``floor.openvino/``: a Slice and a Reshape."""
        folder = out_dir / "floor.openvino"
        if openvino_unavailable_reason() is None and not (folder / MODEL_XML).exists():
            save_model(floor_model(input_shape), folder)
        return {"openvino": folder} if (folder / MODEL_XML).exists() else {}

    def package(self, spec: VariantSpec, contract: ServingContract, metadata: dict,
                dst: Path) -> str:
        """A pyfunc model serving the IR files with OpenVINO (no TensorFlow needed)."""
        import mlflow.pyfunc

        folder = Path(spec.path)
        runner = OpenVINORunner(model_xml(folder))
        if contract.named:
            example, signature = named_example(contract.example, runner), named_signature(runner)
        else:
            example = contract.example.astype(np.float32)
            signature = mlflow_signature(example, {
                info.name: int(info.shape[-1] or 0) for info in runner.outputs
                if info.name == runner.scores_output})
        mlflow.pyfunc.save_model(
            str(dst), python_model=str(_PYFUNC), artifacts={"model": str(folder)},
            model_config={"output": runner.scores_output,
                          "precision_hint": _INFERENCE_PRECISION.get(spec.precision) or ""},
            signature=signature, input_example=example,
            metadata=metadata, pip_requirements=pinned("openvino", "numpy"),
        )
        return f"artifacts/{folder.name}"

    def export(self, sources: BuildSources, settings: OpenVINOSettings,
               out_dir: Path) -> Path | None:
        """``<name>-openvino-bundle/``: every built OpenVINO model and benchmark_app lines."""
        models = {name: spec for name, spec in sources.built.items()
                  if spec.format == "openvino" and spec.status == "ok" and spec.path
                  and spec.precision != "bfloat16"}
        if not models:
            return None
        final = out_dir / f"{sources.model.name}-openvino-bundle"
        staging = staging_dir_for(final)
        staging.mkdir(parents=True)
        for name, spec in models.items():
            shutil.copytree(spec.path, staging / name)
        write_labels(staging, sources.dataset.class_names)
        atomic_write_text(staging / "README.md",
                          bundle_readme(sources.dataset.image_size, sorted(models)))
        replace_dir(staging, final)
        return final

    def slowdown_reason(self, result: VariantResult) -> str | None:
        """Why OpenVINO's forms can be slower than what they derive from on this CPU."""
        if result.precision == "int8" and not any(f in cpu_flags() for f in _VNNI_FLAGS):
            return ("this CPU has no VNNI (AVX512-VNNI, AVX-VNNI or AMX-INT8): OpenVINO's int8 "
                    "convolutions emulate the dot products and gain little over float")
        if result.precision == "int8":
            return ("the quantize/dequantize steps around the layers kept in float (and a "
                    "bf16 float path it competes with) cost what int8 saves on this model")
        return _SLOWER.get(result.precision)


def _version() -> str:
    import openvino as ov

    return ov.get_version().split("-")[0]


RUNTIME = OpenVINO()
