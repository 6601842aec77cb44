"""The browser the UI tests drive: Debian's Chromium, headless, through Playwright."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live import ROOT

CHROMIUM = Path(os.environ.get("TFOPT_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = Path(os.environ.get("TFOPT_SCREENSHOTS", ROOT / ".tfopt" / "screenshots"))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def browser_page() -> Iterator:
    from playwright.sync_api import expect, sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: `make browser-deps` installs Debian's "
                    "chromium (or set TFOPT_CHROMIUM)")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(60_000)
        # `expect` keeps its own 5 s default: ci14 rendered MLflow's compare page later than that
        # beside two test workers' pipelines on 2 cores.
        expect.set_options(timeout=60_000)
        try:
            yield page
        finally:
            browser.close()
