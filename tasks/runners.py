"""Uniform `predict(batch) -> logits` wrappers around every inference backend. Not a task.

The benchmark and the agreement checks call these, so every backend is fed the same numpy
inputs and judged by the same code. TensorFlow is imported only by the runners that need it,
so a process measuring a TFLite or ONNX model carries no TensorFlow runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from tfopt.artifacts import VariantSpec
from tfopt.serving import INPUT_NAME, OUTPUT_LOGITS, SIGNATURE_KEY

TF_FORMATS = frozenset({"keras", "graph", "xla", "savedmodel"})
"""Formats measured through TensorFlow itself (its thread pools apply)."""


class Runner(Protocol):
    """Runs a model on a float32 batch ``[N, S, S, 3]`` and returns logits ``[N, classes]``.

    The benchmark times `invoke` on inputs `prepare` made beforehand, so the timed region holds
    what a serving loop must do per request (hand the input over, run, read the output) and none
    of the harness's own work (quantizing inputs, building dictionaries, converting tensors).
    """

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Return the model's logits for `images`."""
        ...

    def prepare(self, images: np.ndarray) -> list[object]:
        """One ready-to-run input per example of `images` (batch 1), made outside timing."""
        ...

    def invoke(self, prepared: object) -> object:
        """Run the model on one prepared input and fetch its logits: the timed call."""
        ...


def set_tf_threads(threads: int) -> None:
    """Size TensorFlow's intra-op and inter-op pools to `threads`.

    TensorFlow fixes its pools when its runtime starts, so this works only before the first
    TensorFlow operation of the process (a fresh benchmark process); afterwards the pools stay
    as they are, and `tf_threads_in_force` says so.
    """
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass


def tf_threads_in_force() -> tuple[int, int]:
    """TensorFlow's intra-op and inter-op pool sizes (0: its default, one thread per core)."""
    import tensorflow as tf

    return (tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads())


class GraphRunner:
    """A Keras model traced into a TensorFlow graph with `tf.function` (optionally XLA-compiled)."""

    def __init__(self, path: Path, jit_compile: bool = False) -> None:
        import tensorflow as tf

        from tasks.keras_models import load_keras_model

        self._tf = tf
        self.model = model = load_keras_model(path)
        self._call = tf.function(lambda images: model(images, training=False),
                                 jit_compile=jit_compile, reduce_retracing=True)

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Run the traced model."""
        return self._call(self._tf.constant(images)).numpy()

    def prepare(self, images: np.ndarray) -> list[object]:
        """Batch-1 tensors."""
        return [self._tf.constant(images[i : i + 1]) for i in range(len(images))]

    def invoke(self, prepared: object) -> object:
        """Run the traced model on a prepared tensor and copy the logits out."""
        return self._call(prepared).numpy()

    def hlo_text(self, images: np.ndarray) -> str:
        """The optimized HLO XLA compiles for inputs shaped like `images` (jit_compile only)."""
        compiler_ir = self._call.experimental_get_compiler_ir(self._tf.constant(images))
        return compiler_ir(stage="optimized_hlo")


class SavedModelRunner:
    """The ``serving_default`` signature of a reloaded SavedModel."""

    def __init__(self, path: Path) -> None:
        import tensorflow as tf

        self._tf = tf
        self._loaded = tf.saved_model.load(str(path))
        self._signature = self._loaded.signatures[SIGNATURE_KEY]

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Call the serving signature."""
        return self.invoke({INPUT_NAME: self._tf.constant(images)})

    def prepare(self, images: np.ndarray) -> list[object]:
        """Batch-1 keyword arguments of the serving signature."""
        return [{INPUT_NAME: self._tf.constant(images[i : i + 1])} for i in range(len(images))]

    def invoke(self, prepared: object) -> object:
        """Call the serving signature with prepared keyword arguments."""
        return self._signature(**prepared)[OUTPUT_LOGITS].numpy()


class TFLiteRunner:
    """The LiteRT interpreter (``ai_edge_litert``) on the model's serving signature.

    tfopt's files have ``serving_default`` with ``images`` in and ``logits`` out; a user's file
    may name them otherwise, so its only signature, input and (logits-named or first) output
    are used. The signature's tensors are then driven with the interpreter's own
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
        inputs = signature.get_input_details()
        outputs = signature.get_output_details()
        if len(inputs) != 1:
            raise ValueError(f"{path} takes {sorted(inputs)}, not one image tensor")
        self.input_name = next(iter(inputs))
        self.output_name = OUTPUT_LOGITS if OUTPUT_LOGITS in outputs else next(iter(outputs))
        self._input = inputs[self.input_name]
        self._output = outputs[self.output_name]
        in_main_subgraph = getattr(signature, "_subgraph_index", 0) == 0
        self._signature = None if in_main_subgraph else signature
        self._batch: int | None = None

    @property
    def input_dtype(self) -> type:
        """The dtype the model's input tensor holds (float32, or int8 for integer I/O)."""
        return self._input["dtype"]

    @property
    def input_detail(self) -> dict:
        """The input tensor's details (name, shape, dtype, quantization)."""
        return self._input

    @property
    def output_detail(self) -> dict:
        """The output tensor's details."""
        return self._output

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Quantize the input if the model wants integers, invoke, dequantize the logits."""
        self._size_for(len(images))
        return dequantize(self.invoke(quantize(images, self._input)), self._output)

    def prepare(self, images: np.ndarray) -> list[object]:
        """Batch-1 inputs in the model's input type (quantized for integer inputs)."""
        self._size_for(1)
        quantized = quantize(images, self._input)
        return [np.ascontiguousarray(quantized[i : i + 1]) for i in range(len(images))]

    def invoke(self, prepared: object) -> object:
        """Hand over one input, invoke, copy the logits out (still quantized)."""
        if self._signature is not None:
            return self._signature(**{self.input_name: prepared})[self.output_name]
        self.interpreter.set_tensor(self._input["index"], prepared)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self._output["index"])

    def _size_for(self, batch: int) -> None:
        if self._signature is not None or batch == self._batch:
            return
        shape = [batch, *self._input["shape"][1:]]
        self.interpreter.resize_tensor_input(self._input["index"], shape, strict=False)
        self.interpreter.allocate_tensors()
        self._batch = batch


class OnnxRunner:
    """An ONNX Runtime session on the CPU execution provider."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        self.path = path
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        names = [output.name for output in self._session.get_outputs()]
        self._outputs = [next((n for n in names if OUTPUT_LOGITS in n), names[0])]

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Run the session."""
        return self.invoke({self._input: images.astype(np.float32)})

    def prepare(self, images: np.ndarray) -> list[object]:
        """Batch-1 input feeds."""
        floats = images.astype(np.float32)
        return [{self._input: np.ascontiguousarray(floats[i : i + 1])}
                for i in range(len(images))]

    def invoke(self, prepared: object) -> object:
        """Run the session on a prepared feed."""
        return self._session.run(self._outputs, prepared)[0]


def quantize(values: np.ndarray, detail: dict) -> np.ndarray:
    """Map float values to a tensor's integer type with its scale and zero point."""
    dtype = detail["dtype"]
    if dtype == np.float32:
        return values.astype(np.float32)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale + zero_point), info.min, info.max).astype(dtype)


def dequantize(values: np.ndarray, detail: dict) -> np.ndarray:
    """Map an integer tensor back to floats with its scale and zero point."""
    if values.dtype == np.float32:
        return values
    scale, zero_point = detail["quantization"]
    return (values.astype(np.float32) - zero_point) * scale


def enable_onednn_bfloat16() -> None:
    """Let Grappler rewrite this process's graphs to bfloat16 where oneDNN has bf16 kernels.

    Process-wide: a bfloat16 variant is measured in a process of its own.
    """
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})


def load_runner(spec: VariantSpec, threads: int = 1) -> Runner:
    """Open a variant's model file or folder with the runner for its format.

    `threads` sizes the runtime's pools: LiteRT's and ONNX Runtime's intra-op threads, and
    TensorFlow's intra- and inter-op pools (see `set_tf_threads`).

    Raises:
        ValueError: A format with no runner.
    """
    if spec.format in TF_FORMATS:
        set_tf_threads(threads)
    if spec.format == "graph" and spec.precision == "bfloat16":
        enable_onednn_bfloat16()
    if spec.format in ("keras", "graph"):
        return GraphRunner(spec.path)
    if spec.format == "xla":
        return GraphRunner(spec.path, jit_compile=spec.params.get("xla_mode") == "jit_compile")
    if spec.format == "savedmodel":
        return SavedModelRunner(spec.path)
    if spec.format == "tflite":
        return TFLiteRunner(spec.path, threads)
    if spec.format == "onnx":
        return OnnxRunner(spec.path, threads)
    raise ValueError(f"no runner for format {spec.format!r}")


def predict_batched(runner: Runner, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Run `runner` over `images` in batches and stack the logits."""
    outputs = [
        runner.predict(images[start : start + batch_size])
        for start in range(0, len(images), batch_size)
    ]
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, computed stably."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
