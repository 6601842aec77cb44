"""Prefect artifacts on a flow run: the results table and a summary linking to MLflow."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tfopt.report.summary import or_dash


def publish_prefect_artifacts(summary: dict[str, Any]) -> None:
    """Attach a variants table and a Markdown summary (with the MLflow run's link) to the run."""
    rows = [
        {
            "variant": ("★ " if v["name"] == summary["champion"] else "") + v["name"],
            "status": v["status"] if v["status"] == "ok" else f"{v['status']}: {v['error']}",
            "accuracy": or_dash(v["accuracy"], ".4f"),
            "p50 ms": or_dash(v["latency_ms"]["p50"], ".3f"),
            "p99 ms": or_dash(v["latency_ms"]["p99"], ".3f"),
            "size KB": or_dash(v["size_bytes"] / 1024, ",.1f"),
            "notes": " | ".join(v.get("flags", []) + v.get("notes", [])),
        }
        for v in summary["variants"]
    ]
    create_table_artifact(key="tfopt-variants", table=rows,
                          description="Every variant, measured on the same test inputs")
    failed = sum(1 for v in summary["variants"] if v["status"] == "failed")
    lines = [
        f"# tfopt: {summary.get('config_name', '')}",
        "",
        f"**Champion:** {summary['champion'] or 'none'} — {summary['champion_reason']}",
        "",
        f"**MLflow run:** [{summary['mlflow_run_id']}]({summary.get('mlflow_run_url', '')})",
        "",
        f"Variants: {len(summary['variants'])} ({failed} failed).",
    ]
    if summary.get("input_pipeline"):
        ip = summary["input_pipeline"]
        lines.append(
            f"Input pipeline: naive {ip['naive_examples_per_s']:,.0f}, tuned "
            f"{ip['tuned_examples_per_s']:,.0f}, cached {ip['cached_examples_per_s']:,.0f} "
            f"examples/s; batch size {ip['chosen_batch_size']}."
        )
    markdown = "\n".join(lines)
    create_markdown_artifact(key="tfopt-summary", markdown=markdown,
                             description="Run summary with a link to the MLflow run")


REGRESSION_EVENT = "tfopt.regression"


def emit_regression_event(config_name: str, run_url: str, since: dict[str, Any]) -> None:
    """Emit the Prefect event ``tfopt.regression`` when a run regressed since the last one.

    A Prefect automation can notify on it (docs/operations.md: "Since the last run"); its
    payload holds the regressions (variant, what moved, before, after) and the runs compared.
    """
    from prefect.events import emit_event

    regressions = since.get("regressions") or []
    if not regressions:
        return
    emit_event(
        event=REGRESSION_EVENT,
        resource={"prefect.resource.id": f"tfopt.config.{config_name}",
                  "prefect.resource.name": config_name},
        payload={"regressions": regressions, "run_url": run_url,
                 "previous_run_id": since.get("previous_run_id"),
                 "champion": since.get("champion")},
    )


def publish_comparison(since: dict[str, Any] | None) -> None:
    """Attach the "Since the last run" section to the flow run as a Markdown artifact."""
    from tfopt.report.compare import markdown

    create_markdown_artifact(key="tfopt-since-last-run", markdown="\n".join(markdown(since)),
                             description="What changed since the last run of this config")
