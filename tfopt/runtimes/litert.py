"""LiteRT (TFLite): post-training fp32, dynamic-range, float16, int8 and 16x8 files.

Every ``.tflite`` file is converted from a serving SavedModel with ``TFLiteConverter`` and
measured with LiteRT's interpreter (``ai_edge_litert``, XNNPACK on the CPU) without loading
TensorFlow in the measuring process. When full int8 misses the accuracy budget, the worst
layers are kept in float (``tflite-selective-int8``, see `tfopt.runtimes._litert_selective`).
LiteRT's Python package has no operator profiler, so operators are ranked by their FLOPs; MLflow
packages a file as a pyfunc model (`tfopt.runtimes._litert_pyfunc`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from tfopt.artifacts import (
    OpProfile,
    Precision,
    VariantResult,
    VariantSpec,
)
from tfopt.fileio import atomic_write_bytes
from tfopt.measurement.profiles import top_ops
from tfopt.packaging import mlflow_signature, named_example, named_signature, pinned
from tfopt.runtimes._litert_files import (
    STEM_GAIN,
    CompiledModelRunner,
    TFLiteRunner,
    convert_tflite,
    int8_kernel_stats,
    serving_converter,
    tflite_flops,
    tflite_op_flops,
    tflite_precision,
)
from tfopt.runtimes.base import (
    BuildSources,
    PlanRequest,
    Runner,
    Runtime,
    RuntimeSection,
    ServingContract,
)
from tfopt.variants import built, skipped

TflitePrecision = Literal["fp32", "dynamic", "float16", "int8", "int16x8"]
PROFILE_METHOD = "share of FLOPs (LiteRT's Python package has no operator profiler)"
_PYFUNC = Path(__file__).with_name("_litert_pyfunc.py")


FLOAT_STEM_ONLY = "float_stem_only"
"""A compressed model's selective int8 (planned parameter): its first convolution in float
when faster, never the accuracy-driven search of the baseline's."""


class LiteRTSettings(RuntimeSection):
    """Which TFLite files to convert and how to calibrate the integer ones."""

    tflite: list[TflitePrecision] = Field(
        default_factory=lambda: ["fp32", "dynamic", "float16", "int8"],
        description=(
            "TFLite post-training precisions: fp32 (none), dynamic (int8 weights, float "
            "activations), float16 (float16 weights), int8 (full integer, calibrated), "
            "int16x8 (int16 activations, int8 weights, calibrated: closer to float than int8, "
            "on reference kernels)."
        ),
    )
    int8_io: bool = Field(
        False, description="Full-integer models take int8 input and give int8 output (else float)."
    )
    selective_int8: bool = Field(
        True,
        description=(
            "When full int8 loses more than benchmark.accuracy_budget_points on the validation "
            "split, keep the layers that quantize worst (QuantizationDebugger) in float, one at "
            "a time, until it is within budget: the variant <source>-tflite-selective-int8."
        ),
    )
    selective_max_float_layers: int = Field(
        8, ge=1, le=1000, description="The most layers selective int8 may keep in float.")
    selective_float_stem: bool = Field(
        True,
        description=(
            "When full int8 is within the budget already, selective int8 is full int8 with its "
            f"first convolution in float if a quick timing beside full int8 finds that "
            f"{STEM_GAIN:.0%} faster (some CPUs' int8 kernels are slower on an image's few "
            "input channels); else it is skipped as not needed."
        ),
    )


_SLOWER = {
    "dynamic": "dynamic-range kernels quantize activations on the fly at every call; on x86 "
               "the float XNNPACK path is often faster",
    "float16": "float16 weights are expanded to float32 on CPUs without native fp16 arithmetic: "
               "the gain is size, not speed",
    "int8": "this CPU's int8 kernels do not beat its float kernels for this op mix "
            "(quantize/dequantize at the edges costs too)",
    "int16x8": "16x8 kernels are TFLite's reference kernels (XNNPACK has none): the gain is "
               "accuracy closer to float than int8 at int8-size weights, not speed",
}


class LiteRT(Runtime):
    """LiteRT's interpreter on ``.tflite`` files converted from the serving SavedModel."""

    name = "litert"
    formats = frozenset({"tflite"})
    section = LiteRTSettings
    home = "convert"
    order = 20
    file_suffixes: ClassVar[Mapping[str, str]] = {".tflite": "tflite"}
    shares_process = True
    main_api = "interpreter"
    precision_named = frozenset({"tflite"})
    compress_keys: ClassVar[Mapping[str, tuple[Any, Any]]] = {
        "tflite": (list[TflitePrecision], Field(
            default_factory=lambda: ["fp32", "dynamic", "float16", "int8"],
            description="TFLite precisions built for each compressed model (QAT is always int8).",
        )),
    }

    def compressed_forms(self, settings: LiteRTSettings,
                         compress: Any) -> dict[str, tuple[str, ...]]:
        """``compress.tflite``: the TFLite precisions of every technique's model."""
        return {"tflite": tuple(compress.tflite)}

    def plan(self, request: PlanRequest, settings: LiteRTSettings) -> list[VariantSpec]:
        """TFLite files per precision (int8 calibrated), selective int8, or the file as given."""
        source = request.source
        if request.compressed:
            precisions = (request.asked or {}).get("tflite", ())
            planned = [self.variant(source, "tflite", p,
                                    derived_from=self.variant_name(request.start, "tflite", p))
                       for p in precisions]
            if request.sparse and "fp32" in precisions:
                planned.append(self.variant(
                    source, "tflite", form="tflite-sparse",
                    derived_from=self.variant_name(source, "tflite", "fp32"),
                    params={"sparsity_encoding": True}))
            stem = "int8" in (request.asked or {}).get("tflite-selective", ())
            if stem and "int8" in precisions and settings.selective_int8 \
                    and settings.selective_float_stem:
                planned.append(self.variant(
                    source, "tflite", "int8", form="tflite-selective",
                    derived_from=self.variant_name(request.start, "tflite", "int8"),
                    params={FLOAT_STEM_ONLY: True}))
            return planned
        if request.kind == "tflite":
            return [self.variant(source, "tflite", request.precision)]
        if request.kind not in ("keras", "savedmodel"):
            return [skipped(self.variant(source, "tflite", "fp32"),
                            f"model.path is a .{request.kind} file: it is benchmarked as it is")]
        fp32 = self.variant_name(source, "tflite", "fp32")
        planned = [self.variant(source, "tflite", p, derived_from=None if p == "fp32" else fp32)
                   for p in settings.tflite]
        if settings.selective_int8 and "int8" in settings.tflite:
            planned.append(self.variant(source, "tflite", "int8", form="tflite-selective",
                                        derived_from=self.variant_name(source, "tflite", "int8")))
        return planned

    def build(self, spec: VariantSpec, sources: BuildSources,
              settings: LiteRTSettings) -> VariantSpec:
        """Convert the serving SavedModel; selective int8 searches the layers to keep float."""
        if sources.model.format == "tflite":
            return built(spec, sources.model.path)
        if sources.savedmodel is None:
            raise ValueError(f"{sources.model.name} has no SavedModel to convert")
        scale = sources.savedmodel.input_scale
        if spec.form == "tflite-selective":
            from tfopt.runtimes._litert_selective import select_int8_layers

            if sources.dataset.arrays:
                return skipped(spec, "selective int8 judges a classifier's top-1 on images; "
                                     "not built yet for array data")

            return select_int8_layers(sources.savedmodel, spec, sources,
                                      settings.selective_max_float_layers,
                                      settings.selective_float_stem,
                                      search=not spec.params.get(FLOAT_STEM_ONLY, False))
        return convert_tflite(sources.savedmodel.path, spec, sources.dataset,
                              sources.calibration_examples, settings.int8_io, sources.out_dir,
                              scale)

    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        """LiteRT's interpreter with `threads` threads."""
        return TFLiteRunner(spec.path, threads)

    def other_apis(self, spec: VariantSpec, threads: int = 1) -> dict[str, Runner]:
        """LiteRT's CompiledModel API on the same file (``compiled_model``)."""
        return {"compiled_model": CompiledModelRunner(Path(spec.path), threads)}

    def import_file(self, path: Path, out_dir: Path, class_names: Sequence[str] = (),
                    output: str = "logits") -> tuple[Path, Precision]:
        """The file copied in as it is, with the precision it holds."""
        final = out_dir / "baseline.tflite"
        atomic_write_bytes(final, path.read_bytes())
        return final, tflite_precision(TFLiteRunner(final))

    def flops(self, runner: Runner) -> float | None:
        """FLOPs of the graph's convolutions and fully connected ops."""
        return tflite_flops(runner.interpreter)

    def op_profile(self, runner: Runner, prepared: Sequence[object],
                   threads: int) -> OpProfile | None:
        """Operators ranked by their share of the FLOPs (no profiler in LiteRT's package)."""
        totals: Counter[tuple[str, str]] = Counter()
        for node, kind, flops in tflite_op_flops(runner.interpreter):
            totals[(node, kind)] += flops
        return OpProfile(method=PROFILE_METHOD, calls=0, ops=top_ops(totals, 1, timed=False))

    def floor_models(self, input_shape: tuple[int, ...], out_dir: Path) -> dict[str, Path]:
        """The floor model converted to ``floor.tflite``."""
        from tfopt.runtimes.tensorflow import floor_savedmodel

        path = out_dir / "floor.tflite"
        if not path.exists():
            savedmodel = floor_savedmodel(input_shape, out_dir / "floor-savedmodel")
            atomic_write_bytes(path, serving_converter(savedmodel).convert())
        return {"tflite": path}

    def package(self, spec: VariantSpec, contract: ServingContract, metadata: dict,
                dst: Path) -> str:
        """A pyfunc model serving the file with LiteRT (no TensorFlow needed to load it)."""
        import mlflow.pyfunc

        runner = TFLiteRunner(Path(spec.path))
        if contract.named:
            example, signature = named_example(contract.example, runner), named_signature(runner)
        else:
            example = contract.example.astype(np.float32)
            signature = mlflow_signature(example, int(runner.output_detail["shape"][-1]))
        mlflow.pyfunc.save_model(
            str(dst), python_model=str(_PYFUNC), artifacts={"tflite": str(spec.path)},
            model_config={"signature": runner.signature_key, "input": runner.input_name,
                          "output": runner.output_name, "threads": contract.threads},
            signature=signature, input_example=example, metadata=metadata,
            pip_requirements=pinned("ai-edge-litert", "numpy"),
        )
        return f"artifacts/{Path(spec.path).name}"

    def read_back(self, spec: VariantSpec) -> dict[str, float]:
        """An int8 file's kernels as converted: sparsity and values per channel, per layer.

        The file with TFLite's sparse encoding is left out: its weights are stored apart.
        """
        if spec.precision != "int8" or spec.params.get("sparsity_encoding") or spec.path is None:
            return {}
        return int8_kernel_stats(spec.path)

    def slowdown_reason(self, result: VariantResult) -> str | None:
        """Why a post-training precision can be slower than fp32 on a CPU."""
        return _SLOWER.get(result.precision)


RUNTIME = LiteRT()
