"""What a user chooses on the dashboard is kept across page loads (issue 28), in a real
headless Chromium against a real server process and real sandboxed tasks:

- the log page's toggle for the runner's isolation detail lines (``[task][detail]``):
  hidden by default as in ``workflow logs``, shown with the toggle, the choice kept;
- the chart controls (picker, smoothing, log scale, x axis): kept for the browser, for
  every workflow (one set of choices, ``localStorage``: docs/dashboard.md says why).

Screenshots go to ``$TRAINYARD_SCREENSHOT_DIR`` when set (docs/screenshots was made so).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import NEEDS_CHROMIUM, headless_chromium, screenshot_folder
from web_live_server import LiveServer, server  # noqa: F401 - the fixture

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(420)]

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

# Metrics by `step` with a time on each row (so the x axis can be time), then the task ends.
METRICS = """
workflow:
  name: kept
  tasks:
  - name: fit
    image: ubuntu:24.04
    command: [python3]
    args: [/tmp/fit.py, "{{output}}"]
    files:
    - path: /tmp/fit.py
      contents: |
        import json, sys
        from datetime import datetime, timedelta, timezone
        start = datetime.now(timezone.utc) - timedelta(minutes=1)
        with open(sys.argv[1] + "/metrics.jsonl", "a") as f:
            for i in range(1, 21):
                when = (start + timedelta(seconds=i)).isoformat()
                f.write(json.dumps({"step": i, "time": when, "loss": 4.0 / i,
                                    "accuracy": 1 - 0.5 / i, "lr": 0.1 / i}) + "\\n")
        print("metrics written", flush=True)
"""


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with headless_chromium(tmp_path, window="1280x900", page_load_timeout_s=60) as driver:
        yield driver


def _log_in(server: LiveServer, browser: webdriver.Chrome) -> None:
    browser.get(server.url + "/")
    browser.find_element(By.ID, "token").send_keys(server.token)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list"))


def _finished(server: LiveServer, spec: str) -> str:
    answer = server.api("POST", "/api/workflow", json={"spec_text": spec})
    assert answer.status_code == 200, answer.text
    wid = str(answer.json()["id"])
    WebDriverWait(server, 180, poll_frequency=0.5).until(
        lambda s: s.api("GET", f"/api/workflow/{wid}").json()["status"] == "COMPLETED"
    )
    return wid


def _wait(browser: webdriver.Chrome) -> WebDriverWait:
    return WebDriverWait(
        browser, 60, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )


def _shown_lines(browser: webdriver.Chrome) -> list[str]:
    """The log lines the page shows (a hidden line has no text for selenium)."""
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#log .line") if e.text]


def _log_ended(browser: webdriver.Chrome) -> bool:
    return browser.find_element(By.ID, "log-state").text == "ended"


def test_the_log_page_hides_detail_lines_unless_asked_and_keeps_the_choice(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    wid = _finished(server, METRICS)
    _log_in(server, browser)
    page = f"{server.url}/workflows/{wid}/logs?task=fit"
    browser.get(page)
    wait = _wait(browser)
    wait.until(_log_ended)
    toggle = browser.find_element(By.ID, "log-detail")
    assert not toggle.is_selected()
    quiet = _shown_lines(browser)
    assert any("metrics written" in line for line in quiet), quiet
    assert not any("[detail]" in line for line in quiet), quiet
    assert browser.find_element(By.ID, "log-count").text == f"{len(quiet)} lines"

    toggle.click()
    wait.until(lambda d: any("[fit#0] [detail] " in line for line in _shown_lines(d)))
    loud = _shown_lines(browser)
    assert len(loud) > len(quiet) and browser.find_element(By.ID, "log-count").text == (
        f"{len(loud)} lines"
    )
    browser.save_screenshot(str(screenshot_folder(tmp_path) / "logs-detail.png"))

    browser.get(page)  # kept across page loads
    wait.until(_log_ended)
    assert browser.find_element(By.ID, "log-detail").is_selected()
    assert _shown_lines(browser) == loud
    browser.find_element(By.ID, "log-detail").click()
    wait.until(lambda d: _shown_lines(d) == quiet)
    browser.get(page)
    wait.until(_log_ended)
    assert not browser.find_element(By.ID, "log-detail").is_selected()
    assert _shown_lines(browser) == quiet


def _charts(browser: webdriver.Chrome) -> set[str]:
    return {
        e.text for e in browser.find_elements(By.CSS_SELECTOR, ".curves figure.chart figcaption")
    }


def _x_label(browser: webdriver.Chrome) -> str:
    rows = browser.find_elements(By.CSS_SELECTOR, ".curves .u-legend .u-series .u-label")
    return rows[0].text if rows else ""


def test_chart_choices_are_kept_across_page_loads_and_workflows(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    first = _finished(server, METRICS)
    second = _finished(server, METRICS)
    _log_in(server, browser)
    wait = _wait(browser)
    browser.get(f"{server.url}/workflows/{first}")
    wait.until(lambda d: _charts(d) == {"loss", "accuracy"})

    browser.find_element(By.CSS_SELECTOR, "#chart-picker input[value=lr]").click()
    browser.find_element(By.CSS_SELECTOR, "#chart-picker input[value=accuracy]").click()
    wait.until(lambda d: _charts(d) == {"loss", "lr"})
    browser.execute_script(
        "const s = document.getElementById('chart-smooth'); s.value = '0.6';"
        "s.dispatchEvent(new Event('input', {bubbles: true}));"
    )
    browser.find_element(By.ID, "chart-log").click()
    Select(browser.find_element(By.ID, "chart-x")).select_by_value("time")
    wait.until(lambda d: _x_label(d) == "time (UTC)")

    for wid in (first, second):  # the same page again, and another workflow's page
        browser.get(f"{server.url}/workflows/{wid}")
        wait.until(lambda d: _charts(d) == {"loss", "lr"})
        assert browser.find_element(By.ID, "chart-smooth-value").text == "0.60"
        assert browser.find_element(By.ID, "chart-log").is_selected()
        assert all(
            f.get_attribute("data-scale") == "log"
            for f in browser.find_elements(By.CSS_SELECTOR, ".curves figure.chart")
        )
        selected = Select(browser.find_element(By.ID, "chart-x")).first_selected_option
        assert selected.get_attribute("value") == "time"
        assert _x_label(browser) == "time (UTC)"

    # Back to the defaults by hand: kept too.
    browser.find_element(By.CSS_SELECTOR, "#chart-picker input[value=lr]").click()
    browser.find_element(By.CSS_SELECTOR, "#chart-picker input[value=accuracy]").click()
    browser.find_element(By.ID, "chart-log").click()
    Select(browser.find_element(By.ID, "chart-x")).select_by_value("data")
    wait.until(lambda d: _x_label(d) == "step")
    browser.get(f"{server.url}/workflows/{first}")
    wait.until(lambda d: _charts(d) == {"loss", "accuracy"} and _x_label(d) == "step")
    assert not browser.find_element(By.ID, "chart-log").is_selected()
