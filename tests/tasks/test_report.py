from __future__ import annotations

import csv
import json

from tasks.write_report import write_report
from tfopt.artifacts import DatasetArtifact, InputPipelineResult, LatencyStats, VariantResult
from tfopt.eval.metrics import accuracy_budget
from tfopt.report.diagnosis import diagnose
from tfopt.report.files import pareto_front
from tfopt.report.summary import build_summary


def _result(name, source, fmt, precision, p50, accuracy=0.95, size=1000, status="ok",
            stable=True, derived_from=None):
    latency = LatencyStats(p50=p50, p90=p50, p99=p50, mean=p50, std=0.0, min=p50, max=p50,
                           p95=p50, trimmed_mean=p50, cv=0.0, stable=stable)
    return VariantResult(name=name, source=source, format=fmt, precision=precision,
                         status=status, derived_from=derived_from, accuracy=accuracy,
                         size_bytes=size, gzip_bytes=size // 2,
                         latency_ms=latency if status == "ok" else None,
                         error=None if status == "ok" else "boom",
                         samples_ms=[p50, p50 * 1.1, p50 * 0.9] if status == "ok" else [])


RESULTS = [
    _result("baseline-graph", "baseline", "graph", "fp32", 1.0, size=4000),
    _result("baseline-xla", "baseline", "xla", "fp32", 1.5, size=4000,
            derived_from="baseline-graph"),
    _result("baseline-tflite-fp32", "baseline", "tflite", "fp32", 0.10, size=3000),
    _result("baseline-tflite-dynamic", "baseline", "tflite", "dynamic", 0.20, size=900,
            derived_from="baseline-tflite-fp32"),
    _result("baseline-tflite-int8", "baseline", "tflite", "int8", 0.05, accuracy=0.94,
            size=800, stable=False, derived_from="baseline-tflite-fp32"),
    _result("pruned-80-tflite-int8", "pruned-80", "tflite", "int8", 0.05, accuracy=0.90,
            size=800, derived_from="baseline-tflite-int8"),
    _result("pruned-80-graph", "pruned-80", "graph", "fp32", 1.2, size=4000,
            derived_from="baseline-graph"),
    _result("baseline-onnx", "baseline", "onnx", "fp32", 0, status="failed"),
]


def test_diagnosis_explains_slower_optimizations():
    notes = diagnose(RESULTS)
    assert any("slower than baseline-graph" in n and "XLA" in n for n in notes["baseline-xla"])
    assert any("dynamic-range" in n for n in notes["baseline-tflite-dynamic"])
    assert any("unstable" in n for n in notes["baseline-tflite-int8"])
    assert notes["baseline-tflite-fp32"] == []
    assert notes["pruned-80-tflite-int8"] == []
    assert any("slower than baseline-graph" in n and "sparsity" in n
               for n in notes["pruned-80-graph"])
    assert "baseline-onnx" not in notes


def test_the_reference_is_the_derived_from_field_not_the_name():
    renamed = [r.model_copy(update={"name": f"x{i}"}) for i, r in enumerate(RESULTS[:2])]
    assert diagnose(renamed) == {"x0": [], "x1": []}
    linked = [renamed[0], renamed[1].model_copy(update={"derived_from": "x0"})]
    assert any("slower than x0" in n for n in diagnose(linked)["x1"])


def test_pareto_front():
    points = [("a", 1.0, 0.9), ("b", 2.0, 0.95), ("c", 2.0, 0.9), ("d", 0.5, 0.8)]
    assert pareto_front(points) == {"a", "b", "d"}


def _dataset(tmp_path):
    (tmp_path / "m.json").write_text('{"shards": []}')
    return DatasetArtifact(root=tmp_path, manifest_path=tmp_path / "m.json",
                           class_names=["a", "b"], image_size=8, splits={
                               s: {"files": [], "examples": 1, "class_counts": {}}
                               for s in ("train", "val", "test")},
                           shards=3, skipped_records=0)


def _summary(tmp_path, results, champion, tied=None, runoff=None):
    dataset = _dataset(tmp_path)
    pipeline = InputPipelineResult(naive_examples_per_s=1, tuned_examples_per_s=2,
                                   cached_examples_per_s=3, chosen_batch_size=32,
                                   examples_measured=10)
    return build_summary(tracking_uri="http://x", experiment_id="1", run_id="r",
                         flow_run_id="f", dataset=dataset, input_pipeline=pipeline,
                         results=results, champion=champion, champion_reason="fastest",
                         baseline_accuracy=0.95, budget=accuracy_budget(1.0), tied=tied,
                         runoff=runoff)


def test_report_files_are_written_and_readable(tmp_path):
    summary = _summary(tmp_path, RESULTS, "baseline-tflite-int8", tied=["pruned-80-tflite-int8"])
    tied = {v["name"]: v["tied_with"] for v in summary["variants"] if v["tied_with"]}
    assert tied == {"baseline-tflite-int8": ["pruned-80-tflite-int8"],
                    "pruned-80-tflite-int8": ["baseline-tflite-int8"]}
    paths = write_report.fn(summary, RESULTS, tmp_path / "report")
    names = {p.name for p in paths}
    assert {"report.json", "report.csv", "report.md", "accuracy_vs_latency.png", "size.png",
            "latency_distributions.png"} <= names
    assert json.loads((tmp_path / "report" / "report.json").read_text())["champion"]
    rows = list(csv.DictReader((tmp_path / "report" / "report.csv").open()))
    assert [r["name"] for r in rows] == [r.name for r in RESULTS]
    assert rows[4]["tied_with"] == "pruned-80-tflite-int8"
    assert rows[-1]["status"] == "failed" and rows[-1]["error"] == "boom"
    assert rows[-1]["accuracy"] == rows[-1]["size_bytes"] == "", "not measured: no figures"
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "★ baseline-tflite-int8" in markdown and "| baseline-onnx | failed: boom" in markdown
    (failed_row,) = [line for line in markdown.splitlines()
                     if line.startswith("| baseline-onnx | failed")]
    assert set(failed_row.split(" | ")[2:-2]) == {"-"}, failed_row
    flags = next(v for v in summary["variants"] if v["name"] == "pruned-80-tflite-int8")["flags"]
    assert flags and "5.00 points" in flags[0]


def test_a_thread_sweep_gets_its_table_and_scaling_plot(tmp_path):
    swept = [result.model_copy(update={"p50_ms_by_threads": {1: 0.2, 2: 0.12}})
             for result in RESULTS[:3]]
    summary = _summary(tmp_path, swept, "baseline-tflite-fp32")
    assert summary["variants"][0]["p50_ms_by_threads"] == {"1": 0.2, "2": 0.12}
    names = {p.name for p in write_report.fn(summary, swept, tmp_path / "report")}
    assert "thread_scaling.png" in names
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| 1 thr | 2 thr |" in markdown and "| baseline-graph | 0.200 | 0.120 |" in markdown


def test_the_runoff_and_the_top_operators_get_their_tables(tmp_path):
    from tfopt.artifacts import OpProfile, OpTime, Runoff

    profile = OpProfile(method="ONNX Runtime profiler: kernel time per call", calls=50, ops=[
        OpTime(node="model/block0_conv/Conv2D", kind="Conv", ms=0.05, share=0.6),
        OpTime(node="model/fc/MatMul", kind="Gemm", ms=0.01, share=0.1)])
    results = [RESULTS[2].model_copy(update={"op_profile": profile}), *RESULTS[3:5]]
    runoff = Runoff(rounds=6, round_p50_ms={"baseline-tflite-fp32": [0.1, 0.11, 0.09] * 2,
                                            "baseline-tflite-int8": [0.06] * 6},
                    threads={"baseline-tflite-fp32": 2, "baseline-tflite-int8": 1},
                    thread_pick_p50_ms={"baseline-tflite-fp32": {1: 0.15, 2: 0.1},
                                        "baseline-tflite-int8": {1: 0.06, 2: 0.07}},
                    under_load=True, background_cores=0.84, load_retried=True)
    summary = _summary(tmp_path, results, "baseline-tflite-int8", runoff=runoff)
    entries = {v["name"]: v for v in summary["variants"]}
    assert entries["baseline-tflite-fp32"]["runoff_p50_ci95"] == [0.09, 0.11]
    assert entries["baseline-tflite-dynamic"]["runoff_p50_ms"] is None
    assert summary["runoff"]["rounds"] == 6
    assert entries["baseline-tflite-fp32"]["op_profile"]["ops"][0]["kind"] == "Conv"
    write_report.fn(summary, results, tmp_path / "report")
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert ("| baseline-tflite-fp32 | 0.1000 | 0.1000 | 0.0900–0.1100 "
            "| 2 (1: 0.1500, 2: 0.1000 ms) |") in markdown, "the count picked and the tried ones"
    assert entries["baseline-tflite-int8"]["runoff_threads"] == 1
    assert "**Under load**: other processes kept 0.84 cores busy" in markdown
    assert "block0_conv Conv 60%, 0.050 ms · fc Gemm 10%, 0.010 ms" in markdown


def test_the_run_description_keeps_the_verdicts_and_whole_sections_within_mlflows_limit(
        tmp_path):
    from tfopt.report.markdown import run_description

    summary = _summary(tmp_path, RESULTS, "baseline-tflite-int8")
    whole = run_description(summary, 8000)
    assert whole.startswith("# tfopt benchmark") and "Champion: **baseline-tflite-int8**" in whole
    assert "| ★ baseline-tflite-int8 | ok | 0.9400 | -1.00 | 0.050 | 0.8 |" in whole
    assert "| baseline-onnx | failed: boom | - | - | - | - |" in whole
    assert "Runtimes side by side" in whole and "Left out" not in whole
    assert whole.rstrip().endswith("report/ among this run's artifacts.")

    crowd = [*RESULTS, *(_result(f"extra-{i}-tflite-int8", f"extra-{i}", "tflite", "int8", 0.04)
                         for i in range(200))]
    crowded = run_description(_summary(tmp_path, crowd, "baseline-tflite-int8"), 8000)
    assert len(crowded) <= 8000
    assert "Left out here for length: the variants." in crowded
    assert "| extra-" not in crowded, "a section is kept whole or not at all"
    assert "Runtimes side by side" in crowded, "the sections after it still fit"


def test_the_description_keeps_the_comparison_with_the_last_run_before_its_list_of_moves(
        tmp_path):
    from tfopt.report.markdown import run_description

    moves = [{"what": "p50", "variant": f"extra-{i}", "before": 0.5, "after": 0.4,
              "direction": "faster", "ratio": 0.8} for i in range(120)]
    since = {"champion": {"changed": False, "before": "x", "after": "baseline-tflite-int8"},
             "previous_run_id": "r0", "data_changed": False, "regressions": [], "moves": moves,
             "accuracy_tolerance_points": 1.0, "status_changes": [], "new_variants": [],
             "gone_variants": []}
    summary = {**_summary(tmp_path, RESULTS, "baseline-tflite-int8"), "since_last_run": since}
    text = run_description(summary, 8000)
    assert len(text) <= 8000 and "Compared with run r0" in text
    assert "- Champion: unchanged (baseline-tflite-int8)" in text
    assert "| ★ baseline-tflite-int8 | ok |" in text and "Runtimes side by side" in text
    assert "extra-0" not in text
    assert "Left out here for length: the moves since the last run." in text


def test_amx_denied_to_the_measurements_is_said_where_files_are_served_from(tmp_path):
    """The report says how ``benchmark.amx`` was decided; the champion's card how to serve it."""
    from tfopt.measurement.amx import AmxDecision
    from tfopt.report.summary import champion_card

    decision = AmxDecision(setting="denied", decided_by="auto", timed="baseline-tflite-int8",
                           denied_speedup=1.2, round_ratios=[1.2, 1.2],
                           reason="AMX denied (benchmark.amx: auto): baseline-tflite-int8 ran "
                                  "1.20x as fast without it")
    summary = {**_summary(tmp_path, RESULTS, "baseline-tflite-int8"),
               "amx_decision": decision.model_dump(mode="json")}
    write_report.fn(summary, RESULTS, tmp_path / "report")
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert ("AMX denied (benchmark.amx: auto): baseline-tflite-int8 ran 1.20x as fast without "
            "it. Serve these files the same way") in markdown
    dataset, champion = _dataset(tmp_path), RESULTS[4]
    for held, said in (("false", True), ("true", False)):
        measured = champion.model_copy(update={"runner_params": {"amx_permitted": held}})
        tags, description = champion_card(measured, "fastest", 1.0, "http://x", dataset)
        assert ("deny_amx()" in description) is said and (tags.get("amx") == "denied") is said


def test_a_variant_beyond_a_metric_budget_is_flagged_in_that_metrics_direction():
    from tfopt.eval.metrics import MetricBudget, metric_named
    from tfopt.report.summary import variant_flags

    budget = MetricBudget(metric_named("mae"), 0.02, relative=True)
    assert variant_flags(40.7, 40.0, budget) == []
    assert variant_flags(38.0, 40.0, budget) == [], "a lower MAE is better, never flagged"
    assert variant_flags(41.0, 40.0, budget) == [
        "mae 41 is beyond the budget (2% mae) of the baseline's 40"]
    assert variant_flags(0.95, 0.97, accuracy_budget(1.0)) == [
        "accuracy drop 2.00 points exceeds the 1 budget"]


def test_variants_judged_against_the_baselines_own_outputs_read_as_margins_over_a_floor():
    from tfopt.config import EvalConfig
    from tfopt.report.summary import delta_cell, delta_header, variant_flags
    from tfopt.report.terminal import champion_line

    budget = EvalConfig(metric="fidelity").metric_budget(1.0, class_scores=False)
    assert variant_flags(42.8, 138.5, budget) == []
    assert variant_flags(25.0, 138.5, budget) == [
        "snr_db 25 dB misses the budget (snr_db at least 30 dB)"]
    summary = {"metric_budget": {"metric": "snr_db", "amount": 30.0, "bound": True,
                                 "higher_is_better": True, "unit": "dB",
                                 "described": budget.described()},
               "champion": "baseline-tflite-int8",
               "variants": [{"name": "baseline-tflite-int8", "accuracy": 42.8,
                             "metric_delta": -95.7}]}
    assert delta_header(summary) == "over 30"
    assert delta_cell(summary["variants"][0], summary) == "+12.8"
    assert delta_cell({"accuracy": None}, summary) == "-"
    assert ("snr_db 42.8 on test against the baseline's own outputs (budget snr_db at least "
            "30 dB)") in champion_line(summary)
