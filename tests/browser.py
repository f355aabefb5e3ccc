"""Headless Debian Chromium for browser tests, driven by Playwright (no browser download)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--autoplay-policy=no-user-gesture-required",
]


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched Playwright browser; in CI a missing chromium fails the test, elsewhere it skips."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("Debian chromium is missing: scripts/test.sh installs it (apt-get install chromium)")
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            yield browser
        finally:
            browser.close()
