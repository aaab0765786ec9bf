"""A real server process (``python -m trainyard.server``) in a temporary home, shared by the
tests of one module, and what they need to attack it over real HTTP: users' tokens, task
tokens, workflows that print fast or nothing at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trainyard import tasktokens
from trainyard.server.auth import TokenRegistry

QUIET = """
workflow:
  name: quiet
  tasks:
  - name: t
    command: [sh, -c, "echo started; sleep 600"]
"""

CHATTY = """
workflow:
  name: chatty
  tasks:
  - name: t
    command: [sh, -c, "i=0; while [ $i -lt 600000 ]; do echo line $i of a task that prints fast; i=$((i+1)); done; sleep 600"]
"""

TERMINAL = ("COMPLETED", "FAILED")


class Live:
    """A server started in ``home`` (extra environment ``env``); stopped by ``stop``."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        full = {
            k: v
            for k, v in os.environ.items()
            if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
        }
        full.update(TRAINYARD_HOME=str(home), **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard.server", "--port", "0"],
            env=full,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not (home / "server.json").exists():
            assert self.proc.poll() is None, "the server exited at start"
            assert time.monotonic() < deadline, "the server did not start within 60 s"
            time.sleep(0.1)
        self.url = json.loads((home / "server.json").read_text())["url"]
        self.token = (home / "token").read_text().strip()

    def add_user(self, name: str) -> str:
        """A new user's token (the server reads tokens.json again when it changed)."""
        return TokenRegistry(self.home).add(name)

    def cli(
        self, *args: str, token: str | None = None, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``trainyard ARGS`` as a real process against this server (``token``: whose)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
        }
        env.update(
            TRAINYARD_HOME=str(self.home), TRAINYARD_TOKEN=token or self.token, COLUMNS="200"
        )
        return subprocess.run(
            [str(Path(sys.executable).parent / "trainyard"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def task_token(self, workflow_id: str) -> str:
        """The token the tasks of ``workflow_id`` are given."""
        return tasktokens.task_token(self.home, workflow_id)

    def api(
        self,
        method: str,
        path: str,
        token: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **kwargs: object,
    ) -> httpx.Response:
        """One request with ``token`` (default: the admin's) and ``headers``."""
        sent = {"Authorization": f"Bearer {token or self.token}", **(headers or {})}
        return httpx.request(method, self.url + path, timeout=60, headers=sent, **kwargs)

    def submit(self, spec: str, token: str | None = None) -> str:
        answer = self.api("POST", "/api/workflow", token, json={"spec_text": spec})
        assert answer.status_code == 200, answer.text
        return answer.json()["id"]

    def wait_running(self, workflow_id: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.api("GET", f"/api/workflow/{workflow_id}").json()["status"]
            if status == "RUNNING":
                return
            assert not status.startswith(TERMINAL), f"{workflow_id} ended: {status}"
            assert time.monotonic() < deadline, f"{workflow_id} not RUNNING: {status}"
            time.sleep(0.3)

    def wait_ended(self, workflow_id: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.api("GET", f"/api/workflow/{workflow_id}").json()["status"]
            if status.startswith(TERMINAL):
                return status
            assert time.monotonic() < deadline, f"{workflow_id} did not end: {status}"
            time.sleep(0.3)

    def rss_bytes(self) -> int:
        """The server process's resident memory now."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        for row in self.api("GET", "/api/workflow").json():
            if not row["status"].startswith(TERMINAL):
                self.api("POST", f"/api/workflow/{row['id']}/cancel")
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One server for the module's tests; workflows still running are cancelled at the end."""
    home = tmp_path_factory.mktemp("home")
    server = Live(home)
    try:
        yield server
    finally:
        server.stop()
