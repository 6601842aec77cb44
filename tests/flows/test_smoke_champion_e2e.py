"""The smoke run's champion afterwards: measured again by `tfopt benchmark`, served, and timed
on the machines of two work pools (each test reads the session's `smoke_run` and adds runs of
its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.live import (
    SMOKE_RUN_S,
    benchmark_split_of,
    free_port,
    run_tfopt,
    scores_of,
    tfopt_process,
)
from tfopt.services import is_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(SMOKE_RUN_S + 300)]
LATENCY_KEYS = {"p50", "p90", "p99", "mean", "std"}


def _post(url: str, body: dict) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_benchmark_only_flow_measures_the_registered_champion(smoke_run, tmp_path):
    settings, summary, _, demo = smoke_run
    out = tmp_path / "bench.json"
    completed = run_tfopt(
        settings,
        ["benchmark", "--model", "models:/tfopt-smoke@champion",
         "--data", str(demo), "--work-dir", str(tmp_path / "work"), "--summary-json", str(out),
         "--set", "benchmark.threads=1", "--set", "benchmark.min_runs=15"],
        timeout_s=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    bench = json.loads(out.read_text())
    (variant,) = bench["variants"]
    version = summary["champion_model"]["version"]
    assert variant["name"] == f"tfopt-smoke-v{version}" and variant["status"] == "ok"
    champion = next(v for v in summary["variants"] if v["name"] == summary["champion"])
    assert variant["format"] == champion["format"] and variant["precision"] == champion["precision"]
    # Same model, a larger test split (all of the demo data, not the smoke's 60 per class).
    assert abs(variant["accuracy"] - champion["accuracy"]) < 0.1
    assert set(variant["latency_ms"]) >= LATENCY_KEYS
    assert bench["environment"]["benchmark_threads"] == "1", "--set reaches benchmark.*"
    assert variant["timed_runs"] >= 15
    client = MlflowClient(settings.mlflow_url)
    run = client.get_run(bench["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert {"report/report.json", "report/report.md"} <= {
        a.path for a in client.list_artifacts(run.info.run_id, "report")
    }
    (child,) = client.search_runs(
        [bench["mlflow_experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{bench['mlflow_run_id']}'")
    logged = client.get_logged_model(child.data.tags["tfopt.model_id"])
    assert logged.source_run_id == child.info.run_id and logged.status == "READY"
    assert {"accuracy", "latency_p50_ms"} <= {m.key for m in logged.metrics or []}, "linked"


def _smoke_test_split(smoke_run) -> tuple[np.ndarray, np.ndarray]:
    """The smoke run's benchmark inputs: scaled test images and their labels."""
    _, summary, _, demo = smoke_run
    return benchmark_split_of(demo.parent / "work", summary, "smoke")


def test_the_registered_champion_loads_by_uri_and_answers_over_http(smoke_run, tmp_path):
    import mlflow.pyfunc

    settings, summary, _, demo = smoke_run
    images, labels = _smoke_test_split(smoke_run)
    mlflow.set_tracking_uri(settings.mlflow_url)
    uri = "models:/tfopt-smoke@champion"
    champion = mlflow.pyfunc.load_model(uri)
    assert champion.metadata.metadata["class_names"] == sorted(
        p.name for p in demo.iterdir() if p.is_dir())
    scores = scores_of(champion.predict(images))
    assert scores.shape == (len(images), summary["dataset"]["classes"])
    reported = next(v for v in summary["variants"] if v["name"] == summary["champion"])
    assert np.mean(scores.argmax(1) == labels) == pytest.approx(reported["accuracy"], abs=0.01)

    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": settings.mlflow_url,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager",
             "local", "-h", "127.0.0.1", "-p", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not is_healthy(f"http://127.0.0.1:{port}/ping"):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        answer = _post(f"http://127.0.0.1:{port}/invocations",
                       {"inputs": images[:4].tolist()})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    np.testing.assert_allclose(answer["predictions"], scores[:4], atol=1e-5)


def test_variants_are_measured_on_the_machines_of_two_work_pools(smoke_run, tmp_path):
    """`tfopt benchmark --run --work-pool` x2: workers with their own threads and CPUs."""
    settings, summary, _, _ = smoke_run
    pipeline_run = summary["mlflow_run_id"]
    unknown = run_tfopt(settings, ["benchmark", "--run", pipeline_run, "--work-pool", "any",
                                   "--variant", "no-such-variant"], timeout_s=300)
    assert unknown.returncode == 2 and "not an ok variant" in unknown.stdout, unknown.stdout
    pools = {"one-core": ["--set", "benchmark.threads=1", "--set", "benchmark.cpus=[0]"],
             "two-threads": ["--set", "benchmark.threads=2"]}
    variants = ["baseline-xla"]  # one flow run per pool: a worker's process costs ~20 s
    command = ["benchmark", "--run", pipeline_run, "--work-dir", str(tmp_path / "work"),
               "--timeout", "900"]
    for pool in pools:
        command += ["--work-pool", pool]
    for variant in variants:
        command += ["--variant", variant]
    logs = {pool: tmp_path / f"worker-{pool}.log" for pool in pools}
    with ExitStack() as workers:
        for pool, settings_of_pool in pools.items():
            workers.enter_context(tfopt_process(
                settings, ["worker", "--pool", pool, *settings_of_pool], logs[pool],
                ready=lambda log=logs[pool]: "started" in log.read_text().lower()))
        completed = run_tfopt(settings, command, timeout_s=1200)
    assert completed.returncode == 0, (completed.stdout[-3000:] + completed.stderr[-3000:]
                                       + logs["one-core"].read_text()[-3000:])
    client = MlflowClient(settings.mlflow_url)
    measured = client.search_runs(
        [summary["mlflow_experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{pipeline_run}' "
                      "and tags.`tfopt.role` = 'machine-benchmark'")
    by_pool = {pool: {r.data.tags["tfopt.variant"]: r for r in measured
                      if r.data.tags["tfopt.machine"].endswith(f"({pool})")} for pool in pools}
    assert all(set(runs) == set(variants) for runs in by_pool.values()), by_pool
    pipeline = {v["name"]: v for v in summary["variants"]}
    for pool, threads, cpus in (("one-core", "1", "0"), ("two-threads", "2", "not pinned")):
        for name, run in by_pool[pool].items():
            tags, metrics = run.data.tags, run.data.metrics
            assert (tags["env.benchmark_threads"], tags["env.benchmark_cpus"]) == (threads, cpus)
            assert tags["env.cpu"] and tags["tfopt.status"] == "ok"
            # The same file on the same inputs: the same answers, wherever it runs.
            assert metrics["accuracy"] == pytest.approx(pipeline[name]["accuracy"], abs=0.01)
            assert metrics["latency_p50_ms"] > 0
        xla = by_pool[pool]["baseline-xla"].data.params
        assert (xla["format"], xla["runner.xla_mode"]) == ("xla", "jit_compile"), "run as XLA"
    report = {a.path for a in client.list_artifacts(pipeline_run, "report/machines")}
    assert {"report/machines/machines.md", "report/machines/machines.png",
            "report/machines/machines.json"} <= report
    table = json.loads((tmp_path / "work" / "machines" / pipeline_run / "machines.json")
                       .read_text())
    assert len(table["machines"]) == 3 and table["machines"][0].endswith("(pipeline run)")
    assert {row["variant"] for row in table["variants"]} == set(variants)
    assert "per machine" in completed.stdout.lower()
