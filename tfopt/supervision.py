"""Supervising a run in this process: servers, leftovers, the libraries' output, failures.

What `tfopt run` and `tfopt benchmark` do around a flow, so that the command line only parses
and prints: point this process at the servers before Prefect is imported, close what a killed
run left behind, keep the libraries' output in the run's log file, and turn a failure into one
line (a lost Prefect server, a full disk, an unexpected error naming its step).
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tfopt.config import ConfigError
from tfopt.logs import RunLog, move_log, route_output_to_log, show_run_lines
from tfopt.services import ServiceError, ServiceSettings, health_url, is_healthy, redact


class RunFailedError(RuntimeError):
    """A run that failed for a reason of its own (not bad input): one line, exit code 1."""


class PrefectUnavailableError(ServiceError):
    """The Prefect server stopped answering while a flow ran."""


def point_at_services() -> None:
    """Point this process at the configured servers before anything imports Prefect.

    Prefect reads ``PREFECT_API_URL`` once, when it is first imported (loading a config
    imports the techniques, which define Prefect tasks); set later, a flow would run on a
    temporary in-process server instead. Servers that require a password get it from the
    environment or from the password file `tfopt up` wrote (`client_credentials`).
    """
    from tfopt.provenance import mlflow_tracking_uri, prefect_api_url
    from tfopt.services.credentials import client_credentials

    os.environ["PREFECT_API_URL"] = prefect_api_url()
    os.environ["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri()
    os.environ.update(client_credentials(ServiceSettings.from_env().state_dir))


def connect_services() -> tuple[str, str]:
    """Check both servers answer; return their addresses (set by `point_at_services`).

    Raises:
        ServiceError: A server does not answer (naming it and `tfopt up`).
    """
    from tfopt.services import require_services

    api_url, tracking_uri = os.environ["PREFECT_API_URL"], os.environ["MLFLOW_TRACKING_URI"]
    require_services(api_url, tracking_uri)
    return api_url, tracking_uri


def reconcile_leftovers(tracking_uri: str, work_dir: Path | None = None) -> list[str]:
    """Close what a killed tfopt process on this machine left behind.

    MLflow runs and Prefect flow runs left RUNNING are marked KILLED and Crashed; temporary
    folders are removed (the system's, and the work folder's run folders).

    Returns:
        One line per thing closed or removed.
    """
    from tfopt.fileio import RUN_TEMP, remove_orphan_temp_dirs
    from tfopt.orchestration import crash_orphan_flow_runs, mark_crashed
    from tfopt.tracking import reconcile_orphans

    reason = "its tfopt process was gone"
    orphans = reconcile_orphans(tracking_uri)
    crashed = mark_crashed([o["flow_run_id"] for o in orphans], reason)
    lines = []
    for orphan in orphans:
        prefect = ", Prefect Crashed" if orphan["flow_run_id"] in crashed else ""
        lines.append(f"closed a run left RUNNING by a process that is gone: {orphan['name']} "
                     f"(MLflow KILLED{prefect})")
    lines += [f"closed a Prefect flow run left RUNNING by a process that is gone: {name} "
              "(Crashed)" for name in crash_orphan_flow_runs(reason)]
    roots = [None, *([work_dir / RUN_TEMP] if work_dir and (work_dir / RUN_TEMP).is_dir()
                     else [])]
    lines += [f"removed a temporary folder of a process that is gone: {folder}"
              for root in roots for folder in remove_orphan_temp_dirs(root)]
    return lines


def allow_code_from(folder: Path) -> None:
    """Let this process (and the flows it runs) import builders from `folder` too."""
    from tfopt.user_code import CODE_DIRS_ENV

    known = [p for p in os.environ.get(CODE_DIRS_ENV, "").split(os.pathsep) if p]
    os.environ[CODE_DIRS_ENV] = os.pathsep.join([*known, str(folder)])


def wants_verbose(flag: bool) -> bool:
    """Everything on the terminal: ``--verbose``, ``TFOPT_VERBOSE=1``, ``TFOPT_LOG_LEVEL=DEBUG``."""
    return (flag or os.environ.get("TFOPT_VERBOSE") == "1"
            or os.environ.get("TFOPT_LOG_LEVEL", "").upper() == "DEBUG")


_LOG: list[RunLog] = []
"""Where the libraries' output goes: the early log of this process, then the run's own."""


def route_libraries_early() -> TextIO | None:
    """From the start of a command, keep the libraries' output off the terminal.

    TensorFlow prints its C++ banners when it is imported (checking the model imports it), so
    the output goes to a log of this process's own in the temporary folder, moved into the
    work folder once the run starts (`quiet_libraries`); the terminal keeps tfopt's lines.
    Nothing is routed when a caller captures this process's output (a test, an embedding
    program).

    Returns:
        The terminal's stream for tfopt's own lines (None: nothing was routed).
    """
    if sys.stdout is not sys.__stdout__ or sys.stderr is not sys.__stderr__:
        return None
    folder = Path(tempfile.mkdtemp(prefix=f"tfopt-log-{os.getpid()}-"))
    early = route_output_to_log(folder / "start.log")
    _LOG.append(early)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return early.terminal_out


def quiet_libraries(work_dir: Path, name: str) -> Path | None:
    """Continue the libraries' log in the run's log file; Prefect's lines on the terminal.

    Returns:
        The log file (None when nothing was routed, see `route_libraries_early`).
    """
    if not _LOG:
        return None
    path = work_dir / "logs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    early_folder = _LOG[0].path.parent
    run_log = move_log(_LOG[0], path.resolve())
    shutil.rmtree(early_folder, ignore_errors=True)  # nothing left in the system's temp folder
    _LOG[0] = run_log
    show_run_lines(run_log)
    os.environ["TFOPT_RUN_LOG"] = str(run_log.path)
    return run_log.path


def supervised(call: Callable[[], dict], api_url: str, work_dir: Path | None,
               run_log: Path | None) -> dict:
    """Run a flow: a lost Prefect server, a full disk or an unexpected failure is one line.

    Raises:
        PrefectUnavailableError: The flow failed and the Prefect server no longer answers.
        ConfigError: The disk filled (its partial files removed, see `cleaned_if_disk_full`).
        RunFailedError: Any other failure, naming its step (its traceback in `run_log`).
    """
    def flow_run() -> dict:
        return run_flow(call, api_url)

    # The libraries imported so far live as long as the process: the garbage collector's full
    # passes need not walk them again and again during the run.
    gc.freeze()
    guarded = flow_run if work_dir is None else (lambda: cleaned_if_disk_full(flow_run, work_dir))
    return failure_in_one_line(guarded, run_log)


def run_flow(flow_call: Callable[[], dict], api_url: str) -> dict:
    """Run a flow; a Prefect server lost mid-run is an error naming it, not a traceback.

    Raises:
        PrefectUnavailableError: The flow failed and the Prefect server no longer answers.
    """
    try:
        return flow_call()
    except (ConfigError, ServiceError):
        raise
    except Exception as error:
        if is_healthy(health_url(api_url), 5.0):
            raise
        raise PrefectUnavailableError(
            f"Prefect at {redact(api_url)} stopped answering during the run "
            f"({type(error).__name__}). Start it again with `tfopt up` and rerun: the shards and "
            "a trained baseline are reused, and the run left RUNNING is closed then."
        ) from error


def failure_in_one_line(call: Callable[[], dict], run_log: Path | None) -> dict:
    """Run `call`; an unexpected failure is one line naming its step, its traceback logged.

    Raises:
        RunFailedError: The run failed (the step and reason in the message; the traceback in
            the run's log file).
    """
    if run_log is None:
        return call()
    try:
        return call()
    except (ConfigError, ServiceError):
        raise
    except Exception as error:
        traceback.print_exc()  # to the run's log file (standard error goes there)
        raise RunFailedError(failure_line(error, run_log)) from error


def failure_line(error: BaseException, traceback_log: Path) -> str:
    """An unexpected failure in one line: its step, type, first line, and where its traceback is."""
    step = failed_step(error)
    text = str(error).strip()
    first_line = text.splitlines()[0][:300] if text else ""
    return (f"the run failed{f' in {step}' if step else ''}: {type(error).__name__}: "
            f"{first_line} (traceback: {traceback_log})")


def failed_step(error: BaseException) -> str | None:
    """The tfopt task, technique or flow module the error was raised in, if any."""
    steps = [Path(frame.filename).stem for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename).parent.name in ("tasks", "techniques", "flows")]
    return steps[-1] if steps else None


def cleaned_if_disk_full(call: Callable[[], dict], work_dir: Path) -> dict:
    """Run `call`; a disk that fills meanwhile is one line, its partial files removed.

    Raises:
        ConfigError: The disk filled (naming the folder and what is free now); the rerun after
            space is freed reuses the finished shards and a trained baseline.
    """
    from tfopt.fileio import is_disk_full, remove_partial_files

    started = time.time()
    try:
        return call()
    except Exception as error:
        if not is_disk_full(error):
            raise
        removed = remove_partial_files(work_dir, started)
        free_mb = shutil.disk_usage(work_dir).free / 1e6
        raise ConfigError(
            f"work_dir: {work_dir} ran out of space during the run ({free_mb:,.0f} MB free now, "
            f"{len(removed)} unfinished files removed): free space and rerun; finished shards "
            "and a trained baseline are reused") from error


def unexpected_failure_line(error: BaseException) -> str | None:
    """An error no step caught, as one line; its traceback kept in the state folder's logs.

    Returns:
        The line (None when the libraries' output was not routed: the caller shows the
        traceback as it is).
    """
    if not _LOG:
        return None
    traceback.print_exc()  # into the log, kept beside the work folder's logs
    kept = ServiceSettings.from_env().state_dir / "logs" / f"tfopt-error-{os.getpid()}.log"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_LOG[0].path, kept)
    return failure_line(error, kept)
