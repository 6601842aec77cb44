"""The data source: a class-per-folder image tree or a folder of TFRecord files, listed.

Listing reads names, sizes and (for TFRecord sources) labels, never pixels: every file gets its
label and a split from a hash of its path, so the shard plan is known before any image is read
and a file keeps its split across reruns and new files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from tfopt.artifacts import ArraySpec
from tfopt.config import DataConfig
from tfopt.data.records import NoUsableDataError, parsed_source_records


@dataclass(frozen=True)
class SourceImage:
    """One file of the source folder and where it goes."""

    relative_path: str
    label: int
    size_bytes: int
    split: str


def list_class_folders(source_dir: Path) -> list[str]:
    """Return the class names: the non-hidden sub-folders of `source_dir`, sorted.

    Raises:
        NoUsableDataError: The folder does not exist or has no class sub-folders.
    """
    if not source_dir.is_dir():
        raise NoUsableDataError(f"data.source_dir {source_dir} is not a folder")
    classes = sorted(
        entry.name
        for entry in source_dir.iterdir()
        if entry.is_dir() and not entry.name.startswith(".")
    )
    if not classes:
        raise NoUsableDataError(
            f"data.source_dir {source_dir} has no class sub-folders; expected <label>/<image> files"
        )
    return classes


def split_of(relative_path: str, val_fraction: float, test_fraction: float,
             select_fraction: float = 0.0) -> str:
    """Assign a file to a split from a hash of its path: stable across reruns and new files.

    The selection split is the slice after validation, so carving it takes files from training
    only: a file's test or validation split does not depend on `select_fraction`.
    """
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < test_fraction:
        return "test"
    if position < test_fraction + val_fraction:
        return "val"
    if position < test_fraction + val_fraction + select_fraction:
        return "select"
    return "train"


def list_source_images(
    cfg: DataConfig, class_names: list[str]
) -> tuple[list[SourceImage], list[dict]]:
    """List the source files with their labels, in a deterministic order (splits: `with_splits`).

    A file whose name is not valid UTF-8 (it could not be stored in the manifest or a TFRecord)
    is quarantined with its name's bytes.

    Returns:
        The images, and the quarantined files with their reasons.
    """
    images, quarantined = [], []
    for label, class_name in enumerate(class_names):
        class_dir = cfg.source_dir / class_name
        # Symlinks are listed even when broken, so an unreadable file is counted, not ignored.
        files = sorted(
            path
            for path in class_dir.rglob("*")
            if (path.is_file() or path.is_symlink()) and not path.name.startswith(".")
        )
        if cfg.max_examples_per_class is not None:
            files = files[: cfg.max_examples_per_class]
        listed = []
        for path in files:
            relative = path.relative_to(cfg.source_dir).as_posix()
            if not _is_utf8(relative):
                quarantined.append({"path": _printable(relative),
                                    "reason": "file name is not valid UTF-8; rename the file"})
                continue
            listed.append(SourceImage(relative_path=relative, label=label,
                                      size_bytes=_size_or_zero(path), split=""))
        images += listed
    return images, quarantined


def with_splits(images: list[SourceImage], val_fraction: float,
                test_fraction: float, select_fraction: float = 0.0) -> list[SourceImage]:
    """`images` each given its split (`split_of`), in their order.

    Every class reaches training: a class whose files all hash into another split gets its
    first file moved to train.
    """
    placed = [replace(image, split=split_of(image.relative_path, val_fraction, test_fraction,
                                            select_fraction))
              for image in images]
    trained = {image.label for image in placed if image.split == "train"}
    for index, image in enumerate(placed):
        if image.label not in trained:
            placed[index] = replace(image, split="train")
            trained.add(image.label)
    return placed


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(name: str) -> str:
    """A file name whose undecodable bytes show as backslash escapes, never raising."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def source_feature_spec(cfg: DataConfig) -> dict:
    import tensorflow as tf

    return {
        cfg.tfrecord_image_key: tf.io.FixedLenFeature([], tf.string),
        cfg.tfrecord_label_key: tf.io.FixedLenFeature([], tf.int64),
    }


def list_tfrecord_source(cfg: DataConfig) -> tuple[list[str], list[SourceImage], list[dict]]:
    """Index a folder of TFRecord files: one entry per record, labels read from the records.

    Returns:
        Class names (the labels found, sorted), the entries, and the records that could not
        be read or parsed.
    """
    records, skipped = parsed_source_records(cfg, source_feature_spec(cfg), "cannot parse")
    entries = [(name, int(parsed[cfg.tfrecord_label_key]), size)
               for name, parsed, size in records]
    labels = sorted({label for _, label, _ in entries})
    position = {label: i for i, label in enumerate(labels)}
    images = [SourceImage(relative_path=name, label=position[label], size_bytes=size, split="")
              for name, label, size in entries]
    return [str(label) for label in labels], images, skipped


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def source_fingerprint(source_dir: Path) -> str:
    """A digest of every file under `source_dir`: relative path, size and modification time.

    Editing, adding, removing or replacing a file changes it; reading the folder does not.
    """
    digest = hashlib.sha256()
    for path in sorted(source_dir.rglob("*")):
        if path.name.startswith(".") or not (path.is_file() or path.is_symlink()):
            continue
        try:
            stat = path.stat()
            facts = f"{stat.st_size}\t{stat.st_mtime_ns}"
        except OSError:
            facts = "unreadable"
        digest.update(f"{path.relative_to(source_dir).as_posix()}\t{facts}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class SourceListing:
    """What a source folder holds: its classes, its usable entries and what was left out."""

    class_names: list[str]
    images: list[SourceImage]
    skipped: list[dict]
    empty_classes: list[str]
    val_fraction: float = 0.0
    """The validation split's share (``auto`` resolved for these images: `DataConfig.val_share`)."""
    select_fraction: float = 0.0
    """The selection split's share (``auto`` resolved: `DataConfig.select_share`)."""
    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    """An ``npz`` source's arrays by name (`tfopt.data.arrays`); empty for images."""


def list_source(cfg: DataConfig) -> SourceListing:
    """List `cfg.source_dir` (images, TFRecords or arrays) and refuse a source no model can use.

    Class folders that hold no usable file name are left out (and listed as skipped).

    Raises:
        NoUsableDataError: No class folders or files, or fewer than two classes with images.
        ArraySourceError: ``.npz`` files whose arrays cannot be one model's data.
    """
    if cfg.arrays:
        return _array_listing(cfg)
    empty: list[str] = []
    if cfg.source_format == "tfrecord":
        class_names, images, skipped = list_tfrecord_source(cfg)
    else:
        class_names = list_class_folders(cfg.source_dir)
        images, skipped = list_source_images(cfg, class_names)
        used = sorted({image.label for image in images})
        empty = [name for label, name in enumerate(class_names) if label not in used]
        if empty and images:
            class_names = [class_names[label] for label in used]
            images, skipped = list_source_images(cfg, class_names)
            skipped += [{"path": f"{name}/", "reason": "empty class folder"} for name in empty]
    if not images and not skipped:
        raise NoUsableDataError(f"data.source_dir {cfg.source_dir} has class folders but no files")
    if len(class_names) < 2:
        raise NoUsableDataError(
            f"data.source_dir {cfg.source_dir} has {len(class_names)} class with images "
            f"({', '.join(class_names) or 'none'}); a classifier needs at least two classes, "
            "one sub-folder of images per class"
        )
    val_fraction = cfg.val_share(len(images))
    select_fraction = cfg.select_share(len(images))
    return SourceListing(
        class_names, with_splits(images, val_fraction, cfg.test_fraction, select_fraction),
        skipped, empty if images else [], val_fraction, select_fraction)


def _array_listing(cfg: DataConfig) -> SourceListing:
    """An ``npz`` source's examples, or TFRecords of `features`, split as records are (no
    classes: any model's data)."""
    from tfopt.data.arrays import list_npz_source
    from tfopt.data.features import list_feature_source

    if cfg.source_format == "npz":
        (entries, skipped, arrays), files = list_npz_source(cfg.source_dir), ".npz file"
    else:
        (entries, skipped, arrays), files = list_feature_source(cfg), "TFRecord file"
    if not entries:
        raise NoUsableDataError(f"data.source_dir {cfg.source_dir}: no readable {files} holds "
                                f"an example (first skipped: {skipped[0] if skipped else 'none'})")
    val_fraction = cfg.val_share(len(entries))
    select_fraction = cfg.select_share(len(entries))
    examples = [SourceImage(relative_path=name, label=0, size_bytes=size, split="")
                for name, size in entries]
    return SourceListing([], with_splits(examples, val_fraction, cfg.test_fraction,
                                         select_fraction),
                         skipped, [], val_fraction, select_fraction, arrays)
