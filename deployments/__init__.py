"""Prefect deployments: schedules, work pools and local serving."""
