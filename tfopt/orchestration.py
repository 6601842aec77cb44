"""Prefect features tfopt relies on: the benchmark concurrency limit, retries, progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from uuid import UUID

from prefect import Task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import TaskRun
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import ObjectAlreadyExists
from prefect.states import State

from tfopt.logs import step_logger

BENCHMARK_LIMIT = "tfopt-benchmark"
"""Global concurrency limit (1 slot) held while a variant is measured, across all flow runs."""


class TransientError(RuntimeError):
    """A failure worth one more try: a killed process, a network or file-system hiccup."""


def mark_crashed(flow_run_ids: list[str], reason: str) -> list[str]:
    """Set these flow runs Crashed if Prefect still thinks they run; return those changed."""
    from prefect.states import Crashed

    changed = []
    with get_client(sync_client=True) as client:
        for flow_run_id in filter(None, flow_run_ids):
            flow_run = client.read_flow_run(UUID(flow_run_id))
            if flow_run.state is not None and not flow_run.state.is_final():
                client.set_flow_run_state(UUID(flow_run_id), Crashed(message=reason), force=True)
                changed.append(flow_run_id)
    return changed


def ensure_benchmark_limit() -> None:
    """Create the benchmark limit with one slot unless it exists (a user may have raised it)."""
    with get_client(sync_client=True) as client, suppress(ObjectAlreadyExists):
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=BENCHMARK_LIMIT, limit=1)
        )


@contextmanager
def benchmark_slot() -> Iterator[None]:
    """Hold the machine's benchmark slot: two measurements never overlap on one Prefect server."""
    ensure_benchmark_limit()
    with concurrency(BENCHMARK_LIMIT, occupy=1, strict=True):
        yield


def retry_if_transient(_task: Task, _run: TaskRun, state: State) -> bool:
    """Prefect retry condition: retry on `TransientError` and OS-level errors only.

    A deterministic failure (a bad model, a tolerance exceeded) fails at once instead of
    repeating the same work.
    """
    try:
        state.result()
    except (TransientError, OSError):
        return True
    except BaseException:
        return False
    return False


class StepProgress:
    """A Prefect progress artifact for a long step; silent outside a Prefect run (tests, scripts).

    Args:
        key: Artifact key (lowercase letters, digits, dashes).
        description: What the percentage counts.
    """

    def __init__(self, key: str, description: str) -> None:
        self._description = description
        self._artifact_id: UUID | None = None
        if TaskRunContext.get() or FlowRunContext.get():
            from prefect.artifacts import create_progress_artifact

            self._call(lambda: create_progress_artifact(0.0, key=key, description=description))

    def update(self, done: int, total: int) -> None:
        """Report `done` of `total` units finished."""
        if self._artifact_id is None or total <= 0:
            return
        from prefect.artifacts import update_progress_artifact

        artifact_id = self._artifact_id
        self._call(lambda: update_progress_artifact(
            artifact_id, 100.0 * min(done, total) / total,
            description=f"{self._description}: {done}/{total}"))

    def _call(self, request: Callable[[], UUID]) -> None:
        """Make an artifact request; a failure stops the reporting, never the step."""
        try:
            self._artifact_id = request()
        except Exception as error:  # progress is optional, the step is not
            step_logger().warning("progress reporting stopped: %s", error)
            self._artifact_id = None
