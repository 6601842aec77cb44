"""A native step's child process talking to its parent: log lines and progress, as JSON lines.

The child side of `tfopt.native`: a child's ``tfopt`` log records and its progress updates
(`report_progress`, which `tfopt.orchestration.StepProgress` calls where it has no Prefect run)
are appended to a file its parent reads while it waits, and replays to the step's logger and
progress artifact.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

_EVENTS: list[Path] = []
"""In a child: the file its log lines and progress go to (its parent reads and replays it)."""


def report_progress(key: str, description: str, done: int, total: int) -> bool:
    """In a child, send a progress update to the parent's step (False outside a child)."""
    if not _EVENTS:
        return False
    _write_event({"kind": "progress", "key": key, "description": description, "done": done,
                  "total": total})
    return True


def _write_event(event: dict[str, Any]) -> None:
    with _EVENTS[0].open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(event) + "\n")


class _EventHandler(logging.Handler):
    """A child's ``tfopt`` log records, written for the parent to replay."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            _write_event({"kind": "log", "level": record.levelno,
                          "message": record.getMessage()})


def send_events_to(path: Path) -> None:
    """Make this process a child that sends its ``tfopt`` log lines and progress to `path`.

    A worker that runs step after step calls it for each: the lines go to the current step's.
    """
    _EVENTS[:] = [path]
    logger = logging.getLogger("tfopt")
    if not any(isinstance(handler, _EventHandler) for handler in logger.handlers):
        logger.addHandler(_EventHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False
