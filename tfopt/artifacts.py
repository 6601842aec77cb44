"""Small frozen results that tasks return and flows pass on: paths and metrics, never live objects.

Prefect persists task results and caps parameters at 512 KB, so a task hands over where its
output lies on disk and what it measured, not a Keras model or a tf.data pipeline.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tfopt.config import EvalConfig, InputConfig, InputScale

VariantFormat = str
"""A variant's format: the one the runtime that measures it declares (`Runtime.formats`);
checked where variants are planned, at the runtimes' registry (`tfopt.runtimes.plan_variant`)."""
ModelFormat = str
"""A model's format: ``keras`` (a Keras model) or a variant format."""
Precision = Literal["fp32", "float16", "bfloat16", "dynamic", "int8", "int16x8"]
Status = Literal["ok", "failed", "skipped"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SplitInfo(_Frozen):
    """One split of a sharded data set."""

    files: list[Path]
    examples: int
    class_counts: dict[str, int]
    bytes: int = 0


class ArraySpec(_Frozen):
    """One array of an array data set (`tfopt.data.arrays`): its dtype and one example's shape."""

    dtype: str
    shape: list[int]


class DatasetArtifact(_Frozen):
    """A sharded TFRecord data set and its manifest."""

    root: Path
    manifest_path: Path
    class_names: list[str]
    image_size: int
    splits: dict[str, SplitInfo]
    shards: int
    skipped_records: int
    compression: str = ""
    channels: int = 3
    """The channels readers hand the model (the shards hold RGB; 1 is converted to grayscale):
    the model's input decides (`tfopt.models.inspection`)."""
    arrays: dict[str, ArraySpec] = Field(default_factory=dict)
    """An array data set's arrays by name, the labels or targets (``y``) among them; empty for
    images (`tfopt.data.arrays`)."""

    @property
    def num_classes(self) -> int:
        """Number of labels."""
        return len(self.class_names)

    def examples(self, split: str) -> int:
        """The examples of `split` (0 for a split this data set does not have)."""
        info = self.splits.get(split)
        return info.examples if info is not None else 0

    @property
    def selection_split(self) -> str:
        """The split trainings choose on during their epochs.

        ``select`` where the data set has one (``data.select_fraction``), else ``val``.
        """
        return "select" if self.examples("select") else "val"


class TrialRef(_Frozen):
    """A search trial a fine-tuning reports its validation curve to (`tfopt.search`)."""

    storage: str
    study: str
    number: int
    trial_id: int


class LearnedCosts(_Frozen):
    """What each technique's runs took, on this machine and model: epochs and fixed part.

    Kept in the work folder across runs (`tfopt.schedule.learned_costs`): the time budget prices a
    technique's epochs and its fixed part (its process's start, its graph, its export) with it,
    where a first run can only guess (`WRAPPED_EPOCH_SHARE`, `STARTUP_S` in
    `tfopt.schedule.prices`).
    """

    path: Path
    """The work folder's costs file."""
    key: str
    """This machine's CPU and cores, and the model (`tfopt.schedule.learned_costs.costs_key`)."""
    startup_epochs: dict[str, float] = Field(default_factory=dict)
    """Technique -> the median fixed part of its last runs here, in the baseline's epochs."""
    epoch_shares: dict[str, float] = Field(default_factory=dict)
    """Technique -> the median of its last runs' seconds per epoch over the baseline's."""
    finish_s: float | None = None
    """The longest of the last runs' finish beside packaging, in seconds (None: not learned)."""

    def epoch_share(self, technique: str) -> float | None:
        """How many of the baseline's epochs one of `technique`'s costs (None: not learned)."""
        return self.epoch_shares.get(technique)

    def startup_s(self, technique: str, epoch_s: float) -> float | None:
        """`technique`'s fixed part at the baseline's `epoch_s` (None: not learned yet)."""
        epochs = self.startup_epochs.get(technique)
        return None if epochs is None or epoch_s <= 0.0 else epochs * epoch_s

    def summary(self, epoch_s: float) -> dict[str, dict[str, float]]:
        """Each learned technique's fixed part in seconds at `epoch_s` and its epoch share."""
        return {technique: {"startup_s": round(epochs * epoch_s, 1),
                            **({"epoch_share": self.epoch_shares[technique]}
                               if technique in self.epoch_shares else {})}
                for technique, epochs in sorted(self.startup_epochs.items()) if epoch_s > 0.0}


HELD_OUT_SCORE = "val_score"
"""Where a training on array data logs the run's metric on the held-out split, oriented so that
higher is better (a lower-is-better metric negated: `tfopt.models.training.HeldOutMetric`):
what keeps its best epoch and stops it, as ``val_accuracy`` does on images. The recovery and
file targets on array data are such scores too (`tfopt.models.baseline.array_targets`)."""


class TrainingData(_Frozen):
    """What every training step of a run learns from: the same shards, batch, seed and reader.

    The baseline, every technique's fine-tuning and the distillation students all take this, so
    no step can fall back to other input settings than the run's.
    """

    dataset: DatasetArtifact
    batch_size: int
    seed: int
    input: InputConfig
    input_scale: InputScale = "unit"
    loss: str | dict[str, Any] | None = None
    """The Keras loss a model of array data is fine-tuned with: ``train.loss``, else its file's
    compiled loss (`tfopt.models.keras_io.file_loss`); None: none known (images: the labels'
    cross-entropy)."""
    judged_by: EvalConfig | None = None
    """The run's metric (``eval``) where the data is arrays: a fine-tuning on them is judged by
    it on the held-out split (`tfopt.models.training.HeldOutMetric`). None: top-1 accuracy of
    images."""
    recover_to: float | None = None
    """The validation accuracy a compressed model's fine-tuning is back within the budget at
    (the baseline's best minus ``benchmark.accuracy_budget_points``; on array data the score
    of the run's metric, `HELD_OUT_SCORE`): it stops once there and no longer improving
    (`tfopt.models.training.recovery`). None: every fine-tuning runs its epochs."""
    file_target: float | None = None
    """The validation accuracy one of a search trial's files must keep: the baseline's less the
    budget, the champion's rule (`tfopt.search.time_files`; on array data a score, as
    `recover_to`). None: not checked."""
    speedup_reference: VariantSpec | None = None
    """The baseline's int8 TFLite file: a search trial's files are timed side by side with it
    in one process, and the search chooses by that speed-up (`tfopt.search.time_files`). None:
    by the trial's own p50."""
    trial: TrialRef | None = None
    """The search trial this fine-tuning is (its validation curve goes to the study, whose
    pruner may stop a hopeless one)."""
    deadline: float | None = None
    """When every fine-tuning must have ended (a `time.time()` value: the run's time budget,
    `tfopt.schedule.budget`); None: no limit."""
    queued: tuple[tuple[float, float], ...] = ()
    """The fine-tunings still to run one after another before `deadline`, this one first, each
    as (its shortest run's seconds, its epochs), per worker (empty: this one alone). Each gets
    its shortest run first and its epochs' share of the rest
    (`tfopt.schedule.prices.own_deadline`): the first technique cannot take the last one's time,
    and one whose shortest run no longer fits behind those before it keeps none
    (`tfopt.schedule.prices.fitting`)."""
    file_s: float = 0.0
    """What converting and timing one LiteRT file costs, as the baseline's measurements priced
    it (`flows.measurements.Measurements.file_s`): a search trial's files are priced at it
    (`tfopt.schedule.prices.first_trial_s`; 0: at `variant_tail_s`)."""
    variant_tail_s: float = 0.0
    """What the time budget keeps after `deadline` for each planned compressed variant's
    conversion and measurement (0: nothing kept). A technique known never to build its
    variants gives that time back to the compression (`compress.planner.Planner`)."""
    epoch_s: float = 0.0
    """The baseline's seconds per training epoch (0: not trained here): a technique does not
    start with less time left before `deadline` than its shortest run takes at that pace
    (`tfopt.schedule.prices.shortest_run_s`); with less it would stop far from back
    (`compress.cut_short`) and its time go to nothing."""
    costs: LearnedCosts | None = None
    """The techniques' fixed costs learned in earlier runs (None: each priced at
    `tfopt.schedule.prices.STARTUP_S`, nothing recorded)."""

    def judged(self) -> EvalConfig:
        """The run's ``eval``, what a training on array data is judged by (default: top-1)."""
        return self.judged_by or EvalConfig()

    def metric(self) -> Any:
        """The `tfopt.eval.metrics.Metric` of `judged` on array data (no class scores)."""
        return self.judged().resolve(class_scores=False)

    def held_out_key(self) -> str:
        """The log entry a training on it is judged by: ``val_accuracy``, or `HELD_OUT_SCORE`."""
        return HELD_OUT_SCORE if self.dataset.arrays else "val_accuracy"


class InputPipelineResult(_Frozen):
    """Examples per second of the naive, tuned and cached readers on the same files."""

    naive_examples_per_s: float
    tuned_examples_per_s: float
    cached_examples_per_s: float
    chosen_batch_size: int
    examples_measured: int
    cache_mode: str = "none"
    cache_reason: str = ""
    tuned_uncached_examples_per_s: float = 0.0
    passes: int = 1
    decode_ceiling_examples_per_s: float = 0.0


class SweepPoint(_Frozen):
    """Training-step measurements at one batch size."""

    batch_size: int
    examples_per_s: float
    step_ms: float
    peak_extra_mb: float


class BatchSweepResult(_Frozen):
    """The batch-size sweep, the rule applied to it, and its choice."""

    points: list[SweepPoint]
    chosen_batch_size: int
    rule: str
    plot_path: Path | None = None


class LayoutResult(_Frozen):
    """Training-step throughput in NHWC and NCHW on this device, and which was faster."""

    device: str
    nhwc_examples_per_s: float
    nchw_examples_per_s: float | None
    faster: str
    note: str


KERAS_FILE = "keras_file"
"""The parameter naming the Keras file of a model of array data (`ModelArtifact.keras_file`)."""


class ModelArtifact(_Frozen):
    """A model on disk in one format, with what it was built from."""

    name: str
    path: Path
    format: ModelFormat
    precision: Precision = "fp32"
    image_size: int
    num_classes: int
    class_names: list[str] = Field(default_factory=list)
    input_scale: InputScale = "unit"
    channels: int = 3
    """Its image input's channels (1: grayscale, 3: RGB)."""
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    history: dict[str, list[float]] = Field(default_factory=dict)

    @property
    def keras_file(self) -> Path | None:
        """The Keras file behind a model of array data that is its SavedModel (None: none).

        A Keras file given with array data becomes a SavedModel of its own signature, which
        its forms are converted from; the techniques fine-tune the Keras model in this file.
        """
        found = self.params.get(KERAS_FILE)
        return None if found is None else Path(str(found))

    def at_kept_epoch(self, curve: str) -> float | None:
        """`curve`'s value at the epoch its training kept (``kept_epoch``; else its last).

        Not the curve's best: a pruning fine-tune stopped before its sparsity ramp ended keeps
        its last epoch, far below the accurate epochs of the ramp's start. None without the
        curve.
        """
        values = self.history.get(curve) or []
        if not values:
            return None
        kept = self.params.get("kept_epoch")
        index = kept - 1 if isinstance(kept, int) and 0 < kept <= len(values) else -1
        return float(values[index])


class ModelFacts(_Frozen):
    """What the baseline's model is, found before any work on the data (`inspect_model`).

    Attributes:
        kind: ``keras``, ``savedmodel`` or a runtime's file format (``tflite``, ``onnx``).
        keras: For a Keras model, the Keras that builds it: ``tf_keras`` or ``keras3``.
        channels: Its image input's channels (1 grayscale, 3 RGB): what the readers decode to.
        output: ``logits``; ``softmax`` (a softmax end: tfopt takes the tensor before it, or
            log-probabilities where that tensor cannot be reached); ``scores`` (a subclassed
            model's output, taken as it is).
        head_replaced: The classification layer ``model.head: replace`` swaps out, if any.
    """

    kind: str
    keras: str = ""
    channels: int = 3
    output: str = "logits"
    head_replaced: str | None = None

    def params(self) -> dict[str, str | int]:
        """The facts as run parameters (``model.*`` prefixed by the caller)."""
        found: dict[str, str | int] = {"kind": self.kind, "channels": self.channels,
                                       "output": self.output}
        if self.keras:
            found["keras"] = self.keras
        if self.head_replaced:
            found["head_replaced"] = self.head_replaced
        return found


class VariantSpec(_Frozen):
    """One thing to benchmark: a model in a format and precision, or why it could not be built.

    Made by `tfopt.variants.plan_variant` (the one place that names variants); `derived_from`
    names the variant this one is an optimized form of (what its speed and size are judged
    against), or None for a starting point.
    """

    name: str
    source: str
    format: VariantFormat
    precision: Precision
    path: Path | None
    form: str = ""
    """The form's name when it is more than the format (``xla-autocluster``,
    ``tflite-selective``): how its runtime builds it."""
    status: Status = "ok"
    error: str | None = None
    derived_from: str | None = None
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)


CutKind = Literal["not_started", "stopped", "narrowed", "shortened", "not_measured",
                  "not_confirmed"]
"""How the time budget cut a step: not started at all, a training stopped before it was done,
the compressed models' forms narrowed, a search or the timing shortened, a form not measured,
a slowdown not timed again side by side."""


class Cut(BaseModel):
    """One thing the time budget cut, recorded where it was cut."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: str
    """What was cut (``distill``, ``benchmark timing``): a run records one cut per step."""
    kind: CutKind
    reason: str
    """What the run says of it (the summary's ``budget.cuts``, the terminal, the report)."""

class Compressed(_Frozen):
    """What the compression subflow made: its variants, its models, and each search's trials."""

    variants: list[VariantSpec]
    models: list[ModelArtifact]
    searches: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per searched technique: its knob, its trials and the chosen setting (`tfopt.search`)."""
    cuts: list[Cut] = Field(default_factory=list)
    """The techniques the time budget cut before they started, each with its reason."""


class BenchmarkInputs(_Frozen):
    """The test split decoded once, and the float model's outputs on it.

    Every variant is fed exactly these arrays. Without reference logits, each variant is its
    own reference (one model benchmarked alone, never opened outside its measuring process).
    """

    images: Path | None
    """The decoded test images (None: a model benchmarked on `feeds`, without data)."""
    labels: Path | None
    reference_logits: Path | None
    examples: int
    batch_size: int = 32
    feeds: Path | None = None
    """Named inputs of any shape and dtype (an ``.npz``, batch first): the user's file, or
    where the measuring process writes the inputs it generated from the model's signature
    (`generate`). Used when there are no images."""
    generate: dict[str, list[int]] | None = None
    """Generate `examples` inputs from the model's signature, the dimensions it leaves open
    taken from here (by input name, the batch dimension included); None: `feeds` holds them."""
    selection_images: Path | None = None
    """The decoded validation split, on which the run's choices are made (None: no labelled
    validation split): each variant's `VariantResult.val_accuracy`."""
    selection_labels: Path | None = None
    selection_feeds: Path | None = None
    """An array data set's validation split as named feeds with their ``y`` (an ``.npz``): each
    variant's `VariantResult.val_accuracy` is its metric's figure there (None: no such split)."""
    judged_by: EvalConfig = Field(default_factory=EvalConfig)
    """The metric every variant is scored by on these inputs."""
    reference_outputs: Path | None = None
    """A reference model's outputs on `feeds`, by output name (an ``.npz``): what a fidelity
    metric scores each variant's same-named output against."""
    selection_reference_outputs: Path | None = None
    """The reference model's outputs on `selection_feeds` (a fidelity metric's truth there)."""
    floor_models: dict[str, Path] = Field(default_factory=dict)
    """Per runner format, a model that does next to nothing on inputs of the same shape: timed
    through the same runner, it is the harness's own floor (see `tfopt.measurement.floor`)."""
    floor_ms: dict[str, float] = Field(default_factory=dict)
    """Floors this run has measured already, per floor model and thread count (``floor_key``):
    the next variant of that kind reports it instead of timing the same model again."""

    def metric(self) -> Any:
        """The `tfopt.eval.metrics.Metric` variants are scored by on these inputs.

        ``fidelity`` is top-1 agreement on images (a classifier's scores), the SNR on feeds.
        """
        return self.judged_by.resolve(class_scores=self.images is not None)

    def budget(self, accuracy_points: float) -> Any:
        """The `tfopt.eval.metrics.MetricBudget` on `metric` (`EvalConfig.metric_budget`)."""
        return self.judged_by.metric_budget(accuracy_points,
                                            class_scores=self.images is not None)

    def with_floor(self, key: str, floor_ms: float | None) -> BenchmarkInputs:
        """These inputs with a measured floor known (unchanged if None or known already)."""
        if floor_ms is None or key in self.floor_ms:
            return self
        return self.model_copy(update={"floor_ms": {**self.floor_ms, key: floor_ms}})


class LatencyStats(_Frozen):
    """Batch-1 latency in milliseconds over the timed runs (warm-up excluded)."""

    p50: float
    p90: float
    p99: float
    mean: float
    std: float
    min: float = 0.0
    max: float = 0.0
    p95: float = 0.0
    trimmed_mean: float = 0.0
    cv: float = 0.0
    stable: bool = True
    p50_ci95: tuple[float, float] | None = None


class OpTime(_Frozen):
    """One operator of a variant's graph and its part of the work."""

    node: str
    kind: str
    ms: float | None = Field(None, description="Time per call, where a profiler timed it.")
    share: float = Field(description="Share of the profiled time (or of the FLOPs).")


class OpProfile(_Frozen):
    """A variant's top operators and how they were ranked (see `Runtime.op_profile`)."""

    method: str
    calls: int = 0
    ops: list[OpTime] = Field(default_factory=list)


class Runoff(_Frozen):
    """The contenders for champion timed again side by side (see `tfopt.measurement.runoff`).

    Figures are paired round by round: on a shared machine the speed can flip within seconds
    (a virtual machine may run every file about 2x slower for seconds at a time), and the
    median of each contender's rounds alone can then take one from its fast rounds and the
    other from its slow ones; the median of per-round ratios agrees with the vendor's tool
    where the ratio of medians does not (docs/measurements.md, "Run-off").
    """

    rounds: int
    round_p50_ms: dict[str, list[float]] = Field(
        description="Per contender, its p50 in each round, in round order.")
    anchor: str | None = None
    """The contender the others' p50s are paired with (the baseline's int8 TFLite file when it
    took part); None: each contender's own median."""
    threads: dict[str, int] = Field(
        default_factory=dict,
        description="Per contender, the intra-op threads its rounds ran with, picked as its "
                    "fastest count (`thread_pick_p50_ms`); empty: all at benchmark.threads.")
    thread_pick_p50_ms: dict[str, dict[int, float]] = Field(
        default_factory=dict,
        description="Per contender, its p50 at each thread count, in the same alternating "
                    "rounds as every other contender's counts (its figures are its fastest "
                    "count's).")
    background_cores: float | None = Field(
        None, description="Cores other processes kept busy on average while it ran (None: not "
                          "measurable).")
    under_load: bool = Field(
        False, description="More than benchmark.max_background_cores were busy with other "
                           "work while it ran: a file on more threads loses more to them.")
    load_retried: bool = Field(
        False, description="Run once more because the first was under load.")

    def round_ratios(self, name: str, to: str) -> list[float]:
        """`name`'s time over `to`'s in each round, in round order."""
        return [mine / theirs for mine, theirs in
                zip(self.round_p50_ms[name], self.round_p50_ms[to], strict=True)]

    def followed_by(self, more: Runoff) -> Runoff:
        """These rounds and then `more`'s, of the contenders both timed.

        The load is the busier part's: either under load marks the whole.
        """
        names = [name for name in self.round_p50_ms if name in more.round_p50_ms]
        loads = [cores for cores in (self.background_cores, more.background_cores)
                 if cores is not None]
        return Runoff(rounds=self.rounds + more.rounds, anchor=self.anchor,
                      threads=self.threads, thread_pick_p50_ms=self.thread_pick_p50_ms,
                      background_cores=max(loads) if loads else None,
                      under_load=self.under_load or more.under_load,
                      load_retried=self.load_retried,
                      round_p50_ms={name: [*self.round_p50_ms[name], *more.round_p50_ms[name]]
                                    for name in names})

    def ratio(self, name: str, to: str) -> float:
        """`name`'s time over `to`'s: the median of their ratios round by round."""
        return _median(self.round_ratios(name, to))

    def p50(self, name: str) -> float:
        """A contender's run-off p50: the median of its paired rounds (`paired_rounds`)."""
        return _median(self.paired_rounds(name))

    def interval(self, name: str) -> tuple[float, float]:
        """A contender's run-off p50 interval: `median_interval` of its paired rounds."""
        return median_interval(self.paired_rounds(name))

    def ratio_interval(self, name: str, to: str) -> tuple[float, float]:
        """`median_interval` of `name`'s time over `to`'s, round by round.

        Paired within each round, so a round both files ran slow in cancels out; the
        interval holds 1.0 when the rounds did not tell the two files apart.
        """
        return median_interval(self.round_ratios(name, to))

    def paired_rounds(self, name: str) -> list[float]:
        """`name`'s round p50s, each paired with the anchor's round.

        Each is its ratio to the anchor's p50 in that round times the anchor's median, so their
        median is the anchor's median times `ratio`. As measured without an anchor, and for the
        anchor itself.
        """
        rounds = self.round_p50_ms[name]
        if self.anchor is None or name == self.anchor or self.anchor not in self.round_p50_ms:
            return rounds
        middle = _median(self.round_p50_ms[self.anchor])
        return [middle * mine / theirs for mine, theirs in
                zip(rounds, self.round_p50_ms[self.anchor], strict=True)]


def median_interval(values: list[float], coverage: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of at least `coverage` for the median of `values`.

    The k-th lowest and k-th highest value, k the largest rank whose interval still covers the
    median with that probability (k of n independent values fall below the median as a
    binomial(n, 1/2)): with 6 values their range (96.9%), with 12 the 3rd and 10th (96.1%), so
    two rounds a VM's slow state hit do not widen it. Fewer than 6 values: their range.
    """
    ordered = sorted(values)
    count, rank, below = len(ordered), 0, 0.0
    while rank < count // 2:
        below += math.comb(count, rank) / 2.0 ** count
        if 1.0 - 2.0 * below < coverage:
            break
        rank += 1
    rank = max(rank, 1)
    return ordered[rank - 1], ordered[count - rank]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


RUNNER_PARAMS = ("xla_mode",)
"""The `VariantSpec.params` that change how a variant's file is run (kept on its result)."""


class VariantResult(_Frozen):
    """A benchmarked variant: the summary contract's entry plus the measurement details."""

    name: str
    source: str
    format: VariantFormat
    precision: Precision
    status: Status
    error: str | None = None
    derived_from: str | None = None
    size_bytes: int = 0
    gzip_bytes: int = 0
    accuracy: float | None = 0.0
    """The metric (`metric`: top-1 accuracy unless ``eval.metric`` names another) on the test
    split; None for a model benchmarked without labels or targets."""
    metric: str = "accuracy"
    """What `accuracy` and `val_accuracy` hold (`tfopt.eval.metrics.Metric.name`)."""
    val_accuracy: float | None = None
    """The metric on the validation split, the figure the accuracy budget is judged on
    (`tfopt.measurement.champion.BudgetRule`); None: not measured (no validation split)."""
    predictions: Path | None = None
    """Its predicted class per test image (``.npy``), for paired comparisons
    (`tfopt.measurement.accuracy_stats.paired_comparison`)."""
    val_predictions: Path | None = None
    """Its predicted class per validation image (``.npy``): the paired comparison the champion
    was chosen on."""
    latency_ms: LatencyStats | None = None
    throughput_per_s: float = 0.0
    timed_runs: int = 0
    load_seconds: float = 0.0
    first_inference_ms: float = 0.0
    peak_rss_mb: float = 0.0
    top1_agreement: float | None = None
    max_abs_diff: float | None = None
    batch_throughput_per_s: float = 0.0
    batch_size: int = 0
    samples_ms: list[float] = Field(default_factory=list)
    tf_intra_op_threads: int | None = None
    tf_inter_op_threads: int | None = None
    background_cores_before: float | None = None
    background_cores: float | None = None
    under_load: bool = False
    load_retried: bool = False
    harness_floor_ms: float | None = None
    profile_seconds: float = 0.0
    """What its operator profile and other APIs' timings took (a budget prices them apart)."""
    timing_seconds: float = 0.0
    """What the protocol's timing took: the timed windows with their warm-up, the load
    scenarios and the batch throughput (0: not recorded). The rest of its measurement is
    what the protocol cannot shorten."""
    gflops_per_inference: float | None = None
    offline_examples_per_s: float | None = None
    offline_batch_size: int | None = None
    server_qps_within_budget: float | None = None
    server_p99_ms: float | None = None
    server_reason: str | None = None
    """Why the Server scenario found no rate within the budget without searching, if so."""
    p50_ms_by_threads: dict[int, float] = Field(default_factory=dict)
    runner_params: dict[str, str] = Field(default_factory=dict)
    """The variant's settings that change how its file is run (``xla_mode``), so another
    machine measures the same thing, and what the runtime decided on opening it
    (``inference_precision``, ``compiled_model.fully_accelerated``: `Runner.facts`); logged
    as ``runner.<key>`` params."""
    op_profile: OpProfile | None = None
    latency_ms_by_api: dict[str, LatencyStats] = Field(default_factory=dict)
    """Where the runtime has other APIs (`Runtime.other_apis`), the same file timed through
    each in the same process, the main API's figure (`latency_ms`) included."""
    path: Path | None = None
    extra_files: list[Path] = Field(default_factory=list)
