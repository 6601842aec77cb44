"""The serving contract every exported model follows (names only; importing this is cheap)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tfopt.fileio import atomic_write_text

SIGNATURE_KEY = "serving_default"
INPUT_NAME = "images"
OUTPUT_LOGITS = "logits"
OUTPUT_PROBABILITIES = "probabilities"
LABELS_FILE = "labels.txt"
"""The class order, one name per line, beside or inside every model tfopt produces."""


def write_labels(folder: Path, class_names: Sequence[str]) -> Path:
    """Write ``labels.txt`` (one class name per line, in output order) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LABELS_FILE
    atomic_write_text(path, "".join(f"{name}\n" for name in class_names))
    return path


def read_labels(path: Path) -> list[str]:
    """The class names of a ``labels.txt``, in order, without blank lines."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]
