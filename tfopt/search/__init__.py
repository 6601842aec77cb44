"""The strongest compression within the accuracy budget, found by measuring trials on this machine.

A technique declares the knob ``auto`` searches (`Knob`: its config field and its candidate
values, weakest first). A study (Optuna, kept in SQLite in the work folder: a killed run that is
started again resumes it) bisects the candidates: a trial makes the technique's model at one
value, fine-tunes it until it is back within the accuracy budget or hopeless (Optuna's
`ThresholdPruner` reads its validation curve), converts it to int8 and fp32 TFLite, and times
both files holding the machine's benchmark slot (int8 is not faster everywhere: `TRIAL_FORMS`).
A setting is within the budget when its fine-tuned model is on the validation split and one of
its files is too, by the champion's rule (a converted file can lose what its model kept); the
test split is only reported, never chosen on. Assuming that a stronger setting is faster and less
accurate, a setting that stays within the budget moves the lower end up, one that does not the
upper end down; with several workers each round tries as many settings at once. A trial's
figures are those of its fastest file within the budget, by its speed-up over the baseline's
int8 file timed side by side with it; the chosen setting is the fastest trial (within 3%, the
stronger one).

The package: `knob` (what a technique searches), `trials` (one trial's files timed beside the
baseline's int8 file), `study` (the Optuna study, its bisection and the choice), `front` (the
searches' combined accuracy-speed front). The plan that runs the trials beside the other
techniques is `techniques.planner`.
"""

from tfopt.search.front import combined_front
from tfopt.search.knob import Knob
from tfopt.search.study import (
    HOPELESS_POINTS,
    TIE_SHARE,
    WARMUP_EPOCHS,
    Search,
    choose,
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
    "HOPELESS_POINTS", "TIE_SHARE", "TRIAL_FORMS", "WARMUP_EPOCHS", "Knob", "Search",
    "TimedFile", "Trial", "TrialStatus", "baseline_int8", "choose", "combined_front", "keeps",
    "search_line",
    "search_summary", "study_key", "time_files", "trial_of", "trial_protocol", "trial_status",
    "with_speedups", "with_timed_files", "within_budget",
]
