"""TensorRT: a TensorRT-ready export bundle, since TF-TRT is not in TensorFlow >= 2.18 builds.

TensorRT builds its engine on the target machine, from ONNX: the bundle holds the checked ONNX
file, the SavedModel and a ready ``trtexec`` command line with a dynamic-batch shape profile.
The TF-TRT form is planned so the table says why it is missing (``baseline-tftrt-fp32``,
skipped); there is no GPU here to measure an engine on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import Field

from tfopt.artifacts import VariantSpec
from tfopt.fileio import atomic_write_text, replace_dir, staging_dir_for
from tfopt.runtimes.base import (
    BuildSources,
    PlanRequest,
    Runner,
    Runtime,
    RuntimeSection,
    required,
)
from tfopt.serving import INPUT_NAME, SIGNATURE_KEY
from tfopt.variants import skipped


class TensorRTSettings(RuntimeSection):
    """The shape profile of the bundle's engine."""

    tensorrt_max_batch: int = Field(
        32, ge=1, le=4096, description="Max batch in the TensorRT (trtexec) shape profile."
    )


def tftrt_unavailable_reason() -> str | None:
    """Why TF-TRT cannot run here, or None when this TensorFlow was built with TensorRT."""
    import tensorflow as tf

    if tf.sysconfig.get_build_info().get("is_tensorrt_build"):
        return None
    return (
        f"TensorFlow {tf.__version__} is not built with TensorRT (TF-TRT was removed from "
        "TensorFlow >= 2.18 builds); use the ONNX bundle with trtexec instead"
    )


def trtexec_command(shapes: dict[str, list[int]], max_batch: int) -> str:
    """The trtexec line that builds an engine with a dynamic-batch shape profile per input.

    `shapes` holds each input's example shape (the batch left out), by input name.
    """
    opt_batch = max(1, max_batch // 4)

    def profile(batch: int) -> str:
        return ",".join(f"{name}:{'x'.join(str(d) for d in (batch, *shape))}"
                        for name, shape in shapes.items())

    return (
        "trtexec --onnx=model.onnx --saveEngine=model.plan "
        f"--minShapes={profile(1)} --optShapes={profile(opt_batch)} "
        f"--maxShapes={profile(max_batch)} --fp16"
    )


def input_shapes(sources: BuildSources, onnx: Path) -> dict[str, list[int]]:
    """Each ONNX input's example shape: the image a serving SavedModel takes, or the arrays'."""
    savedmodel = sources.savedmodel
    if not sources.dataset.arrays:
        return {INPUT_NAME: [savedmodel.image_size, savedmodel.image_size, savedmodel.channels]}
    import onnxruntime as ort

    from tfopt.data.arrays import feeds_for

    names = [info.name for info in ort.InferenceSession(
        str(onnx), providers=["CPUExecutionProvider"]).get_inputs()]
    return {name: list(spec.shape) for name, spec in feeds_for(
        names, sources.dataset.arrays).items()}


def bundle(sources: BuildSources, onnx: VariantSpec, max_batch: int, out_dir: Path) -> Path:
    """Write ``<name>-tensorrt-bundle/``: ``model.onnx``, ``saved_model/``, ``trtexec.sh``, JSON."""
    savedmodel = sources.savedmodel
    final = out_dir / f"{savedmodel.name}-tensorrt-bundle"
    staging = staging_dir_for(final)
    staging.mkdir()
    shutil.copy2(onnx.path, staging / "model.onnx")
    shutil.copytree(savedmodel.path, staging / "saved_model")
    shapes = input_shapes(sources, Path(onnx.path))
    command = trtexec_command(shapes, max_batch)
    atomic_write_text(
        staging / "trtexec.sh",
        "#!/usr/bin/env bash\n# Build a TensorRT engine from model.onnx on a machine with "
        "TensorRT.\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n" + command + "\n",
    )
    (staging / "trtexec.sh").chmod(0o755)
    inputs = [{"name": name, "dtype": _dtype(sources, name), "shape": [-1, *shape]}
              for name, shape in shapes.items()]
    atomic_write_text(staging / "bundle.json", json.dumps({
        "onnx": "model.onnx",
        "saved_model": "saved_model",
        "signature": SIGNATURE_KEY,
        "input": inputs[0],
        "inputs": inputs,
        "outputs": (["logits", "probabilities"] if not sources.dataset.arrays
                    else "the SavedModel's own"),
        "opset": onnx.params.get("opset"),
        "onnx_vs_savedmodel_max_abs_diff": onnx.params.get("check_max_abs_diff"),
        "trtexec": command,
        "tftrt": tftrt_unavailable_reason() or "available",
    }, indent=2) + "\n")
    replace_dir(staging, final)
    return final


def _dtype(sources: BuildSources, name: str) -> str:
    """An input's dtype: float32 images, or its array's."""
    if not sources.dataset.arrays:
        return "float32"
    from tfopt.data.arrays import input_specs

    specs = input_specs(sources.dataset)
    return (specs.get(name) or next(iter(specs.values()))).dtype


class TensorRT(Runtime):
    """TensorRT's inputs: the ONNX bundle for trtexec; TF-TRT's absence, said."""

    name = "tensorrt"
    formats: frozenset[str] = frozenset()
    section = TensorRTSettings
    home = "convert"
    order = 40
    exports = True
    precision_named = frozenset({"tftrt"})

    def plan(self, request: PlanRequest, settings: TensorRTSettings) -> list[VariantSpec]:
        """The TF-TRT form of a baseline, skipped with the reason it cannot be built here."""
        if request.compressed or request.kind not in ("keras", "savedmodel"):
            return []
        return [skipped(self.variant(request.source, "savedmodel", form="tftrt"),
                        tftrt_unavailable_reason()
                        or "TF-TRT conversion is not built into tfopt; use the ONNX TensorRT "
                           "bundle")]

    def export(self, sources: BuildSources, settings: TensorRTSettings,
               out_dir: Path) -> Path | None:
        """The bundle, from the checked ONNX export (none when ONNX is not exported).

        Raises:
            SourceNotBuiltError: The ONNX export failed.
        """
        from tfopt.runtimes import runtime_of

        onnx_name = runtime_of("onnx").variant_name(sources.model.name, "onnx", "fp32")
        if sources.savedmodel is None or onnx_name not in sources.built:
            return None
        return bundle(sources, required(sources, onnx_name), settings.tensorrt_max_batch,
                      out_dir)

    def load_runner(self, spec: VariantSpec, threads: int = 1) -> Runner:
        """No engine runs here: TensorRT needs an NVIDIA GPU.

        Raises:
            ValueError: Always.
        """
        raise ValueError("TensorRT engines are built and run on a machine with an NVIDIA GPU")


RUNTIME = TensorRT()
