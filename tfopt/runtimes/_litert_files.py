"""LiteRT files: converted from a serving SavedModel, opened for measuring, read back.

The mechanics the LiteRT runtime (`tfopt.runtimes.litert`) and its selective int8
(`tfopt.runtimes._litert_selective`) share: the interpreter and CompiledModel runners, the
converter's settings per precision, and what a converted file holds (its precision, FLOPs, the
int8 kernels' sparsity and values).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfopt.artifacts import DatasetArtifact, Precision, VariantSpec
from tfopt.config import InputScale
from tfopt.fileio import atomic_write_bytes
from tfopt.runtimes.base import Runner, TensorInfo, batch_one
from tfopt.serving import SIGNATURE_KEY, write_labels
from tfopt.variants import built

STEM_GAIN = 0.10
"""Selective int8 keeps the first convolution in float only when a quick timing finds it this
much faster than full int8 (`tfopt.runtimes._litert_selective.float_stem_if_faster`)."""


def quantize(values: np.ndarray, detail: Mapping[str, Any]) -> np.ndarray:
    """Map float values to a tensor's integer type with its scale and zero point."""
    dtype = detail["dtype"]
    if np.dtype(dtype).kind == "f" or not detail.get("quantization", (0.0, 0))[0]:
        return values.astype(dtype)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale + zero_point), info.min, info.max).astype(dtype)


def dequantize(values: np.ndarray, detail: Mapping[str, Any]) -> np.ndarray:
    """Map an integer tensor back to floats with its scale and zero point."""
    if values.dtype == np.float32 or not detail.get("quantization", (0.0, 0))[0]:
        return values
    scale, zero_point = detail["quantization"]
    return (values.astype(np.float32) - zero_point) * scale


class TFLiteRunner(Runner):
    """The LiteRT interpreter (``ai_edge_litert``) on the model's serving signature.

    tfopt's files have ``serving_default`` with ``images`` in and ``logits`` out; a user's file
    may name them otherwise: its only (or ``serving_default``) signature is used, all its
    inputs and outputs. The signature's tensors are driven with the interpreter's own
    set_tensor/invoke/get_tensor, the calls a bare serving loop makes: LiteRT's signature runner
    costs a few microseconds more per call (it returns every output in a new dictionary), which
    on a small model is a tenth of the inference. A signature outside the main subgraph keeps
    the signature runner.
    """

    def __init__(self, path: Path, threads: int = 1) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=threads)
        signatures = self.interpreter.get_signature_list()
        if not signatures:
            raise ValueError(f"{path} has no signature (convert it with TensorFlow >= 2.7)")
        self.signature_key = (SIGNATURE_KEY if SIGNATURE_KEY in signatures
                              else sorted(signatures)[0])
        signature = self.interpreter.get_signature_runner(self.signature_key)
        self._in = signature.get_input_details()
        self._out = signature.get_output_details()
        self.inputs = tuple(_info(name, detail) for name, detail in self._in.items())
        self.outputs = tuple(_info(name, detail) for name, detail in self._out.items())
        in_main_subgraph = getattr(signature, "_subgraph_index", 0) == 0
        self._signature = None if in_main_subgraph else signature
        self._batch: int | None = None
        self._fetch = [self._out[name] for name in self.fetched]
        self._single = self._in[self.inputs[0].name] if len(self.inputs) == 1 else None

    @property
    def input_name(self) -> str:
        """The first input's name in the signature."""
        return self.inputs[0].name

    @property
    def output_name(self) -> str:
        """The classifier output's name in the signature."""
        return self.scores_output

    @property
    def input_dtype(self) -> type:
        """The dtype the first input tensor holds (float32, or int8 for integer I/O)."""
        return self._in[self.input_name]["dtype"]

    @property
    def input_detail(self) -> dict:
        """The first input tensor's details (name, shape, dtype, quantization)."""
        return self._in[self.input_name]

    @property
    def output_detail(self) -> dict:
        """The classifier output tensor's details."""
        return self._out[self.output_name]

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Quantize the inputs the model wants as integers, invoke, dequantize every output."""
        self._size_for(len(next(iter(feeds.values()))))
        quantized = {name: quantize(feeds[name], detail) for name, detail in self._in.items()}
        if self._signature is not None:
            outputs = self._signature(**quantized)
            return {name: dequantize(outputs[name], self._out[name]) for name in self._out}
        for name, detail in self._in.items():
            self.interpreter.set_tensor(detail["index"], quantized[name])
        self.interpreter.invoke()
        return {name: dequantize(self.interpreter.get_tensor(detail["index"]), detail)
                for name, detail in self._out.items()}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """Batch-1 inputs in the model's input types (quantized for integer inputs)."""
        self._size_for(1)
        quantized = {name: quantize(feeds[name], detail) for name, detail in self._in.items()}
        count = len(next(iter(quantized.values())))
        if self._single is not None:
            (values,) = quantized.values()
            return [np.ascontiguousarray(values[i : i + 1]) for i in range(count)]
        return [tuple(np.ascontiguousarray(values[i : i + 1]) for values in quantized.values())
                for i in range(count)]

    def invoke(self, prepared: object) -> object:
        """Hand over one input, invoke, copy the fetched outputs out (still quantized)."""
        if self._signature is not None:
            arguments = (prepared,) if self._single is not None else prepared
            outputs = self._signature(**dict(zip(self._in, arguments, strict=True)))
            return [outputs[name] for name in self.fetched]
        if self._single is not None:
            self.interpreter.set_tensor(self._single["index"], prepared)
        else:
            for detail, values in zip(self._in.values(), prepared, strict=True):
                self.interpreter.set_tensor(detail["index"], values)
        self.interpreter.invoke()
        if len(self._fetch) == 1:
            return self.interpreter.get_tensor(self._fetch[0]["index"])
        return [self.interpreter.get_tensor(detail["index"]) for detail in self._fetch]

    def _size_for(self, batch: int) -> None:
        if self._signature is not None or batch == self._batch:
            return
        for detail in self._in.values():
            shape = [batch, *detail["shape"][1:]]
            self.interpreter.resize_tensor_input(detail["index"], shape, strict=False)
        self.interpreter.allocate_tensors()
        self._batch = batch


class CompiledModelRunner(Runner):
    """LiteRT's CompiledModel API (LiteRT 2.x) on the CPU: what ``benchmark_litert_model`` times.

    The model's serving signature runs on tensor buffers made once; a call writes the input into
    its buffer, runs, and reads the fetched outputs back, as a serving loop does.
    """

    def __init__(self, path: Path, threads: int = 1) -> None:
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import CpuOptions, Options

        options = Options(hardware_accelerators=HardwareAccelerator.CPU,
                          cpu_options=CpuOptions(num_threads=threads))
        self.model = CompiledModel.from_file(str(path), options=options)
        signatures = self.model.get_signature_list()
        self.signature_key = (SIGNATURE_KEY if SIGNATURE_KEY in signatures
                              else sorted(signatures)[0])
        in_details = self.model.get_input_tensor_details(self.signature_key)
        out_details = self.model.get_output_tensor_details(self.signature_key)
        self.inputs = tuple(_buffer_info(name, d) for name, d in in_details.items())
        self.outputs = tuple(_buffer_info(name, d) for name, d in out_details.items())
        self._in = {name: self.model.create_input_buffer_by_name(self.signature_key, name)
                    for name in in_details}
        self._out = {name: self.model.create_output_buffer_by_name(self.signature_key, name)
                     for name in out_details}
        self._reads = [(self._out[info.name], int(np.prod(info.shape)), np.dtype(info.dtype))
                       for info in self.outputs if info.name in self.fetched]
        self._quantization = _quantization(path, self.inputs + self.outputs)

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One example at a time (the buffers hold batch 1); outputs dequantized."""
        outputs: dict[str, list[np.ndarray]] = {info.name: [] for info in self.outputs}
        for feed in self._prepare(feeds):
            for name, values in feed.items():
                self._in[name].write(values)
            self.model.run_by_name(self.signature_key, self._in, self._out)
            for info in self.outputs:
                values = self._out[info.name].read(int(np.prod(info.shape)),
                                                   np.dtype(info.dtype)).reshape(info.shape)
                outputs[info.name].append(dequantize(values, self._quantization[info.name]))
        return {name: np.concatenate(values) for name, values in outputs.items()}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """Batch-1 inputs by name in the model's input types (quantized for integer inputs)."""
        return [{name: np.ascontiguousarray(quantize(values, self._quantization[name]))
                 for name, values in feed.items()} for feed in batch_one(feeds)]

    def invoke(self, prepared: object) -> object:
        """Write the inputs into their buffers, run, read the fetched outputs."""
        for name, values in prepared.items():
            self._in[name].write(values)
        self.model.run_by_name(self.signature_key, self._in, self._out)
        return [buffer.read(count, dtype) for buffer, count, dtype in self._reads]

    def facts(self) -> dict[str, str]:
        """Whether every op of the model ran on the accelerator asked for (XNNPACK on CPU)."""
        return {"fully_accelerated": str(self.model.is_fully_accelerated()).lower()}


def _quantization(path: Path, tensors: Sequence[TensorInfo]) -> dict[str, dict[str, Any]]:
    """Each signature tensor's dtype and (for integer ones) scale and zero point.

    The CompiledModel API does not expose quantization parameters: an integer-I/O file's are
    read once with the interpreter.
    """
    plain = {info.name: {"dtype": np.dtype(info.dtype)} for info in tensors}
    if all(np.dtype(info.dtype).kind == "f" for info in tensors):
        return plain
    runner = TFLiteRunner(path)
    return {**plain, **runner._in, **runner._out}


def _buffer_info(name: str, detail: Mapping[str, Any]) -> TensorInfo:
    shape = tuple(int(d) for d in detail["shape"])
    return TensorInfo(name, shape, np.dtype(detail["dtype"]).name)


def _info(name: str, detail: Mapping[str, Any]) -> TensorInfo:
    signature = detail.get("shape_signature", detail["shape"])
    shape = tuple(None if int(d) < 0 else int(d) for d in signature)
    return TensorInfo(name, shape, np.dtype(detail["dtype"]).name)


def representative_inputs(
    dataset: DatasetArtifact, examples: int, scale: InputScale = "unit"
) -> Iterator[list[np.ndarray] | dict[str, np.ndarray]]:
    """Yield calibration inputs one at a time (batch 1) from the training shards.

    Images scaled for the model, as a list of one; an array data set's inputs (never ``y``):
    a list of one for a model of one input, else by input name (`tfopt.data.arrays`).
    """
    if dataset.arrays:
        from tfopt.data.arrays import input_specs, load_split_feeds

        names = list(input_specs(dataset))
        feeds = load_split_feeds(dataset, "train", examples)
        for row in range(len(feeds[names[0]])):
            one = {name: feeds[name][row : row + 1] for name in names}
            yield [one[names[0]]] if len(names) == 1 else one
        return
    from tfopt.data.pipeline import load_split

    images, _ = load_split(dataset, "train", examples, scale)
    for image in images:
        yield [image[np.newaxis]]


def serving_converter(savedmodel: Path) -> Any:
    """A TFLite converter for the SavedModel's serving signature (no optimizations set yet)."""
    import tensorflow as tf

    return tf.lite.TFLiteConverter.from_saved_model(str(savedmodel),
                                                    signature_keys=[SIGNATURE_KEY])


def configure_converter(converter: Any, precision: Precision, dataset: DatasetArtifact,
                        calibration_examples: int, int8_io: bool = False,
                        scale: InputScale = "unit") -> None:
    """Set the converter's optimizations for one post-training precision.

    Integer precisions are calibrated on `calibration_examples` training images; `int8_io`
    makes a full-integer file take and give int8 tensors.
    """
    import tensorflow as tf

    if precision == "fp32":
        return
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if precision == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif precision in ("int8", "int16x8"):
        converter.representative_dataset = lambda: representative_inputs(
            dataset, calibration_examples, scale)
        converter.target_spec.supported_ops = [{
            "int8": tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
            "int16x8": tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
        }[precision]]
        if precision == "int8" and int8_io:
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8


class ConversionError(RuntimeError):
    """A model the TFLite converter refuses (the message: its diagnosis in one line)."""


def converter_reason(message: str) -> str:
    """The TFLite converter's diagnosis in one line: its last ``error:`` note, shortened.

    The converter raises pages of MLIR locations (``loc(callsite(...))``) before the sentence
    that says what failed.
    """
    errors = [_without_location(line.split("error:", 1)[1].strip())
              for line in message.splitlines() if "error:" in line]
    reason = errors[-1] if errors else message.strip().splitlines()[0] if message.strip() else ""
    return reason[:400]


def _without_location(text: str) -> str:
    """`text` without a leading MLIR location ``loc(...):`` (its parentheses nest)."""
    if not text.startswith("loc("):
        return text
    depth = 0
    for index in range(len("loc"), len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return text[index + 1 :].lstrip(": ").strip()
    return text


def convert_tflite(savedmodel: Path, variant: VariantSpec, dataset: DatasetArtifact,
                   calibration_examples: int, int8_io: bool, out_dir: Path,
                   scale: InputScale) -> VariantSpec:
    """Convert a SavedModel's serving signature to ``<variant name>.tflite`` in `out_dir`.

    The variant's precision is ``fp32`` (no quantization), ``dynamic`` (int8 weights, float
    activations), ``float16`` (float16 weights), ``int8`` (integer weights and activations,
    calibrated on training examples) or ``int16x8`` (int16 activations, int8 weights). With
    ``sparsity_encoding`` in its params, weights are stored in TFLite's sparse format
    (``Optimize.EXPERIMENTAL_SPARSITY``).
    """
    import tensorflow as tf

    converter = serving_converter(savedmodel)
    configure_converter(converter, variant.precision, dataset, calibration_examples, int8_io,
                        scale)
    if variant.params.get("sparsity_encoding"):
        converter.optimizations = [*converter.optimizations,
                                   tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    try:
        flatbuffer = converter.convert()
    except Exception as error:  # the converter's MLIR diagnostics run to pages
        raise ConversionError(f"the TFLite converter cannot convert it: "
                              f"{converter_reason(str(error))}") from error
    path = out_dir / f"{variant.name}.tflite"
    atomic_write_bytes(path, flatbuffer)
    write_labels(out_dir, dataset.class_names)
    params: dict[str, str | int | float | bool] = {"converter": "TFLiteConverter.from_saved_model"}
    if variant.precision == "int8":
        params.update(calibration_examples=calibration_examples, int8_io=int8_io)
    elif variant.precision == "int16x8":
        params.update(calibration_examples=calibration_examples)
    return built(variant, path, **params)


def int8_kernel_stats(tflite: Path) -> dict[str, float]:
    """Sparsity and most distinct values per output channel of each int8 kernel of a file.

    Each weight tensor is read back from the converted file, as tfmot's own
    collaborative-optimization tests do: what survived quantization (the zeros a pruning kept,
    the values a clustering left), not what the Keras model held. Kernels with one output row
    (depthwise ``[1, h, w, channels]``) are not listed.
    """
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tflite))
    stats: dict[str, float] = {}
    for detail in interpreter.get_tensor_details():
        shape = detail["shape"]
        if np.dtype(detail["dtype"]) != np.int8 or len(shape) not in (2, 4) or shape[0] < 2:
            continue
        try:
            weights = interpreter.get_tensor(detail["index"])
        except ValueError:  # an activation, not a constant
            continue
        parts = detail["name"].split(";")[0].split("/")
        layer = (parts[-2] if len(parts) > 1 else parts[0]).removeprefix("quant_")
        stats[f"int8_sparsity.{layer}"] = float(np.mean(weights == 0))
        stats[f"int8_values_per_channel.{layer}"] = float(max(
            len(np.unique(channel)) for channel in weights))
    return stats


def tflite_precision(runner: TFLiteRunner) -> Precision:
    """What a ``.tflite`` file holds: int16x8, int8, float16, dynamic or fp32.

    int16x8 means int16 activations; int8 integer activations (an integer input, or a QUANTIZE
    op after a float input); float16 and dynamic are float16 or int8 weights with float
    activations.
    """
    interpreter = runner.interpreter
    ops = {op["op_name"] for op in interpreter._get_ops_details()}  # no public API lists the ops
    dtypes = {np.dtype(t["dtype"]) for t in interpreter.get_tensor_details()}
    if np.dtype(np.int16) in dtypes:
        return "int16x8"
    if np.dtype(runner.input_dtype).kind in "iu" or "QUANTIZE" in ops:
        return "int8"
    if np.dtype(np.float16) in dtypes:
        return "float16"
    return "dynamic" if np.dtype(np.int8) in dtypes else "fp32"


def tflite_op_flops(interpreter: Any) -> list[tuple[str, str, float]]:
    """(output tensor name, op type, FLOPs per example) of each counted op of a LiteRT graph."""
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    counted = []
    for op in interpreter._get_ops_details():  # no public API lists the ops
        name, inputs, outputs = op["op_name"], op["inputs"], op["outputs"]
        if name not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED") or len(inputs) < 2:
            continue
        weights, output = tensors[int(inputs[1])]["shape"], tensors[int(outputs[0])]
        shape = output["shape"]
        out_elements = float(np.prod(shape)) / max(int(shape[0]), 1)
        if name == "CONV_2D":  # weights [out, kh, kw, in]
            flops = 2.0 * float(np.prod(weights[1:])) * out_elements
        elif name == "DEPTHWISE_CONV_2D":  # weights [1, kh, kw, out]
            flops = 2.0 * float(weights[1] * weights[2]) * out_elements
        else:  # weights [out, in]
            flops = 2.0 * float(weights[1]) * out_elements
        counted.append((output["name"].split(";")[0], name, flops))
    return counted


def tflite_flops(interpreter: Any) -> float:
    """FLOPs per example of an allocated LiteRT interpreter's graph."""
    return sum(flops for _, _, flops in tflite_op_flops(interpreter))
