"""Array sources (`data.source_format: npz`): any model's inputs sharded like images are."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tasks.write_tfrecords import write_tfrecords
from tfopt.config import DataConfig
from tfopt.data.arrays import SOURCE_KEY, ArraySourceError, input_specs, load_split_feeds
from tfopt.data.sources import NoUsableDataError


def _arrays(rows: int, seed: int) -> dict[str, np.ndarray]:
    """Two named inputs of other shapes and dtypes than an image, and float targets."""
    rng = np.random.default_rng(seed)
    return {"features": rng.normal(size=(rows, 5)).astype(np.float32),
            "ids": rng.integers(0, 1000, size=(rows, 3)).astype(np.int32),
            "y": rng.normal(size=rows).astype(np.float32)}


def _config(source: Path) -> DataConfig:
    return DataConfig(source_dir=source, source_format="npz", val_fraction=0.2,
                      select_fraction=0.0, shard_size_mb=0.002)


def _source(tmp_path: Path) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    source = tmp_path / "arrays"
    source.mkdir()
    files = {"part-a.npz": _arrays(120, 1), "more/part-b.npz": _arrays(80, 2)}
    for name, arrays in files.items():
        (source / name).parent.mkdir(exist_ok=True)
        np.savez(source / name, **arrays)
    return source, files


def _by_source(dataset) -> dict[str, dict]:
    """Every sharded example, by its ``<file>#<row>``, its arrays decoded as the manifest says."""
    spec = {name: tf.io.FixedLenFeature([], tf.string) for name in dataset.arrays}
    spec[SOURCE_KEY] = tf.io.FixedLenFeature([], tf.string)
    found: dict[str, dict] = {}
    for info in dataset.splits.values():
        for raw in tf.data.TFRecordDataset([str(path) for path in info.files]):
            parsed = tf.io.parse_single_example(raw, spec)
            name = parsed[SOURCE_KEY].numpy().decode()
            assert name not in found, f"{name} written twice"
            found[name] = {key: np.frombuffer(parsed[key].numpy(), dtype=spec.dtype).reshape(
                spec.shape) for key, spec in dataset.arrays.items()}
    return found


def test_every_example_of_every_file_is_sharded_once_with_its_values(tmp_path):
    source, files = _source(tmp_path)
    dataset = write_tfrecords.fn(_config(source), tmp_path / "work")

    assert dataset.class_names == []
    assert {name: (spec.dtype, spec.shape) for name, spec in dataset.arrays.items()} == {
        "features": ("float32", [5]), "ids": ("int32", [3]), "y": ("float32", [])}
    assert sorted(input_specs(dataset)) == ["features", "ids"]
    found = _by_source(dataset)
    assert len(found) == 200 == sum(info.examples for info in dataset.splits.values())
    for name, arrays in files.items():
        for row in (0, 37, len(arrays["y"]) - 1):
            for key, values in arrays.items():
                np.testing.assert_array_equal(found[f"{name}#{row}"][key], values[row])
    assert dataset.shards > 4, "the shard size was not honoured"
    manifest = json.loads(dataset.manifest_path.read_text())
    assert manifest["arrays"]["ids"] == {"dtype": "int32", "shape": [3]}
    assert manifest["skipped_records"] == 0
    assert 20 <= dataset.examples("test") <= 60 and 20 <= dataset.examples("val") <= 60


def test_a_split_reads_back_as_named_arrays_in_file_order_and_a_rerun_reuses_the_shards(
        tmp_path):
    source, files = _source(tmp_path)
    first = write_tfrecords.fn(_config(source), tmp_path / "work")
    feeds = load_split_feeds(first, "test")

    assert sorted(feeds) == ["features", "ids", "y"]
    assert feeds["features"].dtype == np.float32 and feeds["ids"].dtype == np.int32
    assert len(feeds["y"]) == first.examples("test")
    rows = {tuple(values): index for name, arrays in files.items()
            for index, values in enumerate(arrays["features"].tolist())}
    assert all(tuple(values) in rows for values in feeds["features"].tolist())
    written = {path: path.stat().st_mtime_ns for info in first.splits.values()
               for path in info.files}
    again = write_tfrecords.fn(_config(source), tmp_path / "work")
    assert again.manifest_path.read_text() == first.manifest_path.read_text()
    assert {path: path.stat().st_mtime_ns for path in written} == written


def test_non_finite_examples_and_an_unreadable_file_are_skipped_and_counted(tmp_path):
    source, _ = _source(tmp_path)
    broken = _arrays(30, 3)
    broken["features"][4, 2] = np.nan
    broken["y"][7] = np.inf
    np.savez(source / "broken.npz", **broken)
    (source / "torn.npz").write_bytes((source / "part-a.npz").read_bytes()[:300])

    dataset = write_tfrecords.fn(_config(source), tmp_path / "work")

    manifest = json.loads(dataset.manifest_path.read_text())
    reasons = {item["path"]: item["reason"] for item in manifest["quarantine"]}
    assert dataset.skipped_records == 3 == manifest["skipped_records"]
    assert "non-finite" in reasons["broken.npz#4"] and "features" in reasons["broken.npz#4"]
    assert "y" in reasons["broken.npz#7"]
    assert reasons["torn.npz"].startswith("not a readable .npz")
    assert sum(info.examples for info in dataset.splits.values()) == 200 + 28


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x": np.zeros((4, 2), np.float32), "y": np.zeros(3, np.float32)},
     "differ in length"),
    ({"y": np.zeros(4, np.float32)}, "holds no input array"),
    ({"x": np.array(["a", "b"])}, "numbers or booleans"),
    ({"x": np.float32(1.0)}, "single value"),
])
def test_arrays_no_model_can_take_are_refused_in_one_line(tmp_path, arrays, message):
    source = tmp_path / "arrays"
    source.mkdir()
    np.savez(source / "data.npz", **arrays)
    with pytest.raises(ArraySourceError, match=message) as raised:
        write_tfrecords.fn(_config(source), tmp_path / "work")
    assert "\n" not in str(raised.value) and "data.npz" in str(raised.value)


def test_files_of_different_arrays_or_no_file_at_all_are_refused(tmp_path):
    source, _ = _source(tmp_path)
    np.savez(source / "z-other.npz", features=np.zeros((3, 6), np.float32),
             ids=np.zeros((3, 3), np.int32), y=np.zeros(3, np.float32))
    with pytest.raises(ArraySourceError, match=r"z-other.npz: holds .*features float32\[6\]"):
        write_tfrecords.fn(_config(source), tmp_path / "work")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ArraySourceError, match=r"holds no \.npz files"):
        write_tfrecords.fn(_config(empty), tmp_path / "work")
    only_torn = tmp_path / "torn"
    only_torn.mkdir()
    with zipfile.ZipFile(only_torn / "data.npz", "w") as archive:
        archive.writestr("x.npy", b"not an array")
    with pytest.raises(NoUsableDataError, match=r"no readable \.npz file holds an example"):
        write_tfrecords.fn(_config(only_torn), tmp_path / "work")


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
def test_a_keras_file_is_taken_in_as_a_savedmodel_of_its_own_signature(tmp_path, flavor):
    from tfopt.artifacts import VariantSpec
    from tfopt.models.config import ModelConfig
    from tfopt.models.importing import import_array_model
    from tfopt.models.keras_io import keras_module
    from tfopt.runtimes import load_runner
    from tfopt.runtimes.base import outputs_batched

    source, _ = _source(tmp_path)
    dataset = write_tfrecords.fn(_config(source), tmp_path / "work")
    keras = keras_module(flavor)
    features = keras.Input((5,), name="features")
    ids = keras.Input((3,), dtype="int32", name="ids")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(1000, 2)(ids))
    joined = keras.layers.Concatenate()([features, embedded])
    model = keras.Model([features, ids], [keras.layers.Dense(1, name="price")(joined),
                                          keras.layers.Dense(3, name="parts")(joined)])
    path = tmp_path / ("theirs.keras" if flavor == "keras3" else "theirs.h5")
    model.save(path)

    baseline = import_array_model(ModelConfig(source="file", path=path), dataset,
                                  tmp_path / "models")

    assert baseline.format == "savedmodel" and baseline.params["taken_as_it_is"]
    runner = load_runner(VariantSpec(name="baseline-savedmodel", source="baseline",
                                     format="savedmodel", precision="fp32", path=baseline.path))
    assert sorted(info.name for info in runner.inputs) == ["features", "ids"]
    feeds = load_split_feeds(dataset, "test")
    served = outputs_batched(runner, {name: feeds[name] for name in ("features", "ids")})
    own = model.predict([feeds["features"], feeds["ids"]], verbose=0)
    assert len(served) == 2
    for expected in own:  # each output under its own name, the same values
        match = [name for name, values in served.items() if values.shape == expected.shape]
        assert match and np.allclose(served[match[0]], expected, atol=1e-5), (
            sorted(served), expected.shape)



def test_tfrecords_of_any_features_become_named_arrays_and_records_that_do_not_fit_are_counted(
        tmp_path):
    source = tmp_path / "records"
    source.mkdir()
    rng = np.random.default_rng(5)
    rows = [(rng.normal(size=5).astype(np.float32), rng.integers(0, 1000, size=3),
             float(rng.normal())) for _ in range(150)]
    rows[7][0][1] = np.nan  # skipped as an .npz row with a NaN is

    def example(features, ids, price, drop_price=False):
        feature = {"features": tf.train.Feature(float_list=tf.train.FloatList(value=features)),
                   "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}
        if not drop_price:
            feature["price"] = tf.train.Feature(float_list=tf.train.FloatList(value=[price]))
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    for name, part in (("a.tfrecord", rows[:100]), ("b.tfrecord", rows[100:])):
        with tf.io.TFRecordWriter(str(source / name)) as writer:
            for index, (features, ids, price) in enumerate(part):
                writer.write(example(features, ids, price, drop_price=name == "b.tfrecord"
                                     and index == 3))
    cfg = DataConfig(source_dir=source, source_format="tfrecord", val_fraction=0.2,
                     select_fraction=0.0, shard_size_mb=0.002, label_feature="price",
                     features={"features": {"dtype": "float32", "shape": [5]},
                               "ids": {"dtype": "int32", "shape": [3]},
                               "price": {"dtype": "float32"}})

    dataset = write_tfrecords.fn(cfg, tmp_path / "work")

    assert {name: (spec.dtype, spec.shape) for name, spec in dataset.arrays.items()} == {
        "features": ("float32", [5]), "ids": ("int32", [3]), "y": ("float32", [])}
    found = _by_source(dataset)
    assert len(found) == 148, "one record without its price, one with a NaN, skipped"
    np.testing.assert_array_equal(found["a.tfrecord#12"]["ids"], rows[12][1].astype(np.int32))
    assert found["b.tfrecord#0"]["y"] == np.float32(rows[100][2])
    reasons = {item["path"]: item["reason"] for item in
               json.loads(dataset.manifest_path.read_text())["quarantine"]}
    assert "does not fit data.features" in reasons["b.tfrecord#3"]
    assert "non-finite values (NaN or infinity) in features" in reasons["a.tfrecord#7"]
