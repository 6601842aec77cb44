"""Shared fixtures: tiny real image folders and TFRecord data sets written to temporary folders."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Prefect configures logging when first imported (dictConfig), closing the handlers already
# there: absl's, made when TensorFlow was imported, writes to the sys.stderr of that moment,
# pytest's capture file, and closing it broke every later test of a file run alone that
# imports TensorFlow before Prefect (tests/test_bad_input_table.py). Prefect goes first.
import prefect.main  # noqa: F401
import pytest
from sklearn.datasets import load_digits

import tfopt  # noqa: F401  (environment before TensorFlow)
from tfopt.config import DataConfig
from tfopt.demo_data import digit_to_jpeg
from tfopt.services import ServiceSettings

# Tests write their builders to temporary folders: this test machine allows code from there
# (tests/tasks/test_model_sources.py checks a folder it does not allow is refused).
os.environ.setdefault("TFOPT_CODE_DIRS", tempfile.gettempdir())

DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each test file took in a CI log (``--durations=0``, summed by file)."""


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Longest test files first, so the workers' last files are short ones.

    Files go to test workers whole and in this order (``--dist loadfile
    --no-loadscope-reorder``); by default xdist puts the files with most tests first, which
    left the one-test pipelines (the outages, the failing variant: 3-4 minutes each) to start
    last while the other workers idled. A file missing from `DURATIONS` goes last; the order
    within a file is kept.
    """
    import json

    seconds = json.loads(DURATIONS.read_text())
    position = {item: index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-seconds.get(item.nodeid.split("::")[0], 0), position[item]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collecting imported, as `tfopt.supervision.supervised` does before a run.

    A test worker's garbage collector then does not walk TensorFlow's, Prefect's and MLflow's
    modules at every full pass (collections were 14% of the workers' CPU in a CI run).
    """
    import gc

    gc.collect()
    gc.freeze()


def write_digit_folder(root: Path, classes: int = 3, per_class: int = 20, size: int = 16) -> Path:
    """Write `per_class` real digit JPEGs for each of the first `classes` digits."""
    digits = load_digits()
    for label in range(classes):
        class_dir = root / str(label)
        class_dir.mkdir(parents=True, exist_ok=True)
        indices = np.flatnonzero(digits.target == label)[:per_class]
        for index in indices:
            (class_dir / f"digit_{index:04d}.jpg").write_bytes(
                digit_to_jpeg(digits.images[index], size)
            )
    return root


@pytest.fixture(scope="session")
def digit_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digit_folder(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="session")
def tiny_data_cfg(digit_folder: Path) -> DataConfig:
    return DataConfig(source_dir=digit_folder, image_size=16, val_fraction=0.15,
                      test_fraction=0.25, shard_size_mb=0.004)


@pytest.fixture(scope="session")
def tiny_dataset(tiny_data_cfg: DataConfig, tmp_path_factory: pytest.TempPathFactory):
    from tasks.write_tfrecords import write_tfrecords

    return write_tfrecords.fn(tiny_data_cfg, tmp_path_factory.mktemp("work"))


@pytest.fixture(scope="session")
def test_images(tiny_dataset) -> np.ndarray:
    """The tiny data set's test split, decoded (what the benchmark feeds every variant)."""
    from tfopt.data.pipeline import load_split_arrays

    images, _ = load_split_arrays(tiny_dataset.splits["test"].files, tiny_dataset.image_size)
    return images


@pytest.fixture(scope="session")
def tiny_data(tiny_dataset):
    """The tiny data set as training steps take it (batch 16, seed 0, default input settings)."""
    from tests.steps import training_data

    return training_data(tiny_dataset)


@pytest.fixture(scope="session")
def tiny_baseline(tiny_data, tmp_path_factory: pytest.TempPathFactory):
    from tasks.train_model import train_model
    from tfopt.config import TrainConfig
    from tfopt.models.config import ModelConfig

    return train_model.fn(
        tiny_data.model_copy(update={"seed": 42}), ModelConfig(width=8),
        TrainConfig(epochs=10, batch_size=16), tmp_path_factory.mktemp("models"),
    )


@pytest.fixture(scope="session")
def tiny_savedmodel(tiny_baseline, tmp_path_factory: pytest.TempPathFactory):
    from tasks.export_savedmodel import export_savedmodel

    return export_savedmodel.fn(tiny_baseline, tmp_path_factory.mktemp("savedmodel"))


@pytest.fixture(scope="session")
def live_services() -> Iterator[ServiceSettings]:
    """Real Prefect and MLflow server processes on free ports, state in a temporary folder.

    They keep their state in a real PostgreSQL server, as a team sharing them would; the
    default SQLite stores are what `tests/test_outages.py` starts.
    """
    from tests.live import running_services, state_folder_for_postgres

    with state_folder_for_postgres() as state, running_services(state, db="postgres") as settings:
        yield settings


@pytest.fixture(scope="session")
def served_deployments(
    live_services: ServiceSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceSettings]:
    """`tfopt serve` running against `live_services` until the session ends."""
    from tests.live import tfopt_process

    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with tfopt_process(live_services, ["serve"], log,
                       ready=lambda: "being served" in log.read_text()):
        yield live_services


@pytest.fixture()
def prefect_client(live_services: ServiceSettings):
    """A synchronous Prefect client talking to `live_services`' server."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}), \
            get_client(sync_client=True) as client:
        yield client
