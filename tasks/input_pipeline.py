"""tf.data readers for tfopt's TFRecord shards: the tuned pipeline and the naive reference.

Not a task: the training, measurement and benchmark tasks build their input with these
functions. All input work is pinned to the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

FEATURE_SPEC = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/label": tf.io.FixedLenFeature([], tf.int64),
}
_PARSE_BLOCK = 256
AUTOTUNE = tf.data.AUTOTUNE


def decode_image(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decode one JPEG into a float32 ``[image_size, image_size, 3]`` tensor in [0, 1]."""
    image = tf.io.decode_jpeg(encoded, channels=3)
    image = tf.image.resize(image, [image_size, image_size], antialias=True)
    return tf.clip_by_value(image / 255.0, 0.0, 1.0)


def _decode_block(serialized: tf.Tensor, image_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_example(serialized, FEATURE_SPEC)
    images = tf.map_fn(
        lambda encoded: decode_image(encoded, image_size),
        parsed["image/encoded"],
        fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.float32),
    )
    return images, tf.cast(parsed["image/label"], tf.int32)


def _decode_single(serialized: tf.Tensor, image_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_single_example(serialized, FEATURE_SPEC)
    return (
        decode_image(parsed["image/encoded"], image_size),
        tf.cast(parsed["image/label"], tf.int32),
    )


def _options(deterministic: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = True
    options.experimental_optimization.map_parallelization = True
    return options


def tuned_dataset(
    files: Sequence[Path],
    image_size: int,
    batch_size: int,
    *,
    training: bool = False,
    cache: bool = False,
    seed: int = 0,
    deterministic: bool = False,
) -> tf.data.Dataset:
    """The tuned reader: parallel interleave, vectorized parsing, AUTOTUNE maps, prefetch.

    Args:
        files: TFRecord shards.
        image_size: Output image side.
        batch_size: Examples per batch.
        training: Shuffle files and examples and repeat-friendly ordering when True.
        cache: Keep decoded examples in memory after the first pass.
        seed: Shuffle seed.
        deterministic: Keep a fixed element order (slower when stages run in parallel).

    Returns:
        A dataset of ``(images float32 [B,S,S,3], labels int32 [B])``.
    """
    with tf.device("/CPU:0"):
        names = tf.data.Dataset.from_tensor_slices([str(f) for f in files])
        if training:
            names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        records = names.interleave(
            tf.data.TFRecordDataset,
            cycle_length=max(1, min(len(files), 8)),
            num_parallel_calls=AUTOTUNE,
            deterministic=deterministic,
        )
        examples = (
            records.batch(_PARSE_BLOCK)
            .map(lambda block: _decode_block(block, image_size), num_parallel_calls=AUTOTUNE,
                 deterministic=deterministic)
            .unbatch()
        )
        if cache:
            examples = examples.cache()
        if training:
            examples = examples.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
        dataset = examples.batch(batch_size).prefetch(AUTOTUNE)
        return dataset.with_options(_options(deterministic))


def naive_dataset(files: Sequence[Path], image_size: int, batch_size: int) -> tf.data.Dataset:
    """The reference reader: one file after another, one example at a time, no parallelism."""
    with tf.device("/CPU:0"):
        records = tf.data.TFRecordDataset([str(f) for f in files])
        dataset = records.map(lambda record: _decode_single(record, image_size)).batch(batch_size)
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.map_parallelization = False
        return dataset.with_options(options)


def load_split_arrays(
    files: Sequence[Path], image_size: int, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Decode a split into memory in file order (for evaluation and benchmark inputs).

    Args:
        files: TFRecord shards of the split.
        image_size: Output image side.
        limit: Stop after this many examples.

    Returns:
        ``(images float32 [N,S,S,3], labels int32 [N])``.
    """
    dataset = tuned_dataset(files, image_size, 256, deterministic=True)
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
