"""Benchmark a pipeline run's variants on other machines and put the machines side by side.

`tfopt benchmark --run <MLflow run id> --work-pool <pool>` registers the `benchmark_model`
flow once per work pool (deployment ``benchmark_model/on-<pool>``) and starts one flow run per
ok variant of that run. A worker of the pool (`tfopt worker --pool <pool>`, on the machine that
will serve) downloads the variant and the run's benchmark inputs from MLflow, measures it with
the run's protocol, and logs a child run of the pipeline's run tagged with its machine. The
machine's own benchmark settings (threads, CPUs) are the worker's: `tfopt worker --set
benchmark.threads=4` checks them on its machine and registers them on its pool's deployment,
and every flow run started there carries them as its ``config.machine`` parameter (shown in the
Prefect UI). `machine_rows` and `write_machine_report` then make the "per machine" table and
plot.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfopt.config import (
    BenchmarkConfig,
    ConfigError,
    MachineSettings,
    MeasurementProtocol,
    resolve_cpus,
)

MACHINE_RUN_ROLE = "machine-benchmark"
BENCHMARK_FLOW = "benchmark_model"


class MachineBenchmarkError(ConfigError):
    """A pipeline run that cannot be benchmarked elsewhere, or a flow run that did not finish."""


def machine_settings(pairs: Mapping[str, object]) -> dict[str, Any]:
    """A worker's ``benchmark.*`` overrides, validated on the machine they are for.

    Args:
        pairs: Dotted keys under ``benchmark.`` and their values (from ``--set``).

    Returns:
        The settings by field name: the ``config.machine`` parameter (`MachineSettings`) of the
        flow runs the worker's machine measures.

    Raises:
        ConfigError: A key outside ``benchmark.``'s protocol, a value it refuses, or CPUs this
            machine does not have.
    """
    from pydantic import ValidationError

    settings = {}
    for key, value in pairs.items():
        field = key.removeprefix("benchmark.")
        if field == key or field not in MeasurementProtocol.model_fields:
            raise ConfigError(f"--set {key}: a worker sets benchmark.<field> only (fields: "
                              f"{', '.join(sorted(MeasurementProtocol.model_fields))})")
        settings[field] = value
    try:
        machine = MachineSettings.model_validate(settings)
    except ValidationError as error:
        raise ConfigError(f"machine: {error}") from error
    resolve_cpus(machine.cpus)
    return machine.model_dump(mode="json", exclude_none=True)


def _with_machine(protocol: BenchmarkConfig, machine: MachineSettings | None,
                  **replaced: object) -> BenchmarkConfig:
    """`protocol` with `replaced` and then the machine's own settings on top, CPUs checked here."""
    own = machine.model_dump(mode="json", exclude_none=True) if machine is not None else {}
    merged = BenchmarkConfig.model_validate(
        {**protocol.model_dump(mode="json"), **replaced, **own})
    return merged.model_copy(update={"cpus": resolve_cpus(merged.cpus)})


def machine_protocol(protocol: BenchmarkConfig,
                     machine: MachineSettings | None) -> BenchmarkConfig:
    """`protocol` with this machine's settings on top, its CPUs checked here.

    CPU numbers belong to a machine, not to the protocol: the pipeline machine's pinning is
    dropped, and only this machine's own ``benchmark.cpus`` pins here.

    Raises:
        ConfigError: CPUs this machine does not have.
    """
    return _with_machine(protocol, machine, cpus=None)


def local_protocol(protocol: BenchmarkConfig,
                   machine: MachineSettings | None) -> BenchmarkConfig:
    """A benchmark's own protocol with this machine's settings on top, its CPUs checked here.

    Raises:
        ConfigError: CPUs this machine does not have.
    """
    return _with_machine(protocol, machine)


def machine_label(work_pool: str | None) -> str:
    """How a machine is named in runs and reports: its host name and the work pool it serves."""
    host = socket.gethostname()
    return f"{host} ({work_pool})" if work_pool else host


@dataclass(frozen=True)
class VariantRun:
    """An ok variant of a pipeline run: its name and its MLflow child run."""

    name: str
    run_id: str


def variants_to_measure(tracking_uri: str, pipeline_run: str,
                        names: list[str] | None = None) -> list[VariantRun]:
    """The ok variants of a pipeline run whose model files it logged (all, or those `names`).

    Raises:
        MachineBenchmarkError: No such run, not a pipeline run with shared inputs, or a name
            that is not an ok variant of it.
    """
    from mlflow.exceptions import MlflowException

    from tfopt import tracking
    from tfopt.measurement.inputs import INPUTS_ARTIFACT

    client = tracking.client(tracking_uri)
    try:
        parent = client.get_run(pipeline_run)
    except MlflowException as error:
        raise MachineBenchmarkError(f"--run {pipeline_run}: no such MLflow run at "
                                    f"{tracking_uri} ({error.error_code})") from error
    if parent.data.tags.get("tfopt.role") != "pipeline":
        raise MachineBenchmarkError(f"--run {pipeline_run} is not an optimize_model run")
    if not client.list_artifacts(pipeline_run, INPUTS_ARTIFACT):
        raise MachineBenchmarkError(
            f"--run {pipeline_run} logged no benchmark inputs (it ran with "
            "benchmark.share_inputs false, or before tfopt shared them)")
    ok = {child.data.tags["tfopt.variant"]: child.info.run_id
          for child in _ok_variant_runs(client, parent)
          if child.data.tags.get("tfopt.role") != MACHINE_RUN_ROLE
          and "tfopt.variant" in child.data.tags}
    unknown = sorted(set(names or []) - set(ok))
    if unknown:
        raise MachineBenchmarkError(f"--variant {', '.join(unknown)}: not an ok variant of run "
                                    f"{pipeline_run} (ok: {', '.join(sorted(ok))})")
    chosen = sorted(names or ok)
    if not chosen:
        raise MachineBenchmarkError(f"--run {pipeline_run} has no ok variant")
    return [VariantRun(name, ok[name]) for name in chosen]


def _ok_variant_runs(client: Any, parent: Any) -> list[Any]:
    """The ok child runs of a pipeline run, its own and the machines', oldest first."""
    return client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' "
                      "and tags.`tfopt.status` = 'ok'",
        order_by=["attributes.start_time ASC"], max_results=5000)


def machine_rows(tracking_uri: str, pipeline_run: str) -> tuple[list[str], list[dict]]:
    """The machines that measured a pipeline run's variants, and one row per variant.

    The pipeline's own measurements come first (its host); each machine's latest measurement
    of a variant counts.

    Returns:
        The machine labels, and per variant ``{"variant", machine: {"p50_ms", "p50_ci95",
        "throughput_per_s", "threads", "cpus"}}``.
    """
    from tfopt import tracking

    client = tracking.client(tracking_uri)
    parent = client.get_run(pipeline_run)
    here = f"{parent.data.tags.get('tfopt.host', 'pipeline')} (pipeline run)"
    machines = [here]
    rows: dict[str, dict[str, Any]] = {}
    for child in _ok_variant_runs(client, parent):
        tags, metrics = child.data.tags, child.data.metrics
        if "tfopt.variant" not in tags or "latency_p50_ms" not in metrics:
            continue
        machine = tags.get("tfopt.machine", here) if tags.get(
            "tfopt.role") == MACHINE_RUN_ROLE else here
        if machine not in machines:
            machines.append(machine)
        low, high = (metrics.get("latency_p50_ci95_low_ms"),
                     metrics.get("latency_p50_ci95_high_ms"))
        rows.setdefault(tags["tfopt.variant"], {"variant": tags["tfopt.variant"]})[machine] = {
            "p50_ms": metrics["latency_p50_ms"],
            "p50_ci95": [low, high] if low is not None else None,
            "throughput_per_s": metrics.get("throughput_per_s"),
            "threads": tags.get("env.benchmark_threads",
                                parent.data.params.get("benchmark.threads")),
            "cpus": tags.get("env.benchmark_cpus", parent.data.params.get("benchmark.cpus")),
        }
    measured_elsewhere = [row for row in rows.values() if len(row) > 2]
    return machines, sorted(measured_elsewhere, key=lambda row: row["variant"])


def write_machine_report(machines: list[str], rows: list[dict], out_dir: Path) -> list[Path]:
    """The "per machine" table (Markdown, JSON) and plot of `machine_rows`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from tfopt.fileio import atomic_write_json, atomic_write_text
    from tfopt.report.files import save_figure

    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ["# Per machine: batch-1 p50 (ms) of the same files on the same inputs", "",
             "| variant | " + " | ".join(machines) + " |",
             "|---|" + "---:|" * len(machines)]
    for row in rows:
        cells = []
        for machine in machines:
            cell = row.get(machine)
            cells.append("-" if cell is None else
                         f"{cell['p50_ms']:.3f} ({cell['threads'] or '?'} threads)")
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    markdown = out_dir / "machines.md"
    atomic_write_text(markdown, "\n".join(lines) + "\n")
    table = out_dir / "machines.json"
    atomic_write_json(table, {"machines": machines, "variants": rows})

    fig, axis = plt.subplots(figsize=(8, 1.0 + 0.5 * len(rows) * max(1, len(machines)) / 2))
    height = 0.8 / len(machines)
    positions = np.arange(len(rows))
    for index, machine in enumerate(machines):
        values = [row[machine]["p50_ms"] if machine in row else 0.0 for row in rows]
        axis.barh(positions + index * height, values, height, label=machine)
    axis.set_yticks(positions + height * (len(machines) - 1) / 2,
                    [row["variant"] for row in rows])
    axis.invert_yaxis()
    axis.set_xlabel("batch-1 p50 latency (ms)")
    axis.set_title("Per machine: the same variants, measured where they will run")
    axis.legend(fontsize="small")
    plot = save_figure(fig, out_dir / "machines.png")
    return [markdown, table, plot]
