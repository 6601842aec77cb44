"""Baseline training on several worker processes with MultiWorkerMirroredStrategy.

`train.distribute: multi_worker` makes `train_model` start `train.workers` processes of this
module on this machine (``python -m tfopt.models.multi_worker SPEC``), each with a
``TF_CONFIG`` naming the whole cluster (127.0.0.1 ports) and its own index, as TensorFlow's
multi-worker training expects. Every worker builds the same model, reads its share of every
batch and all-reduces the gradients; worker 0, the chief, writes the history, keeps the best
epoch and saves the trained model into the checkpoint folder, where `train_model` picks it
up. All workers share one `BackupAndRestore` folder, so a killed training resumes from its
last finished epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tfopt.artifacts import TrainingData
from tfopt.config import TrainConfig
from tfopt.fileio import atomic_write_json
from tfopt.models.config import ModelConfig
from tfopt.orchestration import StepProgress
from tfopt.processes import free_port

SPEC_NAME = "multi-worker.json"
_LOOPBACK = "127.0.0.1"
_POLL_SECONDS = 0.5
_LOG_TAIL_CHARS = 3000


class WorkerFailedError(RuntimeError):
    """A worker of a multi-worker training exited with an error; the message holds its log."""


def cluster_spec(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker `index` of a cluster of workers at `addresses`."""
    return json.dumps({"cluster": {"worker": addresses},
                       "task": {"type": "worker", "index": index}})


def train_on_local_workers(
    data: TrainingData, model_cfg: ModelConfig, train_cfg: TrainConfig, checkpoint_dir: Path,
    history: Path,
) -> None:
    """Train the baseline on `train_cfg.workers` local processes until the chief saved it.

    Args:
        data: The shards, batch size (global, split over the workers), seed and input settings.
        model_cfg: Where the model comes from.
        train_cfg: Epochs, learning rate, precision policy, number of workers.
        checkpoint_dir: The shared backup folder; the chief leaves the trained model here.
        history: The chief's per-epoch history file, read to report progress.

    Raises:
        WorkerFailedError: A worker exited with an error (the others are stopped).
    """
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    spec = checkpoint_dir / SPEC_NAME
    atomic_write_json(spec, {
        "data": data.model_dump(mode="json"), "model": model_cfg.model_dump(mode="json"),
        "train": train_cfg.model_dump(mode="json"), "checkpoint_dir": str(checkpoint_dir)})
    addresses = [f"{_LOOPBACK}:{free_port(_LOOPBACK)}" for _ in range(train_cfg.workers)]
    logs = [checkpoint_dir / f"worker-{index}.log" for index in range(train_cfg.workers)]
    workers: list[subprocess.Popen] = []
    try:
        for index, log in enumerate(logs):
            with log.open("ab") as out:
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "tfopt.models.multi_worker", str(spec)],
                    env={**os.environ, "TF_CONFIG": cluster_spec(addresses, index)},
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        _wait_for(workers, logs, history, train_cfg.epochs)
    finally:
        _stop(workers)


def _wait_for(workers: list[subprocess.Popen], logs: list[Path], history: Path,
              epochs: int) -> None:
    """Wait until every worker exits 0; raise on the first that does not."""
    progress = StepProgress("train-baseline", "epochs trained (multi-worker)")
    reported = -1
    while True:
        codes = [worker.poll() for worker in workers]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            index = failed[0]
            tail = logs[index].read_text(errors="replace")[-_LOG_TAIL_CHARS:]
            raise WorkerFailedError(
                f"multi-worker training: worker {index} of {len(workers)} exited with code "
                f"{codes[index]}; its log ({logs[index]}) ends:\n{tail}")
        if all(code == 0 for code in codes):
            return
        done = _epochs_logged(history)
        if done != reported:
            progress.update(done, epochs)
            reported = done
        time.sleep(_POLL_SECONDS)


def _epochs_logged(history: Path) -> int:
    from tfopt.models.training import read_history

    if not history.is_file():
        return 0
    curves = read_history(history)
    return max((len(values) for values in curves.values()), default=0)


def _stop(workers: list[subprocess.Popen]) -> None:
    """Stop the workers still running: SIGTERM, then SIGKILL after 10 s."""
    running = [worker for worker in workers if worker.poll() is None]
    for worker in running:
        worker.send_signal(signal.SIGTERM)
    for worker in running:
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def main(argv: list[str] | None = None) -> int:
    """One worker: join the cluster ``TF_CONFIG`` names, train, and (the chief) save."""
    (spec_path,) = argv if argv is not None else sys.argv[1:]
    import tensorflow as tf

    # The strategy must exist before any other TensorFlow operation runs in this process.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    from tfopt.models.baseline_fit import TRAINED_NAME, keep_trained, train_in_scope
    from tfopt.models.keras_io import save_keras_model

    spec = json.loads(Path(spec_path).read_text())
    resolver = strategy.cluster_resolver
    chief = resolver.task_id == 0
    print(f"worker {resolver.task_id} of {len(resolver.cluster_spec().as_dict()['worker'])}"
          f"{' (chief)' if chief else ''}: {strategy.num_replicas_in_sync} replicas in sync",
          flush=True)
    checkpoint_dir = Path(spec["checkpoint_dir"])
    trained = train_in_scope(
        TrainingData.model_validate(spec["data"]), ModelConfig.model_validate(spec["model"]),
        TrainConfig.model_validate(spec["train"]), strategy, checkpoint_dir, chief=chief)
    if chief:
        keep_trained(trained, checkpoint_dir)
    else:
        # Saving reads the mirrored variables with collective ops, so the chief's save only
        # finishes if every worker saves too; the other workers' copies are thrown away.
        with tempfile.TemporaryDirectory() as scratch:
            save_keras_model(trained[0], Path(scratch) / TRAINED_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
