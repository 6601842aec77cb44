"""Two TFLite files timed in a bare loop, alternating, for an independent speed-up check.

Usage: .venv/bin/python benchmarks/tflite_pair.py FAST.tflite REFERENCE.tflite IMAGES.npy
       [--rounds 7] [--calls 2000] [--threads 1]

Each round times `--calls` single-image calls of each file (LiteRT's Interpreter: `set_tensor`
then `invoke`, nothing else), one file after the other, on the run's test images (a run's
``benchmark-inputs/test-images.npy``), the process pinned to the last `--threads` CPUs
(pinned to one, a second thread shares its core and a two-thread figure is a one-thread one).
It prints each round's medians and the reference's median over the fast file's: the figure a run's
side-by-side speed-up should agree with.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter


def _prepared(path: Path, images: np.ndarray, threads: int) -> tuple[Interpreter, int, list]:
    """The file's interpreter, its input index and the images as its input takes them."""
    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    scale, zero = detail["quantization"]
    if detail["dtype"] == np.int8:
        feeds = [(image[None] / scale + zero).round().clip(-128, 127).astype(np.int8)
                 for image in images]
    else:
        feeds = [image[None].astype(detail["dtype"]) for image in images]
    return interpreter, detail["index"], feeds


def _median_ms(prepared: tuple[Interpreter, int, list], calls: int) -> float:
    interpreter, index, feeds = prepared
    times = []
    for call in range(calls):
        started = time.perf_counter()
        interpreter.set_tensor(index, feeds[call % len(feeds)])
        interpreter.invoke()
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fast", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("images", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[-args.threads:]))
    images = np.load(args.images)[:200]
    files = {path.name: _prepared(path, images, args.threads)
             for path in (args.fast, args.reference)}
    ratios = []
    for round_ in range(args.rounds):
        medians = {name: _median_ms(prepared, args.calls) for name, prepared in files.items()}
        ratios.append(medians[args.reference.name] / medians[args.fast.name])
        print(f"round {round_}: " + ", ".join(f"{name} {ms:.4f} ms" for name, ms in
                                             medians.items()) + f"; ratio {ratios[-1]:.2f}")
    print(f"{args.reference.name} / {args.fast.name}: median {np.median(ratios):.2f}x "
          f"[{min(ratios):.2f}, {max(ratios):.2f}] over {args.rounds} rounds")


if __name__ == "__main__":
    main()
