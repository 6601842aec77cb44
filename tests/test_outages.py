"""MLflow stopped mid-run: a clear error within the retry bound; the rerun reuses the model."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.live import ROOT, running_services, service_env, tfopt_command
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e
RETRY_SECONDS = 10


def test_mlflow_stopped_mid_run_is_a_clear_error_and_the_rerun_reuses_the_model(tmp_path):
    demo, work = tmp_path / "demo", tmp_path / "work"
    write_demo_images(demo)
    command = tfopt_command([
        "run", "--config", "configs/smoke.yaml", "--set", f"data.source_dir={demo}",
        "--set", f"work_dir={work}", "--set", "name=outage", "--set", "convert.xla=[]",
        "--set", "convert.tflite=[fp32]", "--set", "compress.prune.enabled=false",
        "--set", "compress.distill.enabled=false", "--set", "compress.qat.enabled=false"])
    with running_services(tmp_path / "state") as settings:
        env = {**service_env(settings), "TFOPT_SERVICE_RETRY_SECONDS": str(RETRY_SECONDS)}
        log = tmp_path / "first.log"
        with log.open("w") as out:
            first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        while not list(work.glob("checkpoints/*/trained.json")):
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        mlflow_pid = int((Path(settings.state_dir) / "run" / "mlflow.pid").read_text())
        os.killpg(mlflow_pid, signal.SIGKILL)
        stopped = time.monotonic()
        first.wait(timeout=RETRY_SECONDS + 120)
        took = time.monotonic() - stopped
        output = log.read_text()
        assert first.returncode == 2, output[-3000:]
        assert f"MLflow at {settings.mlflow_url} did not answer for {RETRY_SECONDS} s" in output
        assert "tfopt up" in output and took < RETRY_SECONDS + 90, took

        from tfopt.services import start_services

        start_services(settings, timeout_s=240)
        rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=900)
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
        assert "reusing the baseline" in rerun.stdout + rerun.stderr
