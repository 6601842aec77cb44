"""Baseline training with MultiWorkerMirroredStrategy on two local worker processes."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from tasks.train_model import train_model
from tasks.write_tfrecords import write_tfrecords
from tests.conftest import write_digit_folder
from tests.steps import training_data
from tfopt.config import DataConfig, TrainConfig
from tfopt.models.config import ModelConfig
from tfopt.models.multi_worker import SPEC_NAME, WorkerFailedError
from tfopt.models.training import HISTORY_NAME, read_history

EPOCHS = 12
RESUMED_EPOCHS = 8
"""Killed after its third epoch, the first attempt still has five to go."""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Four digits, 60 images each: ~60 test images, enough for an accuracy band to mean much."""
    folder = write_digit_folder(tmp_path_factory.mktemp("digits"), classes=4, per_class=60)
    cfg = DataConfig(source_dir=folder, image_size=16, val_fraction=0.15, test_fraction=0.25,
                     shard_size_mb=0.02)
    return training_data(write_tfrecords.fn(cfg, tmp_path_factory.mktemp("work")), seed=42)


def _train(data, out, checkpoints=None, epochs=EPOCHS, distribute="multi_worker"):
    return train_model.fn(
        data, ModelConfig(width=8),
        TrainConfig(epochs=epochs, batch_size=16, distribute=distribute, workers=2,
                    stop="fixed"), out,
        checkpoints)


@pytest.mark.slow  # two trainings of 12 epochs, one of them on two worker processes
def test_two_workers_learn_as_well_as_one(digits, tmp_path):
    alone = _train(digits, tmp_path / "alone", distribute="none")
    trained = _train(digits, tmp_path / "model", tmp_path / "checkpoints")
    assert trained.params["distribute"] == "multi_worker (2 workers)"
    one, two = alone.metrics["test_accuracy"], trained.metrics["test_accuracy"]
    assert two >= 0.85 and abs(two - one) <= 0.1, (one, two)
    assert len(trained.history["loss"]) == EPOCHS
    logs = [(tmp_path / "checkpoints" / f"worker-{i}.log").read_text() for i in (0, 1)]
    assert "worker 0 of 2 (chief): 2 replicas in sync" in logs[0], logs[0][-2000:]
    assert "worker 1 of 2: 2 replicas in sync" in logs[1], logs[1][-2000:]


def _workers_of(spec_dir) -> list[psutil.Process]:
    spec = str(spec_dir / SPEC_NAME)
    return [p for p in psutil.process_iter(["cmdline"]) if spec in (p.info["cmdline"] or [])]


@pytest.mark.slow  # two multi-worker trainings, the first killed
def test_a_killed_multi_worker_training_resumes_from_its_last_epoch(digits, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    failure: list[BaseException] = []

    def first_attempt() -> None:
        try:
            _train(digits, tmp_path / "first", checkpoints, epochs=RESUMED_EPOCHS)
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=first_attempt)
    thread.start()
    history = checkpoints / HISTORY_NAME
    deadline = time.monotonic() + 300
    while not (history.is_file() and len(read_history(history).get("loss", [])) >= 3):
        assert thread.is_alive() and time.monotonic() < deadline, failure
        time.sleep(0.2)
    for worker in _workers_of(checkpoints):
        worker.kill()
    thread.join(timeout=120)
    assert failure and isinstance(failure[0], WorkerFailedError), failure
    assert "exited with code -9" in str(failure[0])
    logged_before = len(history.read_text().splitlines()) - 1

    resumed = _train(digits, tmp_path / "second", checkpoints, epochs=RESUMED_EPOCHS)
    curves = read_history(history)
    assert len(curves["loss"]) == RESUMED_EPOCHS == len(resumed.history["loss"])
    rows = len(history.read_text().splitlines()) - 1
    assert rows < logged_before + RESUMED_EPOCHS, "the second attempt started over"
    assert not _workers_of(checkpoints)


@pytest.mark.parametrize("workers", [1, 65])
def test_a_worker_count_out_of_range_is_refused(workers):
    with pytest.raises(ValueError, match="workers"):
        TrainConfig(distribute="multi_worker", workers=workers)
