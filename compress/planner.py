"""The compression's plan: every technique's shortest run before any search goes deep.

Coverage first: each search's first round (one trial, at its knob's `Knob.first` or the middle;
the searches from the baseline first, `searches_first`), then every other technique's
fine-tuning, submitted in order (the combinations of two techniques after the others, each group
the longest last: `chained_last`) and waited for, each ending by its epochs' share of the time
left when it starts (`TrainingData.queued`: those after it whose shortest run no longer fits,
`fitting`, keep none); then a joint search's first round (its knobs' own searches covered it);
only then do the searches deepen, in the time left, the one that paid most per second so far
first, then the one whose trials were timed fastest (`Search.deepening_key`). The fine-tunings
that continue from a searched technique's model (QAT of channel pruning's) run last: the
fine-tunings before them share the time with them, and the joint searches and the deepening
leave them their shortest runs. A technique is cut only when even its shortest run
(`shortest_run_s`) does not fit, and `Planner.plan_line` says before any starts which fit:
a search that runs first does not take the time of the techniques after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import Task
from prefect.states import Completed, State

from compress import (
    Planned,
    after_skipped,
    compression_workers,
    contained,
    cut_short_in_run,
    finishing,
    open_search,
    skipped_state,
    trial_forms,
)
from techniques.base import Skipped
from tfopt.artifacts import BenchmarkInputs, ModelArtifact, TrainingData
from tfopt.logs import step_logger
from tfopt.orchestration import final_state
from tfopt.schedule.budget import CUT_BY_BUDGET, Clock
from tfopt.schedule.prices import (
    STARTUP_S,
    WRAPPED_EPOCH_SHARE,
    epochs_of,
    fitting,
    own_deadline,
    shortest_run_s,
    trial_file_s,
)
from tfopt.search import Joint, Search, Trial, search_line, trial_of
from tfopt.tracking import RunRef, log_trial


def searches_first(plans: list[Planned]) -> list[Planned]:
    """`plans` in run order, with the searches that start from the baseline moved first.

    A search's trials go to the task runner the other techniques were submitted to; with one
    worker (the default) those submitted before them run first: on EfficientNetB0 (30 minutes)
    depth pruning's search, which the run order puts after distillation and QAT, started once
    both were done and was cut after one trial. Among them, those that try their strongest
    setting first (`Knob.strongest_first`) go first, then those whose first trial is not the
    middle of a bisection (`Knob.first`).
    """
    def order(planned: Planned) -> tuple[bool, bool, bool]:
        knob = planned.technique.knob
        return (not searched_from_baseline(planned),
                not (knob is not None and knob.strongest_first),
                knob is None or knob.first is None)
    return sorted(plans, key=order)


def longest_last(plans: list[Planned]) -> list[Planned]:
    """`plans` with those no other continues from moved last, the most epochs last of all.

    Each fine-tuning's deadline is set when it starts, from the time left then: what those
    before it did not use goes to those after. Short fine-tunings often end before their
    shortest run's estimate, so the longest runs last and takes what they left; run first, it
    ended on its share while the time the others left went unused (docs/measurements.md). A
    technique another continues from keeps its place before it.
    """
    continued = {p.starts_from for p in plans if p.starts_from}
    leaves = sorted((p for p in plans if p.technique.name not in continued),
                    key=lambda p: epochs_of(p.cfg))
    return [*(p for p in plans if p.technique.name in continued), *leaves]


def chained_last(plans: list[Planned]) -> list[Planned]:
    """`plans` with the combinations of two techniques after the others, each group `longest_last`.

    A combination continues from another technique's model (clustering a pruned model, QAT
    keeping its sparsity or its clusters). When the time runs short those last are cut, so the
    techniques on their own (pruning, QAT, distillation: the mission's steps) keep it: with the
    longest of all last, a slow machine's demo cut distillation in every run while CQAT, whose
    graph takes many times a plain fine-tuning's to build, ran past its share
    (docs/measurements.md). Distillation still takes most of the time the others leave: its
    share counts its controls' epochs.
    """
    alone = [p for p in plans if p.starts_from is None]
    return [*longest_last(alone), *longest_last([p for p in plans if p not in alone])]


def searched_from_baseline(planned: Planned) -> bool:
    """Whether a technique's strength is searched, starting from the baseline."""
    return planned.starts_from is None and planned.technique.searched(planned.cfg)


def refusal_of(search: Search) -> str | None:
    """Why the technique does not apply to the model, if a trial found it does not.

    A model without what the technique works on (no residual block to remove) refuses every
    setting alike: one such trial ends the search.
    """
    return next((trial.error or "" for trial in search.trials()
                 if trial.status == "not_applicable"), None)


@dataclass(frozen=True)
class PlanOrder:
    """The plan's techniques by when they start.

    Attributes:
        first: The searches from the baseline: their first rounds before anything else.
        after: Every other technique's fine-tuning (and the searches continuing from another
            technique's model), the combinations of two last (`chained_last`).
        combined: The joint searches: their first rounds once every fine-tuning is done.
        last: The fine-tunings that continue from a searched technique's model: once the
            searches have deepened, in the time they leave them (their shortest runs kept).
    """

    first: list[Planned]
    after: list[Planned]
    combined: list[Planned]
    last: list[Planned]

    def in_order(self) -> list[Planned]:
        """Every technique of the plan, in the order they start."""
        return [*self.first, *self.after, *self.combined, *self.last]


@dataclass
class Planner:
    """Runs the techniques of one compression subflow in the plan's order.

    Attributes:
        config: The pipeline configuration (compress, convert, benchmark and scale sections).
        baseline: The trained baseline, where the techniques that continue from none start.
        data: The run's training data, with the compression's deadline and targets.
        run_dir: The run's folder (models/ go under it).
        inputs: The benchmark inputs a search times its trials on (None: no search).
        parent: The pipeline's MLflow run (a search's trials are its nested runs).
        trial_task: The Prefect task that runs one search trial (`tasks.run_trial`).
        searches: Each searched technique's study, filled as they open.
    """

    config: Any
    baseline: ModelArtifact
    data: TrainingData
    run_dir: Path
    inputs: BenchmarkInputs | None
    parent: RunRef | None
    trial_task: Task
    searches: dict[str, Search] = field(default_factory=dict)
    _outcomes: dict[str, Any] = field(default_factory=dict)
    _deepen: dict[str, tuple[Planned, ModelArtifact]] = field(default_factory=dict)
    _given_back: set[str] = field(default_factory=set)

    @property
    def workers(self) -> int:
        """How many trials or fine-tunings the task runner runs at once."""
        return compression_workers(self.config)

    def searched(self, planned: Planned) -> bool:
        """Whether a technique is searched here (its strength ``auto``, with inputs to time)."""
        return (planned.technique.searched(planned.cfg) and self.inputs is not None
                and self.parent is not None)

    def plan_line(self, plans: list[Planned]) -> str:
        """Which techniques the time left gives their shortest run, said before any starts."""
        order = self._groups(plans)
        ordered = order.in_order()
        names = [p.technique.name + (" (search)" if self.searched(p) else
                                     " (after the searches)" if p in order.last else "")
                 for p in ordered]
        if self.data.deadline is None:
            return f"compression plan: {', '.join(names)}, each to its epoch cap (no budget)"
        clock = Clock(deadline=self.data.deadline)
        left = clock.left() or 0.0
        shortest = [self._shortest_s(p) for p in ordered]
        starts = fitting([seconds / self.workers for seconds in shortest], left)
        fits = [name for name, starts_too in zip(names, starts, strict=True) if starts_too]
        cut = [name for name in names if name not in fits]
        line = (f"compression plan, {max(0.0, left):.0f} s: shortest runs first "
                f"({sum(shortest):.0f} s together) for {', '.join(fits) or 'none'}, then "
                "their epochs' share of the rest, then the searches deepen")
        line += f"; cut unless those before end sooner: {', '.join(cut)}" if cut else ""
        return line + self._learned_line(ordered)

    def _learned_line(self, ordered: list[Planned]) -> str:
        """The techniques priced by this machine's earlier runs (`tfopt.schedule.learned_costs`)."""
        costs, epoch_s = self.data.costs, self.data.epoch_s
        if costs is None:
            return ""
        said = []
        for name in (p.technique.name for p in ordered):
            startup, share = costs.startup_s(name, epoch_s), costs.epoch_share(name)
            if startup is not None:
                said.append(f"{name} {startup:.0f} s" + (
                    f" + epochs at {share:.2g}x" if share is not None else ""))
        return (f"; priced as this machine's earlier runs took them: {', '.join(said)} (else "
                f"{STARTUP_S:.0f} s + epochs at {WRAPPED_EPOCH_SHARE:.0f}x the baseline's)"
                ) if said else ""

    def run(self, plans: list[Planned]) -> dict[str, Any]:
        """Each technique's outcome (a final state, or a future): every technique before depth."""
        order = self._groups(plans)
        fine_tunes = [p for p in order.after if not self.searched(p)]
        for index, planned in enumerate(order.first):
            self._first_round(planned, self.baseline,
                              queued=[*order.first[index:], *fine_tunes, *order.last])
        for planned in order.after:
            start = (self.baseline if planned.starts_from is None
                     else self._start_from(planned.starts_from))
            if self.searched(planned):
                self._search_after(planned, start)
            else:
                self._make_room(plans)
                self._submit(planned, start,
                             [*fine_tunes[fine_tunes.index(planned):], *order.last])
        self._wait()
        self.give_back_unbuilt(plans)
        reserved = sum(shortest_run_s(p.technique.name, p.cfg, self.data)
                       for p in order.last) / self.workers
        for planned in order.combined:
            self._first_round(planned, self.baseline, reserved)
            self.give_back_unbuilt(plans)
        for name in sorted(self._deepen, key=lambda n: self.searches[n].deepening_key(),
                           reverse=True):
            self.finished(name, reserved)
            self.give_back_unbuilt(plans)
        for index, planned in enumerate(order.last):
            start = self.finished(planned.starts_from)
            self._make_room(plans)
            self._submit(planned, start, order.last[index:])
        self._wait()
        return self._outcomes

    def give_back_unbuilt(self, plans: list[Planned]) -> float:
        """Move the deadline later by what the budget kept for variants never to be built.

        The time after the compression is kept for every planned compressed variant's
        conversion and measurement (`TrainingData.variant_tail_s`); a technique that ended
        skipped, failed, or cut short by the budget (`cut_short_in_run`) builds none, and its
        variants' time goes to the searches and fine-tunings still to run (kept back, it made
        runs end minutes early while searches were stopped after one trial:
        docs/measurements.md). Each technique gives back once.

        Returns:
            The seconds given back by this call.
        """
        if self.data.deadline is None or self.data.variant_tail_s <= 0.0:
            return 0.0
        gone = [p for p in plans if p.technique.name not in self._given_back
                and self._builds_nothing(p.technique.name)]
        variants = sum(1 for p in gone for spec in p.variants if spec.status == "ok")
        self._given_back |= {p.technique.name for p in gone}
        seconds = variants * self.data.variant_tail_s
        if seconds > 0.0:
            self.data = self.data.model_copy(update={"deadline": self.data.deadline + seconds})
            step_logger().info(
                "%.0f s of the benchmarks' time back to the compression: %s will not build "
                "their %d variants", seconds, ", ".join(p.technique.name for p in gone),
                variants)
        return seconds

    def _builds_nothing(self, name: str) -> bool:
        """Whether a technique has ended without a model whose forms will be built."""
        outcome = self._outcomes.get(name)
        if outcome is None or not (isinstance(outcome, State) or outcome.state.is_final()):
            return False
        state = final_state(outcome)
        made = state.result(raise_on_failure=False) if state.is_completed() else None
        if not isinstance(made, ModelArtifact):
            return True
        return cut_short_in_run(made, self.data,
                                self.config.benchmark.accuracy_budget_points) is not None

    def _start_from(self, name: str) -> Any:
        """What a fine-tuning that continues from technique `name` starts from, once it ended.

        Its outcome, or, for a model the time budget stopped far from back (`cut_short_in_run`:
        its forms are not built), a "Skipped" state saying so (`skipped_state`): the one
        continuing from it is skipped in turn rather than fine-tuned from a model already judged
        out.
        """
        outcome = self.finished(name)
        state = final_state(outcome)
        made = state.result(raise_on_failure=False) if state.is_completed() else None
        if isinstance(made, ModelArtifact) and (short := cut_short_in_run(
                made, self.data, self.config.benchmark.accuracy_budget_points)) is not None:
            return skipped_state(Skipped(technique=name, kind="cut", reason=short))
        return outcome

    def finished(self, name: str, reserved_s: float = 0.0) -> Any:
        """A technique's outcome; a search's once it has deepened in the time left.

        Args:
            name: The technique.
            reserved_s: Seconds before the deadline a search's deepening leaves to the
                fine-tunings that continue from the searches' models.
        """
        if name in self._deepen and name not in self._outcomes:
            planned, start = self._deepen[name]
            self._rounds(self.searches[name], planned, start, reserved_s=reserved_s)
            self._outcomes[name] = self._searched(self.searches[name], planned, start)
        return self._outcomes[name]

    def _submit(self, planned: Planned, start: Any, queued: list[Planned]) -> None:
        """A fine-tuning submitted from `start`, its deadline shared with those `queued`."""
        self._outcomes[planned.technique.name] = contained(planned.technique.name).submit(
            start, planned.cfg, self._queued(queued), self.run_dir / "models")

    def _make_room(self, plans: list[Planned]) -> None:
        """Wait until a worker is free, giving back the time of those that ended building nothing.

        A fine-tuning's deadline is set from the time left when it is submitted: submitted
        while one before it still ran, it would miss what that one gives back (a pruning
        stopped by the budget gives its variants' time back only when it ends, and the
        techniques queued behind it would be cut for want of it).
        """
        while len(running := [outcome for outcome in self._outcomes.values()
                              if not isinstance(outcome, State)
                              and not outcome.state.is_final()]) >= self.workers:
            running[0].wait()
        self.give_back_unbuilt(plans)

    def _wait(self) -> None:
        for outcome in list(self._outcomes.values()):
            if not isinstance(outcome, State):
                outcome.wait()

    def _groups(self, plans: list[Planned]) -> PlanOrder:
        """The plan's techniques by when they start (see `PlanOrder`)."""
        enabled = [p for p in plans if p.refusal is None]
        searched = {p.technique.name for p in enabled if self.searched(p)}
        combined = [p for p in enabled if isinstance(p.technique.knob, Joint)
                    and searched_from_baseline(p) and self.searched(p)]
        first = [p for p in searches_first(enabled)
                 if searched_from_baseline(p) and self.searched(p) and p not in combined]
        last = [p for p in enabled if p.starts_from in searched and not self.searched(p)]
        after = chained_last([p for p in enabled if p not in first + combined + last])
        return PlanOrder(first, after, combined, last)

    def _shortest_s(self, planned: Planned) -> float:
        """A technique's shortest run here: a searched one's first trial (`shortest_run_s`)."""
        return shortest_run_s(planned.technique.name, planned.cfg, self.data,
                              len(trial_forms(self.config)) if self.searched(planned) else 0)

    def _queued(self, queued: list[Planned]) -> TrainingData:
        """The training data of the first of `queued` fine-tunings: what the queue shares."""
        return self.data.model_copy(update={
            "queued": tuple((shortest_run_s(p.technique.name, p.cfg, self.data) / self.workers,
                             epochs_of(p.cfg) / self.workers) for p in queued)})

    def _first_round(self, planned: Planned, start: ModelArtifact, reserved_s: float = 0.0,
                     queued: list[Planned] | None = None) -> None:
        """Open a technique's search and run its first round; it deepens after the others.

        The round does not start within `reserved_s` of the deadline (`_rounds`). With the
        techniques `queued` from it on, its trials' fine-tunings end at its share of the time
        (`own_deadline`, as a fine-tuning's): a first trial that is not back within the budget
        by then is over it for this run, and does not take the others' shortest runs.
        """
        search = open_search(planned, self.config, start, self.data)
        search.expected_round_s = max(
            filter(None, (done.round_seconds for done in self.searches.values())), default=None)
        self.searches[planned.technique.name] = search
        share = None
        if queued and self.data.deadline is not None:
            share = own_deadline(self._queued(queued), epochs_of(planned.cfg),
                                 self._shortest_s(planned))
            files_s = (len(trial_forms(self.config)) + 1) * trial_file_s(self.data)
            share = share.model_copy(update={"deadline": share.deadline - files_s})
            step_logger().info(
                "%s search: its first round's fine-tunings end within %.0f s (its share of the "
                "%.0f s left, its files' %.0f s after)", planned.technique.name,
                Clock(deadline=share.deadline).left() or 0.0,
                Clock(deadline=self.data.deadline).left() or 0.0, files_s)
        self._rounds(search, planned, start, rounds=1, reserved_s=reserved_s, data=share)
        self._deepen[planned.technique.name] = (planned, start)

    def _search_after(self, planned: Planned, start: Any) -> None:
        """A searched technique continuing from another's model: its first round, or a skip."""
        start_state = final_state(start) if planned.starts_from else Completed(data=start)
        made = start_state.result() if start_state.is_completed() else None
        if isinstance(made, ModelArtifact):
            self._first_round(planned, made)
            return
        name = planned.technique.name
        self._outcomes[name] = (skipped_state(after_skipped(name, made))
                                if isinstance(made, Skipped) else start_state)

    def _rounds(self, search: Search, planned: Planned, start: ModelArtifact,
                rounds: int | None = None, reserved_s: float = 0.0,
                data: TrainingData | None = None) -> None:
        """Trials of a technique's strength on the task runner, `rounds` rounds at most.

        A round tries as many settings as the runner has workers; each trial reports to the
        study, which is kept in the work folder (a killed run resumes it). No round starts
        that would end within `reserved_s` of the deadline. `data`: the trials' training data
        when it is not the run's (a first round's share of the time).
        """
        name, done = planned.technique.name, 0
        trial_data = data or self.data
        deadline = None if self.data.deadline is None else self.data.deadline - reserved_s
        while (rounds is None or done < rounds) and not refusal_of(search) and (
                opened := search.next_trials(self.workers, deadline)):
            futures = [(point, self.trial_task.submit(
                name, point, "-".join(f"{v:g}" for v in point.values()), start, planned.cfg,
                trial_data.model_copy(update={"trial": ref}), search.trial_folder(point),
                self.config.convert, trial_forms(self.config), self.inputs,
                self.config.benchmark, self.parent))
                for point, ref in opened]
            for point, future in futures:
                search.finish(trial_of(final_state(future), search, point))
            done += 1

    def _log_cut_points(self, name: str, search: Search) -> None:
        """Each setting the cut round would have tried, a nested run with status ``cut``.

        A failure to log one is a warning: the search's outcome does not depend on it.
        """
        assert search.cut is not None and self.parent is not None
        for point in search.cut_points:
            run_name = f"{name} " + " ".join(f"{k}={v:g}" for k, v in point.items())
            trial = Trial(params=point, status="cut", error=search.cut.reason)
            try:
                log_trial(self.parent, run_name, {"technique": name, **trial.summary()})
            except Exception as error:
                step_logger().warning("the cut trial %s was not logged to MLflow: %s",
                                      run_name, error)

    def _searched(self, search: Search, planned: Planned, start: ModelArtifact) -> State:
        """The state of a technique's search: its chosen trial's model, or why there is none.

        The settings the time budget left no round for are nested runs too, ``cut``.
        """
        name = planned.technique.name
        if search.cut is not None and self.parent is not None:
            self._log_cut_points(name, search)
        chosen = search.chosen()
        step_logger().info("%s search: %s", name, search_line(search))
        if not search.trials():
            return skipped_state(Skipped(technique=name, kind="cut", reason=(
                f"{CUT_BY_BUDGET}: the fine-tunings' time was used before {name}'s search "
                "could start")))
        if refusal := refusal_of(search):
            return skipped_state(Skipped(technique=name, kind="not_applicable", reason=refusal))
        if chosen is None or chosen.model is None:
            return skipped_state(Skipped(technique=name, kind="not_applicable", reason=(
                f"no {search.knob.field} tried kept the "
                f"{'accuracy' if search.metric is None else search.metric.name} within the budget "
                f"({search_line(search)})")))
        if planned.technique.after_search is None:
            return Completed(data=chosen.model)
        return final_state(finishing(name).submit(
            start, planned.technique.at(planned.cfg, chosen.params), self.data,
            search.trial_folder(chosen.params), chosen.model))
