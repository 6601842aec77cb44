"""Loggers for steps that run both inside Prefect and as plain functions (tests, benchmarks)."""

from __future__ import annotations

import logging
import sys


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
