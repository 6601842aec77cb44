from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from tasks.measure_data_layout import measure_data_layout
from tasks.measure_input_pipeline import measure_input_pipeline
from tasks.sweep_batch_size import sweep_batch_size
from tasks.write_tfrecords import write_tfrecords
from tests.conftest import write_digit_folder
from tfopt.artifacts import SweepPoint
from tfopt.config import DataConfig, InputConfig
from tfopt.data.pipeline import ReaderOptions, naive_dataset, plan_cache, tuned_dataset
from tfopt.models.config import ModelConfig
from tfopt.models.step_timing import choose_batch_size


def _multiset(dataset) -> Counter:
    seen = Counter()
    for images, labels in dataset:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            seen[(int(label), hashlib.sha256(image.tobytes()).hexdigest())] += 1
    return seen


def _all_files(dataset):
    return [f for info in dataset.splits.values() for f in info.files]


@pytest.mark.parametrize("image_size", [16, 12])
def test_tuned_and_naive_readers_yield_the_same_examples(tiny_dataset, image_size):
    files = _all_files(tiny_dataset)
    naive = _multiset(naive_dataset(files, image_size, 7))
    for options in (ReaderOptions(), ReaderOptions(cache="decoded"),
                    ReaderOptions(cache="encoded"), ReaderOptions(interleave_cycle=5)):
        tuned = tuned_dataset(files, image_size, 7, options=options)
        assert _multiset(tuned) == naive, options
    assert sum(naive.values()) == sum(info.examples for info in tiny_dataset.splits.values())


def test_training_reader_shuffles_crops_and_keeps_every_label(tiny_dataset):
    files = tiny_dataset.splits["train"].files
    options = ReaderOptions(random_crop_min_area=0.5, cache="encoded")
    dataset = tuned_dataset(files, 16, 8, training=True, seed=1, options=options)
    labels, shapes = Counter(), set()
    for images, batch_labels in dataset:
        shapes.add(tuple(images.shape[1:]))
        assert float(images.numpy().min()) >= 0.0 and float(images.numpy().max()) <= 1.0
        labels.update(batch_labels.numpy().tolist())
    assert shapes == {(16, 16, 3)}
    expected = Counter()
    for _, batch_labels in naive_dataset(files, 16, 8):
        expected.update(batch_labels.numpy().tolist())
    assert labels == expected


def test_cache_rule_prefers_decoded_then_encoded_then_nothing():
    assert plan_cache(1000, 32, 10**6, budget_mb=100, random_crops=False).mode == "decoded"
    decision = plan_cache(10**6, 224, 10**9, budget_mb=2000, random_crops=False)
    assert decision.mode == "encoded" and "MB" in decision.reason
    assert plan_cache(1000, 32, 10**6, budget_mb=100, random_crops=True).mode == "encoded"
    assert plan_cache(10**6, 224, 10**11, budget_mb=2000, random_crops=False).mode == "none"


def test_batch_size_rule_picks_the_smallest_near_the_best():
    curve = [SweepPoint(batch_size=b, examples_per_s=t, step_ms=b / t * 1000, peak_extra_mb=m)
             for b, t, m in [(16, 500, 10), (32, 900, 20), (64, 1000, 40), (128, 1020, 80),
                             (256, 1030, 9000)]]
    chosen, rule = choose_batch_size(curve, tolerance=0.05, memory_budget_mb=8192)
    assert chosen == 64 and "5%" in rule
    assert choose_batch_size(curve, tolerance=0.0, memory_budget_mb=8192)[0] == 128
    assert choose_batch_size(curve, tolerance=0.2, memory_budget_mb=8192)[0] == 32
    assert choose_batch_size(curve, tolerance=0.05, memory_budget_mb=5)[0] == 16
    capped, rule = choose_batch_size(curve, tolerance=0.05, memory_budget_mb=8192,
                                     max_batch_size=40)
    assert capped == 32 and "<= 40" in rule


def test_measure_input_pipeline_reports_three_rates(tiny_dataset):
    result = measure_input_pipeline.fn(tiny_dataset, 8, InputConfig(measure_passes=1))
    assert result.naive_examples_per_s > 0 and result.tuned_examples_per_s > 0
    assert result.cached_examples_per_s > 0 and result.chosen_batch_size == 8
    assert result.cache_mode == "decoded" and result.cache_reason


def test_sweep_and_layout_measure_what_they_say(tiny_dataset, tmp_path):
    cfg = InputConfig(sweep_batch_sizes=[4, 8], sweep_steps=2, min_steps_per_epoch=1)
    sweep = sweep_batch_size.fn(tiny_dataset, ModelConfig(width=4), cfg, tmp_path)
    assert [p.batch_size for p in sweep.points] == [4, 8]
    quarter = tiny_dataset.splits["train"].examples // 4
    too_few_steps = cfg.model_copy(update={"min_steps_per_epoch": quarter})
    small = sweep_batch_size.fn(tiny_dataset, ModelConfig(width=4), too_few_steps, tmp_path)
    assert [p.batch_size for p in small.points] == [4], "a batch it cannot choose is not timed"
    assert sweep.chosen_batch_size in (4, 8) and sweep.plot_path.stat().st_size > 1000
    layout = measure_data_layout.fn(tiny_dataset, ModelConfig(width=4), 8, 2)
    assert layout.nhwc_examples_per_s > 0 and layout.faster in ("NHWC", "NCHW")
    assert layout.nchw_examples_per_s is not None, "NCHW runs on this CPU build"


def test_gzip_and_parallel_writers_give_the_same_examples(tmp_path, tiny_dataset):
    source = write_digit_folder(tmp_path / "src", classes=3, per_class=12)
    plain = write_tfrecords.fn(DataConfig(source_dir=source, shard_size_mb=0.004), tmp_path / "a")
    parallel = write_tfrecords.fn(
        DataConfig(source_dir=source, shard_size_mb=0.004, write_workers=2), tmp_path / "b"
    )
    manifest = json.loads(plain.manifest_path.read_text())
    assert json.loads(parallel.manifest_path.read_text())["splits"] == manifest["splits"]
    zipped = write_tfrecords.fn(
        DataConfig(source_dir=source, shard_size_mb=0.004, compression="gzip"), tmp_path / "c"
    )
    assert zipped.compression == "GZIP"
    assert all(f.name.endswith(".tfrecord.gz") for f in _all_files(zipped))
    assert _multiset(naive_dataset(_all_files(zipped), 16, 5, "GZIP")) == _multiset(
        naive_dataset(_all_files(plain), 16, 5)
    )


def test_existing_tfrecord_folder_is_accepted_as_a_source(tiny_dataset, tmp_path):
    cfg = DataConfig(source_dir=tiny_dataset.root, source_format="tfrecord", shard_size_mb=1)
    resharded = write_tfrecords.fn(cfg, tmp_path)
    total = sum(info.examples for info in tiny_dataset.splits.values())
    assert sum(info.examples for info in resharded.splits.values()) == total
    assert resharded.class_names == ["0", "1", "2"]
    original = Counter(label for _, label in _multiset(naive_dataset(_all_files(tiny_dataset),
                                                                     16, 8)))
    again = Counter(label for _, label in _multiset(naive_dataset(_all_files(resharded), 16, 8)))
    assert again == original


def test_truncated_source_tfrecord_is_counted_not_fatal(tiny_dataset, tmp_path):
    source = tmp_path / "records"
    source.mkdir()
    shards = _all_files(tiny_dataset)
    for shard in shards:
        (source / shard.name).write_bytes(shard.read_bytes())
    victim = source / shards[0].name
    victim.write_bytes(victim.read_bytes()[:-40])
    cfg = DataConfig(source_dir=source, source_format="tfrecord", shard_size_mb=1)
    resharded = write_tfrecords.fn(cfg, tmp_path / "work")
    total = sum(info.examples for info in tiny_dataset.splits.values())
    assert resharded.skipped_records == 1
    assert sum(info.examples for info in resharded.splits.values()) == total - 1
