"""Every CPU runtime side by side, and tfopt's p50 for each against its vendor's own tool.

Usage: .venv/bin/python benchmarks/runtimes.py [--models small,mobilenet_v2] [--rounds 3]
       [--seconds 3] [--threads 1] [--cpu 1]

Models (untrained: speed does not depend on the weights): the demo's small CNN (32 px, width
32) and MobileNetV2 (alpha 1.0, 160 px, the bench config's network). Each is converted as tfopt
converts it: TFLite fp32 and full-integer int8, ONNX (tf2onnx) fp32 and ONNX Runtime's static
int8, OpenVINO fp32 (run at f32 and, where the CPU has it, bf16) and NNCF int8; the integer
files are calibrated on 64 random images (the same for every runtime).

Each round times every file, alternating, through tfopt's runner (`prepare` outside the timed
region, `invoke` timed by `time_runs`, the run's protocol) and through its vendor's reference,
on the same inputs, threads and core (the process is pinned to ``--cpu``):
- LiteRT Interpreter: a bare set_tensor/invoke/get_tensor loop;
- LiteRT CompiledModel: LiteRT's shipped ``benchmark_litert_model.py`` (which rounds to 0.01 ms,
  too coarse below 0.2 ms) and a bare loop of the calls it times (``run_by_name`` on buffers);
- OpenVINO: ``benchmark_app`` (sync API, one stream, the same threads, static batch-1 shape,
  pinned: its UI takes these with ``-hint none`` only; it reports
  its C++ per-request counter, so no Python call overhead is in its figure) and a bare loop of
  OpenVINO's synchronous Python API with the same settings (the input set once, then
  ``InferRequest.infer()`` alone: the least a Python loop can do per call);
- ONNX Runtime: a bare ``session.run`` loop.
Goal: tfopt / vendor <= 1.05 (median over rounds, with the spread of per-round ratios). Then
the runtimes per precision: each runtime's median p50 (tfopt's harness) at fp32, bf16 and int8.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tfopt  # noqa: F401

MODELS = {"small": ("small_cnn", 32, {"width": 32}),
          "mobilenet_v2": ("mobilenet_v2", 160, {"alpha": 1.0})}
CALIBRATION = 64


def build_files(name: str, out_dir: Path) -> tuple[int, dict[str, Path]]:
    """The model's files per (runtime, precision) key; returns its image size and them."""
    import tensorflow as tf

    from tfopt.models.serving_export import save_serving_savedmodel
    from tfopt.models.zoo import build_model
    from tfopt.runtimes._litert_files import serving_converter
    from tfopt.runtimes.onnxruntime import quantize_onnx_file, run_tf2onnx
    from tfopt.runtimes.openvino import convert_savedmodel, save_model

    architecture, size, options = MODELS[name]
    model = build_model(architecture, size, 10, **options)
    savedmodel = out_dir / f"{name}-savedmodel"
    save_serving_savedmodel(model, size, savedmodel)
    calibration = np.random.default_rng(0).random((CALIBRATION, size, size, 3), np.float32)
    files: dict[str, Path] = {}
    for precision in ("fp32", "int8"):
        converter = serving_converter(savedmodel)
        if precision == "int8":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: ([image[None]] for image in calibration)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        files[f"litert-{precision}"] = out_dir / f"{name}-{precision}.tflite"
        files[f"litert-{precision}"].write_bytes(converter.convert())
    files["onnx-fp32"] = out_dir / f"{name}.onnx"
    run_tf2onnx(savedmodel, files["onnx-fp32"], 17)
    files["onnx-int8"] = out_dir / f"{name}-int8.onnx"
    quantize_onnx_file(files["onnx-fp32"], files["onnx-int8"], "int8",
                       iter([[image[None]] for image in calibration]))
    xml = convert_savedmodel(savedmodel, out_dir, f"{name}-openvino")
    files["openvino-fp32"] = files["openvino-bf16"] = xml
    import nncf
    import openvino as ov

    quantized = nncf.quantize(ov.Core().read_model(str(xml)),
                              nncf.Dataset([image[None] for image in calibration]),
                              subset_size=CALIBRATION)
    files["openvino-int8"] = save_model(quantized, out_dir / f"{name}-openvino-int8")
    return size, files


def harness(key: str, path: Path, threads: int) -> tuple[object, str]:
    """Tfopt's runner for a file, and the API it drives."""
    from tfopt.runtimes.litert import CompiledModelRunner, TFLiteRunner
    from tfopt.runtimes.onnxruntime import OnnxRunner
    from tfopt.runtimes.openvino import OpenVINORunner

    if key.startswith("litert"):
        return TFLiteRunner(path, threads), "interpreter"
    if key.startswith("compiled"):
        return CompiledModelRunner(path, threads), "compiled_model"
    if key.startswith("onnx"):
        return OnnxRunner(path, threads), "session.run"
    hint = {"openvino-fp32": "f32", "openvino-bf16": "bf16"}.get(key)
    return OpenVINORunner(path, threads, hint), "infer request"


def bare_loop(key: str, path: Path, threads: int, image: np.ndarray) -> Callable[[], object]:
    """One call of the vendor's documented API, set up as its own examples do."""
    if key.startswith("litert"):
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(path), num_threads=threads)
        interpreter.allocate_tensors()
        detail = interpreter.get_input_details()[0]
        output = interpreter.get_output_details()[0]["index"]
        values = _quantized(image, detail)

        def call() -> object:
            interpreter.set_tensor(detail["index"], values)
            interpreter.invoke()
            return interpreter.get_tensor(output)
        return call
    if key.startswith("compiled"):
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import CpuOptions, Options

        model = CompiledModel.from_file(str(path), options=Options(
            hardware_accelerators=HardwareAccelerator.CPU,
            cpu_options=CpuOptions(num_threads=threads)))
        signature = next(iter(model.get_signature_list()))
        inputs = {name: model.create_input_buffer_by_name(signature, name)
                  for name in model.get_input_tensor_details(signature)}
        outputs = {name: model.create_output_buffer_by_name(signature, name)
                   for name in model.get_output_tensor_details(signature)}
        for buffer in inputs.values():
            buffer.write(image)
        return lambda: model.run_by_name(signature, inputs, outputs)
    if key.startswith("onnx"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: image}
        return lambda: session.run(None, feed)
    import openvino as ov

    from tfopt.runtimes.openvino import batch_one_model, compile_config

    core = ov.Core()
    hint = {"openvino-fp32": "f32", "openvino-bf16": "bf16"}.get(key)
    compiled = core.compile_model(batch_one_model(core.read_model(str(path))), "CPU",
                                  compile_config(threads, hint))
    request = compiled.create_infer_request()
    request.set_input_tensor(ov.Tensor(image, shared_memory=True))
    return request.infer


def _quantized(image: np.ndarray, detail: dict) -> np.ndarray:
    if np.dtype(detail["dtype"]).kind == "f":
        return image
    scale, zero = detail["quantization"]
    return np.clip(np.round(image / scale + zero), -128, 127).astype(detail["dtype"])


def time_bare(call: Callable[[], object], seconds: float) -> float:
    """The p50 in ms of a bare loop: 1 s of warm-up, then `seconds` of timed calls."""
    until = time.perf_counter() + 1.0
    while time.perf_counter() < until:
        call()
    samples = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        before = time.perf_counter()
        call()
        samples.append(time.perf_counter() - before)
    return float(np.median(samples)) * 1000.0


def vendor_tool(key: str, path: Path, threads: int, size: int, seconds: float, cpu: int,
                ) -> float | None:
    """The vendor's own benchmark tool's median p50 (ms), pinned to the same core."""
    pin = ["taskset", "-c", str(cpu)]
    if key.startswith("compiled"):
        runs = max(50, int(seconds * 1000))
        with tempfile.NamedTemporaryFile(suffix=".json") as result:
            subprocess.run([*pin, sys.executable, "-m",
                            "ai_edge_litert.tools.benchmark_litert_model", "--model", str(path),
                            "--num_threads", str(threads), "--warmup_runs", "200",
                            "--num_runs", str(runs), "--result_json", result.name],
                           check=True, capture_output=True, timeout=600)
            return float(json.loads(Path(result.name).read_text())["latency"]["median_ms"])
    if key.startswith("openvino"):
        tool = Path(sys.executable).with_name("benchmark_app")
        precision = {"openvino-fp32": ["-infer_precision", "f32"],
                     "openvino-bf16": ["-infer_precision", "bf16"]}.get(key, [])
        done = subprocess.run([*pin, str(tool), "-m", str(path), "-d", "CPU", "-hint", "none",
                               "-api", "sync", "-nthreads", str(threads), "-nstreams", "1",
                               "-pin", "YES", "-shape", f"[1,{size},{size},3]",
                               "-t", str(max(1, int(seconds))), *precision],
                              check=True, capture_output=True, text=True, timeout=600)
        found = re.search(r"Median:\s+([\d.]+) (ms|us)", done.stdout)
        if found is None:
            return None
        return float(found.group(1)) / (1000.0 if found.group(2) == "us" else 1.0)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,mobilenet_v2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})

    from tfopt.config import BenchmarkConfig
    from tfopt.cpu_features import bf16_unavailable_reason
    from tfopt.measurement.worker import time_runs

    protocol = BenchmarkConfig(warmup_runs=200, warmup_seconds=1.0, min_runs=300,
                               min_seconds=args.seconds, max_seconds=args.seconds * 3,
                               p50_ci_width=0.03)
    keys = ["litert-fp32", "compiled-fp32", "onnx-fp32", "openvino-fp32", "openvino-bf16",
            "litert-int8", "compiled-int8", "onnx-int8", "openvino-int8"]
    if bf16_unavailable_reason():
        keys.remove("openvino-bf16")
    with tempfile.TemporaryDirectory(prefix="tfopt-runtimes-") as folder:
        for name in args.models.split(","):
            size, files = build_files(name, Path(folder))
            files["compiled-fp32"], files["compiled-int8"] = (files["litert-fp32"],
                                                              files["litert-int8"])
            image = np.random.default_rng(1).random((1, size, size, 3), np.float32)
            images = np.random.default_rng(2).random((32, size, size, 3), np.float32)
            ours: dict[str, list[float]] = {key: [] for key in keys}
            bare: dict[str, list[float]] = {key: [] for key in keys}
            tool: dict[str, list[float]] = {key: [] for key in keys}
            apis: dict[str, str] = {}
            for round_index in range(args.rounds):
                for key in keys[round_index % len(keys):] + keys[:round_index % len(keys)]:
                    runner, apis[key] = harness(key, files[key], args.threads)
                    ours[key].append(float(np.median(time_runs(
                        runner.invoke, runner.prepare(images), protocol))))
                    del runner
                    bare[key].append(time_bare(bare_loop(key, files[key], args.threads, image),
                                               args.seconds))
                    measured = vendor_tool(key, files[key], args.threads, size, args.seconds,
                                           args.cpu)
                    if measured is not None:
                        tool[key].append(measured)
            report(name, size, keys, apis, ours, bare, tool, args)


def _ratio(ours: list[float], reference: list[float]) -> str:
    if not reference:
        return "-"
    ratios = [a / b for a, b in zip(ours, reference, strict=True)]
    return f"{np.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"


def report(name: str, size: int, keys: list[str], apis: dict[str, str],
           ours: dict[str, list[float]], bare: dict[str, list[float]],
           tool: dict[str, list[float]], args: argparse.Namespace) -> None:
    """Print tfopt against the vendor references, then the runtimes per precision."""
    print(f"\n## {name} ({size} px), batch 1, {args.threads} thread(s) pinned to CPU {args.cpu}, "
          f"{args.rounds} rounds (p50 ms: median over rounds [range])\n")
    print("| file | API | tfopt p50 | bare loop p50 | vendor tool p50 | tfopt / bare "
          "| tfopt / tool |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key in keys:
        vendor = f"{np.median(tool[key]):.3f}" if tool[key] else "-"
        print(f"| {key} | {apis[key]} | {_span(ours[key])} | {_span(bare[key])} | {vendor} "
              f"| {_ratio(ours[key], bare[key])} | {_ratio(ours[key], tool[key])} |")
    print("\n| precision | " + " | ".join(("LiteRT Interpreter", "LiteRT CompiledModel",
                                           "ONNX Runtime", "OpenVINO")) + " |")
    print("|---|---:|---:|---:|---:|")
    for precision in ("fp32", "bf16", "int8"):
        cells = [f"{np.median(ours[key]):.3f}" if key in ours else "-"
                 for key in (f"litert-{precision}", f"compiled-{precision}",
                             f"onnx-{precision}", f"openvino-{precision}")]
        if any(cell != "-" for cell in cells):
            print(f"| {precision} | " + " | ".join(cells) + " |")


def _span(values: list[float]) -> str:
    return f"{np.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


if __name__ == "__main__":
    main()
