"""Image folder -> sharded TFRecord files with a manifest.

The shard plan is computed from the file listing alone (paths, sizes, labels, a hash-based
split), so it is deterministic and known before any image is read. Each shard is written under a
temporary name and renamed when complete, then described by a small sidecar JSON. A rerun skips
every shard whose sidecar matches the plan and whose bytes still match its checksum, so an
interrupted run resumes instead of starting over.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from prefect import task

from tfopt.artifacts import DatasetArtifact, SplitInfo
from tfopt.config import DataConfig
from tfopt.fileio import atomic_write_json, sha256_file
from tfopt.logs import step_logger

SPLITS = ("train", "val", "test")
MANIFEST_NAME = "manifest.json"
_MANIFEST_VERSION = 1
_REENCODE_QUALITY = 95


@dataclass(frozen=True)
class SourceImage:
    """One file of the source folder and where it goes."""

    relative_path: str
    label: int
    size_bytes: int
    split: str


@dataclass(frozen=True)
class ShardPlan:
    """The files of one shard, fixed before anything is written."""

    split: str
    index: int
    count: int
    images: tuple[SourceImage, ...]

    @property
    def file_name(self) -> str:
        """Shard file name, e.g. ``train-00001-of-00004.tfrecord``."""
        return f"{self.split}-{self.index:05d}-of-{self.count:05d}.tfrecord"

    def digest(self) -> str:
        """Hash of what the shard must contain; a sidecar with another digest is stale."""
        text = "\n".join(
            f"{image.relative_path}\t{image.label}\t{image.size_bytes}" for image in self.images
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


class NoUsableDataError(ValueError):
    """The source folder holds no image the pipeline can use."""


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


def split_of(relative_path: str, val_fraction: float, test_fraction: float) -> str:
    """Assign a file to a split from a hash of its path: stable across reruns and new files."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    if position < test_fraction:
        return "test"
    if position < test_fraction + val_fraction:
        return "val"
    return "train"


def list_source_images(cfg: DataConfig, class_names: list[str]) -> list[SourceImage]:
    """List the source files with their labels and splits, in a deterministic order."""
    images = []
    for label, class_name in enumerate(class_names):
        class_dir = cfg.source_dir / class_name
        files = sorted(
            path
            for path in class_dir.rglob("*")
            if path.is_file() and not path.name.startswith(".")
        )
        if cfg.max_examples_per_class is not None:
            files = files[: cfg.max_examples_per_class]
        for path in files:
            relative = path.relative_to(cfg.source_dir).as_posix()
            images.append(
                SourceImage(
                    relative_path=relative,
                    label=label,
                    size_bytes=path.stat().st_size,
                    split=split_of(relative, cfg.val_fraction, cfg.test_fraction),
                )
            )
    return images


def plan_shards(images: list[SourceImage], target_bytes: int) -> list[ShardPlan]:
    """Pack each split's files, in order, into shards of about `target_bytes` each."""
    plans = []
    for split in SPLITS:
        members = [image for image in images if image.split == split]
        groups: list[list[SourceImage]] = []
        current: list[SourceImage] = []
        current_bytes = 0
        for image in members:
            if current and current_bytes + image.size_bytes > target_bytes:
                groups.append(current)
                current, current_bytes = [], 0
            current.append(image)
            current_bytes += image.size_bytes
        if current:
            groups.append(current)
        plans.extend(
            ShardPlan(split=split, index=i, count=len(groups), images=tuple(group))
            for i, group in enumerate(groups)
        )
    return plans


def read_image(path: Path) -> tuple[bytes, int, int, bool]:
    """Read and validate an image: JPEG bytes, height, width, and whether it was re-encoded.

    Baseline JPEGs in RGB or grayscale are kept byte for byte. Anything else PIL can read (PNG,
    RGBA, CMYK, palette, BMP, ...) is converted to RGB and re-encoded as JPEG, so every record
    decodes with the same (fused) JPEG ops.

    Raises:
        ValueError: The file is not a readable image (corrupt, truncated or not an image).
    """
    data = path.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as probe:
            probe.verify()
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            width, height = image.size
            if image.format == "JPEG" and image.mode in ("RGB", "L"):
                return data, height, width, False
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="JPEG", quality=_REENCODE_QUALITY)
            return buffer.getvalue(), height, width, True
    except Exception as error:
        raise ValueError(f"not a readable image: {type(error).__name__}: {error}") from error


def _example_bytes(encoded: bytes, label: int, class_name: str, height: int, width: int,
                   source: str) -> bytes:
    import tensorflow as tf

    def _bytes(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def _int(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    features = tf.train.Features(
        feature={
            "image/encoded": _bytes(encoded),
            "image/format": _bytes(b"jpeg"),
            "image/label": _int(label),
            "image/class": _bytes(class_name.encode("utf-8")),
            "image/height": _int(height),
            "image/width": _int(width),
            "image/channels": _int(3),
            "image/source": _bytes(source.encode("utf-8")),
        }
    )
    return tf.train.Example(features=features).SerializeToString()


def _sidecar_path(shard_path: Path) -> Path:
    return shard_path.with_name(shard_path.name + ".json")


def load_complete_shard(plan: ShardPlan, shard_path: Path) -> dict | None:
    """Return a shard's sidecar if the shard on disk is complete, current and intact."""
    sidecar = _sidecar_path(shard_path)
    if not (sidecar.exists() and shard_path.exists()):
        return None
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if meta.get("plan_digest") != plan.digest():
        return None
    if meta.get("bytes") != shard_path.stat().st_size or meta.get("sha256") != sha256_file(
        shard_path
    ):
        return None
    return meta


def write_shard(plan: ShardPlan, source_dir: Path, class_names: list[str],
                shard_path: Path) -> dict:
    """Write one shard atomically and its sidecar; skip and record unreadable images.

    Returns:
        The sidecar's content: examples, bytes, sha256, class counts and skipped files.
    """
    import tensorflow as tf

    tmp_path = shard_path.with_name(f".{shard_path.name}.{os.getpid()}.tmp")
    skipped, class_counts, examples, reencoded = [], {}, 0, 0
    try:
        with tf.io.TFRecordWriter(str(tmp_path)) as writer:
            for image in plan.images:
                path = source_dir / image.relative_path
                try:
                    encoded, height, width, converted = read_image(path)
                except (OSError, ValueError) as error:
                    skipped.append({"path": image.relative_path, "reason": str(error)[:300]})
                    continue
                reencoded += converted
                class_name = class_names[image.label]
                writer.write(
                    _example_bytes(encoded, image.label, class_name, height, width,
                                   image.relative_path)
                )
                class_counts[class_name] = class_counts.get(class_name, 0) + 1
                examples += 1
        os.replace(tmp_path, shard_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    meta = {
        "file": shard_path.name,
        "split": plan.split,
        "examples": examples,
        "bytes": shard_path.stat().st_size,
        "sha256": sha256_file(shard_path),
        "class_counts": class_counts,
        "skipped": skipped,
        "reencoded": reencoded,
        "plan_digest": plan.digest(),
    }
    atomic_write_json(_sidecar_path(shard_path), meta)
    return meta


def dataset_dir_for(cfg: DataConfig, work_dir: Path, images: list[SourceImage]) -> Path:
    """A folder named after the source listing, so the same data maps to the same shards."""
    listing = hashlib.sha256()
    listing.update(f"{cfg.source_dir.resolve()}|{cfg.shard_size_mb}".encode())
    for image in images:
        listing.update(f"{image.relative_path}\t{image.size_bytes}\t{image.split}\n".encode())
    return work_dir / "datasets" / f"{cfg.source_dir.name}-{listing.hexdigest()[:12]}"


@task(name="write_tfrecords", tags=["preprocessing"])
def write_tfrecords(cfg: DataConfig, work_dir: Path) -> DatasetArtifact:
    """Shard an image folder into TFRecord files with a manifest; resume where a run stopped.

    Args:
        cfg: Source folder, split fractions and shard size.
        work_dir: Root folder; shards go to ``<work_dir>/datasets/<source>-<hash>/``.

    Returns:
        The shard files per split, the class names and the counts.

    Raises:
        NoUsableDataError: The folder has no usable image, or the training split is empty.
    """
    logger = step_logger()
    class_names = list_class_folders(cfg.source_dir)
    images = list_source_images(cfg, class_names)
    if not images:
        raise NoUsableDataError(f"data.source_dir {cfg.source_dir} has class folders but no files")
    out_dir = dataset_dir_for(cfg, work_dir, images)
    out_dir.mkdir(parents=True, exist_ok=True)
    plans = plan_shards(images, int(cfg.shard_size_mb * 1024 * 1024))
    shard_metas, reused = [], 0
    for plan in plans:
        shard_path = out_dir / plan.file_name
        meta = load_complete_shard(plan, shard_path)
        if meta is None:
            meta = write_shard(plan, cfg.source_dir, class_names, shard_path)
        else:
            reused += 1
        shard_metas.append(meta)
    logger.info(
        "%d shards in %s (%d reused from an earlier run, %d written)",
        len(plans), out_dir, reused, len(plans) - reused,
    )
    return _finish_manifest(cfg, out_dir, class_names, shard_metas)


def _finish_manifest(cfg: DataConfig, out_dir: Path, class_names: list[str],
                     shard_metas: list[dict]) -> DatasetArtifact:
    splits: dict[str, SplitInfo] = {}
    manifest_splits = {}
    for split in SPLITS:
        metas = [meta for meta in shard_metas if meta["split"] == split and meta["examples"]]
        counts: dict[str, int] = {}
        for meta in metas:
            for name, count in meta["class_counts"].items():
                counts[name] = counts.get(name, 0) + count
        examples = sum(meta["examples"] for meta in metas)
        splits[split] = SplitInfo(
            files=[out_dir / meta["file"] for meta in metas],
            examples=examples,
            class_counts=counts,
        )
        manifest_splits[split] = {
            "examples": examples,
            "class_counts": counts,
            "shards": [
                {key: meta[key] for key in ("file", "examples", "bytes", "sha256")}
                for meta in metas
            ],
        }
    quarantine = [item for meta in shard_metas for item in meta["skipped"]]
    total = sum(info.examples for info in splits.values())
    if total == 0:
        raise NoUsableDataError(
            f"no usable image in {cfg.source_dir}: all {len(quarantine)} files were skipped "
            f"(first: {quarantine[0] if quarantine else 'none'})"
        )
    if splits["train"].examples == 0:
        raise NoUsableDataError(f"the training split of {cfg.source_dir} is empty")
    manifest = {
        "version": _MANIFEST_VERSION,
        "source_dir": str(cfg.source_dir.resolve()),
        "class_names": class_names,
        "shard_target_bytes": int(cfg.shard_size_mb * 1024 * 1024),
        "split_rule": (
            f"sha256(relative path) -> [0,1): test < {cfg.test_fraction}, "
            f"val < {cfg.test_fraction + cfg.val_fraction}, else train"
        ),
        "splits": manifest_splits,
        "skipped_records": len(quarantine),
        "reencoded_to_jpeg": sum(meta.get("reencoded", 0) for meta in shard_metas),
        "quarantine": quarantine,
    }
    manifest_path = out_dir / MANIFEST_NAME
    atomic_write_json(manifest_path, manifest)
    return DatasetArtifact(
        root=out_dir,
        manifest_path=manifest_path,
        class_names=class_names,
        image_size=cfg.image_size,
        splits=splits,
        shards=sum(len(info.files) for info in splits.values()),
        skipped_records=len(quarantine),
    )
