"""The baseline's forms measured breadth-first, and those that would starve the compression wait."""

import time
from pathlib import Path

from flows.measurements import Measurements, first_round, in_plan_order
from flows.parameters import PipelineConfig
from tfopt.artifacts import BenchmarkInputs, ModelArtifact, VariantResult, VariantSpec
from tfopt.measurement.champion import is_peer
from tfopt.runtimes import plan_forms, plan_variant, runtime_of
from tfopt.runtimes.base import PlanRequest
from tfopt.schedule.budget import CUT_BY_BUDGET, Budget, MeasurementCosts
from tfopt.variants import breadth_first, skipped


def _demo_forms():
    config = PipelineConfig.model_validate({"name": "m", "convert": {
        "tflite": ["fp32", "dynamic", "int8"], "xla": ["jit_compile"], "onnx": True},
        "runtimes": {"openvino": {"precisions": ["fp32", "int8"]}}})
    forms = plan_forms(PlanRequest(source="baseline", kind="keras"), config)
    return [spec for spec in forms if spec.status == "ok"]


def test_each_runtime_gets_its_first_form_measured_before_any_gets_its_second():
    forms = _demo_forms()
    runtime = lambda spec: runtime_of(spec.format).name  # noqa: E731
    ordered = breadth_first(forms, runtime, "baseline-tflite-int8")
    assert ordered[0].name == "baseline-tflite-int8", "the speedup reference leads"
    runtimes = {runtime(spec) for spec in forms}
    assert len(runtimes) >= 3
    assert {runtime(spec) for spec in ordered[:len(runtimes)]} == runtimes
    assert sorted(s.name for s in ordered) == sorted(s.name for s in forms)
    for name in runtimes:
        assert [s.name for s in ordered if runtime(s) == name and s.name != ordered[0].name] \
            == [s.name for s in forms if runtime(s) == name and s.name != ordered[0].name]
    shuffled = [VariantResult(name=s.name, source=s.source, format=s.format,
                              precision=s.precision, status="skipped") for s in ordered]
    assert [r.name for r in in_plan_order(forms, shuffled)] == [s.name for s in forms]


def test_a_form_its_build_timed_faster_than_the_reference_is_measured_in_the_first_round():
    from tfopt.variants import QUICK_SPEEDUP

    selective = plan_variant("baseline", "tflite", "int8", form="tflite-selective")
    forms = [spec for spec in _demo_forms() if spec.name != selective.name]
    runtimes = len({runtime_of(spec.format).name for spec in forms})

    def ordered_with(speedup: float | None) -> list[VariantSpec]:
        spec = (skipped(selective, "not needed") if speedup is None
                else selective.model_copy(update={"params": {QUICK_SPEEDUP: speedup}}))
        return breadth_first([*forms, spec], lambda s: runtime_of(s.format).name,
                             "baseline-tflite-int8")

    ordered = ordered_with(1.4)
    first, rest = first_round(ordered)
    peers = [spec for spec in ordered[runtimes:] if is_peer(spec)]
    assert first[:runtimes] == ordered[:runtimes], "each runtime's first form, as before"
    assert {spec.name for spec in first[runtimes:]} == {selective.name} | {s.name for s in peers}
    assert rest == [spec for spec in ordered[runtimes:]
                    if spec.name != selective.name and spec not in peers]
    for other in (ordered_with(0.9), ordered_with(None)):
        assert first_round(other) == (other[:runtimes] + peers,
                                      [s for s in other[runtimes:] if s not in peers])


def test_the_peers_each_runtimes_one_call_int8_and_xla_are_measured_in_the_first_round():
    forms = [*_demo_forms(), plan_variant("baseline", "xla", form="xla-autocluster"),
             plan_variant("baseline", "tflite", "int8", form="tflite-selective"),
             plan_variant("channels-50", "tflite", "int8")]
    peers = {spec.name for spec in forms if is_peer(spec)}
    assert peers == {"baseline-tflite-int8", "baseline-onnx-int8", "baseline-openvino-int8",
                     "baseline-xla"}, "not dynamic, selective, auto-clustered or compressed"
    ordered = breadth_first(forms, lambda spec: runtime_of(spec.format).name,
                            "baseline-tflite-int8")
    first, rest = first_round(ordered)
    assert peers <= {spec.name for spec in first}
    assert not peers & {spec.name for spec in rest}
    assert not {spec.name for spec in first} - peers - {
        spec.name for spec in ordered[:len({runtime_of(s.format).name for s in forms})]}


def _measurements(started: float) -> Measurements:
    costs = MeasurementCosts()
    costs.add("tflite", 8.0)
    costs.add("graph", 12.0)
    budget = Budget(minutes=5.0, compressed_variants=10, started=started)
    bench = Measurements(PipelineConfig.model_validate({"name": "m"}), budget)
    bench.ledger.costs = costs
    return bench


def test_forms_that_would_leave_the_techniques_less_than_their_shortest_runs_wait():
    forms = [plan_variant("baseline", "graph"), plan_variant("baseline", "xla"),
             plan_variant("baseline", "savedmodel")]
    compressed = ["tflite"] * 10
    # 10 compressed variants at 1.5 + 8 s and the finish leave the compression until about
    # +3m02s; with 2m30s gone the three TensorFlow forms (about 37 s) would take all of it.
    late = _measurements(time.time() - 150.0)
    assert late.would_starve(forms, compressed, needed_s=20.0)
    assert not late.would_starve([], compressed, needed_s=20.0)
    assert not _measurements(time.time()).would_starve(forms, compressed, needed_s=20.0)
    unbounded = Measurements(PipelineConfig.model_validate({"name": "m"}), Budget(minutes=None))
    assert not unbounded.would_starve(forms, compressed, needed_s=20.0)


def test_waiting_forms_the_time_left_cannot_hold_are_cut_with_their_reason(tmp_path: Path):
    over = _measurements(time.time() - 400.0)
    over.waiting = [plan_variant("baseline", "graph"), plan_variant("baseline", "xla")]
    inputs = BenchmarkInputs(images=tmp_path / "images.npy", labels=tmp_path / "labels.npy",
                             reference_logits=None, examples=10)
    rows = over.later(inputs)
    assert [row.name for row in rows] == ["baseline-graph", "baseline-xla"]
    assert all(row.status == "skipped" and row.error.startswith(CUT_BY_BUDGET) for row in rows)
    assert over.cuts.lines() == ["baseline-graph, baseline-xla not measured: their time went "
                                 "to the compression"]
    assert [cut.kind for cut in over.cuts] == ["not_measured"]
    assert over.waiting == [] and over.later(inputs) == []


def test_the_finish_is_priced_for_the_variants_it_will_package():
    from tfopt.schedule.budget import FINISH_S, ModelSizes

    planned = Budget(minutes=25.0, baseline_variants=4, compressed_variants=6)
    bench = Measurements(PipelineConfig.model_validate({"name": "m"}), planned.with_builds(
        10.0, 4, ModelSizes(model_bytes=20_000_000)))
    per_variant = bench.budget.package_s
    assert bench.budget.finish_s == FINISH_S + 10 * per_variant > FINISH_S
    measured = [VariantResult(name=f"baseline-{n}", source="baseline", format="tflite",
                              precision="fp32", status=status)
                for n, status in enumerate(["ok", "ok", "failed"])]
    built = [plan_variant("qat", "tflite", "int8"),
             skipped(plan_variant("distilled", "tflite", "int8"), "cut by the time budget")]
    bench.waiting = [plan_variant("baseline", "xla")]
    bench.finish_for(measured, built)
    assert bench.budget.finish_s == FINISH_S + 4 * per_variant, (
        "two measured, one built and one waiting: the failed and the skipped are not packaged")


def _pruned_and_qat(epochs: int) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "m", "compress": {
        "prune": {"enabled": True, "epochs": epochs}, "qat": {"enabled": True, "epochs": epochs}}})


def _forms_of(config: PipelineConfig, baseline: ModelArtifact,
              ) -> tuple[list[VariantSpec], set[str]]:
    """The baseline's planned forms, the first round's marked not built, and those names.

    Not built here (no files), the speedup reference does not lead. Each runtime's first form
    and the peers are taken as not buildable either: nothing is measured for real.
    """
    forms = plan_forms(PlanRequest(source=baseline.name, kind="keras"), config)
    ordered = breadth_first(forms, lambda spec: runtime_of(spec.format).name)
    unbuilt = {spec.name for spec in first_round(ordered, baseline.name)[0]}
    return ([skipped(spec, "not built in this test") if spec.name in unbuilt else spec
             for spec in forms], unbuilt)


def test_a_run_out_of_time_narrows_the_compressed_forms_and_cuts_the_baseline_forms_waiting(
        tiny_baseline, tmp_path: Path):
    from compress import compressed_formats, plan

    config = _pruned_and_qat(epochs=2)
    forms, unbuilt = _forms_of(config, tiny_baseline)
    wide = len(compressed_formats(plan(config, tiny_baseline)))
    bench = _measurements(time.time() - 290.0)
    bench.config, bench.budget = config, bench.budget.model_copy(
        update={"compressed_variants": wide})
    inputs = BenchmarkInputs(images=tmp_path / "images.npy", labels=tmp_path / "labels.npy",
                             reference_logits=None, examples=10)
    rows = bench.baseline_first(tiny_baseline, forms, inputs)
    budget = bench.budget
    assert len(rows) == len(unbuilt) and all(row.status == "skipped" for row in rows)
    assert bench.config.compress.forms == "tflite_int8"
    narrow = compressed_formats(plan(bench.config, tiny_baseline))
    assert narrow == ["tflite"] * len(narrow) and budget.compressed_variants == len(narrow) < wide
    assert any("int8 TFLite file only" in cut for cut in bench.cuts.lines())
    waiting = [spec.name for spec in bench.waiting if spec.status == "ok"]
    assert waiting and len(waiting) + len(unbuilt) <= len(forms)
    later = bench.later(inputs)
    assert {row.name for row in later if row.status == "skipped"
            and row.error.startswith(CUT_BY_BUDGET)} == set(waiting)


def test_a_run_with_room_for_the_tflite_pair_narrows_to_it_not_to_int8_alone(
        tiny_baseline, tmp_path: Path, prefect_client):
    """Every form would starve the techniques, the int8 and fp32 TFLite files would not.

    int8 is not the faster file everywhere: narrowed to it alone, a thinned network whose fp32
    file is the fast one (an Intel Xeon with AMX) would never have that file built. The forms
    it measures take the machine's benchmark slot on the session's Prefect server (not a
    temporary one started for the test, which can take longer than Prefect waits for it).
    """
    from compress import compressed_formats, plan
    from tfopt.models.baseline import epoch_seconds
    from tfopt.runtimes import with_forms

    config = _pruned_and_qat(epochs=2)
    forms, _ = _forms_of(config, tiny_baseline)
    every = compressed_formats(plan(config, tiny_baseline))
    pair = compressed_formats(plan(with_forms(config, "tflite"), tiny_baseline))
    assert len(pair) < len(every)
    bench = _measurements(time.time())
    bench.config, bench.budget = config, bench.budget.model_copy(
        update={"compressed_variants": len(every)})
    shortest_s = bench.shortest_runs_s(plan(config, tiny_baseline),
                                        epoch_seconds(tiny_baseline), None)

    def window(formats: list[str]) -> float:
        cost = (bench.ledger.costs.expected(formats, profiled=False)
                + len(formats) * bench.budget.timing_s)
        return bench.budget.with_compressed(len(formats)).window_after(0.0, cost)

    gap = window(pair) - window(every)
    assert gap > 2.0, "the test needs room between the two"
    # Started so that the pair's window ends halfway past the techniques' shortest runs.
    bench.budget = bench.budget.model_copy(update={
        "started": bench.budget.started + shortest_s + gap / 2 - window(pair)})
    assert window(every) < shortest_s < window(pair)
    inputs = BenchmarkInputs(images=tmp_path / "images.npy", labels=tmp_path / "labels.npy",
                             reference_logits=None, examples=10)
    bench.baseline_first(tiny_baseline, forms, inputs)
    budget = bench.budget
    assert bench.config.compress.forms == "tflite"
    narrow = plan(bench.config, tiny_baseline)
    assert sorted({spec.precision for p in narrow for spec in p.variants}) == ["fp32", "int8"]
    assert compressed_formats(narrow) == pair and budget.compressed_variants == len(pair)
    assert any("int8 and fp32 TFLite files only" in cut for cut in bench.cuts.lines()), (
        bench.cuts.lines())


def test_past_the_first_round_forms_wait_while_the_techniques_would_miss_their_full_runs(
        tiny_baseline, tmp_path: Path):
    from compress import compressed_formats, plan, priced_runs
    from tfopt.models.baseline import epoch_seconds
    from tfopt.schedule.prices import full_runs_s

    config = _pruned_and_qat(epochs=60)
    forms, unbuilt = _forms_of(config, tiny_baseline)
    plans, epoch_s = plan(config, tiny_baseline), epoch_seconds(tiny_baseline)
    formats = compressed_formats(plans)
    full_s = full_runs_s(priced_runs(plans), epoch_s)
    bench = _measurements(time.time())
    bench.config, bench.budget = config, bench.budget.model_copy(
        update={"compressed_variants": len(formats)})
    shortest_s = bench.shortest_runs_s(plans, epoch_s, None)
    assert full_s > shortest_s + 20.0, "the test needs room between the two"
    compressed_s = (bench.ledger.costs.expected(formats, profiled=False)
                    + len(formats) * bench.budget.timing_s)
    # Started so that the compression's window falls halfway between the two.
    window = bench.budget.window_after(0.0, compressed_s)
    bench.budget = bench.budget.model_copy(update={
        "started": bench.budget.started + (shortest_s + full_s) / 2 - window})
    assert not bench.would_starve([], formats, shortest_s)
    assert bench.would_starve([], formats, full_s)
    inputs = BenchmarkInputs(images=tmp_path / "images.npy", labels=tmp_path / "labels.npy",
                             reference_logits=None, examples=10)
    rows = bench.baseline_first(tiny_baseline, forms, inputs)
    assert {row.name for row in rows} == unbuilt, "nothing past the first round measured now"
    assert bench.config.compress.forms != "tflite_int8", "the shortest runs fit: not narrowed"
    assert {spec.name for spec in bench.waiting} == {spec.name for spec in forms} - unbuilt
