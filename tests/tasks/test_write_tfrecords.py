from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from pathlib import Path

import pytest
import tensorflow as tf

from tasks.write_tfrecords import write_tfrecords
from tests.conftest import write_digit_folder
from tfopt.config import DataConfig, ScaleConfig
from tfopt.data.shards import plan_shards
from tfopt.data.sources import NoUsableDataError, list_class_folders, list_source, split_of


def _records(files: list[Path]) -> list[dict]:
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/label": tf.io.FixedLenFeature([], tf.int64),
        "image/source": tf.io.FixedLenFeature([], tf.string),
    }
    out = []
    for raw in tf.data.TFRecordDataset([str(f) for f in files]):
        parsed = tf.io.parse_single_example(raw, spec)
        out.append({k: v.numpy() for k, v in parsed.items()})
    return out


def test_round_trip_preserves_every_example_and_label(tiny_dataset, tiny_data_cfg):
    all_files = [f for info in tiny_dataset.splits.values() for f in info.files]
    records = _records(all_files)
    sources = Counter(r["image/source"].decode() for r in records)
    on_disk = sorted(
        p.relative_to(tiny_data_cfg.source_dir).as_posix()
        for p in tiny_data_cfg.source_dir.rglob("*.jpg")
    )
    assert sorted(sources) == on_disk
    assert set(sources.values()) == {1}, "an example was written twice"
    for record in records:
        source = record["image/source"].decode()
        assert record["image/encoded"] == (tiny_data_cfg.source_dir / source).read_bytes()
        assert tiny_dataset.class_names[record["image/label"]] == source.split("/")[0]


def test_manifest_counts_match_the_shards(tiny_dataset):
    manifest = json.loads(tiny_dataset.manifest_path.read_text())
    for split, info in tiny_dataset.splits.items():
        entry = manifest["splits"][split]
        assert entry["examples"] == info.examples == len(_records(info.files))
        assert sum(s["examples"] for s in entry["shards"]) == info.examples
        assert sum(entry["class_counts"].values()) == info.examples
        for shard in entry["shards"]:
            assert (tiny_dataset.root / shard["file"]).stat().st_size == shard["bytes"]
    assert manifest["skipped_records"] == 0


def test_shards_respect_the_target_size(tiny_dataset, tiny_data_cfg):
    target = tiny_data_cfg.shard_size_mb * 1024 * 1024
    assert tiny_dataset.shards > 3
    largest_image = max(p.stat().st_size for p in tiny_data_cfg.source_dir.rglob("*.jpg"))
    per_record_overhead = 300
    for info in tiny_dataset.splits.values():
        for shard in info.files:
            records = len(_records([shard]))
            assert shard.stat().st_size <= target + largest_image + records * per_record_overhead


def test_split_assignment_is_deterministic_and_uses_fractions():
    paths = [f"c/{i}.jpg" for i in range(4000)]
    splits = Counter(split_of(p, 0.1, 0.2) for p in paths)
    assert abs(splits["test"] / 4000 - 0.2) < 0.03
    assert abs(splits["val"] / 4000 - 0.1) < 0.03


def test_the_selection_split_is_carved_from_training_alone():
    paths = [f"c/{i}.jpg" for i in range(4000)]
    without = {p: split_of(p, 0.1, 0.2) for p in paths}
    carved = {p: split_of(p, 0.1, 0.2, select_fraction=0.05) for p in paths}
    moved = {p for p in paths if without[p] != carved[p]}
    assert {without[p] for p in moved} == {"train"} and {carved[p] for p in moved} == {"select"}
    assert abs(len(moved) / 4000 - 0.05) < 0.02


def test_select_fraction_auto_takes_half_the_validation_share_where_it_is_enough(tmp_path):
    cfg = DataConfig(source_dir=tmp_path)
    assert cfg.select_share(1800) == pytest.approx(cfg.val_share(1800) / 2, abs=1e-4)
    assert cfg.select_share(1800) * 1800 >= 100
    assert cfg.select_share(300) == 0.0, "too few images for a selection split"
    assert DataConfig(source_dir=tmp_path, select_fraction=0).select_share(1800) == 0.0
    with pytest.raises(ValueError, match="select_fraction"):
        DataConfig(source_dir=tmp_path, select_fraction=0.5)


def test_rerun_reuses_complete_shards_and_gives_the_same_manifest(tiny_data_cfg, tmp_path):
    first = write_tfrecords.fn(tiny_data_cfg, tmp_path)
    stamps = {f: f.stat().st_mtime_ns for info in first.splits.values() for f in info.files}
    manifest = first.manifest_path.read_text()
    second = write_tfrecords.fn(tiny_data_cfg, tmp_path)
    assert second.manifest_path.read_text() == manifest
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps, "a complete shard was rewritten"


def test_rerun_rewrites_a_damaged_shard_resume(tiny_data_cfg, tmp_path):
    first = write_tfrecords.fn(tiny_data_cfg, tmp_path)
    victim = first.splits["train"].files[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    manifest = first.manifest_path.read_text()
    second = write_tfrecords.fn(tiny_data_cfg, tmp_path)
    assert second.manifest_path.read_text() == manifest


def test_dask_workers_write_the_sequential_writers_shards_and_resume(
    tiny_data_cfg, tiny_dataset, tmp_path, caplog
):
    from tfopt.scaling import local_cluster

    sequential = tiny_dataset.manifest_path.read_text()
    caplog.set_level(logging.INFO, logger="tfopt")
    with local_cluster(2) as cluster:
        running = ScaleConfig(task_runner="dask", dask_address=cluster.scheduler_address)
        on_dask = write_tfrecords.fn(tiny_data_cfg, tmp_path, running)
    assert on_dask.manifest_path.read_text() == sequential, "same shards, same checksums"
    assert f"written by 2 Dask workers at {cluster.scheduler_address}" in caplog.text
    assert not list(on_dask.root.glob(".*.tmp"))

    victim = on_dask.splits["train"].files[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    caplog.clear()
    local = ScaleConfig(task_runner="dask", dask_workers=2)
    resumed = write_tfrecords.fn(tiny_data_cfg, tmp_path, local)
    assert resumed.manifest_path.read_text() == sequential
    assert f"({on_dask.shards - 1} reused from an earlier run, 1 written by 2 Dask workers" in (
        caplog.text)


def test_corrupt_and_non_image_files_are_skipped_and_counted(tmp_path):
    source = write_digit_folder(tmp_path / "src", classes=2, per_class=10)
    (source / "0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (source / "1" / "notes.txt").write_text("not an image")
    good = (source / "1").glob("*.jpg").__next__()
    (source / "1" / "truncated.jpg").write_bytes(good.read_bytes()[:60])
    cfg = DataConfig(source_dir=source, image_size=16, shard_size_mb=1)
    dataset = write_tfrecords.fn(cfg, tmp_path / "work")
    manifest = json.loads(dataset.manifest_path.read_text())
    assert dataset.skipped_records == 3
    assert sorted(q["path"] for q in manifest["quarantine"]) == [
        "0/broken.jpg", "1/notes.txt", "1/truncated.jpg",
    ]
    assert sum(info.examples for info in dataset.splits.values()) == 20


def test_png_and_rgba_images_are_reencoded_as_jpeg(tmp_path):
    from PIL import Image

    source = write_digit_folder(tmp_path / "src", classes=2, per_class=8)
    Image.new("RGBA", (20, 12), (255, 0, 0, 128)).save(source / "0" / "red.png")
    Image.new("L", (9, 9), 200).save(source / "1" / "gray.png")
    dataset = write_tfrecords.fn(DataConfig(source_dir=source, shard_size_mb=1), tmp_path / "w")
    manifest = json.loads(dataset.manifest_path.read_text())
    assert manifest["reencoded_to_jpeg"] == 2
    files = [f for info in dataset.splits.values() for f in info.files]
    for record in _records(files):
        image = tf.io.decode_jpeg(record["image/encoded"], channels=3)
        assert image.shape[-1] == 3


def test_an_empty_or_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(NoUsableDataError, match="not a folder"):
        list_class_folders(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoUsableDataError, match="no class sub-folders"):
        list_class_folders(tmp_path / "empty")
    (tmp_path / "empty" / "cat").mkdir()
    with pytest.raises(NoUsableDataError, match="no files"):
        write_tfrecords.fn(DataConfig(source_dir=tmp_path / "empty"), tmp_path / "w")


def test_shard_plan_is_fixed_by_the_listing(tiny_data_cfg):
    images = list_source(tiny_data_cfg).images
    first = plan_shards(images, 4096)
    second = plan_shards(list_source(tiny_data_cfg).images, 4096)
    assert [p.digest() for p in first] == [p.digest() for p in second]
    assert sum(len(p.images) for p in first) == len(images)


def test_an_auto_validation_split_is_sized_so_one_image_is_a_quarter_of_the_budget(tmp_path):
    source = write_digit_folder(tmp_path / "digits", classes=10, per_class=100)
    auto = DataConfig(source_dir=source)
    assert auto.val_fraction == "auto" and auto.auto_val_image_points == 0.25
    listing = list_source(auto)
    assert listing.val_fraction == 0.25, "400 images wanted of 1000: the largest share"
    val = sum(image.split == "val" for image in listing.images)
    assert 200 <= val <= 300
    assert "one image is" in auto.val_note(1000), "it says the split cannot resolve the budget"
    assert auto.val_share(10_000) == 0.1 and auto.val_note(10_000) is None, "the smallest share"
    assert auto.val_share(2_000) == 0.2
    fixed = DataConfig(source_dir=source, val_fraction=0.1)
    assert list_source(fixed).val_fraction == 0.1 and fixed.val_note(1000) is None
    moved = {image.relative_path for image in listing.images if image.split == "val"} - {
        image.relative_path for image in list_source(fixed).images if image.split == "val"}
    assert not {image.relative_path for image in list_source(fixed).images
                if image.split == "test"} & moved, "a larger share takes from training only"
    from flows.parameters import PipelineConfig

    two_points = PipelineConfig.model_validate(
        {"data": {"source_dir": str(source)}, "benchmark": {"accuracy_budget_points": 2.0}})
    assert two_points.data.auto_val_image_points == 0.5
    assert two_points.data.val_share(1000) == 0.2


def test_user_folder_with_spaces_and_unicode_names(tmp_path):
    source = write_digit_folder(tmp_path / "my data", classes=2, per_class=8)
    shutil.move(source / "0", source / "zéro chiffre")
    dataset = write_tfrecords.fn(DataConfig(source_dir=source, shard_size_mb=1), tmp_path / "w")
    assert dataset.class_names == ["1", "zéro chiffre"]
    assert sum(info.examples for info in dataset.splits.values()) == 16
