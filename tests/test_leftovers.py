"""A run killed with its process is closed by the next `tfopt run`, in MLflow and Prefect."""

from __future__ import annotations

import os
import signal
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.live import tfopt_process
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e


def test_a_killed_runs_leftovers_are_reconciled(live_services, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tfopt.orchestration import mark_crashed
    from tfopt.tracking import reconcile_orphans

    demo, work = tmp_path / "demo", tmp_path / "work"
    write_demo_images(demo)
    args = ["run", "--config", "configs/smoke.yaml", "--set", f"data.source_dir={demo}",
            "--set", f"work_dir={work}", "--set", "name=killed"]
    with tfopt_process(live_services, args, tmp_path / "run.log",
                       ready=lambda: any((work / "runs").glob("killed-*/report")),
                       timeout_s=300) as process:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
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
