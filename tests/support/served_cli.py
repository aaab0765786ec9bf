"""The CLI against a server in this process, for tests that go through the real CLI path
without a server process: the server's own app (``python -m trainyard.server``'s
``build_app``: store, engine and pools from ``$TRAINYARD_HOME``) served by uvicorn in a
thread on loopback, and ``trainyard ARGV`` run in this process (``cli.main``)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def served(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The server of ``home`` (``$TRAINYARD_HOME``; its app in a thread, on loopback) for
    the duration, the CLI pointed at it (``TRAINYARD_SERVER_URL``); yields its URL. No
    token, database URL or kubeconfig of the caller's environment reaches it."""
    import uvicorn

    from trainyard.server.__main__ import build_app

    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    for name in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN", "TRAINYARD_DATABASE_URL", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("TRAINYARD_SERVER_URL", url)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``trainyard ARGV`` in this process (``cli.main``); its stdout. Fails on an exit code
    other than 0, showing stderr."""
    from trainyard.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out
