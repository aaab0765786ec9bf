"""The CLI's client takes the local server's address from its lock note with only cheap
checks (no psutil: issue 15) and falls back to ``ensure_running`` only when its first
request cannot connect; once a server answered, a lost connection is reported as before
(no server started behind a running ``--wait``). Real lock file, real HTTP server on
127.0.0.1; ``ensure_running`` is replaced where the test needs to see whether it is asked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainyard.cli import client as client_module
from trainyard.cli.client import Client
from trainyard.errors import ServerError
from trainyard.server.process import ServerInfo, lock_path
from trainyard.store.lock import FileLock


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def live_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TRAINYARD_SERVER_URL", raising=False)
    monkeypatch.delenv("TRAINYARD_TOKEN", raising=False)
    (tmp_path / "token").write_text("t0ken\n")
    return tmp_path


def _hold(home: Path, url: str) -> FileLock:
    lock = FileLock.acquire(lock_path(home), what="the test home")
    lock.note(
        {"pid": os.getpid(), "host": os.uname().nodename, "url": url, "create_time_s": 0.0}
    )  # a start time no check would accept
    return lock


def _recording_ensure_running(monkeypatch: pytest.MonkeyPatch, url: str) -> list[Path]:
    asked: list[Path] = []

    def ensure_running(home: Path) -> ServerInfo:
        asked.append(home)
        return ServerInfo(pid=1, url=url, create_time_s=0.0)

    monkeypatch.setattr(client_module, "ensure_running", ensure_running)
    return asked


def test_the_note_is_used_without_the_full_check_when_it_answers(
    home: Path, live_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _recording_ensure_running(monkeypatch, "http://127.0.0.1:9")
    lock = _hold(home, live_url)
    try:
        client = Client(home)
        assert client.url == live_url
        assert client.json("GET", "/api/health") == {"path": "/api/health"}
    finally:
        lock.release()
    assert asked == []


def test_a_first_request_that_cannot_connect_is_sent_again_to_the_checked_server(
    home: Path, live_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _recording_ensure_running(monkeypatch, live_url)
    lock = _hold(home, _closed_port_url())  # what a pid reused since its server died says
    try:
        client = Client(home)
        assert client.json("GET", "/api/workflow/x") == {"path": "/api/workflow/x"}
    finally:
        lock.release()
    assert asked == [home] and client.url == live_url


def test_the_checked_server_not_answering_either_is_the_error_of_before(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _closed_port_url()
    asked = _recording_ensure_running(monkeypatch, dead)
    lock = _hold(home, dead)
    try:
        client = Client(home)
        with pytest.raises(
            ServerError,
            match=f"cannot reach the trainyard server at {dead}.*trainyard server start",
        ):
            client.json("GET", "/api/health")
    finally:
        lock.release()
    assert asked == [home]  # checked once, sent twice, then reported


def test_after_an_answer_a_lost_server_is_reported_not_looked_for_again(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _recording_ensure_running(monkeypatch, "http://127.0.0.1:9")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    lock = _hold(home, url)
    try:
        client = Client(home)
        client.json("GET", "/api/health")
        server.shutdown()
        server.server_close()
        with pytest.raises(ServerError, match="cannot reach"):
            client.json("GET", "/api/health")
    finally:
        lock.release()
    assert asked == []  # no server started behind a running --wait


def test_workflow_submit_loads_no_psutil_before_its_request(tmp_path: Path) -> None:
    """A real ``workflow submit`` in a fresh interpreter with the local server's lock held
    (in that process, its note naming a port where nothing listens): psutil is not loaded
    when the request connects; the full check that follows loads it (exit 7 either way)."""
    example = Path(__file__).resolve().parents[3] / "examples" / "torchrun_multinode" / "train.yaml"
    probe = f"""
import os, sys, time
os.environ["TRAINYARD_HOME"] = {str(tmp_path)!r}
os.environ.pop("TRAINYARD_SERVER_URL", None)
from pathlib import Path
from trainyard.store.lock import FileLock
lock = FileLock.acquire(Path({str(lock_path(tmp_path))!r}), what="the test home")
lock.note({{"pid": os.getpid(), "host": os.uname().nodename, "url": {_closed_port_url()!r},
           "create_time_s": time.time()}})  # this process's start, within the 1 s allowed
at_connect = []
sys.addaudithook(lambda event, args: event == "socket.connect" and not at_connect
                 and at_connect.append("psutil" in sys.modules))
from trainyard.cli.main import main
status = main(["workflow", "submit", {str(example)!r}, "--set", "n_gpus_per_node=1", "--dry-run"])
print(status, at_connect, "psutil" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["7", "[False]", "True"], done.stdout + done.stderr
