"""The whole pipeline on the smoke config against real Prefect and MLflow servers."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.live import SMOKE_RUN_S
from tfopt.cpu_features import cpu_flags
from tfopt.runtimes import known_formats

# Read-only assertions on the session's smoke run (`smoke_run` in tests/conftest.py): the test
# that makes it, or waits for it, holds the run's time.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(SMOKE_RUN_S + 60)]
EXPECTED_OK = {
    "baseline-graph", "baseline-savedmodel", "baseline-xla", "baseline-xla-autocluster",
    "baseline-tflite-fp32", "baseline-tflite-dynamic", "baseline-tflite-float16",
    "baseline-tflite-int8", "baseline-onnx", "baseline-onnx-int8", "baseline-openvino",
    "baseline-openvino-int8",
}
EXPECTED_COMPRESSED = {"pruned-80-tflite-int8", "distilled-small-tflite-int8", "qat-tflite-int8"}
LATENCY_KEYS = {"p50", "p90", "p99", "mean", "std"}
VARIANT_KEYS = {"name", "format", "precision", "status", "error", "size_bytes", "gzip_bytes",
                "accuracy", "latency_ms", "throughput_per_s"}


def test_no_step_opens_the_deprecated_tflite_interpreter(smoke_run):
    """Only selective int8's layer search opens LiteRT's debugger (and its deprecated interpreter).

    The search runs when full int8 misses the budget on validation, which on the smoke's 45
    images is one image's luck either way; when it is not needed, nothing opens that interpreter
    (the first convolution kept in float for speed is quantized without it).
    """
    _, summary, stdout, demo = smoke_run
    (run_log,) = (demo.parent / "work" / "logs").glob("smoke-*.log")
    text = run_log.read_text()
    assert "oneDNN" in text, "the libraries' output is in the run's log"
    selective = next(v for v in summary["variants"]
                     if v["name"] == "baseline-tflite-selective-int8")
    searched = "layers by quantization damage" in text
    assert ("tf.lite.Interpreter is deprecated" in text) == searched, selective
    assert searched or selective["status"] in ("ok", "skipped"), selective
    assert "oneDNN" not in stdout and "is deprecated" not in stdout


def test_summary_has_the_contract_keys(smoke_run):
    settings, summary, stdout, _ = smoke_run
    assert {"mlflow_tracking_uri", "mlflow_run_id", "prefect_flow_run_id", "dataset",
            "input_pipeline", "variants", "champion"} <= set(summary)
    assert summary["mlflow_tracking_uri"] == settings.mlflow_url
    dataset = summary["dataset"]
    assert dataset["train_examples"] > dataset["test_examples"] > 0
    assert dataset["val_examples"] > 0 and dataset["shards"] >= 3
    assert dataset["skipped_records"] == 0
    pipeline = summary["input_pipeline"]
    assert {"naive_examples_per_s", "tuned_examples_per_s", "cached_examples_per_s",
            "chosen_batch_size"} <= set(pipeline)
    assert all(pipeline[k] > 0 for k in pipeline if k != "cache")
    by_name = {v["name"]: v for v in summary["variants"]}
    search = summary["search"]["channel_prune"]
    channels = ({f"channels-{round(search['chosen'] * 100)}-tflite-int8"}
                if search["chosen"] is not None else {"channels-auto-tflite-int8"})
    depth = {"depth-auto-tflite-int8"}
    assert not [name for name in by_name if name.endswith("-graph")
                and not name.startswith("baseline")], "smoke's compress.graph: false"
    # compress.float_stem is left to the run: where the baseline's int8 file was quicker with
    # its first convolution in float, every thinner model's int8 file gets that form too.
    stems = {name for name in by_name if name.endswith("-tflite-selective-int8")
             and not name.startswith("baseline-")}
    assert set(by_name) - stems == EXPECTED_OK | EXPECTED_COMPRESSED | channels | depth | {
        "baseline-tftrt-fp32", "baseline-tflite-selective-int8"}
    int8_files = {"distilled-small-tflite-int8"} | channels | depth
    if stems:
        assert by_name["baseline-tflite-selective-int8"]["status"] == "ok", stems
        assert {name.replace("-selective-int8", "-int8") for name in stems} == int8_files
        for name in stems:
            full_int8 = by_name[name.replace("-selective-int8", "-int8")]
            assert by_name[name]["derived_from"] == full_int8["derived_from"], name
    for name in depth:
        assert by_name[name]["status"] == "skipped", by_name[name]
        assert "depth_prune does not apply: no residual block" in by_name[name]["error"]
    assert len(summary["search"]["depth_prune"]["trials"]) == 1, "one refusal ends it"
    selective = by_name["baseline-tflite-selective-int8"]
    assert selective["status"] in ("ok", "skipped"), selective
    if selective["status"] == "skipped":
        assert "not needed: full int8 loses" in selective["error"]
        # smoke's convert.selective_float_stem: false: no stem tried
        assert "first convolution" not in selective["error"]
    assert summary["environment"]["cpu_features"]
    assert by_name["baseline-tftrt-fp32"]["status"] == "skipped"
    assert "TensorRT" in by_name["baseline-tftrt-fp32"]["error"]
    floors = {(v["format"], v["harness_floor_ms"]) for v in summary["variants"]
              if v["status"] == "ok" and v["format"] in ("tflite", "onnx")}
    assert len(floors) == 2, f"one floor measurement per runner and thread count: {floors}"
    for name in EXPECTED_OK:
        variant = by_name[name]
        assert set(variant) >= VARIANT_KEYS
        assert variant["status"] == "ok", variant
        assert set(variant["latency_ms"]) >= LATENCY_KEYS
        assert all(variant["latency_ms"][key] > 0 for key in LATENCY_KEYS)
        assert {"p95", "min", "max", "trimmed_mean", "cv", "stable"} <= set(variant["latency_ms"])
        assert variant["batch_throughput_per_s"] > 0 and variant["peak_rss_mb"] > 0
        assert variant["accuracy"] > 0.5, "the smoke baseline should learn the digits"
        assert variant["top1_agreement"] >= 0.9
        assert variant["harness_floor_ms"] > 0, name
        if variant["format"] in ("tflite", "onnx"):  # TensorFlow's per-call cost is the floor
            assert variant["harness_floor_ms"] < variant["latency_ms"]["p50"], name
        low, high = variant["latency_ms"]["p50_ci95"]
        assert low <= variant["latency_ms"]["p50"] <= high
        assert variant["gflops_per_inference"] > 0 and variant["achieved_gflops_per_s"] > 0
        profile = variant["op_profile"]
        assert profile["ops"], (name, profile["method"])
        assert all(0 <= op["share"] <= 1 for op in profile["ops"]), name
    contenders = [v["name"] for v in summary["variants"] if v.get("runoff_p50_ms")]
    if summary["runoff"]:
        assert sorted(contenders) == sorted(summary["runoff"]["round_p50_ms"])
        assert "run-off" in summary["champion_reason"]
        # smoke's runoff_threads: benchmark (the picks: test_a_runoff_times_the_contenders...)
        assert summary["runoff"]["threads"] == {}
        assert all(by_name[name]["runoff_threads"] is None for name in contenders)
    network = {by_name[name]["gflops_per_inference"] for name in EXPECTED_OK
               if by_name[name]["source"] == "baseline"}
    assert len(network) == 1, f"the baseline network counted differently by format: {network}"
    assert summary["environment"]["machine_peak_gflops"] > 0
    for name in EXPECTED_COMPRESSED:
        assert by_name[name]["status"] == "ok", by_name[name]
        assert set(by_name[name]["latency_ms"]) >= LATENCY_KEYS
    baseline = summary["baseline_accuracy"]
    assert by_name["qat-tflite-int8"]["accuracy"] >= baseline - 0.01, "QAT lost over 1 point"
    techniques = summary["techniques"]
    assert techniques["pruned-80"]["metrics"]["sparsity"] >= 0.78
    assert {"test_accuracy", "scratch_test_accuracy"} <= set(
        techniques["distilled-small"]["metrics"]
    )
    int8, fp32 = by_name["baseline-tflite-int8"], by_name["baseline-tflite-fp32"]
    assert int8["size_bytes"] <= 0.3 * fp32["size_bytes"]
    assert by_name["baseline-onnx"]["max_abs_diff"] < 1e-4
    assert by_name[summary["champion"]]["status"] == "ok"
    champion, speedup = by_name[summary["champion"]], summary["champion_speedup"]
    if champion["source"] != "baseline" and champion["format"] == "tflite":
        reference = by_name[champion["derived_from"]]
        assert speedup["reference"] == reference["name"] and speedup["side_by_side"], speedup
        assert speedup["reference_p50_ms"] == reference["runoff_p50_ms"], "its run-off figure"
        rounds = summary["runoff"]["round_p50_ms"]
        paired = [theirs / ours for theirs, ours in
                  zip(rounds[reference["name"]], rounds[champion["name"]], strict=True)]
        assert speedup["ratio"] == pytest.approx(float(np.median(paired)), abs=1e-3), (
            "the median of the rounds' ratios (with an even count of rounds, not the ratio of "
            "the two medians)")
    else:
        assert speedup is None, "a baseline form or a graph: no other model's form to beat"
    over_int8 = summary["champion_speedup_over_int8"]
    if summary["champion"] == int8["name"]:
        assert over_int8 is None
    else:
        assert over_int8["reference"] == int8["name"], over_int8
        if champion["runoff_p50_ms"] is not None:
            assert over_int8["side_by_side"], "the int8 file is in every run-off"
            assert over_int8["reference_p50_ms"] == int8["runoff_p50_ms"]
    peers = summary["champion_speedup_over_peers"]
    timed = {v["name"]: v["latency_ms"]["p50"] for v in summary["variants"]
             if v["status"] == "ok" and v["name"] in {"baseline-tflite-int8", "baseline-onnx-int8",
                                                      "baseline-openvino-int8", "baseline-xla"}}
    assert peers["peers_p50_ms"] == timed and len(timed) >= 3, (peers, timed)
    assert peers["reference"] == (summary["champion"] if summary["champion"] in timed
                                  else min(timed, key=timed.get))
    verdict = summary["accuracy_verdict"]
    assert verdict["judged_on"] == "validation", "the test split is read only for the figures"
    assert verdict["champion"]["val_accuracy"] >= (
        verdict["baseline"]["val_accuracy"] - 0.01 - 1e-9), "within the budget on validation"
    assert verdict["test_images"] == summary["dataset"]["test_examples"]
    low, high = verdict["champion"]["test_ci95"]
    assert low <= verdict["champion"]["test_accuracy"] <= high
    if summary["champion"] != verdict["baseline"]["name"]:
        paired = verdict["paired"]
        assert paired["images"] == verdict["test_images"] and 0 <= paired["mcnemar_p_value"] <= 1
        on_val = verdict["paired_on_validation"]
        assert on_val["images"] == summary["dataset"]["val_examples"]
        assert on_val["only_first_right"] - on_val["only_second_right"] == round(
            (verdict["champion"]["val_accuracy"] - verdict["baseline"]["val_accuracy"])
            * on_val["images"]), "the choice's evidence, image by image"
    assert all(v["val_accuracy"] is not None for v in summary["variants"]
               if v["status"] == "ok" and v["accuracy"] is not None)
    assert summary["environment"]["tf_intra_op_threads"] == 2, "smoke's benchmark.threads"
    assert by_name["pruned-80-tflite-int8"]["derived_from"] == "baseline-tflite-int8"
    runner = dict(by_name["baseline-openvino"]["runner"])
    held = runner.pop("amx_permitted", None)
    assert runner == {"inference_precision": "f32"}
    amx = summary["amx_decision"]
    assert summary["environment"]["benchmark_amx"] == amx["setting"] == "allowed", amx
    # smoke's amx: allowed, not timed (auto's timing: test_amx_auto_times_the_file_both_ways...)
    assert (amx["decided_by"], amx["timed"]) == ("config", None), amx
    if "amx_tile" in cpu_flags():
        # OpenVINO asks for AMX only when its kernels want it: allowed may still read false.
        assert held in {"true", "false"}, amx
    else:
        assert held is None, amx
    assert by_name["baseline-openvino-int8"]["runtime"] == "openvino"
    for name in ("baseline-tflite-fp32", "baseline-tflite-int8"):
        by_api = by_name[name]["latency_ms_by_api"]
        assert set(by_api) == {"interpreter", "compiled_model"}, name
        assert by_api["interpreter"]["p50"] == by_name[name]["latency_ms"]["p50"]
    # XNNPACK takes every op of the float file; the int8 file's may leave some to LiteRT.
    assert by_name["baseline-tflite-fp32"]["runner"]["compiled_model.fully_accelerated"] == "true"
    assert by_name["baseline-xla"]["derived_from"] == "baseline-graph"
    assert techniques["distilled-small"]["params"]["learning_rate"] == 0.003
    assert techniques["pruned-80"]["params"]["input.random_crop_min_area"] == 1.0, "smoke's"
    assert "Prefect UI" in stdout and "MLflow UI" in stdout
    (line,) = [line for line in stdout.splitlines() if line.startswith("champion: ")]
    assert f" {len(summary['champion_speedup_over_peers']['peers_p50_ms'])} peers" in line, line


def test_the_runs_finish_is_kept_for_the_next_runs_budget(smoke_run):
    """What the run-off, the MLflow models and the report took, for the next run to keep."""
    from tfopt.schedule.learned_costs import COSTS_FILE, FINISH

    _, summary, _, demo = smoke_run
    book = json.loads((demo.parent / "work" / COSTS_FILE).read_text())
    (kept,) = book.values()
    (finish,) = kept[FINISH]
    assert 0.0 < finish["seconds"] < 600.0, finish
    assert summary["budget"]["learned_finish_s"] is None, "the first run of its key"
    assert summary["budget"]["cuts"] == summary["budget"]["cut_steps"] == [], "no budget, no cut"


def test_mlflow_holds_the_parent_run_and_one_child_per_variant(smoke_run):
    settings, summary, _, _ = smoke_run
    client = MlflowClient(settings.mlflow_url)
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["train.epochs"] == "30"
    training = summary["baseline_training"]
    assert parent.data.params["baseline.epochs_run"] == str(training["epochs_run"])
    assert parent.data.params["baseline.stop_reason"] == training["stop_reason"]
    assert parent.data.tags["tfopt.baseline_health"] == training["health"]["status"]
    assert parent.data.tags["tfopt.benchmark_amx"] == summary["amx_decision"]["setting"]
    assert (("amx_denied_speedup" in parent.data.metrics)
            == (summary["amx_decision"]["denied_speedup"] is not None))
    assert training["health"]["val_accuracy"] is not None, "judged on its validation split"
    assert parent.data.tags["tfopt.champion"] == summary["champion"]
    picked = (summary["champion_speedup_over_int8"] or summary["champion_speedup"] or {}).get(
        "champion_threads")
    assert parent.data.tags.get("tfopt.champion.threads") == (
        None if picked is None else str(picked)), "the count its model serves with"
    peers = summary["champion_speedup_over_peers"]
    assert parent.data.metrics["champion_speedup_over_peers"] == peers["ratio"]
    assert parent.data.tags["tfopt.champion.fastest_peer"] == peers["reference"]
    assert parent.data.tags["prefect.flow_run_id"] == summary["prefect_flow_run_id"]
    assert "mlflow.source.git.commit" in parent.data.tags
    assert {"dataset_train_examples", "dataset_shards", "input_tuned_examples_per_s",
            "pruned-80.sparsity"} <= set(parent.data.metrics)
    cpu = client.get_metric_history(parent.info.run_id, "system/cpu_utilization_percentage")
    memory = client.get_metric_history(parent.info.run_id, "system/system_memory_usage_megabytes")
    assert len(cpu) >= 3 and len(memory) == len(cpu), "sampled over the run (psutil)"
    assert all(0.0 <= point.value <= 100.0 for point in cpu) and memory[0].value > 0
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert parent.info.run_name == "smoke-small_cnn", "the config's name once"
    note = parent.data.tags["mlflow.note.content"]
    assert f"Champion: **{summary['champion']}**" in note and "| baseline-graph | ok |" in note
    assert "Runtimes side by side" in note and "Left out" not in note, note[-300:]
    (data_input,) = parent.inputs.dataset_inputs
    profile = json.loads(data_input.dataset.profile)
    assert profile["train_examples"] == summary["dataset"]["train_examples"]
    manifest = Path(summary["dataset"]["manifest"]).read_bytes()
    assert data_input.dataset.digest == hashlib.sha256(manifest).hexdigest()[:16]
    history = client.get_metric_history(parent.info.run_id, "train_loss")
    epochs = training["epochs_run"]
    assert len(history) == epochs and [m.step for m in history] == list(range(epochs))
    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.json", "report/report.csv", "report/report.md",
            "report/accuracy_vs_latency.png", "report/size.png",
            "report/latency_distributions.png", "report/batch_size_sweep.png"} <= report
    champion = client.get_model_version_by_alias("tfopt-smoke", "champion")
    assert champion.version == summary["champion_model"]["version"]
    champion_run = client.get_run(champion.run_id)
    assert champion_run.info.run_name == summary["champion"]
    judged = {a.path for a in client.list_artifacts(champion.run_id, "classes")}
    assert judged == {"classes/per_class.json", "classes/confusion_matrix.png"}
    by_class = {k: v for k, v in champion_run.data.metrics.items()
                if k.startswith("class_accuracy.")}
    assert by_class and all(0.0 <= v <= 1.0 for v in by_class.values()), by_class
    lost = summary["accuracy_verdict"]["classes_lost_most"]
    assert isinstance(lost, list) and all(c["delta_points"] < 0 for c in lost)
    assert ("Per class: " in note) or (f"Classes {summary['champion']} lost most" in note)
    assert champion_run.data.tags["tfopt.champion"] == "true"
    entry = next(v for v in summary["variants"] if v["name"] == summary["champion"])
    assert champion.tags["variant"] == entry["name"] and champion.tags["runtime"] == (
        entry["runtime"])
    assert champion.tags["precision"] == entry["precision"]
    assert champion.tags["accuracy"] == f"{entry['accuracy']:.4f}"
    assert champion.tags["dataset_digest"] == summary["dataset_digest"]
    assert {"p50_ms", "derived_from", "tfopt_version", "git_commit"} <= set(champion.tags)
    assert "Why it won: " + summary["champion_reason"] in champion.description
    assert summary["mlflow_run_id"] in champion.description, "a link to the parent run"
    model_id = champion_run.data.tags["tfopt.model_id"]
    assert model_id in (champion.model_id or champion.source), "from its LoggedModel"
    assert "Champions of tfopt pipeline runs" in client.get_registered_model(
        "tfopt-smoke").description
    parent_artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"dataset", "report", "models", "export"} <= parent_artifacts
    bundle = {a.path for a in client.list_artifacts(parent.info.run_id,
                                                     "export/baseline-tensorrt-bundle")}
    assert {"export/baseline-tensorrt-bundle/model.onnx",
            "export/baseline-tensorrt-bundle/trtexec.sh"} <= bundle
    nested = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    every_trial = [c for c in nested if c.data.tags.get("tfopt.role") == "search-trial"]
    trials = [t for t in every_trial if t.data.tags["tfopt.technique"] == "channel_prune"]
    (refused,) = [t for t in every_trial if t.data.tags["tfopt.technique"] == "depth_prune"]
    assert refused.data.tags["tfopt.status"] == "not_applicable", "a refused trial has its run"
    assert "no residual block" in refused.data.tags["tfopt.error"]
    children = [c for c in nested if c.data.tags.get("tfopt.role") != "search-trial"]
    assert sorted(c.info.run_name for c in children) == sorted(
        v["name"] for v in summary["variants"]
    )
    searched = summary["search"]["channel_prune"]["trials"]
    assert sorted(float(t.data.params["fraction"]) for t in trials) == sorted(
        t["params"]["fraction"] for t in searched), "each trial a nested run"
    assert {t.data.tags["tfopt.status"] for t in trials} == {t["status"] for t in searched}
    kept = summary["search"]["channel_prune"]["target_file_val_accuracy"]
    assert kept is not None and 0.0 < kept < 1.0, "the baseline's val accuracy less 1 point"
    for trial in searched:
        if trial["status"] == "ok":
            assert trial["file_val_accuracy"] >= kept, trial
            assert trial["speedup"] > 0, "timed side by side with baseline-tflite-int8"
        if trial["p50_ms"] is not None:
            files = {timed["name"]: timed for timed in trial["files"]}
            assert {name.rsplit("-", 1)[-1] for name in files} == {"int8", "fp32"}, trial
            assert files[trial["file"]]["p50_ms"] == trial["p50_ms"], "its figures: one file's"
    assert {t.data.metrics.get("speedup") for t in trials} == {
        t["speedup"] for t in searched}, "each trial's speed-up is its run's metric"
    for child in children:
        assert child.data.params["format"] in known_formats()
        if child.data.tags["tfopt.status"] != "ok":
            continue
        assert {"accuracy", "latency_p50_ms", "size_bytes", "gzip_bytes",
                "top1_agreement"} <= set(child.data.metrics)
        packaged = {a.path for a in client.list_artifacts(child.info.run_id, "model")}
        assert {"model/MLmodel", "model/labels.txt"} <= packaged, child.info.run_name


def _post(url: str, body: dict) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_prefect_shows_the_flow_run_its_subflow_and_their_task_runs(smoke_run):
    settings, summary, _, _ = smoke_run
    api = settings.prefect_api_url
    flow_run_id = summary["prefect_flow_run_id"]
    with urllib.request.urlopen(f"{api}/flow_runs/{flow_run_id}", timeout=10) as response:
        flow_run = json.load(response)
    assert flow_run["state_type"] == "COMPLETED"
    subflows = _post(f"{api}/flow_runs/filter",
                     {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}})
    assert [run["name"] for run in subflows] == ["compress-smoke"]
    assert subflows[0]["state_type"] == "COMPLETED"
    task_runs = _post(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [
        flow_run_id, subflows[0]["id"]]}}})
    names = {run["task_key"].rsplit("-", 1)[0] for run in task_runs}
    assert {"write_tfrecords", "measure_input_pipeline", "train_model", "export_savedmodel",
            "prepare_benchmark_inputs", "build_variant", "prune_model", "distill_model",
            "quantize_aware_train", "export_bundle",
            "benchmark_variant", "pick_champion", "sweep_batch_size", "measure_data_layout",
            "write_report"} <= names
    refused = [run for run in task_runs if run["name"].startswith("trial-depth_prune")]
    assert [(run["state_type"], run["state_name"]) for run in refused] == [
        ("COMPLETED", "Skipped")], "small_cnn: no residual block; not a failure"
    assert all(run["state_type"] == "COMPLETED" for run in task_runs), "no red in the UI"
    started = sorted((run["start_time"], run["name"]) for run in task_runs if run["start_time"])
    trials = [name for _, name in started if name.startswith("trial-channel_prune")]
    fine_tunes = [name for _, name in started
                  if name.split("-")[0] in ("prune_model", "distill_model", "quantize_aware_train")]
    order = [name for _, name in started]
    assert len(fine_tunes) == 3, fine_tunes
    assert all(order.index(trials[0]) < order.index(name) for name in fine_tunes), (
        "each search's first trial before the fine-tunings")
    assert all(order.index(name) < order.index(trial) for name in fine_tunes
               for trial in trials[1:]), "coverage before depth: no search deepens before"
