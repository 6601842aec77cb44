"""Loggers for steps that run both inside Prefect and as plain functions (tests, benchmarks)."""

from __future__ import annotations

import logging

from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger


def step_logger() -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a flow or task run (shown in the UI), else a plain logger."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("tfopt")
