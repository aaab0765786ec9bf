"""Starting, finding and stopping the local server process.

The server writes ``$TRAINYARD_HOME/server.json`` (``{"pid", "url", "create_time_s"}``) once it
listens; the CLI reads it to find the server and starts one in the background when none
answers (``ensure_running``). ``python -m trainyard.server`` runs one in the foreground.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from trainyard.errors import ServerError

__all__ = ["ServerInfo", "read_info", "is_alive", "start_background", "stop", "ensure_running"]

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServerInfo:
    """Where a running server listens."""

    pid: int
    url: str
    create_time_s: float


def info_path(home: Path) -> Path:
    return home / "server.json"


def write_info(home: Path, url: str) -> None:
    """Record this process as the server (called by the server once it listens)."""
    pid = os.getpid()
    data = {"pid": pid, "url": url, "create_time_s": psutil.Process(pid).create_time()}
    tmp = info_path(home).with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, info_path(home))


def read_info(home: Path) -> ServerInfo | None:
    """The recorded server, or None."""
    path = info_path(home)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return ServerInfo(int(data["pid"]), str(data["url"]), float(data["create_time_s"]))
    except (ValueError, KeyError):
        return None


def is_alive(info: ServerInfo) -> bool:
    """True when the recorded process still runs (same pid AND same start time) and answers."""
    try:
        proc = psutil.Process(info.pid)
        if abs(proc.create_time() - info.create_time_s) > 1.0:
            return False
    except psutil.Error:
        return False
    try:
        # plain http to our own server: no TLS, so no CA bundle to load (issue 15)
        verify = not info.url.lower().startswith("http://")
        return httpx.get(f"{info.url}/api/health", timeout=2.0, verify=verify).status_code == 200
    except httpx.HTTPError:
        return False


def start_background(home: Path, host: str = "127.0.0.1", port: int = 0) -> ServerInfo:
    """Start ``python -m trainyard.server`` detached, wait until it answers, return it.

    Raises:
        ServerError: it did not come up within START_TIMEOUT_S; the message points at its log.
    """
    log_path = home / "server.log"
    old = info_path(home)
    old.unlink(missing_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard.server", "--host", host, "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, "TRAINYARD_HOME": str(home)},
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = read_info(home)
        if info is not None and info.pid == proc.pid and is_alive(info):
            return info
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise ServerError(f"the trainyard server did not start; see {log_path}")


def stop(home: Path, timeout_s: float = 15.0) -> bool:
    """Stop the recorded server (SIGTERM, then SIGKILL). Returns False if none ran."""
    info = read_info(home)
    if info is None or not is_alive(info):
        info_path(home).unlink(missing_ok=True)
        return False
    os.kill(info.pid, signal.SIGTERM)
    try:
        psutil.Process(info.pid).wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        os.kill(info.pid, signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
    info_path(home).unlink(missing_ok=True)
    return True


def ensure_running(home: Path) -> ServerInfo:
    """The running server, started in the background first if none answers."""
    if os.environ.get("TRAINYARD_SERVER_URL"):
        url = os.environ["TRAINYARD_SERVER_URL"].rstrip("/")
        return ServerInfo(pid=0, url=url, create_time_s=0.0)
    info = read_info(home)
    if info is not None and is_alive(info):
        return info
    return start_background(home)
