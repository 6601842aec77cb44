"""Variant identity: the one place that names a variant and records what it derives from.

A variant's name reads ``<source>-<form>[-<precision>]``: the source names the model (the
baseline, or a technique and its setting such as ``pruned-80``), the form its format (or a
more specific form of it, e.g. ``xla-autocluster``). Nothing parses a name back: source, format,
precision and `derived_from` travel as fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import zip_longest
from pathlib import Path

from tfopt.artifacts import Precision, VariantFormat, VariantSpec


def variant_name(source: str, form: str, precision: Precision, *,
                 names_precision: bool = False) -> str:
    """``<source>-<form>``, plus ``-<precision>`` for a non-fp32 model or where always named.

    Args:
        source: The model's name (``baseline``, ``pruned-80``, ``qat`` ...).
        form: The format, with its flavor if any (``graph``, ``xla-autocluster``, ``tflite``).
        precision: The numeric precision.
        names_precision: State fp32 too: the runtime chooses a precision per form
            (``baseline-tflite-fp32``; `Runtime.precision_named`).
    """
    shown = names_precision or precision != "fp32"
    return f"{source}-{form}-{precision}" if shown else f"{source}-{form}"


def plan_variant(
    source: str,
    format: VariantFormat,
    precision: Precision = "fp32",
    *,
    form: str = "",
    derived_from: str | None = None,
    path: Path | None = None,
    params: dict[str, str | int | float | bool] | None = None,
    names_precision: bool = False,
) -> VariantSpec:
    """A variant to build (``path`` None) or already built, named by `variant_name`.

    Runtimes plan through `Runtime.variant`, everything else through the registry's
    `tfopt.runtimes.plan_variant`, so a name follows its runtime's rule.

    Args:
        source: The model's name.
        format: The variant's format (the runner that measures it).
        precision: Its numeric precision.
        form: The form's name when it is more than the format: ``xla-autocluster`` (XLA
            auto-clustering), ``tftrt`` (a form measured through the SavedModel runner).
        derived_from: The variant this one is an optimized form of (None: a starting point).
        path: The model file or folder, if it exists already.
        params: How it was built (converter settings, XLA mode ...).
        names_precision: State fp32 in the name too (see `variant_name`).
    """
    return VariantSpec(
        name=variant_name(source, form or format, precision, names_precision=names_precision),
        source=source, format=format,
        precision=precision, path=path, form=form or format, derived_from=derived_from,
        params=params or {},
    )


def built(spec: VariantSpec, path: Path, **params: str | int | float | bool) -> VariantSpec:
    """`spec` with its model file in place and the parameters it was built with."""
    return spec.model_copy(update={"path": path, "params": {**spec.params, **params}})


def failed(spec: VariantSpec, error: str) -> VariantSpec:
    """`spec` marked failed with `error`, without a file."""
    return spec.model_copy(update={"status": "failed", "error": error, "path": None})


def skipped(spec: VariantSpec, reason: str) -> VariantSpec:
    """`spec` marked skipped (it cannot be built here) with the reason."""
    return spec.model_copy(update={"status": "skipped", "error": reason, "path": None})


def breadth_first(specs: Sequence[VariantSpec], group_of: Callable[[VariantSpec], str],
                  first: str | None = None) -> list[VariantSpec]:
    """`specs` with each group's first, then each one's second, and so on (plan order within).

    The variant named `first`, if any, leads as its group's first: a budget that stops partway
    through has then seen every group (runtime) before any group's second form.
    """
    leading = [spec for spec in specs if spec.name == first]
    groups: dict[str, list[VariantSpec]] = {group_of(spec): [spec] for spec in leading}
    for spec in specs:
        if spec.name != first:
            groups.setdefault(group_of(spec), []).append(spec)
    turns = zip_longest(*groups.values())
    return [spec for turn in turns for spec in turn if spec is not None]


QUICK_SPEEDUP = "quick_speedup_over_int8"
"""A built variant's parameter: how much faster than the full int8 file its build timed it
(selective int8's first convolution in float)."""


def quicker_than_reference(spec: VariantSpec) -> bool:
    """Whether `spec`'s build timed it faster than the int8 reference (`QUICK_SPEEDUP` > 1)."""
    return spec.status == "ok" and float(spec.params.get(QUICK_SPEEDUP, 0.0)) > 1.0
