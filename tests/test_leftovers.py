"""What a killed run leaves (RUNNING runs, the benchmark slot, temporary folders) is cleaned up."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.live import tfopt_process
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e


def test_a_killed_runs_leftovers_are_reconciled(live_services, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tfopt.fileio import remove_orphan_temp_dirs
    from tfopt.orchestration import mark_crashed
    from tfopt.tracking import reconcile_orphans

    demo, work, system_tmp = tmp_path / "demo", tmp_path / "work", tmp_path / "system-tmp"
    write_demo_images(demo)
    system_tmp.mkdir()
    args = ["run", "--config", "configs/smoke.yaml", "--set", f"data.source_dir={demo}",
            "--set", f"work_dir={work}", "--set", "name=killed",
            "--set", "runtimes.openvino.precisions=[]"]
    with tfopt_process(live_services, args, tmp_path / "run.log",
                       ready=lambda: any((work / "runs").glob("killed-*/report")),
                       timeout_s=300, env={"TMPDIR": str(system_tmp)}) as process:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert list(system_tmp.iterdir()) == [], "temporary files go to the work folder"
    (left,) = (work / "tmp").iterdir()
    assert left.name.startswith(f"tfopt-run-{process.pid}-"), left
    assert any(left.rglob("__autograph_generated_file*.py")), "TensorFlow's went there too"
    assert remove_orphan_temp_dirs(work / "tmp") == [left], "the next run sweeps it"
    client = MlflowClient(live_services.mlflow_url)
    (run,) = client.search_runs([client.get_experiment_by_name("tfopt-smoke").experiment_id],
                                filter_string="attributes.run_name = 'killed-small_cnn'")
    assert run.info.status == "RUNNING", "left behind by the kill"

    time.sleep(0.5)
    orphans = reconcile_orphans(live_services.mlflow_url)
    assert run.info.run_id in {o["run_id"] for o in orphans}
    flow_run_id = run.data.tags["prefect.flow_run_id"]
    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        assert mark_crashed([flow_run_id], "its tfopt process was gone") == [flow_run_id]
        with get_client(sync_client=True) as prefect:
            assert prefect.read_flow_run(flow_run_id).state.is_crashed()
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    assert reconcile_orphans(live_services.mlflow_url) == [], "live or closed runs are left alone"


_HOLD_THE_SLOT = """
import sys, time
from pathlib import Path
from prefect import flow
from tfopt.fileio import process_temp_dir
from tfopt.orchestration import benchmark_slot, claim_flow_run

@flow(name="holds-the-benchmark-slot")
def hold():
    claim_flow_run()
    with benchmark_slot("killed-variant"), process_temp_dir("bench"):
        Path(sys.argv[1]).touch()
        time.sleep(600)

hold()
"""


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_benchmark_killed_holding_the_slot_frees_it_and_the_next_logs_the_wait(
    live_services, tmp_path
):
    import subprocess
    import sys
    import tempfile

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.live import ROOT, service_env
    from tfopt.fileio import remove_orphan_temp_dirs
    from tfopt.orchestration import BENCHMARK_LEASE_S, benchmark_slot, crash_orphan_flow_runs

    ready = tmp_path / "holding"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_SLOT, str(ready)], cwd=ROOT,
        env={**service_env(live_services), "PREFECT_API_URL": live_services.prefect_api_url},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the holder never held"
        time.sleep(0.5)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    leftovers = list(Path(tempfile.gettempdir()).glob(f"tfopt-bench-{holder.pid}-*"))
    assert leftovers, "a kill leaves the temporary folder behind"

    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        logged, logger = _Lines(), logging.getLogger("tfopt")
        logger.addHandler(logged)
        logger.setLevel(logging.INFO)
        started = time.monotonic()
        try:
            with benchmark_slot("next-variant"):
                waited = time.monotonic() - started
        finally:
            logger.removeHandler(logged)
        assert waited < BENCHMARK_LEASE_S + 45, "the dead holder's lease must run out"
        wait_lines = [line for line in logged.lines if "waits for" in line]
        assert wait_lines, "the wait is logged"
        assert "killed-variant of flow run" in wait_lines[0]
        assert f"process {holder.pid}" in wait_lines[0] and "that process is gone" in wait_lines[0]

        crashed = crash_orphan_flow_runs("its tfopt process was gone")
        assert len(crashed) == 1
        with get_client(sync_client=True) as prefect:
            (flow_run,) = [run for run in prefect.read_flow_runs(limit=200)
                           if run.name == crashed[0]]
            assert flow_run.state.is_crashed()
        assert crash_orphan_flow_runs("again") == []
    remove_orphan_temp_dirs()  # another tfopt process of this machine may have swept it first
    assert not any(path.exists() for path in leftovers)
