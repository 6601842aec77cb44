"""tf.data readers for tfopt's TFRecord shards: the tuned pipeline and the naive reference.

Not a task: the training, measurement and benchmark tasks build their input with these
functions. All input work is pinned to the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tensorflow as tf

from tfopt.artifacts import DatasetArtifact
from tfopt.config import InputConfig

FEATURE_SPEC = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/label": tf.io.FixedLenFeature([], tf.int64),
}
PARSE_BLOCK = 256
AUTOTUNE = tf.data.AUTOTUNE
_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class ReaderOptions:
    """Knobs of the tuned reader (see `tfopt.config.InputConfig`)."""

    cache: Literal["decoded", "encoded", "none"] = "none"
    deterministic: bool = False
    random_crop_min_area: float = 1.0
    interleave_cycle: int = 8
    private_threads: int = 0
    compression: str = ""


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
    dataset: DatasetArtifact, split: str, cfg: InputConfig, training: bool
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
    )
    return options, decision


def _to_float(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Resize (only when needed) and scale a uint8 image to float32 in [0, 1]."""
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], image_size), tf.equal(shape[1], image_size))
    resized = tf.cond(
        same,
        lambda: tf.cast(image, tf.float32),
        lambda: tf.image.resize(image, [image_size, image_size], antialias=True),
    )
    return tf.ensure_shape(tf.clip_by_value(resized / 255.0, 0.0, 1.0),
                           [image_size, image_size, 3])


def decode_image(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decode one JPEG into a float32 ``[image_size, image_size, 3]`` tensor in [0, 1]."""
    return _to_float(tf.io.decode_jpeg(encoded, channels=3), image_size)


def decode_random_crop(encoded: tf.Tensor, image_size: int, min_area: float) -> tf.Tensor:
    """Decode only a random crop of a JPEG with the fused `decode_and_crop_jpeg`, then resize.

    Decoding just the crop window skips the rest of the image's pixels, which is why the fused
    op is faster than decoding everything and cropping afterwards.
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
    return _to_float(tf.io.decode_and_crop_jpeg(encoded, window, channels=3), image_size)


def _parse_block(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(serialized, FEATURE_SPEC)
    return parsed["image/encoded"], tf.cast(parsed["image/label"], tf.int32)


def _decode_block(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    return tf.map_fn(
        lambda one: decode_image(one, image_size), encoded,
        fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.float32),
    )


def _pipeline_options(options: ReaderOptions) -> tf.data.Options:
    data_options = tf.data.Options()
    data_options.deterministic = options.deterministic
    data_options.autotune.enabled = True
    data_options.experimental_optimization.map_parallelization = True
    data_options.threading.max_intra_op_parallelism = 1
    if options.private_threads:
        data_options.threading.private_threadpool_size = options.private_threads
    return data_options


def tuned_dataset(
    files: Sequence[Path],
    image_size: int,
    batch_size: int,
    *,
    training: bool = False,
    seed: int = 0,
    options: ReaderOptions | None = None,
) -> tf.data.Dataset:
    """The tuned reader: parallel interleave, vectorized parsing, AUTOTUNE maps, cache, prefetch.

    Records are parsed in blocks of `PARSE_BLOCK` with one `parse_example` call; JPEGs are
    decoded block by block (a whole crop-free block per map call, blocks in parallel), or, for
    training with random crops, one by one with the fused `decode_and_crop_jpeg`.

    Args:
        files: TFRecord shards.
        image_size: Output image side.
        batch_size: Examples per batch.
        training: Shuffle files and examples (and crop, if the options say so).
        seed: Shuffle and crop seed.
        options: Cache mode, determinism, crops, parallelism (default: no cache).

    Returns:
        A dataset of ``(images float32 [B,S,S,3], labels int32 [B])``.
    """
    options = options or ReaderOptions()
    crops = training and options.random_crop_min_area < 1.0
    with tf.device("/CPU:0"):
        names = tf.data.Dataset.from_tensor_slices([str(f) for f in files])
        if training:
            names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        records = names.interleave(
            lambda name: tf.data.TFRecordDataset(name, compression_type=options.compression),
            cycle_length=max(1, min(len(files), options.interleave_cycle)),
            num_parallel_calls=AUTOTUNE,
            deterministic=options.deterministic,
        )
        blocks = records.batch(PARSE_BLOCK).map(_parse_block, num_parallel_calls=AUTOTUNE)
        if crops:
            examples = blocks.unbatch()
            if options.cache == "encoded":
                examples = examples.cache()
            examples = examples.shuffle(10_000, seed=seed, reshuffle_each_iteration=True).map(
                lambda encoded, label: (
                    decode_random_crop(encoded, image_size, options.random_crop_min_area), label
                ),
                num_parallel_calls=AUTOTUNE, deterministic=options.deterministic,
            )
        else:
            if options.cache == "encoded":
                blocks = blocks.cache()
            examples = blocks.map(
                lambda encoded, label: (_decode_block(encoded, image_size), label),
                num_parallel_calls=AUTOTUNE, deterministic=options.deterministic,
            ).unbatch()
            if options.cache == "decoded":
                examples = examples.cache()
            if training:
                examples = examples.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
        dataset = examples.batch(batch_size).prefetch(AUTOTUNE)
        return dataset.with_options(_pipeline_options(options))


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


def load_split_arrays(
    files: Sequence[Path], image_size: int, limit: int | None = None, compression: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Decode a split into memory in file order (for evaluation and benchmark inputs).

    Args:
        files: TFRecord shards of the split.
        image_size: Output image side.
        limit: Stop after this many examples.
        compression: ``""`` or ``"GZIP"``.

    Returns:
        ``(images float32 [N,S,S,3], labels int32 [N])``.
    """
    options = ReaderOptions(deterministic=True, compression=compression)
    dataset = tuned_dataset(files, image_size, 256, options=options)
    images, labels, total = [], [], 0
    for batch_images, batch_labels in dataset:
        images.append(batch_images.numpy())
        labels.append(batch_labels.numpy())
        total += len(batch_labels)
        if limit is not None and total >= limit:
            break
    if not images:
        return np.zeros((0, image_size, image_size, 3), np.float32), np.zeros((0,), np.int32)
    all_images, all_labels = np.concatenate(images), np.concatenate(labels)
    return (all_images[:limit], all_labels[:limit]) if limit else (all_images, all_labels)
