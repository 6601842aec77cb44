"""Prefect features tfopt relies on: the benchmark concurrency limit, retries, progress."""

from __future__ import annotations

import contextvars
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import TypeVar
from uuid import UUID

from prefect import Task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import ConcurrencyLeaseHolder, TaskRun
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.futures import PrefectFuture
from prefect.states import State

from tfopt.logs import step_logger
from tfopt.native_events import report_progress
from tfopt.processes import left_by_dead_process, process_identity

_T = TypeVar("_T")
BENCHMARK_LEASE_S = 60
"""The slot's lease (Prefect's shortest): renewed while its holder lives, so a killed holder's
slot is free again within a minute and Prefect's lease check (every 15 s by default)."""
_WAIT_LOG_INTERVAL_S = 30


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


def claim_flow_run() -> None:
    """Tag the current flow run with this machine and process (``tfopt.host:``/``tfopt.pid:``).

    A flow run whose process is killed, or loses the Prefect server, stays RUNNING; these
    tags let the next `tfopt run` or `tfopt up` on this machine find it and mark it Crashed.
    """
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    identity = (f"{key}:{value}" for key, value in process_identity().items())
    tags = {*context.flow_run.tags, *identity}
    with get_client(sync_client=True) as client:
        client.update_flow_run(context.flow_run.id, tags=sorted(tags))


def crash_orphan_flow_runs(reason: str) -> list[str]:
    """Mark Crashed the running flow runs a gone tfopt process of this machine left behind.

    Returns:
        The names of the flow runs marked.
    """
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(
            any_=[StateType.RUNNING, StateType.PENDING])),
        tags=FlowRunFilterTags(all_=[f"tfopt.host:{process_identity()['tfopt.host']}"]))
    marked = []
    with get_client(sync_client=True) as client:
        for flow_run in client.read_flow_runs(flow_run_filter=unfinished, limit=200):
            tags = dict(tag.split(":", 1) for tag in flow_run.tags if ":" in tag)
            if left_by_dead_process(tags):
                client.set_flow_run_state(flow_run.id, Crashed(message=reason), force=True)
                marked.append(flow_run.name)
    return marked


def _host_key() -> str:
    return re.sub(r"[^a-z0-9]+", "-", socket.gethostname().lower()).strip("-") or "host"


def benchmark_limit() -> str:
    """This machine's benchmark slot: the global concurrency limit ``tfopt-benchmark-<host>``.

    One per machine, because it guards the machine's cores: flow runs on one machine take
    turns, workers on different machines (`tfopt benchmark --run`) measure at once.
    """
    return f"tfopt-benchmark-{_host_key()}"


def _holder_variable() -> str:
    """The Prefect variable naming who took this machine's slot last, for the waiting log."""
    return f"tfopt_benchmark_holder_{_host_key().replace('-', '_')}"


def ensure_benchmark_limit() -> None:
    """Create the benchmark limit with one slot unless it exists (a user may have raised it).

    Read first: Prefect's server on SQLite answers a duplicate with a 409 but logs it as an
    error with two tracebacks, once per measurement of every run.
    """
    with get_client(sync_client=True) as client:
        with suppress(ObjectNotFound):
            client.read_global_concurrency_limit_by_name(benchmark_limit())
            return
        with suppress(ObjectAlreadyExists):
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=benchmark_limit(), limit=1)
            )


@contextmanager
def benchmark_slot(what: str) -> Iterator[None]:
    """Hold this machine's benchmark slot: two measurements never overlap on one machine.

    The slot is a Prefect lease held by this flow run: a process killed while holding it loses
    it when the lease runs out. While the slot is taken, the wait is logged every 30 s with
    who holds it.

    Args:
        what: What is measured while the slot is held (a variant's name), for the waiting log.
    """
    ensure_benchmark_limit()
    with _logging_the_wait(what) as acquired, concurrency(
        benchmark_limit(), occupy=1, strict=True, lease_duration=BENCHMARK_LEASE_S,
        holder=_lease_holder(),
    ):
        acquired.set()
        _record_holder(what)
        yield


@contextmanager
def _logging_the_wait(what: str) -> Iterator[threading.Event]:
    """Log who holds the slot after 1 s of waiting and every 30 s after, until the event is set."""
    logger, acquired = step_logger(), threading.Event()
    started = time.monotonic()

    def report() -> None:
        delay = 1.0
        while not acquired.wait(delay):
            logger.info("%s waits for the benchmark slot (%.0f s so far), held by %s", what,
                        time.monotonic() - started, describe_benchmark_holder())
            delay = _WAIT_LOG_INTERVAL_S

    reporter = threading.Thread(target=contextvars.copy_context().run, args=(report,),
                                name="tfopt-benchmark-wait", daemon=True)
    reporter.start()
    try:
        yield acquired
    finally:
        acquired.set()
        reporter.join()


def _lease_holder() -> ConcurrencyLeaseHolder | None:
    """This flow run as the holder Prefect records on the lease."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None
    return ConcurrencyLeaseHolder(type="flow_run", id=context.flow_run.id)


def _record_holder(what: str) -> None:
    """Name this process as the benchmark slot's holder; a failure only costs the waiting log."""
    from prefect.variables import Variable

    context = FlowRunContext.get()
    holder = {"what": what, **process_identity(),
              "flow_run": context.flow_run.name if context and context.flow_run else "",
              "since": datetime.now(UTC).isoformat(timespec="seconds")}
    try:
        Variable.set(_holder_variable(), holder, overwrite=True)
    except Exception as error:  # the slot is held either way
        step_logger().warning("could not record the benchmark slot's holder: %s", error)


def describe_benchmark_holder() -> str:
    """Who took the benchmark slot last, and whether that process still lives on this machine."""
    from prefect.variables import Variable

    try:
        holder = Variable.get(_holder_variable(), default=None)
    except Exception as error:  # only the log line depends on it
        return f"a holder tfopt could not read ({type(error).__name__})"
    if not isinstance(holder, dict):
        return "a process tfopt did not record"
    who = (f"{holder.get('what')} of flow run {holder.get('flow_run') or '?'} "
           f"(process {holder.get('tfopt.pid')} on {holder.get('tfopt.host')}, "
           f"since {holder.get('since')})")
    if left_by_dead_process(holder):
        who += (f"; that process is gone, its lease ends within {BENCHMARK_LEASE_S} s of its "
                "last renewal")
    return who


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

    In a native step's child process (`tfopt.native`) the updates go to the step's own artifact,
    which the parent moves while it waits.

    Args:
        key: Artifact key (lowercase letters, digits, dashes).
        description: What the percentage counts.
    """

    def __init__(self, key: str, description: str) -> None:
        self._key, self._description = key, description
        self._artifact_id: UUID | None = None
        if TaskRunContext.get() or FlowRunContext.get():
            from prefect.artifacts import create_progress_artifact

            self._call(lambda: create_progress_artifact(0.0, key=key, description=description))

    def update(self, done: int, total: int) -> None:
        """Report `done` of `total` units finished (from a native step's child: to its parent)."""
        if total <= 0:
            return
        if self._artifact_id is None:
            report_progress(self._key, self._description, done, total)
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


def error_of(state: State) -> str:
    """The exception (type and message) a failed state holds."""
    error = state.result(raise_on_failure=False)
    return f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)


def final_state(outcome: State | PrefectFuture) -> State:
    """A task's final state: a submitted one's once it ends (failures are not raised)."""
    if isinstance(outcome, State):
        return outcome
    outcome.wait()
    return outcome.state


class LateSteps:
    """The steps after every variant is measured, each of which may fail without losing the run.

    What the run measured is what it is for: a failing run-off, MLflow model or child run,
    champion registration, comparison with the last run or report is said in one line, recorded
    (`failures`, the summary's ``late_failures``), and the run goes on with what it had; the
    summary JSON is still written with every measured variant.
    """

    def __init__(self) -> None:
        self.failures: list[dict[str, str]] = []

    def run(self, step: str, call: Callable[[], _T], otherwise: _T) -> _T:
        """`call()`'s value, or `otherwise` when it raises (the failure recorded for `step`)."""
        try:
            return call()
        except Exception as error:  # any failure here is one step's, never the run's
            text = str(error).strip()
            reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
            step_logger().warning("%s failed after the measurements: %s; the run goes on "
                                  "without it", step, reason)
            self.failures.append({"step": step, "error": reason[:2000]})
            return otherwise
