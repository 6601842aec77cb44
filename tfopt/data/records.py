"""TFRecord source files: found under a folder and read record by record.

Shared by the image TFRecords' listing (`tfopt.data.sources`) and TFRecords of any features
(`tfopt.data.features`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
