"""TFRecord source files: found under a folder and read record by record.

Shared by the image TFRecords' listing (`tfopt.data.sources`) and TFRecords of any features
(`tfopt.data.features`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tfopt.config import ConfigError, DataConfig


class NoUsableDataError(ConfigError):
    """The source folder holds no image the pipeline can use (a one-line error naming it)."""


def tfrecord_files(source_dir: Path) -> list[Path]:
    """The ``*.tfrecord*`` files under `source_dir`, sorted.

    Raises:
        NoUsableDataError: The folder does not exist or holds none.
    """
    if not source_dir.is_dir():
        raise NoUsableDataError(f"data.source_dir {source_dir} is not a folder")
    files = sorted(p for p in source_dir.rglob("*") if p.is_file() and ".tfrecord" in p.name)
    if not files:
        raise NoUsableDataError(f"data.source_dir {source_dir} holds no *.tfrecord* files")
    return files


def _compression_of(path: Path) -> str:
    return "GZIP" if path.suffix in (".gz", ".gzip") else ""


def iterate_source_records(cfg: DataConfig, path: Path) -> Iterator[tuple[int, bytes | str]]:
    """Yield ``(index, serialized record)`` of one source file.

    Where the file stops being readable (truncated or corrupt), yields ``(index, error text)``
    once and ends.
    """
    import tensorflow as tf

    index = 0
    iterator = iter(tf.data.TFRecordDataset(str(path), compression_type=_compression_of(path)))
    while True:
        try:
            record = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            yield index, f"unreadable from record {index} on: {error.message[:200]}"
            return
        yield index, record.numpy()
        index += 1


def parsed_source_records(cfg: DataConfig, spec: Mapping[str, Any], unfit: str
                          ) -> tuple[list[tuple[str, dict[str, Any], int]], list[dict]]:
    """Every record of the source's TFRecord files parsed by `spec`.

    Returns:
        Each record that parses (``<file>#<index>``, its parsed features, its bytes), and the
        records skipped with their reason: a file unreadable from a record on, or a record
        `spec` cannot parse (`unfit` and the parser's first line).
    """
    import tensorflow as tf

    parsed: list[tuple[str, dict[str, Any], int]] = []
    skipped: list[dict] = []
    for path in tfrecord_files(cfg.source_dir):
        relative = path.relative_to(cfg.source_dir).as_posix()
        for index, record in iterate_source_records(cfg, path):
            if isinstance(record, str):
                skipped.append({"path": f"{relative}#{index}", "reason": record})
                break
            try:
                features = tf.io.parse_single_example(record, spec)
            except tf.errors.OpError as error:
                skipped.append({"path": f"{relative}#{index}",
                                "reason": f"{unfit}: {first_line(error)}"})
                continue
            parsed.append((f"{relative}#{index}", features, len(record)))
    return parsed, skipped


def first_line(error: Any) -> str:
    """A TensorFlow error's message (else its text), first line, at most 200 characters."""
    lines = str(getattr(error, "message", error)).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def named_records(cfg: DataConfig, entries: Iterable[str]) -> dict[str, bytes]:
    """The serialized records named ``<file>#<index>`` in `entries` that can still be read.

    Each file is read once, up to where it stops being readable; an entry missing from the
    result is a record no longer readable.
    """
    wanted: dict[str, set[int]] = {}
    for entry in entries:
        name, _, index = entry.rpartition("#")
        wanted.setdefault(name, set()).add(int(index))
    records: dict[str, bytes] = {}
    for name, indices in wanted.items():
        for index, record in iterate_source_records(cfg, Path(cfg.source_dir) / name):
            if index in indices and isinstance(record, bytes):
                records[f"{name}#{index}"] = record
    return records
