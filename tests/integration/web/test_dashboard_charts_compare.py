"""The dashboard's charts, times and comparison in a real headless Chromium (issue 28): a
real server process, real sandboxed tasks on the local pool.

- Charts: the x axis comes from the metrics rows (``step`` here, never a hard-coded
  ``epoch``), or their time at the user's choice; a chart picker shows loss, accuracy and throughput by default, a constant field
  gets no chart; an EMA smoothing slider, a log scale, and hover synced across the charts.
- One time format (UTC, ``YYYY-MM-DD HH:MM:SS``) on every page, chart legends included;
  elapsed time while a workflow runs; queue time and run time apart in the list.
- ``/compare``: a table of the runs' differing ``--set`` values and labels (and pool,
  backend, image): the facts of ``trainyard workflow diff``, for two runs or more.

Screenshots go to ``$TRAINYARD_SCREENSHOT_DIR`` when set (docs/screenshots was made so).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import NEEDS_CHROMIUM, headless_chromium, screenshot_folder
from web_live_server import LiveServer, server  # noqa: F401 - the fixture

from trainyard.pools import real_gpu_count

pytestmark = [NEEDS_CHROMIUM, pytest.mark.timeout(420)]

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

# Metrics by `step` (no epoch), a constant field (`images`) and one not charted by default
# (`lr`); then the task keeps running, so the page is watched while it runs.
STEPS = """
workflow:
  name: steps
  tasks:
  - name: fit
    image: ubuntu:24.04
    command: [python3]
    args: [/tmp/fit.py, "{{output}}"]
    files:
    - path: /tmp/fit.py
      contents: |
        import json, sys, time
        from datetime import datetime, timedelta, timezone
        start = datetime.now(timezone.utc) - timedelta(minutes=1)
        with open(sys.argv[1] + "/metrics.jsonl", "a") as f:
            for i in range(1, 41):
                loss = 4.0 / i
                when = (start + timedelta(seconds=i)).isoformat()
                f.write(json.dumps({"step": 10 * i, "time": when, "loss": loss,
                                    "accuracy": 1 - loss / 8,
                                    "throughput_images_per_s": 900 + i % 7,
                                    "lr": 0.1 / i, "images": 512}) + "\\n")
        print("metrics written", flush=True)
        time.sleep(600)
"""

# Rendered with default-values, overridden by --set; written metrics by step.
TUNED = """
workflow:
  name: tuned
  tasks:
  - name: fit
    image: ubuntu:24.04
    command: [python3]
    args: [/tmp/fit.py, "{{output}}", "{{lr}}"]
    files:
    - path: /tmp/fit.py
      contents: |
        import json, sys
        lr = float(sys.argv[2])
        with open(sys.argv[1] + "/metrics.jsonl", "a") as f:
            for i in range(1, 6):
                f.write(json.dumps({"step": i, "loss": 1 / (i * lr)}) + "\\n")
default-values:
  lr: 0.1
  batch: 64
"""

TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
ELAPSED = re.compile(r"\d+s|\d+m\d\ds|\d+h\d\dm")


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with headless_chromium(tmp_path, window="1280x1000", page_load_timeout_s=60) as driver:
        yield driver


def _log_in(server: LiveServer, browser: webdriver.Chrome) -> None:
    browser.get(server.url + "/")
    browser.find_element(By.ID, "token").send_keys(server.token)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list"))


def _submit(server: LiveServer, spec: str, **body: Any) -> str:
    answer = server.api("POST", "/api/workflow", json={"spec_text": spec, **body})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def _charts(browser: webdriver.Chrome, section: str) -> dict[str, WebElement]:
    return {
        f.find_element(By.TAG_NAME, "figcaption").text: f
        for f in browser.find_elements(By.CSS_SELECTOR, f"{section} figure.chart")
    }


def _curve_charts(browser: webdriver.Chrome) -> dict[str, WebElement]:
    return _charts(browser, ".curves")


def _hovered(
    browser: webdriver.Chrome,
    over: str,
    read: list[str],
    section: str = ".curves",
) -> dict[str, tuple[str, str]] | None:
    """The mouse over chart ``over`` near its right end, then the (x, first run's y) legend
    values of the charts ``read``; None while one shows no value yet (a refresh redrew it).
    In one step, for ``WebDriverWait.until``."""
    charts = _charts(browser, section)
    if over not in charts or any(name not in charts for name in read):
        return None  # captions read while a refresh redrew them
    _hover_right_end(browser, charts[over])
    found = {}
    for name in read:
        legend = _legend(charts[name])
        if legend[0][1] in ("", "--") or legend[1][1] in ("", "--"):
            return None
        found[name] = (legend[0][1], legend[1][1])
    return found


def _legend(chart: WebElement) -> list[tuple[str, str]]:
    """(label, value) of each legend row of a chart: the x series first."""
    rows = chart.find_elements(By.CSS_SELECTOR, ".u-legend .u-series")
    return [
        (
            r.find_element(By.CSS_SELECTOR, ".u-label").text,
            r.find_element(By.CSS_SELECTOR, ".u-value").text,
        )
        for r in rows
    ]


def _hover_right_end(browser: webdriver.Chrome, chart: WebElement) -> None:
    """The mouse over the chart's plot, near its right edge (the last points)."""
    over = chart.find_element(By.CSS_SELECTOR, ".u-over")
    ActionChains(browser).move_to_element_with_offset(
        over, over.size["width"] // 2 - 2, 0
    ).perform()


def _no_other_time_format(text: str) -> None:
    """No raw ISO time, no microseconds, no 12-hour clock, no year-less date on a page."""
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", text), text
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d", text), text
    assert not re.search(r"\b\d{1,2}:\d\d(:\d\d)?\s?[AP]M\b", text), text
    assert not re.search(r"(?<!\d{4}-)\b\d\d-\d\d \d\d:\d\d", text), text


def test_charts_follow_the_data_and_times_have_one_format(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    shots = screenshot_folder(tmp_path)
    wid = _submit(server, STEPS)
    _log_in(server, browser)
    wait = WebDriverWait(
        browser, 120, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )
    browser.get(f"{server.url}/workflows/{wid}")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".curves figure.chart canvas")) >= 3)

    # Defaults: loss, accuracy, throughput; the constant `images` and `lr` are offered only.
    assert set(_curve_charts(browser)) == {"loss", "accuracy", "throughput_images_per_s"}
    offered = {
        e.get_attribute("value"): e
        for e in browser.find_elements(By.CSS_SELECTOR, "#chart-picker input[name=metric]")
    }
    assert {"loss", "accuracy", "throughput_images_per_s", "lr", "images"} <= set(offered)
    assert not offered["images"].is_selected() and not offered["lr"].is_selected()
    assert (
        "constant"
        in browser.find_element(By.CSS_SELECTOR, "#chart-picker label[data-metric=images]").text
    )

    # The x axis is the data's: `step`.
    for chart in _curve_charts(browser).values():
        assert _legend(chart)[0][0] == "step"

    # Synced hover: over the loss chart, the accuracy chart shows the same step.
    loss = wait.until(lambda d: _hovered(d, "loss", ["loss", "accuracy"]))
    (loss_x, loss_raw), (accuracy_x, _) = loss["loss"], loss["accuracy"]
    assert accuracy_x == loss_x
    assert float(loss_raw) == pytest.approx(4.0 / (int(loss_x) / 10), rel=0.01)

    # Smoothing (EMA): the same point now reads above the raw value (loss falls).
    browser.execute_script(
        "const s = document.getElementById('chart-smooth'); s.value = '0.9';"
        "s.dispatchEvent(new Event('input', {bubbles: true}));"
    )
    wait.until(lambda d: d.find_element(By.ID, "chart-smooth-value").text == "0.90")
    smoothed = wait.until(lambda d: _hovered(d, "loss", ["loss"]))["loss"]
    assert smoothed[0] == loss_x and float(smoothed[1]) > float(loss_raw) * 1.5

    # Log scale, and the picker: `lr` added, `accuracy` taken away; kept across refreshes.
    browser.find_element(By.ID, "chart-log").click()
    wait.until(
        lambda d: all(f.get_attribute("data-scale") == "log" for f in _curve_charts(d).values())
    )
    browser.find_element(By.CSS_SELECTOR, "#chart-picker input[value=lr]").click()
    browser.find_element(By.CSS_SELECTOR, "#chart-picker input[value=accuracy]").click()
    wait.until(lambda d: set(_curve_charts(d)) == {"loss", "lr", "throughput_images_per_s"})
    drawn = int(browser.find_element(By.ID, "charts").get_attribute("data-drawn"))
    wait.until(lambda d: int(d.find_element(By.ID, "charts").get_attribute("data-drawn")) > drawn)
    assert set(_curve_charts(browser)) == {"loss", "lr", "throughput_images_per_s"}
    assert all(f.get_attribute("data-scale") == "log" for f in _curve_charts(browser).values())
    browser.execute_script("document.getElementById('charts').scrollIntoView()")
    wait.until(lambda d: _hovered(d, "loss", ["loss", "lr"]))  # the shot shows synced hover
    browser.save_screenshot(str(shots / "charts.png"))

    # The rows carry a time too: the x axis can be time instead of step, in the one format.
    Select(browser.find_element(By.ID, "chart-x")).select_by_value("time")
    wait.until(lambda d: all(_legend(c)[0][0] == "time (UTC)" for c in _curve_charts(d).values()))
    on_time = wait.until(lambda d: _hovered(d, "loss", ["loss", "lr"]))
    assert TIME.fullmatch(on_time["loss"][0]) and on_time["lr"][0] == on_time["loss"][0]
    browser.save_screenshot(str(shots / "charts-time.png"))

    # Utilisation charts have a time axis: the legend shows the one time format.
    hovered = wait.until(
        lambda d: _hovered(
            d, "CPU % (100 = one core)", ["CPU % (100 = one core)"], section=".usage"
        )
    )
    assert TIME.fullmatch(hovered["CPU % (100 = one core)"][0]), hovered
    cpu = _charts(browser, ".usage")["CPU % (100 = one core)"]
    assert _legend(cpu)[0][0] == "time (UTC)"

    # Elapsed time while it runs, and the page's times in one format.
    assert (
        browser.find_element(By.XPATH, "//dt[following-sibling::dd[1][@id='wf-ran']]").text
        == "Running for"
    )
    first = browser.find_element(By.ID, "wf-ran").text
    assert ELAPSED.fullmatch(first), first
    wait.until(lambda d: d.find_element(By.ID, "wf-ran").text != first)
    _no_other_time_format(browser.find_element(By.TAG_NAME, "main").text)

    # The list: queue time and run time apart; the run time grows while it runs.
    browser.get(server.url + "/")
    heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#wf-table thead th")]
    assert "Queued" in heads and "Ran" in heads and not any("Total" in h for h in heads), heads
    row = browser.find_element(By.XPATH, f"//tr[td/a[text()='{wid}']]")
    cells = row.find_elements(By.TAG_NAME, "td")
    assert TIME.fullmatch(cells[heads.index("Submitted (UTC)")].text)
    assert ELAPSED.fullmatch(cells[heads.index("Queued")].text)
    ran = cells[heads.index("Ran")].text
    assert ELAPSED.fullmatch(ran), ran
    wait.until(
        lambda d: (
            d.find_element(By.XPATH, f"//tr[td/a[text()='{wid}']]")
            .find_elements(By.TAG_NAME, "td")[heads.index("Ran")]
            .text
            != ran
        )
    )
    _no_other_time_format(browser.find_element(By.TAG_NAME, "main").text)
    browser.save_screenshot(str(shots / "workflows.png"))

    # The log: each line starts with the same format.
    browser.get(f"{server.url}/workflows/{wid}/logs?task=fit")
    wait.until(lambda d: "metrics written" in d.find_element(By.ID, "log").text)
    line = next(
        e.text
        for e in browser.find_elements(By.CSS_SELECTOR, "#log .line")
        if "metrics written" in e.text
    )
    assert TIME.match(line) and line[19:20] == " ", line
    _no_other_time_format(browser.find_element(By.TAG_NAME, "main").text)
    browser.save_screenshot(str(shots / "logs.png"))


def test_compare_shows_how_the_runs_settings_differ(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    first = _submit(server, TUNED, labels={"team": "vision"})
    second = _submit(server, TUNED, set=["lr=0.2"], labels={"team": "vision", "try": "2"})
    third = _submit(server, TUNED, set=["lr=0.4", "batch=128"], labels={"team": "speech"})
    for wid in (first, second, third):
        WebDriverWait(server, 120, poll_frequency=0.5).until(
            lambda s, w=wid: s.api("GET", f"/api/workflow/{w}").json()["status"] == "COMPLETED"
        )
    _log_in(server, browser)
    wait = WebDriverWait(
        browser, 60, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )

    # Two runs: the same differing settings as `trainyard workflow diff A B`.
    browser.get(f"{server.url}/compare?id={first}&id={second}")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#diff-settings tr"))
    rows = _settings(browser)
    assert rows["set.lr"] == ["0.1", "0.2"]
    assert rows["label.try"] == ["-", "2"]
    assert "label.team" not in rows and "set.batch" not in rows
    expected = {
        d["field"]
        for d in server.api("GET", f"/api/workflow/{first}/diff/{second}").json()["differences"]
    }
    assert set(rows) - {"pool / backend"} == expected

    # Three runs: one column per run; curves by step.
    browser.get(f"{server.url}/compare?id={first}&id={second}&id={third}")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#diff-settings tr"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".curves figure.chart canvas"))
    rows = _settings(browser)
    assert rows["set.lr"] == ["0.1", "0.2", "0.4"]
    assert rows["set.batch"] == ["64", "64", "128"]
    assert rows["label.team"] == ["vision", "vision", "speech"]
    assert rows["label.try"] == ["-", "2", "-"]
    heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#diff-settings th")]
    assert heads == ["setting", first, second, third]
    assert _legend(_curve_charts(browser)["loss"])[0][0] == "step"
    _no_other_time_format(browser.find_element(By.TAG_NAME, "main").text)
    browser.save_screenshot(str(screenshot_folder(tmp_path) / "compare.png"))

    # The pools page: no Python None; the local pool's GPU slots are virtual on a machine
    # without GPUs (the capacity column says so for every node of a pool without strict).
    browser.get(server.url + "/pools")
    wait.until(lambda d: d.find_elements(By.ID, "resources"))
    assert "None" not in browser.find_element(By.TAG_NAME, "main").text
    local = [
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "#resources tbody tr")
        if r.find_element(By.TAG_NAME, "td").text == "local"
    ]
    assert local
    for row in local:
        gpu = row.find_element(By.CSS_SELECTOR, "td.gpu").text
        assert ("virtual: no GPU here" in gpu) == (real_gpu_count() == 0), gpu
    browser.save_screenshot(str(screenshot_folder(tmp_path) / "pools.png"))


def _settings(browser: webdriver.Chrome) -> dict[str, list[str]]:
    """The settings table: field -> the value of each run, for the rows that differ."""
    table = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "#diff-settings tr.differs"):
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        table[cells[0]] = cells[1:]
    return table
