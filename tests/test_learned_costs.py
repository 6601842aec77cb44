"""A technique's fixed cost, learned on this machine for this model, prices its next run."""

import json
import re
import time

from tfopt.schedule.learned_costs import (
    COSTS_FILE,
    FINISH,
    KEPT,
    costs_key,
    load_costs,
    record_cost,
    record_finish,
)


def test_the_median_of_a_techniques_last_runs_prices_it_per_machine_and_model(tmp_path):
    costs = load_costs(tmp_path, "cpu-a model-1")
    assert costs.startup_epochs == {} and costs.startup_s("cqat", 1.0) is None, "a first run"
    walls = [60.0, 12.0, 16.0, 13.0]
    for wall in walls:
        assert record_cost(costs, "cqat", wall, priced_s=2.0, epoch_s=2.0) == wall - 2.0
    learned = load_costs(tmp_path, "cpu-a model-1")
    kept = sorted((wall - 2.0) / 2.0 for wall in walls[-KEPT:])
    assert learned.startup_epochs == {"cqat": kept[1]}, "the median of the last runs"
    assert learned.startup_s("cqat", 4.0) == kept[1] * 4.0, "in the baseline's epochs"
    assert learned.startup_s("cqat", 0.0) is None, "no pace: not priced"
    assert load_costs(tmp_path, "cpu-b model-1").startup_epochs == {}, "another machine"
    assert record_cost(costs, "qat", 1.0, priced_s=5.0, epoch_s=2.0) == 0.0, "never negative"
    assert record_cost(costs, "qat", 10.0, priced_s=5.0, epoch_s=0.0) is None, "no pace"
    (tmp_path / COSTS_FILE).write_text("{half a json")
    assert load_costs(tmp_path, "cpu-a model-1").startup_epochs == {}, "a broken file: a guess"
    assert record_cost(costs, "qat", 9.0, priced_s=5.0, epoch_s=2.0) == 4.0
    assert load_costs(tmp_path, "cpu-a model-1").startup_epochs == {"qat": 2.0}
    (tmp_path / "a-file").write_text("")
    elsewhere = load_costs(tmp_path / "a-file", "cpu-a model-1")
    assert record_cost(elsewhere, "qat", 9.0, 5.0, 2.0) is None, "not writable: not recorded"


def test_a_techniques_epoch_share_is_learned_beside_its_fixed_part(tmp_path):
    costs = load_costs(tmp_path, "cpu-a model-1")
    assert costs.epoch_share("distill") is None, "a first run"
    for share in (0.4, 3.0, 0.6, 0.5):
        record_cost(costs, "distill", 20.0, priced_s=10.0, epoch_s=2.0, epoch_share=share)
    record_cost(costs, "distill", 20.0, priced_s=10.0, epoch_s=2.0)
    learned = load_costs(tmp_path, "cpu-a model-1")
    assert learned.epoch_share("distill") == 0.55, "of the last three runs, those that measured it"
    assert learned.startup_s("distill", 2.0) == 10.0
    assert learned.summary(2.0) == {"distill": {"startup_s": 10.0, "epoch_share": 0.55}}
    (tmp_path / COSTS_FILE).write_text(json.dumps({"cpu-a model-1": {
        "qat": [4.0, {"fixed": 6.0, "share": 1.5}, "nonsense", {"share": 9.0}],
        "prune": "nonsense"}}))
    older = load_costs(tmp_path, "cpu-a model-1")
    assert older.startup_epochs == {"qat": 5.0}, "a bare number: a fixed part kept before shares"
    assert older.epoch_shares == {"qat": 1.5}, "what cannot be read is left out"


def test_the_costs_key_names_the_machine_and_changes_with_the_model():
    from tfopt.models.config import ModelConfig
    from tfopt.provenance import cpu_model

    key = costs_key(ModelConfig(width=8), 16)
    assert key.startswith(cpu_model()) and key == costs_key(ModelConfig(width=8), 16)
    assert key != costs_key(ModelConfig(width=16), 16) != costs_key(ModelConfig(width=8), 32)


def test_a_techniques_run_is_recorded_and_prices_its_next_start(tiny_baseline, tiny_data,
                                                                tmp_path):
    from compress import contained, plan
    from flows.parameters import PipelineConfig
    from tfopt.schedule.budget import CUT_BY_BUDGET
    from tfopt.schedule.prices import STARTUP_S, WRAPPED_EPOCH_SHARE, shortest_run_s

    config = PipelineConfig.model_validate({"name": "learned", "compress": {
        "qat": {"enabled": True, "epochs": 2}}})
    (qat,) = [p for p in plan(config, tiny_baseline) if p.technique.name == "qat"]
    costs = load_costs(tmp_path / "work", "this machine, this model")
    data = tiny_data.model_copy(update={"epoch_s": 0.5, "costs": costs})
    started = time.monotonic()
    made = contained("qat").fn(tiny_baseline, qat.cfg, data, tmp_path / "qat")
    wall = time.monotonic() - started
    assert made.params["epochs_run"] == 2
    learned = load_costs(tmp_path / "work", "this machine, this model")
    fixed, share = learned.startup_s("qat", data.epoch_s), learned.epoch_share("qat")
    fit_s, steady = made.metrics["fit_seconds"], made.metrics["steady_epoch_seconds"]
    assert steady < fit_s / 2, "its first epoch built the graph too"
    assert share == round(steady / data.epoch_s, 3), "its later epoch over the baseline's"
    assert fixed is not None and wall - fit_s < fixed < wall - 2 * steady, (
        "what its run took beside its epochs at their steady pace: the graph's building in it")
    priced = data.model_copy(update={"costs": learned})
    assert shortest_run_s("qat", qat.cfg, priced) == fixed + 2 * 0.5 * share
    assert shortest_run_s("qat", qat.cfg, data.model_copy(update={"costs": None})) == (
        STARTUP_S + 2 * 0.5 * WRAPPED_EPOCH_SHARE), "not learned: the guesses"

    record_cost(learned, "qat", 60.0, priced_s=0.0, epoch_s=0.5)
    record_cost(learned, "qat", 60.0, priced_s=0.0, epoch_s=0.5)
    slow = load_costs(tmp_path / "work", "this machine, this model")
    short = data.model_copy(update={"costs": slow, "deadline": time.time() + 30.0})
    state = contained("qat").fn(tiny_baseline, qat.cfg, short, tmp_path / "cut")
    assert state.name == "Skipped", "60 s in its last runs: not started with 30 s left"
    assert re.search(rf"{CUT_BY_BUDGET}: .* less than its shortest run "
                     rf"\({60.0 + 2 * 0.5 * share:.1f} s\)", state.result().line())


def test_the_plan_line_says_which_techniques_are_priced_by_earlier_runs(tiny_baseline,
                                                                         tiny_data, tmp_path):
    from compress import plan
    from compress.planner import Planner
    from flows.parameters import PipelineConfig
    from tasks.run_trial import run_trial

    config = PipelineConfig.model_validate({"name": "learned", "compress": {
        "distill": {"enabled": False},
        **{name: {"enabled": True, "epochs": 2} for name in ("qat", "prune")}}})
    costs = load_costs(tmp_path, "here")
    record_cost(costs, "qat", 31.0, priced_s=1.0, epoch_s=1.0)
    data = tiny_data.model_copy(update={"epoch_s": 1.0, "deadline": time.time() + 40.0,
                                        "costs": load_costs(tmp_path, "here")})
    line = Planner(config, tiny_baseline, data, tmp_path, None, None, run_trial).plan_line(
        plan(config, tiny_baseline))
    assert "shortest runs first (43 s together) for prune, then" in line, (
        "prune 5 + 4 s, qat 30 + 4 s: qat last, the longest")
    assert line.endswith("; cut unless those before end sooner: qat; priced as this machine's "
                         "earlier runs took them: qat 30 s (else 5 s + epochs at 2x the "
                         "baseline's)")
    record_cost(costs, "prune", 11.0, priced_s=1.0, epoch_s=1.0, epoch_share=0.5)
    learned = data.model_copy(update={"costs": load_costs(tmp_path, "here")})
    line = Planner(config, tiny_baseline, learned, tmp_path, None, None, run_trial).plan_line(
        plan(config, tiny_baseline))
    assert "(45 s together) for prune, then" in line, "prune 10 + 2 x 1 x 0.5 s, qat 30 + 4 s"
    assert "prune 10 s + epochs at 0.5x, qat 30 s (else" in line


def test_the_runs_finish_is_learned_beside_the_techniques(tmp_path):
    costs = load_costs(tmp_path, "cpu-a model-1")
    assert costs.finish_s is None, "a first run"
    record_cost(costs, "qat", 9.0, priced_s=5.0, epoch_s=2.0)
    for seconds in (60.0, 31.0, 44.0, 38.0):
        record_finish(costs, seconds)
    record_finish(costs, -3.0)
    learned = load_costs(tmp_path, "cpu-a model-1")
    assert learned.finish_s == 44.0, "the longest of the last three: a reserve"
    assert learned.startup_epochs == {"qat": 2.0} and FINISH not in learned.summary(1.0), (
        "not a technique")
    assert load_costs(tmp_path, "cpu-b model-1").finish_s is None, "another machine"
    book = json.loads((tmp_path / COSTS_FILE).read_text())
    book["cpu-a model-1"][FINISH] = [{"seconds": "slow"}, 7, {"seconds": 12.5}]
    (tmp_path / COSTS_FILE).write_text(json.dumps(book))
    assert load_costs(tmp_path, "cpu-a model-1").finish_s == 12.5, "what cannot be read is out"
    book["cpu-a model-1"][FINISH] = 7
    (tmp_path / COSTS_FILE).write_text(json.dumps(book))
    assert load_costs(tmp_path, "cpu-a model-1").finish_s is None
    record_finish(costs, 21.0)
    assert load_costs(tmp_path, "cpu-a model-1").finish_s == 21.0, "written over, not raised"
    (tmp_path / COSTS_FILE).write_text(json.dumps({"cpu-a model-1": "nonsense"}))
    record_cost(costs, "qat", 9.0, priced_s=5.0, epoch_s=2.0)
    assert load_costs(tmp_path, "cpu-a model-1").startup_epochs == {"qat": 2.0}
    record_finish(None, 9.0)  # a run without a costs file: nothing to keep
    (tmp_path / "a-file").write_text("")
    record_finish(load_costs(tmp_path / "a-file", "cpu-a model-1"), 9.0)  # logged, not raised


def test_a_one_epoch_run_keeps_its_fixed_part_and_not_its_graphs_building_as_a_share(
        tiny_baseline, tiny_data, tmp_path):
    from techniques.qat import QatConfig
    from tfopt.schedule.prices import learn_cost

    costs = load_costs(tmp_path, "here")
    record_cost(costs, "qat", 10.0, priced_s=4.0, epoch_s=2.0, epoch_share=1.0)
    data = tiny_data.model_copy(update={"epoch_s": 2.0, "costs": load_costs(tmp_path, "here")})
    one_epoch = tiny_baseline.model_copy(update={"params": {"epochs_run": 1},
                                                 "metrics": {"fit_seconds": 9.0}})
    learn_cost("qat", QatConfig(), data, one_epoch, wall_s=14.0)
    learned = load_costs(tmp_path, "here")
    assert learned.epoch_share("qat") == 1.0, "no share read from an epoch that built the graph"
    assert learned.startup_s("qat", 2.0) == (3.0 + 6.0) / 2 * 2.0, (
        "its fixed part: 14 s less one epoch at the learned share (2 s), beside the first run's")
