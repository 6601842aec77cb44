"""Does this machine run multi-threaded inference at two speeds? Which work does its slow state hit?

Usage: .venv/bin/python benchmarks/machine_states.py [--tflite FILE] [--threads 2]
                                                     [--seconds 150] [--window 0.15]

Short windows (0.15 s) of five workloads alternate for ``--seconds``: the LiteRT file at
``--threads`` (by default an untrained MobileNetV2 at 160 px in fp32, built here; or a run's
``variants/baseline-tflite-int8.tflite``), the same file at 1 thread, and three probes that
involve no runtime tfopt measures: a NumPy matrix product on OpenBLAS's ``--threads`` threads,
the same on 1 thread, and a pure Python loop. Each window's median is kept. A window is slow
when the file at ``--threads`` reads over 1.25x its median; printed per workload: its window
medians' p10/p50/p90, and its median in the slow windows over its median in the others (1.0:
the slow state does not touch it). So a sceptic can tell a VM whose second vCPU stalls for
seconds (only the multi-threaded workloads slow) from a busy or throttled machine (all slow).

Measured (2026-11-28, AMD EPYC Firecracker VM, 2 vCPUs, 150 s each): EfficientNetB0 64 px int8
from a run, 55 of 200 rounds slow: the file at 2 threads 1.93x in them (p50 0.358 ms, p90 0.693),
at 1 thread 1.00 (0.532 ms: slower than 2 threads' fast state, faster than their slow one),
OpenBLAS at 2 threads 1.17, at 1 thread 1.01, Python 1.00. Untrained MobileNetV2 160 px fp32,
20 of 199 slow: 2 threads 1.40, 1 thread 1.02, OpenBLAS 1.15 and 1.07, Python 0.99. The slow
state hits work split across both vCPUs (as if the second one stalled), not the machine as a
whole: a probe on one thread cannot see it. Hence the run-off's paired rounds and its wide
margin (README "Run-off"), and own turns that can differ ~2x between runs ("Known limits").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SLOW = 1.25
"""A window is in the slow state when the multi-threaded file reads this much over its median."""


def _file_call(path: Path, threads: int) -> Callable[[int], object]:
    """`harness_overhead.bare_tflite` on the file, fed 16 fixed random inputs in turn."""
    from ai_edge_litert.interpreter import Interpreter
    from harness_overhead import bare_tflite

    entry = Interpreter(model_path=str(path)).get_input_details()[0]
    rng = np.random.default_rng(0)
    shape = [1, *entry["shape"][1:]]
    if np.issubdtype(entry["dtype"], np.integer):
        info = np.iinfo(entry["dtype"])
        feeds = [rng.integers(info.min, info.max, shape).astype(entry["dtype"])
                 for _ in range(16)]
    else:
        feeds = [rng.random(shape, dtype=np.float32).astype(entry["dtype"]) for _ in range(16)]
    bare = bare_tflite(path, threads)
    return lambda index: bare(feeds[index % 16])


def _matmul_call(threads: int) -> Callable[[int], object]:
    """A 384x384 float32 matrix product on `threads` of OpenBLAS's threads."""
    from threadpoolctl import threadpool_limits

    matrix = np.random.default_rng(1).standard_normal((384, 384)).astype(np.float32)

    def call(index: int) -> object:
        with threadpool_limits(threads, user_api="blas"):
            return matrix @ matrix

    return call


def _python_call(index: int) -> int:
    return sum(k * k for k in range(2000))


def _window_median_ms(call: Callable[[int], object], seconds: float) -> float:
    durations, index = [], 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        before = time.perf_counter()
        call(index)
        durations.append(time.perf_counter() - before)
        index += 1
    return float(np.median(durations)) * 1000.0


def _default_file(out: Path) -> Path:
    """An untrained MobileNetV2 at 160 px as fp32 LiteRT (speed does not depend on weights)."""
    import tfopt  # noqa: F401
    from tfopt.models.serving_export import save_serving_savedmodel
    from tfopt.models.zoo import build_model
    from tfopt.runtimes._litert_files import serving_converter

    model = build_model("mobilenet_v2", 160, 10, alpha=1.0)
    save_serving_savedmodel(model, 160, out / "savedmodel")
    path = out / "mobilenet_v2.tflite"
    path.write_bytes(serving_converter(out / "savedmodel").convert())
    return path


def measure(workloads: dict[str, Callable[[int], object]], seconds: float,
            window: float) -> np.ndarray:
    """Window medians (ms), one row per round of all `workloads` in turn, for `seconds`."""
    for call in workloads.values():
        _window_median_ms(call, 2 * window)
    rows = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        rows.append([_window_median_ms(call, window) for call in workloads.values()])
    return np.asarray(rows)


def report(names: list[str], rows: np.ndarray) -> list[str]:
    """Per workload its spread and its slow-window / other-window ratio (row 0 defines slow)."""
    relative = rows / np.median(rows, axis=0)
    slow = relative[:, 0] > SLOW
    lines = [f"{len(rows)} rounds; {int(slow.sum())} slow ({slow.mean():.0%}): "
             f"{names[0]} over {SLOW}x its median"]
    for column, name in enumerate(names):
        values = rows[:, column]
        inside = (np.median(relative[slow, column]) / np.median(relative[~slow, column])
                  if slow.any() and (~slow).any() else float("nan"))
        lines.append(f"{name:28s} p10 {np.percentile(values, 10):8.4f}  p50 "
                     f"{np.median(values):8.4f}  p90 {np.percentile(values, 90):8.4f} ms  "
                     f"slow/other windows {inside:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tflite", type=Path, help="a LiteRT file (default: built here)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--window", type=float, default=0.15)
    args = parser.parse_args()
    from tfopt.cpu_features import inference_features
    from tfopt.provenance import cpu_model

    with tempfile.TemporaryDirectory() as scratch:
        path = args.tflite or _default_file(Path(scratch))
        workloads = {f"file at {args.threads} threads": _file_call(path, args.threads),
                     "file at 1 thread": _file_call(path, 1),
                     f"matmul at {args.threads} threads": _matmul_call(args.threads),
                     "matmul at 1 thread": _matmul_call(1), "python loop": _python_call}
        print(f"{path.name} on {cpu_model()} (features: "
              f"{', '.join(inference_features()) or 'none'})", flush=True)
        rows = measure(workloads, args.seconds, args.window)
    print("\n".join(report(list(workloads), rows)))


if __name__ == "__main__":
    sys.exit(main())
