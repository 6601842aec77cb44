"""Killed runs resume: preprocessing and training, each killed with SIGKILL mid-way."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from tests.conftest import write_digit_folder
from tests.steps import training_data
from tfopt.config import DataConfig, TrainConfig
from tfopt.models.baseline_fit import BEST_NAME
from tfopt.models.config import ModelConfig
from tfopt.models.training import HISTORY_NAME, KeepBestWeights, read_history
from tfopt.processes import terminate_group

ROOT = Path(__file__).resolve().parents[2]


def _spawn(script: str, *args: str, capture: bool = False) -> subprocess.Popen:
    """Run `script` in a fresh interpreter, its own process group (`_kill` ends all of it);
    with `capture`, its output and logs as text."""
    if capture:
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the whole job at once, as a lost machine or a cancelled CI job does.

    Killing only the script left its native step's worker (a child of the fork server) running
    until the fork server noticed its client gone: in ci17 it finished the training it was to
    leave half done. Returns once every process of the group is gone, so nothing writes after.
    """
    terminate_group(process.pid, timeout_s=30, first=signal.SIGKILL)
    process.wait()


def _wait_for(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError("condition not reached")


@pytest.mark.parametrize("kill_after_shards", [1, 4])
def test_preprocessing_killed_mid_way_resumes_to_the_same_manifest_fault(tmp_path,
                                                                       kill_after_shards):
    source = write_digit_folder(tmp_path / "src", classes=3, per_class=40, size=48)
    cfg = DataConfig(source_dir=source, shard_size_mb=0.01)
    reference = write_tfrecords.fn(cfg, tmp_path / "clean")
    work = tmp_path / "killed"
    script = f"""
        import tfopt
        from pathlib import Path
        from tasks.write_tfrecords import write_tfrecords
        from tfopt.config import DataConfig
        write_tfrecords.fn(DataConfig(source_dir=Path({str(source)!r}), shard_size_mb=0.01),
                           Path({str(work)!r}))
    """
    process = _spawn(script)
    sidecars = lambda: list(work.glob("datasets/*/*.tfrecord.json"))  # noqa: E731
    _wait_for(lambda: len(sidecars()) >= kill_after_shards or process.poll() is not None)
    _kill(process)
    for shard in work.glob("datasets/*/*.tfrecord"):
        meta = shard.with_name(shard.name + ".json")
        assert meta.exists(), f"{shard.name} visible under its final name without its sidecar"
    resumed = write_tfrecords.fn(cfg, work)
    assert json.loads(resumed.manifest_path.read_text()) == json.loads(
        reference.manifest_path.read_text()
    )
    assert not list(work.glob("datasets/*/.*.tmp")), "a temporary shard was left behind"


def test_training_killed_mid_way_resumes_from_its_last_epoch(tiny_dataset, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    dataset_json = tmp_path / "dataset.json"
    dataset_json.write_text(tiny_dataset.model_dump_json())
    epochs = 12
    script = f"""
        import tfopt
        from pathlib import Path
        from tasks.train_model import train_model
        from tfopt.artifacts import DatasetArtifact, TrainingData
        from tfopt.config import InputConfig, TrainConfig
        from tfopt.models.config import ModelConfig
        dataset = DatasetArtifact.model_validate_json(Path({str(dataset_json)!r}).read_text())
        data = TrainingData(dataset=dataset, batch_size=8, seed=42, input=InputConfig())
        train_model.fn(data, ModelConfig(width=4),
                       TrainConfig(epochs={epochs}, batch_size=8, stop="fixed"),
                       Path({str(tmp_path / "models")!r}),
                       checkpoint_dir=Path({str(checkpoint)!r}))
    """
    process = _spawn(script)
    history = checkpoint / HISTORY_NAME

    def epochs_done() -> int:
        return max(0, len(history.read_text().splitlines()) - 1) if history.exists() else 0

    _wait_for(lambda: epochs_done() >= 3 or process.poll() is not None, timeout_s=300)
    _kill(process)
    done_before = epochs_done()
    assert 3 <= done_before < epochs, "the kill should land mid-training"
    first_rows = history.read_text().splitlines()[: done_before + 1]
    model = train_model.fn(training_data(tiny_dataset, batch_size=8, seed=42),
                           ModelConfig(width=4),
                           TrainConfig(epochs=epochs, batch_size=8, stop="fixed"),
                           tmp_path / "models", checkpoint_dir=checkpoint)
    rows = history.read_text().splitlines()
    assert rows[: done_before + 1] == first_rows, "finished epochs were redone"
    assert len(rows) == epochs + 1, "every epoch exactly once"
    assert len(model.history["loss"]) == epochs
    assert read_history(history)["loss"] == model.history["loss"]
    assert not (checkpoint / BEST_NAME).exists(), "the best epoch's file outlived its training"
    assert 1 <= model.params["kept_epoch"] <= epochs


def test_the_best_epoch_is_kept_across_a_resume_and_ties_go_to_the_later_one(tmp_path):
    import numpy as np
    import tf_keras as keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    weights_at = {epoch: [np.full_like(w, epoch) for w in model.get_weights()]
                  for epoch in range(5)}
    kept = tmp_path / BEST_NAME

    def epochs(callback: KeepBestWeights, accuracies: dict[int, float]) -> None:
        callback.set_model(model)
        callback.on_train_begin()
        for epoch, accuracy in accuracies.items():
            model.set_weights(weights_at[epoch])
            callback.on_epoch_end(epoch, {"val_accuracy": accuracy})

    epochs(KeepBestWeights(path=kept), {0: 0.5, 1: 0.9})
    assert kept.is_file()  # the process dies here; a new one resumes at epoch 2
    other_worker = KeepBestWeights(path=kept, writes=False)
    epochs(other_worker, {2: 0.95})
    other_worker.on_train_end()
    assert other_worker.best_epoch == 2 and kept.is_file(), "only the chief writes the file"
    other_worker = KeepBestWeights(path=kept, writes=False)
    other_worker.set_model(model)
    other_worker.on_train_begin()
    assert (other_worker.best_epoch, other_worker.best_accuracy) == (1, 0.9), (
        "every worker resumes from the same best epoch")
    resumed = KeepBestWeights(path=kept)
    epochs(resumed, {2: 0.7, 3: 0.8})
    resumed.on_train_end()
    assert resumed.best_epoch == 1 and model.get_weights()[0][0, 0] == 1.0
    assert not kept.exists()

    tie = KeepBestWeights(from_epoch=1)
    epochs(tie, {0: 0.95, 1: 0.9, 2: 0.9, 3: 0.6})
    tie.on_train_end()
    assert tie.best_epoch == 2, "epoch 0 is before from_epoch; the tie goes to the later epoch"
    assert model.get_weights()[0][0, 0] == 2.0


def test_two_runs_training_one_baseline_at_once_both_complete(tiny_dataset, tmp_path):
    """The second waits for the first's lock, then reuses its baseline: one clean history."""
    checkpoint = tmp_path / "checkpoint"
    dataset_json = tmp_path / "dataset.json"
    dataset_json.write_text(tiny_dataset.model_dump_json())
    script = f"""
        import logging, sys, tfopt
        from pathlib import Path
        from tasks.train_model import train_model
        logging.getLogger("tfopt").addHandler(logging.StreamHandler(sys.stdout))
        logging.getLogger("tfopt").setLevel(logging.INFO)
        from tfopt.artifacts import DatasetArtifact, TrainingData
        from tfopt.config import InputConfig, TrainConfig
        from tfopt.models.config import ModelConfig
        dataset = DatasetArtifact.model_validate_json(Path({str(dataset_json)!r}).read_text())
        data = TrainingData(dataset=dataset, batch_size=8, seed=42, input=InputConfig())
        model = train_model.fn(data, ModelConfig(width=4),
                               TrainConfig(epochs=4, batch_size=8, stop="fixed"),
                               Path(sys.argv[1]), checkpoint_dir=Path({str(checkpoint)!r}))
        print("ACCURACY", model.metrics["test_accuracy"])
    """
    runs = [_spawn(script, str(tmp_path / f"models-{index}"), capture=True) for index in (1, 2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    accuracies = {line for out in outputs for line in out.splitlines() if "ACCURACY" in line}
    assert len(accuracies) == 1, "both runs hold the same baseline"
    assert sum("reusing the baseline" in out for out in outputs) == 1, outputs
    rows = (checkpoint / HISTORY_NAME).read_text().splitlines()
    assert len(rows) == 4 + 1 and rows[0].startswith("epoch"), rows


def test_a_torn_or_repeated_history_line_is_ignored(tmp_path):
    history = tmp_path / HISTORY_NAME
    history.write_text("epoch,accuracy,loss\n0,0.5,1.0\nepoch,accuracy,loss\n1,0.6,0.9\n"
                       "1,0.7,0.8\n2,0.\n")
    assert read_history(history) == {"accuracy": [0.5, 0.7], "loss": [1.0, 0.8]}
