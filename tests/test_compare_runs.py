"""A run says what changed since the last run of its config, beyond the measurement's noise."""

from __future__ import annotations

from tfopt.report.compare import (
    ACCURACY_TOLERANCE_POINTS,
    accuracy_noise_points,
    compare,
    markdown,
    markdown_moves,
    regression_lines,
    settle,
    to_confirm,
)


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
    assert {r["variant"] for r in since["regressions"]} == {"c", "d"}, "b waits for its check"
    assert [m["variant"] for m in to_confirm(since)] == ["b"]
    confirmed = settle(since, {"b": {
        "verdict": "confirmed", "rounds": 6, "previous_p50_ms": 2.0, "current_p50_ms": 2.5,
        "ratio": 1.25, "previous_interval": [1.95, 2.05], "current_interval": [2.45, 2.6],
        "round_ratios": [1.2, 1.3, 1.25, 1.2, 1.3, 1.25]}})
    assert {r["variant"] for r in confirmed["regressions"]} == {"b", "c", "d"}
    assert since["new_variants"] == ["new"] and since["gone_variants"] == ["gone"]
    text = "\n".join(markdown(confirmed))
    assert "- Champion: a -> new" in text and "- Regressions: 3" in text
    assert ("- b: p50 2.0000 -> 2.6000 ms, slower (1.30x), beyond both runs' intervals; minimum "
            "change 5.0% (no run-to-run spread measured yet): confirmed side by side in 6 "
            "alternating rounds: previous 2.0000 ms (1.9500-2.0500), this run's 2.5000 ms "
            "(2.4500-2.6000), 1.25x, slower in 6 of 6 rounds") in text
    assert "- c: accuracy 0.9700 -> 0.9600 (-1.00 points, noise 0.50)" in text
    assert "confirmed side by side" in regression_lines(confirmed)[0]


def test_a_run_like_the_last_one_reports_nothing_and_faster_is_no_regression():
    before = _summary(_entry("a", 1.0, (0.98, 1.02), accuracy=0.970))
    same = compare(before, _summary(_entry("a", 1.0, (0.99, 1.01), accuracy=0.972)))
    assert same["moves"] == [] and same["regressions"] == [] and not same["champion"]["changed"]
    assert "- No latency or accuracy move beyond the noise." in markdown(same)
    faster = compare(before, _summary(_entry("a", 0.5, (0.49, 0.51))))
    assert faster["moves"][0]["direction"] == "faster" and faster["regressions"] == []
    assert markdown(None)[-1].startswith("This is the first finished run")


def test_a_slowdown_within_the_run_to_run_spread_is_noise_and_others_wait_for_a_check():
    before = _summary(_entry("steady", 1.00, (0.99, 1.01)), _entry("noisy", 1.00, (0.99, 1.01)),
                      _entry("slower", 1.00, (0.99, 1.01)))
    after = _summary(_entry("steady", 1.04, (1.03, 1.05)), _entry("noisy", 1.09, (1.08, 1.10)),
                     _entry("slower", 1.09, (1.08, 1.10)))
    history = {"noisy": [0.95, 1.00, 1.04], "slower": [1.00, 1.01]}
    since = compare(before, after, history)
    verdicts = {m["variant"]: m["verdict"] for m in since["moves"]}
    assert verdicts == {"steady": "noise", "noisy": "noise", "slower": "to_confirm"}, \
        "under 5% always noise; 9% within a 9.5% spread"
    assert since["regressions"] == [], "nothing counts before its side-by-side check"
    assert "within run-to-run noise" in "\n".join(markdown(since))
    strict = compare(before, after, history, configured=0.2)
    assert [m["verdict"] for m in strict["moves"]] == ["noise"] * 3, "a configured minimum"
    cleared = settle(since, {"slower": {"verdict": "not_confirmed", "rounds": 6,
                                        "previous_p50_ms": 1.0, "current_p50_ms": 1.01,
                                        "ratio": 1.01, "previous_interval": [0.99, 1.02],
                                        "current_interval": [1.0, 1.02]}})
    assert cleared["regressions"] == []
    assert "NOT confirmed side by side" in "\n".join(markdown(cleared))


def test_a_previous_file_that_is_gone_leaves_the_stricter_rule():
    from tfopt.measurement.confirm import confirm_slowdown

    move = {"variant": "x", "ratio": 1.08, "minimum_change": 0.05}
    check = confirm_slowdown(move, None, None, None, None, "deleted")  # type: ignore[arg-type]
    assert check == {"verdict": "within_stricter_rule", "required_ratio": 1.1,
                     "reason": "deleted", "cut": False}
    assert confirm_slowdown({**move, "ratio": 1.3}, None, None, None, None)["verdict"] == \
        "stricter_rule"


def test_without_a_file_a_move_no_larger_than_one_this_run_cleared_is_not_counted():
    """effnet24 (AMD EPYC): six moves of 1.23-2.08x cleared side by side, one of 1.20x cut."""
    from tfopt.measurement.confirm import _largest_cleared, confirm_slowdown

    moves = [{"variant": name, "ratio": ratio, "minimum_change": 0.05, "verdict": "to_confirm",
              "what": "p50", "direction": "slower", "before": 1.0, "after": ratio}
             for name, ratio in (("onnx", 2.08), ("fp32", 1.79), ("onnx-int8", 1.20))]
    checks = {"onnx": {"verdict": "not_confirmed"}, "fp32": {"verdict": "confirmed"}}
    assert _largest_cleared(moves, checks) == 2.08
    assert _largest_cleared(moves, {"fp32": {"verdict": "confirmed"}}) is None
    cut = confirm_slowdown(moves[2], None, None, None, None, "cut", 2.08)  # type: ignore[arg-type]
    assert cut == {"verdict": "within_stricter_rule", "required_ratio": 1.1, "reason": "cut",
                   "cut": False, "cleared_ratio": 2.08}
    assert confirm_slowdown({**moves[2], "ratio": 2.09}, None, None, None, None, "cut",  # type: ignore[arg-type]
                            2.08)["verdict"] == "stricter_rule", "larger than any cleared"
    alone = confirm_slowdown(moves[2], None, None, None, None, "cut")  # type: ignore[arg-type]
    assert alone["verdict"] == "stricter_rule", "1.20x >= 1.10x with nothing cleared"
    since = settle({"moves": moves, "status_changes": [], "new_variants": [],
                    "gone_variants": [], "accuracy_tolerance_points": 0.5}, {
        **checks, "fp32": {**checks["fp32"], "rounds": 6, "round_ratios": [1.8] * 6,
                           "previous_p50_ms": 1.0, "current_p50_ms": 1.8, "ratio": 1.8,
                           "previous_interval": [1.0, 1.0], "current_interval": [1.8, 1.8]},
        "onnx": {**checks["onnx"], "rounds": 6, "round_ratios": [1.0] * 6,
                 "previous_p50_ms": 1.0, "current_p50_ms": 1.0, "ratio": 1.0,
                 "previous_interval": [1.0, 1.0], "current_interval": [1.0, 1.0]},
        "onnx-int8": cut})
    assert [r["variant"] for r in since["regressions"]] == ["fp32"]
    assert ("not a regression by the stricter rule (>= 1.10x and above the 2.08x move this run "
            "cleared side by side)") in "\n".join(markdown_moves(since))


def test_checks_the_time_budget_leaves_no_room_for_are_not_started_and_said_as_cut(tmp_path):
    import time

    from tfopt.artifacts import VariantResult
    from tfopt.measurement.confirm import confirm_all
    from tfopt.schedule.budget import CUT_BY_BUDGET, confirmation_cuts

    moves = [{"variant": name, "ratio": ratio, "minimum_change": 0.05, "verdict": "to_confirm",
              "what": "p50", "direction": "slower", "before": 1.0, "after": ratio}
             for name, ratio in (("a", 1.08), ("b", 1.3))]
    results = [VariantResult(name=name, source="baseline", format="tflite", precision="int8",
                             status="ok", path=tmp_path / f"{name}.tflite") for name in "ab"]
    # Nothing is downloaded or timed: the MLflow address is closed and the inputs are absent.
    checks = confirm_all(moves, "previous", "http://127.0.0.1:9", results, None, None,  # type: ignore[arg-type]
                         tmp_path, deadline=time.time() + 5.0, first_s=60.0)
    assert {name: check["verdict"] for name, check in checks.items()} == {
        "a": "within_stricter_rule", "b": "stricter_rule"}
    assert all(check["reason"].startswith(CUT_BY_BUDGET) and check["cut"]
               for check in checks.values())
    since = settle({"moves": moves, "status_changes": []}, checks)
    assert [r["variant"] for r in since["regressions"]] == ["b"]
    assert "not timed side by side (cut by the time budget" in "\n".join(regression_lines(since))
    (cut,) = confirmation_cuts(since)
    assert cut.kind == "not_confirmed"
    assert cut.reason.startswith("2 slowdowns since the last run not timed side by side")
    assert confirmation_cuts(None) == [] and confirmation_cuts({"moves": moves}) == []


def test_the_largest_slowdowns_are_timed_first_so_a_budget_cut_leaves_the_smallest():
    before = _summary(*(_entry(name, 1.0, (0.98, 1.02)) for name in "abc"))
    after = _summary(_entry("a", 1.2, (1.18, 1.22)), _entry("b", 1.9, (1.88, 1.92)),
                     _entry("c", 1.5, (1.48, 1.52)))
    since = compare(before, after)
    assert [m["variant"] for m in since["moves"]] == ["a", "b", "c"]
    assert [m["variant"] for m in to_confirm(since)] == ["b", "c", "a"]


def test_the_side_by_side_check_opens_a_variant_folder_as_it_is_and_a_packaged_one_inside(
        tmp_path):
    from tfopt.artifacts import VariantResult
    from tfopt.measurement.confirm import _spec

    folder = tmp_path / "distilled-thinner-50-openvino-int8.openvino"
    folder.mkdir()
    (folder / "model.xml").write_text("<net/>")
    (folder / "model.bin").write_bytes(b"\0")
    result = VariantResult(name="distilled-thinner-50-openvino-int8", source="distilled",
                           format="openvino", precision="int8", status="ok", path=folder)
    assert _spec(result, folder, "previous").path == folder, "an OpenVINO model is a folder"
    tflite = tmp_path / "m.tflite"
    tflite.write_bytes(b"\0")
    assert _spec(result, tflite, "previous").path == tflite


def test_an_accuracy_move_counts_beyond_what_two_retrained_models_differ_by_on_the_test_split():
    before = _summary(_entry("a", 1.0, (0.98, 1.02), accuracy=0.9878),
                      _entry("b", 1.0, (0.98, 1.02), accuracy=0.9878))
    after = _summary(_entry("a", 1.0, (0.98, 1.02), accuracy=0.9757),
                     _entry("b", 1.0, (0.98, 1.02), accuracy=0.9300))
    small_split = compare(before, after)
    assert {m["variant"] for m in small_split["regressions"]} == {"a", "b"}, "no split size"
    demo_split = compare(before, {**after, "dataset": {"test_examples": 329}})
    (moved,) = demo_split["regressions"]
    assert moved["variant"] == "b" and moved["noise_points"] < -moved["points"], moved
    assert 2.0 < accuracy_noise_points(0.9878, 0.9757, 329) < 2.1, "a's 1.21 points are noise"
    assert accuracy_noise_points(0.98, 0.98, 100_000) == ACCURACY_TOLERANCE_POINTS


def test_a_slowdown_is_confirmed_round_by_round_not_by_intervals_a_slow_round_widens():
    """CI: one round the machine slowed read 3.7 ms for a 0.9 ms file; it slowed both files."""
    from tfopt.artifacts import Runoff
    from tfopt.measurement.confirm import side_by_side_verdict

    previous = [0.86, 0.90, 3.71, 0.95, 1.00, 1.05]
    slower = Runoff(rounds=6, round_p50_ms={"old": previous,
                                            "new": [4.60, 4.50, 5.33, 2.97, 4.70, 4.60]})
    check = side_by_side_verdict(slower, "old", "new", 0.05)
    assert check["current_interval"][0] < check["previous_interval"][1], "intervals overlap"
    assert check["verdict"] == "confirmed" and min(check["round_ratios"]) > 1.0
    same = Runoff(rounds=6, round_p50_ms={"old": previous,
                                          "new": [0.88, 0.89, 3.80, 0.94, 1.02, 1.04]})
    assert side_by_side_verdict(same, "old", "new", 0.05)["verdict"] == "not_confirmed"
    one_round_faster = Runoff(rounds=6, round_p50_ms={"old": previous,
                                                      "new": [1.5, 1.5, 3.0, 1.5, 1.6, 1.7]})
    assert side_by_side_verdict(one_round_faster, "old", "new", 0.05)["verdict"] == (
        "not_confirmed"), "5 of 6 rounds slower: two equal files do so 7 times in 64"
    twelve = one_round_faster.followed_by(slower.model_copy(
        update={"background_cores": 1.4, "under_load": True}))
    assert twelve.rounds == 12 and twelve.round_p50_ms["new"][6:] == slower.round_p50_ms["new"]
    assert twelve.under_load and twelve.background_cores == 1.4, "the busier part marks the whole"
    assert side_by_side_verdict(twelve, "old", "new", 0.05)["verdict"] == "confirmed", (
        "11 of 12: 13 times in 4096")
    assert side_by_side_verdict(one_round_faster.followed_by(one_round_faster), "old", "new",
                                0.05)["verdict"] == "not_confirmed", "10 of 12: 79 in 4096"
    barely = Runoff(rounds=6, round_p50_ms={"old": [1.0] * 6, "new": [1.02] * 6})
    assert side_by_side_verdict(barely, "old", "new", 0.05)["verdict"] == "not_confirmed"


def test_a_metric_that_is_no_share_moves_beyond_its_budget_in_its_own_direction():
    mae = {"metric": "mae", "amount": 0.02, "relative": True, "higher_is_better": False,
           "unit": "value", "described": "2% mae"}
    before = _summary(_entry("a", 1.0, (0.9, 1.1), accuracy=40.0),
                      _entry("b", 1.0, (0.9, 1.1), accuracy=40.0),
                      _entry("c", 1.0, (0.9, 1.1), accuracy=40.0))
    after = {**_summary(_entry("a", 1.0, (0.9, 1.1), accuracy=40.7),
                        _entry("b", 1.0, (0.9, 1.1), accuracy=41.0),
                        _entry("c", 1.0, (0.9, 1.1), accuracy=38.0)), "metric_budget": mae}
    since = compare(before, after)
    moves = {m["variant"]: m for m in since["moves"]}
    assert sorted(moves) == ["b", "c"], "a's 0.7 is within 2% of 40"
    assert moves["b"]["direction"] == "worse" and moves["c"]["direction"] == "better"
    assert [r["variant"] for r in since["regressions"]] == ["b"], "a lower MAE is no regression"
    assert regression_lines(since) == [
        "- b: mae 40 -> 41 (worse, +1, beyond the budget's 0.8)"]


def test_a_metric_against_a_floor_moves_when_the_floor_is_crossed():
    snr = {"metric": "snr_db", "amount": 30.0, "relative": False, "bound": True,
           "higher_is_better": True, "unit": "dB", "described": "snr_db at least 30 dB"}
    before = _summary(_entry("a", 1.0, (0.9, 1.1), accuracy=45.0),
                      _entry("b", 1.0, (0.9, 1.1), accuracy=45.0),
                      _entry("c", 1.0, (0.9, 1.1), accuracy=28.0))
    after = {**_summary(_entry("a", 1.0, (0.9, 1.1), accuracy=31.0),
                        _entry("b", 1.0, (0.9, 1.1), accuracy=29.0),
                        _entry("c", 1.0, (0.9, 1.1), accuracy=33.0)), "metric_budget": snr}
    moves = {m["variant"]: m for m in compare(before, after)["moves"]}
    assert sorted(moves) == ["b", "c"], "a's 14 dB is still above the floor"
    assert moves["b"]["direction"] == "worse" and moves["c"]["direction"] == "better"
