"""The flows' parameters: one pydantic model per flow, shared by the CLI, the UI and schedules.

Every field has a type, a default and a description; bounds and choices are part of the type so
that bad values are refused before any work starts, with a message naming the field. The
sections come from where they are read: the core's (`tfopt.config`), the runtimes' registry
(``convert`` and ``runtimes``, `tfopt.runtimes`) and the techniques' registry (``compress``,
`techniques`). YAML in configs/ validates into the same models (`load_pipeline_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from techniques import CompressConfig
from tfopt.config import (
    BenchmarkConfig,
    DataConfig,
    EvalConfig,
    InputConfig,
    InputScale,
    MachineSettings,
    ScaleConfig,
    Section,
    ServicesConfig,
    TrainConfig,
    experiment_field,
    load_config,
    run_name_field,
)
from tfopt.models.config import APPLICATION_ARCHITECTURES, ModelConfig
from tfopt.runtimes import ConvertConfig, RuntimesConfig, known_formats
from tfopt.schedule.budget import BudgetConfig


def _auto_or_format(value: str) -> str:
    if value != "auto" and value not in known_formats():
        raise ValueError(f"format {value!r} is neither auto nor one a runtime measures "
                         f"({', '.join(sorted(known_formats()))})")
    return value


AUTOMATIC_PLAN: dict[str, Any] = {
    "compress": {
        "channel_prune": {"enabled": True, "fraction": "auto", "epochs": "auto"},
        "depth_prune": {"enabled": True, "share": "auto", "epochs": "auto"},
        "width_depth": {"enabled": True, "fraction": "auto", "share": "auto",
                        "epochs": "auto"},
        "distill": {"enabled": True, "student": "thinner", "require_gain": True,
                    "epochs": 30},
        "qat": {"enabled": True}, "thinned_qat": {"enabled": True},
        "prune": {"enabled": False}, "cluster": {"enabled": False},
        "pqat": {"enabled": False}, "cqat": {"enabled": False},
        "tflite": ["fp32", "int8"], "graph": False,
    },
    "convert": {"onnx_compressed": ["fp32", "int8"]},
    "runtimes": {"openvino": {"compressed": ["int8"]}},
}
"""What a config without a ``compress`` section gets: the techniques that buy time, the
strength of channel and depth pruning searched (each rebuilt model's fine-tuning capped by how
long the baseline trained: a thinner model relearns the data about as long), distillation kept
only where it pays (its cap 30 epochs, so a student still improving is not stopped by the cap:
the budget's share ends it sooner), int8 of every compressed model on every runtime (each key of
``convert`` and ``runtimes`` only where the config does not set it). Width and depth are also
searched together (`techniques.width_depth`: an Optuna sampler's points), once every
fine-tuning has had its turn. Channel pruning's chosen model is also fine-tuned for int8
(`techniques.thinned_qat`) once the searches are done. Depth pruning's search tries removing
every residual block first, then bisects below only after the other searches
(`compress.planner`), so its strongest point is tried before a short budget ends the search
(docs/measurements.md)."""


def _under(config: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """`config` with `plan`'s settings wherever it sets none, key by key at every depth.

    A config's ``convert`` section that names only its TFLite precisions keeps the plan's ONNX
    forms of the compressed models: merged section by section, it lost them.
    """
    merged = dict(config)
    for key, planned in plan.items():
        if key not in merged:
            merged[key] = planned
        elif isinstance(planned, dict) and isinstance(merged[key], dict):
            merged[key] = _under(merged[key], planned)
    return merged


class PipelineConfig(Section):
    """All parameters of one tfopt pipeline run."""

    name: str = run_name_field("demo")
    experiment: str = experiment_field("tfopt", "MLflow experiment to log into.")
    work_dir: Path = Field(
        Path(".tfopt/work"), description="Folder for TFRecords, models and reports."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Data and sharding.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Baseline network.")
    input: InputConfig = Field(default_factory=InputConfig, description="Input pipeline.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Baseline training.")
    compress: CompressConfig = Field(
        default_factory=CompressConfig, description="Pruning, distillation, QAT."
    )
    convert: ConvertConfig = Field(default_factory=ConvertConfig, description="Conversions.")
    runtimes: RuntimesConfig = Field(
        default_factory=RuntimesConfig, description="Each runtime's own settings.")
    benchmark: BenchmarkConfig = Field(
        default_factory=BenchmarkConfig, description="Benchmark protocol."
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description=("What every variant is judged by and may give up: the metric, the output "
                     "it scores, the budget (npz data; image data: accuracy)."),
    )
    scale: ScaleConfig = Field(
        default_factory=ScaleConfig, description="Task runner for the compression techniques."
    )
    services: ServicesConfig = Field(
        default_factory=ServicesConfig, description="Waiting for the servers."
    )
    budget: BudgetConfig = Field(
        default_factory=BudgetConfig, description="How long the whole run may take."
    )

    @model_validator(mode="before")
    @classmethod
    def _automatic_plan(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or "compress" in raw:
            return raw
        return _under(raw, AUTOMATIC_PLAN)

    @model_validator(mode="before")
    @classmethod
    def _validation_resolves_the_budget(cls, raw: Any) -> Any:
        """``val_fraction: auto`` sized for this config's accuracy budget: a quarter of it."""
        if not isinstance(raw, dict):
            return raw
        data, benchmark = raw.get("data") or {}, raw.get("benchmark") or {}
        budget = (benchmark.get("accuracy_budget_points") if isinstance(benchmark, dict)
                  else getattr(benchmark, "accuracy_budget_points", None))
        if not isinstance(budget, int | float) or budget <= 0:
            return raw
        if isinstance(data, dict) and "auto_val_image_points" not in data:
            return {**raw, "data": {**data, "auto_val_image_points": budget / 4.0}}
        if isinstance(data, DataConfig) and "auto_val_image_points" not in data.model_fields_set:
            return {**raw, "data": data.model_copy(update={"auto_val_image_points": budget / 4.0})}
        return raw

    @model_validator(mode="before")
    @classmethod
    def _float_stem_off_without_amx(cls, raw: Any) -> Any:
        """``benchmark.amx`` auto or denied turns ``convert.selective_float_stem`` off unless set.

        The float stem answers AMX's slow int8 first convolution, and its quick timing runs in
        the build's process, which holds AMX: with AMX denied to the measuring processes (set, or
        decided by ``auto`` after the stems are built) that timing would not be theirs.
        """
        if not isinstance(raw, dict):
            return raw
        benchmark, convert = raw.get("benchmark") or {}, raw.get("convert") or {}
        amx = (benchmark.get("amx") if isinstance(benchmark, dict)
               else getattr(benchmark, "amx", None))
        if amx == "allowed":
            return raw
        if isinstance(convert, dict) and "selective_float_stem" not in convert:
            return {**raw, "convert": {**convert, "selective_float_stem": False}}
        if not isinstance(convert, dict) and "selective_float_stem" not in convert.model_fields_set:
            return {**raw, "convert": convert.model_copy(update={"selective_float_stem": False})}
        return raw

    @model_validator(mode="after")
    def _training_fits_the_model_source(self) -> PipelineConfig:
        if self.model.head == "replace" and self.train.epochs + self.train.head_epochs == 0:
            raise ValueError("model.head: replace with train.epochs 0 and train.head_epochs 0 "
                             "leaves the new classification layer untrained")
        if self.train.epochs == 0 and self.model.source != "file":
            raise ValueError(
                f"train.epochs: 0 trains nothing, so model.source={self.model.source} leaves no "
                "model to optimize (epochs 0 is for model.source=file)"
            )
        if not self.data.arrays and self.eval.metric != "accuracy":
            raise ValueError(
                f"eval.metric {self.eval.metric}: image data is trained and judged on top-1 "
                "accuracy; other metrics judge array data (data.source_format: npz, or tfrecord "
                "with data.features)")
        if self.data.arrays and self.model.kind == "keras" and (
                self.model.source != "file" or self.train.epochs):
            raise ValueError(
                "array data: the baseline must be a trained model file (a Keras "
                "file, SavedModel, .tflite or .onnx; model.source: file) taken as it is "
                "(train.epochs: 0); training on arrays is not built yet")
        if self.train.mixed_precision != "off" and self.model.source != "zoo":
            raise ValueError("train.mixed_precision applies to model.source=zoo networks only")
        if (self.model.source == "zoo" and self.model.architecture in APPLICATION_ARCHITECTURES
                and self.data.image_size < 32):
            raise ValueError(
                f"model.architecture {self.model.architecture} needs images of at least 32x32 "
                f"pixels but data.image_size is {self.data.image_size}"
            )
        return self


class PreprocessConfig(Section):
    """Shard a data folder into TFRecords with a manifest, and nothing else."""

    name: str = run_name_field("preprocess")
    experiment: str = experiment_field("tfopt-preprocess")
    work_dir: Path = Field(Path(".tfopt/work"), description="Folder for the TFRecord shards.")
    data: DataConfig = Field(default_factory=DataConfig, description="Data and sharding.")
    scale: ScaleConfig = Field(
        default_factory=ScaleConfig, description="Where the shards are written (Dask or here)."
    )
    services: ServicesConfig = Field(
        default_factory=ServicesConfig, description="Waiting for the servers."
    )


class BenchmarkOnlyConfig(Section):
    """Benchmark one existing model (a registered version or a file) without the pipeline."""

    name: str = run_name_field("benchmark")
    experiment: str = experiment_field("tfopt-benchmarks")
    model: str = Field(
        "models:/tfopt-demo@champion", min_length=1,
        description=(
            "models:/<name>@<alias>, models:/<name>/<version>, runs:/<run id>/<artifact path>, "
            "or a path to a .tflite, .onnx or .keras file or a SavedModel folder."
        ),
    )
    format: Annotated[str, AfterValidator(_auto_or_format)] = Field(
        "auto", description="The model's format: auto (from the file) or a runtime's format "
                            "(graph, xla, savedmodel, tflite, onnx ...)."
    )
    precision: Literal["auto", "fp32", "float16", "dynamic", "int8", "int16x8"] = Field(
        "auto", description="Its precision (auto: the registered run's, else fp32)."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Test data (test split).")
    inputs: str = Field(
        "auto", pattern=r"^(auto|data|random|.+\.npz)$",
        description=(
            "What the model is measured on: data (data.source_dir's test split: accuracy too); "
            "random (inputs generated from the model's signature: any inputs, no data); a path "
            "to an .npz of named inputs (one array per input name, batch first); auto: data "
            "when the model takes one image tensor and data.source_dir is a folder, else "
            "random."
        ),
    )
    shapes: dict[str, list[int]] = Field(
        default_factory=dict,
        description=(
            "The shape of one batch-1 request per input name, for inputs whose dimensions the "
            "model leaves open: {images: [1, 3, 320, 320]} (tfopt benchmark --shape "
            "images=1x3x320x320)."
        ),
    )
    examples: int = Field(32, ge=1, le=10_000,
                          description="Requests generated from the signature (inputs: random).")
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description=("What the model is scored by: the data's labels, an .npz's y (its "
                     "labels or targets), or with eval.metric fidelity the reference's outputs."),
    )
    reference: str | None = Field(
        None, min_length=1,
        description=(
            "A model whose outputs are the truth for eval.metric fidelity (agreement, snr_db, "
            "relative_error): the float model a converted file came from, run on the same "
            "inputs, its outputs matched by name (a path or a models:/ reference)."
        ),
    )
    work_dir: Path = Field(Path(".tfopt/work"), description="Folder for shards and reports.")
    batch_size: int = Field(32, ge=1, le=8192, description="Batch of the throughput figure.")
    input_scale: InputScale = Field(
        "unit", description="Pixels the model expects: unit (0..1), symmetric (-1..1), raw."
    )
    benchmark: BenchmarkConfig = Field(
        default_factory=BenchmarkConfig, description="Benchmark protocol."
    )
    pipeline_run: str | None = Field(
        None, pattern=r"^[0-9a-f]{32}$",
        description=(
            "An optimize_model MLflow run: measure `model` (one of its variants, "
            "runs:/<child run id>/model) on that run's benchmark inputs with its protocol and "
            "log the result as a child run of it, tagged with this machine (`data`, "
            "`batch_size`, `input_scale` and `benchmark` are then taken from that run)."
        ),
    )
    machine: MachineSettings = Field(
        default_factory=MachineSettings,
        description=(
            "This machine's benchmark.* settings (threads, cpus ...), set by its worker "
            "(`tfopt worker --set benchmark.threads=4`): with pipeline_run, they apply on top "
            "of the pipeline's protocol, and the CPUs are checked where the flow runs."
        ),
    )
    services: ServicesConfig = Field(
        default_factory=ServicesConfig, description="Waiting for the servers."
    )


def load_pipeline_config(path: Path | None, overrides: dict[str, object] | None = None,
                         ) -> PipelineConfig:
    """A YAML file (or the defaults) with overrides, validated into `PipelineConfig`.

    Raises:
        ConfigError: The file is missing, is not YAML, or a value is out of range.
    """
    return load_config(path, overrides, PipelineConfig)
