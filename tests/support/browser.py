"""The browser tests' headless Chromium (Debian's package, driven by Playwright) and their sign-in, shared by the
files that drive pages in a real browser (tests/test_browser_e2e.py, tests/test_browser_import.py); the `browser`
fixture in tests/conftest.py launches it once per module."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.markers import require

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--no-first-run"]


@contextmanager
def launched_chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's Browser), closed on the way out whatever the test did."""
    require("browser", "drives a real browser")
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: `make browser-deps` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread; the tests' own database calls are still
    # synchronous and safe, so Django's async guard is told so (Django's documented escape hatch), for these
    # tests only.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                yield instance
            finally:
                instance.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def sign_in(browser: Any, portal_url: str, username: str, width: int = 1280, height: int = 900) -> Any:
    """A new browser context signed in as `username` (password "password", as tests/support/people.py makes
    them): its page, on the dashboard."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{portal_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "password")
    page.click("#login-submit")
    page.wait_for_url(f"{portal_url}/")
    return page
