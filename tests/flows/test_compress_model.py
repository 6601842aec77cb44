"""The compression subflow fanned out to Dask worker processes."""

from __future__ import annotations

import os

import pytest

from flows.compress_model import all_failed, compress_model, planned_variants, task_runner_for
from tfopt.config import PipelineConfig


def test_the_plan_names_every_compressed_variant_and_can_fail_them_all():
    config = PipelineConfig.model_validate({"compress": {"tflite": ["int8"], "distill": False}})
    plan = planned_variants(config)
    assert [source for source, _ in plan] == ["pruned-80", "qat"]
    names = [spec.name for _, specs in plan for spec in specs]
    assert names == ["pruned-80-graph", "pruned-80-tflite-int8", "qat-tflite-int8"]
    failed = all_failed(config, "compress_model failed: KilledWorker")
    assert [v.name for v in failed] == names
    assert all(v.status == "failed" and "KilledWorker" in v.error for v in failed)


@pytest.mark.e2e
def test_dask_runs_every_technique_and_conversion_on_worker_processes(
    live_services, tiny_dataset, tiny_baseline, tmp_path
):
    from distributed import Client, LocalCluster
    from prefect.settings import PREFECT_API_URL, temporary_settings

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None)

    config = PipelineConfig.model_validate({
        "name": "dask-test",
        "compress": {"prune_epochs": 1, "distill_epochs": 1, "qat_epochs": 1,
                     "tflite": ["fp32", "int8"]},
        "convert": {"calibration_examples": 16},
        "scale": {"task_runner": "dask", "dask_address": cluster.scheduler_address},
    })
    try:
        with temporary_settings({PREFECT_API_URL: live_services.prefect_api_url}):
            variants, models = compress_model.with_options(
                task_runner=task_runner_for(config.scale)
            )(config, tiny_dataset, tiny_baseline, 16, tmp_path)
        with Client(cluster) as client:
            ran = client.run_on_scheduler(
                lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
            worker_pids = set(client.run(lambda: __import__("os").getpid()).values())
    finally:
        cluster.close()

    assert {m.name for m in models} == {"pruned-80", "distilled-small", "qat"}
    by_name = {v.name: v for v in variants}
    assert set(by_name) == {
        "pruned-80-graph", "pruned-80-tflite-fp32", "pruned-80-tflite-int8",
        "distilled-small-graph", "distilled-small-tflite-fp32", "distilled-small-tflite-int8",
        "qat-tflite-int8",
    }
    assert all(v.status == "ok" and v.path.exists() for v in variants), variants
    assert os.getpid() not in worker_pids
    for step in ("prune_model", "distill_model", "quantize_aware_train", "convert_tflite",
                 "export_savedmodel"):
        assert any(prefix.startswith(step) for prefix in ran), (step, ran)
