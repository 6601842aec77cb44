"""Keras model files of either Keras: save atomically, load safely, copy, which Keras made one.

Two Keras packages live side by side here: tf_keras (Keras 2, which
tensorflow-model-optimization needs) and Keras 3 (TensorFlow 2.21's ``keras``). A file is loaded
with the Keras that saved it (its ``keras_version``), and code handling a model asks the model
which Keras it is (`keras_of`), so a Keras 3 model is trained, traced, exported and packaged by
Keras 3 itself; only tfmot's techniques work on a tf_keras translation
(`tfopt.models.translate`).

The graph runner loads models through this module, so it imports tf_keras only (Keras 3 when a
file needs it): neither Prefect nor tensorflow-model-optimization (loaded only for files that
need its layers).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import tf_keras as keras

from tfopt.user_code import import_code

KerasFlavor = Literal["tf_keras", "keras3"]


def keras_module(flavor: KerasFlavor) -> ModuleType:
    """The Keras package of `flavor`: ``tf_keras``, or Keras 3 (imported on first use)."""
    return keras if flavor == "tf_keras" else importlib.import_module("keras")


def flavor_of(model: object) -> KerasFlavor:
    """Which Keras `model` (a model or a layer) belongs to.

    Raises:
        TypeError: It is neither a tf_keras nor a Keras 3 object.
    """
    if isinstance(model, keras.layers.Layer):
        return "tf_keras"
    if any(cls.__module__.split(".")[0] == "keras" for cls in type(model).__mro__):
        return "keras3"
    raise TypeError(f"a {type(model).__module__}.{type(model).__name__} is not a Keras model")


def keras_of(model: object) -> ModuleType:
    """The Keras package `model` was built with (its layers, optimizers, callbacks)."""
    return keras_module(flavor_of(model))


def is_keras_model(value: object) -> bool:
    """Whether `value` is a tf_keras or Keras 3 model."""
    try:
        return isinstance(value, keras_of(value).Model)
    except TypeError:
        return False


def is_layer_graph(model: object) -> bool:
    """Whether a model of either Keras is functional or sequential (its layers can be rebuilt).

    A subclassed model's layers are wired in Python code only, so neither tfmot nor a
    translation can rebuild it.
    """
    module = keras_of(model)
    if isinstance(model, module.Sequential):
        return True
    if flavor_of(model) == "tf_keras":
        return bool(getattr(model, "_is_graph_network", False))
    from keras.src.models.functional import Functional

    return isinstance(model, Functional)


def keras_model_path(out_dir: Path, name: str) -> Path:
    """Where a Keras model named `name` is saved."""
    return out_dir / f"{name}.keras"


def code_file(path: Path) -> Path:
    """The file beside a saved model naming the user's code its classes come from."""
    return path.with_name(f"{path.name}.code")


def save_keras_model(model: Any, path: Path, code: str | None = None) -> None:
    """Save a model of either Keras atomically (temporary file, then rename).

    Args:
        model: The model.
        path: The ``.keras`` file to write.
        code: The user's builder (``"file.py:build"``) whose classes the model may use (a
            subclassed model, custom layers): named beside the file, so `load_keras_model`
            imports it first.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix or '.keras'}")
    model.save(tmp)
    if code:
        code_file(path).write_text(code)
    else:
        code_file(path).unlink(missing_ok=True)
    tmp.replace(path)


def load_keras_model(path: Path) -> Any:
    """Load a saved model with the Keras that saved it, without unsafe deserialization.

    A tf_keras file holding tfmot's quantization-aware layers is loaded again in tfmot's scope;
    plain models never import tfmot. Compile state (an old file's optimizer) is ignored. The
    user's code named beside the file (`save_keras_model`'s `code`) is imported first.
    """
    if code_file(path).is_file():
        import_code(code_file(path).read_text().strip())
    if keras_flavor_of_file(path) == "keras3":
        return keras_module("keras3").saving.load_model(path, compile=False, safe_mode=True)
    try:
        return keras.models.load_model(path, compile=False, safe_mode=True)
    except (TypeError, ValueError) as error:
        if "Quantize" not in str(error):
            raise
    import tensorflow_model_optimization as tfmot

    with tfmot.quantization.keras.quantize_scope():
        return keras.models.load_model(path, compile=False, safe_mode=True)


def file_loss(path: Path) -> str | dict[str, Any] | None:
    """The loss a Keras file was compiled with, as its config names it (None: not compiled).

    Read from the file's saved compile settings (``.keras``: ``compile_config``; ``.h5``:
    ``training_config``), without loading the model. A loss per output (a dict or list of
    them) is None: one loss for one output only.
    """
    import json
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                compiled = json.loads(archive.read("config.json")).get("compile_config")
        else:
            import h5py

            with h5py.File(path, "r") as stored:
                raw = stored.attrs.get("training_config")
            compiled = json.loads(raw) if raw is not None else None
    except (OSError, KeyError, ValueError):
        return None
    loss = (compiled or {}).get("loss")
    if isinstance(loss, dict) and "class_name" not in loss:
        return None
    return loss if isinstance(loss, str | dict) else None


def tf_keras_loss(spec: str | dict[str, Any]) -> Any:
    """A tf_keras loss from its name (``mse``) or a Keras 3 or tf_keras loss config.

    Raises:
        ValueError: tf_keras has no such loss (the name said).
    """
    try:
        if isinstance(spec, str):
            return keras.losses.get(spec)
        return keras.losses.deserialize({"class_name": spec["class_name"],
                                         "config": spec.get("config") or {}})
    except (TypeError, ValueError) as error:
        name = spec if isinstance(spec, str) else spec.get("class_name")
        raise ValueError(f"tf_keras has no loss {name!r}") from error


def copy_model(model: Any) -> Any:
    """An independent copy of a model: new variables holding the same weights.

    tfmot's wrappers reuse the wrapped layers' variables, so a technique that must not change
    its input works on a copy.
    """
    copy = keras_of(model).models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def keras_version_of(path: Path) -> str | None:
    """The Keras version that saved a model file or folder, None if it does not say.

    A ``.keras`` archive says it in its ``metadata.json``, an HDF5 file in its
    ``keras_version`` attribute; a SavedModel folder with Keras metadata was written by Keras 2.
    """
    if path.is_dir():
        return "2" if (path / "keras_metadata.pb").is_file() else None
    if path.suffix.lower() in (".h5", ".hdf5"):
        return _hdf5_keras_version(path)
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return str(json.loads(archive.read("metadata.json")).get("keras_version")) or None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _hdf5_keras_version(path: Path) -> str | None:
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            version = handle.attrs.get("keras_version")
    except OSError:
        return None
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    return str(version) if version else None


def keras_flavor_of_file(path: Path) -> KerasFlavor:
    """The Keras that loads a model file: Keras 3 for files it saved, tf_keras for the rest.

    Keras 1 and 2 files (any ``2.x`` HDF5 file, a tf_keras ``.keras`` or SavedModel folder) and
    files that do not say are tf_keras's.
    """
    version = keras_version_of(path) or ""
    return "keras3" if version.split(".")[0].isdigit() and int(version.split(".")[0]) >= 3 \
        else "tf_keras"
