"""ONNX Runtime: the checked ONNX export, and ONNX Runtime's own dynamic and static int8.

``onnx`` is tf2onnx's conversion of the serving SavedModel (opset >= 17, in a separate process),
checked against the SavedModel on real test inputs: a file whose probabilities differ by more
than ``convert.onnx_atol`` fails. ``onnx-dynamic`` (``quantize_dynamic``) and ``onnx-int8``
(``quantize_static``, QDQ, uint8 activations and per-channel int8 weights, calibrated on the same
training images as TFLite's int8) are what a user serving with ONNX Runtime would pick instead
of a TFLite int8 file. The session's own profiler times each kernel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from tfopt.artifacts import DatasetArtifact, OpProfile, Precision, VariantResult, VariantSpec
from tfopt.fileio import atomic_write_bytes
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
    predict_batched,
    required,
    softmax,
)
from tfopt.serving import INPUT_NAME, OUTPUT_LOGITS, SIGNATURE_KEY, write_labels
from tfopt.variants import built, skipped

CHECK_EXAMPLES = 256
PROFILE_METHOD = "ONNX Runtime profiler: kernel time per call"
_NUMPY_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
                "tensor(double)": "float64", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
                "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
                "tensor(bool)": "bool"}


class OnnxSettings(RuntimeSection):
    """Whether to export ONNX, and ONNX Runtime's quantizations of it."""

    onnx: bool = Field(True, description="Export ONNX with tf2onnx and benchmark ONNX Runtime.")
    onnx_opset: int = Field(17, ge=17, le=21, description="ONNX opset for the export.")
    onnx_quantize: list[Literal["dynamic", "int8"]] = Field(
        default_factory=lambda: ["dynamic", "int8"],
        description=(
            "ONNX Runtime's own quantization of the exported model: dynamic "
            "(quantize_dynamic, int8 weights) and int8 (quantize_static, QDQ, uint8 "
            "activations and per-channel int8 weights, calibrated on the same "
            "calibration_examples as TFLite's int8)."
        ),
    )
    onnx_compressed: list[Literal["fp32", "int8"]] = Field(
        default_factory=list,
        description=(
            "ONNX forms of every compressed Keras model (pruned, distilled, channel-pruned ...): "
            "fp32 (the checked export, judged against the baseline's) and int8 (ONNX Runtime's "
            "static QDQ quantization of that export, which is built for it either way)."
        ),
    )
    onnx_atol: float = Field(
        1e-4, gt=0.0, le=1.0,
        description="Largest allowed |ONNX - SavedModel| probability difference on test inputs.",
    )


class OnnxMismatchError(RuntimeError):
    """The ONNX model's outputs differ from the SavedModel's beyond the tolerance."""


class OnnxRunner(Runner):
    """An ONNX Runtime session on the CPU execution provider."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        self.path = path
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self.inputs = tuple(_info(node) for node in self._session.get_inputs())
        self.outputs = tuple(_info(node) for node in self._session.get_outputs())
        self._dtypes = {info.name: info.dtype for info in self.inputs}
        self._fetch = list(self.fetched)

    @property
    def fetched(self) -> tuple[str, ...]:
        """The output whose name holds ``logits`` (tf2onnx may prefix it), else every output."""
        names = tuple(output.name for output in self.outputs)
        return next(((name,) for name in names if OUTPUT_LOGITS in name), names)

    def _cast(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.asarray(values, dtype=self._dtypes[name])
                for name, values in feeds.items()}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the session, every output."""
        values = self._session.run(None, self._cast(feeds))
        return {info.name: value for info, value in zip(self.outputs, values, strict=True)}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """Batch-1 input feeds in the model's input types."""
        return batch_one(self._cast(feeds))

    def invoke(self, prepared: object) -> object:
        """Run the session on a prepared feed; fetch its outputs."""
        values = self._session.run(self._fetch, prepared)
        return values[0] if len(values) == 1 else values


def _info(node: object) -> TensorInfo:
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in node.shape)
    return TensorInfo(node.name, shape, _NUMPY_TYPES.get(node.type, "float32"))


_TF2ONNX_MAIN = ("import gc, runpy, tfopt, tf2onnx.convert; gc.collect(); gc.freeze(); "
                 "runpy.run_module('tf2onnx.convert', run_name='__main__', alter_sys=True)")
"""``python -m tf2onnx.convert`` after ``import tfopt`` (its environment and garbage-collector
settings) with what it imported frozen: 1.3 of tf2onnx's ~5 CPU-s were collections walking
TensorFlow's objects."""


def run_tf2onnx(savedmodel_dir: Path, output: Path, opset: int) -> None:
    """Convert the SavedModel's serving signature to ONNX in a separate process.

    Raises:
        RuntimeError: tf2onnx failed; the message holds the end of its log.
    """
    tmp = output.with_name(f".{output.name}.tmp")
    command = [
        sys.executable, "-c", _TF2ONNX_MAIN,
        "--saved-model", str(savedmodel_dir), "--signature_def", SIGNATURE_KEY,
        "--opset", str(opset), "--output", str(tmp),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"tf2onnx failed ({completed.returncode}): {completed.stderr[-2000:]}")
    tmp.replace(output)


def max_probability_difference(
    reference: np.ndarray, candidate: np.ndarray
) -> tuple[float, float]:
    """Largest absolute difference of softmax outputs, and the share of equal top-1 classes."""
    ref, cand = softmax(reference), softmax(candidate)
    return (
        float(np.max(np.abs(ref - cand))),
        float(np.mean(np.argmax(ref, 1) == np.argmax(cand, 1))),
    )


def _check_on_arrays(savedmodel: Path, onnx_file: Path,
                     dataset: DatasetArtifact) -> tuple[float, int]:
    """The largest |ONNX - SavedModel| on test examples, and the examples compared.

    Every output is matched by name; its difference is a share of its largest magnitude.

    Raises:
        OnnxMismatchError: The two files' outputs have different names.
    """
    from tfopt.data.arrays import feeds_for, load_split_feeds
    from tfopt.runtimes.base import outputs_batched
    from tfopt.runtimes.tensorflow import SavedModelRunner

    arrays = load_split_feeds(dataset, "test", CHECK_EXAMPLES)
    outputs = []
    for runner in (SavedModelRunner(savedmodel), OnnxRunner(onnx_file)):
        outputs.append(outputs_batched(runner, feeds_for(
            [info.name for info in runner.inputs], arrays), 32))
    reference, candidate = outputs
    if sorted(reference) != sorted(candidate):
        raise OnnxMismatchError(f"ONNX outputs {sorted(candidate)} are not the SavedModel's "
                                f"{sorted(reference)}")
    worst = max(float(np.max(np.abs(reference[name] - candidate[name])))
                / max(float(np.max(np.abs(reference[name]))), 1e-12) for name in reference)
    step_logger().info("ONNX vs SavedModel on %d test examples: max |Δ| %.2e of the outputs' "
                       "largest value", len(next(iter(arrays.values()))), worst)
    return worst, len(next(iter(arrays.values())))


def export_onnx(spec: VariantSpec, sources: BuildSources, cfg: OnnxSettings) -> VariantSpec:
    """Write ``<source>.onnx`` from the serving signature and check it with ONNX Runtime.

    The check runs both models on real test examples (a batch of several, so the dynamic batch
    dimension is exercised) and requires the probabilities to agree within ``cfg.onnx_atol``.

    Raises:
        OnnxMismatchError: The outputs disagree beyond the tolerance.
    """
    from tfopt.data.pipeline import load_split
    from tfopt.runtimes.tensorflow import SavedModelRunner

    savedmodel = sources.savedmodel
    if savedmodel is None:
        raise ValueError(f"{sources.model.name} has no SavedModel to export")
    out_dir = sources.out_dir
    path = out_dir / f"{savedmodel.name}.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_labels(out_dir, sources.dataset.class_names)
    run_tf2onnx(savedmodel.path, path, cfg.onnx_opset)
    if sources.dataset.arrays:
        max_diff, checked = _check_on_arrays(savedmodel.path, path, sources.dataset)
        if max_diff > cfg.onnx_atol:
            raise OnnxMismatchError(f"ONNX differs from the SavedModel by {max_diff:.3e} of its "
                                    f"outputs' largest value > onnx_atol {cfg.onnx_atol}")
        return built(spec, path, opset=cfg.onnx_opset, check_max_rel_diff=max_diff,
                     check_examples=checked)
    images, _ = load_split(sources.dataset, "test", CHECK_EXAMPLES, savedmodel.input_scale)
    reference = predict_batched(SavedModelRunner(savedmodel.path), images, 32)
    candidate = predict_batched(OnnxRunner(path), images, 32)
    max_diff, agreement = max_probability_difference(reference, candidate)
    step_logger().info("ONNX vs SavedModel on %d test inputs: max |Δp| %.2e, top-1 agreement "
                       "%.4f", len(images), max_diff, agreement)
    if max_diff > cfg.onnx_atol:
        raise OnnxMismatchError(
            f"ONNX differs from the SavedModel by {max_diff:.3e} > onnx_atol {cfg.onnx_atol}")
    return built(spec, path, opset=cfg.onnx_opset, check_max_abs_diff=max_diff,
                 check_examples=len(images))


def quantize_onnx_file(
    source: Path, output: Path, precision: str,
    calibration: Iterator[list[np.ndarray] | dict[str, np.ndarray]] | None,
) -> dict[str, str | int | float | bool]:
    """Write the quantized form of `source` to `output` atomically; return how it was made.

    The model is pre-processed first (shape inference and graph optimization), as ONNX Runtime
    recommends before quantizing. Activations are uint8 and weights per-channel int8 (U8S8),
    the combination ONNX Runtime's x86 integer kernels are built for.
    """
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Calibration(CalibrationDataReader):
        def __init__(self, input_name: str,
                     examples: Iterator[list[np.ndarray] | dict[str, np.ndarray]]) -> None:
            self._feeds = (one if isinstance(one, dict) else {input_name: one[0]}
                           for one in examples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

    prepared = output.with_name(f".{output.stem}.pre.onnx")
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        if precision == "dynamic":
            quantize_dynamic(prepared, tmp, weight_type=QuantType.QInt8)
            how: dict[str, str | int | float | bool] = {
                "quantizer": "onnxruntime.quantization.quantize_dynamic", "weights": "int8"}
        else:
            if calibration is None:
                raise ValueError("static int8 quantization needs calibration images")
            session = ort.InferenceSession(str(prepared), providers=["CPUExecutionProvider"])
            reader = Calibration(session.get_inputs()[0].name, calibration)
            quantize_static(prepared, tmp, reader, quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            per_channel=True)
            how = {"quantizer": "onnxruntime.quantization.quantize_static",
                   "quant_format": "QDQ", "activations": "uint8",
                   "weights": "int8 per-channel"}
        tmp.replace(output)
    finally:
        prepared.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return how


def onnx_flops(path: Path) -> float:
    """FLOPs per example of an ONNX file (shapes inferred, symbolic batch taken as 1).

    Dense ops are counted by their weights' shape; the Integer ones are what ONNX Runtime's
    dynamic quantization leaves (a QDQ model keeps Conv/Gemm/MatMul behind DequantizeLinear).
    """
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    graph = model.graph
    shapes = {}
    for info in list(graph.value_info) + list(graph.output) + list(graph.input):
        dims = info.type.tensor_type.shape.dim
        shapes[info.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
    for initializer in graph.initializer:
        shapes[initializer.name] = list(numpy_helper.to_array(initializer).shape)
    total = 0.0
    for node in graph.node:
        if node.op_type not in ("Conv", "ConvInteger", "Gemm", "MatMul", "MatMulInteger") \
                or len(node.input) < 2:
            continue
        weights, output = shapes.get(node.input[1]), shapes.get(node.output[0])
        if not weights or not output:
            continue
        out_elements = float(np.prod(output)) / max(output[0], 1)
        if node.op_type in ("Conv", "ConvInteger"):  # weights [out, in / group, kh, kw]
            total += 2.0 * float(np.prod(weights[1:])) * out_elements
        else:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            inner = weights[-1] if transposed else weights[-2]
            total += 2.0 * float(inner) * out_elements
    return total


def onnx_op_profile(path: Path, threads: int, prepared: Sequence[object]) -> OpProfile:
    """Run `PROFILED_CALLS` calls on a profiling session of its own; rank the kernels by time."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="tfopt-ort-profile-") as folder:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "ort")
        session = ort.InferenceSession(str(path), sess_options=options,
                                       providers=["CPUExecutionProvider"])
        for index in range(WARMUP_CALLS + PROFILED_CALLS):
            session.run(None, prepared[index % len(prepared)])
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted(event["ts"] for event in events if event.get("name") == "model_run")
    profiled_from = runs[WARMUP_CALLS] if len(runs) > WARMUP_CALLS else 0
    totals: Counter[tuple[str, str]] = Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time") \
                and event["ts"] >= profiled_from:
            node = name.removesuffix("_kernel_time")
            totals[(node, event["args"].get("op_name", "?"))] += event["dur"] / 1000.0
    return OpProfile(method=PROFILE_METHOD, calls=PROFILED_CALLS,
                     ops=top_ops(totals, PROFILED_CALLS, timed=True))


def onnx_floor_bytes(input_shape: tuple[int, ...]) -> bytes:
    """An ONNX model slicing the first pixel out of NHWC images, serialized."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    side, channels = input_shape[0], input_shape[-1]
    constants = [numpy_helper.from_array(np.asarray(values, np.int64), name)
                 for name, values in (("starts", [0, 0]), ("ends", [1, 1]), ("axes", [1, 2]),
                                      ("shape", [-1, channels]))]
    graph = helper.make_graph(
        [helper.make_node("Slice", [INPUT_NAME, "starts", "ends", "axes"], ["pixel"]),
         helper.make_node("Reshape", ["pixel", "shape"], [OUTPUT_LOGITS])],
        "harness_floor",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT,
                                       ["batch", side, side, channels])],
        [helper.make_tensor_value_info(OUTPUT_LOGITS, TensorProto.FLOAT, ["batch", channels])],
        initializer=constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


class OnnxRuntime(Runtime):
    """ONNX Runtime on the CPU execution provider."""

    name = "onnxruntime"
    formats = frozenset({"onnx"})
    section = OnnxSettings
    home = "convert"
    order = 30
    file_suffixes: ClassVar[Mapping[str, str]] = {".onnx": "onnx"}
    shares_process = True

    def plan(self, request: PlanRequest, settings: OnnxSettings) -> list[VariantSpec]:
        """The checked ONNX export and its quantizations, or the ``.onnx`` file as given."""
        source = request.source
        if request.compressed:
            return self._compressed_forms(request)
        if request.kind == "onnx":
            return [self.variant(source, "onnx", request.precision)]
        if request.kind not in ("keras", "savedmodel"):
            return [skipped(self.variant(source, "onnx"),
                            f"model.path is a .{request.kind} file: it is benchmarked as it is")]
        if not settings.onnx:
            return []
        onnx = self.variant(source, "onnx", derived_from=self.variant(source, "savedmodel").name)
        return [onnx, *(self.variant(source, "onnx", precision, derived_from=onnx.name)
                        for precision in settings.onnx_quantize)]

    def compressed_forms(self, settings: OnnxSettings,
                         compress: Any) -> dict[str, tuple[str, ...]]:
        """``convert.onnx_compressed``, when ONNX is exported at all."""
        return {"onnx": tuple(settings.onnx_compressed)} if settings.onnx else {}

    def _compressed_forms(self, request: PlanRequest) -> list[VariantSpec]:
        """A technique's Keras model: its checked export, and its int8 when asked."""
        asked = (request.asked or {}).get("onnx", ())
        if not asked or request.kind != "keras":
            return []
        start = self.variant_name(request.start or "baseline", "onnx", "fp32")
        onnx = self.variant(request.source, "onnx", derived_from=start)
        if "int8" not in asked:
            return [onnx]
        return [onnx, self.variant(request.source, "onnx", "int8", derived_from=onnx.name)]

    def builds_from(self, spec: VariantSpec) -> str | None:
        """A quantized file is ONNX Runtime's quantization of the float ONNX file."""
        return spec.derived_from if spec.precision != "fp32" else None

    def build(self, spec: VariantSpec, sources: BuildSources,
              settings: OnnxSettings) -> VariantSpec:
        """tf2onnx's export (checked), or ONNX Runtime's quantization of the float file."""
        if sources.model.format == "onnx":
            return built(spec, sources.model.path)
        if spec.precision == "fp32":
            return export_onnx(spec, sources, settings)
        from tfopt.runtimes._litert_files import representative_inputs

        float_file = required(sources, spec.derived_from)
        path = sources.out_dir / f"{spec.name}.onnx"
        calibration = (None if spec.precision == "dynamic" else representative_inputs(
            sources.dataset, sources.calibration_examples, sources.model.input_scale))
        how = quantize_onnx_file(float_file.path, path, spec.precision, calibration)
        if calibration is not None:
            how["calibration_examples"] = sources.calibration_examples
        return built(spec, path, **how)

    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        """An ONNX Runtime session with `threads` intra-op threads."""
        return OnnxRunner(spec.path, threads)

    def import_file(self, path: Path, out_dir: Path, class_names: Sequence[str] = (),
                    output: str = "logits") -> tuple[Path, Precision]:
        """The file copied in as it is."""
        final = out_dir / "baseline.onnx"
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, final.with_suffix(".onnx.tmp"))
        final.with_suffix(".onnx.tmp").replace(final)
        return final, "fp32"

    def flops(self, runner: Runner) -> float | None:
        """FLOPs of the file's convolutions and matrix products."""
        return onnx_flops(runner.path)

    def op_profile(self, runner: Runner, prepared: Sequence[object],
                   threads: int) -> OpProfile | None:
        """ONNX Runtime's own profiler on a session of its own."""
        return onnx_op_profile(runner.path, threads, prepared)

    def floor_models(self, input_shape: tuple[int, ...], out_dir: Path) -> dict[str, Path]:
        """``floor.onnx``: a Slice and a Reshape."""
        path = out_dir / "floor.onnx"
        if not path.exists():
            atomic_write_bytes(path, onnx_floor_bytes(input_shape))
        return {"onnx": path}

    def package(self, spec: VariantSpec, contract: ServingContract, metadata: dict,
                dst: Path) -> str:
        """MLflow's ONNX flavor."""
        import mlflow.onnx
        import onnx

        model = onnx.load(str(spec.path))
        if contract.named:  # fed and answered by name by the flavor itself
            runner = OnnxRunner(Path(spec.path))
            example, signature = named_example(contract.example, runner), named_signature(runner)
        else:
            example = contract.example.astype(np.float32)
            signature = mlflow_signature(example, {
                output.name: output.type.tensor_type.shape.dim[-1].dim_value
                for output in model.graph.output})
        mlflow.onnx.save_model(
            model, str(dst), signature=signature, input_example=example,
            metadata=metadata, pip_requirements=pinned("onnx", "onnxruntime"),
        )
        return "model.onnx"

    def slowdown_reason(self, result: VariantResult) -> str | None:
        """Why ONNX Runtime's forms can be slower than what they derive from on x86."""
        return {
            "fp32": "ONNX Runtime's CPU kernels are slower than TensorFlow's for this graph",
            "dynamic": "ONNX Runtime's dynamic quantization turns convolutions into "
                       "ConvInteger, which quantizes activations at every call and is slower "
                       "than float Conv on x86",
            "int8": "QuantizeLinear/DequantizeLinear at the edges of each quantized island cost "
                    "more than the int8 kernels save on this model",
        }.get(result.precision)


RUNTIME = OnnxRuntime()
