"""Compression techniques, one module each; the registry finds them (no list to edit).

Adding a technique: a module here that declares its config section (a `TechniqueSection`)
and defines ``TECHNIQUE = Technique(...)`` (see `techniques.base`). The ``compress`` section is
assembled from the registry (`compress_config_class`), the techniques run in the order their
``starts_from`` declares (`run_order`), and the compression subflow loops over `plan(...)`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from prefect import Task, task
from pydantic import Field, create_model, model_validator

import tfopt  # noqa: F401  (environment before TensorFlow)
from techniques.base import Technique, TechniqueSection
from tfopt.artifacts import ModelArtifact, TrainingData, VariantSpec
from tfopt.config import Section
from tfopt.native import NativeStep, run_native
from tfopt.runtimes import compress_keys
from tfopt.variants import failed, skipped


@cache
def registry() -> dict[str, Technique]:
    """Every technique module's ``TECHNIQUE`` in this package, by name, in run order.

    Raises:
        LookupError: A module without ``TECHNIQUE``, two techniques with one name, or a
            technique continuing from one that does not exist (or from itself, in a circle).
    """
    found: dict[str, Technique] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        technique = getattr(module, "TECHNIQUE", None)
        if not isinstance(technique, Technique):
            raise LookupError(f"techniques/{info.name}.py defines no TECHNIQUE = Technique(...)")
        if technique.name in found:
            raise LookupError(f"two techniques are named {technique.name!r}")
        found[technique.name] = technique
    return {name: found[name] for name in run_order(found)}


def _possible_bases(technique: Technique) -> set[str]:
    """Every technique `technique` may continue from, whatever its settings."""
    if callable(technique.starts_from):
        defaults = technique.section()
        bases = {technique.starts_from(defaults)}
        for field, info in technique.section.model_fields.items():
            if info.annotation in (bool, "bool"):
                bases.add(technique.starts_from(
                    defaults.model_copy(update={field: not getattr(defaults, field)})))
        return {base for base in bases if base}
    return {technique.starts_from} if technique.starts_from else set()


def run_order(techniques: dict[str, Technique]) -> list[str]:
    """The techniques' names, each after every technique it may continue from, else by name.

    Raises:
        LookupError: A technique continues from an unknown technique, or the chain is circular.
    """
    bases = {name: _possible_bases(t) for name, t in techniques.items()}
    for name, wanted in bases.items():
        unknown = wanted - set(techniques)
        if unknown:
            raise LookupError(f"technique {name} continues from unknown {sorted(unknown)}")
    ordered: list[str] = []
    while len(ordered) < len(techniques):
        ready = sorted(name for name in techniques
                       if name not in ordered and bases[name] <= set(ordered))
        if not ready:
            raise LookupError(f"techniques continue from each other in a circle: "
                              f"{sorted(set(techniques) - set(ordered))}")
        ordered += ready
    return ordered


_MOVED_COMPRESS_KEYS = {
    "target_sparsity": "compress.prune.target_sparsity",
    "structured_2_4": "compress.prune.structured_2_4",
    "prune_epochs": "compress.prune.epochs",
    "student_width": "compress.distill.student_width",
    "distill_alpha": "compress.distill.alpha",
    "temperature": "compress.distill.temperature",
    "distill_epochs": "compress.distill.epochs",
    "qat_epochs": "compress.qat.epochs",
    "finetune_learning_rate": "compress.prune.learning_rate and compress.qat.learning_rate",
}
"""Keys of the flat `compress` section before techniques had sections of their own."""


class CompressSection(Section):
    """Model compression: one section per technique, and the forms of their models."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_old_keys(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        moved = [f"compress.{key} is now {_MOVED_COMPRESS_KEYS[key]}"
                 for key in raw if key in _MOVED_COMPRESS_KEYS]
        moved += [f"compress.{key}: {value!r} is now compress.{key}.enabled: {value!r}"
                  for key, value in raw.items()
                  if key in registry() and isinstance(value, bool)]
        if moved:
            raise ValueError("old compress keys: " + "; ".join(moved))
        return raw

    def techniques(self) -> list[tuple[str, TechniqueSection]]:
        """Each technique's name and settings, in run order."""
        return [(name, getattr(self, name)) for name in registry()
                if isinstance(getattr(self, name, None), TechniqueSection)]


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0]


def compress_config_class() -> type[CompressSection]:
    """The ``compress`` section: one field per registered technique, and the runtimes' keys."""
    fields: dict[str, Any] = {
        name: (technique.section, Field(default_factory=technique.section,
                                        description=_first_line(technique.section.__doc__)))
        for name, technique in registry().items()
    }
    return create_model("CompressConfig", __base__=CompressSection, __module__=__name__,
                        __doc__=CompressSection.__doc__, **fields, **compress_keys())


CompressConfig = compress_config_class()


@dataclass(frozen=True)
class Planned:
    """An enabled technique with its settings and the variants it will yield."""

    technique: Technique
    cfg: TechniqueSection
    variants: list[VariantSpec]
    refusal: str | None = None

    @property
    def source(self) -> str:
        """The name of the model the technique makes."""
        return self.technique.source_name(self.cfg)

    @property
    def starts_from(self) -> str | None:
        """The technique whose model it continues from (None: the baseline)."""
        return self.technique.base_of(self.cfg)


def plan(config: Any, model: ModelArtifact) -> list[Planned]:
    """The enabled techniques in run order, each with its planned variants for `model`.

    A technique that cannot work on this kind of model, or continues from a technique that is
    not enabled, is planned with its refusal; its variants are marked skipped.

    Args:
        config: The pipeline's configuration (its ``compress``, ``convert`` and ``runtimes``
            sections).
        model: The baseline.

    Raises:
        LookupError: A config section of the wrong class.
    """
    techniques = registry()
    compress = config.compress
    plans = []
    for name, cfg in compress.techniques():
        technique = techniques[name]
        if not isinstance(cfg, technique.section):
            raise LookupError(f"compress.{name} must be a {technique.section.__name__}")
        if not cfg.enabled:
            continue
        start, refusal, base = model.name, technique.refusal(model), technique.base_of(cfg)
        if base is not None:
            base_cfg = getattr(compress, base)
            start = techniques[base].source_name(base_cfg)
            if not base_cfg.enabled and refusal is None:
                refusal = f"{name} continues from the {base} technique's model: enable " \
                          f"compress.{base}"
        variants = technique.variants(cfg, config, start)
        if refusal:
            variants = [skipped(spec, refusal) for spec in variants]
        plans.append(Planned(technique, cfg, variants, refusal))
    return plans


def apply_here(name: str, model: ModelArtifact, cfg: TechniqueSection, data: TrainingData,
               out_dir: Path) -> ModelArtifact:
    """Apply technique `name` in this process (what its child process runs: `contained`)."""
    return registry()[name].apply.fn(model, cfg, data, out_dir)


@cache
def contained(name: str) -> Task:
    """Technique `name`'s task as the flows run it: its name and tags, its body in a child process.

    Fine-tuning runs the model in TensorFlow's kernels: a crash there fails this technique
    (`tfopt.native`: one line, retried once without oneDNN), and the others go on.
    """
    technique = registry()[name]
    step = NativeStep(technique.apply.name,
                      f"the {name} technique's fine-tuning in TensorFlow's kernels",
                      "the other techniques go on; this one's variants are reported failed")

    def run_technique(model: ModelArtifact, cfg: TechniqueSection, data: TrainingData,
                      out_dir: Path) -> ModelArtifact:
        return run_native(step, apply_here, name, model, cfg, data, out_dir)

    run_technique.__doc__ = technique.apply.fn.__doc__
    return task(run_technique, name=technique.apply.name, tags=sorted(technique.apply.tags))


def all_failed(plans: list[Planned], error: str) -> list[VariantSpec]:
    """Every planned variant marked failed with `error` (when the whole subflow failed)."""
    return [failed(spec, error) if spec.status == "ok" else spec
            for planned in plans for spec in planned.variants]
