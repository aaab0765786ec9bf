"""A real trainyard server process in a temporary home, for the dashboard's tests."""

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

__all__ = ["SPEC", "LiveServer", "server"]

# Prints a line per epoch and appends the documented metrics format (docs/dashboard.md)
# to {{output}}/metrics.jsonl, slowly enough that the log is followed while it runs.
SPEC = """
workflow:
  name: curves
  tasks:
  - name: fit
    image: ubuntu:24.04
    command: [python3]
    args: [/tmp/fit.py, "{{output}}"]
    files:
    - path: /tmp/fit.py
      contents: |
        import json, sys, time
        out = sys.argv[1]
        print("starting <b>not bold</b>", flush=True)
        for epoch in range(1, 6):
            time.sleep(2.0)
            loss = 2.0 / epoch
            with open(out + "/metrics.jsonl", "a") as f:
                f.write(json.dumps({"epoch": epoch, "loss": loss, "accuracy": 1 - loss / 4,
                                    "images_per_s": 1000 + 10 * epoch}) + "\\n")
            print(f"epoch {epoch} loss {loss:.3f}", flush=True)
        print("done", flush=True)
"""


class LiveServer:
    def __init__(self, home: Path) -> None:
        self.home = home
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
        }
        env.update(TRAINYARD_HOME=str(home), TRAINYARD_USAGE_INTERVAL_S="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard.server", "--port", "0"],
            env=env,
            start_new_session=True,
        )
        deadline = time.time() + 60
        while not (home / "server.json").exists():
            assert self.proc.poll() is None, "the server exited at start"
            assert time.time() < deadline, "the server did not start within 60 s"
            time.sleep(0.1)
        self.url = json.loads((home / "server.json").read_text())["url"]
        self.token = (home / "token").read_text().strip()

    def api(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        return httpx.request(
            method,
            self.url + path,
            timeout=30,
            headers={"Authorization": f"Bearer {self.token}"},
            **kwargs,
        )

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server in ``tmp_path/home``; workflows still running are cancelled at the end."""
    home = tmp_path / "home"
    home.mkdir()
    live = LiveServer(home)
    try:
        yield live
    finally:
        for row in live.api("GET", "/api/workflow").json():
            if not (row["status"] == "COMPLETED" or row["status"].startswith("FAILED")):
                live.api("POST", f"/api/workflow/{row['id']}/cancel")
        live.stop()
