"""The runtime contract: what every inference runtime declares, in one module of its own.

A runtime (TensorFlow, LiteRT, ONNX Runtime, ...) is the twin of a compression technique: a
module under ``tfopt/runtimes/`` defines ``RUNTIME = <a Runtime subclass>()`` and the registry
(`tfopt.runtimes.registry`) finds it. The runtime says which variant formats it measures, which
forms it builds from a model (`Runtime.plan`) and how (`Runtime.build`), how it opens a variant
for measuring (`Runtime.load_runner`), and what it offers beyond timing: FLOPs, a per-operator
profile, a floor model for the harness, MLflow packaging, an export bundle. Every method has a
default, so a runtime implements what it has.

Runners are general: named inputs of any shape, dtype and layout taken from the model's
signature, named outputs. A classifier (one image input, a logits output) is one case of it
(`Runner.predict`), not the assumption.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tfopt.artifacts import (
    DatasetArtifact,
    ModelArtifact,
    OpProfile,
    Precision,
    VariantResult,
    VariantSpec,
)
from tfopt.config import EvalConfig, Section
from tfopt.serving import OUTPUT_LOGITS
from tfopt.variants import plan_variant, variant_name

Feeds = Mapping[str, np.ndarray] | np.ndarray
"""A batch of inputs by name, or a classifier's images (its one input)."""


@dataclass(frozen=True)
class TensorInfo:
    """One named input or output of a model: its shape (None where dynamic) and dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str


class Runner(ABC):
    """A model opened in a runtime: named inputs in, named outputs out.

    The benchmark times `invoke` on inputs `prepare` made beforehand, so the timed region holds
    what a serving loop does per request (hand the inputs over, run, read the outputs) and none
    of the harness's own work (quantizing inputs, building dictionaries, converting tensors).
    The timed call fetches the outputs in `fetched`: the logits where the model has an output
    of that name (probabilities follow from them), else every output.

    Attributes:
        inputs: The model's inputs, in signature order.
        outputs: The model's outputs, in signature order.
    """

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    @property
    def fetched(self) -> tuple[str, ...]:
        """The outputs the timed call fetches: ``logits`` if the model has one, else all."""
        names = tuple(output.name for output in self.outputs)
        return (OUTPUT_LOGITS,) if OUTPUT_LOGITS in names else names

    @property
    def scores_output(self) -> str:
        """The classifier's output: the first `fetched` (``logits`` if the model has one)."""
        return self.fetched[0]

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run a batch (any size the model allows) and return every output by name.

        `feeds` names each input's batch; a bare array is a classifier's images (its one
        input). Integer outputs of quantized models come back as floats, with their scales.
        """
        return self._run(self.named(feeds))

    def prepare(self, feeds: Feeds) -> list[object]:
        """One ready-to-run input per example of `feeds` (batch 1), made outside timing."""
        return self._prepare(self.named(feeds))

    @abstractmethod
    def invoke(self, prepared: object) -> object:
        """Run the model on one prepared input and fetch the `fetched` outputs: the timed call."""

    @abstractmethod
    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`run` on named inputs."""

    @abstractmethod
    def _prepare(self, feeds: Mapping[str, np.ndarray]) -> list[object]:
        """`prepare` on named inputs."""

    def named(self, feeds: Feeds) -> Mapping[str, np.ndarray]:
        """`feeds` by input name (a bare array goes to the one image input)."""
        return {self.image_input.name: feeds} if isinstance(feeds, np.ndarray) else feeds

    @property
    def image_input(self) -> TensorInfo:
        """The classifier's one input.

        Raises:
            ValueError: The model takes more than one input.
        """
        if len(self.inputs) != 1:
            raise ValueError(f"the model takes {len(self.inputs)} inputs "
                             f"({', '.join(i.name for i in self.inputs)}), not one image tensor")
        return self.inputs[0]

    def predict(self, images: np.ndarray) -> np.ndarray:
        """A classifier's scores for a batch of images (its one input, its logits output)."""
        return self.run({self.image_input.name: images})[self.scores_output]

    def facts(self) -> dict[str, str]:
        """What the runtime decided on opening the model, recorded with the measurement.

        The inference precision in force, whether every op was accelerated, and the like.
        """
        return {}



def predict_batched(runner: Runner, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Run a classifier over `images` in batches and stack its scores."""
    outputs = [runner.predict(images[start : start + batch_size])
               for start in range(0, len(images), batch_size)]
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def scores_output(names: Iterable[str]) -> str:
    """The output a model is scored on by default, from its output names alone.

    ``logits`` if it has one, else its first: `Runner.scores_output` before the model is opened.
    """
    names = list(names)
    return OUTPUT_LOGITS if OUTPUT_LOGITS in names else names[0]


def outputs_batched(runner: Runner, feeds: Mapping[str, np.ndarray],
                    batch_size: int = 64) -> dict[str, np.ndarray]:
    """Run a model over named feeds in batches, every output stacked by name.

    Batches of 1 where the model's batch dimension is fixed.
    """
    fixed = any(info.shape and info.shape[0] is not None for info in runner.inputs)
    step = 1 if fixed else batch_size
    count = len(next(iter(feeds.values()))) if feeds else 0
    batches = [runner.run({name: values[start : start + step] for name, values in feeds.items()})
               for start in range(0, count, step)]
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]
            } if batches else {}


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, computed stably."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def batch_one(feeds: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Split a batch of named inputs into batch-1 feeds, each array contiguous."""
    count = len(next(iter(feeds.values()))) if feeds else 0
    return [{name: np.ascontiguousarray(values[i : i + 1]) for name, values in feeds.items()}
            for i in range(count)]


class RuntimeSection(Section):
    """A runtime's own settings (its config section: see `Runtime.home`)."""


class ConversionSettings(RuntimeSection):
    """What every runtime's conversions share."""

    calibration_examples: int = Field(
        200, ge=1, le=100_000,
        description="Training examples fed to every int8 converter to calibrate activation "
                    "ranges (the same images for all runtimes).",
    )


@dataclass(frozen=True)
class PlanRequest:
    """What a runtime is asked to plan forms of.

    Attributes:
        source: The model's name (``baseline``, ``pruned-80``): the variants' source.
        kind: The model's format: ``keras`` (a tf_keras model), ``savedmodel``, or a runtime's
            own file format (``tflite``, ``onnx`` ...) given as it is.
        precision: The model's precision (a given ``.tflite`` file may be int8 already).
        start: For a technique's model, the model it was made from: its forms are what these
            derive from. None for a starting point (the baseline).
        asked: For a technique's model, the formats and precisions the technique and the
            ``compress`` section ask for; None for the baseline (the runtime's own settings
            decide).
        sparse: Also the sparse-encoding form of a float file (a pruning technique's model).
    """

    source: str
    kind: str
    precision: Precision = "fp32"
    start: str | None = None
    asked: Mapping[str, tuple[str, ...]] | None = None
    sparse: bool = False

    @property
    def compressed(self) -> bool:
        """Whether the model is a technique's (its forms are the ones `asked` names)."""
        return self.asked is not None


class BuildSources(BaseModel):
    """What a runtime converts a planned variant from.

    Attributes:
        model: The model (a Keras model, a SavedModel, or a runtime's own file).
        savedmodel: Its serving SavedModel, where conversions start (None for a runtime's file).
        dataset: Calibration images (training split) and checks (test and validation splits).
        out_dir: Where the variant's file goes.
        built: The variants of the same model planned before this one, built or not (a
            quantized ONNX file needs the float one), by name.
        calibration_examples: Training images every runtime's int8 calibration sees
            (``convert.calibration_examples``).
        accuracy_budget_points: The run's accuracy budget (accuracy-driven conversions).
        judged_by: The run's metric and its budget (``eval``: an array data set's conversions
            are judged by it; image data's by top-1 within `accuracy_budget_points`).
        threads: The run's benchmark threads (quick latency checks while converting).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelArtifact
    savedmodel: ModelArtifact | None
    dataset: DatasetArtifact
    out_dir: Path
    built: dict[str, VariantSpec] = Field(default_factory=dict)
    calibration_examples: int = 200
    accuracy_budget_points: float = 1.0
    judged_by: EvalConfig = Field(default_factory=EvalConfig)
    threads: int = 1


class SourceNotBuiltError(RuntimeError):
    """A variant converts another variant of the same model, which was not built."""


def required(sources: BuildSources, name: str | None) -> VariantSpec:
    """The built variant `name` a conversion starts from.

    Raises:
        SourceNotBuiltError: It was not built (its status and error named).
    """
    spec = sources.built.get(name or "")
    if spec is None or spec.status != "ok" or spec.path is None:
        why = f": {spec.status}: {spec.error}" if spec is not None else ""
        raise SourceNotBuiltError(f"{name} was not built{why}")
    return spec


@dataclass(frozen=True)
class ServingContract:
    """What every variant of one run takes and answers, for its MLflow model.

    Attributes:
        class_names: The output order (none for a model of array data).
        input_scale: How pixel values are scaled before they reach the model.
        example: A few inputs: images, float32 ``[N, H, W, C]``, already scaled; or a model of
            array data's named inputs (`named`), served by those names, every output answered
            by its name.
        threads: The intra-op threads a runtime that takes them serves with: the count the
            variant was measured at (its run-off pick, else ``benchmark.threads``).
    """

    class_names: Sequence[str]
    input_scale: str
    example: np.ndarray | Mapping[str, np.ndarray]
    threads: int = 1

    @property
    def named(self) -> bool:
        """The model takes named inputs (array data), not a batch of images."""
        return isinstance(self.example, Mapping)


class Runtime(ABC):
    """One inference runtime, declared by its module as ``RUNTIME``.

    Attributes:
        name: Its name (``litert``), also its config section ``runtimes.<name>``.
        formats: The variant formats it measures (``tflite``); a variant's format names its
            runtime, so no two runtimes share one.
        section: Its settings' class (None: no settings).
        home: Where its section lives in the config: ``runtimes`` (``runtimes.<name>``), or
            ``convert`` for the runtimes whose keys predate ``runtimes.*`` (their fields sit
            flat in ``convert``, e.g. ``convert.tflite``).
        order: Its variants' place in a run's table (lower first).
        file_suffixes: Model files it measures as they are, by suffix (``.tflite``), for
            ``model.path`` and ``tfopt benchmark --model``.
        shares_process: Its variants can be timed side by side in one process (the run-off).
        exports: It ships a bundle beside a baseline's variants (`export`).
        main_api: The name of the API `load_runner` opens, where `other_apis` offers others.
        precision_named: Its forms whose names state their precision even at fp32
            (``baseline-tflite-fp32``): each file is converted at a precision of its own.
        compiled_formats: Formats compiled when they are opened (XLA): one step more than the
            model as it is, so a tie goes to the simpler form (`champion.simplicity`).
        compress_keys: Keys it adds to the ``compress`` section, name to (type, Field): where
            the forms of compressed models were asked for before ``runtimes.*`` existed
            (``compress.tflite``, ``compress.graph``; see `compressed_forms`).
    """

    name: ClassVar[str]
    formats: ClassVar[frozenset[str]]
    section: ClassVar[type[RuntimeSection] | None] = None
    home: ClassVar[Literal["convert", "runtimes"]] = "runtimes"
    order: ClassVar[int] = 100
    file_suffixes: ClassVar[Mapping[str, str]] = {}
    shares_process: ClassVar[bool] = False
    exports: ClassVar[bool] = False
    main_api: ClassVar[str] = ""
    precision_named: ClassVar[frozenset[str]] = frozenset()
    compiled_formats: ClassVar[frozenset[str]] = frozenset()
    compress_keys: ClassVar[Mapping[str, tuple[Any, Any]]] = {}

    def compressed_forms(self, settings: Any, compress: Any) -> dict[str, tuple[str, ...]]:
        """The precisions, per format, of its forms of every technique's model (none: empty).

        The config says them where the runtime keeps it: its own section, or for the runtimes
        whose keys predate ``runtimes.*`` the ``compress`` keys it declares (`compress_keys`).
        A technique with precisions of its own (QAT: int8) gets those instead
        (`techniques.base.Technique.request`).
        """
        return {}

    def variant(self, source: str, variant_format: str, precision: Precision = "fp32",
                **fields: Any) -> VariantSpec:
        """One of its forms of the model `source`, named by its rule (see `plan_variant`)."""
        form = fields.get("form") or variant_format
        return plan_variant(source, variant_format, precision,
                            names_precision=form in self.precision_named, **fields)

    def variant_name(self, source: str, form: str, precision: Precision) -> str:
        """The name of its form `form` of the model `source` at `precision`."""
        return variant_name(source, form, precision,
                            names_precision=form in self.precision_named)

    @abstractmethod
    def plan(self, request: PlanRequest, settings: Any) -> list[VariantSpec]:
        """The variants it makes of a model (not built yet; skipped ones with the reason)."""

    def build(self, spec: VariantSpec, sources: BuildSources, settings: Any) -> VariantSpec:
        """Convert the model into the planned variant (its file written under `out_dir`).

        Returns:
            The variant built, or skipped or failed with the reason where the conversion
            decides so itself.
        """
        raise NotImplementedError(f"{self.name} does not build {spec.name}")

    def builds_from(self, spec: VariantSpec) -> str | None:
        """The variant of the same model whose file this one converts (None: the model itself).

        It is built first, and handed over in `BuildSources.built`.
        """
        return None

    def export(self, sources: BuildSources, settings: Any, out_dir: Path) -> Path | None:
        """A bundle to ship beside the variants (e.g. for an engine built elsewhere), or None.

        Called once a baseline's variants are built (`exports` true).
        """
        return None

    @abstractmethod
    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        """Open a variant's file for measuring with `threads` intra-op threads."""

    def other_apis(self, spec: VariantSpec, threads: int = 1) -> dict[str, Runner]:
        """The same file opened through the runtime's other APIs, by API name.

        Each is timed in the same process, with the same protocol and inputs, right after the
        main runner (whose figure stays the variant's ``latency_ms``).
        """
        return {}

    def offline_runner(self, spec: VariantSpec, threads: int = 1) -> Runner | None:
        """The file set up for throughput (the Offline scenario's batches), or None.

        None: the latency runner answers the Offline scenario's batches too.
        """
        return None

    def import_file(self, path: Path, out_dir: Path, class_names: Sequence[str] = (),
                    output: str = "logits") -> tuple[Path, Precision]:
        """Take a user's model file of its format in as the baseline; return it and its precision.

        `output` says what the file's scores are: ``logits``, or ``softmax`` probabilities.

        Raises:
            ValueError: The file is not one this runtime can open.
        """
        raise NotImplementedError(f"{self.name} does not import model files")

    def flops(self, runner: Runner) -> float | None:
        """FLOPs per example of the model a runner holds (None: cannot count)."""
        return None

    def op_profile(self, runner: Runner, prepared: Sequence[object],
                   threads: int) -> OpProfile | None:
        """The runner's top operators, from the runtime's own profiler (None: none)."""
        return None

    def floor_models(self, input_shape: tuple[int, ...], out_dir: Path) -> dict[str, Path]:
        """Models that do next to nothing on inputs of `input_shape`, by the format opening them."""
        return {}

    def floor_format(self, variant_format: str) -> str | None:
        """Which floor model a variant of this format is timed against (a `floor_models` key)."""
        return variant_format

    def package(self, spec: VariantSpec, contract: ServingContract, metadata: dict,
                dst: Path) -> str:
        """Write the variant as an MLflow Model folder `dst`; return its model file inside.

        Raises:
            ValueError: The runtime has no MLflow flavor.
        """
        raise ValueError(f"no MLflow flavor for format {spec.format!r}")

    def worker_env(self, spec: VariantSpec, env: dict[str, str]) -> dict[str, str]:
        """The measuring process's environment for this variant (flags set at process start)."""
        return env

    def own_process_reason(self, spec: VariantSpec) -> str | None:
        """Why a variant must be measured in a process of its own, or None."""
        return None

    def threads_in_force(self) -> tuple[int, int] | None:
        """The runtime's process-wide intra- and inter-op pool sizes, where it has them."""
        return None

    def extra_files(self, runner: Runner, spec: VariantSpec, images: np.ndarray) -> list[Path]:
        """Files a measurement leaves for the run's artifacts (e.g. compiled HLO)."""
        return []

    def read_back(self, spec: VariantSpec) -> dict[str, float]:
        """What survived the conversion in a built variant's file, as metrics (none: empty).

        E.g. the zeros a pruning kept and the values a clustering left in an int8 file's
        kernels: the technique's promise checked in the file that is measured, not in the
        Keras model (`compress_model` adds them to the technique's metrics).

        Raises:
            OSError, ValueError, RuntimeError: The file cannot be read.
        """
        return {}

    def slowdown_reason(self, result: VariantResult) -> str | None:
        """Why this form may come out slower than what it derives from, as commonly seen."""
        return None
