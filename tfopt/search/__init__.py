"""The strongest compression within the accuracy budget, found by measuring trials on this machine.

A technique declares what ``auto`` searches: one knob (`Knob`: its config field and its
candidate values, weakest first), or knobs that compose on one model (`Joint`). A study (Optuna,
kept in SQLite in the work folder: a killed run that is started again resumes it) chooses the
points: a trial makes the technique's model at one point, fine-tunes it until it is back within
the accuracy budget or hopeless, converts it to int8 and fp32 TFLite, and times both files
holding the machine's benchmark slot (int8 is not faster everywhere: `TRIAL_FORMS`), then side by
side with the baseline's int8 file. A point is within the budget when its fine-tuned model is on
the validation split and one of its files is too, by the champion's rule (a converted file can
lose what its model kept); the test split is only reported, never chosen on.

Every search is one kind of study (`Search`): two objectives (validation accuracy, time relative
to the baseline's int8 file), and a sampler behind Optuna's interface proposing each point. One
knob is bisected (`BisectionSampler`): assuming that a stronger setting is faster and less
accurate, a setting that stays within the budget moves the lower end up, one that does not the
upper end down, and a crashed trial bounds neither; with several workers each round tries as
many settings at once. Knobs that compose are drawn by Optuna's TPE (`JointSampler`). A
fine-tuning still ten points below the target after its warm-up stops as hopeless. The chosen
point is the fastest trial within the budget (within 3%, the stronger one).

The package: `knob` (what a technique searches), `trials` (one trial's files timed beside the
baseline's int8 file), `samplers` (how a study proposes its points), `study` (the Optuna study
and the choice), `front` (the searches' combined accuracy-speed front). The plan that runs the
trials beside the other techniques is `compress.planner`.
"""

from tfopt.search.front import combined_front, is_chosen, params_label
from tfopt.search.knob import Joint, Knob, Point, Space
from tfopt.search.study import (
    HOPELESS_POINTS,
    TIE_SHARE,
    WARMUP_EPOCHS,
    Search,
    choose,
    open_study,
    point_key,
    search_line,
    search_summary,
    study_key,
    trial_of,
)
from tfopt.search.trials import (
    TRIAL_FORMS,
    TimedFile,
    Trial,
    TrialStatus,
    baseline_int8,
    keeps,
    time_files,
    trial_protocol,
    trial_status,
    with_speedups,
    with_timed_files,
    within_budget,
)

__all__ = [
    "HOPELESS_POINTS", "TIE_SHARE", "TRIAL_FORMS", "WARMUP_EPOCHS", "Joint",
    "Knob", "Point", "Search", "Space", "TimedFile", "Trial", "TrialStatus", "baseline_int8",
    "choose", "combined_front", "is_chosen", "keeps", "open_study", "params_label",
    "point_key", "search_line",
    "search_summary", "study_key", "time_files", "trial_of", "trial_protocol", "trial_status",
    "with_speedups", "with_timed_files", "within_budget",
]
