"""Why an "optimized" variant came out slower or larger than what it came from."""

from __future__ import annotations

from tfopt.artifacts import VariantResult

_SLOWER_MARGIN = 1.05

# Why an "optimized" form is slower than what it came from, on a CPU, as commonly observed.
_SLOWER_REASONS = {
    "tflite-dynamic": "dynamic-range kernels quantize activations on the fly at every call; "
                      "on x86 the float XNNPACK path is often faster",
    "tflite-float16": "float16 weights are expanded to float32 on CPUs without native fp16 "
                      "arithmetic: the gain is size, not speed",
    "tflite-int8": "this CPU's int8 kernels do not beat its float kernels for this op mix "
                   "(quantize/dequantize at the edges costs too)",
    "tflite-int16x8": "16x8 kernels are TFLite's reference kernels (XNNPACK has none): the "
                      "gain is accuracy closer to float than int8 at int8-size weights, "
                      "not speed",
    "bfloat16": "the bfloat16 rewrite adds casts around every converted op; on a small model "
                "they cost more than bf16 kernels (AVX512-BF16/AMX) save",
    "xla": "XLA's CPU backend parallelises worse than TensorFlow's own kernels, and small "
           "models gain little from fusion",
    "savedmodel": "the signature call adds argument flattening and a function call per inference",
    "onnx": "ONNX Runtime's CPU kernels are slower than TensorFlow's for this graph",
    "onnx-dynamic": "ONNX Runtime's dynamic quantization turns convolutions into ConvInteger, "
                    "which quantizes activations at every call and is slower than float Conv "
                    "on x86",
    "onnx-int8": "QuantizeLinear/DequantizeLinear at the edges of each quantized island cost "
                 "more than the int8 kernels save on this model",
    "compressed": "sparsity and smaller weights do not speed up dense kernels: the gain is "
                  "compressed size (or a smaller network's fewer operations, if any)",
}


def slowdown_reason(result: VariantResult, reference: VariantResult) -> str:
    """The reason key for `result` coming out slower than `reference`, from their fields."""
    if result.source != reference.source:
        return "compressed"
    if result.precision == "bfloat16":
        return "bfloat16"
    if result.format == "tflite":
        return f"tflite-{result.precision}"
    if result.format == "onnx" and result.precision != "fp32":
        return f"onnx-{result.precision}"
    return result.format


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
        why = _SLOWER_REASONS.get(slowdown_reason(result, reference), "no known cause")
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
