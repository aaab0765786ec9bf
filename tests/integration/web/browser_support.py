"""What the browser tests share: Debian's chromium and its driver (never a downloaded one),
the skip when they are missing, a headless Chromium made for one test, and the screenshot
folder (``$TRAINYARD_SCREENSHOT_DIR`` when set: docs/screenshots was made this way, else the
test's temporary folder). Importing it skips the importing module without selenium."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"

NEEDS_CHROMIUM = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(DRIVER).exists()),
    reason="needs Debian's chromium and chromium-driver "
    "(apt-get install chromium chromium-driver; .ci/run does)",
)

selenium = pytest.importorskip("selenium", reason="needs selenium (pip install -e '.[dev]')")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service as DriverService  # noqa: E402


@contextlib.contextmanager
def headless_chromium(
    tmp_path: Path,
    *,
    window: str,
    page_load_timeout_s: float,
) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a profile of its own under ``tmp_path``, quit on exit.

    Args:
        tmp_path: the test's temporary folder.
        window: the window size, ``"WIDTHxHEIGHT"`` in pixels (screenshots have it).
        page_load_timeout_s: how long ``get`` may wait for a page.
    """
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    width, height = window.split("x")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--window-size={width},{height}",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=DriverService(DRIVER), options=options)
    driver.set_page_load_timeout(page_load_timeout_s)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot_folder(tmp_path: Path) -> Path:
    """The folder screenshots go to (made if missing)."""
    folder = Path(os.environ.get("TRAINYARD_SCREENSHOT_DIR") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
