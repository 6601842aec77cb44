"""The smoke run in the MLflow UI, in headless Debian Chromium driven by Playwright.

A user compares a run's variants side by side and finds every variant among the experiment's
models. Screenshots land in ``.tfopt/screenshots/`` (or ``$TFOPT_SCREENSHOTS``).
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.browser.conftest import SCREENSHOTS
from tests.live import SMOKE_RUN_S
from tfopt.tracking import experiment_url

# The session's smoke run: the test that waits for it holds the run's time.
pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(SMOKE_RUN_S + 180)]


def test_the_mlflow_ui_compares_the_runs_variants(smoke_run, browser_page):
    from playwright.sync_api import expect

    settings, summary, _, _ = smoke_run
    page = browser_page
    # The experiment's address as tfopt makes it opens on its runs, not on GenAI traces.
    page.goto(experiment_url(settings.mlflow_url, summary["mlflow_experiment_id"]))
    expect(page.get_by_text("matching runs")).to_be_visible()
    page.locator("button[data-component-id*=runnamecellrenderer]").first.click()
    chosen = ["baseline-graph", "baseline-tflite-int8", "baseline-onnx"]
    for name in chosen:
        row = page.locator(".ag-row", has=page.get_by_role("link", name=name, exact=True)).first
        index = row.get_attribute("row-index")
        page.locator(f".ag-row[row-index='{index}'] input.ag-checkbox-input").first.check()
    page.screenshot(path=SCREENSHOTS / "mlflow-1-children-selected.png")
    page.get_by_role("button", name="Compare").first.click()
    expect(page.get_by_text("Comparing 3 Runs")).to_be_visible()
    assert "compare-runs" in page.url
    for name in chosen:
        expect(page.get_by_text(name, exact=True).first).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "mlflow-2-compare.png", full_page=True)


def test_the_mlflow_models_tab_lists_every_variant_with_its_metrics(smoke_run, browser_page):
    from playwright.sync_api import expect

    settings, summary, _, _ = smoke_run
    page, experiment = browser_page, summary["mlflow_experiment_id"]
    mlflow = MlflowClient(settings.mlflow_url)
    # The pipeline's variants: not its search trials, nor what other tests measured later.
    variants = {c.info.run_id: c.info.run_name for c in mlflow.search_runs(
        [experiment], f"tags.`mlflow.parentRunId` = '{summary['mlflow_run_id']}' and "
        "tags.`tfopt.status` = 'ok'") if "tfopt.role" not in c.data.tags}
    models = [m for m in mlflow.search_logged_models([experiment])
              if m.source_run_id in variants]
    assert sorted(m.name for m in models) == sorted(variants.values()), (
        "every ok variant is a LoggedModel")
    model = next(m for m in models if m.name == "baseline-tflite-int8")
    assert model.params["runtime"] == "litert" and model.params["precision"] == "int8"
    assert {metric.key for metric in model.metrics} >= {"accuracy", "latency_p50_ms",
                                                        "size_bytes"}
    page.goto(f"{settings.mlflow_url}/#/experiments/{experiment}/models")
    expect(page.get_by_text("baseline-tflite-int8", exact=True).first).to_be_visible()
    expect(page.get_by_text("baseline-onnx", exact=True).first).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "mlflow-3-models-tab.png", full_page=True)
