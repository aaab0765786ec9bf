"""``python -m trainyard.server [--host H] [--port P]``: run the API server in the foreground.

Port 0 picks a free port; the address is written to ``$TRAINYARD_HOME/server.json``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket

import uvicorn

from trainyard.pools import load_pools, trainyard_home
from trainyard.server.auth import TokenRegistry
from trainyard.server.process import info_path, write_info


def private_process() -> None:
    """Make what this process (and the launcher and runners it starts) creates readable
    by its owner only: umask 077 (store, server.json, run.json, task.log, events.jsonl).
    Also forget a ``TRAINYARD_TOKEN`` it was started with, so that no task inherits it."""
    os.umask(0o077)
    os.environ.pop("TRAINYARD_TOKEN", None)


def _tighten(home: "os.PathLike[str]") -> None:
    """``home`` becomes 0700 when it is ours and others could enter it."""
    st = os.stat(home)
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(home, 0o700)


def build_app():  # noqa: ANN201 - FastAPI app
    """The app for ``$TRAINYARD_HOME`` with its store and engine."""
    from trainyard.engine.reconciler import Engine
    from trainyard.server.app import create_app
    from trainyard.server.service import Service
    from trainyard.store import Store, default_url

    home = trainyard_home()
    url = os.environ.get("TRAINYARD_DATABASE_URL") or default_url(home)
    engine = Engine(Store(url), home, pools=load_pools())
    service = Service(engine)
    return create_app(service, TokenRegistry(home, service.task_token_owner))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainyard.server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    private_process()
    home = trainyard_home()
    _tighten(home)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = "127.0.0.1"
    app = build_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    write_info(home, f"http://{shown}:{port}")
    try:
        server.run(sockets=[sock])
    finally:
        if info_path(home).exists():
            info_path(home).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
