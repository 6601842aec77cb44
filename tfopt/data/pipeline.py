"""tf.data readers for tfopt's TFRecord shards: the tuned pipeline and the naive reference.

Not a task: the training, measurement and benchmark tasks build their input with these
functions. All input work is pinned to the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tensorflow as tf

from tfopt.artifacts import DatasetArtifact
from tfopt.config import InputConfig, InputScale

FEATURE_SPEC = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/label": tf.io.FixedLenFeature([], tf.int64),
}
_BLOCK_SPEC = {
    **FEATURE_SPEC,
    "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
}
AUTOTUNE = tf.data.AUTOTUNE
_RECORD_SHUFFLE = 1024
# Decodes of one batch that may run at once (map_fn's parallel_iterations): more than its default
# of 10 keeps both cores decoding (docs/measurements.md).
_DECODES_IN_FLIGHT = 64
# Below this many examples the parallel readers' start-up costs more than they save.
_PARALLEL_FILL_EXAMPLES = 4096
_EXAMPLE_SHUFFLE = 10_000
_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class ReaderOptions:
    """Knobs of the tuned reader (see `tfopt.config.InputConfig`)."""

    cache: Literal["decoded", "encoded", "none"] = "none"
    deterministic: bool = False
    random_crop_min_area: float = 1.0
    interleave_cycle: int = 0
    private_threads: int = 0
    compression: str = ""
    scale: InputScale = "unit"
    channels: int = 3
    """The model's image channels: 1 converts the RGB shards to grayscale after decoding."""


@dataclass(frozen=True)
class CacheDecision:
    """What the tuned reader keeps in memory, and the rule's reasoning."""

    mode: Literal["decoded", "encoded", "none"]
    reason: str


def plan_cache(
    examples: int, image_size: int, encoded_bytes: int, budget_mb: float, random_crops: bool
) -> CacheDecision:
    """Decide what to cache: decoded images if they fit the budget, else encoded records, else none.

    Decoded images are float32 ``S x S x 3``; with random crops they cannot be cached (every
    epoch crops anew), so only the encoded records are candidates.

    Args:
        examples: Examples in the split.
        image_size: Output image side.
        encoded_bytes: Total size of the split's shards.
        budget_mb: Memory the cache may take.
        random_crops: Whether training decodes random crops.

    Returns:
        The mode and a one-line reason with the sizes compared.
    """
    budget = budget_mb * 1024 * 1024
    decoded = examples * image_size * image_size * 3 * _FLOAT32_BYTES
    if not random_crops and decoded <= budget:
        return CacheDecision("decoded", f"decoded {decoded / 2**20:.1f} MB <= budget "
                                        f"{budget_mb:.0f} MB")
    if encoded_bytes <= budget:
        why = "random crops decode every epoch" if random_crops else (
            f"decoded {decoded / 2**20:.1f} MB > budget {budget_mb:.0f} MB")
        return CacheDecision("encoded", f"{why}; encoded {encoded_bytes / 2**20:.1f} MB fits")
    return CacheDecision("none", f"neither decoded {decoded / 2**20:.1f} MB nor encoded "
                                 f"{encoded_bytes / 2**20:.1f} MB fits {budget_mb:.0f} MB")


def reader_options(
    dataset: DatasetArtifact, split: str, cfg: InputConfig, training: bool,
    scale: InputScale = "unit",
) -> tuple[ReaderOptions, CacheDecision]:
    """The tuned reader's options for one split, with the cache rule applied and explained."""
    info = dataset.splits[split]
    crops = training and cfg.random_crop_min_area < 1.0
    decision = plan_cache(info.examples, dataset.image_size, info.bytes, cfg.cache_budget_mb, crops)
    options = ReaderOptions(
        cache=decision.mode,
        deterministic=cfg.deterministic,
        random_crop_min_area=cfg.random_crop_min_area,
        interleave_cycle=cfg.interleave_cycle,
        private_threads=cfg.private_threads,
        compression=dataset.compression,
        scale=scale,
        channels=dataset.channels,
    )
    return options, decision


def decode_uint8(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decode one JPEG to uint8 ``[image_size, image_size, 3]`` (resized only when needed)."""
    return _fit_size(tf.io.decode_jpeg(encoded, channels=3), image_size)


def _fit_size(image: tf.Tensor, image_size: int) -> tf.Tensor:
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], image_size), tf.equal(shape[1], image_size))
    resized = tf.cond(
        same,
        lambda: image,
        lambda: tf.cast(tf.clip_by_value(
            tf.round(tf.image.resize(image, [image_size, image_size], antialias=True)), 0, 255
        ), tf.uint8),
    )
    return tf.ensure_shape(resized, [image_size, image_size, 3])


def to_channels(images: tf.Tensor, channels: int) -> tf.Tensor:
    """A batch of uint8 RGB images as the model's channels: 3 as it is, 1 as grayscale.

    Grayscale is ITU-R 601's luma, what `tf.image.rgb_to_grayscale` and JPEG decoding with
    ``channels=1`` compute.
    """
    return images if channels == 3 else tf.image.rgb_to_grayscale(images)


def to_unit_float(images: tf.Tensor) -> tf.Tensor:
    """uint8 pixels to float32 in [0, 1] (one vectorized op for a whole batch)."""
    return to_model_float(images, "unit")


# (multiplier, offset) from uint8 pixels to what the model expects.
_SCALES: dict[str, tuple[float, float]] = {
    "unit": (1.0 / 255.0, 0.0), "symmetric": (1.0 / 127.5, -1.0), "raw": (1.0, 0.0),
}


def to_model_float(images: tf.Tensor, scale: InputScale) -> tf.Tensor:
    """uint8 pixels to the model's float32 input, one vectorized op for a whole batch.

    ``unit``: [0, 1]; ``symmetric``: [-1, 1]; ``raw``: [0, 255] (models with their own
    rescaling layer).
    """
    multiplier, offset = _SCALES[scale]
    floats = tf.cast(images, tf.float32) * multiplier
    return floats + offset if offset else floats


def decode_image(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decode one JPEG into a float32 ``[image_size, image_size, 3]`` tensor in [0, 1]."""
    return to_unit_float(decode_uint8(encoded, image_size))


def decode_random_crop(encoded: tf.Tensor, image_size: int, min_area: float) -> tf.Tensor:
    """Decode only a random crop of a JPEG with the fused `decode_and_crop_jpeg`, then resize.

    Decoding just the crop window skips the rest of the image's pixels, which is why the fused
    op is faster than decoding everything and cropping afterwards. Returns uint8.
    """
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        min_object_covered=min_area,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    return _fit_size(tf.io.decode_and_crop_jpeg(encoded, window, channels=3), image_size)


def _parse_block(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    return tf.io.parse_example(serialized, _BLOCK_SPEC)


def _decode_block(
    parsed: dict[str, tf.Tensor], image_size: int, crop_min_area: float
) -> tuple[tf.Tensor, tf.Tensor]:
    """Decode a parsed batch of JPEGs to uint8.

    When every image already has the output size (the shape stored in the records says so),
    one check for the batch replaces one per image.
    """
    encoded = parsed["image/encoded"]
    labels = tf.cast(parsed["image/label"], tf.int32)
    signature = tf.TensorSpec([image_size, image_size, 3], tf.uint8)
    if crop_min_area < 1.0:
        images = tf.map_fn(lambda one: decode_random_crop(one, image_size, crop_min_area),
                           encoded, fn_output_signature=signature,
                           parallel_iterations=_DECODES_IN_FLIGHT)
        return images, labels
    all_fit = tf.reduce_all(tf.logical_and(tf.equal(parsed["image/height"], image_size),
                                           tf.equal(parsed["image/width"], image_size)))
    images = tf.cond(
        all_fit,
        lambda: tf.map_fn(
            lambda one: tf.ensure_shape(tf.io.decode_jpeg(one, channels=3),
                                        [image_size, image_size, 3]),
            encoded, fn_output_signature=signature, parallel_iterations=_DECODES_IN_FLIGHT,
        ),
        lambda: tf.map_fn(lambda one: decode_uint8(one, image_size), encoded,
                          fn_output_signature=signature, parallel_iterations=_DECODES_IN_FLIGHT),
    )
    return images, labels


def _pipeline_options(options: ReaderOptions) -> tf.data.Options:
    data_options = tf.data.Options()
    data_options.deterministic = options.deterministic
    data_options.autotune.enabled = True
    if options.private_threads:
        data_options.threading.private_threadpool_size = options.private_threads
    return data_options


def parallel_readers(options: ReaderOptions) -> int:
    """Shard readers working at once: the configured number, or one per core."""
    return options.interleave_cycle or os.cpu_count() or 1


def _reading_units(files: Sequence[Path], readers: int) -> tuple[list[str], list[int], list[int]]:
    """(file, part, parts) triples so that there are at least `readers` units of work.

    With fewer shards than readers, each shard is read by several readers, each keeping every
    n-th record (`Dataset.shard`): raw reads repeat, parsing and decoding do not.
    """
    parts = max(1, -(-readers // max(1, len(files))))
    names, indices, counts = [], [], []
    for file in files:
        for part in range(parts):
            names.append(str(file))
            indices.append(part)
            counts.append(parts)
    return names, indices, counts


def tuned_dataset(
    files: Sequence[Path],
    image_size: int,
    batch_size: int,
    *,
    training: bool = False,
    seed: int = 0,
    options: ReaderOptions | None = None,
    examples_hint: int | None = None,
) -> tf.data.Dataset:
    """The tuned reader: parallel shard readers, vectorized parsing, block decoding, prefetch.

    Each of `parallel_readers` workers (a parallel `interleave`) reads its shard sequentially,
    batches the serialized records, parses each batch with one `parse_example` call and decodes
    the batch's JPEGs (with the fused `decode_and_crop_jpeg` for training crops), handing over
    whole batches. Measured on 2 cores, this beat per-example parallel `map`s, whose hand-offs
    cost more than small images take to decode. Pixels become floats once per batch. Decoded
    examples are cached when the cache rule allows; encoded records otherwise, if they fit.

    Args:
        files: TFRecord shards.
        image_size: Output image side.
        batch_size: Examples per batch.
        training: Shuffle shards and records (and crop, if the options say so).
        seed: Shuffle and crop seed.
        options: Cache mode, determinism, crops, parallelism (default: no cache).
        examples_hint: Examples in `files`; a small data set that is cached decoded is read
            sequentially once instead (fewer than `_PARALLEL_FILL_EXAMPLES`).

    Returns:
        A dataset of ``(images float32 [B,S,S,C], labels int32 [B])``, C the options'
        channels.
    """
    options = options or ReaderOptions()
    crop = options.random_crop_min_area if training else 1.0
    readers = parallel_readers(options)

    def read_unit(name: tf.Tensor, part: tf.Tensor, parts: tf.Tensor) -> tf.data.Dataset:
        records = tf.data.TFRecordDataset(name, compression_type=options.compression)
        records = records.shard(tf.cast(parts, tf.int64), tf.cast(part, tf.int64))
        if training:
            records = records.shuffle(_RECORD_SHUFFLE, seed=seed, reshuffle_each_iteration=True)
        return (records.batch(batch_size).map(_parse_block)
                .map(lambda parsed: _decode_block(parsed, image_size, crop)))

    with tf.device("/CPU:0"):
        if options.cache == "decoded" and not crop < 1.0 and (
            examples_hint is not None and examples_hint < _PARALLEL_FILL_EXAMPLES
        ):
            # A small data set is read once into the cache: the sequential reader has the least
            # overhead, and parallel readers cost more to start than they save (measured).
            batches = _sequential_batches(files, image_size, batch_size, options)
        elif options.cache == "encoded":
            batches = _cached_encoded_batches(files, image_size, batch_size, crop, training,
                                              seed, options)
        else:
            units = tf.data.Dataset.from_tensor_slices(_reading_units(files, readers))
            if training:
                units = units.shuffle(len(files) * readers, seed=seed,
                                      reshuffle_each_iteration=True)
            batches = units.interleave(read_unit, cycle_length=readers,
                                       num_parallel_calls=readers,
                                       deterministic=options.deterministic)
        if options.cache == "decoded":
            batches = batches.unbatch().cache()
            if training:
                batches = batches.shuffle(_EXAMPLE_SHUFFLE, seed=seed,
                                          reshuffle_each_iteration=True)
            batches = batches.batch(batch_size)
        dataset = batches.map(
            lambda x, y: (to_model_float(to_channels(x, options.channels), options.scale), y)
        ).prefetch(AUTOTUNE)
        return dataset.with_options(_pipeline_options(options))


def _sequential_batches(
    files: Sequence[Path], image_size: int, batch_size: int, options: ReaderOptions
) -> tf.data.Dataset:
    """uint8 batches read one record at a time (the naive reader's path, without the floats)."""
    def parse_one(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_single_example(record, FEATURE_SPEC)
        return (decode_uint8(parsed["image/encoded"], image_size),
                tf.cast(parsed["image/label"], tf.int32))

    records = tf.data.TFRecordDataset([str(f) for f in files],
                                      compression_type=options.compression)
    return records.map(parse_one).batch(batch_size)


def _cached_encoded_batches(
    files: Sequence[Path], image_size: int, batch_size: int, crop: float, training: bool,
    seed: int, options: ReaderOptions,
) -> tf.data.Dataset:
    """Records cached in memory as read, then batched, parsed and decoded in parallel."""
    records = tf.data.Dataset.from_tensor_slices([str(f) for f in files]).interleave(
        lambda name: tf.data.TFRecordDataset(name, compression_type=options.compression),
        cycle_length=max(1, min(len(files), parallel_readers(options))),
        num_parallel_calls=AUTOTUNE, deterministic=options.deterministic,
    ).cache()
    if training:
        records = records.shuffle(_EXAMPLE_SHUFFLE, seed=seed, reshuffle_each_iteration=True)
    return records.batch(batch_size).map(_parse_block).map(
        lambda parsed: _decode_block(parsed, image_size, crop),
        num_parallel_calls=AUTOTUNE, deterministic=options.deterministic,
    )


_CEILING_EXAMPLES = 50_000


def decode_ceiling_dataset(
    files: Sequence[Path], image_size: int, batch_size: int, compression: str = ""
) -> tf.data.Dataset:
    """The shards' JPEG bytes held in memory, decoded in parallel batches on all cores.

    The records are read and parsed before the dataset is returned (up to `_CEILING_EXAMPLES`
    of them), so iterating it costs only the decoding: the physical limit of any reader that
    decodes every pass, against which the tuned reader without cache is judged.

    Returns:
        A dataset of ``(images uint8 [B,S,S,3], labels int32 [B])``.
    """
    encoded, labels = [], []
    records = tf.data.TFRecordDataset([str(f) for f in files], compression_type=compression)
    for parsed in records.take(_CEILING_EXAMPLES).batch(4096).map(_parse_block):
        encoded.append(parsed["image/encoded"])
        labels.append(tf.cast(parsed["image/label"], tf.int32))
    blocks = tf.data.Dataset.from_tensor_slices(
        (tf.concat(encoded, 0), tf.concat(labels, 0))).batch(batch_size)
    signature = tf.TensorSpec([image_size, image_size, 3], tf.uint8)
    decoded = blocks.map(
        lambda block, y: (tf.map_fn(lambda one: decode_uint8(one, image_size), block,
                                    fn_output_signature=signature,
                                    parallel_iterations=_DECODES_IN_FLIGHT), y),
        num_parallel_calls=os.cpu_count() or 1, deterministic=False)
    return decoded.prefetch(AUTOTUNE)


def naive_dataset(
    files: Sequence[Path], image_size: int, batch_size: int, compression: str = ""
) -> tf.data.Dataset:
    """The reference reader: one file after another, one example at a time, no parallelism."""
    def parse_one(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_single_example(record, FEATURE_SPEC)
        return (decode_image(parsed["image/encoded"], image_size),
                tf.cast(parsed["image/label"], tf.int32))

    with tf.device("/CPU:0"):
        records = tf.data.TFRecordDataset([str(f) for f in files], compression_type=compression)
        dataset = records.map(parse_one).batch(batch_size)
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        return dataset.with_options(options)


def load_split(
    dataset: DatasetArtifact, split: str, limit: int | None = None, scale: InputScale = "unit"
) -> tuple[np.ndarray, np.ndarray]:
    """Decode one split of a data set into memory in file order, scaled for the model.

    Evaluation, calibration, export checks and benchmark inputs all read through this, so the
    model sees the same pixels everywhere.
    """
    return load_split_arrays(dataset.splits[split].files, dataset.image_size, limit,
                             dataset.compression, scale, dataset.channels)


def load_split_arrays(
    files: Sequence[Path], image_size: int, limit: int | None = None, compression: str = "",
    scale: InputScale = "unit", channels: int = 3,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode shards into memory in file order (for evaluation and benchmark inputs).

    Args:
        files: TFRecord shards of the split.
        image_size: Output image side.
        limit: Stop after this many examples.
        compression: ``""`` or ``"GZIP"``.
        scale: The model's input scale (see `to_model_float`).
        channels: The model's image channels (1: grayscale).

    Returns:
        ``(images float32 [N,S,S,C], labels int32 [N])``.
    """
    options = ReaderOptions(deterministic=True, compression=compression, scale=scale,
                            channels=channels)
    dataset = tuned_dataset(files, image_size, 256, options=options)
    images, labels, total = [], [], 0
    for batch_images, batch_labels in dataset:
        images.append(batch_images.numpy())
        labels.append(batch_labels.numpy())
        total += len(batch_labels)
        if limit is not None and total >= limit:
            break
    if not images:
        return (np.zeros((0, image_size, image_size, channels), np.float32),
                np.zeros((0,), np.int32))
    all_images, all_labels = np.concatenate(images), np.concatenate(labels)
    return (all_images[:limit], all_labels[:limit]) if limit else (all_images, all_labels)
