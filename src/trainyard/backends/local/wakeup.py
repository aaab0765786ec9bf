"""The socket through which task runners wake the engine when they write an event.

The local backend reads facts from each attempt's ``events.jsonl`` at every engine step (a
tick of ``Engine.poll_interval_s``, 50 ms). To read a start or an exit as it happens, the
backend binds a Unix datagram socket; a runner whose environment names it
(``runner.report.FACTS_SOCKET_ENV``) sends one datagram after each event it writes
(``runner.report.notify_socket``), and a thread here calls the engine's ``wake``. The file
stays the one record of facts: a datagram only says "look now", so one lost or never sent
(a runner of an older server, a socket that could not be bound) costs at most one tick.

The socket lives in the backend's state folder (the owner's only, under the 0700 home), so
only its owner's processes can send to it; a task never can (its sandbox shows no home).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["FactsSocket", "MAX_SOCKET_PATH_BYTES"]

log = logging.getLogger("trainyard.backends.local.wakeup")

MAX_SOCKET_PATH_BYTES = 107
"""The longest path a Unix socket can be bound to on Linux (``sun_path`` is 108 bytes)."""


class FactsSocket:
    """A bound Unix datagram socket and the daemon thread that calls ``wake`` per datagram.

    Args:
        path: where to bind; an existing file there (a socket left by a killed server) is
            replaced.
        wake: called (from the thread) after each datagram received; must not block long.

    Raises:
        OSError: the socket cannot be bound (a path over ``MAX_SOCKET_PATH_BYTES``, a folder
            that is not there or not writable).
    """

    def __init__(self, path: Path, wake: Callable[[], None]) -> None:
        self.path = str(path)
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH_BYTES:
            raise OSError(f"socket path longer than {MAX_SOCKET_PATH_BYTES} bytes: {self.path}")
        self._wake = wake
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            Path(self.path).unlink(missing_ok=True)
            self._sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self._inode = os.stat(self.path).st_ino
        except OSError:
            self._sock.close()
            raise
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="facts socket", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                self._sock.recv(64)
            except OSError:  # closed under us: the end
                return
            if not self._closed.is_set():
                self._wake()

    def close(self) -> None:
        """Stop listening and remove the socket file, unless another ``FactsSocket`` has been
        bound at the same path since (a new backend of a new engine). Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:  # the reader's recv returns once it gets a datagram, or on shutdown
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._sock.close()
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass
