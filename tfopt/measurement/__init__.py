"""Measurement: the benchmark worker, timing statistics, load scenarios, machine load."""
