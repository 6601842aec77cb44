"""One variant failing to build: isolated, recorded, and the run completes."""

from __future__ import annotations

import json
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from tests.live import run_smoke_with
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e


def test_a_failing_variant_is_isolated_and_the_run_completes_fault(live_services, tmp_path):
    demo = tmp_path / "demo"
    write_demo_images(demo)
    summary_path = tmp_path / "out.json"
    overrides = {
        "data.source_dir": demo, "work_dir": tmp_path / "work", "name": "failing-variant",
        "convert.onnx_atol": 1e-12, "convert.tflite": "[fp32]", "convert.xla": "[]",
        "compress.prune.enabled": "false", "compress.distill.enabled": "false",
        "compress.qat.enabled": "false", "runtimes.openvino.precisions": "[]",
        "input.sweep_batch_sizes": "[32]", "input.measure_layouts": "false", "train.epochs": 3,
    }
    summary = run_smoke_with(live_services, summary_path, overrides)
    by_name = {v["name"]: v for v in summary["variants"]}
    onnx = by_name["baseline-onnx"]
    assert onnx["status"] == "failed" and "OnnxMismatchError" in onnx["error"]
    assert onnx["latency_ms"]["p50"] is None
    ok = [v for v in summary["variants"] if v["status"] == "ok"]
    assert {"baseline-graph", "baseline-savedmodel", "baseline-tflite-fp32"} <= {
        v["name"] for v in ok
    }
    assert summary["champion"] in {v["name"] for v in ok}
    with urllib.request.urlopen(
        f"{live_services.prefect_api_url}/flow_runs/{summary['prefect_flow_run_id']}", timeout=10
    ) as response:
        assert json.load(response)["state_type"] == "COMPLETED"
    child = MlflowClient(live_services.mlflow_url).search_runs(
        [summary["mlflow_experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}' "
                      "and tags.`tfopt.variant` = 'baseline-onnx'",
    )[0]
    assert child.data.tags["tfopt.status"] == "failed" and child.info.status == "FAILED"
