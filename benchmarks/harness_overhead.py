"""The benchmark harness's p50 against a bare runtime loop, side by side, for TFLite and ONNX.

Usage: .venv/bin/python benchmarks/harness_overhead.py [--rounds 5] [--runs 2000]
       [--models small,mobilenet_v2] [--threads 2]
       .venv/bin/python benchmarks/harness_overhead.py --summary .tfopt/demo-summary.json

Models (untrained: speed does not depend on the weights): the demo's small CNN at 32x32 and
MobileNetV2 (alpha 1.0) at 224x224, each as fp32 TFLite and as ONNX (tf2onnx). For each model
and runtime, rounds alternate between the harness (tfopt's runner: `prepare` outside the timed
region, `invoke` timed by `time_runs` with the run's protocol) and a bare loop on its own
runtime instance (LiteRT set_tensor/invoke/get_tensor; ONNX Runtime session.run), both on the
same inputs with the same threads. Goal: harness p50 / bare p50 <= 1.05 (the median over rounds,
with the spread of the per-round ratios). The harness's floor (the identity-like floor model
through the same runner) is printed too.

With ``--summary``, the files of a finished run are re-measured instead, as a sceptic would: the
champion and the baseline's int8 and fp32 TFLite files (those in TFLite or ONNX form), each by a
bare loop (500 warm-up calls, then 3,000 timed, per round) on the run's own test images and
threads, against the p50 the summary reports. Goal: within 5%. Each round also re-times the file
through the harness right then, so a machine that got faster or slower since the run (a shared
host's level shifts) shows as harness-now / bare near 1 while summary / bare is off.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tfopt  # noqa: F401

MODELS = {"small": ("small_cnn", 32, {"width": 32}),
          "mobilenet_v2": ("mobilenet_v2", 224, {"alpha": 1.0})}


def build_files(name: str, out_dir: Path) -> tuple[int, Path, Path]:
    """The model as fp32 TFLite and ONNX files; returns its image size and the two paths."""
    from tfopt.models.serving_export import save_serving_savedmodel
    from tfopt.models.zoo import build_model
    from tfopt.runtimes._litert_files import serving_converter
    from tfopt.runtimes.onnxruntime import run_tf2onnx

    architecture, size, options = MODELS[name]
    model = build_model(architecture, size, 10, **options)
    savedmodel = out_dir / f"{name}-savedmodel"
    save_serving_savedmodel(model, size, savedmodel)
    converter = serving_converter(savedmodel)
    tflite = out_dir / f"{name}.tflite"
    tflite.write_bytes(converter.convert())
    onnx = out_dir / f"{name}.onnx"
    run_tf2onnx(savedmodel, onnx, 17)
    return size, tflite, onnx


def bare_tflite(path: Path, threads: int) -> Callable[[np.ndarray], object]:
    """A plain LiteRT call on its own interpreter: set_tensor, invoke, get_tensor."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    interpreter.allocate_tensors()
    entry = interpreter.get_input_details()[0]["index"]
    exit_ = interpreter.get_output_details()[0]["index"]

    def call(image: np.ndarray) -> object:
        interpreter.set_tensor(entry, image)
        interpreter.invoke()
        return interpreter.get_tensor(exit_)

    return call


def bare_onnx(path: Path, threads: int) -> Callable[[np.ndarray], object]:
    """A plain ONNX Runtime call on its own session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outputs = [session.get_outputs()[0].name]
    return lambda image: session.run(outputs, {name: image})


def _bare_call(runtime: str, path: Path, threads: int) -> Callable[[np.ndarray], object]:
    return (bare_tflite if runtime == "tflite" else bare_onnx)(path, threads)


def bare_p50(call: Callable[[np.ndarray], object], images: list[np.ndarray], runs: int,
             warmup: int) -> float:
    """p50 in ms of `call` over `images` in turn, the first `warmup` calls untimed."""
    samples = []
    for index in range(warmup + runs):
        image = images[index % len(images)]
        started = time.perf_counter()
        call(image)
        if index >= warmup:
            samples.append((time.perf_counter() - started) * 1000.0)
    return float(np.median(samples))


def compare(label: str, runtime: str, path: Path, size: int, args: argparse.Namespace) -> float:
    """Alternate harness and bare rounds on one file; print and return the median ratio."""
    from tfopt.config import BenchmarkConfig
    from tfopt.measurement.floor import build_floor_models
    from tfopt.measurement.worker import time_runs
    from tfopt.runtimes.litert import TFLiteRunner
    from tfopt.runtimes.onnxruntime import OnnxRunner

    runner_class = TFLiteRunner if runtime == "tflite" else OnnxRunner
    images = np.random.default_rng(0).random((32, size, size, 3), dtype=np.float32)
    singles = [np.ascontiguousarray(images[i : i + 1]) for i in range(len(images))]
    runner = runner_class(path, threads=args.threads)
    bare_call = _bare_call(runtime, path, args.threads)
    floor_runner = runner_class(build_floor_models(size, path.parent / f"floor-{size}")[runtime],
                                threads=args.threads)
    prepared = runner.prepare(images)
    protocol = BenchmarkConfig(warmup_runs=50, warmup_seconds=0.2, min_runs=args.runs,
                               min_seconds=0.5, max_seconds=5, threads=args.threads)
    harness, bare_p50s, floors = [], [], []
    for _ in range(args.rounds):
        harness.append(float(np.median(time_runs(runner.invoke, prepared, protocol))))
        bare_p50s.append(bare_p50(bare_call, singles, args.runs, 50))
        floors.append(float(np.median(time_runs(floor_runner.invoke,
                                                floor_runner.prepare(images), protocol))))
    ratios = np.asarray(harness) / np.asarray(bare_p50s)
    ratio = float(np.median(ratios))
    verdict = "met" if ratio <= 1.05 else "missed"
    print(f"{label:13s} {runtime:6s}  bare {np.median(bare_p50s):8.4f} ms  harness "
          f"{np.median(harness):8.4f} ms  floor {np.median(floors):7.4f} ms  harness/bare "
          f"{ratio:.3f} (rounds {ratios.min():.3f}-{ratios.max():.3f})  <= 1.05 {verdict}")
    return ratio


RECHECK_WARMUP, RECHECK_RUNS = 500, 3000


def recheck_files(summary: dict, run_dir: Path) -> list[tuple[str, str, Path, float]]:
    """(variant, runtime, file, summary p50) for the champion and the baseline's TFLite files."""
    by_name = {entry["name"]: entry for entry in summary["variants"] if entry["status"] == "ok"}
    wanted = [summary.get("champion"), "baseline-tflite-int8", "baseline-tflite-fp32"]
    found = []
    for name in dict.fromkeys(name for name in wanted if name in by_name):
        entry = by_name[name]
        if entry["format"] not in ("tflite", "onnx"):
            print(f"{name}: {entry['format']} has no bare runtime loop here; not rechecked")
            continue
        suffix = "tflite" if entry["format"] == "tflite" else "onnx"
        matches = sorted((run_dir / "variants").glob(f"{name}.{suffix}"))
        if entry["format"] == "onnx" and not matches:
            matches = sorted((run_dir / "variants").glob(f"{entry['source']}.onnx"))
        if not matches:
            print(f"{name}: no file under {run_dir / 'variants'}; not rechecked")
            continue
        found.append((name, entry["format"], matches[0], entry["latency_ms"]["p50"]))
    return found


def recheck_summary(summary_path: Path, rounds: int) -> int:
    """Re-measure a finished run's files with bare loops; print summary p50 / bare p50."""
    import json

    from tfopt.config import BenchmarkConfig
    from tfopt.measurement.worker import time_runs
    from tfopt.runtimes._litert_files import TFLiteRunner, quantize
    from tfopt.runtimes.onnxruntime import OnnxRunner

    summary = json.loads(summary_path.read_text())
    run_dir = summary_path.parent / "work" / "runs"
    run_dir = next(run_dir.glob(f"*-{summary['mlflow_run_id'][:12]}"), run_dir)
    threads = int(summary["environment"].get("benchmark_threads", 1))
    images = np.load(run_dir / "benchmark-inputs" / "test-images.npy")[:64]
    protocol = BenchmarkConfig(threads=threads)
    print(f"{summary_path}: run {summary['mlflow_run_id']}, {threads} thread(s); bare loop "
          f"{RECHECK_WARMUP} warm-up + {RECHECK_RUNS} timed calls, {rounds} round(s)")
    worst = 0.0
    for name, runtime, path, reported in recheck_files(summary, run_dir):
        runner = (TFLiteRunner if runtime == "tflite" else OnnxRunner)(path, threads)
        prepared = runner.prepare(images)
        detail = runner.input_detail if runtime == "tflite" else {"dtype": np.float32}
        singles = list(quantize(images, detail)[:, None])
        bare_call = _bare_call(runtime, path, threads)
        bare, now = [], []
        for _ in range(rounds):
            bare.append(bare_p50(bare_call, singles, RECHECK_RUNS, RECHECK_WARMUP))
            now.append(float(np.median(time_runs(runner.invoke, prepared, protocol))))
        off = abs(reported / np.median(bare) - 1.0)
        worst = max(worst, off)
        print(f"{name:32s} summary {reported:8.4f} ms  bare {np.median(bare):8.4f} ms "
              f"(rounds {min(bare):.4f}-{max(bare):.4f})  summary/bare "
              f"{reported / np.median(bare):.3f}  harness-now/bare "
              f"{np.median(now) / np.median(bare):.3f}  within 5% "
              f"{'yes' if off <= 0.05 else 'no'}")
    verdict = "met" if worst <= 0.05 else "missed"
    print(f"largest summary-vs-bare gap {worst:.1%}: goal <= 5% {verdict}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="small,mobilenet_v2")
    parser.add_argument("--summary", type=Path, default=None,
                        help="re-measure this run summary's files instead (see above)")
    args = parser.parse_args(argv)
    if args.summary is not None:
        return recheck_summary(args.summary, args.rounds)
    out_dir = Path(tempfile.mkdtemp(prefix="tfopt-harness-"))
    print(f"{args.rounds} alternating rounds of >= {args.runs} batch-1 runs, "
          f"{args.threads} thread(s); p50 per round, median over rounds")
    ratios = []
    for name in args.models.split(","):
        size, tflite, onnx = build_files(name, out_dir)
        for runtime, path in (("tflite", tflite), ("onnx", onnx)):
            ratios.append(compare(f"{name} {size}px", runtime, path, size, args))
    print(f"worst harness/bare {max(ratios):.3f}: goal <= 1.05 "
          f"{'met' if max(ratios) <= 1.05 else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
