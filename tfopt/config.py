"""The pipeline's parameters: one pydantic model shared by the CLI, the Prefect UI and schedules.

Every field has a type, a default and a description; bounds and choices are part of the type so
that bad values are refused before any work starts, with a message naming the field.
"""

from __future__ import annotations

import os
import tempfile
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)


class Section(BaseModel):
    """A config section: frozen, unknown keys refused, booleans never taken for numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1; `--set train.epochs=true` is a mistake, not one epoch.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _is_numeric(field.annotation):
            raise ValueError(f"a number is expected, not {str(value).lower()}")
        return value


def _is_numeric(annotation: Any) -> bool:
    """Whether a field holds an int or float (alone or optional), not a bool."""
    options = typing.get_args(annotation) or (annotation,)
    return bool not in options and any(option in (int, float) for option in options)


def run_name_field(default: str) -> Any:
    """The `name` field every flow's parameters start with (it names runs and models)."""
    return Field(
        default, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
        description="Short name of this configuration, used in run names.",
    )


def experiment_field(default: str, description: str = "MLflow experiment.") -> Any:
    """The MLflow experiment a flow logs into: a name, never a path (no slashes, no "..")."""
    return Field(
        default, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _:.-]*$",
        description=f"{description} Letters, digits, spaces, '_', ':', '.', '-'; no path.",
    )


AUTO_VAL_SHARES = (0.1, 0.25)
"""The smallest and largest share of the examples ``val_fraction: auto`` takes."""


AUTO_SELECT_MIN_IMAGES = 100
"""``select_fraction: auto`` carves a selection split only when it gets at least this many
images: below that, its per-epoch readings would be too coarse to stop a training on."""


class FeatureSpec(Section):
    """One feature of TFRecords of any model's inputs: its dtype and shape per example."""

    dtype: Literal["float32", "int32", "int64"] = Field(
        description="float32 (a float_list), int64 or int32 (an int64_list, int32 cast from it).")
    shape: list[int] = Field(
        default_factory=list, max_length=8,
        description="Its shape per example, the batch left out ([]: one value).")

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(size < 1 for size in shape):
            raise ValueError(f"every dimension is at least 1, not {shape}")
        return shape


class DataConfig(Section):
    """Where the labelled data comes from and how it is split and sharded."""

    source_dir: Path = Field(
        Path("data/demo"),
        description="Folder with one sub-folder per class holding its images (JPEG, PNG, ...).",
    )
    image_size: int = Field(
        32, ge=8, le=512, description="Images are resized to image_size x image_size pixels."
    )
    val_fraction: float | Literal["auto"] = Field(
        "auto",
        description=(
            "Share of examples in the validation split, where every model's files are judged. "
            "auto: "
            f"enough that one image is at most auto_val_image_points accuracy points (between "
            f"{AUTO_VAL_SHARES[0]} and {AUTO_VAL_SHARES[1]} of the examples; the run says so "
            "when even the largest share cannot resolve it)."
        ),
    )
    auto_val_image_points: float = Field(
        0.25, gt=0.0, le=10.0,
        description=(
            "For val_fraction auto: the accuracy points one validation image may weigh at most. "
            "A pipeline config sets it to a quarter of benchmark.accuracy_budget_points unless "
            "given."
        ),
    )
    test_fraction: float = Field(
        0.2, gt=0.0, le=0.4, description="Share of examples in the test split (benchmarks use it)."
    )
    select_fraction: float | Literal["auto"] = Field(
        "auto",
        description=(
            "Share of examples carved from training into the selection split, which every "
            "training reads during its epochs (best epoch, early stop, batch-norm check), so "
            "the validation split judges each model's files on images no training chose on. "
            "auto: half the validation split's share when that gives at least "
            f"{AUTO_SELECT_MIN_IMAGES} images, else none. 0: trainings read validation."
        ),
    )
    max_examples_per_class: int | None = Field(
        None, ge=1, le=100_000_000,
        description="Use at most this many images per class (None: all of them).",
    )
    shard_size_mb: float = Field(
        100.0, gt=0.0, le=4096.0, description="Target TFRecord shard size in MB (~100 MB is best)."
    )
    compression: Literal["none", "gzip"] = Field(
        "none", description="Compress TFRecord shards (smaller files, more CPU to read)."
    )
    write_workers: int = Field(
        0, ge=0, le=256,
        description=(
            "Processes writing shards in parallel (0: one per core when more than 256 MB is "
            "to be written, else one)."
        ),
    )
    source_format: Literal["image_folder", "tfrecord", "npz"] = Field(
        "image_folder",
        description=(
            "image_folder: <source_dir>/<label>/<image>; tfrecord: *.tfrecord* files of "
            "images; npz: *.npz files of any model's inputs, one array per input name (x for "
            "one input) and optionally y, the labels or targets (docs/own-models.md)."
        ),
    )
    tfrecord_image_key: str = Field(
        "image/encoded", min_length=1,
        description="For tfrecord sources: feature holding the encoded image bytes.",
    )
    tfrecord_label_key: str = Field(
        "image/label", min_length=1,
        description="For tfrecord sources: int64 feature holding the class label.",
    )
    features: dict[str, FeatureSpec] | None = Field(
        None, max_length=64,
        description=(
            "For tfrecord sources of any model's inputs (not images): each feature's dtype and "
            "shape, parsed into arrays named after the features, as npz data is (each input "
            "feature named after the model's input it feeds; x for a model of one). None: "
            "TFRecords of images (tfrecord_image_key, tfrecord_label_key)."
        ),
    )
    label_feature: str | None = Field(
        None, min_length=1, max_length=200,
        description="With features: the one holding the labels or targets (y); None: no labels.",
    )

    @model_validator(mode="after")
    def _splits_leave_training_data(self) -> DataConfig:
        if self.source_format != "image_folder" and self.max_examples_per_class is not None:
            raise ValueError("max_examples_per_class applies to image_folder sources only")
        if self.features is not None and self.source_format != "tfrecord":
            raise ValueError("features describe tfrecord sources (source_format: tfrecord)")
        if self.label_feature is not None and self.label_feature not in (self.features or {}):
            raise ValueError(f"label_feature {self.label_feature!r} is not one of the features "
                             f"({', '.join(self.features or {}) or 'none given'})")
        if self.features is not None:
            inputs = [name for name in self.features if name != self.label_feature]
            if not inputs:
                raise ValueError("features: name at least one input feature besides the label")
            if "y" in inputs:
                raise ValueError("features: y is the labels' name; set label_feature: y, or "
                                 "rename that input")
        if self.val_fraction != "auto" and not 0.0 <= self.val_fraction <= 0.4:
            raise ValueError("val_fraction must be auto or between 0 and 0.4")
        if self.select_fraction != "auto" and not 0.0 <= self.select_fraction <= 0.2:
            raise ValueError("select_fraction must be auto or between 0 and 0.2")
        if max(self.val_share(n) + self.select_share(n) for n in (1, 1_000_000)) \
                + self.test_fraction >= 0.8:
            raise ValueError("val_fraction + select_fraction + test_fraction must be below 0.8")
        return self

    @property
    def arrays(self) -> bool:
        """Any model's data (npz, or TFRecords of `features`), not labelled images."""
        return self.source_format == "npz" or self.features is not None

    def val_share(self, examples: int) -> float:
        """The validation split's share of `examples` listed (`val_fraction`, auto resolved)."""
        if self.val_fraction != "auto":
            return self.val_fraction
        needed = 100.0 / self.auto_val_image_points
        low, high = AUTO_VAL_SHARES
        return round(min(high, max(low, needed / max(examples, 1))), 4)

    def select_share(self, examples: int) -> float:
        """The selection split's share of `examples` listed (`select_fraction`, auto resolved)."""
        if self.select_fraction != "auto":
            return self.select_fraction
        share = round(self.val_share(examples) / 2, 4)
        return share if share * examples >= AUTO_SELECT_MIN_IMAGES else 0.0

    def val_note(self, examples: int) -> str | None:
        """Why the validation split cannot resolve `auto_val_image_points` (None: it can)."""
        share = self.val_share(examples)
        images = share * examples
        if self.val_fraction != "auto" or images * self.auto_val_image_points >= 100.0 - 1e-9:
            return None
        return (f"data.val_fraction auto: {examples} examples give a validation split of about "
                f"{images:.0f} images at the largest share ({share:g}): one image is "
                f"{100.0 / max(images, 1.0):.2f} accuracy points, more than "
                f"{self.auto_val_image_points:g}; verdicts within the budget are coarse")


InputScale = Literal["unit", "symmetric", "raw"]
"""Pixels a model expects: unit (0..1), symmetric (-1..1) or raw (0..255)."""


class TrainConfig(Section):
    """How the baseline is trained."""

    epochs: int = Field(
        50, ge=0, le=1000,
        description=(
            "The most training epochs (with stop: plateau training usually ends before; 0: "
            "optimize a model.source=file model as it is)."
        ),
    )
    stop: Literal["plateau", "fixed"] = Field(
        "plateau",
        description=(
            "plateau: train until the held-out accuracy stops improving (by min_delta for "
            "patience epochs, nor holds while the held-out loss falls 1% below its best; the "
            "learning rate is halved after half of them), then take the "
            "rate down to zero over cool_down_epochs, keeping the best epoch, and train further "
            "when a compressed child beats it; fixed: train all "
            "train.epochs, and no further."
        ),
    )
    patience: int = Field(
        4, ge=1, le=100,
        description="stop: plateau: epochs without a gain of min_delta before training ends.",
    )
    min_delta: float = Field(
        0.002, ge=0.0, le=1.0,
        description="stop: plateau: the smallest held-out accuracy gain that counts (0.002: "
                    "0.2 points).",
    )
    cool_down_epochs: int = Field(
        3, ge=0, le=100,
        description=("stop: plateau: epochs that take the learning rate straight down to zero "
                     "once the plateau is reached, before training ends (0: it ends there)."),
    )
    head_epochs: int = Field(
        3, ge=0, le=1000,
        description=("model.head=replace: epochs that train the new classification layer alone "
                     "(the rest frozen), before train.epochs fine-tune everything."),
    )
    mixed_precision: Literal["off", "mixed_float16", "mixed_bfloat16"] = Field(
        "off",
        description=(
            "Keras mixed-precision policy for training (mixed_bfloat16 runs on CPUs with bf16 "
            "support; mixed_float16 wants a GPU). The logits layer stays float32."
        ),
    )
    batch_size: int | None = Field(
        None, ge=1, le=8192,
        description="Training batch size; null: the batch-size sweep's choice.",
    )
    learning_rate: float = Field(
        2e-3, gt=0.0, le=1.0, description="Adam learning rate for the baseline."
    )
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Seed for weights, shuffling and splits.")
    distribute: Literal["none", "mirrored", "multi_worker"] = Field(
        "none",
        description=(
            "tf.distribute strategy for baseline training: mirrored replicates the model on "
            "every local GPU (one CPU replica without GPUs); multi_worker trains it with "
            "MultiWorkerMirroredStrategy on `workers` worker processes of this machine."
        ),
    )
    workers: int = Field(
        2, ge=2, le=64,
        description="Worker processes of a multi_worker training (each with its TF_CONFIG).",
    )
    loss: str | None = Field(
        None,
        description=(
            "The loss a model of array data is fine-tuned with by the techniques: a Keras loss "
            "name (mse, mae, huber, binary_crossentropy, sparse_categorical_crossentropy...); "
            "null: the loss its Keras file was compiled with."
        ),
    )


class InputConfig(Section):
    """The tuned tf.data pipeline and the measurements that tune it."""

    cache_budget_mb: float = Field(
        1024.0, ge=0.0, le=1_000_000.0,
        description=(
            "Memory the input cache may take: decoded images are cached when they fit, else "
            "the encoded records when they fit, else nothing."
        ),
    )
    deterministic: bool = Field(
        False, description="Keep a fixed element order (reproducible, slower in parallel)."
    )
    random_crop_min_area: float = Field(
        0.85, ge=0.1, le=1.0,
        description=(
            "Training crops: the smallest share of the image a random crop keeps, decoded with "
            "the fused decode_and_crop_jpeg (1.0: no crops)."
        ),
    )
    interleave_cycle: int = Field(
        0, ge=0, le=256, description="Shard readers working at once (0: one per core)."
    )
    private_threads: int = Field(
        0, ge=0, le=256, description="Threads of the pipeline's own pool (0: TensorFlow's)."
    )
    measure_passes: int = Field(
        3, ge=1, le=100,
        description="Passes (epochs) over the training shards per reader measured.",
    )
    sweep_batch_sizes: list[Annotated[int, Field(ge=1, le=65_536)]] = Field(
        default_factory=lambda: [16, 32, 64, 128, 256],
        description="Batch sizes the sweep measures (train-step throughput, latency, memory).",
    )
    sweep_steps: int = Field(20, ge=2, le=10_000, description="Timed train steps per batch size.")
    sweep_tolerance: float = Field(
        0.05, ge=0.0, le=1.0,
        description="Rule: the smallest batch within this share of the best throughput ...",
    )
    memory_budget_mb: float = Field(
        8192.0, gt=0.0, le=10_000_000.0,
        description="... whose training step's extra memory stays within this budget ...",
    )
    min_steps_per_epoch: int = Field(
        20, ge=1, le=1_000_000,
        description="... and that leaves at least this many steps per epoch (small data sets).",
    )
    measure_layouts: bool = Field(
        True, description="Measure NHWC and NCHW training steps and record the faster."
    )


class MeasurementProtocol(Section):
    """How every variant is timed: the same protocol for all of them, on any machine.

    What a measuring process needs (`tfopt.measurement`), what a pipeline shares with the
    machines that repeat its measurements, and what a machine may set for itself
    (`MachineSettings`).
    """

    warmup_runs: int = Field(
        20, ge=1, le=10_000, description="Untimed runs before measuring (excluded)."
    )

    warmup_seconds: float = Field(
        0.5, ge=0.0, le=600.0, description="... and at least this long of warm-up."
    )

    min_runs: int = Field(200, ge=5, le=1_000_000, description="Timed batch-1 runs at least.")
    min_seconds: float = Field(
        2.0, ge=0.0, le=3600.0, description="Keep timing for at least this long."
    )

    max_seconds: float = Field(
        10.0, gt=0.0, le=3600.0,
        description="Stop timing a variant after this long, even if its p50 has not settled.",
    )

    p50_ci_width: float = Field(
        0.03, gt=0.0, le=1.0,
        description=(
            "Keep timing until the p50's 95% interval (the medians of 6 consecutive windows) "
            "lies within +-this share of the p50; a variant that never gets there within "
            "max_seconds is marked unstable."
        ),
    )

    threads: int = Field(
        2, ge=1, le=256,
        description="Intra-op threads every runtime measures with (TensorFlow, LiteRT, ONNX "
                    "Runtime, OpenVINO).",
    )

    thread_sweep: bool = Field(
        False,
        description=(
            "Also time each ok variant at 1..threads threads (batch-1 p50 per thread count, "
            "one more measurement each) and plot how it scales."
        ),
    )

    isolate: bool = Field(
        True,
        description=(
            "Measure each variant in its own process (peak memory per variant, XLA "
            "auto-clustering flags, a crash cannot take the run down)."
        ),
    )

    time_limit_seconds: float = Field(
        900.0, gt=0, le=86_400,
        description=(
            "Longest a variant's measuring process may run (load, timing, load scenarios, "
            "profile): past it the process is stopped and the variant fails with that reason; "
            "the others go on."
        ),
    )

    scenarios: list[Literal["single_stream", "offline", "server"]] = Field(
        default_factory=lambda: ["single_stream"],
        description=(
            "MLPerf LoadGen scenarios measured per variant: single_stream (batch-1 latency, "
            "always), offline (best examples/s over batch sizes), server (Poisson arrivals "
            "from concurrent clients; the highest rate whose p99 meets latency_budget_ms)."
        ),
    )

    latency_budget_ms: float | None = Field(
        None, gt=0.0, le=600_000.0,
        description="The p99 a Server-scenario rate must meet (needed by the server scenario).",
    )

    server_clients: int = Field(
        2, ge=1, le=256,
        description="Concurrent clients of the server scenario (one runtime instance each).",
    )

    scenario_seconds: float = Field(
        1.0, gt=0.0, le=600.0,
        description="Minimum duration of each LoadGen run (every server search trial is one).",
    )

    max_background_cores: float = Field(
        0.5, gt=0.0, le=1024.0,
        description=(
            "A variant timed while other processes kept more cores than this busy (just before "
            "or during its timing) is measured once more, and marked under_load if it still is."
        ),
    )

    cpus: list[int] | None = Field(
        None, min_length=1, max_length=1024,
        description=("Pin the measuring process to these CPU numbers; negative ones count from "
                     "the last CPU available (-1: the last; null: no pinning)."),
    )

    amx: Literal["auto", "allowed", "denied"] = Field(
        "auto",
        description=(
            "denied: every measuring process starts with AMX refused to it (a seccomp filter on "
            "the kernel's AMX permission request), so XNNPACK and the other runtimes use their "
            "AVX-512 kernels, as a serving process that calls tfopt.cpu_features.deny_amx() "
            "first would: where XNNPACK's int8 kernels on AMX tiles are slower than its AVX-512 "
            "ones (docs/limits.md). auto: on a CPU with AMX, the baseline's int8 TFLite file is "
            "timed in processes with AMX allowed and denied, alternating, and AMX is denied unless "
            "that file runs at least 15% faster with it (the summary's amx_decision says "
            "what was measured); elsewhere allowed. auto and denied also turn "
            "convert.selective_float_stem off unless set (its quick timing runs with AMX)."
        ),
    )

    profile: bool = Field(
        True,
        description=(
            "Also profile each variant's operators and time it through its runtime's other "
            "APIs (a run short of its time budget turns this off)."
        ),
    )
    share_inputs: bool = Field(
        True,
        description=(
            "Log the decoded test split and this protocol to the pipeline's MLflow run, so "
            "`tfopt benchmark --run` can measure its variants on other machines (the split is "
            "stored as float32 arrays: large for big images or test sets)."
        ),
    )

    @model_validator(mode="after")
    def _server_has_a_budget(self) -> MeasurementProtocol:
        if "server" in self.scenarios and self.latency_budget_ms is None:
            raise ValueError("the server scenario needs benchmark.latency_budget_ms (the p99 "
                             "its rate must meet)")
        return self

    @model_validator(mode="after")
    def _amx_denied_in_a_process_of_its_own(self) -> MeasurementProtocol:
        if self.amx == "denied" and not self.isolate:
            raise ValueError("benchmark.amx: denied needs benchmark.isolate=true (AMX is refused "
                             "to the measuring process for its whole life)")
        return self

    @field_validator("cpus")
    @classmethod
    def _cpus_once_each(cls, cpus: list[int] | None) -> list[int] | None:
        if cpus is not None and len(set(cpus)) != len(cpus):
            raise ValueError(f"CPUs {cpus} name a CPU twice")
        return cpus

    def as_protocol(self) -> MeasurementProtocol:
        """These settings as a plain protocol (a `BenchmarkConfig`'s without its policy)."""
        return MeasurementProtocol.of(self.model_dump(mode="json"))

    @staticmethod
    def of(settings: dict[str, Any]) -> MeasurementProtocol:
        """The protocol among `settings` (a whole ``benchmark`` section's keys are fine)."""
        return MeasurementProtocol.model_validate(
            {key: value for key, value in settings.items()
             if key in MeasurementProtocol.model_fields})


class ChampionPolicy(Section):
    """Which variant wins: the objective, the accuracy budget, the run-off, its registration."""

    objective: Literal["p50", "p90", "p99", "mean", "throughput", "size",
                       "throughput_under_budget"] = Field(
        "p50",
        description=(
            "What the champion is best at: batch-1 latency statistic, throughput, size, or the "
            "highest Server rate within latency_budget_ms (needs the server scenario)."
        ),
    )

    accuracy_budget_points: float = Field(
        1.0, ge=0.0, le=100.0,
        description="A champion may lose at most this many accuracy points to the baseline.",
    )

    runoff_margin: float | None = Field(
        1.0, ge=0.0, le=10.0,
        description=(
            "On the p50 objective, the LiteRT and ONNX Runtime variants within this share of "
            "the fastest eligible one, with baseline-tflite-int8 and the baseline forms their "
            "speed-ups are quoted against (at most 5, the slowest giving way), are timed again "
            "side by side, in 12 rounds that alternate between them in one process, and the "
            "champion is chosen among them on those figures: a machine whose speed drifts "
            "between variants' turns cannot pick it. 1.0 (twice the fastest): a turn can read "
            "nearly 2x slow on a VM whose second vCPU stalls. null: no run-off."
        ),
    )

    runoff_threads: Literal["fastest", "benchmark"] = Field(
        "fastest",
        description=(
            "fastest: the run-off times each contender at 1, 2, 4, ... up to threads intra-op "
            "threads, every count in the same alternating rounds, and quotes each at its "
            "fastest count, the count its packaged model serves with: each speed-up compares "
            "files at the threads a deployer would give each. benchmark: all at threads."
        ),
    )
    register_champion: bool = Field(
        True, description="Register the champion in the MLflow model registry (alias champion)."
    )
    regression_min_change: float | None = Field(
        None, ge=0.0, le=10.0,
        description=(
            "The smallest slowdown since the last run that is timed again side by side and "
            "flagged when it holds (0.1: 10%); null: each variant's own run-to-run spread "
            "over its last runs, at least 5%."
        ),
    )


class BenchmarkConfig(ChampionPolicy, MeasurementProtocol):
    """How every variant is measured (`MeasurementProtocol`) and which one wins (`ChampionPolicy`).

    One config section, ``benchmark``: its keys are both parts' fields.
    """

    @model_validator(mode="after")
    def _objective_is_measured(self) -> BenchmarkConfig:
        if self.objective == "throughput_under_budget" and "server" not in self.scenarios:
            raise ValueError("objective throughput_under_budget needs 'server' in "
                             "benchmark.scenarios")
        return self


RELATIVE_BUDGET = 0.01
"""A metric that is no share (MAE, RMSE, a user's) may by default give up 1% of the baseline's
figure (`EvalConfig.budget`)."""


class EvalConfig(Section):
    """What a model is judged by: its metric (`tfopt.eval.metrics`), on which of its outputs."""

    metric: str = Field(
        "accuracy", min_length=1, max_length=300,
        pattern=r"^([a-z0-9_]+|[A-Za-z0-9_./ -]+\.py:[A-Za-z_][A-Za-z0-9_]*"
                r"|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$",
        description=(
            "accuracy (top-1), top5 (any top<k>), mae, rmse, mean_iou, auc; fidelity (against "
            "the reference model's own outputs, no labels: top-1 agreement for an image "
            "classifier, snr_db for other models' tensors; or agreement, snr_db, "
            "relative_error by name); or your "
            "function 'my_metrics.py:score' ((y_true, y_pred) -> float; set higher_is_better)."
        ),
    )
    higher_is_better: bool | None = Field(
        None, description="Your function's direction (a built-in metric knows its own).")
    output: str | None = Field(
        None, min_length=1, max_length=200,
        description="The model output the metric scores (default: logits, else the first).",
    )
    budget: float | None = Field(
        None, ge=0.0, le=1e12,
        description=(
            "What a variant may give up of the baseline's figure, in the metric's units (0.02: "
            "2 points of a share such as accuracy; 5.0 of an MAE), or with budget_relative a "
            "share of the baseline's figure. None: benchmark.accuracy_budget_points for a share "
            f"(accuracy, top-k, IoU, AUC), else {100 * RELATIVE_BUDGET:g}% of the baseline's "
            "figure. For snr_db and relative_error (fidelity: against the baseline's own "
            "outputs, its figure their cap) the worst figure a variant keeps: 30 (dB) by "
            "default, 0.03 for relative_error."
        ),
    )
    budget_relative: bool = Field(
        False, description="eval.budget is a share of the baseline's figure (0.01: 1%).")

    @model_validator(mode="after")
    def _a_metric_that_exists(self) -> EvalConfig:
        from tfopt.eval.metrics import FIDELITY, built_in

        found = built_in(self.metric)
        if found is not None:
            if self.higher_is_better is not None:
                raise ValueError(f"eval.higher_is_better: {self.metric} knows its direction; "
                                 "leave it unset")
        elif ":" not in self.metric:
            raise ValueError(f"eval.metric: {self.metric!r} is no built-in metric (accuracy, "
                             "top5, mae, rmse, mean_iou, auc, fidelity, agreement, snr_db, "
                             "relative_error) nor 'file.py:function'")
        elif self.higher_is_better is None:
            raise ValueError(f"eval.higher_is_better: say whether a higher {self.metric} is "
                             "better (true or false)")
        if self.budget_relative and self.budget is None:
            raise ValueError("eval.budget_relative: set eval.budget too (0.01: 1% of the "
                             "baseline's figure)")
        # fidelity is the SNR for tensors: a bound too
        bounded = self.metric == FIDELITY or (found is not None and found.bound is not None)
        if self.budget_relative and bounded:
            raise ValueError(f"eval.budget_relative: a budget on {self.metric} is the worst "
                             "figure a variant keeps (eval.budget: 30 for 30 dB), not a share "
                             "of the baseline's (its own outputs: the metric's cap)")
        return self

    def metric_budget(self, accuracy_points: float, class_scores: bool = True) -> Any:
        """The `tfopt.eval.metrics.MetricBudget` a variant is judged within (see `budget`)."""
        from tfopt.eval.metrics import MetricBudget

        metric = self.resolve(class_scores)
        if metric.bound is not None:
            return MetricBudget(metric, metric.bound if self.budget is None else self.budget,
                                bound=True)
        if self.budget is not None:
            return MetricBudget(metric, self.budget, self.budget_relative)
        if metric.unit == "share":
            return MetricBudget(metric, accuracy_points / 100.0)
        return MetricBudget(metric, RELATIVE_BUDGET, relative=True)

    def settled(self, accuracy_points: float, class_scores: bool = True) -> EvalConfig:
        """This section with its budget as `metric_budget` resolves it, made explicit.

        What travels with a run's data to the steps that do not know
        ``benchmark.accuracy_budget_points`` (a fine-tuning's recovery on array data).
        """
        budget = self.metric_budget(accuracy_points, class_scores)
        return self.model_copy(update={"budget": budget.amount,
                                       "budget_relative": budget.relative})

    def resolve(self, class_scores: bool = True) -> Any:
        """The `tfopt.eval.metrics.Metric` (a user's function imported now).

        ``fidelity`` is top-1 agreement on `class_scores` (an image classifier's), else the
        SNR of the outputs against the reference's.

        Raises:
            tfopt.eval.metrics.MetricError: The user's function cannot be loaded (one line).
        """
        from tfopt.eval.metrics import metric_named

        return metric_named(self.metric, self.higher_is_better, class_scores=class_scores)


def _optional(info: Any) -> tuple[Any, Any]:
    """A protocol field as a machine's optional setting: the same bounds, None when unset."""
    annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return annotation | None, Field(None, description=info.description)


class _MachineSection(Section):
    @model_validator(mode="before")
    @classmethod
    def _only_protocol_keys(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            unknown = sorted(set(raw) - set(MeasurementProtocol.model_fields))
            if unknown:
                raise ValueError(f"{', '.join(unknown)} are not benchmark settings a machine "
                                 f"sets (those are: {', '.join(MeasurementProtocol.model_fields)})")
        return raw


MachineSettings = create_model(
    "MachineSettings", __base__=_MachineSection, __module__=__name__,
    __doc__="One machine's own benchmark settings (threads, CPUs ...): unset ones are the "
            "pipeline's.",
    **{name: _optional(info) for name, info in MeasurementProtocol.model_fields.items()})


def resolve_cpus(cpus: list[int] | None) -> list[int] | None:
    """`benchmark.cpus` as CPU numbers of this machine (negative ones count from the last).

    CPU numbers belong to the machine that measures: a protocol is validated anywhere, its
    CPUs are checked here, where the measuring process will be pinned.

    Raises:
        ConfigError: A CPU this process may not run on, naming the ones it may.
    """
    if cpus is None:
        return None
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    resolved = {available[cpu] if -len(available) <= cpu < 0 else cpu for cpu in cpus}
    missing = sorted(resolved - set(available))
    if missing:
        raise ConfigError(f"benchmark.cpus: CPUs {missing} are not available on this machine "
                          f"(available: {available})")
    return sorted(resolved)


class ScaleConfig(Section):
    """Where the TFRecord shards are written and the compression techniques run."""

    task_runner: Literal["sequential", "dask"] = Field(
        "sequential",
        description=(
            "sequential: in the flow's process (shards in parallel processes when the data is "
            "large); dask: shards and compression techniques fanned out to Dask worker "
            "processes (benchmarks stay serialized by the machine's tfopt-benchmark-<host> limit)."
        ),
    )
    dask_address: str | None = Field(
        None,
        description="Address of a running Dask scheduler (tcp://host:8786); null: a local cluster.",
    )
    dask_workers: int = Field(
        2, ge=1, le=256, description="Worker processes of the local Dask cluster."
    )


class ServicesConfig(Section):
    """How tfopt treats its Prefect and MLflow servers."""

    retry_seconds: float | None = Field(
        None, gt=0, le=3600,
        description=(
            "How long a request to MLflow is retried before the run stops with an error naming "
            "the server (null: TFOPT_SERVICE_RETRY_SECONDS, else 60)."
        ),
    )


ConfigT = TypeVar("ConfigT", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration file that cannot be read or does not validate."""


def load_config(
    path: Path | None,
    overrides: dict[str, object] | None,
    schema: type[ConfigT],
) -> ConfigT:
    """Read a YAML file (or nothing) and validate it, with overrides, into `schema`.

    Args:
        path: YAML file whose keys mirror the schema's fields; None: start from the defaults.
        overrides: Dotted keys (``"train.epochs"``) replacing values from the file.
        schema: The flow's parameter model (`PipelineConfig`, `BenchmarkOnlyConfig` ...).

    Returns:
        The validated configuration.

    Raises:
        ConfigError: The file is missing, is not YAML, or a value is out of range.
    """
    raw = _read_mapping(path) if path is not None else {}
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    try:
        return schema.model_validate(raw)
    except ValidationError as error:
        details = describe_validation_error(error)
        where = f"config {path}" if path is not None else "the parameters"
        joined = f" {details.strip()}" if "\n" not in details else f"\n{details}"
        raise ConfigError(f"{where} is invalid:{joined}") from error


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config {path} is not valid YAML: {error}") from error
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping of fields, not {type(raw).__name__}")
    return raw


def check_writable(work: Path) -> None:
    """Refuse a work folder that cannot be written, without creating it.

    An existing folder gets a probe file of this process's own (two runs starting together must
    not share one), removed at once; a folder still to be made needs its nearest existing
    parent to be a writable folder.

    Raises:
        ConfigError: Naming the folder and why.
    """
    existing = next((p for p in (work, *work.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise ConfigError(f"work_dir: {work} cannot be made: {existing} is not a folder")
    if existing != work:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"work_dir: {work} cannot be made: {existing} is not writable")
        return
    try:
        with tempfile.NamedTemporaryFile(dir=work, prefix=".tfopt-write-probe-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"work_dir: {work} is not a writable folder ({error.strerror or error})"
        ) from error


_UNION_MEMBER = ("-", "[", "'")
"""Marks of the parts pydantic adds to an error's location for a union's members
(``constrained-float``, ``literal['auto']``): not fields."""


def describe_validation_error(error: ValidationError) -> str:
    """Turn a pydantic error into one line per bad field: where, what was given, what is allowed.

    A value refused by each member of a union (a number or ``auto``) is one line: what each
    member allows, joined by "or".
    """
    fields: dict[str, tuple[list[str], str]] = {}
    for item in error.errors():
        parts = [str(part) for part in item["loc"]
                 if not (isinstance(part, str) and any(mark in part for mark in _UNION_MEMBER))]
        field = ".".join(parts) or "(root)"
        given = item.get("input")
        shown = "" if isinstance(given, dict) else f" (got {given!r})"
        messages, _ = fields.setdefault(field, ([], shown))
        if item["msg"] not in messages:
            messages.append(item["msg"])
    return "\n".join(f"  {field}: {', or '.join(messages)}{shown}"
                     for field, (messages, shown) in fields.items())


def _set_dotted(tree: dict, dotted: str, value: object) -> None:
    """Set ``a.b.c`` in a nested mapping.

    Raises:
        ConfigError: An empty part, or a part that is a value rather than a section.
    """
    *parents, leaf = dotted.split(".")
    if not all([*parents, leaf]):
        raise ConfigError(f"--set {dotted}: empty key part (write section.key=value)")
    for depth, key in enumerate(parents):
        tree = tree.setdefault(key, {})
        if not isinstance(tree, dict):
            section = ".".join(parents[: depth + 1])
            raise ConfigError(f"--set {dotted}: {section} is a value ({tree!r}), not a section "
                              "with keys")
    tree[leaf] = value
