"""Why a workflow failed and why it waits, end to end (issue 28): a real server process, real
sandboxed tasks on the local pool, the real ``trainyard`` CLI as a process, the JSON API, and
the dashboard in a real headless Chromium; plus ``trainyard dashboard``'s one-time login link
and the server's port kept across a restart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import NEEDS_CHROMIUM, headless_chromium, screenshot_folder
from web_live_server import LiveServer, server  # noqa: F401 - the fixture

pytestmark = [pytest.mark.timeout(300)]

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TRAINYARD = Path(sys.executable).parent / "trainyard"

FAILING = """
workflow:
  name: oops
  tasks:
  - name: prepare
    command: [sh, -c]
    args: ["for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo filler $i; done; echo 'oops: data missing' >&2; exit 3"]
"""

HOG = """
workflow:
  name: gpu-hog
  resources:
    default: {gpu: 8, cpu: 1, memory: 1Gi}
  groups:
  - name: hog
    tasks:
    - {name: a, lead: true, command: [sleep, "120"]}
    - {name: b, command: [sleep, "120"]}
    - {name: c, command: [sleep, "120"]}
    - {name: d, command: [sleep, "120"]}
"""

WANTS_4 = """
workflow:
  name: {name}
  resources:
    default: {{gpu: 4, cpu: 1, memory: 1Gi}}
  tasks:
  - name: train
    command: [sleep, "1"]
"""


def _cli(live: LiveServer, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(TRAINYARD_HOME=str(live.home), NO_COLOR="1", COLUMNS="200")
    return subprocess.run(
        [str(TRAINYARD), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _submit(live: LiveServer, spec: str) -> str:
    got = live.api("POST", "/api/workflow", json={"spec_text": spec})
    assert got.status_code == 200, got.text
    return got.json()["id"]


def _query(live: LiveServer, workflow_id: str) -> dict[str, Any]:
    return live.api("GET", f"/api/workflow/{workflow_id}").json()


def _wait(live: LiveServer, workflow_id: str, check: Any, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        data = _query(live, workflow_id)
        if check(data):
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.3)


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with headless_chromium(tmp_path, window="1280x1000", page_load_timeout_s=60) as driver:
        yield driver


def test_a_failed_workflow_says_which_task_its_exit_code_why_and_its_last_lines(
    server: LiveServer, tmp_path: Path
) -> None:
    spec = tmp_path / "oops.yaml"
    spec.write_text(FAILING)
    waited = _cli(server, "workflow", "submit", str(spec), "--wait")
    assert waited.returncode == 1, waited.stderr
    workflow_id = re.search(r"Workflow submitted: (\S+)", waited.stdout).group(1)
    assert (
        "Task prepare retry 0 FAILED (exit code 3): the command exited with code 3" in waited.stdout
    )
    assert "| oops: data missing" in waited.stdout
    assert "| filler 12" in waited.stdout and "| filler 2\n" not in waited.stdout  # bounded

    failure = _query(server, workflow_id)["failure"]
    assert failure["task"] == "prepare" and failure["exit_code"] == 3
    assert failure["reason"] == "the command exited with code 3"
    assert failure["log_tail"][-1] == "oops: data missing"
    assert len(failure["log_tail"]) == 10

    shown = _cli(server, "workflow", "query", workflow_id)
    assert shown.returncode == 0, shown.stderr
    assert (
        "Failed: task prepare retry 0 FAILED (exit code 3): the command exited with code 3"
        in shown.stdout
    )
    assert "| oops: data missing" in shown.stdout


def _log_in(live: LiveServer, browser: webdriver.Chrome, page: str) -> None:
    """Open ``page`` through a one-time login link, as ``trainyard dashboard`` does."""
    link = live.api("POST", "/api/login-link", params={"next": page}).json()["path"]
    browser.get(live.url + link)


@NEEDS_CHROMIUM
def test_a_waiting_group_says_what_it_needs_what_is_free_and_what_it_waits_behind(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    hog = _submit(server, HOG)
    _wait(server, hog, lambda d: d["status"] == "RUNNING")
    first = _submit(server, WANTS_4.format(name="queued"))
    mine = _submit(server, WANTS_4.format(name="mine"))
    data = _wait(
        server,
        mine,
        lambda d: d["waiting"] and d["waiting"][0]["reason"] != "waiting for the scheduler",
        timeout_s=30,
    )
    assert data["status"] == "PENDING"
    assert data["waiting"][0]["reason"] == (
        f"needs 4 GPUs on pool local: 0 of 32 free; held by {hog}; behind {first} (2nd in queue)"
    )
    shown = _cli(server, "workflow", "query", mine)
    assert (
        f"Waiting: group train SCHEDULING: needs 4 GPUs on pool local: 0 of 32 free; "
        f"held by {hog}" in shown.stdout
    )
    _log_in(server, browser, f"/workflows/{mine}")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "wf-waiting"))
    box = browser.find_element(By.ID, "wf-waiting")
    assert data["waiting"][0]["reason"] in box.text
    assert box.location["y"] < browser.find_element(By.CSS_SELECTOR, "svg.dag").location["y"]
    browser.save_screenshot(str(screenshot_folder(tmp_path) / "why-waiting.png"))
    server.api("POST", f"/api/workflow/{hog}/cancel")
    done = _wait(server, mine, lambda d: d["status"] == "COMPLETED", timeout_s=120)
    assert done["waiting"] == []


@NEEDS_CHROMIUM
def test_the_dashboard_command_logs_a_browser_in_and_the_page_says_why_it_failed(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    workflow_id = _submit(server, FAILING)
    _wait(server, workflow_id, lambda d: d["status"] == "FAILED")
    got = _cli(server, "dashboard", workflow_id, "--no-open")
    assert got.returncode == 0, got.stderr
    link = next(line for line in got.stdout.splitlines() if "/login/once?" in line).strip()
    assert link.startswith(server.url)
    browser.get(link)
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)
    wait.until(lambda d: d.find_elements(By.ID, "wf-failure"))
    assert f"/workflows/{workflow_id}" in browser.current_url
    assert browser.find_element(By.ID, "wf-failure-task").text == "prepare"
    assert browser.find_element(By.ID, "wf-failure-exit").text == "3"
    assert browser.find_element(By.ID, "wf-failure-reason").text == "the command exited with code 3"
    assert browser.find_element(By.ID, "wf-failure-tail").text.endswith("oops: data missing")
    browser.save_screenshot(str(screenshot_folder(tmp_path) / "why-failed.png"))
    # The box is at the top: above the groups and the timeline.
    top = browser.find_element(By.ID, "wf-failure").location["y"]
    assert top < browser.find_element(By.CSS_SELECTOR, "svg.dag").location["y"]
    # One time format (UTC, seconds), queue and run time apart.
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", browser.find_element(By.ID, "wf-submitted").text
    )
    assert re.fullmatch(r"\d+s", browser.find_element(By.ID, "wf-queued").text)
    assert re.fullmatch(r"\d+s", browser.find_element(By.ID, "wf-ran").text)
    # The pools page: no Python None, the local pool's capacity marked virtual.
    browser.get(server.url + "/pools")
    wait.until(lambda d: d.find_elements(By.ID, "resources"))
    assert "None" not in browser.find_element(By.TAG_NAME, "main").text
    cells = browser.find_elements(By.CSS_SELECTOR, "#resources td.capacity")
    assert cells and all(c.text == "virtual" for c in cells)
    # The link is used up: a second browser visit is sent to the login page.
    browser.delete_all_cookies()
    browser.get(link)
    wait.until(lambda d: "/login" in d.current_url or d.find_elements(By.ID, "token"))
    assert "used or has expired" in browser.page_source


def test_a_login_link_needs_a_bearer_token(server: LiveServer) -> None:
    got = httpx.post(server.url + "/api/login-link", timeout=30)
    assert got.status_code == 401
    assert (
        httpx.get(
            server.url + "/login/once?code=made-up", timeout=30, follow_redirects=False
        ).status_code
        == 401
    )


def test_the_server_keeps_its_port_across_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = LiveServer(home)
    try:
        url = first.url
    finally:
        first.stop()
    (home / "server.json").unlink(missing_ok=True)
    second = LiveServer(home)
    try:
        assert second.url == url
    finally:
        second.stop()


def test_a_taken_port_gives_another_which_is_then_kept(tmp_path: Path) -> None:
    import socket

    home = tmp_path / "home"
    home.mkdir()
    first = LiveServer(home)
    port = int(first.url.rsplit(":", 1)[1])
    first.stop()
    (home / "server.json").unlink(missing_ok=True)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)
        second = LiveServer(home)
        try:
            assert second.url != first.url
        finally:
            second.stop()
    assert (home / "server.port").read_text().strip() == second.url.rsplit(":", 1)[1]
