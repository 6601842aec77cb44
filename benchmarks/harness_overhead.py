"""The benchmark harness's p50 for a TFLite model against a bare timing loop, side by side.

Usage: .venv/bin/python benchmarks/harness_overhead.py [--rounds 5] [--runs 300]

Both time the same model file with the same LiteRT interpreter settings on the same inputs at
batch 1; the harness goes through tfopt's runner and protocol (`time_runs`), the bare loop calls
set_tensor/invoke/get_tensor on its own interpreter instance (LiteRT refuses raw tensor writes
while a signature runner holds the first one's buffers). Rounds alternate between the two;
the median of each is compared. Goal: the harness within 5% of the bare loop.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tfopt  # noqa: F401


def build_tflite(out_dir: Path, image_size: int, alpha: float) -> Path:
    """A MobileNetV2-style network (untrained: speed does not depend on the weights) as TFLite."""
    import tensorflow as tf

    from tasks.export_savedmodel import save_serving_savedmodel
    from tasks.model_zoo import build_model
    from tfopt.serving import SIGNATURE_KEY

    model = build_model("mobilenet_v2", image_size, 10, alpha=alpha)
    save_serving_savedmodel(model, image_size, out_dir / "savedmodel")
    converter = tf.lite.TFLiteConverter.from_saved_model(str(out_dir / "savedmodel"),
                                                         signature_keys=[SIGNATURE_KEY])
    path = out_dir / "model.tflite"
    path.write_bytes(converter.convert())
    return path


def bare_p50(interpreter: object, images: np.ndarray, runs: int, warmup: int) -> float:
    """p50 of a plain loop: set_tensor, invoke, get_tensor on the raw interpreter."""
    entry = interpreter.get_input_details()[0]["index"]
    exit_ = interpreter.get_output_details()[0]["index"]
    samples = []
    for index in range(warmup + runs):
        image = images[index % len(images)][np.newaxis]
        started = time.perf_counter()
        interpreter.set_tensor(entry, image)
        interpreter.invoke()
        interpreter.get_tensor(exit_)
        if index >= warmup:
            samples.append((time.perf_counter() - started) * 1000.0)
    return float(np.median(samples))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--alpha", type=float, default=0.35)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    from tasks.benchmark_worker import latency_stats, time_runs
    from tasks.runners import TFLiteRunner
    from tfopt.config import BenchmarkConfig

    path = build_tflite(Path(tempfile.mkdtemp(prefix="tfopt-harness-")), args.image_size,
                        args.alpha)
    rng = np.random.default_rng(0)
    images = rng.random((32, args.image_size, args.image_size, 3), dtype=np.float32)
    from ai_edge_litert.interpreter import Interpreter

    runner = TFLiteRunner(path, threads=args.threads)
    raw = Interpreter(model_path=str(path), num_threads=args.threads)
    raw.allocate_tensors()
    singles = [images[i : i + 1] for i in range(len(images))]
    protocol = BenchmarkConfig(warmup_runs=20, warmup_seconds=0.0, min_runs=args.runs,
                               min_seconds=0.0, max_seconds=600)
    harness, bare = [], []
    for _ in range(args.rounds):
        samples = time_runs(lambda i: runner.predict(singles[i % len(singles)]), protocol)
        harness.append(latency_stats(samples).p50)
        bare.append(bare_p50(raw, images, args.runs, 20))
    harness_p50, bare_median = float(np.median(harness)), float(np.median(bare))
    ratio = harness_p50 / bare_median
    print(f"model: MobileNetV2-style alpha {args.alpha}, {args.image_size}x{args.image_size}, "
          f"TFLite fp32, {args.threads} thread(s); {args.rounds} rounds of {args.runs} runs")
    print(f"bare loop p50   {bare_median:.4f} ms   (rounds: "
          + ", ".join(f"{v:.4f}" for v in bare) + ")")
    print(f"harness p50     {harness_p50:.4f} ms   (rounds: "
          + ", ".join(f"{v:.4f}" for v in harness) + ")")
    print(f"harness / bare  {ratio:.3f}   goal <= 1.05: {'met' if ratio <= 1.05 else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
