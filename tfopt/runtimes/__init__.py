"""Inference runtimes, one module each; the registry finds them (no list to edit).

Adding a runtime: a module here that defines ``RUNTIME = <a Runtime subclass>()`` (see
`tfopt.runtimes.base`) with its settings' class as ``section``; its section appears in the
config as ``runtimes.<name>`` (`runtimes_config_class`), its variants in every run's plan
(`plan_forms`), and every step that opens, profiles, counts, packages or explains a variant
asks the registry for the runtime of the variant's format (`runtime_of`). Modules whose name
starts with ``_`` are a runtime's helpers, not runtimes.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

import tfopt  # noqa: F401  (environment before TensorFlow)
from tfopt.artifacts import Precision, VariantSpec
from tfopt.config import Section
from tfopt.native import NativeStep, run_native
from tfopt.runtimes.base import BuildSources, ConversionSettings, PlanRequest, Runner, Runtime
from tfopt.variants import quicker_than_reference


@cache
def registry() -> dict[str, Runtime]:
    """Every runtime module's ``RUNTIME`` in this package, by name.

    Raises:
        LookupError: A module without ``RUNTIME``, two runtimes with one name, or two
            runtimes claiming one variant format.
    """
    found: dict[str, Runtime] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        runtime = getattr(module, "RUNTIME", None)
        if not isinstance(runtime, Runtime):
            raise LookupError(f"tfopt/runtimes/{info.name}.py defines no RUNTIME = Runtime()")
        if runtime.name in found:
            raise LookupError(f"two runtimes are named {runtime.name!r}")
        for other in found.values():
            if runtime.formats & other.formats:
                raise LookupError(f"{runtime.name} and {other.name} both claim the formats "
                                  f"{sorted(runtime.formats & other.formats)}")
        found[runtime.name] = runtime
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


def runtime_of(variant_format: str) -> Runtime:
    """The runtime that measures variants of `variant_format`.

    Raises:
        ValueError: No runtime measures that format.
    """
    for runtime in registry().values():
        if variant_format in runtime.formats:
            return runtime
    raise ValueError(f"no runtime measures format {variant_format!r} (known: "
                     f"{', '.join(sorted(known_formats()))})")


READ_BACK_STEP = NativeStep("read_back", "a converted file opened to read its kernels back")


def read_back_file(spec: VariantSpec) -> dict[str, float]:
    """What `spec`'s runtime reads back from its built file, in a child process (`tfopt.native`).

    Raises:
        NativeCrashError: Opening the file crashed the child (and its retry).
    """
    return run_native(READ_BACK_STEP, _read_back, spec)


def _read_back(spec: VariantSpec) -> dict[str, float]:
    return runtime_of(spec.format).read_back(spec)


def load_runner(spec: VariantSpec, threads: int = 1) -> Runner:
    """Open a variant's file with its runtime, `threads` intra-op threads (see `Runtime`)."""
    return runtime_of(spec.format).load_runner(spec, threads)


def plan_variant(source: str, variant_format: str, precision: Precision = "fp32",
                 **fields: Any) -> VariantSpec:
    """A variant of a format some runtime measures, named as that runtime names its forms.

    The registry's edge for variants planned outside the runtimes (a reference model, a
    benchmark script's file); the keyword fields are `tfopt.variants.plan_variant`'s.

    Raises:
        ValueError: No runtime measures `variant_format`.
    """
    return runtime_of(variant_format).variant(source, variant_format, precision, **fields)


def build_step(spec: VariantSpec) -> NativeStep:
    """Building `spec` as a native step: its runtime's converter runs the model."""
    return NativeStep(f"build_variant ({spec.name})",
                      f"{runtime_of(spec.format).name}'s conversion of {spec.source}",
                      "the other variants go on; this one is reported failed")


def build_here(spec: VariantSpec, sources: BuildSources, settings: Any) -> VariantSpec:
    """Build `spec` with its runtime in this process (what a build's child process runs)."""
    return runtime_of(spec.format).build(spec, sources, settings)


BUNDLE_STEP = NativeStep("export_bundle", "a runtime's export of the baseline",
                         "the variants go on without the bundle")


def export_bundle_here(runtime: str, sources: BuildSources, settings: Any,
                       out_dir: Path) -> Path | None:
    """A runtime's export bundle, made in this process (what the bundle's child process runs)."""
    return registry()[runtime].export(sources, settings, out_dir)


def known_formats() -> frozenset[str]:
    """Every variant format some runtime measures."""
    return frozenset(fmt for runtime in registry().values() for fmt in runtime.formats)


def file_suffixes() -> dict[str, str]:
    """Model file suffixes a runtime measures as they are (``.tflite``), with their format."""
    return {suffix: fmt for runtime in registry().values()
            for suffix, fmt in runtime.file_suffixes.items()}


KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
"""Files tfopt reads as Keras models (tf_keras or Keras 3, whichever saved the file)."""


def model_file_suffixes() -> dict[str, str]:
    """Every model file suffix tfopt reads, with its kind: ``keras`` or a runtime's format."""
    return {**dict.fromkeys(KERAS_SUFFIXES, "keras"), **file_suffixes()}


def model_kind(path: Path) -> str:
    """The kind of model file or folder at `path`: ``keras``, ``savedmodel`` or a runtime's format.

    The one place that tells model files apart. A folder is a SavedModel: a tf_keras one when
    it holds Keras metadata, else a plain one. A file is a Keras model by its suffix, or a file
    some runtime measures as it is (``.tflite``, ``.onnx``: `Runtime.file_suffixes`).

    Raises:
        ValueError: Not a model file tfopt reads.
    """
    suffixes = model_file_suffixes()
    if path.suffix.lower() in KERAS_SUFFIXES:
        return "keras"
    if path.suffix in suffixes:
        return suffixes[path.suffix]
    if path.suffix == "" or path.is_dir():
        return "keras" if (path / "keras_metadata.pb").is_file() else "savedmodel"
    known = list(suffixes)
    listed = f"{', '.join(known[:-1])} or {known[-1]}"
    raise ValueError(f"model.path: {path} is not a {listed} file or a SavedModel folder")


def settings_of(runtime: Runtime, config: Any) -> Any:
    """A runtime's section of a pipeline configuration (`config.convert` or `config.runtimes`)."""
    if runtime.section is None:
        return None
    if runtime.home == "convert":
        return config.convert
    return getattr(config.runtimes, runtime.name)


def plan_forms(request: PlanRequest, config: Any) -> list[VariantSpec]:
    """Every runtime's variants of one model, in the runtimes' order (see `Runtime.plan`).

    The baseline's forms and every compressed model's are planned here, the same way.
    """
    return [spec for runtime in registry().values()
            for spec in runtime.plan(request, settings_of(runtime, config))]


NARROWED_FORMS = {"tflite": ("int8", "fp32"), "tflite_int8": ("int8",)}
"""What a run whose budget cannot hold every compressed form narrows them to, widest first:
each ``compress.forms`` value and the TFLite precisions it asks of every compressed model. The
fp32 file comes first with int8 because int8 is not the faster file on every CPU
(docs/measurements.md)."""


def compressed_forms(config: Any) -> dict[str, tuple[str, ...]]:
    """The one rule for a technique's model: the precisions each runtime's format is asked for.

    Every runtime says it from the config (`Runtime.compressed_forms`); formats asked for
    nothing are left out. ``compress.forms: tflite`` asks for the int8 and fp32 TFLite files
    alone, ``tflite_int8`` for the int8 one. ``compress.float_stem`` adds the int8 file with its
    first convolution in float (`FLOAT_STEM`) beside an int8 file.
    """
    forms = getattr(config.compress, "forms", "all")
    if forms in NARROWED_FORMS:
        asked = {"tflite": NARROWED_FORMS[forms]}
    else:
        asked = {fmt: precisions for runtime in registry().values()
                 for fmt, precisions in runtime.compressed_forms(settings_of(runtime, config),
                                                                 config.compress).items()
                 if precisions}
    if getattr(config.compress, "float_stem", None) and "int8" in asked.get("tflite", ()):
        asked[FLOAT_STEM] = ("int8",)
    return asked


FLOAT_STEM = "tflite-selective"
"""The form a compressed model's int8 file with its first convolution in float is asked as."""


def with_float_stem(config: Any, baseline_variants: list[VariantSpec]) -> Any:
    """`config` with ``compress.float_stem`` decided where the config left it to the run.

    On when the baseline's selective int8 kept its first convolution in float as faster than
    its full int8 file (`tfopt.variants.quicker_than_reference`): the same CPU's kernels judge
    the compressed models' files.
    """
    if getattr(config.compress, "float_stem", False) is not None:
        return config
    quicker = any(spec.form == FLOAT_STEM and quicker_than_reference(spec)
                  for spec in baseline_variants)
    return config.model_copy(update={"compress": config.compress.model_copy(
        update={"float_stem": quicker})})


def with_forms(config: Any, forms: str) -> Any:
    """`config` with each compressed model narrowed to `forms` (one of `NARROWED_FORMS`)."""
    return config.model_copy(update={"compress": config.compress.model_copy(
        update={"forms": forms})})


def int8_only(config: Any) -> Any:
    """`config` with each compressed model narrowed to its int8 TFLite file (`narrowed_to_int8`)."""
    return with_forms(config, "tflite_int8")


def narrowed_to_int8(config: Any) -> bool:
    """Whether the compressed models are narrowed to their int8 TFLite files.

    ``compress.forms: tflite_int8``: a config's, or the time budget's on a slow machine.
    """
    return getattr(config.compress, "forms", "all") == "tflite_int8"


def compress_keys() -> dict[str, tuple[Any, Any]]:
    """The ``compress`` keys the runtimes declare (`Runtime.compress_keys`), by name."""
    return {key: field for runtime in registry().values()
            for key, field in runtime.compress_keys.items()}


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc else ""


def convert_config_class() -> type[Section]:
    """The ``convert`` section: what every conversion shares, and the runtimes living there.

    The runtimes whose keys predate ``runtimes.*`` (``Runtime.home == "convert"``) have their
    fields flat in it, beside `ConversionSettings`.
    """
    bases = [runtime.section for runtime in registry().values()
             if runtime.home == "convert" and runtime.section is not None]
    # pydantic lists the fields of the last base first: keep the runtimes' order.
    return create_model("ConvertConfig", __base__=tuple(reversed([ConversionSettings, *bases])),
                        __module__=__name__,
                        __doc__="Which converted and compiled forms of each model to build "
                                "and benchmark.")


def runtimes_config_class() -> type[Section]:
    """The ``runtimes`` section: one field per runtime whose section lives there."""
    fields: dict[str, Any] = {
        runtime.name: (runtime.section, Field(default_factory=runtime.section,
                                              description=_first_line(runtime.section.__doc__)))
        for runtime in registry().values()
        if runtime.home == "runtimes" and runtime.section is not None
    }
    return create_model("RuntimesConfig", __base__=Section, __module__=__name__,
                        __doc__="Each runtime's own settings (runtimes.<name>).", **fields)


ConvertConfig = convert_config_class()
RuntimesConfig = runtimes_config_class()
