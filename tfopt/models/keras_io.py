"""Keras model files: save atomically, load safely, copy, and which Keras saved a file.

The graph runner loads models through this module, so it imports tf_keras only: neither Prefect
nor tensorflow-model-optimization (loaded only for files that need its layers).
"""

from __future__ import annotations

from pathlib import Path

import tf_keras as keras


def keras_model_path(out_dir: Path, name: str) -> Path:
    """Where a Keras model named `name` is saved."""
    return out_dir / f"{name}.keras"


def save_keras_model(model: keras.Model, path: Path) -> None:
    """Save a Keras model atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.keras")
    model.save(tmp)
    tmp.replace(path)


def load_keras_model(path: Path) -> keras.Model:
    """Load a saved Keras model without unsafe deserialization (no arbitrary lambdas).

    A file holding tfmot's quantization-aware layers is loaded again in tfmot's scope; plain
    models never import tfmot.
    """
    try:
        return keras.models.load_model(path, compile=False, safe_mode=True)
    except (TypeError, ValueError) as error:
        if "Quantize" not in str(error):
            raise
    import tensorflow_model_optimization as tfmot

    with tfmot.quantization.keras.quantize_scope():
        return keras.models.load_model(path, compile=False, safe_mode=True)


def copy_model(model: keras.Model) -> keras.Model:
    """An independent copy of a model: new variables holding the same weights.

    tfmot's wrappers reuse the wrapped layers' variables, so a technique that must not change
    its input works on a copy.
    """
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def keras_version_of(path: Path) -> str | None:
    """The Keras version that saved a ``.keras`` file (its metadata.json), None if unknown."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return str(json.loads(archive.read("metadata.json")).get("keras_version")) or None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
