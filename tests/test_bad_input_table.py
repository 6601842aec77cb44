"""`tfopt run` refuses bad input before any work: one line naming the field, exit code 2,
no traceback, nothing written. No server is needed: the checks come before the servers."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from tests.conftest import write_digit_folder

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
SIZE = 16


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A good data folder and the model files the cases break in their own ways."""
    import tf_keras as keras

    root = tmp_path_factory.mktemp("bad-input")
    write_digit_folder(root / "good", classes=3, per_class=12, size=SIZE)

    def classifier(size: int, channels: int, classes: int) -> keras.Model:
        inputs = keras.Input((size, size, channels))
        pooled = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inputs))
        return keras.Model(inputs, keras.layers.Dense(classes)(pooled))

    classifier(SIZE, 3, 3).save(root / "good.keras")
    classifier(24, 3, 3).save(root / "big.keras")
    classifier(SIZE, 3, 5).save(root / "five.keras")
    classifier(SIZE, 5, 3).save(root / "channels.keras")
    labelled = root / "labelled"
    labelled.mkdir()
    classifier(SIZE, 3, 3).save(labelled / "model.keras")
    (labelled / "labels.txt").write_text("cat\ndog\nbird\n")
    inputs = keras.Input((SIZE, SIZE, 3))
    left = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(3, 3)(inputs))
    right = keras.layers.GlobalMaxPooling2D()(keras.layers.Conv2D(3, 3)(inputs))
    keras.Model(inputs, keras.layers.Add(name="add")([left, right])).save(root / "two-heads.keras")
    features = keras.Input((4,), name="features")
    keras.Model(features, keras.layers.Dense(1, name="value")(features)).save(
        root / "regressor.keras")
    keras.Model(features, keras.layers.Dense(1, name="price")(features)).save(
        root / "priced.keras")
    np.savez(root / "no-y.npz", x=np.ones((6, 4), np.float32))
    for name, arrays in {"arrays-good": {"x": (40, 4), "y": (40,)},
                         "arrays-named-otherwise": {"a": (40, 4), "b": (40, 2), "y": (40,)},
                         "arrays-too-wide": {"x": (40, 5), "y": (40,)},
                         "arrays-of-two-lengths": {"x": (40, 4), "y": (39,)},
                         "arrays-without-y": {"x": (40, 4)}}.items():
        (root / name).mkdir()
        np.savez(root / name / "part.npz", **{key: np.random.default_rng(0).normal(
            size=shape).astype(np.float32) for key, shape in arrays.items()})
    import tensorflow as tf

    (root / "features-good").mkdir()
    with tf.io.TFRecordWriter(str(root / "features-good" / "part.tfrecord")) as writer:
        for row in np.random.default_rng(0).normal(size=(40, 5)).astype(np.float32):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "features": tf.train.Feature(float_list=tf.train.FloatList(value=row[:4])),
                "price": tf.train.Feature(float_list=tf.train.FloatList(value=row[4:]))})
            ).SerializeToString())

    class Priced(tf.Module):
        def __init__(self) -> None:
            self.weights = tf.Variable(tf.ones((4, 1)))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
        def __call__(self, features):
            return {"price": tf.matmul(features, self.weights)[:, 0]}

    priced = Priced()
    tf.saved_model.save(priced, str(root / "priced-savedmodel"),
                        signatures={"serving_default": priced.__call__})
    np.savez(root / "short-y.npz", features=np.ones((6, 4), np.float32), y=np.ones(5))
    (root / "text.keras").write_text("I am not a model")
    (root / "empty.h5").write_bytes(b"")
    (root / "text.tflite").write_text("not a flatbuffer")
    (root / "text.onnx").write_text("<html>a saved web page</html>")
    (root / "weights.pt").write_bytes(b"torch")
    (root / "builders.py").write_text(
        "import tf_keras as keras\n"
        "def wrong(size):\n    return None\n"
        "def text(size, classes):\n    return 'a model'\n"
        "def explodes(size, classes):\n    raise RuntimeError('no GPU here')\n")
    return root


def _data(place: Path, name: str, make: Callable[[Path], None]) -> Path:
    folder = place / "data" / name
    if not folder.exists():
        folder.mkdir(parents=True)
        make(folder)
    return folder


def _one_class(folder: Path) -> None:
    write_digit_folder(folder, classes=1, per_class=6, size=SIZE)


def _flat(folder: Path) -> None:
    good = next((folder.parent.parent / "good" / "0").glob("*.jpg"))
    shutil.copy(good, folder / "a.jpg")


def _tiny(folder: Path) -> None:
    write_digit_folder(folder, classes=2, per_class=1, size=SIZE)


def _undecodable(folder: Path) -> None:
    for name in ("cats", "dogs"):
        (folder / name).mkdir()
        for index in range(4):
            (folder / name / f"{index}.jpg").write_bytes(b"\xff\xd8 not really a JPEG")


def _one_bad_class(folder: Path) -> None:
    write_digit_folder(folder, classes=2, per_class=20, size=SIZE)
    (folder / "broken").mkdir()
    for index in range(5):
        (folder / "broken" / f"{index}.png").write_text("text saved as png")


def _dangling(folder: Path) -> None:
    write_digit_folder(folder, classes=2, per_class=20, size=SIZE)
    (folder / "links").mkdir()
    (folder / "links" / "gone.jpg").symlink_to(folder / "nowhere.jpg")


def _loop(folder: Path) -> None:
    write_digit_folder(folder, classes=1, per_class=20, size=SIZE)
    (folder / "loop").mkdir()
    (folder / "loop" / "again").symlink_to(folder / "loop")


def _empty_classes(folder: Path) -> None:
    (folder / "a").mkdir()
    (folder / "b").mkdir()


DATA_CASES = {
    "missing folder": (None, "data.source_dir: {data} does not exist or is not a folder"),
    "a file": ("file", "data.source_dir: {data} does not exist or is not a folder"),
    "one class": (_one_class, "has 1 class with images (0); a classifier needs at least two"),
    "no class folders": (_flat, "has no class sub-folders; expected <label>/<image> files"),
    "class folders, no files": (_empty_classes, "has class folders but no files"),
    "one image per class": (_tiny, "which leave the val and test split empty"),
    "nothing decodable": (_undecodable, "has 8 files and none of them is a decodable image"),
    "one class undecodable": (_one_bad_class, "no file of class broken (5 files) is a readable"),
    "a dangling link as a class": (_dangling, "no file of class links (1 files) is a readable"),
    "a symlink loop": (_loop, "no file of class loop (1 files) is a readable image"),
}


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["run", "--config", str(SMOKE), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(code: int, out: str, err: str, expected: str) -> None:
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2, (code, out, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    assert expected in lines[0], (expected, lines[0])
    assert "Traceback" not in out + err


@pytest.mark.parametrize("case", DATA_CASES)
def test_bad_input_data_folders_are_one_line_refusals(case, place, tmp_path, capsys):
    make, expected = DATA_CASES[case]
    if make is None:
        data = tmp_path / "nothing here"
    elif make == "file":
        data = tmp_path / "data.txt"
        data.write_text("a file, not a folder")
    else:
        data = _data(place, case.replace(" ", "-"), make)
    work = tmp_path / "work"
    code, out, err = _run(["--set", f"data.source_dir={data}", "--set", f"work_dir={work}"],
                          capsys)
    _refused(code, out, err, expected.format(data=data))
    assert not work.exists(), "nothing written"


MODEL_CASES = {
    "missing file": ({"model.source": "file", "model.path": "{place}/gone.keras"},
                     "model.path: {place}/gone.keras does not exist"),
    "unknown suffix": ({"model.source": "file", "model.path": "{place}/weights.pt"},
                       "is not a .keras, .h5, .hdf5, .tflite or .onnx file"),
    "text as .keras": ({"model.source": "file", "model.path": "{place}/text.keras"},
                       "model.path: {place}/text.keras cannot be loaded by tf_keras"),
    "empty .h5": ({"model.source": "file", "model.path": "{place}/empty.h5"},
                  "model.path: {place}/empty.h5 cannot be loaded by tf_keras"),
    "text as .tflite": ({"model.source": "file", "model.path": "{place}/text.tflite",
                         "train.epochs": 0}, "cannot be read as a tflite model"),
    "text as .onnx": ({"model.source": "file", "model.path": "{place}/text.onnx",
                       "train.epochs": 0}, "cannot be read as a onnx model"),
    "tflite to train": ({"model.source": "file", "model.path": "{place}/text.tflite"},
                        "train.epochs: 30 fine-tunes the model, but model.path"),
    "input size": ({"model.source": "file", "model.path": "{place}/big.keras"},
                   "model.path: the model's input is 24x24 but data.image_size is 16"),
    "classes": ({"model.source": "file", "model.path": "{place}/five.keras"},
                "the model has 5 outputs but the data folder has 3 classes (model.head: "
                "replace"),
    "channels": ({"model.source": "file", "model.path": "{place}/channels.keras"},
                 "model.path: the model's input is (None, 16, 16, 5); expected one image tensor"),
    "labels": ({"model.source": "file", "model.path": "{place}/labelled/model.keras"},
               "labels.txt lists other classes than the data folder"),
    "head not followable": ({"model.source": "file", "model.path": "{place}/two-heads.keras",
                             "model.head": "replace"},
                            "add (Add) in model.path takes several inputs"),
    "head on a zoo network": ({"model.head": "replace"},
                              "model.head: replace is for a model you bring"),
    "missing builder file": ({"model.source": "builder", "model.builder": "{place}/no.py:f"},
                             "model.builder: {place}/no.py does not exist"),
    "missing module": ({"model.source": "builder", "model.builder": "no_such_pkg.models:f"},
                       "model.builder: importing no_such_pkg.models failed: "
                       "ModuleNotFoundError"),
    "missing function": ({"model.source": "builder", "model.builder": "{place}/builders.py:f"},
                         "has no function 'f'"),
    "wrong signature": ({"model.source": "builder",
                         "model.builder": "{place}/builders.py:wrong"},
                        "model.builder: {place}/builders.py:wrong raised TypeError"),
    "not a model": ({"model.source": "builder", "model.builder": "{place}/builders.py:text"},
                    "returned a builtins.str, not a Keras model"),
    "builder raises": ({"model.source": "builder",
                        "model.builder": "{place}/builders.py:explodes"},
                       "raised RuntimeError: no GPU here"),
    "missing weights": ({"model.weights": "{place}/none.h5"},
                        "model.weights: {place}/none.h5 does not exist or is not a file"),
    "epochs 0 on a zoo network": ({"train.epochs": 0}, "train.epochs: 0 trains nothing"),
    "mixed precision on a file": ({"model.source": "file", "model.path": "{place}/good.keras",
                                   "train.mixed_precision": "mixed_bfloat16"},
                                  "train.mixed_precision applies to model.source=zoo"),
}


ARRAY_CASES = {
    "a Keras file to train": ("arrays-good", {"model.path": "{place}/good.keras",
                                              "train.epochs": 2},
                              "training on arrays is not built yet"),
    "arrays named otherwise": ("arrays-named-otherwise", {},
                               "takes features [None, 4]; the data's arrays are ['a', 'b']"),
    "examples too wide": ("arrays-too-wide", {},
                          "input features takes [None, 4] but the data's x holds examples of "
                          "shape [5]"),
    "arrays of two lengths": ("arrays-of-two-lengths", {},
                              "part.npz: its arrays differ in length"),
    "an output it lacks": ("arrays-good", {"eval.output": "boxes"},
                           "has no output 'boxes' (its outputs: price)"),
    "a metric without y": ("arrays-without-y", {"eval.metric": "mae"},
                           "eval.metric: mae needs labels or targets: an array y"),
    "a share of an SNR's cap": ("arrays-without-y", {"eval.metric": "snr_db",
                                                     "eval.budget": 0.1,
                                                     "eval.budget_relative": "true"},
                                "eval.budget_relative: a budget on snr_db is the worst figure"),
    "a feature spec the records do not fit": (
        "features-good", {"data.source_format": "tfrecord", "data.label_feature": "price",
                          "data.features": "{{features: {{dtype: float32, shape: [3]}}, "
                                           "price: {{dtype: float32}}}}"},
        "data.features: no record of {place}/features-good fits them (part.tfrecord#0: does "
        "not fit data.features: "),
    "a metric for images": ("", {"eval.metric": "mae"},
                            "eval.metric mae: image data is trained and judged on top-1"),
}


@pytest.mark.parametrize("case", ARRAY_CASES)
def test_bad_input_arrays_and_their_model_are_one_line_refusals(case, place, tmp_path, capsys):
    folder, settings, expected = ARRAY_CASES[case]
    args = ["--set", f"work_dir={tmp_path / 'work'}", "--set", "train.epochs=0",
            "--set", "model.source=file", "--set", f"model.path={place / 'priced-savedmodel'}"]
    if folder:
        args += ["--set", f"data.source_dir={place / folder}", "--set", "data.source_format=npz",
                 "--set", "data.max_examples_per_class=null", "--set", "eval.metric=mae"]
    else:
        args += ["--set", f"data.source_dir={place / 'good'}"]
    for key, value in settings.items():
        args += ["--set", f"{key}={str(value).format(place=place)}"]
    code, out, err = _run(args, capsys)
    _refused(code, out, err, expected.format(place=place))
    assert not (tmp_path / "work").exists(), "nothing written"


@pytest.mark.parametrize("case", MODEL_CASES)
def test_bad_input_models_are_one_line_refusals(case, place, tmp_path, capsys):
    settings, expected = MODEL_CASES[case]
    args = ["--set", f"data.source_dir={place / 'good'}", "--set", f"data.image_size={SIZE}",
            "--set", f"work_dir={tmp_path / 'work'}"]
    for key, value in settings.items():
        args += ["--set", f"{key}={str(value).format(place=place)}"]
    code, out, err = _run(args, capsys)
    _refused(code, out, err, expected.format(place=place))
    assert not (tmp_path / "work").exists(), "nothing written"


NAME_CASES = {
    "a name with a slash": ("name=a/b", "name: String should match pattern"),
    "an experiment that is a path": ("experiment=../x", "experiment: String should match"),
    "an experiment with a slash": ("experiment=team/x", "experiment: String should match"),
    "threads": ("benchmark.threads=0", "benchmark.threads: Input should be greater than"),
    "sparsity": ("compress.prune.target_sparsity=1.5", "compress.prune.target_sparsity: "),
    "tflite precision": ("convert.tflite=[int4]", "convert.tflite.0: Input should be"),
    "openvino precision": ("runtimes.openvino.precisions=[fp64]",
                           "runtimes.openvino.precisions.0: Input should be"),
    "qat layers": ("compress.qat.unsupported_layers=maybe",
                   "compress.qat.unsupported_layers: Input should be 'float' or 'skip'"),
    "head": ("model.head=swap", "model.head: Input should be 'keep' or 'replace'"),
    "head epochs": ("train.head_epochs=-1", "train.head_epochs: Input should be greater"),
    "batch sizes": ("input.sweep_batch_sizes=[0]", "input.sweep_batch_sizes.0: Input should"),
}


@pytest.mark.parametrize("case", NAME_CASES)
def test_bad_input_names_and_bounds_are_one_line_refusals(case, place, tmp_path, capsys):
    setting, expected = NAME_CASES[case]
    code, out, err = _run(["--set", f"data.source_dir={place / 'good'}",
                           "--set", f"work_dir={tmp_path / 'work'}", "--set", setting], capsys)
    _refused(code, out, err, expected)
    assert not (tmp_path / "work").exists(), "nothing written"


def test_bad_input_a_work_folder_under_a_file_is_refused(place, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    code, out, err = _run(["--set", f"data.source_dir={place / 'good'}",
                           "--set", f"work_dir={tmp_path / 'a-file' / 'work'}"], capsys)
    _refused(code, out, err, f"work_dir: {tmp_path / 'a-file' / 'work'} cannot be made: "
                             f"{tmp_path / 'a-file'} is not a folder")


def test_bad_input_a_full_disk_is_refused_with_the_space_it_needs(place, tmp_path, capsys):
    small = tmp_path / "small-disk"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(small)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip()}")
    try:
        code, out, err = _run(["--set", f"data.source_dir={place / 'good'}",
                               "--set", f"work_dir={small / 'work'}"], capsys)
        _refused(code, out, err, f"work_dir: {small / 'work'} has 3 MB free; this run needs "
                                 "about 2")
        assert list(small.iterdir()) == [], "nothing written"
    finally:
        subprocess.run(["umount", str(small)], check=True)


SCORING_CASES = {
    "a metric without y": (["--inputs", "{place}/no-y.npz", "--set", "eval.metric=mae"],
                           "eval.metric: mae needs labels or targets: an .npz with y"),
    "y of another length": (["--inputs", "{place}/short-y.npz"],
                            "y holds 5 labels or targets for 6 examples"),
    "fidelity alone": (["--inputs", "{place}/no-y.npz", "--set", "eval.metric=fidelity"],
                       "eval.metric: fidelity compares a model with a reference model"),
    "a reference without the output": (["--inputs", "{place}/no-y.npz", "--reference",
                                        "{place}/priced.keras", "--set", "eval.metric=fidelity"],
                                       "reference: {place}/priced.keras has no output 'value'"),
    "a reference that is not there": (["--inputs", "random", "--reference", "{place}/gone.onnx"],
                                      "reference: {place}/gone.onnx does not exist"),
    "an output it lacks": (["--inputs", "{place}/no-y.npz", "--set", "eval.output=boxes"],
                           "eval.output: the model has no output 'boxes'; its outputs: value"),
    "a function it lacks": (["--inputs", "{place}/no-y.npz", "--set",
                             "eval.metric={place}/builders.py:score", "--set",
                             "eval.higher_is_better=true"], "has no function 'score'"),
    "a function without its direction": (["--set", "eval.metric={place}/builders.py:text"],
                                         "eval.higher_is_better: say whether a higher"),
}


@pytest.mark.parametrize("case", SCORING_CASES)
def test_bad_input_what_a_benchmark_is_scored_by_is_a_one_line_refusal(case, place, tmp_path,
                                                                       capsys):
    args, expected = SCORING_CASES[case]
    code = main(["benchmark", "--model", str(place / "regressor.keras"),
                 "--work-dir", str(tmp_path / "work"),
                 *(arg.format(place=place) for arg in args)])
    out = capsys.readouterr()
    _refused(code, out.out, out.err, expected.format(place=place))
    assert not (tmp_path / "work").exists(), "nothing written"
