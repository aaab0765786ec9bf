"""The dashboard in a real headless Chromium (Debian ``chromium`` + ``chromium-driver``,
driven by selenium with the system driver, never a downloaded one) against a real server
process in a temporary home: log in, watch a real workflow (local backend, sandboxed) run
and finish, follow its log live, search it, see its training curve and its utilisation.

Screenshots of each page go to ``$TRAINYARD_SCREENSHOT_DIR`` when set (docs/screenshots was
made this way), else to the test's temporary folder.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser_support import NEEDS_CHROMIUM, headless_chromium, screenshot_folder
from web_live_server import SPEC, LiveServer, server  # noqa: F401 - the fixture

pytestmark = [
    NEEDS_CHROMIUM,
    pytest.mark.timeout(420),
]

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with headless_chromium(tmp_path, window="1280x1000", page_load_timeout_s=60) as driver:
        yield driver


def _text(driver: webdriver.Chrome, css: str) -> str:
    """The text of the first element ``css`` finds; "" when none, or when the page's own
    refresh (htmx, every 3 s while a workflow runs) replaced it between find and read."""
    found = driver.find_elements(By.CSS_SELECTOR, css)
    try:
        return found[0].text if found else ""
    except StaleElementReferenceException:
        return ""


def _no_browser_errors(driver: webdriver.Chrome) -> None:
    """No JavaScript error and no CSP violation was logged by the page."""
    severe = [
        e
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "/login - Failed to load resource" not in e["message"]
    ]  # the wrong token
    assert not severe, severe


def test_login_watch_a_run_follow_its_log_and_see_its_curves(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    shots = screenshot_folder(tmp_path)
    wait = WebDriverWait(browser, 120, poll_frequency=0.2)

    browser.get(server.url + "/")
    assert "/login" in browser.current_url
    browser.find_element(By.ID, "token").send_keys("wrong")
    browser.find_element(By.ID, "login").click()
    wait.until(lambda d: "unknown token" in _text(d, "#login-error"))
    browser.save_screenshot(str(shots / "login.png"))
    browser.find_element(By.ID, "token").send_keys(server.token)
    browser.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list"))

    answer = server.api(
        "POST", "/api/workflow", json={"spec_text": SPEC, "labels": {"demo": "browser"}}
    )
    assert answer.status_code == 200, answer.text
    wid = answer.json()["id"]

    # The log, followed while the task runs: lines arrive before the workflow ends.
    browser.get(f"{server.url}/workflows/{wid}/logs?task=fit")
    wait.until(lambda d: "epoch 1 loss" in _text(d, "#log"))
    assert _text(browser, "#log-state") == "following"
    assert server.api("GET", f"/api/workflow/{wid}").json()["status"] in ("RUNNING", "INITIALIZING")
    assert browser.find_elements(By.CSS_SELECTOR, "#log b") == []  # task text stays text
    assert "starting <b>not bold</b>" in _text(browser, "#log")
    wait.until(lambda d: _text(d, "#log-state") == "ended")
    assert "done" in _text(browser, "#log")
    browser.find_element(By.ID, "log-search").send_keys("epoch 3")
    wait.until(lambda d: _text(d, "#log-count").startswith("1 of "))
    visible = [
        e.text for e in browser.find_elements(By.CSS_SELECTOR, "#log .line") if e.is_displayed()
    ]
    assert len(visible) == 1 and "epoch 3 loss 0.667" in visible[0]
    browser.save_screenshot(str(shots / "logs.png"))

    # The list shows it; its page shows the end state, curves and utilisation.
    browser.get(server.url + "/?label=demo%3Dbrowser")
    link = wait.until(lambda d: d.find_element(By.LINK_TEXT, wid))
    browser.save_screenshot(str(shots / "workflows.png"))
    # A ticked row survives the list's own refresh (every 5 s).
    browser.find_element(By.CSS_SELECTOR, f'input[value="{wid}"]').click()
    time.sleep(6)
    assert browser.find_element(By.CSS_SELECTOR, f'input[value="{wid}"]').is_selected()
    link = browser.find_element(By.LINK_TEXT, wid)
    link.click()
    wait.until(lambda d: _text(d, "#wf-status") == "COMPLETED")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "figure.chart canvas")) >= 3)
    captions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "figure.chart figcaption")]
    assert {"loss", "accuracy", "images_per_s"} <= set(captions), captions
    assert any(c.startswith("CPU %") for c in captions), captions
    assert "fit · COMPLETED" in _text(browser, "svg.dag")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.gantt rect.ph.RUNNING")
    browser.save_screenshot(str(shots / "workflow.png"))
    browser.execute_script("document.getElementById('charts').scrollIntoView()")
    browser.save_screenshot(str(shots / "charts.png"))

    browser.get(f"{server.url}/compare?id={wid}&id={wid}")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "figure.chart canvas"))
    browser.save_screenshot(str(shots / "compare.png"))
    browser.get(server.url + "/pools")
    assert "local" in _text(browser, "#resources")
    browser.save_screenshot(str(shots / "pools.png"))
    browser.get(server.url + "/datasets")
    browser.save_screenshot(str(shots / "datasets.png"))
    _no_browser_errors(browser)


def test_cancel_from_the_workflow_page(server: LiveServer, browser: webdriver.Chrome) -> None:
    spec = SPEC.replace("range(1, 6)", "range(1, 600)")
    wid = server.api("POST", "/api/workflow", json={"spec_text": spec}).json()["id"]
    browser.get(server.url + "/")
    browser.find_element(By.ID, "token").send_keys(server.token)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list"))
    browser.get(f"{server.url}/workflows/{wid}")
    browser.find_element(By.ID, "cancel").click()  # it asks first; dismissed: nothing happens
    alert = WebDriverWait(browser, 10).until(lambda d: d.switch_to.alert)
    assert alert.text.startswith(f"Cancel workflow {wid}?")
    alert.dismiss()
    time.sleep(1.0)
    assert _text(browser, "#msg") == "" and _text(browser, "#wf-status") != "FAILED_CANCELED"
    browser.find_element(By.ID, "cancel").click()
    WebDriverWait(browser, 10).until(lambda d: d.switch_to.alert).accept()
    WebDriverWait(browser, 60).until(lambda d: _text(d, "#msg") == "cancel requested")
    WebDriverWait(browser, 120).until(lambda d: _text(d, "#wf-status") == "FAILED_CANCELED")


def test_dashboard_is_unreachable_without_login(server: LiveServer) -> None:
    answer = httpx.get(server.url + "/pools", follow_redirects=False, timeout=30)
    assert answer.status_code == 303 and answer.headers["location"] == "/login?next=%2Fpools"


DEMO = Path(__file__).resolve().parents[3] / "examples" / "torchrun_multinode" / "train.yaml"


@pytest.mark.slow
def test_the_demo_trainer_run_shows_its_curves_and_logs(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    """OSMO's two-node torchrun demo (one process per node, 2 epochs): the trainer's own
    metrics.jsonl gives the loss, accuracy and images/s curves."""
    pytest.importorskip("torch", reason="the demo trains with torch (pip install -e '.[train]')")
    answer = server.api(
        "POST",
        "/api/workflow",
        json={
            "spec_text": DEMO.read_text(),
            "spec_name": str(DEMO),
            "set": ["n_gpus_per_node=1", "n_epochs=2"],
        },
    )
    assert answer.status_code == 200, answer.text
    wid = answer.json()["id"]
    wait = WebDriverWait(browser, 300, poll_frequency=0.5)
    browser.get(server.url + "/")
    browser.find_element(By.ID, "token").send_keys(server.token)
    browser.find_element(By.ID, "login").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.list"))
    browser.get(f"{server.url}/workflows/{wid}")
    wait.until(lambda d: _text(d, "#wf-status") in ("COMPLETED", "FAILED"))
    assert _text(browser, "#wf-status") == "COMPLETED"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "figure.chart canvas")) >= 3)
    captions = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "figure.chart figcaption")}
    assert {"val_loss", "val_accuracy", "throughput_images_per_s"} <= captions, captions
    assert "master · COMPLETED" in _text(browser, "svg.dag")
    browser.save_screenshot(str(screenshot_folder(tmp_path) / "demo-workflow.png"))
    browser.get(f"{server.url}/workflows/{wid}/logs?task=master")
    wait.until(lambda d: _text(d, "#log-state") == "ended")
    assert "Training completed successfully." in _text(browser, "#log")
    _no_browser_errors(browser)
