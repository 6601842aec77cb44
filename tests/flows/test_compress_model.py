"""The compression subflow fanned out to Dask worker processes."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from flows.compress_model import compress_model
from flows.parameters import PipelineConfig
from tfopt.scaling import task_runner


@pytest.mark.e2e
def test_dask_runs_every_technique_and_conversion_on_worker_processes(
    live_services, tiny_data, tiny_baseline, tmp_path
):
    from distributed import Client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tfopt.scaling import local_cluster

    cluster = local_cluster(2)

    config = PipelineConfig.model_validate({
        "name": "dask-test",
        "compress": {"prune": {"epochs": 1}, "distill": {"epochs": 1}, "qat": {"epochs": 1},
                     "pqat": {"enabled": True, "epochs": 1}, "tflite": ["fp32", "int8"]},
        "convert": {"calibration_examples": 16},
        "scale": {"task_runner": "dask", "dask_address": cluster.scheduler_address},
    })
    try:
        with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
            compressed = compress_model.with_options(
                task_runner=task_runner(config.scale)
            )(config, tiny_baseline, tiny_data, tmp_path)
        variants, models = compressed.variants, compressed.models
        with Client(cluster) as client:
            ran = client.run_on_scheduler(
                lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
            worker_pids = set(client.run(os.getpid).values())
            daemonic = set(client.run(lambda: multiprocessing.current_process().daemon).values())
    finally:
        cluster.close()

    assert {m.name for m in models} == {"pruned-80", "distilled-small", "qat", "pqat"}
    by_name = {v.name: v for v in variants}
    assert set(by_name) == {
        "pruned-80-graph", "pruned-80-tflite-fp32", "pruned-80-tflite-int8",
        "pruned-80-tflite-sparse",
        "distilled-small-graph", "distilled-small-tflite-fp32", "distilled-small-tflite-int8",
        "qat-tflite-int8", "pqat-tflite-int8",
    }
    assert all(v.status == "ok" and v.path.exists() for v in variants), variants
    assert os.getpid() not in worker_pids
    assert daemonic == {False}, "native steps fork from a fork server there, not a fresh Python"
    assert by_name["pqat-tflite-int8"].derived_from == "pruned-80-tflite-int8"
    sparse, dense = by_name["pruned-80-tflite-sparse"], by_name["pruned-80-tflite-fp32"]
    assert sparse.derived_from == dense.name and sparse.params["sparsity_encoding"] is True
    assert sparse.path.stat().st_size < dense.path.stat().st_size, "sparse encoding"
    pqat = next(m for m in models if m.name == "pqat")
    assert pqat.params["starts_from"] == "pruned-80"
    kept = {k: v for k, v in pqat.metrics.items() if k.startswith("int8_sparsity.")}
    assert kept and all(v >= 0.75 for v in kept.values()), "zeros survive into int8"
    for step in ("prune_model", "distill_model", "quantize_aware_train", "build_variant",
                 "export_savedmodel", "prune_preserving_qat"):
        assert any(prefix.startswith(step) for prefix in ran), (step, ran)


@pytest.mark.e2e
def test_a_searched_student_width_is_distilled_per_trial_and_its_controls_trained_once(
    live_services, tiny_data, tiny_baseline, tiny_savedmodel, tiny_dataset, tmp_path
):
    from mlflow import MlflowClient
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.prepare_benchmark_inputs import prepare_benchmark_inputs
    from tests.steps import to_tflite
    from tfopt.tracking import RunRef

    config = PipelineConfig.model_validate({
        "name": "distill-search", "work_dir": str(tmp_path / "work"),
        "compress": {"distill": {"student": "thinner", "thinner": "auto", "epochs": 2},
                     "prune": {"enabled": False}, "qat": {"enabled": False},
                     "cluster": {"enabled": False}, "tflite": ["int8"], "graph": False},
        "convert": {"calibration_examples": 16},
        "benchmark": {"min_runs": 10, "min_seconds": 0.1, "max_seconds": 0.5},
    })
    mlflow = MlflowClient(live_services.mlflow_url)
    experiment = mlflow.create_experiment(f"distill-search-{tmp_path.name}")
    parent = RunRef(tracking_uri=live_services.mlflow_url, experiment_id=experiment,
                    run_id=mlflow.create_run(experiment).info.run_id)
    inputs = prepare_benchmark_inputs.fn(None, tiny_dataset, tmp_path / "inputs")
    reference = to_tflite(tiny_savedmodel, "int8", tiny_dataset, config.convert, tmp_path / "int8")
    data = tiny_data.model_copy(update={"speedup_reference": reference})
    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        compressed = compress_model(config, tiny_baseline, data, tmp_path, inputs, parent)

    search = compressed.searches["distill"]
    assert search["knob"] == "thinner" and len(search["trials"]) >= 2, search
    chosen = search["chosen"]
    assert chosen is not None, search
    assert all(trial["speedup"] > 0 for trial in search["trials"] if trial["status"] == "ok"), (
        "each trial within the budget timed side by side with the baseline's int8 file")
    assert all(len(trial["files"]) == 2 and trial["file"] in {f["name"] for f in trial["files"]}
               for trial in search["trials"] if trial["p50_ms"] is not None), (
        "each trial's int8 and fp32 files timed; its figures one of theirs")
    (student,) = compressed.models
    assert student.name == f"distilled-thinner-{round(chosen * 100)}"
    assert student.params["thinner"] == chosen
    assert {"scratch_test_accuracy", "same_start_test_accuracy",
            "distillation_gain_points"} <= set(student.metrics), "its controls, after the search"
    (variant,) = compressed.variants
    assert variant.name == f"{student.name}-tflite-int8" and variant.status == "ok", variant
    trials = mlflow.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.run_id}'")
    assert sorted(float(run.data.params["thinner"]) for run in trials) == sorted(
        trial["params"]["thinner"] for trial in search["trials"]), "each trial a nested run"


@pytest.mark.e2e
def test_one_techniques_failed_export_fails_its_variants_only(
    live_services, tiny_data, tiny_baseline, tmp_path, monkeypatch
):
    """Pruning's SavedModel export raises (injected); QAT's variants are built all the same."""
    from prefect import task
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.compress_model as subflow
    from tasks.export_savedmodel import export_savedmodel

    @task(name="export_savedmodel")
    def export_failing_for_pruning(model, out_dir):
        if model.name.startswith("pruned"):
            raise RuntimeError("the disk broke (injected)")
        return export_savedmodel.fn(model, out_dir)

    monkeypatch.setattr(subflow, "export_savedmodel", export_failing_for_pruning)
    config = PipelineConfig.model_validate({
        "name": "export-fails",
        "compress": {"prune": {"epochs": 1}, "qat": {"epochs": 1},
                     "distill": {"enabled": False}, "tflite": ["int8"], "graph": False},
        "convert": {"calibration_examples": 16},
    })
    with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
        compressed = compress_model(config, tiny_baseline, tiny_data, tmp_path)

    by_name = {v.name: v for v in compressed.variants}
    pruned = by_name["pruned-80-tflite-int8"]
    assert pruned.status == "failed", pruned
    assert pruned.error == "export_savedmodel failed: RuntimeError: the disk broke (injected)"
    assert by_name["qat-tflite-int8"].status == "ok" and by_name["qat-tflite-int8"].path.exists()
    assert {m.name for m in compressed.models} >= {"qat"}
