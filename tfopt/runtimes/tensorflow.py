"""TensorFlow: the Keras graph, the serving SavedModel, XLA, and oneDNN's bfloat16 rewrite.

Forms of a tf_keras model: ``graph`` (the model traced with `tf.function`), ``savedmodel`` (the
serving signature reloaded), ``xla`` (``jit_compile=True``) and ``xla-autocluster``
(TensorFlow's auto-clustering, flags set when the measuring process starts), and
``graph-bfloat16`` (Grappler's ``auto_mixed_precision_onednn_bfloat16`` rewrite, where the CPU
has bf16 instructions). A plain SavedModel (no Keras metadata) has the ``savedmodel`` form and
XLA's forms of its signature (no Keras model to trace for the graph or bfloat16 forms).

Operators are profiled with the TensorFlow profiler, FLOPs counted on the Keras layers, and
MLflow packages Keras models with its TensorFlow flavor and SavedModels as a TF2 module.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from tfopt.artifacts import OpProfile, Precision, VariantResult, VariantSpec
from tfopt.cpu_features import bf16_unavailable_reason
from tfopt.measurement.profiles import PROFILED_CALLS, WARMUP_CALLS, top_ops
from tfopt.models.flops import keras_flops
from tfopt.models.serving_export import save_serving_function, save_serving_savedmodel
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
from tfopt.serving import (
    INPUT_NAME,
    OUTPUT_LOGITS,
    SIGNATURE_KEY,
)
from tfopt.variants import built, skipped

XLA_AUTOCLUSTER_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"
_SIGNATURE_PYFUNC = Path(__file__).with_name("_savedmodel_pyfunc.py")
BF16_REWRITE = "auto_mixed_precision_onednn_bfloat16"
PROFILE_METHOD = "TensorFlow profiler: kernel time per call"


class TensorFlowSettings(RuntimeSection):
    """Which TensorFlow forms of the baseline to build: XLA, bfloat16, the HLO dump."""

    xla: list[Literal["jit_compile", "autocluster"]] = Field(
        default_factory=lambda: ["jit_compile", "autocluster"],
        description=(
            "XLA variants: a tf.function with jit_compile=True, and TensorFlow's auto-clustering "
            "(--tf_xla_auto_jit=2)."
        ),
    )
    bfloat16: bool = Field(
        True,
        description=(
            "A bfloat16 form of the Keras graph (oneDNN's automatic bfloat16 mixed precision, "
            "measured in its own process) where the CPU has bf16 instructions (AVX512-BF16, "
            "AMX-BF16); skipped with the reason elsewhere."
        ),
    )
    dump_hlo: bool = Field(False, description="Save the jit-compiled model's HLO as an artifact.")


def set_tf_threads(threads: int) -> None:
    """Size TensorFlow's intra-op and inter-op pools to `threads`.

    TensorFlow fixes its pools when its runtime starts, so this works only before the first
    TensorFlow operation of the process (a fresh benchmark process); afterwards the pools stay
    as they are, and `threads_in_force` says so.
    """
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass


def enable_onednn_bfloat16() -> None:
    """Let Grappler rewrite this process's graphs to bfloat16 where oneDNN has bf16 kernels.

    Process-wide: a bfloat16 variant is measured in a process of its own.
    """
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({BF16_REWRITE: True})


def _info(name: str, shape: object, dtype: object) -> TensorInfo:
    dims = tuple(None if d is None else int(d) for d in list(shape))
    return TensorInfo(name, dims, np.dtype(getattr(dtype, "as_numpy_dtype", dtype)).name)


def _tensor_names(model: Any, side: Literal["input", "output"]) -> list[str]:
    """A Keras model's input or output names (tf_keras names them; Keras 3 names its tensors)."""
    names = getattr(model, f"{side}_names", None)
    return list(names) if names else [t.name for t in getattr(model, f"{side}s")]


class GraphRunner(Runner):
    """A Keras model traced into a TensorFlow graph with `tf.function` (optionally XLA-compiled)."""

    def __init__(self, path: Path, jit_compile: bool = False) -> None:
        import tensorflow as tf

        from tfopt.models.keras_io import load_keras_model

        self._tf = tf
        self.model = model = load_keras_model(path)
        self.inputs = tuple(_info(name, tensor.shape, tensor.dtype) for name, tensor
                            in zip(_tensor_names(model, "input"), model.inputs, strict=True))
        self.outputs = tuple(_info(name, tensor.shape, tensor.dtype) for name, tensor
                             in zip(_tensor_names(model, "output"), model.outputs, strict=True))
        self._call = tf.function(lambda args: model(args, training=False),
                                 jit_compile=jit_compile, reduce_retracing=True)
        self._fetch = [i for i, output in enumerate(self.outputs)
                       if output.name in self.fetched]

    def _args(self, feeds: Mapping[str, Any]) -> object:
        values = [self._tf.convert_to_tensor(feeds[i.name]) for i in self.inputs]
        return values[0] if len(values) == 1 else values

    def _outputs_of(self, result: object) -> list[object]:
        return list(result) if isinstance(result, list | tuple) else [result]

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the traced model on a batch."""
        outputs = self._outputs_of(self._call(self._args(feeds)))
        return {info.name: value.numpy() for info, value in zip(self.outputs, outputs,
                                                                strict=True)}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """Batch-1 tensors."""
        return [self._args(feed) for feed in batch_one(feeds)]

    def invoke(self, prepared: object) -> object:
        """Run the traced model on a prepared tensor and copy the fetched outputs out."""
        outputs = self._outputs_of(self._call(prepared))
        if len(self._fetch) == 1:
            return outputs[self._fetch[0]].numpy()
        return [outputs[i].numpy() for i in self._fetch]

    def hlo_text(self, images: np.ndarray) -> str:
        """The optimized HLO XLA compiles for inputs shaped like `images` (jit_compile only)."""
        compiler_ir = self._call.experimental_get_compiler_ir(self._tf.constant(images))
        return compiler_ir(stage="optimized_hlo")


class SavedModelRunner(Runner):
    """A reloaded SavedModel's ``serving_default`` signature (or its only one).

    With `jit_compile`, the signature is called through a `tf.function` XLA compiles: the XLA
    form of a SavedModel that has no Keras model to trace.
    """

    def __init__(self, path: Path, jit_compile: bool = False) -> None:
        import tensorflow as tf

        self._tf = tf
        self._loaded = tf.saved_model.load(str(path))
        signatures = dict(self._loaded.signatures)
        if not signatures:
            raise ValueError(f"{path} has no serving signature to call")
        self.signature_key = (SIGNATURE_KEY if SIGNATURE_KEY in signatures
                              else sorted(signatures)[0])
        signature = signatures[self.signature_key]
        self._signature = (tf.function(lambda **kwargs: signature(**kwargs), jit_compile=True)
                           if jit_compile else signature)
        specs = signature.structured_input_signature[1]
        self.inputs = tuple(_info(name, spec.shape, spec.dtype)
                            for name, spec in sorted(specs.items()))
        self._dtypes = {name: spec.dtype for name, spec in specs.items()}
        self.outputs = tuple(_info(name, spec.shape, spec.dtype) for name, spec
                             in signature.structured_outputs.items())

    def _kwargs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, object]:
        return {name: self._tf.constant(values, self._dtypes[name])
                for name, values in feeds.items()}

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Call the serving signature on a batch."""
        return {name: value.numpy() for name, value in self._signature(
            **self._kwargs(feeds)).items()}

    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """Batch-1 keyword arguments of the serving signature."""
        return [self._kwargs(feed) for feed in batch_one(feeds)]

    def invoke(self, prepared: object) -> object:
        """Call the serving signature with prepared keyword arguments; fetch its outputs."""
        outputs = self._signature(**prepared)
        fetched = self.fetched
        if len(fetched) == 1:
            return outputs[fetched[0]].numpy()
        return [outputs[name].numpy() for name in fetched]


_TF_KERNEL_EVENT = re.compile(r"^(?P<node>[^\s:]+):(?P<kind>[A-Za-z_][\w]*)$")
"""A TensorFlow executor's kernel event: ``model/layer/Op:OpType``."""
_CALL_KINDS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "XlaLaunch", "_XlaRun"})
"""Kernels that run a nested function or XLA cluster: their inner kernels are counted instead."""
_HLO_NUMBER = re.compile(r"\.\d+$")
"""XLA numbers its instructions (``Conv2D.3``); the kind drops the number."""


def tf_op_profile(invoke: Callable[[object], object], prepared: Sequence[object]) -> OpProfile:
    """Trace `PROFILED_CALLS` calls with the TensorFlow profiler; rank the kernels by time.

    Its XSpace holds one event per executed kernel, named ``node:OpType`` on the executor's
    threads, and for XLA-compiled code one event per HLO instruction or fusion (those carry an
    ``hlo_op`` statistic).
    """
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for index in range(WARMUP_CALLS):
        invoke(prepared[index % len(prepared)])
    with tempfile.TemporaryDirectory(prefix="tfopt-tf-profile-") as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for index in range(PROFILED_CALLS):
                invoke(prepared[index % len(prepared)])
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        for trace in Path(logdir).rglob("*.xplane.pb"):
            space.ParseFromString(trace.read_bytes())
    totals: Counter[tuple[str, str]] = Counter()
    for plane in space.planes:
        hlo_stat = next((key for key, stat in plane.stat_metadata.items()
                         if stat.name == "hlo_op"), None)
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                match = _TF_KERNEL_EVENT.match(name)
                if match and match["kind"] not in _CALL_KINDS:
                    totals[(match["node"], match["kind"])] += event.duration_ps / 1e9
                elif hlo_stat is not None and any(s.metadata_id == hlo_stat for s in event.stats):
                    totals[(name, "XLA " + _HLO_NUMBER.sub("", name))] += event.duration_ps / 1e9
    return OpProfile(method=PROFILE_METHOD, calls=PROFILED_CALLS,
                     ops=top_ops(totals, PROFILED_CALLS, timed=True))


def _floor_keras_model(input_shape: tuple[int, ...]) -> Any:
    """A Keras model returning the first pixel of ``[batch, S, S, C]`` images."""
    import tf_keras as keras

    side, channels = input_shape[0], input_shape[-1]
    inputs = keras.Input(input_shape)
    first_pixel = keras.layers.Cropping2D(((0, side - 1), (0, side - 1)))(inputs)
    flat = keras.layers.Reshape((channels,))(first_pixel)
    return keras.Model(inputs, flat, name="harness_floor")


def floor_savedmodel(input_shape: tuple[int, ...], path: Path) -> Path:
    """The floor model as a serving SavedModel (what the TFLite floor is converted from)."""
    if not (path / "saved_model.pb").exists():
        save_serving_savedmodel(_floor_keras_model(input_shape), input_shape[0], path,
                                channels=input_shape[-1])
    return path


def _is_savedmodel(spec: VariantSpec) -> bool:
    """Whether a form runs a SavedModel's signature: its own, or XLA's of a plain SavedModel."""
    return spec.format == "savedmodel" or (Path(spec.path) / "saved_model.pb").is_file()


class TensorFlow(Runtime):
    """TensorFlow itself: the Keras graph, the SavedModel, XLA and the bfloat16 rewrite."""

    name = "tensorflow"
    formats = frozenset({"graph", "xla", "savedmodel"})
    compiled_formats = frozenset({"xla"})
    compress_keys: ClassVar[Mapping[str, tuple[Any, Any]]] = {
        "graph": (bool, Field(
            default=True,
            description="Also benchmark each compressed Keras model as a TensorFlow graph (the "
                        "baseline's graph, SavedModel and XLA forms are measured regardless).",
        )),
    }

    def compressed_forms(self, settings: TensorFlowSettings,
                         compress: Any) -> dict[str, tuple[str, ...]]:
        """``compress.graph``: every technique's Keras model as a TensorFlow graph."""
        return {"graph": ("fp32",)} if compress.graph else {}
    section = TensorFlowSettings
    home = "convert"
    order = 10

    def plan(self, request: PlanRequest, settings: TensorFlowSettings) -> list[VariantSpec]:
        """Graph, SavedModel, XLA and bfloat16 forms of a Keras model; its SavedModel form."""
        source = request.source
        if request.compressed:
            if "fp32" in (request.asked or {}).get("graph", ()) and request.kind == "keras":
                start = self.variant_name(request.start, "graph", "fp32")
                return [self.variant(source, "graph", derived_from=start)]
            return []
        graph = self.variant(source, "graph")
        served = self.variant(source, "savedmodel", derived_from=graph.name)
        if request.kind not in ("keras", "savedmodel"):
            why = f"model.path is a .{request.kind} file: it is benchmarked as it is"
            return [skipped(graph, why), skipped(self.variant(source, "savedmodel"), why)]
        xla_forms = [self.variant(source, "xla",
                                  form="xla" if mode == "jit_compile" else f"xla-{mode}",
                                  derived_from=graph.name, params={"xla_mode": mode})
                     for mode in settings.xla]
        bf16 = [self.variant(source, "graph", "bfloat16", derived_from=graph.name,
                             params={"rewrite": BF16_REWRITE})] if settings.bfloat16 else []
        if request.kind == "savedmodel":  # XLA compiles its signature (`SavedModelRunner`)
            why = "needs a Keras model; the baseline is a plain SavedModel (its own signature)"
            signature_xla = [x.model_copy(update={"derived_from": served.name}) for x in xla_forms]
            return [skipped(graph, why), served, *signature_xla, *(skipped(x, why) for x in bf16)]
        no_bf16 = bf16_unavailable_reason()
        bf16 = [skipped(x, no_bf16) for x in bf16] if no_bf16 else bf16
        return [graph, served, *xla_forms, *bf16]

    def build(self, spec: VariantSpec, sources: BuildSources,
              settings: TensorFlowSettings) -> VariantSpec:
        """The Keras file is the graph, XLA and bfloat16 forms' file; the SavedModel the other."""
        if spec.format == "savedmodel" or sources.model.format == "savedmodel":
            if sources.savedmodel is None:
                raise ValueError(f"{sources.model.name} has no SavedModel")
            return built(spec, sources.savedmodel.path)
        if settings.dump_hlo and spec.params.get("xla_mode") == "jit_compile":
            sources.out_dir.mkdir(parents=True, exist_ok=True)
            return built(spec, sources.model.path,
                         hlo_path=str(sources.out_dir / f"{spec.name}.hlo.txt"))
        return built(spec, sources.model.path)

    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        """Size TensorFlow's pools, apply the bfloat16 rewrite if asked, open the model."""
        set_tf_threads(threads)
        if spec.precision == "bfloat16":
            enable_onednn_bfloat16()
        jit = spec.format == "xla" and spec.params.get("xla_mode") == "jit_compile"
        if _is_savedmodel(spec):
            return SavedModelRunner(spec.path, jit_compile=jit)
        return GraphRunner(spec.path, jit_compile=jit)

    def import_file(self, path: Path, out_dir: Path, class_names: Sequence[str] = (),
                    output: str = "logits") -> tuple[Path, Precision]:
        """A plain SavedModel re-exported with tfopt's serving signature (``images`` in).

        A softmax's probabilities are served as ``probabilities`` unchanged: the re-exported
        ``logits`` are their logarithm (the softmax of log-probabilities is the probabilities).
        """
        import tensorflow as tf

        runner = SavedModelRunner(path)
        (model_input,) = runner.inputs
        serve = runner._signature
        scores = runner.scores_output
        dtype = runner._dtypes[model_input.name]
        final = out_dir / "baseline-savedmodel"

        def logits_of(images: Any) -> Any:
            found = tf.cast(serve(**{model_input.name: tf.cast(images, dtype)})[scores],
                            tf.float32)
            return tf.math.log(tf.maximum(found, 1e-30)) if output == "softmax" else found

        save_serving_function(runner._loaded, logits_of, int(model_input.shape[1]), final,
                              class_names, int(model_input.shape[-1]))
        return final, "fp32"

    def flops(self, runner: Runner) -> float | None:
        """FLOPs of a Keras model's layers (a bare SavedModel signature is not counted)."""
        return keras_flops(runner.model) if isinstance(runner, GraphRunner) else None

    def op_profile(self, runner: Runner, prepared: Sequence[object],
                   threads: int) -> OpProfile | None:
        """The TensorFlow profiler's kernel times."""
        return tf_op_profile(runner.invoke, prepared)

    def floor_models(self, input_shape: tuple[int, ...], out_dir: Path) -> dict[str, Path]:
        """The floor as a Keras file (graph and XLA forms) and as a serving SavedModel."""
        from tfopt.models.keras_io import save_keras_model

        keras_file = out_dir / "floor.keras"
        if not keras_file.exists():
            save_keras_model(_floor_keras_model(input_shape), keras_file)
        return {"graph": keras_file,
                "savedmodel": floor_savedmodel(input_shape, out_dir / "floor-savedmodel")}

    def floor_format(self, variant_format: str) -> str | None:
        """Graph and XLA forms are timed against the Keras floor, a SavedModel against its own."""
        return "savedmodel" if variant_format == "savedmodel" else "graph"

    def package(self, spec: VariantSpec, contract: ServingContract, metadata: dict,
                dst: Path) -> str:
        """MLflow's TensorFlow flavor: the Keras model, or the SavedModel as a TF2 module."""
        if contract.named:
            return _package_signature(Path(spec.path), contract, metadata, dst)
        example = contract.example.astype(np.float32)
        if _is_savedmodel(spec):
            return _package_savedmodel(Path(spec.path), example, metadata, dst)
        return _package_keras(Path(spec.path), example, metadata, dst)

    def worker_env(self, spec: VariantSpec, env: dict[str, str]) -> dict[str, str]:
        """XLA auto-clustering's flags for that variant's process only."""
        env = {key: value for key, value in env.items() if key != "TF_XLA_FLAGS"}
        if spec.params.get("xla_mode") == "autocluster":
            env["TF_XLA_FLAGS"] = XLA_AUTOCLUSTER_FLAGS
        return env

    def own_process_reason(self, spec: VariantSpec) -> str | None:
        """XLA auto-clustering and the bfloat16 rewrite are process-wide settings."""
        if spec.params.get("xla_mode") == "autocluster":
            return "XLA auto-clustering needs benchmark.isolate=true (process-wide flags)"
        if spec.precision == "bfloat16":
            return ("a bfloat16 variant needs benchmark.isolate=true (a process-wide graph "
                    "rewrite)")
        return None

    def threads_in_force(self) -> tuple[int, int] | None:
        """TensorFlow's intra-op and inter-op pool sizes (0: its default, one per core)."""
        import tensorflow as tf

        return (tf.config.threading.get_intra_op_parallelism_threads(),
                tf.config.threading.get_inter_op_parallelism_threads())

    def extra_files(self, runner: Runner, spec: VariantSpec, images: np.ndarray) -> list[Path]:
        """The optimized HLO of a jit-compiled form, when ``convert.dump_hlo`` asked for it."""
        hlo_path = spec.params.get("hlo_path")
        if not hlo_path or not isinstance(runner, GraphRunner):
            return []
        Path(str(hlo_path)).write_text(runner.hlo_text(images[:1]))
        return [Path(str(hlo_path))]

    def slowdown_reason(self, result: VariantResult) -> str | None:
        """Why XLA, the SavedModel signature or the bfloat16 rewrite can cost time on a CPU."""
        if result.precision == "bfloat16":
            return ("the bfloat16 rewrite adds casts around every converted op; on a small model "
                    "they cost more than bf16 kernels (AVX512-BF16/AMX) save")
        return {
            "xla": "XLA's CPU backend parallelises worse than TensorFlow's own kernels, and "
                   "small models gain little from fusion",
            "savedmodel": "the signature call adds argument flattening and a function call per "
                          "inference",
        }.get(result.format)


def _package_keras(path: Path, example: np.ndarray, metadata: dict, dst: Path) -> str:
    import mlflow.tensorflow

    from tfopt.models.keras_io import flavor_of, load_keras_model

    model = load_keras_model(path)
    signature = mlflow_signature(example, int(model.output_shape[-1]))
    if flavor_of(model) == "keras3":
        import mlflow.keras

        dst.mkdir(parents=True)  # mlflow.keras writes the input example before its folder
        mlflow.keras.save_model(model, str(dst), signature=signature, input_example=example,
                                metadata=metadata,
                                pip_requirements=pinned("tensorflow-cpu", "keras"))
        return "data/model.keras"
    mlflow.tensorflow.save_model(
        model, str(dst), signature=signature,
        input_example=example, metadata=metadata,
        pip_requirements=pinned("tensorflow-cpu", "tf-keras"),
    )
    # MLflow records "tensorflow.keras", which is Keras 3 unless TF_USE_LEGACY_KERAS is set in
    # the loading process; naming tf_keras makes the model load anywhere it is installed.
    (dst / "data" / "keras_module.txt").write_text("tf_keras")
    return "data/model.keras"


def _package_signature(path: Path, contract: ServingContract, metadata: dict, dst: Path) -> str:
    """A pyfunc model calling a plain SavedModel's signature by name (`_SIGNATURE_PYFUNC`)."""
    import mlflow.pyfunc

    runner = SavedModelRunner(path)
    mlflow.pyfunc.save_model(
        str(dst), python_model=str(_SIGNATURE_PYFUNC), artifacts={"savedmodel": str(path)},
        model_config={"signature": runner.signature_key}, signature=named_signature(runner),
        input_example=named_example(contract.example, runner), metadata=metadata,
        pip_requirements=pinned("tensorflow-cpu", "numpy"),
    )
    return f"artifacts/{path.name}"


def _package_savedmodel(path: Path, example: np.ndarray, metadata: dict, dst: Path) -> str:
    import mlflow.tensorflow
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    serve = loaded.signatures[SIGNATURE_KEY]
    spec = serve.structured_input_signature[1][INPUT_NAME]
    images = tf.TensorSpec(spec.shape, spec.dtype, name=INPUT_NAME)
    module = tf.Module()
    module.loaded = loaded
    # MLflow's TF2-module pyfunc calls the module itself; the serving signature stays as it was
    # so the folder benchmarks like any tfopt SavedModel.
    module.__call__ = tf.function(lambda images: serve(images=images)[OUTPUT_LOGITS],
                                  input_signature=[images])
    module.serve = tf.function(lambda images: serve(images=images), input_signature=[images])
    mlflow.tensorflow.save_model(
        module, str(dst), signature=mlflow_signature(example, int(serve.structured_outputs[
            OUTPUT_LOGITS].shape[-1])),
        input_example=example, metadata=metadata,
        saved_model_kwargs={"signatures": {SIGNATURE_KEY: module.serve}},
        pip_requirements=pinned("tensorflow-cpu"),
    )
    return "tf2model"


RUNTIME = TensorFlow()
