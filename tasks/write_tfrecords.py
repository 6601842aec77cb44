"""Image folder -> sharded TFRecord files with a manifest.

The shard plan is computed from the file listing alone (paths, sizes, labels, a hash-based
split), so it is deterministic and known before any image is read. Each shard is written under a
temporary name and renamed when complete, then described by a small sidecar JSON. A rerun skips
every shard whose sidecar matches the plan and whose bytes still match its checksum, so an
interrupted run resumes instead of starting over. Large writes run one process per core; with
`scale.task_runner: dask` every pending shard is a Dask task (a local cluster or a running
scheduler), each worker writing its shard atomically into the shared output folder.

The source is a class-per-folder image tree, or a folder of existing TFRecord files whose
image and label features are named in the config; either way the shards hold the same
features (encoded JPEG, label, class name, shape, source).
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image
from prefect import task

from tfopt.artifacts import DatasetArtifact, SplitInfo
from tfopt.config import DataConfig, ScaleConfig
from tfopt.fileio import atomic_write_json, sha256_file
from tfopt.logs import step_logger
from tfopt.orchestration import local_dask_cluster_kwargs, retry_if_transient

SPLITS = ("train", "val", "test")
MANIFEST_NAME = "manifest.json"
_MANIFEST_VERSION = 1
_REENCODE_QUALITY = 95
_PARALLEL_WRITE_BYTES = 256 * 1024 * 1024


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


def list_source_images(
    cfg: DataConfig, class_names: list[str]
) -> tuple[list[SourceImage], list[dict]]:
    """List the source files with their labels and splits, in a deterministic order.

    Every class reaches training: a class whose files all hash into val or test gets its first
    file moved to train. A file whose name is not valid UTF-8 (it could not be stored in the
    manifest or a TFRecord) is quarantined with its name's bytes.

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
            listed.append(SourceImage(
                relative_path=relative, label=label, size_bytes=_size_or_zero(path),
                split=split_of(relative, cfg.val_fraction, cfg.test_fraction),
            ))
        if listed and all(image.split != "train" for image in listed):
            listed[0] = replace(listed[0], split="train")
        images += listed
    return images, quarantined


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(name: str) -> str:
    """A file name whose undecodable bytes show as backslash escapes, never raising."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _tfrecord_files(source_dir: Path) -> list[Path]:
    if not source_dir.is_dir():
        raise NoUsableDataError(f"data.source_dir {source_dir} is not a folder")
    files = sorted(p for p in source_dir.rglob("*") if p.is_file() and ".tfrecord" in p.name)
    if not files:
        raise NoUsableDataError(f"data.source_dir {source_dir} holds no *.tfrecord* files")
    return files


def _compression_of(path: Path) -> str:
    return "GZIP" if path.suffix in (".gz", ".gzip") else ""


def _source_feature_spec(cfg: DataConfig) -> dict:
    import tensorflow as tf

    return {
        cfg.tfrecord_image_key: tf.io.FixedLenFeature([], tf.string),
        cfg.tfrecord_label_key: tf.io.FixedLenFeature([], tf.int64),
    }


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


def list_tfrecord_source(cfg: DataConfig) -> tuple[list[str], list[SourceImage], list[dict]]:
    """Index a folder of TFRecord files: one entry per record, labels read from the records.

    Returns:
        Class names (the labels found, sorted), the entries, and the records that could not
        be read or parsed.
    """
    import tensorflow as tf

    spec = _source_feature_spec(cfg)
    entries: list[tuple[str, int, int]] = []
    skipped: list[dict] = []
    for path in _tfrecord_files(cfg.source_dir):
        relative = path.relative_to(cfg.source_dir).as_posix()
        for index, record in iterate_source_records(cfg, path):
            if isinstance(record, str):
                skipped.append({"path": f"{relative}#{index}", "reason": record})
                break
            try:
                parsed = tf.io.parse_single_example(record, spec)
            except tf.errors.OpError as error:
                skipped.append({"path": f"{relative}#{index}",
                                "reason": f"cannot parse: {error.message[:200]}"})
                continue
            entries.append((f"{relative}#{index}", int(parsed[cfg.tfrecord_label_key]),
                            len(record)))
    labels = sorted({label for _, label, _ in entries})
    position = {label: i for i, label in enumerate(labels)}
    images = [
        SourceImage(relative_path=name, label=position[label], size_bytes=size,
                    split=split_of(name, cfg.val_fraction, cfg.test_fraction))
        for name, label, size in entries
    ]
    return [str(label) for label in labels], images, skipped


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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

    wanted: dict[str, set[int]] = {}
    for image in plan.images:
        name, _, index = image.relative_path.rpartition("#")
        wanted.setdefault(name, set()).add(int(index))
    records: dict[str, bytes] = {}
    spec = _source_feature_spec(cfg)
    for name, indices in wanted.items():
        for index, record in iterate_source_records(cfg, cfg.source_dir / name):
            if index in indices and isinstance(record, bytes):
                parsed = tf.io.parse_single_example(record, spec)
                records[f"{name}#{index}"] = parsed[cfg.tfrecord_image_key].numpy()
    for image in plan.images:
        data = records.get(image.relative_path)
        yield image, data, None if data is not None else "record no longer readable"


def write_shard(plan: ShardPlan, cfg: DataConfig, class_names: list[str],
                shard_path: Path) -> dict:
    """Write one shard atomically and its sidecar; skip and record unreadable images.

    Returns:
        The sidecar's content: examples, bytes, sha256, class counts and skipped files.
    """
    import tensorflow as tf

    tmp_path = shard_path.with_name(f".{shard_path.name}.{os.getpid()}.tmp")
    options = tf.io.TFRecordOptions(compression_type=_writer_compression(cfg))
    skipped, class_counts, examples, reencoded = [], {}, 0, 0
    try:
        with tf.io.TFRecordWriter(str(tmp_path), options) as writer:
            for image, data, error in _shard_sources(plan, cfg):
                try:
                    if data is None:
                        raise ValueError(error)
                    encoded, height, width, converted = validate_image(data)
                except ValueError as problem:
                    skipped.append({"path": image.relative_path, "reason": str(problem)[:300]})
                    continue
                reencoded += converted
                class_name = class_names[image.label]
                writer.write(
                    _example_bytes(encoded, image.label, class_name, height, width,
                                   image.relative_path)
                )
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


def writer_processes(cfg: DataConfig, pending: list[ShardPlan]) -> int:
    """How many processes write the pending shards (see `DataConfig.write_workers`)."""
    if cfg.write_workers:
        return max(1, min(cfg.write_workers, len(pending)))
    pending_bytes = sum(image.size_bytes for plan in pending for image in plan.images)
    if pending_bytes < _PARALLEL_WRITE_BYTES or len(pending) < 2:
        return 1
    return max(1, min(os.cpu_count() or 1, len(pending)))


def write_pending_shards(
    pending: list[ShardPlan], cfg: DataConfig, class_names: list[str], out_dir: Path,
    scale: ScaleConfig | None = None,
) -> tuple[list[dict], str]:
    """Write shards here, in parallel processes when that pays, or as Dask tasks.

    Local processes are spawned (no forked TensorFlow); Dask is used when `scale` asks for it.

    Returns:
        The shards' sidecars in the order of `pending`, and who wrote them.
    """
    paths = [out_dir / plan.file_name.replace(".tfrecord", shard_suffix(cfg)) for plan in pending]
    if scale is not None and scale.task_runner == "dask" and pending:
        return _write_on_dask(pending, cfg, class_names, paths, scale)
    workers = writer_processes(cfg, pending)
    if workers == 1:
        return [write_shard(plan, cfg, class_names, path)
                for plan, path in zip(pending, paths, strict=True)], "1 process"
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(write_shard, plan, cfg, class_names, path)
                   for plan, path in zip(pending, paths, strict=True)]
        return [future.result() for future in futures], f"{workers} processes"


def _write_on_dask(pending: list[ShardPlan], cfg: DataConfig, class_names: list[str],
                   paths: list[Path], scale: ScaleConfig) -> tuple[list[dict], str]:
    with _dask_client(scale) as client:
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        # pure=False: a shard is written for its side effect, never taken from Dask's cache.
        futures = client.map(write_shard, pending, [cfg] * len(pending),
                             [class_names] * len(pending), paths, pure=False)
        metas = client.gather(futures)
        return metas, f"{workers} Dask workers at {client.scheduler.address}"


@contextmanager
def _dask_client(scale: ScaleConfig) -> Iterator:
    """A Dask client of the scheduler at `scale.dask_address`, or of a local cluster."""
    from distributed import Client, LocalCluster

    if scale.dask_address:
        with Client(scale.dask_address) as client:
            yield client
        return
    with LocalCluster(dashboard_address=None,
                      **local_dask_cluster_kwargs(scale.dask_workers)) as cluster, \
            Client(cluster) as client:
        yield client


def dataset_dir_for(cfg: DataConfig, work_dir: Path, images: list[SourceImage]) -> Path:
    """A folder named after the source listing, so the same data maps to the same shards."""
    listing = hashlib.sha256()
    listing.update(
        f"{cfg.source_dir.resolve()}|{cfg.shard_size_mb}|{cfg.compression}".encode()
    )
    for image in images:
        listing.update(f"{image.relative_path}\t{image.size_bytes}\t{image.split}\n".encode())
    return work_dir / "datasets" / f"{cfg.source_dir.name}-{listing.hexdigest()[:12]}"


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


def preprocessing_cache_key(_context: object, parameters: dict) -> str | None:
    """Prefect cache key of `write_tfrecords`: the source folder's content and the settings.

    Not time: an unchanged folder with unchanged settings hits the cache however old it is.
    """
    cfg: DataConfig = parameters["cfg"]
    if not cfg.source_dir.is_dir():
        return None
    settings = json.dumps([cfg.model_dump(mode="json"), str(Path(parameters["work_dir"]).resolve()),
                           str(cfg.source_dir.resolve())])
    return "write_tfrecords-" + hashlib.sha256(
        f"{settings}|{source_fingerprint(cfg.source_dir)}".encode()
    ).hexdigest()[:32]


def is_intact(dataset: DatasetArtifact) -> bool:
    """The manifest and every shard a (possibly cached) result names are still on disk."""
    files = [file for info in dataset.splits.values() for file in info.files]
    return dataset.manifest_path.is_file() and all(file.is_file() for file in files)


@task(
    name="write_tfrecords",
    tags=["preprocessing"],
    cache_key_fn=preprocessing_cache_key,
    persist_result=True,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_if_transient,
)
def write_tfrecords(
    cfg: DataConfig, work_dir: Path, scale: ScaleConfig | None = None
) -> DatasetArtifact:
    """Shard an image folder into TFRecord files with a manifest; resume where a run stopped.

    Prefect caches the result under the source folder's fingerprint and the settings, so an
    unchanged input is not read again; shards already on disk are reused in any case. Where
    the shards are written does not change them, so `scale` is not part of the cache key.

    Args:
        cfg: Source folder, split fractions and shard size.
        work_dir: Root folder; shards go to ``<work_dir>/datasets/<source>-<hash>/``.
        scale: Dask (`task_runner: dask`) or here (None or sequential).

    Returns:
        The shard files per split, the class names and the counts.

    Raises:
        NoUsableDataError: The folder has no usable image, or the training split is empty.
    """
    logger = step_logger()
    if cfg.source_format == "tfrecord":
        class_names, images, listing_skipped = list_tfrecord_source(cfg)
    else:
        class_names = list_class_folders(cfg.source_dir)
        images, listing_skipped = list_source_images(cfg, class_names)
        used = sorted({image.label for image in images})
        empty = [name for label, name in enumerate(class_names) if label not in used]
        if empty and images:
            logger.warning("class folders with no usable file names, left out: %s", empty)
            class_names = [class_names[label] for label in used]
            images, listing_skipped = list_source_images(cfg, class_names)
            listing_skipped += [{"path": f"{name}/", "reason": "empty class folder"}
                                for name in empty]
    if not images and not listing_skipped:
        raise NoUsableDataError(f"data.source_dir {cfg.source_dir} has class folders but no files")
    if len(class_names) < 2:
        raise NoUsableDataError(
            f"data.source_dir {cfg.source_dir} has {len(class_names)} class with images "
            f"({', '.join(class_names) or 'none'}); a classifier needs at least two classes, "
            "one sub-folder of images per class"
        )
    out_dir = dataset_dir_for(cfg, work_dir, images)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".*.tmp"):
        # Left by a writer that was killed (one writer per dataset folder at a time).
        stale.unlink(missing_ok=True)
    plans = plan_shards(images, int(cfg.shard_size_mb * 1024 * 1024))
    metas: dict[str, dict] = {}
    pending = []
    for plan in plans:
        shard_path = out_dir / plan.file_name.replace(".tfrecord", shard_suffix(cfg))
        meta = load_complete_shard(plan, shard_path)
        if meta is None:
            pending.append(plan)
        else:
            metas[plan.file_name] = meta
    written, writers = write_pending_shards(pending, cfg, class_names, out_dir, scale)
    metas.update({plan.file_name: meta for plan, meta in zip(pending, written, strict=True)})
    logger.info("%d shards in %s (%d reused from an earlier run, %d written by %s)",
                len(plans), out_dir, len(plans) - len(pending), len(pending), writers)
    return _finish_manifest(cfg, out_dir, class_names,
                            [metas[plan.file_name] for plan in plans], listing_skipped)


def _finish_manifest(cfg: DataConfig, out_dir: Path, class_names: list[str],
                     shard_metas: list[dict], listing_skipped: list[dict]) -> DatasetArtifact:
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
            f"no usable image in {cfg.source_dir}: all {len(quarantine)} files were skipped "
            f"(first: {quarantine[0] if quarantine else 'none'})"
        )
    if splits["train"].examples == 0:
        raise NoUsableDataError(f"the training split of {cfg.source_dir} is empty")
    manifest = {
        "version": _MANIFEST_VERSION,
        "source_dir": str(cfg.source_dir.resolve()),
        "class_names": class_names,
        "source_format": cfg.source_format,
        "compression": cfg.compression,
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
        compression=_writer_compression(cfg),
    )
