"""Shared fixtures: tiny real image folders and TFRecord data sets written to temporary folders."""

from __future__ import annotations

import os
import tempfile
import time
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
from tests.shared import made_once, recorded
from tfopt.config import DataConfig
from tfopt.demo_data import digit_to_jpeg
from tfopt.services import ServiceSettings

# Tests write their builders to temporary folders: this test machine allows code from there
# (tests/tasks/test_model_sources.py checks a folder it does not allow is refused).
os.environ.setdefault("TFOPT_CODE_DIRS", tempfile.gettempdir())

SUITE_LIMIT_S = float(os.environ.get("TFOPT_SUITE_LIMIT_S", "2400"))
"""The whole suite's time (``make test``) past which it fails: well inside CI's 90 minutes, so a
suite that grows is stopped long before a submission is lost to it."""
_STARTED = pytest.StashKey[float]()
_OVER = pytest.StashKey[str]()
SERVICES = "services"
"""The name of the session's servers' record (`tests.shared`)."""
DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each test took in a run of the suite (``python -m tests.durations``)."""
TIMEOUT_SHARE = 1.5
"""A measured test's timeout: this many times its measured seconds, at least `TIMEOUT_FLOOR_S`
(a test without a measurement, or marked with a timeout of its own, keeps that)."""
TIMEOUT_FLOOR_S = 180.0
"""Covers the wait of whichever test is the first to ask for what the session shares (the
servers, the tiny baseline), whatever it measured."""


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Longest test files first, and each measured test's timeout from its measured seconds.

    Files go to test workers whole and in this order (``--dist loadfile
    --no-loadscope-reorder``); by default xdist puts the files with most tests first, which
    left the one-test pipelines to start last while the other workers idled. The files that
    read the shared smoke run go last but the one that makes it (first): a worker that took one
    early would idle until the run is made. A file missing from `DURATIONS` goes before those;
    the order within a file is kept. A test that grows past its timeout fails, with its time:
    make it lighter, do not raise the timeout.
    """
    import json
    from collections import Counter

    seconds = json.loads(DURATIONS.read_text())
    by_file: Counter[str] = Counter()
    for test, took in seconds.items():
        by_file[test.split("::")[0]] += took
    readers = sorted({_file_of(item) for item in items if "smoke_run" in item.fixturenames},
                     key=lambda file: -by_file[file])
    waiting = set(readers[1:])  # the longest makes the shared run; the others wait for it
    position = {item: index for index, item in enumerate(items)}
    items.sort(key=lambda item: (_file_of(item) in waiting, -by_file[_file_of(item)],
                                 position[item]))
    for item in items:
        if item.nodeid in seconds and item.get_closest_marker("timeout") is None:
            timeout = max(TIMEOUT_FLOOR_S, TIMEOUT_SHARE * seconds[item.nodeid])
            item.add_marker(pytest.mark.timeout(round(timeout)))


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collecting imported, as `tfopt.supervision.supervised` does before a run.

    A test worker's garbage collector then does not walk TensorFlow's, Prefect's and MLflow's
    modules at every full pass (collections were 14% of the workers' CPU in a CI run).
    """
    import gc

    gc.collect()
    gc.freeze()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the session's servers, once, and fail a suite that took over `SUITE_LIMIT_S`.

    Both in the process that runs the session, not in a worker.
    """
    if hasattr(session.config, "workerinput"):
        return
    from tests.live import stop_session_services

    services = recorded(session.config._tmp_path_factory.getbasetemp(), SERVICES)
    if services is not None:
        stop_session_services(services)
    took = time.monotonic() - session.config.stash[_STARTED]
    if took > SUITE_LIMIT_S and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.stash[_OVER] = (
            f"the suite took {took:.0f} s, over its {SUITE_LIMIT_S:.0f} s limit "
            "(TFOPT_SUITE_LIMIT_S): make the slowest tests above lighter, or move the checks "
            "that need many full runs to `make test-slow`; do not raise the limit")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Say, after the durations table, that the suite failed for its time."""
    if _OVER in config.stash:
        terminalreporter.write_sep("=", f"FAILED: {config.stash[_OVER]}", red=True, bold=True)


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
    """A small CNN trained on the tiny data set, once for every test worker."""
    from tasks.train_model import train_model
    from tfopt.artifacts import ModelArtifact
    from tfopt.config import TrainConfig
    from tfopt.models.config import ModelConfig

    def train(folder: Path) -> dict:
        return train_model.fn(
            tiny_data.model_copy(update={"seed": 42}), ModelConfig(width=8),
            TrainConfig(epochs=10, batch_size=16), folder,
        ).model_dump(mode="json")

    return ModelArtifact.model_validate(made_once(tmp_path_factory, "tiny-baseline", train))


@pytest.fixture(scope="session")
def tiny_savedmodel(tiny_baseline, tmp_path_factory: pytest.TempPathFactory):
    """`tiny_baseline` exported as a SavedModel, once for every test worker."""
    from tasks.export_savedmodel import export_savedmodel
    from tfopt.artifacts import ModelArtifact

    def export(folder: Path) -> dict:
        return export_savedmodel.fn(tiny_baseline, folder).model_dump(mode="json")

    return ModelArtifact.model_validate(made_once(tmp_path_factory, "tiny-savedmodel", export))


@pytest.fixture(scope="session")
def live_services(tmp_path_factory: pytest.TempPathFactory) -> ServiceSettings:
    """Real PostgreSQL, Prefect and MLflow server processes on free ports, one set per session.

    They keep their state in a real PostgreSQL server, as a team sharing them would; every test
    worker uses the same servers (`tests.shared.made_once`), stopped once when the session ends
    (`pytest_sessionfinish`). Tests that need servers of their own (a stopped server, a held
    benchmark slot) start them with `tests.live.running_services`.
    """
    from tests.live import session_services, start_session_services

    return session_services(made_once(tmp_path_factory, SERVICES, start_session_services))


@pytest.fixture(scope="session")
def smoke_run(live_services: ServiceSettings, tmp_path_factory: pytest.TempPathFactory):
    """The smoke config's run with searches, made once for every read-only assertion on it.

    Returns:
        The servers, the run's summary, its terminal output and its demo data folder.
    """
    import json

    from tests.live import make_smoke_run

    made = made_once(tmp_path_factory, "smoke-run",
                     lambda folder: make_smoke_run(live_services, folder))
    return (live_services, json.loads(Path(made["summary"]).read_text()), made["stdout"],
            Path(made["demo"]))


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
