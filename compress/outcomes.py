"""What each technique's outcome gives the benchmark: its variants, skipped, failed or to build.

A technique's outcome is a final Prefect state: Completed with its model, Completed "Skipped"
with a `Skipped` (not applicable, cut by the budget, or continuing from a skipped one), or
Failed. These turn it into the variants the run lists, each with its reason.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.states import State

from compress import Planned
from techniques.base import NotApplicable, Skipped
from tfopt.artifacts import ModelArtifact, VariantSpec
from tfopt.orchestration import error_of
from tfopt.runtimes import read_back_file
from tfopt.variants import failed, skipped


def not_built(planned: Planned, state: State, plans: list[Planned],
              states: dict[str, State]) -> list[VariantSpec]:
    """The variants of a technique that made no model: skipped, failed, or as its start was.

    `states` holds every technique's final state by name.
    """
    base = planned.starts_from
    outcome = state.result(raise_on_failure=False)
    if base is not None and not isinstance(outcome, Skipped) and not states[base].is_completed():
        start = next(p for p in plans if p.technique.name == base)
        start_variants = not_built(start, states[base], plans, states)
        return without_base(planned, start_variants[0] if start.variants else None)
    if isinstance(outcome, Skipped):
        return [skipped(spec, outcome.line()) for spec in planned.variants]
    if isinstance(outcome, NotApplicable):
        return [skipped(spec, f"{planned.technique.name} does not apply: {outcome}")
                for spec in planned.variants]
    error = f"{planned.source} failed: {error_of(state)}"
    return [failed(spec, error) for spec in planned.variants]


def without_base(planned: Planned, base: VariantSpec | None) -> list[VariantSpec]:
    """A technique whose starting model is missing: skipped or failed as that model's variants."""
    why = f"{base.status}: {base.error}" if base is not None else "not built"
    reason = (f"{planned.source} continues from the {planned.starts_from} technique's model, "
              f"which was {why}")
    mark = skipped if base is not None and base.status == "skipped" else failed
    return [mark(spec, reason) for spec in planned.variants]


def replanned(planned: Planned, model: ModelArtifact, config: Any, baseline: ModelArtifact,
              made: dict[str, ModelArtifact]) -> Planned:
    """A technique's plan made again with what is known now.

    Its searched strength names its variants, and the model it started from (itself searched,
    perhaps) names what they derive from.
    """
    technique, cfg = planned.technique, planned.cfg
    if technique.searched(cfg):
        cfg = technique.at(cfg, {field: float(model.params[field])
                                 for field in technique.knob.fields})
    start = made[planned.starts_from].name if planned.starts_from in made else baseline.name
    return Planned(technique, cfg, technique.variants(
        cfg, config, start, arrays=baseline.keras_file is not None))


def with_read_back(model: ModelArtifact, forms: list[VariantSpec]) -> ModelArtifact:
    """`model` with what its runtimes read back from its built files (`Runtime.read_back`).

    Read from the very files the benchmark measures, so the sparsity and clusters a technique
    kept are checked where they must survive; a file that cannot be read is logged and passed
    over.
    """
    found: dict[str, float] = {}
    for spec in forms:
        if spec.status != "ok":
            continue
        try:
            kept = read_back_file(spec)
        except (OSError, ValueError, RuntimeError) as error:
            get_run_logger().warning("%s: could not read %s back: %s", model.name, spec.name,
                                     error)
            continue
        if kept:
            get_run_logger().info("%s: read back from %s: %s", model.name, spec.name,
                                  {key: round(value, 3) for key, value in kept.items()})
        found = {**kept, **found}
    if not found:
        return model
    return model.model_copy(update={"metrics": {**model.metrics, **found}})
