"""TFRecords of any model's inputs: records parsed by the config's feature spec into arrays.

``data.features`` names each feature's dtype and per-example shape (``data.label_feature`` the
one holding the labels or targets); each record becomes one example of named arrays, as a row of
an ``.npz`` source is (`tfopt.data.arrays`): the input features keep their names, the label
feature becomes ``y``. Listing parses every record (a record the spec cannot parse is skipped
and counted; a spec that fits no record at all is refused in one line before any work), the
entries are ``<file>#<index>`` split by a hash of that name, and the shards hold the same raw
little-endian bytes as an ``.npz`` source's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfopt.artifacts import ArraySpec
from tfopt.config import DataConfig
from tfopt.data.arrays import TRUTH, ArraySourceError, serialized_example
from tfopt.data.records import first_line, named_records, parsed_source_records

UNFIT = "does not fit data.features"
"""The reason a record the feature spec cannot parse is skipped with."""


def array_specs(cfg: DataConfig) -> dict[str, ArraySpec]:
    """Each array the records become, by name (the label feature as ``y``)."""
    return {_array_name(cfg, name): ArraySpec(dtype=spec.dtype, shape=list(spec.shape))
            for name, spec in (cfg.features or {}).items()}


def _array_name(cfg: DataConfig, feature: str) -> str:
    return TRUTH if feature == cfg.label_feature else feature


def _parse_spec(cfg: DataConfig) -> dict[str, Any]:
    import tensorflow as tf

    return {name: tf.io.FixedLenFeature(spec.shape, tf.float32 if spec.dtype == "float32"
                                        else tf.int64)
            for name, spec in (cfg.features or {}).items()}


def parsed_arrays(cfg: DataConfig, record: bytes, spec: Mapping[str, Any]
                  ) -> dict[str, np.ndarray]:
    """One record's arrays by name, in the spec's dtypes.

    Raises:
        tensorflow.errors.OpError: The record does not fit the spec.
    """
    import tensorflow as tf

    parsed = tf.io.parse_single_example(record, spec)
    return {_array_name(cfg, name): parsed[name].numpy().astype(cfg.features[name].dtype)
            for name in spec}


def list_feature_source(cfg: DataConfig) -> tuple[list[tuple[str, int]], list[dict],
                                                   dict[str, ArraySpec]]:
    """Index TFRecords of features: one entry ``<file>#<index>`` per record that parses.

    Returns:
        The entries with their bytes, the records skipped (unreadable or not fitting the spec,
        each with its reason), and each array's spec.

    Raises:
        ArraySourceError: Not one record fits the spec (the first record's parse error).
    """
    specs = array_specs(cfg)
    size = sum(int(np.dtype(s.dtype).itemsize * np.prod(s.shape, dtype=np.int64))
               for s in specs.values())
    records, skipped = parsed_source_records(cfg, _parse_spec(cfg), UNFIT)
    entries = [(name, size) for name, _, _ in records]
    if not entries and skipped:
        raise ArraySourceError(f"data.features: no record of {cfg.source_dir} fits them "
                               f"({skipped[0]['path']}: {skipped[0]['reason']})")
    return entries, skipped, specs


def feature_records(entries: Sequence[str], cfg: DataConfig
                    ) -> Iterator[tuple[str, bytes | None, str | None]]:
    """Each entry ``<file>#<index>`` as a serialized example of raw arrays, or why it is skipped.

    Each file is read once; an example with a NaN or an infinity is skipped as an ``.npz``
    row is (`tfopt.data.arrays.serialized_example`).
    """
    import tensorflow as tf

    spec = _parse_spec(cfg)
    readable = named_records(cfg, entries)
    for entry in entries:
        if entry not in readable:
            yield entry, None, "record no longer readable"
            continue
        try:
            yield entry, *serialized_example(entry, parsed_arrays(cfg, readable[entry], spec))
        except tf.errors.OpError as error:
            yield entry, None, f"{UNFIT}: {first_line(error)}"
