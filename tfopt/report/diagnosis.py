"""Why an "optimized" variant came out slower or larger than what it came from."""

from __future__ import annotations

from tfopt.artifacts import VariantResult
from tfopt.runtimes import runtime_of

_SLOWER_MARGIN = 1.05
_COMPRESSED = ("sparsity and smaller weights do not speed up dense kernels: the gain is "
               "compressed size (or a smaller network's fewer operations, if any)")


def slowdown_reason(result: VariantResult, reference: VariantResult) -> str:
    """Why `result` may come out slower than `reference`, as commonly observed on a CPU.

    A technique's model against the baseline's same form: compression; else what the
    variant's runtime knows of its form (`Runtime.slowdown_reason`).
    """
    if result.source != reference.source:
        return _COMPRESSED
    return runtime_of(result.format).slowdown_reason(result) or "no known cause"


def diagnose(results: list[VariantResult]) -> dict[str, list[str]]:
    """Notes for variants that came out slower or larger than what they optimize.

    Returns:
        Variant name to notes (empty for variants with nothing to remark).
    """
    ok = {r.name: r for r in results if r.status == "ok" and r.latency_ms}
    notes: dict[str, list[str]] = {name: [] for name in ok}
    for result in ok.values():
        reference = ok.get(result.derived_from or "")
        if reference is None:
            continue
        why = slowdown_reason(result, reference)
        if result.latency_ms.p50 > reference.latency_ms.p50 * _SLOWER_MARGIN:
            notes[result.name].append(
                f"slower than {reference.name} (p50 {result.latency_ms.p50:.3f} vs "
                f"{reference.latency_ms.p50:.3f} ms): {why}"
            )
        if result.size_bytes > reference.size_bytes:
            notes[result.name].append(
                f"larger than {reference.name} ({result.size_bytes:,} vs "
                f"{reference.size_bytes:,} bytes)"
            )
    for result in ok.values():
        if not result.latency_ms.stable:
            low, high = result.latency_ms.p50_ci95 or (float("nan"), float("nan"))
            notes[result.name].append(
                f"unstable measurement (its windows' medians spread {low:.3f}-{high:.3f} ms "
                "and did not settle within benchmark.p50_ci_width before max_seconds): rerun "
                "on a quieter machine before trusting small differences"
            )
        if result.under_load:
            notes[result.name].append(
                "timed while other processes kept "
                f"{max(result.background_cores_before or 0.0, result.background_cores or 0.0):.2f}"
                " cores busy, also on its second try: its latency reads high"
            )
    return notes
