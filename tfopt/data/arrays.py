"""Array sources: a folder of NumPy ``.npz`` files whose arrays are named after a model's inputs.

Any model's data, not only images: each ``.npz`` holds one array per input name (batch first;
``x`` for a model of one input) and optionally ``y``, the labels or targets its metric scores.
Every file holds the same names, each with the same per-example shape and dtype. Listing reads
the arrays' headers only (names, shapes, dtypes), never their values; each example is an entry
``<file>#<row>`` split by a hash of that name, as a TFRecord source's records are. The shards
hold each array's example as raw little-endian bytes, decoded with the shapes and dtypes the
manifest keeps (`ArraySpec`). An example with a NaN or infinity is skipped and counted.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tfopt.artifacts import ArraySpec, DatasetArtifact
from tfopt.config import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf

TRUTH = "y"
"""The array that holds the labels or targets (never a model input, unless the model has an
input so named)."""

ONE_INPUT = "x"
"""The array a model of one input takes, whatever that input's name."""

SOURCE_KEY = "tfopt/source"
"""The feature naming an example's file and row in the shards."""

_KINDS = "biuf"
"""bool, signed and unsigned integers, floats: the dtypes a tensor is made of here."""


class ArraySourceError(ConfigError):
    """Arrays that cannot be the data of one model (the message names the file and array)."""


def npz_files(source_dir: Path) -> list[Path]:
    """The ``.npz`` files under `source_dir`, sorted (hidden ones left out).

    Raises:
        ArraySourceError: The folder does not exist or holds no ``.npz`` file.
    """
    if not source_dir.is_dir():
        raise ArraySourceError(f"data.source_dir {source_dir} is not a folder")
    files = sorted(path for path in source_dir.rglob("*.npz")
                   if path.is_file() and not path.name.startswith("."))
    if not files:
        raise ArraySourceError(f"data.source_dir {source_dir} holds no .npz files")
    return files


def read_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's shape and dtype in an ``.npz``, read from the headers (no values loaded).

    Raises:
        OSError, ValueError, zipfile.BadZipFile: The file is no readable ``.npz``.
    """
    headers = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                continue
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(stream)
                                   if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(stream))
            headers[member[: -len(".npy")]] = (tuple(shape), np.dtype(dtype))
    return headers


def _spec_of(name: str, shape: tuple[int, ...], dtype: np.dtype, where: str) -> ArraySpec:
    if dtype.kind not in _KINDS:
        raise ArraySourceError(f"{where}: array {name} holds {dtype} values; the arrays must be "
                               "numbers or booleans")
    if not shape:
        raise ArraySourceError(f"{where}: array {name} is a single value; every array needs "
                               "one entry per example along its first axis")
    return ArraySpec(dtype=dtype.newbyteorder("<").name, shape=list(shape[1:]))


def file_specs(path: Path, where: str) -> tuple[int, dict[str, ArraySpec]]:
    """The examples in one ``.npz`` and each array's spec (`ArraySpec`, one example's shape).

    Raises:
        ArraySourceError: Arrays of different lengths, of no numbers, or none but `TRUTH`.
        OSError, ValueError, zipfile.BadZipFile: The file is no readable ``.npz``.
    """
    headers = read_headers(path)
    specs = {name: _spec_of(name, shape, dtype, where)
             for name, (shape, dtype) in sorted(headers.items())}
    lengths = {name: shape[0] for name, (shape, _) in headers.items()}
    if len(set(lengths.values())) > 1:
        raise ArraySourceError(f"{where}: its arrays differ in length (the first axis, one entry "
                               f"per example): {dict(sorted(lengths.items()))}")
    if not [name for name in specs if name != TRUTH]:
        raise ArraySourceError(f"{where}: holds no input array (only {sorted(specs) or 'none'}); "
                               "name each array after the model's input it feeds (x for one)")
    return next(iter(lengths.values())), specs


def list_npz_source(source_dir: Path) -> tuple[list[tuple[str, int]], list[dict],
                                               dict[str, ArraySpec]]:
    """Index a folder of ``.npz`` files: one entry ``<file>#<row>`` per example.

    A file that is no readable ``.npz`` is skipped with its reason (counted as the data set's
    skipped records); files whose arrays differ from the first file's are refused.

    Returns:
        The entries with their bytes, the skipped files, and each array's spec (by name).

    Raises:
        ArraySourceError: No ``.npz`` file, arrays that do not fit one model, or different
            arrays in two files.
    """
    entries: list[tuple[str, int]] = []
    skipped: list[dict] = []
    specs: dict[str, ArraySpec] | None = None
    first = ""
    for path in npz_files(source_dir):
        relative = path.relative_to(source_dir).as_posix()
        where = f"data.source_dir {source_dir}: {relative}"
        try:
            count, found = file_specs(path, where)
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            if isinstance(error, ArraySourceError):
                raise
            skipped.append({"path": relative,
                            "reason": f"not a readable .npz: {type(error).__name__}: {error}"})
            continue
        if specs is None:
            specs, first = found, relative
        elif found != specs:
            raise ArraySourceError(f"{where}: holds {_described(found)}, {first} holds "
                                   f"{_described(specs)}; every file needs the same arrays")
        size = sum(int(np.dtype(spec.dtype).itemsize * np.prod(spec.shape, dtype=np.int64))
                   for spec in found.values())
        entries += [(f"{relative}#{row}", size) for row in range(count)]
    return entries, skipped, specs or {}


def _described(specs: Mapping[str, ArraySpec]) -> str:
    return ", ".join(f"{name} {spec.dtype}{spec.shape}" for name, spec in specs.items())


def input_specs(dataset: DatasetArtifact) -> dict[str, ArraySpec]:
    """The arrays of an array data set that a model takes (all but `TRUTH`)."""
    return {name: spec for name, spec in dataset.arrays.items() if name != TRUTH}


def feeds_for(names: Sequence[str], arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a model of input `names` takes, by those names (``x`` for a model of one).

    Raises:
        KeyError: An input no array feeds.
    """
    if len(names) == 1 and names[0] not in arrays and ONE_INPUT in arrays:
        return {names[0]: arrays[ONE_INPUT]}
    return {name: arrays[name] for name in names}


def example_records(entries: Sequence[str], source_dir: Path
                    ) -> Iterator[tuple[str, bytes | None, str | None]]:
    """Each entry ``<file>#<row>`` as a serialized ``tf.train.Example``, or why it is skipped.

    Rows are read file by file (each file loaded once); an example with a NaN or an infinity
    in any array is skipped with the array's name.
    """
    by_file: dict[str, list[tuple[str, int]]] = {}
    for entry in entries:
        name, _, row = entry.rpartition("#")
        by_file.setdefault(name, []).append((entry, int(row)))
    records: dict[str, tuple[bytes | None, str | None]] = {}
    for name, rows in by_file.items():
        try:
            with np.load(source_dir / name, allow_pickle=False) as stored:
                arrays = {key: stored[key] for key in stored.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            records.update({entry: (None, f"no longer readable: {type(error).__name__}")
                            for entry, _ in rows})
            continue
        for entry, row in rows:
            records[entry] = serialized_example(
                entry, {key: array[row] for key, array in arrays.items()})
    for entry in entries:
        yield entry, *records[entry]


def serialized_example(entry: str, values: Mapping[str, np.ndarray]
                       ) -> tuple[bytes | None, str | None]:
    """One example's arrays as a ``tf.train.Example`` of raw little-endian bytes.

    The example is named `entry`; None and why where it is skipped (a NaN or an infinity,
    naming the arrays).
    """
    import tensorflow as tf

    bad = [key for key, value in values.items()
           if value.dtype.kind == "f" and not np.isfinite(value).all()]
    if bad:
        return None, f"non-finite values (NaN or infinity) in {', '.join(bad)}"
    feature = {key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[
        np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()]))
        for key, value in values.items()}
    feature[SOURCE_KEY] = tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[entry.encode("utf-8")]))
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True), None


def decode_examples(serialized: tf.Tensor, specs: Mapping[str, ArraySpec]
                    ) -> dict[str, tf.Tensor]:
    """A batch of serialized examples as one tensor per array (batch first)."""
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized, {name: tf.io.FixedLenFeature([], tf.string) for name in specs})
    return {name: tf.reshape(tf.io.decode_raw(parsed[name], tf.dtypes.as_dtype(spec.dtype)),
                             [-1, *spec.shape])
            for name, spec in specs.items()}


def array_dataset(dataset: DatasetArtifact, split: str, batch_size: int) -> tf.data.Dataset:
    """One split as batches of ``{name: tensor}``, in file order (inputs and `TRUTH` alike)."""
    import tensorflow as tf

    files = [str(path) for path in dataset.splits[split].files]
    records = tf.data.TFRecordDataset(files, compression_type=dataset.compression)
    return (records.batch(batch_size)
            .map(lambda batch: decode_examples(batch, dataset.arrays),
                 num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


def load_split_feeds(dataset: DatasetArtifact, split: str,
                     limit: int | None = None) -> dict[str, np.ndarray]:
    """One split of an array data set in memory, in file order: each array by name."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in dataset.arrays}
    total = 0
    for batch in array_dataset(dataset, split, 256):
        for name, values in batch.items():
            parts[name].append(values.numpy())
        total += int(next(iter(batch.values())).shape[0])
        if limit is not None and total >= limit:
            break
    return {name: (np.concatenate(values) if values
                   else np.zeros((0, *dataset.arrays[name].shape),
                                 np.dtype(dataset.arrays[name].dtype)))[:limit]
            for name, values in parts.items()}


def training_pipeline(dataset: DatasetArtifact, split: str, batch_size: int,
                      seed: int | None = None) -> tf.data.Dataset:
    """One split as Keras trains on it: batches of ``(inputs, y)``, shuffled given a `seed`.

    The inputs are a dict by name, or the one input's tensor alone (a model of one input may
    name it otherwise than ``x``).
    """
    import tensorflow as tf

    specs = dict(dataset.arrays)
    names = [name for name in specs if name != TRUTH]
    files = [str(path) for path in dataset.splits[split].files]
    records = tf.data.TFRecordDataset(files, compression_type=dataset.compression)
    if seed is not None:
        records = records.shuffle(max(1, min(dataset.splits[split].examples, 10_000)), seed=seed,
                                  reshuffle_each_iteration=True)

    def inputs_and_truth(serialized: tf.Tensor) -> tuple[object, tf.Tensor]:
        batch = decode_examples(serialized, specs)
        inputs = batch[names[0]] if len(names) == 1 else {name: batch[name] for name in names}
        return inputs, batch[TRUTH]

    return (records.batch(batch_size)
            .map(inputs_and_truth, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))
