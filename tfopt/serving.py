"""The serving contract every exported model follows (names only; importing this is cheap)."""

SIGNATURE_KEY = "serving_default"
INPUT_NAME = "images"
OUTPUT_LOGITS = "logits"
OUTPUT_PROBABILITIES = "probabilities"
