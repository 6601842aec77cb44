"""The compression's plan: said before any technique starts, coverage before depth, typed ends."""

import time

from compress import plan
from compress.planner import Planner
from flows.parameters import PipelineConfig
from tasks.run_trial import run_trial


def _config(**benchmark: object) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "plan", "benchmark": benchmark, "compress": {
        "channel_prune": {"enabled": True, "fraction": "auto", "epochs": 2},
        "distill": {"enabled": True, "epochs": 2},
        "qat": {"enabled": True, "epochs": 2},
        "prune": {"enabled": True, "epochs": 2}}})


def _budgeted(config: PipelineConfig, tiny_baseline, tiny_data, tmp_path,
              deadline: float) -> Planner:
    """A planner whose compression ends at `deadline`, 10 s kept per variant, 0.95 to keep."""
    data = tiny_data.model_copy(update={"deadline": deadline, "variant_tail_s": 10.0,
                                        "recover_to": 0.95})
    return Planner(config, tiny_baseline, data, tmp_path, None, None, run_trial)


def _ok_variants(plans) -> dict[str, int]:
    """Each technique's variants that would be built."""
    return {p.technique.name: sum(1 for spec in p.variants if spec.status == "ok")
            for p in plans}


def test_the_plan_line_says_which_techniques_get_their_shortest_run_before_any_starts(
        tiny_baseline, tiny_data, tmp_path):
    config = _config()
    plans = plan(config, tiny_baseline)
    enabled = [p.technique.name for p in plans if p.refusal is None]
    # Each shortest run is 5 s + 2 epochs x 1 s x 2 = 9 s, distillation's 13 s (its student
    # and its control train 2 epochs each, and it runs last): 25 s hold the search's trial and
    # the first fine-tuning.
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "deadline": time.time() + 25.0})
    searching = Planner(config, tiny_baseline, data, tmp_path, tmp_path, "parent", run_trial)
    line = searching.plan_line(plans)
    assert line.startswith("compression plan, 25 s: shortest runs first (40 s together)")
    assert "channel_prune (search), " in line.split(" for ")[1], "the search's trial first"
    fitting, cut = line.split("; cut unless those before end sooner: ")
    assert fitting.split(" for ")[1].startswith("channel_prune (search), prune, then")
    assert cut.endswith("distill"), "the most epochs last"
    assert len(cut.split(", ")) == len(enabled) - 2
    assert all(name.split(" ")[0] in enabled for name in cut.split(", "))
    roomy = Planner(config, tiny_baseline, data.model_copy(
        update={"deadline": time.time() + 600.0}), tmp_path, None, None, run_trial)
    assert "cut unless" not in roomy.plan_line(plans)
    assert "(search)" not in roomy.plan_line(plans), "no inputs to time trials on: fine-tuned"
    unbounded = Planner(config, tiny_baseline, tiny_data, tmp_path, None, None, run_trial)
    assert unbounded.plan_line(plans).endswith("each to its epoch cap (no budget)")


def test_the_longest_fine_tuning_runs_last_and_takes_what_those_before_left(tiny_baseline):
    from compress.planner import longest_last

    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "distill": {"enabled": True, "epochs": 30}, "qat": {"enabled": True, "epochs": 2},
        "prune": {"enabled": True, "epochs": 10},
        "cluster": {"enabled": True, "epochs": 6, "preserve_sparsity": True},
        "pqat": {"enabled": True, "epochs": 2}, "cqat": {"enabled": True, "epochs": 2}}})
    ordered = [p.technique.name for p in longest_last(plan(config, tiny_baseline))]
    assert ordered[-1] == "distill", "the most epochs (its controls counted) last"
    assert ordered.index("prune") < ordered.index("cluster") < ordered.index("cqat"), (
        "a technique another continues from stays before it")
    assert ordered.index("prune") < ordered.index("pqat")
    assert sorted(ordered) == sorted(p.technique.name for p in plan(config, tiny_baseline))


def test_combinations_of_two_techniques_run_after_those_on_their_own_and_are_cut_first(
        tiny_baseline, tiny_data, tmp_path):
    from compress.planner import chained_last

    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "distill": {"enabled": True, "epochs": 30}, "qat": {"enabled": True, "epochs": 2},
        "prune": {"enabled": True, "epochs": 10},
        "cluster": {"enabled": True, "epochs": 6, "preserve_sparsity": True},
        "pqat": {"enabled": True, "epochs": 2}, "cqat": {"enabled": True, "epochs": 2}}})
    plans = plan(config, tiny_baseline)
    assert [p.technique.name for p in chained_last(plans)] == [
        "qat", "prune", "distill", "cluster", "pqat", "cqat"], (
        "on their own, the longest last; then the combinations, cluster before CQAT")
    # Shortest runs: 9 s each (5 s + 2 epochs x 1 s x 2), distillation's 17 s (its student and
    # two controls): 40 s hold pruning, QAT and distillation, not the combinations as well.
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "deadline": time.time() + 40.0})
    line = Planner(config, tiny_baseline, data, tmp_path, None, None, run_trial).plan_line(plans)
    assert line.split(" for ")[1].startswith("qat, prune, distill, then"), line
    assert line.endswith("; cut unless those before end sooner: cluster, pqat, cqat"), line


def test_a_fine_tuning_continuing_from_a_searched_model_runs_once_the_searches_are_done(
        tiny_baseline, tiny_data, tmp_path):
    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "channel_prune": {"enabled": True, "fraction": "auto", "epochs": 2},
        "thinned_qat": {"enabled": True, "epochs": 2},
        "qat": {"enabled": True, "epochs": 2}}})
    plans = plan(config, tiny_baseline)
    thinned = next(p for p in plans if p.technique.name == "thinned_qat")
    assert thinned.starts_from == "channel_prune" and thinned.refusal is None
    assert [spec.name for spec in thinned.variants if spec.status == "ok"] == [
        "thinned-qat-tflite-int8"]
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "deadline": time.time() + 600.0})
    searching = Planner(config, tiny_baseline, data, tmp_path, tmp_path, "parent", run_trial)
    assert searching.plan_line(plans).split(" for ")[1].startswith(
        "channel_prune (search), qat, prune, distill, thinned_qat (after the searches), then")
    fine_tuned = Planner(config, tiny_baseline, data, tmp_path, None, None, run_trial)
    assert fine_tuned.plan_line(plans).split(" for ")[1].startswith(
        "channel_prune, qat, prune, distill, thinned_qat,"), (
        "nothing searched: QAT of the thinned model after the techniques on their own")
    alone = PipelineConfig.model_validate({"name": "plan", "compress": {
        "thinned_qat": {"enabled": True}}})
    (refused,) = [p for p in plan(alone, tiny_baseline) if p.technique.name == "thinned_qat"]
    assert refused.refusal == ("thinned_qat continues from the channel_prune technique's "
                               "model: enable compress.channel_prune")


def test_techniques_that_build_nothing_give_their_variants_time_back_to_the_compression(
        tiny_baseline, tiny_data, tmp_path):
    from prefect.states import Completed, Failed

    from compress import skipped_state
    from techniques.base import Skipped

    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "distill": {"enabled": True, "epochs": 2}, "qat": {"enabled": True, "epochs": 2},
        "prune": {"enabled": True, "epochs": 2}, "cluster": {"enabled": True, "epochs": 2}}})
    plans = plan(config, tiny_baseline)
    variants = _ok_variants(plans)
    deadline = time.time() + 60.0
    planner = _budgeted(config, tiny_baseline, tiny_data, tmp_path, deadline)
    far_from_back = tiny_baseline.model_copy(update={
        "name": "qat", "history": {"val_accuracy": [0.52]},
        "params": {"stopped_by": "budget", "epochs_run": 1, "kept_epoch": "last"}})
    back = far_from_back.model_copy(update={"name": "prune", "history": {
        "val_accuracy": [0.96]}})
    planner._outcomes.update({
        "distill": skipped_state(Skipped(technique="distill", kind="cut", reason="no time")),
        "qat": Completed(data=far_from_back), "prune": Completed(data=back),
        "cluster": Failed(message="it crashed")})
    given = planner.give_back_unbuilt(plans)
    assert given == 10.0 * (variants["distill"] + variants["qat"] + variants["cluster"]) > 0
    assert planner.data.deadline == deadline + given, "prune's forms will be built: kept"
    assert planner.give_back_unbuilt(plans) == 0.0, "each technique gives back once"
    unbudgeted = Planner(config, tiny_baseline, tiny_data, tmp_path, None, None, run_trial)
    unbudgeted._outcomes.update(planner._outcomes)
    assert unbudgeted.give_back_unbuilt(plans) == 0.0 and unbudgeted.data.deadline is None


def test_a_fine_tuning_is_submitted_once_a_worker_is_free_with_the_time_given_back(
        tiny_baseline, tiny_data, tmp_path):
    from prefect.states import Completed, Running

    class Submitted:
        """A submitted fine-tuning, running until waited for (as a future on one worker)."""

        def __init__(self, ends_as):
            self.state, self._ends_as = Running(), ends_as

        def wait(self):
            self.state = self._ends_as

    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "distill": {"enabled": True, "epochs": 2}, "prune": {"enabled": True, "epochs": 2}}})
    plans = plan(config, tiny_baseline)
    deadline = time.time() + 60.0
    planner = _budgeted(config, tiny_baseline, tiny_data, tmp_path, deadline)
    stopped_mid_ramp = tiny_baseline.model_copy(update={
        "name": "pruned-80", "history": {"val_accuracy": [0.30]},
        "params": {"stopped_by": "budget", "epochs_run": 4, "kept_epoch": "last"}})
    pruning = Submitted(Completed(data=stopped_mid_ramp))
    planner._outcomes["prune"] = pruning
    planner._make_room(plans)
    assert pruning.state.is_final(), "one worker: the next waits for it"
    assert planner.data.deadline == deadline + 10.0 * _ok_variants(plans)["prune"] > deadline, (
        "its variants' time goes to the next fine-tuning's deadline before it is submitted")


def test_a_combination_does_not_continue_from_a_model_the_budget_stopped_far_from_back(
        tiny_baseline, tiny_data, tmp_path):
    from prefect.states import Completed

    from compress import contained
    from techniques.base import Skipped

    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "prune": {"enabled": True, "epochs": 2},
        "cluster": {"enabled": True, "epochs": 2, "preserve_sparsity": True}}})
    planner = _budgeted(config, tiny_baseline, tiny_data, tmp_path, time.time() + 60.0)
    stopped_mid_ramp = tiny_baseline.model_copy(update={
        "name": "pruned-80", "history": {"val_accuracy": [0.53]},
        "params": {"stopped_by": "budget", "epochs_run": 1, "kept_epoch": "last"}})
    planner._outcomes["prune"] = Completed(data=stopped_mid_ramp)
    start = planner._start_from("prune")
    assert start.name == "Skipped", "a state, as outcomes are"
    skip = start.result()
    assert isinstance(skip, Skipped) and skip.kind == "cut"
    assert "stopped by the time budget after 1 epochs" in skip.reason
    (cluster,) = [p for p in plan(config, tiny_baseline) if p.technique.name == "cluster"]
    state = contained("cluster").fn(skip, cluster.cfg, planner.data, tmp_path / "cluster")
    assert state.name == "Skipped" and "continues from the prune technique's model" in (
        state.result().line())
    planner._search_after(cluster, start)
    assert planner._outcomes["cluster"].name == "Skipped", "a search continuing from it too"
    back = stopped_mid_ramp.model_copy(update={"history": {"val_accuracy": [0.96]}})
    planner._outcomes["prune"] = Completed(data=back)
    assert planner._start_from("prune").result() == back, "back within: continued from"


def test_the_shortest_runs_together_are_what_the_planner_reserves_per_worker(tiny_baseline,
                                                                             tiny_data):
    from compress import priced_runs
    from tfopt.schedule.prices import shortest_run_s, shortest_runs_s

    plans = plan(_config(), tiny_baseline)
    data = tiny_data.model_copy(update={"epoch_s": 1.0})
    each = [shortest_run_s(p.technique.name, p.cfg, data) for p in plans if p.refusal is None]
    assert shortest_runs_s(priced_runs(plans), 1.0) == sum(each) == 40.0
    assert shortest_runs_s(priced_runs(plans), 1.0, workers=2) == 20.0
    assert shortest_runs_s(priced_runs(plans), 0.0) == 0.0, "an unknown epoch: nothing to reserve"


def test_a_searchs_first_trial_is_priced_with_its_cool_down_and_its_files(tiny_baseline,
                                                                         tiny_data):
    from compress import priced_runs
    from tfopt.schedule.prices import first_trial_s, shortest_run_s, shortest_runs_s
    from tfopt.search import TRIAL_FORMS

    config = PipelineConfig.model_validate({"name": "plan", "compress": {
        "channel_prune": {"enabled": True, "fraction": "auto", "epochs": 20,
                          "learning_rate_schedule": "cosine", "cool_down_epochs": 3},
        "qat": {"enabled": True, "epochs": 20}}})
    plans = plan(config, tiny_baseline)
    channel = next(p for p in plans if p.technique.name == "channel_prune")
    qat = next(p for p in plans if p.technique.name == "qat")
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "variant_tail_s": 4.0})
    files_s = (len(TRIAL_FORMS) + 1) * 4.0
    assert first_trial_s(channel.cfg, 1.0, 4.0) == 5.0 + (1 + 3) * 1.0 * 2.0 + files_s, (
        "back within the budget after an epoch, then 3 cooling down; 2 files and a run-off")
    assert shortest_run_s("channel_prune", channel.cfg, data, trial_files=2) == first_trial_s(
        channel.cfg, 1.0, 4.0)
    priced = data.model_copy(update={"file_s": 3.0})
    assert shortest_run_s("channel_prune", channel.cfg, priced, trial_files=2) == first_trial_s(
        channel.cfg, 1.0, 3.0), "its files as the baseline's LiteRT files cost, where known"
    assert first_trial_s(channel.cfg, 1.0, 4.0, files=1) == first_trial_s(
        channel.cfg, 1.0, 4.0) - 4.0, "one file fewer to convert and time"
    assert shortest_run_s("channel_prune", channel.cfg, data) == 9.0, (
        "a fixed strength: its shortest run")
    each = [shortest_run_s(p.technique.name, p.cfg, data,
                           len(TRIAL_FORMS) if p.technique.searched(p.cfg) else 0)
            for p in plans if p.refusal is None]
    assert first_trial_s(channel.cfg, 1.0, 4.0) in each
    assert shortest_run_s("qat", qat.cfg, data) in each
    runs = priced_runs(plans)
    assert shortest_runs_s(runs, 1.0, file_s=4.0) == sum(each) > shortest_runs_s(runs, 1.0)
    capped = channel.cfg.model_copy(update={"epochs": 2})
    assert first_trial_s(capped, 1.0, 0.0) == 5.0 + 2 * 2.0, "no more epochs than its cap"
    no_cool_down = channel.cfg.model_copy(update={"cool_down_epochs": 0})
    assert first_trial_s(no_cool_down, 1.0, 0.0) == 5.0 + 20 * 2.0, (
        "a cosine rate without a cool-down runs its schedule (a distilled student's)")


def test_compressed_models_narrowed_to_their_int8_tflite_files_plan_nothing_else(tiny_baseline):
    from compress import trial_forms

    config = _config()
    narrowed = config.model_copy(update={"compress": config.compress.model_copy(
        update={"forms": "tflite_int8"})})
    wide = [s for p in plan(config, tiny_baseline) for s in p.variants if s.status == "ok"]
    narrow = [s for p in plan(narrowed, tiny_baseline) for s in p.variants if s.status == "ok"]
    assert len(narrow) < len(wide)
    assert narrow and all((s.format, s.precision) == ("tflite", "int8") for s in narrow)
    assert trial_forms(config) == ("int8", "fp32")
    assert trial_forms(narrowed) == ("int8",), "a search times only the file that is built"
    assert {s.source for s in narrow} == {s.source for s in wide}, "every model keeps one form"


def test_the_float_stem_is_planned_beside_each_thinner_int8_file_where_the_baseline_s_was_quicker(
        tiny_baseline):
    """Left to the run (null), `compress.float_stem` follows the baseline's selective int8.

    Only a model thinner or shallower than the baseline gets the form: one of the baseline's
    shape runs it at the speed of the baseline's own.
    """
    from tfopt.runtimes import plan_variant, with_float_stem
    from tfopt.runtimes.litert import FLOAT_STEM_ONLY
    from tfopt.variants import QUICK_SPEEDUP, skipped

    config = _config(amx="allowed")  # auto and denied leave the float stem off
    selective = plan_variant("baseline", "tflite", "int8", form="tflite-selective")
    quicker = selective.model_copy(update={"params": {QUICK_SPEEDUP: 1.3}})
    assert with_float_stem(config, [quicker]).compress.float_stem is True
    assert with_float_stem(config, [skipped(selective, "not needed")]).compress.float_stem is False
    never = config.model_copy(update={"compress": config.compress.model_copy(
        update={"float_stem": False})})
    assert with_float_stem(never, [quicker]).compress.float_stem is False, "the config's word"

    def stems(cfg: PipelineConfig) -> list:
        return [s for p in plan(cfg, tiny_baseline) for s in p.variants
                if s.status == "ok" and s.name.endswith("-tflite-selective-int8")]

    assert not stems(config)
    on = with_float_stem(config, [quicker])
    planned = stems(on)

    def int8_sources(reshaped: bool) -> set[str]:
        return {s.source for p in plan(on, tiny_baseline) for s in p.variants
                if s.status == "ok" and s.name == f"{s.source}-tflite-int8"
                and p.technique.reshapes == reshaped}

    int8 = int8_sources(reshaped=True)
    assert {s.source for s in planned} == int8 and len(int8) >= 2, "thinned and distilled"
    assert int8_sources(reshaped=False), "the baseline's shape (pruned, QAT): no stem form"
    assert all(s.params[FLOAT_STEM_ONLY] and s.derived_from.endswith("-tflite-int8")
               for s in planned)
    narrowed = on.model_copy(update={"compress": on.compress.model_copy(
        update={"forms": "tflite_int8"})})
    assert {s.source for s in stems(narrowed)} == int8, "kept beside the narrowed int8 files"


def test_a_run_that_cannot_have_its_shortest_run_is_passed_over_and_a_shorter_one_after_fits():
    from tfopt.schedule.prices import fitting

    assert fitting([10.0, 15.0, 40.0, 5.0], 32.0) == [True, True, False, True]
    assert fitting([40.0, 5.0], 30.0) == [False, True], "the first is checked too"
    assert fitting([], 10.0) == []


def test_a_searchs_first_trial_ends_at_its_share_and_leaves_the_others_their_shortest_runs(
        tiny_baseline, tiny_data, tmp_path):
    """bench.yaml's channel search once fine-tuned its first trial for 32 epochs, never back,
    and QAT, distillation and the joint search were cut: the first round's share bounds it."""
    from prefect.states import Failed

    from compress import trial_forms
    from tfopt.schedule.prices import first_trial_s, shortest_run_s, trial_file_s

    sent = []

    class Recording:
        """The trial task, recording the training data each trial is given (it then fails)."""

        def submit(self, *args):
            sent.append(args[5])
            return Failed(message="not run in this test")

    config = _config().model_copy(update={"work_dir": tmp_path})  # its study in tmp_path
    plans = plan(config, tiny_baseline)
    search = next(p for p in plans if p.technique.name == "channel_prune")
    others = [p for p in plans if p is not search and p.refusal is None]
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "deadline": time.time() + 300.0,
                                        "variant_tail_s": 2.0})
    planner = Planner(config, tiny_baseline, data, tmp_path, tmp_path, "parent", Recording())
    before = time.time()
    planner._first_round(search, tiny_baseline, queued=[search, *others])
    (trial_data,) = sent
    files_s = (len(trial_forms(config)) + 1) * trial_file_s(data)
    shortest = first_trial_s(search.cfg, 1.0, trial_file_s(data), len(trial_forms(config)))
    assert trial_data.deadline - before >= shortest - files_s - 1.0, "its own shortest run"
    others_s = sum(shortest_run_s(p.technique.name, p.cfg, data) for p in others)
    assert trial_data.deadline <= data.deadline - others_s - files_s + 1.0, (
        "the others' shortest runs kept after its trial and its files")
    assert trial_data.deadline < data.deadline and trial_data.trial is not None
    sent.clear()
    planner._rounds(planner.searches["channel_prune"], search, tiny_baseline, rounds=1)
    assert sent and sent[0].deadline == data.deadline, "a deepening round: the time left"


def test_the_settings_the_budget_left_no_round_for_are_nested_runs_too(
        live_services, tiny_baseline, tiny_data, tmp_path):
    """A trial the time budget cut is seen in MLflow beside those that ran, with the cut."""
    import uuid

    from mlflow.tracking import MlflowClient

    from tfopt.tracking import RunRef

    client = MlflowClient(live_services.mlflow_url)
    experiment = client.create_experiment(f"cut-trials-{uuid.uuid4().hex[:8]}")
    parent = RunRef(tracking_uri=live_services.mlflow_url, experiment_id=experiment,
                    run_id=client.create_run(experiment).info.run_id)
    config = _config().model_copy(update={"work_dir": tmp_path})  # its own study, not resumed
    plans = plan(config, tiny_baseline)
    search = next(p for p in plans if p.technique.name == "channel_prune")
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "deadline": time.time() - 1.0})
    planner = Planner(config, tiny_baseline, data, tmp_path, tmp_path, parent, run_trial)
    planner._first_round(search, tiny_baseline, queued=[search])
    state = planner._searched(planner.searches["channel_prune"], search, tiny_baseline)
    assert state.name == "Skipped" and "cut by the time budget" in state.message
    (cut,) = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.run_id}'")
    assert cut.data.tags["tfopt.role"] == "search-trial"
    assert cut.data.tags["tfopt.status"] == "cut", cut.data.tags
    assert cut.data.tags["tfopt.error"] == "the fraction search was not started (time budget)"
    assert float(cut.data.params["fraction"]) in search.technique.knob.values
