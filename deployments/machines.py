"""Measure a pipeline run's variants on other machines: one deployment per work pool.

`tfopt worker --pool <pool>` registers the `benchmark_model` flow to its pool (deployment
``benchmark_model/on-<pool>``) with its machine's settings as the deployment's parameters;
`tfopt benchmark --run <MLflow run id> --work-pool <pool>` starts one flow run per ok variant of
that run there, each carrying those settings as ``config.machine`` (see `tfopt.machines`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.serve import PROJECT_DIR, ensure_work_pools
from tfopt.machines import BENCHMARK_FLOW, MachineBenchmarkError, VariantRun

_ENTRYPOINT = "flows/benchmark_model.py:benchmark_model"


def deploy_to_pool(pool: str, source: str | None = None,
                   machine: dict[str, Any] | None = None) -> str:
    """Register `benchmark_model` to a process work pool (created if missing).

    The deployment's default parameters hold the machine's settings (``config.machine``): a
    worker registers them when it starts (`machine`); registering again without them keeps
    the ones it has.

    Args:
        pool: The work pool whose workers sit on the machine to measure on.
        source: Where the worker gets the flow code: this checkout (None) or a git URL.
        machine: The machine's ``benchmark.*`` settings (None: keep the registered ones).

    Returns:
        The deployment's full name, ``benchmark_model/on-<pool>``.
    """
    from prefect import Flow

    ensure_work_pools([pool])
    name = f"{BENCHMARK_FLOW}/on-{pool}"
    if machine is None:
        machine = machine_of(name)
    flow = Flow.from_source(source or str(PROJECT_DIR), _ENTRYPOINT)
    deployment = flow.to_deployment(
        name=f"on-{pool}", tags=["tfopt", "benchmark", "machine"],
        parameters={"config": {"machine": machine}},
        description=f"Benchmark pipeline variants on the machine of work pool {pool}.")
    deployment.apply(work_pool_name=pool)
    return name


def machine_of(deployment: str) -> dict[str, Any]:
    """The machine settings a pool's deployment holds (empty if none, or no deployment)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            parameters = client.read_deployment_by_name(deployment).parameters
        except ObjectNotFound:
            return {}
    return dict((parameters.get("config") or {}).get("machine") or {})


@dataclass(frozen=True)
class Submitted:
    """One flow run started on a pool for one variant."""

    pool: str
    variant: str
    flow_run_id: str


def submit(pipeline_run: str, variants: list[VariantRun], pools: list[str],
           work_dir: Path | None = None, source: str | None = None) -> list[Submitted]:
    """Start one `benchmark_model` flow run per variant on every pool (not waiting for them)."""
    from prefect.deployments import run_deployment

    submitted = []
    for pool in pools:
        deployment = deploy_to_pool(pool, source)
        machine = machine_of(deployment)
        for variant in variants:
            config: dict[str, Any] = {"name": variant.name[:64],
                                      "model": f"runs:/{variant.run_id}/model",
                                      "pipeline_run": pipeline_run, "machine": machine}
            if work_dir is not None:
                config["work_dir"] = str(work_dir)
            flow_run = run_deployment(deployment, parameters={"config": config}, timeout=0,
                                      tags=["machine-benchmark"])
            submitted.append(Submitted(pool, variant.name, str(flow_run.id)))
    return submitted


def wait_for(submitted: list[Submitted], timeout_s: float) -> dict[str, str]:
    """Wait until every submitted flow run is final; its state name per flow run id.

    Raises:
        MachineBenchmarkError: Some are not final after `timeout_s` (is a worker running on
            each pool?).
    """
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    final: set[str] = set()
    with get_client(sync_client=True) as client:
        while True:
            for item in submitted:
                if item.flow_run_id not in final:
                    state = client.read_flow_run(item.flow_run_id).state
                    states[item.flow_run_id] = state.name if state else "Pending"
                    if state is not None and state.is_final():
                        final.add(item.flow_run_id)
            waiting = [item for item in submitted if item.flow_run_id not in final]
            if not waiting:
                return states
            if time.monotonic() > deadline:
                pools = sorted({item.pool for item in waiting})
                raise MachineBenchmarkError(
                    f"{len(waiting)} flow runs on {', '.join(pools)} did not finish within "
                    f"{timeout_s:.0f} s; is a worker running on each pool "
                    "(`tfopt worker --pool <pool>`)?")
            time.sleep(2.0)


