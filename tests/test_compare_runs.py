"""A run says what changed since the last run of its config, beyond the measurement's noise."""

from __future__ import annotations

from tfopt.report.compare import compare, markdown


def _entry(name: str, p50: float, interval: tuple[float, float], accuracy: float = 0.97,
           status: str = "ok", error: str | None = None) -> dict:
    return {"name": name, "status": status, "error": error, "accuracy": accuracy,
            "latency_ms": {"p50": p50, "p50_ci95": list(interval)}}


def _summary(*variants: dict, champion: str = "a", digest: str = "d1") -> dict:
    return {"mlflow_run_id": "r1", "champion": champion, "dataset_digest": digest,
            "variants": list(variants)}


def test_only_moves_beyond_both_intervals_and_the_accuracy_tolerance_count():
    before = _summary(_entry("a", 1.00, (0.98, 1.02)), _entry("b", 2.0, (1.9, 2.1)),
                      _entry("c", 3.0, (2.9, 3.1), accuracy=0.970),
                      _entry("d", 1.0, (0.9, 1.1)), _entry("gone", 1.0, (0.9, 1.1)))
    after = _summary(_entry("a", 1.01, (0.99, 1.03)), _entry("b", 2.6, (2.5, 2.7)),
                     _entry("c", 3.0, (2.9, 3.1), accuracy=0.960),
                     _entry("d", 0.0, (0.0, 0.0), status="failed", error="onnx check"),
                     _entry("new", 1.0, (0.9, 1.1)), champion="new", digest="d2")
    since = compare(before, after)
    assert since["champion"] == {"before": "a", "after": "new", "changed": True}
    assert since["data_changed"]
    assert [(m["variant"], m["what"], m["direction"]) for m in since["moves"]] == [
        ("b", "p50", "slower"), ("c", "accuracy", "lower")], "a's overlap is noise"
    assert since["status_changes"] == [{"variant": "d", "before": "ok", "after": "failed",
                                        "error": "onnx check"}]
    assert {r["variant"] for r in since["regressions"]} == {"b", "c", "d"}
    assert since["new_variants"] == ["new"] and since["gone_variants"] == ["gone"]
    text = "\n".join(markdown(since))
    assert "- Champion: a -> new" in text and "- Regressions: 3" in text
    assert "- b: p50 2.0000 -> 2.6000 ms, slower (1.30x), beyond both runs' intervals" in text
    assert "- c: accuracy 0.9700 -> 0.9600 (-1.00 points)" in text


def test_a_run_like_the_last_one_reports_nothing_and_faster_is_no_regression():
    before = _summary(_entry("a", 1.0, (0.98, 1.02), accuracy=0.970))
    same = compare(before, _summary(_entry("a", 1.0, (0.99, 1.01), accuracy=0.972)))
    assert same["moves"] == [] and same["regressions"] == [] and not same["champion"]["changed"]
    assert "- No latency or accuracy move beyond the noise." in markdown(same)
    faster = compare(before, _summary(_entry("a", 0.5, (0.49, 0.51))))
    assert faster["moves"][0]["direction"] == "faster" and faster["regressions"] == []
    assert markdown(None)[-1].startswith("This is the first finished run")
