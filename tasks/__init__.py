"""Pipeline steps, one per module; TensorFlow code lives here and nowhere else."""

import tfopt  # noqa: F401  (sets TF_USE_LEGACY_KERAS before any task imports TensorFlow)
