"""What `tfopt run` prints last: measured variants, the ones not measured, the verdict."""

from __future__ import annotations

from rich.console import Console

from tfopt.report.summary import accuracy_sentence
from tfopt.report.terminal import champion_line, measured_table, not_measured_lines, verdict_lines

LONG_REASON = ("distill: cut by the time budget: the fine-tunings' time was used before distill "
               "could start, and this reason is longer than any table cell would show")


def _variant(name: str, status: str = "ok", error: str | None = None, p50: float = 0.1,
             delta: float | None = 0.0) -> dict:
    return {"name": name, "status": status, "error": error, "accuracy": 0.98 if status == "ok"
            else None, "accuracy_delta_points": delta if status == "ok" else None,
            "latency_ms": {"p50": p50 if status == "ok" else None,
                           "p99": p50 * 2 if status == "ok" else None},
            "throughput_per_s": 1000.0, "size_bytes": 2048, "gzip_bytes": 1024}


def _summary(**changes) -> dict:
    summary = {
        "variants": [
            _variant("baseline-tflite-int8", p50=0.034),
            _variant("channels-50-tflite-int8", p50=0.014, delta=-0.91),
            _variant("distilled-small-tflite-fp32", "skipped", LONG_REASON),
            _variant("distilled-small-tflite-int8", "skipped", LONG_REASON),
            _variant("baseline-onnx", "failed", "ONNX check: max |Δp| 0.3 > 1e-4"),
        ],
        "champion": "channels-50-tflite-int8", "champion_reason": "fastest within the budget",
        "accuracy_budget_points": 1.0,
        "champion_speedup_over_int8": {"ratio": 2.455, "reference": "baseline-tflite-int8",
                                       "champion_p50_ms": 0.0137, "reference_p50_ms": 0.0336,
                                       "side_by_side": True, "champion_threads": 1,
                                       "reference_threads": 2},
        "budget": {"minutes": 5.0, "used_minutes": 3.48,
                   "cuts": ["distill (not started: cut by the time budget)"]},
        "prefect_flow_run_id": "f1", "mlflow_run_url": "http://127.0.0.1:5000/#/r/1",
        "report": "/w/runs/demo-1/report/report.md",
    }
    return {**summary, **changes}


def _text(renderable) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_table_holds_the_measured_variants_and_stars_the_champion():
    text = _text(measured_table(_summary()))
    assert "★ channels-50-tflite-int8" in text and "baseline-tflite-int8" in text
    assert "distilled-small" not in text and "baseline-onnx" not in text
    assert "-0.91" in text


def test_variants_not_measured_share_one_line_per_reason_said_whole_failures_first():
    lines = not_measured_lines(_summary())
    assert lines == [
        "failed: baseline-onnx: ONNX check: max |Δp| 0.3 > 1e-4",
        f"skipped: distilled-small-tflite-fp32, distilled-small-tflite-int8: {LONG_REASON}",
    ]


def test_the_verdict_says_the_speedup_over_int8_the_points_the_cuts_and_where_to_look():
    champion, budget, look = verdict_lines(_summary(), "http://127.0.0.1:4200")
    assert champion.startswith("champion: channels-50-tflite-int8, 2.46x the speed of "
                               "baseline-tflite-int8 (side by side")
    assert "-0.91 points against the baseline on test (budget 1 point)" in champion
    assert "0.0137 vs 0.0336 ms, at 1 vs 2 threads)" in champion, "each at its run-off pick"
    assert budget == ("time budget: 3.5 of 5 min used; cut: distill (not started: cut by the "
                      "time budget)")
    assert "Prefect UI http://127.0.0.1:4200/runs/flow-run/f1" in look
    assert "MLflow UI http://127.0.0.1:5000/#/r/1" in look and "report.md" in look


def test_the_verdict_without_a_champion_or_a_budget_says_so():
    champion, budget, _ = verdict_lines(
        _summary(champion="", champion_reason="no variant within 1.0 points", budget=None),
        "http://x")
    assert champion == "champion: none (no variant within 1.0 points)"
    assert budget == "time budget: none set"


def test_a_step_that_failed_after_the_measurements_is_one_line_before_the_budget():
    failures = [{"step": "report", "error": "OSError: [Errno 28] No space left on device"},
                {"step": "run-off", "error": "RuntimeError: its process died"}]
    champion, report, runoff, budget, _ = verdict_lines(
        {**_summary(), "late_failures": failures}, "http://x")
    assert champion.startswith("champion: ")
    assert report == "not finished: report: OSError: [Errno 28] No space left on device"
    assert runoff == "not finished: run-off: RuntimeError: its process died"
    assert budget.startswith("time budget: ")


def test_a_run_measured_with_amx_denied_says_how_to_serve_its_files():
    denied = {"setting": "denied", "decided_by": "auto", "timed": "baseline-tflite-int8",
              "denied_speedup": 1.8, "round_ratios": [1.8, 1.8],
              "reason": "AMX denied (benchmark.amx: auto): baseline-tflite-int8 ran 1.80x"}
    champion, amx, _, _ = verdict_lines({**_summary(), "amx_decision": denied}, "http://x")
    assert champion.startswith("champion: ")
    assert amx == ("AMX denied (benchmark.amx: auto): baseline-tflite-int8 ran 1.80x: serve the "
                   "same way: call tfopt.cpu_features.deny_amx() before the model loads")
    allowed = {**denied, "setting": "allowed"}
    assert len(verdict_lines({**_summary(), "amx_decision": allowed}, "http://x")) == 3


def test_a_champion_the_held_out_test_puts_significantly_beyond_the_budget_is_said_so():
    def verdict(champion_test: float, p_value: float) -> dict:
        return {"judged_on": "validation", "budget_points": 1.0, "test_images": 329,
                "champion": {"name": "channels-50-tflite-int8", "val_accuracy": 0.9848,
                             "test_accuracy": champion_test, "test_ci95": [0.926, 0.972]},
                "baseline": {"name": "baseline-graph", "val_accuracy": 0.9747,
                             "test_accuracy": 0.9818, "test_ci95": [0.961, 0.992]},
                "paired": {"first": "channels-50-tflite-int8", "second": "baseline-graph",
                           "images": 329, "only_first_right": 0, "only_second_right": 9,
                           "mcnemar_p_value": p_value},
                "paired_on_validation": {
                    "first": "channels-50-tflite-int8", "second": "baseline-graph",
                    "images": 395, "only_first_right": 7, "only_second_right": 3,
                    "mcnemar_p_value": 0.3438}}

    line = champion_line(_summary(accuracy_verdict=verdict(0.9544, 0.0039)))
    assert line.endswith("; on test the champion is 2.74 points below the baseline, beyond the "
                         "budget (McNemar p = 0.0039): the choice made on validation did not "
                         "hold on held-out images"), line
    sentence = accuracy_sentence(verdict(0.9544, 0.0039))
    assert ("validation split (channels-50-tflite-int8 0.9848, baseline-graph 0.9747; image by "
            "image, 7 only the champion got right, 3 only the baseline, McNemar p = 0.34); on "
            "329 held-out test images") in sentence, "the evidence the choice rested on"
    assert sentence.endswith("(McNemar p = 0.0039). On test the champion is 2.74 points below "
                             "the baseline, beyond the budget (McNemar p = 0.0039): the choice "
                             "made on validation did not hold on held-out images."), sentence
    assert "did not hold" not in champion_line(_summary(accuracy_verdict=verdict(0.9544, 0.2)))
    assert "did not hold" not in champion_line(_summary(accuracy_verdict=verdict(0.975, 0.01)))
