"""The harness's own floor: models that do next to nothing, timed through the same runners.

Each floor model takes the benchmark's input shape and returns the first pixel, so timing it
with a variant's runner, threads and protocol measures what the harness and the runtime cost
per call (handing the input over, the invoke, fetching the output) with no model in the way. A
variant whose p50 is close to its floor is limited by the calling overhead, not by its
arithmetic. Not a task: the benchmark's input step builds these once per run.
"""

from __future__ import annotations

from pathlib import Path

from tfopt.fileio import atomic_write_bytes

FLOOR_OF_FORMAT = {"keras": "keras", "graph": "keras", "xla": "keras",
                   "savedmodel": "savedmodel", "tflite": "tflite", "onnx": "onnx"}
"""Which floor model a variant's format is measured against (the runner it goes through)."""


def floor_key(variant_format: str, threads: int) -> str:
    """Which floor measurement a variant of `variant_format` at `threads` threads shares."""
    return f"{FLOOR_OF_FORMAT.get(variant_format, '')}@{threads}"


def build_floor_models(image_size: int, out_dir: Path) -> dict[str, Path]:
    """Write the floor models for ``[batch, image_size, image_size, 3]`` float inputs.

    Files already written by an earlier attempt of the same run are reused.

    Returns:
        Floor model path per floor kind (``keras``, ``savedmodel``, ``tflite``, ``onnx``).
    """
    floors = {
        "keras": out_dir / "floor.keras",
        "savedmodel": out_dir / "floor-savedmodel",
        "tflite": out_dir / "floor.tflite",
        "onnx": out_dir / "floor.onnx",
    }
    if all(path.exists() for path in floors.values()):
        return floors
    from tasks.convert_tflite import serving_converter
    from tasks.export_savedmodel import save_serving_savedmodel
    from tasks.keras_models import keras, save_keras_model

    inputs = keras.Input((image_size, image_size, 3))
    first_pixel = keras.layers.Cropping2D(((0, image_size - 1), (0, image_size - 1)))(inputs)
    model = keras.Model(inputs, keras.layers.Flatten()(first_pixel), name="harness_floor")
    save_keras_model(model, floors["keras"])
    save_serving_savedmodel(model, image_size, floors["savedmodel"])
    converter = serving_converter(floors["savedmodel"])
    atomic_write_bytes(floors["tflite"], converter.convert())
    atomic_write_bytes(floors["onnx"], onnx_floor_bytes(image_size))
    return floors


def onnx_floor_bytes(image_size: int) -> bytes:
    """An ONNX model slicing the first pixel out of NHWC images, serialized."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tfopt.serving import INPUT_NAME, OUTPUT_LOGITS

    constants = [numpy_helper.from_array(np.asarray(values, np.int64), name)
                 for name, values in (("starts", [0, 0]), ("ends", [1, 1]), ("axes", [1, 2]),
                                      ("shape", [-1, 3]))]
    graph = helper.make_graph(
        [helper.make_node("Slice", [INPUT_NAME, "starts", "ends", "axes"], ["pixel"]),
         helper.make_node("Reshape", ["pixel", "shape"], [OUTPUT_LOGITS])],
        "harness_floor",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT,
                                       ["batch", image_size, image_size, 3])],
        [helper.make_tensor_value_info(OUTPUT_LOGITS, TensorProto.FLOAT, ["batch", 3])],
        initializer=constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()
