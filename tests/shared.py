"""What the whole test session makes once and every xdist worker reads: pytest-xdist's pattern.

The first worker to ask for a thing makes it under a file lock in the folder all workers share
(the base temporary folder's parent under xdist) and records it there as JSON; the others wait
on the lock and read the record. A thing that failed to be made is recorded as its error, so
the other workers fail at once with the same message instead of making it again. What must be
stopped at the end (the servers) is stopped once, by the process that runs the session
(`tests/conftest.py`'s ``pytest_sessionfinish``).
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tfopt.fileio import atomic_write_json, file_lock


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this test session shares (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], Any]) -> Any:
    """`make(folder)`'s JSON value, made by the first worker that asks and read by the rest.

    Args:
        tmp_path_factory: The asking worker's factory (it locates the shared folder).
        name: The thing's name: its record is ``<name>.json`` in the shared folder.
        make: Makes the thing in the folder it is given and returns what describes it.
    """
    shared = session_folder(tmp_path_factory)
    record = shared / f"{name}.json"
    with file_lock(shared / f"{name}.lock"):
        if not record.exists():
            folder = shared / name
            folder.mkdir(exist_ok=True)
            try:
                value = {"value": make(folder)}
            except BaseException as error:
                message = "".join(traceback.format_exception_only(error)).strip()
                atomic_write_json(record, {"error": message[-4000:]})
                raise
            atomic_write_json(record, value)
    made = json.loads(record.read_text())
    if "error" in made:
        pytest.fail(f"{name}, shared by the session, could not be made: {made['error']}")
    return made["value"]


def recorded(folder: Path, name: str) -> Any | None:
    """The value `made_once` recorded for `name` in `folder`, or None if none was made."""
    record = folder / f"{name}.json"
    if not record.exists():
        return None
    return json.loads(record.read_text()).get("value")
