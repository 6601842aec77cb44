"""Compression techniques, one module each; the registry finds them (no list to edit).

Adding a technique: a module here that defines ``TECHNIQUE = Technique(...)`` (see
`techniques.base`) and a `TechniqueSection` field of the same name in
`tfopt.config.CompressConfig`. The compression subflow loops over `plan(...)`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache

import tfopt  # noqa: F401  (environment before TensorFlow)
from techniques.base import Technique
from tfopt.artifacts import ModelArtifact, VariantSpec
from tfopt.config import CompressConfig, TechniqueSection
from tfopt.variants import failed, skipped


@cache
def registry() -> dict[str, Technique]:
    """Every technique module's ``TECHNIQUE`` in this package, by name.

    Raises:
        LookupError: A module without ``TECHNIQUE``, or two techniques with one name.
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
    return found


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


def plan(compress: CompressConfig, model: ModelArtifact) -> list[Planned]:
    """The enabled techniques in config order, each with its planned variants for `model`.

    A technique that cannot work on this kind of model, or continues from a technique that is
    not enabled, is planned with its refusal; its variants are marked skipped. A technique
    comes after the one it continues from (config order).

    Raises:
        LookupError: A config section with no technique module, or of the wrong class.
    """
    techniques = registry()
    plans = []
    for name, cfg in compress.techniques():
        if name not in techniques:
            raise LookupError(f"compress.{name} has no technique module (techniques/{name}.py)")
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
        variants = technique.variants(cfg, compress.tflite, start, graph=compress.graph)
        if refusal:
            variants = [skipped(spec, refusal) for spec in variants]
        plans.append(Planned(technique, cfg, variants, refusal))
    return plans


def all_failed(plans: list[Planned], error: str) -> list[VariantSpec]:
    """Every planned variant marked failed with `error` (when the whole subflow failed)."""
    return [failed(spec, error) if spec.status == "ok" else spec
            for planned in plans for spec in planned.variants]
