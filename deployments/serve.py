"""Serve or register the deployments of `deployments/prefect.yaml`, the one place they are defined.

`serve_deployments` runs them from this process (`prefect.serve`): the Prefect UI triggers them
and their schedules fire with no work pool or worker. `deploy_to_work_pool` registers them to
their process work pool, for workers on this or other machines. Both validate each
deployment's parameters against its flow's pydantic model and register the complete
configuration (the yaml holds only what differs from the defaults), which `prefect deploy`
would register as written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

PROJECT_DIR = Path(__file__).resolve().parent.parent
PREFECT_YAML = PROJECT_DIR / "deployments" / "prefect.yaml"


class ScheduleSpec(BaseModel):
    """One schedule of a deployment (cron only: what tfopt's yaml uses)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cron: str
    timezone: str = "UTC"
    active: bool = True


class WorkPoolSpec(BaseModel):
    """The work pool a registered deployment is sent to."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str


class DeploymentSpec(BaseModel):
    """One entry of the yaml's `deployments` list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    entrypoint: str
    description: str
    tags: list[str] = Field(default_factory=list)
    parameters: dict[str, Any] = Field(default_factory=dict)
    schedules: list[ScheduleSpec] = Field(default_factory=list)
    concurrency_limit: int | None = None
    work_pool: WorkPoolSpec


def load_deployment_specs(path: Path = PREFECT_YAML) -> list[DeploymentSpec]:
    """The deployments of a prefect.yaml, validated."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [DeploymentSpec.model_validate(entry) for entry in raw["deployments"]]


def work_pool_names(specs: list[DeploymentSpec]) -> list[str]:
    """The work pools the deployments name, each once."""
    return sorted({spec.work_pool.name for spec in specs})


def complete_parameters(flow: Any, parameters: dict[str, Any]) -> dict[str, Any]:
    """Validate each parameter against the flow's pydantic model and fill in every default.

    The yaml holds only what differs from the defaults; the registered deployment holds the
    whole configuration, so the Prefect UI's form shows every value a run will use.

    Raises:
        pydantic.ValidationError: A value the flow would refuse (caught before registering).
    """
    from typing import get_type_hints

    hints = get_type_hints(flow.fn)
    completed = {}
    for name, value in parameters.items():
        annotation = hints[name]
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            value = annotation.model_validate(value).model_dump(mode="json")
        completed[name] = value
    return completed


def build_runner_deployments(specs: list[DeploymentSpec], source: str | None = None) -> list[Any]:
    """Prefect `RunnerDeployment`s, one per spec.

    Args:
        specs: The deployments to build.
        source: Where a worker gets the flow code (for work pools): a folder, set as its working
            directory, or a git URL it clones. None: load each flow from its file here (for
            serving from this process).
    """
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint
    from prefect.schedules import Cron

    deployments = []
    for spec in specs:
        flow = (Flow.from_source(source, spec.entrypoint) if source
                else load_flow_from_entrypoint(str(PROJECT_DIR / spec.entrypoint)))
        deployments.append(flow.to_deployment(
            name=spec.name,
            description=spec.description,
            tags=spec.tags,
            parameters=complete_parameters(flow, spec.parameters),
            schedules=[Cron(s.cron, timezone=s.timezone, active=s.active)
                       for s in spec.schedules],
            concurrency_limit=spec.concurrency_limit,
        ))
    return deployments


class DeploymentConflictError(RuntimeError):
    """A deployment to serve is already registered to a work pool under the same name."""


def refuse_work_pool_twins(deployments: list[Any]) -> None:
    """Refuse to serve a deployment that `tfopt deploy` registered to a work pool.

    Serving it would re-register it without the pull step while it keeps its work pool, and
    its runs would crash looking for flow code ("No such file or directory: '.../None'").

    Raises:
        DeploymentConflictError: Naming each such deployment and how to remove it.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    twins = []
    with get_client(sync_client=True) as client:
        for deployment in deployments:
            full_name = f"{deployment.flow_name}/{deployment.name}"
            try:
                existing = client.read_deployment_by_name(full_name)
            except ObjectNotFound:
                continue
            if existing.work_pool_name:
                twins.append(f"{full_name} (work pool {existing.work_pool_name})")
    if twins:
        raise DeploymentConflictError(
            "already registered to a work pool by `tfopt deploy`: " + ", ".join(twins)
            + ". Run them with `tfopt worker`, or remove them first (`prefect deployment "
            "delete <flow>/<name>`) to serve them from this process instead."
        )


def serve_deployments(path: Path = PREFECT_YAML, limit: int | None = None) -> None:
    """Serve every deployment of the yaml from this process until interrupted.

    Args:
        path: The prefect.yaml to read.
        limit: Flow runs executed at the same time (None: Prefect's default).

    Raises:
        DeploymentConflictError: One of them is registered to a work pool already.
    """
    from prefect import serve

    os.chdir(PROJECT_DIR)
    deployments = build_runner_deployments(load_deployment_specs(path))
    refuse_work_pool_twins(deployments)
    serve(*deployments, limit=limit)


def ensure_work_pools(names: list[str]) -> list[str]:
    """Create the named process work pools that do not exist yet; return the created ones."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    created = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process"))
                created.append(name)
    return created


def deploy_to_work_pool(path: Path = PREFECT_YAML, source: str | None = None) -> list[str]:
    """Register every deployment of the yaml to its work pool (created if missing).

    Args:
        path: The prefect.yaml to read.
        source: Where workers get the code: this checkout (None) or a git URL.

    Returns:
        One line per deployment: its name, work pool and id.
    """
    specs = load_deployment_specs(path)
    ensure_work_pools(work_pool_names(specs))
    registered = []
    for spec, deployment in zip(specs, build_runner_deployments(specs, source or str(PROJECT_DIR)),
                                strict=True):
        deployment_id = deployment.apply(work_pool_name=spec.work_pool.name)
        registered.append(f"{deployment.flow_name}/{spec.name} -> work pool "
                          f"{spec.work_pool.name} ({deployment_id})")
    return registered
