"""What a killed run leaves (RUNNING runs, the benchmark slot, temporary folders) is cleaned up."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.live import tfopt_process
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def own_services(tmp_path_factory):
    """Servers of this module's own, on PostgreSQL as the session's are.

    On the session's shared servers every other worker's `tfopt run` closes, as it starts,
    what dead processes left (the very leftovers these tests make and then look for), and takes
    turns on the one benchmark slot the second test holds. (On SQLite, under the suite's load,
    the holder's lease was once lost before it was killed: nothing was left to wait for.)
    """
    from tests.live import running_services, state_folder_for_postgres

    with state_folder_for_postgres() as state, running_services(state, db="postgres") as settings:
        yield settings


def test_a_killed_runs_leftovers_are_reconciled(own_services, tmp_path):
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
    with tfopt_process(own_services, args, tmp_path / "run.log",
                       ready=lambda: any((work / "runs").glob("killed-*/report")),
                       timeout_s=300, env={"TMPDIR": str(system_tmp)}) as process:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert list(system_tmp.iterdir()) == [], "temporary files go to the work folder"
    (left,) = (work / "tmp").iterdir()
    assert left.name.startswith(f"tfopt-run-{process.pid}-"), left
    assert any(left.rglob("__autograph_generated_file*.py")), "TensorFlow's went there too"
    assert remove_orphan_temp_dirs(work / "tmp") == [left], "the next run sweeps it"
    client = MlflowClient(own_services.mlflow_url)
    (run,) = client.search_runs([client.get_experiment_by_name("tfopt-smoke").experiment_id],
                                filter_string="attributes.run_name = 'killed-small_cnn'")
    assert run.info.status == "RUNNING", "left behind by the kill"

    time.sleep(0.5)
    orphans = reconcile_orphans(own_services.mlflow_url)
    assert run.info.run_id in {o["run_id"] for o in orphans}
    flow_run_id = run.data.tags["prefect.flow_run_id"]
    with temporary_settings({PREFECT_API_URL: own_services.prefect_api_url}):
        assert mark_crashed([flow_run_id], "its tfopt process was gone") == [flow_run_id]
        with get_client(sync_client=True) as prefect:
            assert prefect.read_flow_run(flow_run_id).state.is_crashed()
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    assert reconcile_orphans(own_services.mlflow_url) == [], "live or closed runs are left alone"


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


_TAKE_THE_SLOT_NEXT = """
import logging, sys, time
from tfopt.orchestration import benchmark_slot

logger = logging.getLogger("tfopt")  # where a wait is logged outside a flow run
logger.setLevel(logging.INFO)
logger.addHandler(logging.StreamHandler(sys.stdout))
started = time.monotonic()
with benchmark_slot("next-variant"):
    print(f"waited {time.monotonic() - started:.1f} s", flush=True)
"""


def test_a_benchmark_killed_holding_the_slot_frees_it_and_the_next_logs_the_wait(
    own_services, tmp_path
):
    import subprocess
    import sys
    import tempfile

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.live import ROOT, service_env
    from tfopt.fileio import remove_orphan_temp_dirs
    from tfopt.orchestration import BENCHMARK_LEASE_S, benchmark_limit, crash_orphan_flow_runs

    ready, said = tmp_path / "holding", tmp_path / "holder.log"
    with said.open("w") as out:
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_THE_SLOT, str(ready)], cwd=ROOT,
            env={**service_env(own_services), "PREFECT_API_URL": own_services.prefect_api_url},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert holder.poll() is None and time.monotonic() < deadline, said.read_text()[-3000:]
        time.sleep(0.5)
    with temporary_settings({PREFECT_API_URL: own_services.prefect_api_url}), \
            get_client(sync_client=True) as prefect:
        limit = prefect.read_global_concurrency_limit_by_name(benchmark_limit())
    assert (limit.limit, limit.active_slots) == (1, 1), (limit, said.read_text()[-3000:])
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    leftovers = list(Path(tempfile.gettempdir()).glob(f"tfopt-bench-{holder.pid}-*"))
    assert leftovers, "a kill leaves the temporary folder behind"

    # In a process of its own, as a benchmark is: in this test worker, Prefect's event-loop
    # thread may still carry the settings of an earlier test's servers.
    taken = subprocess.run(
        [sys.executable, "-c", _TAKE_THE_SLOT_NEXT], cwd=ROOT, capture_output=True, text=True,
        env={**service_env(own_services), "PREFECT_API_URL": own_services.prefect_api_url},
        timeout=BENCHMARK_LEASE_S + 120)
    said_next = taken.stdout + taken.stderr
    assert taken.returncode == 0, said_next[-3000:]
    waited = float(said_next.split("waited ", 1)[1].split(" s", 1)[0])
    assert waited < BENCHMARK_LEASE_S + 45, "the dead holder's lease must run out"
    wait_lines = [line for line in said_next.splitlines() if "waits for" in line]
    assert wait_lines, ("the wait is logged", said_next[-3000:])
    assert "killed-variant of flow run" in wait_lines[0]
    assert f"process {holder.pid}" in wait_lines[0] and "that process is gone" in wait_lines[0]

    with temporary_settings({PREFECT_API_URL: own_services.prefect_api_url}):
        crashed = crash_orphan_flow_runs("its tfopt process was gone")
        assert len(crashed) == 1
        with get_client(sync_client=True) as prefect:
            (flow_run,) = [run for run in prefect.read_flow_runs(limit=200)
                           if run.name == crashed[0]]
            assert flow_run.state.is_crashed()
        assert crash_orphan_flow_runs("again") == []
    remove_orphan_temp_dirs()  # another tfopt process of this machine may have swept it first
    assert not any(path.exists() for path in leftovers)
