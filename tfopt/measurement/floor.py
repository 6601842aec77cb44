"""The harness's own floor: models that do next to nothing, timed through the same runners.

Each floor model takes the benchmark's input shape and returns the first pixel, so timing it
with a variant's runner, threads and protocol measures what the harness and the runtime cost
per call (handing the input over, the invoke, fetching the output) with no model in the way. A
variant whose p50 is close to its floor is limited by the calling overhead, not by its
arithmetic. Every runtime writes its own floor models (`Runtime.floor_models`) and says which
one a variant is timed against (`Runtime.floor_format`).
"""

from __future__ import annotations

from pathlib import Path

from tfopt.runtimes import registry, runtime_of


def floor_format(variant_format: str) -> str:
    """Which floor model a variant of `variant_format` is timed against ('' for none)."""
    return runtime_of(variant_format).floor_format(variant_format) or ""


def floor_key(variant_format: str, threads: int) -> str:
    """Which floor measurement a variant of `variant_format` at `threads` threads shares."""
    return f"{floor_format(variant_format)}@{threads}"


def build_floor_models(input_shape: tuple[int, ...], out_dir: Path) -> dict[str, Path]:
    """Every runtime's floor models for inputs of `input_shape` (per example), written once.

    Files already written by an earlier attempt of the same run are reused.

    Returns:
        Floor model path per format that opens it (``graph``, ``savedmodel``, ``tflite`` ...).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    floors: dict[str, Path] = {}
    for runtime in registry().values():
        floors.update(runtime.floor_models(tuple(input_shape), out_dir))
    return floors
