"""The time budget sizes each measurement to the time left and says what it cut, once."""

import re
import time

import pytest

from tfopt.artifacts import Cut
from tfopt.config import MeasurementProtocol
from tfopt.schedule.budget import (
    FINISH_S,
    LEAST_WORK_SHARE,
    MIN_TIMING_S,
    PROFILES,
    Budget,
    Cuts,
    FinishWatch,
    MeasurementCosts,
    ModelSizes,
)

PROTOCOL = MeasurementProtocol(min_seconds=1.0, max_seconds=4.0)


def _budget_ending_in(seconds: float) -> Budget:
    minutes = 10.0
    return Budget(minutes=minutes, started=time.time() + seconds - minutes * 60.0)


def test_without_a_budget_or_with_time_to_spare_the_protocol_is_kept():
    cuts = Cuts()
    assert Budget(minutes=None).measurement_protocol(PROTOCOL, 30, None, cuts) == PROTOCOL
    roomy = _budget_ending_in(FINISH_S + 30 * (4.0 + 5.0))
    assert roomy.measurement_protocol(PROTOCOL, 30, 30.0, cuts) == PROTOCOL
    assert not cuts


def test_short_of_time_the_timing_is_cut_to_the_share_left_and_said_once():
    budget, cuts = _budget_ending_in(FINISH_S + 10 * (2.0 + 1.0)), Cuts()
    first = budget.measurement_protocol(PROTOCOL, 10, 10.0, cuts)
    second = budget.measurement_protocol(PROTOCOL, 9, 9.0, cuts)
    assert MIN_TIMING_S <= first.max_seconds < 2.0 + 1e-6
    assert first.min_seconds <= first.max_seconds and not first.thread_sweep
    assert first.profile and second.max_seconds >= first.max_seconds - 0.1
    (cut,) = cuts
    assert cut.kind == "shortened" and cut.reason.startswith("benchmark timing cut to")


def test_out_of_time_the_profiles_go_too():
    budget, cuts = _budget_ending_in(FINISH_S), Cuts()
    protocol = budget.measurement_protocol(PROTOCOL, 10, None, cuts)
    assert protocol.max_seconds == MIN_TIMING_S and not protocol.profile
    assert [cut.step for cut in cuts] == ["benchmark timing", PROFILES]


def test_cheap_files_are_not_sized_by_the_dear_tensorflow_measurements_before_them():
    # The EfficientNetB0 minimal config (Intel Xeon): the baseline's TensorFlow variants cost
    # 30-40 s each beside their timing, its LiteRT files 5-7 s; sized by the mean of the first
    # ones, every file after them was timed 0.3 s and the run ended 8 minutes early.
    costs = MeasurementCosts()
    assert costs.expected(["tflite"]) is None
    for seconds in (38.0, 36.0, 37.0):
        costs.add("graph", seconds)
    assert costs.expected(["tflite", "graph"]) == 2 * costs.expected(["graph"])
    costs.add("tflite", 5.0)
    costs.add("tflite", 7.0)
    left = ["graph", *["tflite"] * 12, *["onnx"] * 4]
    assert costs.expected(left) == 37.0 + 12 * 6.0 + 4 * 37.0
    budget, cuts = _budget_ending_in(FINISH_S + 17 * (1.0 + 4.0) + costs.expected(left)), Cuts()
    assert budget.measurement_protocol(PROTOCOL, 17, costs.expected(left), cuts) == PROTOCOL
    mean_of_all = sum((38.0, 36.0, 37.0, 5.0, 7.0)) / 5
    assert budget.measurement_protocol(PROTOCOL, 17, 17 * mean_of_all, cuts) != PROTOCOL


def test_the_sweep_and_layout_end_early_in_the_baselines_share():
    budget = Budget(minutes=10.0, baseline_variants=5, compressed_variants=10)
    assert budget.started < budget.measuring_deadline < budget.baseline_deadline
    assert Budget(minutes=None).measuring_deadline is None


def test_the_measurements_are_sized_by_the_test_inputs_and_tensorflow_by_the_model():
    # Intel Xeon, 2 cores, 329 test images: a file's measurement 15-17 s at 160 px (101 MB of
    # inputs), 5.6-6.4 s at 64 px (16 MB) whatever the network; TensorFlow's 11 s for a 3.3 MB
    # SavedModel, 28-33 s for 11.9 and 20.9 MB; the finish 33-88 s.
    planned = Budget(minutes=30.0, baseline_variants=15, compressed_variants=10)
    small_images = planned.with_builds(30.0, 15, ModelSizes(
        model_bytes=20_900_000, input_bytes=16_200_000, tensorflow_variants=5))
    large_images = planned.with_builds(30.0, 15, ModelSizes(
        model_bytes=11_900_000, input_bytes=101_000_000, tensorflow_variants=4))
    assert 5.0 < small_images.measure_s < 7.0 < 14.0 < large_images.measure_s < 17.0
    assert 26.0 < small_images.measure_s + small_images.tensorflow_measure_s < 34.0
    assert 26.0 < large_images.measure_s + large_images.tensorflow_measure_s < 34.0
    assert FINISH_S < small_images.finish_s < 150.0 and FINISH_S < large_images.finish_s < 90.0
    assert large_images.compression_deadline < small_images.compression_deadline
    assert small_images.build_s == large_images.build_s == 2.0
    nothing = planned.with_builds(0.0, 0, ModelSizes())
    assert nothing.finish_s == FINISH_S and nothing.build_s == planned.build_s


def test_the_cuts_say_which_trainings_the_deadline_ended_and_how():
    from tfopt.schedule.budget import TRAINING_TIME_USED, budget_cuts

    baseline = {"stop_reason": f"budget: {TRAINING_TIME_USED}", "stopped_by": "budget",
                "epochs_run": 7}
    cooled = {"params": {"stop_reason": "recovered: ..., then 2 epochs cooling down",
                         "stopped_by": "recovered", "epochs_run": 5}}
    cooling = {"params": {"stop_reason": f"plateau: ..., then 1 epoch cooling down "
                                         f"({TRAINING_TIME_USED})",
                          "stopped_by": "budget_cooling", "epochs_run": 4}}
    cuts = budget_cuts(baseline, {"cooled": cooled, "cooling": cooling})
    assert [cut.reason for cut in cuts] == [
        "the baseline's training stopped after 7 epochs (time budget)",
        "cooling's fine-tuning stopped after 4 epochs (time budget), before its rate had "
        "cooled down to zero"]
    assert [(cut.step, cut.kind) for cut in cuts] == [
        ("the baseline's training", "stopped"), ("cooling's fine-tuning", "stopped")]


def test_the_ledger_keeps_one_cut_per_step_the_first_and_the_summary_says_each():
    first = Cut(step=PROFILES, kind="shortened", reason="profiles measured before the compression")
    cuts = Cuts([first, Cut(step="distill", kind="not_started", reason="distill: cut")])
    cuts.record(Cut(step=PROFILES, kind="shortened", reason="profiles left out"))
    assert cuts.lines() == ["profiles measured before the compression", "distill: cut"]
    said = Budget(minutes=5.0).summary(cuts)
    assert said["cuts"] == cuts.lines()
    assert said["cut_steps"] == [{"step": PROFILES, "kind": "shortened"},
                                 {"step": "distill", "kind": "not_started"}]


def test_a_format_not_measured_yet_is_priced_by_its_plan_as_far_over_as_the_dearest_measured():
    # bench.yaml on an AMD EPYC: the baseline's graph cost 46 s beside its timing (37 planned);
    # priced as dear, every file after it was timed 0.3 s and the run ended 4.5 minutes early.
    planned = Budget.planned(30.0, (15, 11), PROTOCOL).with_builds(30.0, 15, ModelSizes(
        model_bytes=11_900_000, input_bytes=101_000_000, tensorflow_variants=4))
    file_s, graph_s = planned.planned_measurement_s(False), planned.planned_measurement_s(True)
    assert graph_s == file_s + planned.tensorflow_measure_s and 10.0 < file_s < graph_s
    costs = MeasurementCosts(lambda variant_format: planned.planned_measurement_s(
        variant_format in {"graph", "xla"}))
    costs.add("graph", 1.25 * graph_s)
    assert costs.expected(["xla", "tflite"]) == 1.25 * graph_s + 1.25 * file_s
    costs.add("tflite", 0.5 * file_s)
    assert costs.expected(["onnx"]) == 1.25 * file_s, "the dearest over its plan"
    assert costs.expected(["tflite"]) == 0.5 * file_s, "measured: its own mean"


def test_the_clock_says_what_is_left_what_fits_and_why_a_step_is_cut():
    from tfopt.schedule.budget import CUT_BY_BUDGET, Clock

    unbounded = Clock()
    assert unbounded.left() is None and unbounded.can_start(1e9)
    assert unbounded.share(5.0, 50.0, 0.5) == unbounded
    clock = Clock(deadline=time.time() + 30.0)
    assert 29.0 < clock.left() <= 30.0
    assert clock.can_start(20.0) and not clock.can_start(45.0)
    assert re.match(rf"{CUT_BY_BUDGET}: [\d.]+ s were left for qat's fine-tuning, less than its "
                    r"shortest run \(45\.0 s\)", clock.cut("qat's fine-tuning", 45.0))
    assert "was used before qat could start" in Clock(deadline=time.time() - 1).cut("qat", 9.0)
    # Its own 5 s, then half of what the queue's 10 s leave of 30: 5 + 10 = 15 s.
    assert clock.share(5.0, 10.0, 0.5).left() == pytest.approx(15.0, abs=1.0)
    assert clock.share(5.0, 60.0, 0.5).left() == pytest.approx(5.0, abs=1.0), "its own first"
    assert clock.share(50.0, 0.0, 1.0).left() <= 30.0, "never past the deadline"


def test_measured_baseline_variants_price_the_compressed_ones_and_hand_back_the_guess():
    # The demo (AMD EPYC): the planned tail was 206 s, the measurements and finish took 140 s,
    # and the run ended a minute inside its budget with fine-tunings cut.
    planned = Budget.planned(5.0, (16, 19), PROTOCOL).with_builds(16.0, 16, ModelSizes(
        model_bytes=400_000, input_bytes=3_000_000, tensorflow_variants=5))
    cheap = planned.with_measured(19 * 3.0)
    assert cheap.compression_deadline > planned.compression_deadline
    assert cheap.compression_deadline == pytest.approx(
        planned.started + 300.0 - 19 * planned.build_s - 19 * 3.0 - planned.finish_s)
    dear = planned.with_measured(19 * 30.0)
    assert dear.compression_deadline == pytest.approx(
        planned.started + LEAST_WORK_SHARE * 300.0), "the work before keeps its least share"
    assert "priced by the baseline's measurements" in cheap.plan_line()
    assert Budget(minutes=None).with_measured(1.0).compression_deadline is None
    assert cheap.compressed_variant_s == pytest.approx(planned.build_s + 3.0), (
        "one variant's share of the tail: what a technique that builds none gives back")
    assert planned.compressed_variant_s == pytest.approx(planned.build_s + planned.measure_s)
    assert Budget(minutes=5.0).compressed_variant_s == 0.0, "no compressed variant planned"


def test_the_compression_window_shrinks_by_the_work_still_before_it():
    budget = Budget(minutes=5.0, compressed_variants=10, started=time.time() - 100.0)
    # The tail: 10 conversions at 1.5 s, 80 s of measurements and the finish.
    tail = 10 * budget.build_s + 80.0 + budget.finish_s
    assert budget.window_after(0.0, 80.0) == pytest.approx(300.0 - tail - 100.0, abs=1.0)
    assert budget.window_after(30.0, 80.0) == pytest.approx(300.0 - tail - 130.0, abs=1.0)
    assert budget.left_for_measurements() == pytest.approx(200.0 - budget.finish_s, abs=1.0)
    assert Budget(minutes=None).window_after(30.0, 80.0) is None
    assert Budget(minutes=None).left_for_measurements() is None


def test_fewer_compressed_variants_planned_shrink_the_finish_that_packages_them():
    planned = Budget(minutes=25.0, baseline_variants=16, compressed_variants=24)
    sized = planned.with_builds(60.0, 16, ModelSizes(model_bytes=21_000_000))
    narrowed = sized.with_compressed(6)
    assert sized.finish_s == pytest.approx(FINISH_S + 0.2 * 21.0 * 40)
    assert narrowed.compressed_variants == 6
    assert narrowed.finish_s == pytest.approx(FINISH_S + 0.2 * 21.0 * 22)
    assert planned.with_compressed(6).finish_s == FINISH_S, "not sized yet: the fixed part"
    assert narrowed.with_packaged(15).finish_s == pytest.approx(FINISH_S + 0.2 * 21.0 * 15)
    assert narrowed.with_packaged(15).with_packaged(20).finish_s == pytest.approx(
        FINISH_S + 0.2 * 21.0 * 20), "priced again, not compounded"


def test_the_baselines_training_is_not_cut_for_forms_the_run_would_narrow_away():
    """The demo's plan on a slow CPU: 19 compressed forms priced whole left the baseline 40 s."""
    planned = Budget.planned(5.0, (16, 19), PROTOCOL)
    narrowable = Budget.planned(5.0, (16, 19), PROTOCOL, least_compressed=7)
    assert narrowable.started + 60.0 < narrowable.baseline_deadline, "its share with int8 alone"
    assert planned.baseline_deadline - planned.started < narrowable.baseline_deadline - (
        narrowable.started) - 20.0
    assert narrowable.compression_deadline - narrowable.started == pytest.approx(
        planned.compression_deadline - planned.started, abs=0.01), "the rest as planned"
    few, fewer = (Budget.planned(5.0, (16, 5), PROTOCOL, least_compressed=least)
                  for least in (7, None))
    assert few.baseline_deadline - few.started == pytest.approx(
        fewer.baseline_deadline - fewer.started, abs=0.01), "never more variants than planned"


def test_a_learned_finish_is_kept_at_the_end_in_place_of_the_guess():
    """Runs priced at the guessed 20 s ended past their budget: the finish learned is kept."""
    guessed = Budget.planned(15.0, (16, 24), PROTOCOL)
    learned = Budget.planned(15.0, (16, 24), PROTOCOL, learned_finish_s=42.0)
    assert guessed.finish_s == FINISH_S and learned.finish_s == 42.0
    assert learned.compression_deadline == pytest.approx(
        guessed.compression_deadline - 22.0, abs=0.01), "the compression ends sooner"
    sizes = ModelSizes(model_bytes=5_000_000)
    sized = learned.with_builds(30.0, 16, sizes)
    assert sized.finish_s == pytest.approx(42.0 + 0.2 * 5.0 * 40), "packaging beside it"
    assert sized.with_packaged(10).finish_s == pytest.approx(42.0 + 0.2 * 5.0 * 10)
    assert "the finish (run-off, MLflow models, report) kept 42 s" in learned.plan_line()
    assert "the finish" not in guessed.plan_line()
    assert learned.summary(Cuts())["learned_finish_s"] == 42.0
    assert guessed.summary(Cuts())["learned_finish_s"] is None


def test_the_finish_watch_leaves_the_checks_since_the_last_run_out():
    watch = FinishWatch()
    time.sleep(0.05)
    with watch.excluding():
        time.sleep(0.3)
    assert 0.05 <= watch.seconds() < 0.25
    with pytest.raises(RuntimeError), watch.excluding():
        time.sleep(0.2)
        raise RuntimeError("a failed check is left out too")
    assert watch.seconds() < 0.25
