"""Steps after the measurements that fail lose nothing the run measured (faults injected)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.live import LIGHT, ROOT, TECHNIQUES_OFF
from tfopt.demo_data import write_demo_images

pytestmark = pytest.mark.e2e


def _broken(what: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{what} broke (injected)")

    return fail


def test_a_failing_runoff_child_runs_and_report_leave_a_summary_with_every_variant(
    live_services, tmp_path, monkeypatch
):
    """The run-off, MLflow's child runs and the report each raise: the run still completes.

    Each is one line and one ``late_failures`` entry; the summary JSON in the run's folder
    holds every measured variant; the champion is chosen on the variants' own turns and, having
    no child run, not registered; the MLflow parent run and the Prefect flow run end finished.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import optimize_model as pipeline
    from flows.parameters import load_pipeline_config
    from tfopt.native import RECORD_ENV

    demo = tmp_path / "demo"
    write_demo_images(demo)
    config = load_pipeline_config(ROOT / "configs" / "smoke.yaml", {
        **LIGHT, **TECHNIQUES_OFF, "name": "late-failures", "data.source_dir": str(demo),
        "work_dir": str(tmp_path / "work"), "convert.tflite": ["fp32", "int8"],
        "convert.onnx": False, "train.epochs": 2, "train.stop": "fixed",
    })
    monkeypatch.setattr(pipeline, "run_off", _broken("the run-off"))
    monkeypatch.setattr(pipeline.tracking, "log_variants", _broken("MLflow's child runs"))
    monkeypatch.setattr(pipeline, "write_report", _broken("the report"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", live_services.mlflow_url)
    monkeypatch.setenv(RECORD_ENV, "")  # the flow sets it for its run; put back after
    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        summary = pipeline.optimize_model(config)

    failures = {failure["step"]: failure["error"] for failure in summary["late_failures"]}
    assert failures == {
        "run-off": "RuntimeError: the run-off broke (injected)",
        "MLflow child runs": "RuntimeError: MLflow's child runs broke (injected)",
        "report": "RuntimeError: the report broke (injected)",
    }, summary["late_failures"]
    ok = {v["name"] for v in summary["variants"] if v["status"] == "ok"}
    assert {"baseline-graph", "baseline-savedmodel", "baseline-tflite-fp32",
            "baseline-tflite-int8"} <= ok
    run_dir = tmp_path / "work" / "runs" / f"late-failures-{summary['mlflow_run_id'][:12]}"
    written = json.loads((run_dir / "summary.json").read_text())
    assert [v["name"] for v in written["variants"]] == [v["name"] for v in summary["variants"]]
    assert all(v["latency_ms"]["p50"] > 0 for v in written["variants"] if v["name"] in ok)
    assert written["late_failures"] == summary["late_failures"]
    assert summary["champion"] in ok and summary["runoff"] is None
    assert summary["champion_model"] is None, "no child run to register it from"
    assert summary["report"] is None and not (run_dir / "report" / "report.md").exists()
    parent = MlflowClient(live_services.mlflow_url).get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert Path(summary["dataset"]["manifest"]).is_file()
