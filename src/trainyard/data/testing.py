"""Test helpers shipped with the data layer: a real S3-compatible server on loopback (moto's
``ThreadedMotoServer``, from the ``dev`` extra) and a TCP proxy that can cut connections.

``with MotoS3(buckets=["my-bucket"]) as server:`` then set ``server.env()`` in the test's
environment (``monkeypatch.setenv``); ``tests/integration/data/conftest.py`` has ready
fixtures (``moto_s3``, ``s3_env``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

__all__ = ["MotoS3", "TcpProxy", "s3_env_vars"]

_LOOPBACK = "127.0.0.1"


def s3_env_vars(endpoint_url: str) -> dict[str, str]:
    """The environment that points trainyard (and botocore) at ``endpoint_url`` with fake
    credentials (``testing``/``testing``, region us-east-1)."""
    return {
        "TRAINYARD_S3_ENDPOINT_URL": endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


class MotoS3:
    """moto's S3 server on ``127.0.0.1`` at a free port, in a thread of this process.

    Args:
        buckets: buckets to create once it runs.
    """

    def __init__(self, buckets: Iterable[str] = ("my-bucket",)) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=_LOOPBACK, port=0, verbose=False)
        self._buckets = list(buckets)
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.port}"

    def start(self) -> MotoS3:
        """Start serving (request logging off) and create the buckets."""
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        for bucket in self._buckets:
            self.create_bucket(bucket)
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.stop()
        inner = getattr(self._server, "_server", None)
        if inner is not None:
            inner.server_close()

    def client(self, endpoint_url: str | None = None) -> Any:
        """A boto3 S3 client for this server (or for ``endpoint_url``, e.g. a proxy)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key of ``bucket`` under ``prefix``, sorted."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """``s3_env_vars`` for this server (or for ``endpoint_url``)."""
        return s3_env_vars(endpoint_url or self.endpoint_url)

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class TcpProxy:
    """A loopback TCP proxy to ``127.0.0.1:target_port``: ``cut()`` closes every open
    connection (requests in flight fail), ``refuse_next(n)`` drops the next ``n`` new
    connections at once, ``refuse_for(s)`` drops every new one for ``s`` seconds, ``stop()`` also
    stops accepting (the server looks gone: connection
    refused)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server((_LOOPBACK, 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._refuse = 0
        self._refuse_until = 0.0
        self.refused = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{_LOOPBACK}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            if self._take_refusal():
                _close(client)
                continue
            try:
                upstream = socket.create_connection((_LOOPBACK, self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()

    def refuse_next(self, count: int) -> None:
        """Drop the next ``count`` new connections as soon as they are accepted."""
        with self._lock:
            self._refuse = count

    def refuse_for(self, seconds: float) -> None:
        """Drop every new connection for ``seconds`` (the server is briefly unreachable)."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds

    def _take_refusal(self) -> bool:
        with self._lock:
            if time.monotonic() < self._refuse_until:
                self.refused += 1
                return True
            if self._refuse <= 0:
                return False
            self._refuse -= 1
            self.refused += 1
            return True

    def cut(self) -> None:
        """Close every connection now."""
        with self._lock:
            doomed, self._sockets = self._sockets, []
        for sock in doomed:
            _close(sock)

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        _close(self._listener)
        self.cut()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _close(dst)
