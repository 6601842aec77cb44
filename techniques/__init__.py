"""Compression techniques, one module each; the registry finds them (no list to edit).

Adding a technique: a module here that declares its config section (a `TechniqueSection`)
and defines ``TECHNIQUE = Technique(...)`` (see `techniques.base`). The ``compress`` section is
assembled from the registry (`compress_config_class`), and the techniques run in the order their
``starts_from`` declares (`run_order`). How they are planned and run is the `compress` package.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any, Literal

from pydantic import Field, create_model, model_validator

import tfopt  # noqa: F401  (environment before TensorFlow)
from techniques.base import Technique, TechniqueSection
from tfopt.config import Section
from tfopt.runtimes import compress_keys

NOT_TECHNIQUES = frozenset({"base"})
"""The package's modules that hold no technique: what techniques share, and how they are run."""


@cache
def registry() -> dict[str, Technique]:
    """Every technique module's ``TECHNIQUE`` in this package, by name, in run order.

    Every module but `NOT_TECHNIQUES` holds one.

    Raises:
        LookupError: A module without ``TECHNIQUE``, two techniques with one name, or a
            technique continuing from one that does not exist (or from itself, in a circle).
    """
    found: dict[str, Technique] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in NOT_TECHNIQUES:
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

    forms: Literal["all", "tflite", "tflite_int8"] = Field(
        "all",
        description=(
            "The forms of every compressed model: all those the runtimes' keys ask for, only its "
            "int8 and fp32 TFLite files, or only its int8 TFLite file. A run whose time budget "
            "cannot hold the measurements of all of them narrows to tflite on its own, to "
            "tflite_int8 when even those would not fit, and says so."
        ),
    )
    float_stem: bool | None = Field(
        None,
        description=(
            "Whether each compressed model thinner or shallower than the baseline (channel and "
            "depth pruning, distillation) also gets selective int8 with its first convolution "
            "in float beside its int8 TFLite file (kept when a quick timing finds it faster "
            "than its full int8 file): null, when the baseline's was found faster on this "
            "machine; true, always; false, never (any value: only while "
            "convert.selective_int8 and convert.selective_float_stem are on)."
        ),
    )

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


