"""A Keras 3 model trained outside tfopt, through the whole pipeline against real servers."""

from __future__ import annotations

import pytest

from tests.live import LIGHT, run_smoke_with
from tests.theirs import their_keras3_network

pytestmark = pytest.mark.e2e


def test_a_keras3_model_file_goes_through_pruning_and_int8_as_it_is(live_services, tmp_path):
    """A network nobody here wrote, saved by Keras 3, optimized with train.epochs 0.

    Kept short for CI (its network trained 2 epochs, no run-off): QAT and XLA of Keras 3 models
    are checked in tests/tasks/test_keras3_models.py; here the pipeline's own steps take it in.
    """
    demo, network, own_accuracy, _ = their_keras3_network(tmp_path / "outside", epochs=2)
    network.save(tmp_path / "theirs.keras")
    summary = run_smoke_with(live_services, tmp_path / "out.json", {
        **LIGHT, "data.source_dir": demo, "work_dir": tmp_path / "work", "name": "own-keras3",
        "model.source": "file", "model.path": tmp_path / "theirs.keras", "train.epochs": 0,
        "convert.tflite": "[int8]", "compress.tflite": "[int8]",
        "compress.distill.enabled": "false", "compress.qat.enabled": "false",
        "compress.prune.epochs": 2, "convert.onnx": "false", "compress.graph": "false",
        "benchmark.runoff_margin": "null",  # one process fewer: no champion's run-off
    })
    by_name = {v["name"]: v for v in summary["variants"]}
    assert abs(summary["baseline_accuracy"] - own_accuracy) < 1e-6, "the model as it was"
    for name in ("baseline-graph", "baseline-savedmodel"):
        assert by_name[name]["status"] == "ok", by_name[name]
        assert by_name[name]["top1_agreement"] >= 0.99, by_name[name]
    pruned = summary["techniques"]["pruned-80"]
    assert pruned["params"]["translated_from"].startswith("Keras 3.")
    assert pruned["metrics"]["translation_max_abs_diff"] < 1e-3
    assert pruned["metrics"]["sparsity"] >= 0.7
    for name in ("baseline-tflite-int8", "pruned-80-tflite-int8"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert summary["model_facts"] == {"kind": "keras", "keras": "keras3", "channels": 3,
                                      "output": "logits"}
