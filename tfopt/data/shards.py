"""TFRecord shards: the plan, each shard written atomically with its sidecar, the manifest.

Each shard is written under a temporary name and renamed when complete, then described by a
small sidecar JSON. A rerun skips every shard whose sidecar matches the plan and whose bytes
still match its checksum, so an interrupted run resumes instead of starting over. Images from a
folder or from TFRecords become the same features (encoded JPEG, label, class name, shape,
source); an array source's examples become each array's raw bytes (`tfopt.data.arrays`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tfopt.artifacts import ArraySpec, DatasetArtifact, SplitInfo
from tfopt.config import DataConfig
from tfopt.data.records import NoUsableDataError, named_records
from tfopt.data.sources import SourceImage, source_feature_spec
from tfopt.fileio import atomic_write_json, sha256_file


SPLITS = ("train", "select", "val", "test")


MANIFEST_NAME = "manifest.json"


_MANIFEST_VERSION = 1


_REENCODE_QUALITY = 95


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


_MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def validate_image(data: bytes) -> tuple[bytes, int, int, bool]:
    """Validate encoded image bytes: JPEG bytes, height, width, and whether it was re-encoded.

    Baseline JPEGs in RGB or grayscale are kept byte for byte. Anything else PIL can read (PNG,
    RGBA, CMYK, palette, BMP, ...) is converted to RGB and re-encoded as JPEG, so every record
    decodes with the same (fused) JPEG ops.

    Raises:
        ValueError: The file is not a readable image (corrupt, truncated or not an image).
    """
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
        # PIL names the in-memory buffer with its address; a reason must not differ per run.
        message = _MEMORY_ADDRESS.sub("", str(error))
        raise ValueError(f"not a readable image: {type(error).__name__}: {message}") from error


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
    # Map fields serialize in process-dependent order unless asked otherwise; a shard rewritten
    # by another process must have the same bytes (and checksum) as the first time.
    return tf.train.Example(features=features).SerializeToString(deterministic=True)


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


def _shard_sources(
    plan: ShardPlan, cfg: DataConfig
) -> Iterator[tuple[SourceImage, bytes | None, str | None]]:
    """Each planned entry with its encoded bytes, or the reason they could not be read."""
    if cfg.source_format == "image_folder":
        for image in plan.images:
            try:
                yield image, (cfg.source_dir / image.relative_path).read_bytes(), None
            except OSError as error:
                yield image, None, f"cannot read: {error.strerror or error}"
        return
    import tensorflow as tf

    spec = source_feature_spec(cfg)
    records = {entry: tf.io.parse_single_example(record, spec)[cfg.tfrecord_image_key].numpy()
               for entry, record in named_records(
                   cfg, (image.relative_path for image in plan.images)).items()}
    for image in plan.images:
        data = records.get(image.relative_path)
        yield image, data, None if data is not None else "record no longer readable"


def _shard_records(plan: ShardPlan, cfg: DataConfig, class_names: list[str]
                   ) -> Iterator[tuple[SourceImage, bytes | None, bool, str | None]]:
    """Each planned entry's serialized example, whether it was re-encoded, or why it is skipped."""
    if cfg.arrays:
        from tfopt.data.arrays import example_records
        from tfopt.data.features import feature_records

        by_name = {entry.relative_path: entry for entry in plan.images}
        records = (example_records(list(by_name), cfg.source_dir) if cfg.source_format == "npz"
                   else feature_records(list(by_name), cfg))
        for name, record, problem in records:
            yield by_name[name], record, False, problem
        return
    for image, data, error in _shard_sources(plan, cfg):
        try:
            if data is None:
                raise ValueError(error)
            encoded, height, width, converted = validate_image(data)
        except ValueError as problem:
            yield image, None, False, str(problem)
            continue
        yield image, _example_bytes(encoded, image.label, class_names[image.label], height,
                                    width, image.relative_path), converted, None


def write_shard(plan: ShardPlan, cfg: DataConfig, class_names: list[str],
                shard_path: Path) -> dict:
    """Write one shard atomically and its sidecar; skip and record unreadable examples.

    Returns:
        The sidecar's content: examples, bytes, sha256, class counts and skipped files.
    """
    import tensorflow as tf

    tmp_path = shard_path.with_name(f".{shard_path.name}.{os.getpid()}.tmp")
    options = tf.io.TFRecordOptions(compression_type=_writer_compression(cfg))
    skipped, class_counts, examples, reencoded = [], {}, 0, 0
    try:
        with tf.io.TFRecordWriter(str(tmp_path), options) as writer:
            for entry, record, converted, problem in _shard_records(plan, cfg, class_names):
                if record is None:
                    skipped.append({"path": entry.relative_path, "reason": str(problem)[:300]})
                    continue
                reencoded += converted
                writer.write(record)
                if class_names:
                    class_name = class_names[entry.label]
                    class_counts[class_name] = class_counts.get(class_name, 0) + 1
                examples += 1
        # The sidecar goes first: a shard under its final name always has one, and a sidecar
        # whose shard is missing or differs is ignored on resume.
        meta = {
            "file": shard_path.name,
            "split": plan.split,
            "examples": examples,
            "bytes": tmp_path.stat().st_size,
            "sha256": sha256_file(tmp_path),
            "class_counts": class_counts,
            "skipped": skipped,
            "reencoded": reencoded,
            "plan_digest": plan.digest(),
        }
        atomic_write_json(_sidecar_path(shard_path), meta)
        os.replace(tmp_path, shard_path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return meta


def _writer_compression(cfg: DataConfig) -> str:
    return "GZIP" if cfg.compression == "gzip" else ""


def shard_suffix(cfg: DataConfig) -> str:
    """File suffix of the shards: ``.tfrecord``, or ``.tfrecord.gz`` when compressed."""
    return ".tfrecord.gz" if cfg.compression == "gzip" else ".tfrecord"


def shard_path(out_dir: Path, plan: ShardPlan, cfg: DataConfig) -> Path:
    """Where a planned shard lies in the data set's folder (``.tfrecord.gz`` when compressed)."""
    return out_dir / plan.file_name.replace(".tfrecord", shard_suffix(cfg))


def dataset_dir_for(cfg: DataConfig, work_dir: Path, images: list[SourceImage]) -> Path:
    """A folder named after the source listing, so the same data maps to the same shards."""
    listing = hashlib.sha256()
    listing.update(
        f"{cfg.source_dir.resolve()}|{cfg.shard_size_mb}|{cfg.compression}".encode()
    )
    if cfg.features is not None:  # the same records parsed another way are other shards
        listing.update(json.dumps([{k: v.model_dump() for k, v in cfg.features.items()},
                                   cfg.label_feature], sort_keys=True).encode())
    for image in images:
        listing.update(f"{image.relative_path}\t{image.size_bytes}\t{image.split}\n".encode())
    return work_dir / "datasets" / f"{cfg.source_dir.name}-{listing.hexdigest()[:12]}"


def is_intact(dataset: DatasetArtifact) -> bool:
    """The manifest and every shard a (possibly cached) result names are still on disk."""
    files = [file for info in dataset.splits.values() for file in info.files]
    return dataset.manifest_path.is_file() and all(file.is_file() for file in files)


def write_manifest(cfg: DataConfig, out_dir: Path, class_names: list[str],
                   shard_metas: list[dict], listing_skipped: list[dict],
                   val_fraction: float, select_fraction: float = 0.0,
                   arrays: dict[str, ArraySpec] | None = None) -> DatasetArtifact:
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
            bytes=sum(meta["bytes"] for meta in metas),
        )
        manifest_splits[split] = {
            "examples": examples,
            "class_counts": counts,
            "shards": [
                {key: meta[key] for key in ("file", "examples", "bytes", "sha256")}
                for meta in metas
            ],
        }
    quarantine = listing_skipped + [item for meta in shard_metas for item in meta["skipped"]]
    total = sum(info.examples for info in splits.values())
    if total == 0:
        raise NoUsableDataError(
            f"no usable example in {cfg.source_dir}: all {len(quarantine)} were skipped "
            f"(first: {quarantine[0] if quarantine else 'none'})"
        )
    if splits["train"].examples == 0:
        raise NoUsableDataError(f"the training split of {cfg.source_dir} is empty")
    manifest = {
        "version": _MANIFEST_VERSION,
        "source_dir": str(cfg.source_dir.resolve()),
        "class_names": class_names,
        "arrays": {name: spec.model_dump() for name, spec in (arrays or {}).items()},
        "source_format": cfg.source_format,
        "compression": cfg.compression,
        "shard_target_bytes": int(cfg.shard_size_mb * 1024 * 1024),
        "split_rule": (
            f"sha256(relative path) -> [0,1): test < {cfg.test_fraction}, "
            f"val < {cfg.test_fraction + val_fraction:g}, "
            f"select < {cfg.test_fraction + val_fraction + select_fraction:g}, else train"
        ),
        "val_fraction": val_fraction,
        "select_fraction": select_fraction,
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
        compression=_writer_compression(cfg),
        arrays=arrays or {},
    )
