"""Prefect flows: they wire tasks together and pass their small results on."""

import tfopt  # noqa: F401
