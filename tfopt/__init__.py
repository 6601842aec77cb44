"""tfopt: make TensorFlow models fast in production, measured on your own hardware.

Importing this package sets the process-wide environment that TensorFlow, Keras and Prefect
read at import time, and the garbage collector's thresholds, so every entry point (CLI, flows,
tasks, tests) imports it first.
"""

import gc
import os

# Python's cycle collector runs a young collection every 700 allocations by default: importing
# TensorFlow, Keras, Prefect and MLflow (500k objects) spent 1.25 of 6.0 CPU-s in it, in every
# process tfopt starts (CLI, native steps, measurements); every 20000 allocations, 0.39 s.
gc.set_threshold(20_000, 10, 10)
# tensorflow-model-optimization 0.8 only understands Keras 2 models (tf_keras); the switch must be
# set before TensorFlow is imported anywhere in the process.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# No network here: telemetry calls would only fill the logs with errors.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# MLflow's telemetry also sets and unsets a variable of this environment from a thread of its
# own: another thread reading the environment then (urllib's proxy lookup, in every MLflow and
# Prefect request) failed with KeyError on it.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# One bounded retry policy around MLflow (tfopt.tracking.with_retries), not MLflow's own retries
# (7 with backoff) times tfopt's: an outage ends in a clear error within about a minute.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
# tfopt prints the run addresses itself, once, when a pipeline run ends.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

__version__ = "0.1.0"
