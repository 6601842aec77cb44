"""Arithmetic per inference: FLOPs of a Keras model, a ``.tflite`` file or an ONNX file.

FLOPs count 2 x the multiply-accumulates of the layers that hold nearly all of a vision
network's arithmetic (convolutions, depthwise convolutions, fully connected layers and matrix
products), per example; bias adds, activations and pooling are left out, the usual convention
(so 1 GFLOP here is 0.5 GMACs). The same rule is applied to a Keras model, a ``.tflite`` file
and an ONNX file, so a network's variants agree whatever their format. Not a task.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np


def keras_flops(model: object) -> float:
    """FLOPs per example of a Keras model (tfmot's wrappers are looked through)."""
    total = 0.0
    for layer in _keras_layers(model):
        kind = type(layer).__name__
        kernel = getattr(layer, "depthwise_kernel", None)
        if kind == "DepthwiseConv2D" and kernel is not None:
            kh, kw, _, _ = kernel.shape
            total += 2.0 * kh * kw * _per_example(layer.output_shape)
        elif kind in ("Conv2D", "Conv1D", "Conv3D") and getattr(layer, "kernel", None) is not None:
            *window, channels_in, _ = layer.kernel.shape
            total += 2.0 * float(np.prod(window)) * channels_in * _per_example(layer.output_shape)
        elif kind == "Dense" and getattr(layer, "kernel", None) is not None:
            total += 2.0 * layer.kernel.shape[0] * _per_example(layer.output_shape)
    return total


def _keras_layers(model: object) -> Iterable[object]:
    for layer in getattr(model, "layers", []):
        inner = getattr(layer, "layer", None)  # PruneLowMagnitude, QuantizeWrapper, Cluster...
        if inner is not None:
            yield inner
        elif hasattr(layer, "layers"):
            yield from _keras_layers(layer)
        else:
            yield layer


def _per_example(shape: object) -> float:
    """Elements per example of a layer's output shape ``(None, ...)``."""
    if isinstance(shape, list):
        shape = shape[0]
    return float(np.prod([d for d in shape[1:] if d is not None]))


def tflite_flops(interpreter: object) -> float:
    """FLOPs per example of an allocated LiteRT interpreter's graph."""
    return sum(flops for _, _, flops in tflite_op_flops(interpreter))


def tflite_op_flops(interpreter: object) -> list[tuple[str, str, float]]:
    """(output tensor name, op type, FLOPs per example) of each counted op of a LiteRT graph."""
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    counted = []
    for op in interpreter._get_ops_details():  # no public API lists the ops
        name, inputs, outputs = op["op_name"], op["inputs"], op["outputs"]
        if name not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED") or len(inputs) < 2:
            continue
        weights, output = tensors[int(inputs[1])]["shape"], tensors[int(outputs[0])]
        shape = output["shape"]
        out_elements = float(np.prod(shape)) / max(int(shape[0]), 1)
        if name == "CONV_2D":  # weights [out, kh, kw, in]
            flops = 2.0 * float(np.prod(weights[1:])) * out_elements
        elif name == "DEPTHWISE_CONV_2D":  # weights [1, kh, kw, out]
            flops = 2.0 * float(weights[1] * weights[2]) * out_elements
        else:  # weights [out, in]
            flops = 2.0 * float(weights[1]) * out_elements
        counted.append((output["name"].split(";")[0], name, flops))
    return counted


# Dense ops by their weights' shape; the Integer ones are what ONNX Runtime's dynamic
# quantization leaves (a QDQ model keeps Conv/Gemm/MatMul behind DequantizeLinear).
_ONNX_COUNTED = frozenset({"Conv", "ConvInteger", "Gemm", "MatMul", "MatMulInteger"})


def onnx_flops(path: Path) -> float:
    """FLOPs per example of an ONNX file (shapes inferred, symbolic batch taken as 1)."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    graph = model.graph
    shapes = {}
    for info in list(graph.value_info) + list(graph.output) + list(graph.input):
        dims = info.type.tensor_type.shape.dim
        shapes[info.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
    for initializer in graph.initializer:
        shapes[initializer.name] = list(numpy_helper.to_array(initializer).shape)
    total = 0.0
    for node in graph.node:
        if node.op_type not in _ONNX_COUNTED or len(node.input) < 2:
            continue
        weights, output = shapes.get(node.input[1]), shapes.get(node.output[0])
        if not weights or not output:
            continue
        out_elements = float(np.prod(output)) / max(output[0], 1)
        if node.op_type in ("Conv", "ConvInteger"):  # weights [out, in / group, kh, kw]
            total += 2.0 * float(np.prod(weights[1:])) * out_elements
        else:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            inner = weights[-1] if transposed else weights[-2]
            total += 2.0 * float(inner) * out_elements
    return total
