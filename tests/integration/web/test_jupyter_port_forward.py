"""OSMO's Jupyter cookbook spec (``examples/jupyter/jupyter.yaml``) on the local pool, reached
through ``trainyard workflow port-forward`` in a real headless Chromium (issue 13, "The
Jupyter cookbook spec runs and its page is reached through the forward in the browser
test").

Real throughout: the server process, the sandboxed task running ``jupyter lab`` (the venv's,
first on a task's PATH), the CLI's forward as a process of its own, Debian's chromium driven
by selenium through the system driver. The JupyterLab page is asserted by its title and its
launcher; a notebook made from the launcher runs a cell (its kernel, ipykernel, runs inside
the sandbox); the
forward ends by itself (exit 4, "has ended") once the workflow is cancelled, and its local
port is free again.

Screenshots go to ``$TRAINYARD_SCREENSHOT_DIR`` when set (docs/screenshots/jupyter*.png
were made this way), else to the test's temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser_support import NEEDS_CHROMIUM, headless_chromium, screenshot_folder
from web_live_server import LiveServer, server  # noqa: F401 - the fixture

TRAINYARD = Path(sys.executable).parent / "trainyard"
JUPYTER = Path(sys.executable).parent / "jupyter"
SPEC = Path(__file__).resolve().parents[3] / "examples" / "jupyter" / "jupyter.yaml"
TASK_PORT = 6060  # the cookbook's

pytestmark = [
    NEEDS_CHROMIUM,
    pytest.mark.skipif(
        shutil.which("bwrap") is None,
        reason="needs bubblewrap, the local backend's sandbox (apt-get install "
        "bubblewrap; .ci/run does)",
    ),
    pytest.mark.skipif(
        not JUPYTER.exists(),
        reason="needs JupyterLab in trainyard's environment, where a local "
        "task finds it (pip install -e '.[dev]')",
    ),
    pytest.mark.timeout(540),
]

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with headless_chromium(tmp_path, window="1280x900", page_load_timeout_s=120) as driver:
        yield driver


def _cli_env(live: LiveServer) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(TRAINYARD_HOME=str(live.home), COLUMNS="200")
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _task_status(live: LiveServer, wid: str) -> str:
    data = live.api("GET", f"/api/workflow/{wid}").json()
    return next(t["status"] for g in data["groups"] for t in g["tasks"] if t["name"] == "notebook")


def _jupyter_token(live: LiveServer, wid: str, timeout_s: float = 240) -> str:
    """The token JupyterLab printed in the task's log (it is up once it printed it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = subprocess.run(
            [str(TRAINYARD), "workflow", "logs", wid, "--no-follow"],
            env=_cli_env(live),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if found := re.search(r"/lab\?token=([0-9a-f]+)", logs.stdout):
            return found.group(1)
        assert _task_status(live, wid) in (
            "PENDING",
            "WAITING",
            "SCHEDULING",
            "INITIALIZING",
            "RUNNING",
        ), logs.stdout[-3000:]
        assert time.monotonic() < deadline, (
            f"JupyterLab never printed its URL:\n{logs.stdout[-3000:]}"
        )
        time.sleep(1)


def _get(url: str, timeout_s: float = 60) -> httpx.Response:
    """GET ``url`` (redirects followed), tried again until the forward answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=30, follow_redirects=True)
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.5)


CELL = "import socket; print(6 * 7, socket.gethostname())"


def _run_a_cell(browser: webdriver.Chrome, wait: WebDriverWait) -> None:
    """A new notebook from the launcher, one cell run: its kernel (ipykernel) runs in the
    task's sandbox, and JupyterLab talks to it over the task's own loopback. Each step waits
    for what the page shows (the kernel idle, the text typed) before the next."""
    card = wait.until(
        lambda d: d.find_elements(By.CSS_SELECTOR, '.jp-LauncherCard[data-category="Notebook"]'),
        message="no Notebook card in the launcher",
    )
    card[0].click()
    wait.until(
        lambda d: d.find_elements(
            By.CSS_SELECTOR, '.jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status="idle"]'
        ),
        message="the notebook's kernel never became idle",
    )
    editor = wait.until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell .cm-content"),
        message="no cell editor",
    )[0]
    editor.click()
    ActionChains(browser).send_keys(CELL).perform()
    wait.until(lambda d: "gethostname()" in editor.text, message="the cell's text was not typed")
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    outputs = wait.until(
        lambda d: [
            e.text
            for e in d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output")
            if e.text.strip()
        ],
        message="the cell gave no output",
    )
    assert outputs[0].strip() == "42 notebook", outputs  # the task's host name: its kernel


def test_jupyter_cookbook_page_through_port_forward(
    server: LiveServer, browser: webdriver.Chrome, tmp_path: Path
) -> None:  # noqa: F811
    answer = server.api(
        "POST", "/api/workflow", json={"spec_text": SPEC.read_text(), "spec_name": str(SPEC)}
    )
    assert answer.status_code == 200, answer.text
    wid = answer.json()["id"]
    token = _jupyter_token(server, wid)
    assert _task_status(server, wid) == "RUNNING"

    local = _free_port()
    forward = subprocess.Popen(
        [
            str(TRAINYARD),
            "workflow",
            "port-forward",
            wid,
            "notebook",
            "--port",
            f"{local}:{TASK_PORT}",
        ],
        env=_cli_env(server),
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{local}"
    try:
        # Without the token: JupyterLab's own login page, through the forward.
        first = _get(base + "/")
        assert first.status_code == 200 and "/login" in str(first.url), first.url
        shots = screenshot_folder(tmp_path)
        browser.get(base + "/")
        WebDriverWait(browser, 120).until(
            lambda d: d.find_elements(By.ID, "password_input"), message="no JupyterLab login page"
        )
        browser.save_screenshot(str(shots / "jupyter-login.png"))

        # With it: the JupyterLab application, its launcher drawn by its JavaScript.
        browser.get(f"{base}/lab?token={token}")
        WebDriverWait(browser, 240, poll_frequency=0.5).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Launcher"),
            message="JupyterLab's launcher was never drawn",
        )
        assert browser.title.endswith("JupyterLab"), browser.title
        assert browser.find_elements(By.CSS_SELECTOR, "#jp-main-dock-panel")
        try:
            _run_a_cell(browser, WebDriverWait(browser, 180, poll_frequency=0.5))
        except Exception:
            browser.save_screenshot(str(shots / "jupyter-failed.png"))  # what the page showed
            raise
        browser.save_screenshot(str(shots / "jupyter.png"))

        server.api("POST", f"/api/workflow/{wid}/cancel")
        assert forward.wait(timeout=120) == 4
        assert "has ended" in (forward.stderr.read() if forward.stderr else "")
    finally:
        if forward.poll() is None:
            forward.kill()
            forward.wait()
    # The forward let go of its port: nothing answers there, and a new forward (which
    # listens as socket.create_server does) could take it at once.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", local), timeout=10).close()
    socket.create_server(("127.0.0.1", local)).close()
