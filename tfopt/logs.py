"""Loggers for steps that run both inside Prefect and as plain functions, and the run's log file.

A `tfopt run` keeps the terminal for tfopt's and Prefect's lines: the libraries' output (C++
banners, converter prints, warnings) goes to the run's log file (`route_output_to_log`,
`show_run_lines`), which the run logs to MLflow; ``--verbose`` leaves everything on the
terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


def step_logger() -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a flow or task run (shown in the UI), else a plain logger.

    A process that never imported Prefect (a benchmark worker) is not in a run: it gets the
    plain logger without paying for Prefect's import.
    """
    if "prefect" not in sys.modules:
        return logging.getLogger("tfopt")
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("tfopt")


_EXPLAINED = {
    "Gradients do not exist for variables": (
        "some variables get no gradient in this fine-tuning and stay as they are (in "
        "cluster-preserving QAT, the clusters' index tensors: expected); the full warning is in "
        "the run's log file"),
}
"""Library warnings that say something about the user's model, as the tfopt line they mean."""


class TerminalLines(logging.Filter):
    """Lets Prefect's and tfopt's lines through to the terminal, and any library error.

    Library warnings and notices (TensorFlow's retracing, MLflow's type-hint advice, Keras'
    HDF5 notes) go to the run's log file only; one that says something about the user's model
    (`_EXPLAINED`) becomes one tfopt line, once.
    """

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record on the terminal (rewritten if it is one tfopt explains)?"""
        if record.name.split(".")[0] in ("prefect", "tfopt") or record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        for pattern, meaning in _EXPLAINED.items():
            if pattern in message and pattern not in self._said:
                self._said.add(pattern)
                record.name, record.msg, record.args = "tfopt", meaning, ()
                return True
        return False


class _WithoutTraceback(logging.Formatter):
    """A console formatter that leaves tracebacks out (the run's log file keeps them)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self._inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        """The record's line(s) as the inner formatter writes them, without a traceback."""
        import copy

        bare = copy.copy(record)
        bare.exc_info, bare.exc_text, bare.stack_info = None, None, None
        return self._inner.format(bare)


@dataclass
class RunLog:
    """The run's log file, and the terminal's streams kept for tfopt's and Prefect's lines."""

    path: Path
    terminal_out: TextIO
    terminal_err: TextIO


def route_output_to_log(path: Path) -> RunLog:
    """Send this process's (and its children's) raw output to `path`; keep the terminal apart.

    File descriptors 1 and 2 are pointed at the log file, so TensorFlow's C++ start-up
    banners, the converters' prints, the benchmark workers' output and Python's warnings land
    there; the returned streams still reach the terminal, for tfopt's own lines
    (`show_run_lines`). Python warnings become log records (``py.warnings``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal_out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    terminal_err = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8")
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    logging.captureWarnings(True)
    return RunLog(path=path, terminal_out=terminal_out, terminal_err=terminal_err)


def move_log(run_log: RunLog, path: Path) -> RunLog:
    """Continue the log in `path` (what was logged so far copied there first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(log_fd, run_log.path.read_bytes())
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    run_log.path.unlink(missing_ok=True)
    return RunLog(path=path, terminal_out=run_log.terminal_out,
                  terminal_err=run_log.terminal_err)


def show_run_lines(run_log: RunLog) -> None:
    """Point the console handlers at the terminal, filtered by `TerminalLines`; log all to file.

    Called once Prefect has configured logging (its console handler sits on the root logger).
    """
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler):
            handler.setStream(run_log.terminal_err)
            console = getattr(handler, "console", None)  # Prefect's writes through rich
            if console is not None:
                console.file = run_log.terminal_err
            handler.addFilter(TerminalLines())
            handler.setFormatter(_WithoutTraceback(handler.formatter))
    everything = logging.FileHandler(run_log.path, encoding="utf-8")
    everything.setFormatter(logging.Formatter(
        "%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    root.addHandler(everything)
