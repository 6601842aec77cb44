"""A run's time: the budget, the prices of its steps, and what it cut.

- `budget`: ``budget.minutes`` made into each phase's deadline (`Budget`), the clock a step that
  may be cut asks (`Clock`), what ended a training (`Stop`) and the run's ledger of cuts
  (`Cuts`, of `tfopt.artifacts.Cut` records);
- `prices`: what a technique's run costs at the baseline's pace (its fixed part and its
  epochs' share, learned or guessed), its shortest run, its share of the time left, and the
  epochs its deadline holds;
- `learned_costs`: those prices as this machine's earlier runs of the model took them.
"""
