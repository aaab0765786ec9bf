"""``python -m trainyard.server [--host H] [--port P]``: run the API server in the foreground.

Port 0 (the default) listens on the port this home's server used last when it is free, else on
any free port (remembered in ``$TRAINYARD_HOME/server.port``); the address is written to
``$TRAINYARD_HOME/server.json`` and to
the home's lock note (``server.process``). Before anything else the server takes the
home's lock and its store's one-engine lock (``store.lock``), and checks that the store can
be trusted (``Store.verify``); if any of these fails it says why on stderr and in
``server.failed`` and exits with the error's code (4: another server holds the lock,
naming its pid; 6: the store is damaged).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from pathlib import Path

import uvicorn

from trainyard.backends.served import load_usable_pools
from trainyard.errors import TrainyardError
from trainyard.pools import trainyard_home
from trainyard.server.auth import TokenRegistry
from trainyard.server.process import (
    info_path,
    read_info,
    record_failure,
    take_home_lock,
    write_info,
)
from trainyard.store.lock import HeldLock, acquire_store_lock


def private_process() -> None:
    """Make what this process (and the launcher and runners it starts) creates readable
    by its owner only: umask 077 (store, server.json, run.json, task.log, events.jsonl).
    Also forget a ``TRAINYARD_TOKEN`` it was started with, so that no task inherits it."""
    os.umask(0o077)
    os.environ.pop("TRAINYARD_TOKEN", None)


def _tighten(home: os.PathLike[str]) -> None:
    """``home`` becomes 0700 when it is ours and others could enter it."""
    st = os.stat(home)
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(home, 0o700)


def take_database_url() -> str:
    """The store's URL (``database_url``), taken out of this process's environment, so that
    no process the server starts (launcher, runners, ``sbatch`` with its default
    ``--export=ALL``) inherits it: a PostgreSQL URL holds the database's password."""
    url = database_url()
    os.environ.pop("TRAINYARD_DATABASE_URL", None)
    return url


def database_url() -> str:
    """The store's URL: ``$TRAINYARD_DATABASE_URL``, else SQLite under the home."""
    from trainyard.store import default_url

    return os.environ.get("TRAINYARD_DATABASE_URL") or default_url(trainyard_home())


def build_app(url: str | None = None):  # noqa: ANN201 - FastAPI app
    """The app for ``$TRAINYARD_HOME`` with its store and engine (the caller holds the
    store's lock). Raises StoreError when the store is damaged, ConfigError for a bad
    ``$TRAINYARD_RUN_RETENTION`` or pools file."""
    from trainyard.backends.served import refused_pools
    from trainyard.engine.reconciler import Engine
    from trainyard.server.app import create_app
    from trainyard.server.service import Service
    from trainyard.store import Store

    home = trainyard_home()
    from trainyard.engine.retention import run_retention_s

    run_retention_s()  # a bad $TRAINYARD_RUN_RETENTION refuses the start (ConfigError)
    store = Store(url or database_url())
    store.verify()
    pools = load_usable_pools()
    engine = Engine(store, home, pools=pools)
    if any(pool.backend == "local" for pool in pools.values()):
        from trainyard.backends.local.sandbox import warm_host_scans

        threading.Thread(target=warm_host_scans, name="trainyard-warm-scans", daemon=True).start()
    service = Service(
        engine, refused_pools=refused_pools(), pools_file=home / "pools.yaml"
    )  # edits apply without a restart
    return create_app(service, TokenRegistry(home, service.task_token_owner))


def _take_locks(url: str) -> list[HeldLock]:
    """The home's lock, then the lock of the store at ``url`` (each waits a moment for a
    CLI that peeks)."""
    locks: list[HeldLock] = [take_home_lock(trainyard_home())]
    store_lock = acquire_store_lock(url, wait_s=2.0)
    if store_lock is not None:
        locks.append(store_lock)
    return locks


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's TCP socket, bound and listening (port 0: any free port); requests made
    from then on wait for uvicorn instead of failing.

    Its proto is ``IPPROTO_TCP``, not 0: asyncio (which uvicorn serves with) sets
    ``TCP_NODELAY`` only on accepted sockets whose proto says TCP. Without it every answer
    on a kept-alive connection after the first waited ~40 ms (Nagle's algorithm holding the
    body until the client's delayed ACK of the headers): each ``--wait`` long poll, each
    query.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


PORT_FILE = "server.port"
"""The port the home's server last listened on (``$TRAINYARD_HOME/server.port``)."""


def stable_socket(home: Path, host: str, port: int) -> socket.socket:
    """``listening_socket``; for ``port`` 0, on the port this home's server used last
    (``PORT_FILE``) when it is free, so dashboard bookmarks survive a restart, else on any
    free port, which is then remembered. A port given explicitly is used as it is."""
    remembered = _remembered_port(home) if port == 0 else None
    if remembered is not None:
        try:
            sock = listening_socket(host, remembered)
        except OSError:  # taken by something else meanwhile: any free port
            sock = None
        if sock is not None:
            return sock
    sock = listening_socket(host, port)
    if port == 0:
        path = home / PORT_FILE
        path.write_text(f"{sock.getsockname()[1]}\n")
        os.chmod(path, 0o600)
    return sock


def _remembered_port(home: Path) -> int | None:
    try:
        port = int((home / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainyard.server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    private_process()
    home = trainyard_home()
    try:
        url = take_database_url()
        locks = _take_locks(url)
        _tighten(home)
        app = build_app(url)
    except TrainyardError as exc:
        record_failure(home, exc)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    sock = stable_socket(home, args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = "127.0.0.1"
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    write_info(home, f"http://{shown}:{port}", lock=locks[0])  # type: ignore[arg-type]
    (home / "server.failed").unlink(missing_ok=True)  # an earlier start's reason is old news
    try:
        server.run(sockets=[sock])
    finally:
        mine = read_info(home)
        if mine is not None and mine.pid == os.getpid():
            info_path(home).unlink(missing_ok=True)
        for lock in reversed(locks):
            lock.release()


if __name__ == "__main__":
    main()
