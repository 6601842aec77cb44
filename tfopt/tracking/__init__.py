"""Everything tfopt writes to MLflow and reads back from it, one module per concern.

- `tfopt.tracking.client`: the client, the one retry loop, the batched calls;
- `tfopt.tracking.runs`: a run's life (experiment, start, end, address) and runs left behind;
- `tfopt.tracking.results`: one typed function per result a run logs;
- `tfopt.tracking.registry`: variants as LoggedModels, the champion in the model registry;
- `tfopt.tracking.history`: a config's earlier runs read back.

Flows log through `tracked_run` and the typed functions, named here (``tracking.log_dataset``).
"""

from tfopt.tracking.client import (
    TrackingUnavailableError,
    client,
    download_run_artifacts,
    flatten_params,
    log_artifact,
    retry_seconds,
    use_retry_seconds,
    with_retries,
)
from tfopt.tracking.history import (
    champion_history,
    previous_summary,
    previous_variant_file,
    variant_p50_history,
)
from tfopt.tracking.registry import log_champion, note_regressions
from tfopt.tracking.results import (
    DESCRIPTION_LIMIT,
    describe_run,
    log_amx_decision,
    log_baseline_health,
    log_comparison,
    log_continued_training,
    log_dataset,
    log_file,
    log_input_pipeline,
    log_layout,
    log_model_facts,
    log_native_crashes,
    log_sweep,
    log_technique,
    log_training,
    log_trial,
    log_variant_run,
    log_variants,
)
from tfopt.tracking.runs import (
    RunRef,
    TrackedRun,
    experiment_url,
    reconcile_orphans,
    run_url,
    tracked_run,
)

__all__ = [
    "DESCRIPTION_LIMIT", "RunRef", "TrackedRun", "TrackingUnavailableError", "champion_history",
    "client", "describe_run", "download_run_artifacts", "experiment_url", "flatten_params",
    "log_amx_decision", "log_artifact", "log_baseline_health", "log_champion", "log_comparison",
    "log_continued_training", "log_dataset", "log_file",
    "log_input_pipeline", "log_layout", "log_model_facts", "log_native_crashes", "log_sweep",
    "log_technique", "log_training", "log_trial", "log_variant_run", "log_variants",
    "note_regressions", "previous_summary", "previous_variant_file", "reconcile_orphans",
    "retry_seconds", "run_url", "tracked_run", "use_retry_seconds", "variant_p50_history",
    "with_retries",
]
