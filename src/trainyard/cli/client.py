"""The CLI's HTTP client for the trainyard server (httpx).

It finds the server (``$TRAINYARD_SERVER_URL``, else the local one, started in the background
on first use), sends the token (``$TRAINYARD_TOKEN`` or ``$TRAINYARD_HOME/token``), and turns
error answers back into trainyard errors so the CLI prints each problem once. The server
names the error's class (``kind``); the client raises that same class, so an error exits
with the same code whether it was raised here or on the server.

The local server's address is taken from its lock's note with only a cheap check
(``server.process.claimed_url``: no psutil import on the CLI's start); a request
that cannot connect to it asks ``ensure_running`` (the full check, which may start a server)
and is sent once more, to the address that gives. httpx (with httpcore, and trio where the
dev extra installed it: ~0.25 s) is imported by the first ``Client`` or ``server_version``,
not by importing this module: ``--help`` and a usage error send no request.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainyard.errors import (
    AuthError,
    BackendError,
    BadArgumentError,
    ConfigError,
    DataError,
    ForbiddenError,
    NotFoundError,
    RefusedError,
    ServerError,
    SpecError,
    SpecProblem,
    StoreError,
    TooBusyError,
    TrainyardError,
)
from trainyard.home import trainyard_home

if TYPE_CHECKING:
    from types import ModuleType

    import httpx

    from trainyard.server.answers import HealthAnswer
    from trainyard.server.process import ServerInfo

__all__ = ["Client", "server_version", "running_server_client"]

_BY_KIND: dict[str, type[TrainyardError]] = {
    cls.__name__: cls
    for cls in (
        BadArgumentError,
        NotFoundError,
        ConfigError,
        RefusedError,
        BackendError,
        StoreError,
        ServerError,
        AuthError,
        ForbiddenError,
        DataError,
        TooBusyError,
    )
}
"""Error classes the server may name in ``kind``; SpecError is rebuilt with its problems."""

_BY_STATUS: dict[int, type[TrainyardError]] = {
    400: BadArgumentError,
    401: AuthError,
    403: ForbiddenError,
    404: NotFoundError,
    409: RefusedError,
    422: BadArgumentError,
    429: TooBusyError,
}
"""Without a known ``kind``: 400 and 422 (FastAPI's check of a query parameter) are bad
arguments (exit 2, as click's usage errors), 409/429 refusals (exit 4), anything else a
server failure."""


def _httpx() -> ModuleType:
    """httpx, imported on first use in a pause of the garbage collector (``cli.main``'s
    ``collector_paused``: its objects live as long as the process), httpcore with it
    (httpx would import it at its first ``Client``)."""
    from trainyard.cli.main import collector_paused

    with collector_paused():
        import httpcore  # noqa: F401
        import httpx
    return httpx


def _process() -> ModuleType:
    """``trainyard.server.process`` (it imports httpx), imported on first use as ``_httpx``."""
    _httpx()
    from trainyard.server import process

    return process


def claimed_url(home: Path) -> str | None:
    """``trainyard.server.process.claimed_url``: the local server's address from its lock
    note (cheap checks only), else None."""
    return _process().claimed_url(home)  # type: ignore[no-any-return]


def ensure_running(home: Path) -> ServerInfo:
    """``trainyard.server.process.ensure_running``: the local server, started if none runs."""
    return _process().ensure_running(home)  # type: ignore[no-any-return]


def find_running(home: Path, wait_s: float | None = None) -> ServerInfo | None:
    """``trainyard.server.process.find_running``: the local server if one runs, else None."""
    process = _process()
    if wait_s is None:
        return process.find_running(home)  # type: ignore[no-any-return]
    return process.find_running(home, wait_s=wait_s)  # type: ignore[no-any-return]


def _error_class(status: int, kind: object) -> type[TrainyardError]:
    if isinstance(kind, str) and kind in _BY_KIND:
        return _BY_KIND[kind]
    return _BY_STATUS.get(status, ServerError)


def _row_message(row: object) -> str:
    """One error row as text: ours (``message``) or FastAPI's (``loc`` and ``msg``)."""
    if not isinstance(row, dict):
        return str(row)
    if "message" in row:
        return str(row["message"])
    if "msg" in row:
        where = ".".join(str(part) for part in row.get("loc", [])[1:])
        return f"{where}: {row['msg']}" if where else str(row["msg"])
    return str(row)


def _is_spec_error(status: int, body: dict[str, Any], rows: object) -> bool:
    if body.get("kind") == "SpecError":
        return True
    return (
        status == 422
        and isinstance(rows, list)
        and bool(rows)
        and isinstance(rows[0], dict)
        and "path" in rows[0]
    )


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ServerError(f"server answered {response.status_code}: {response.text[:200]}")
    rows = body.get("detail", [])
    if _is_spec_error(response.status_code, body, rows):
        warnings = body.get("warnings") or []
        raise SpecError([SpecProblem(**row) for row in rows], [SpecProblem(**w) for w in warnings])
    rows = rows if isinstance(rows, list) else [rows]
    message = "; ".join(_row_message(row) for row in rows)
    raise _error_class(response.status_code, body.get("kind"))(message)


def server_version(home: Path | None = None) -> tuple[str, str] | None:
    """``(url, version)`` of the server the CLI would talk to, if one answers now.

    Looks at ``$TRAINYARD_SERVER_URL``, else the server holding the local lock; never starts
    a server and never raises (None when there is none or it does not answer).
    """
    url = os.environ.get("TRAINYARD_SERVER_URL", "").rstrip("/")
    url = url or _logged_in_url(home or trainyard_home()) or ""
    if not url:
        try:
            info = find_running(home or trainyard_home(), wait_s=2.0)
        except (ServerError, OSError):  # e.g. a home this user may not create: no server
            return None
        if info is None:
            return None
        url = info.url
    httpx = _httpx()
    try:
        health: HealthAnswer = httpx.get(f"{url}/api/health", timeout=2.0).json()
        return url, str(health["version"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def running_server_client(home: Path | None = None) -> Client | None:
    """A client of the server the CLI would use, only if one is configured or already runs:
    ``$TRAINYARD_SERVER_URL`` (even if it does not answer: the request then says so), else
    the local server holding the lock (however slowly it answers). Never starts a server;
    None when there is none."""
    home = home or trainyard_home()
    if os.environ.get("TRAINYARD_SERVER_URL") or _logged_in_url(home):
        return Client(home)
    info = find_running(home)
    if info is None:
        return None
    return Client(home, url=info.url)


def _logged_in_url(home: Path) -> str | None:
    """The server of ``login URL`` (``$TRAINYARD_HOME/login.json``), else None."""
    from trainyard.server.auth import read_login  # hmac, secrets: not on --help's path

    login = read_login(home)
    return login["url"].rstrip("/") if login else None


def tls_verify(url: str) -> bool:
    """httpx's ``verify`` for ``url``: True (the CA bundle checks the server) for https,
    False for plain http, where no TLS is spoken and loading the CA bundle only costs the
    CLI's start time."""
    return not url.lower().startswith("http://")


class Client:
    """Calls the server's REST API. Every method raises a TrainyardError on failure."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.home = home or trainyard_home()
        self._from_env = url is None and bool(os.environ.get("TRAINYARD_SERVER_URL"))
        if url is None and not self._from_env:
            url = _logged_in_url(self.home)
        claimed = None if url or self._from_env else claimed_url(self.home)
        self._unchecked = claimed is not None  # the lock note's address, its pid unchecked
        self.url = url or claimed or ensure_running(self.home).url
        if token is None:
            from trainyard.server.auth import read_client_token

            token = read_client_token(self.home)
        self.token = token
        self._timeout_s = timeout_s
        self._http = self._http_client()

    def _http_client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return _httpx().Client(
            base_url=self.url, headers=headers, timeout=self._timeout_s, verify=tls_verify(self.url)
        )

    def _check_server(self) -> bool:
        """Replace an unchecked address by ``ensure_running``'s (the pid's start time
        checked; a server started if none holds the lock). True when it was unchecked, so
        a request that could not connect is worth sending once more."""
        if not self._unchecked:
            return False
        self._unchecked = False
        url = ensure_running(self.home).url
        if url != self.url:
            self._http.close()
            self.url = url
            self._http = self._http_client()
        return True

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; connection failures become ServerError with what to do. The first
        request, if it could not connect to an unchecked address (``claimed_url``), is sent
        once more after the full check (it never reached a server: a submit is not made
        twice); once a server answered, none is sent again."""
        import httpx  # loaded by __init__: a lookup

        try:
            response = self._send(method, path, kwargs, last=False)
        except httpx.ConnectError as exc:
            if not self._check_server():
                raise self._unreachable(exc) from exc
            response = self._send(method, path, kwargs, last=True)
        self._unchecked = False  # it answered: later failures are reported as they come
        _raise_for(response)
        return response

    def _send(
        self, method: str, path: str, kwargs: dict[str, Any], *, last: bool
    ) -> httpx.Response:
        """Send; transport errors become ServerError, but for a ConnectError when not
        ``last`` (``request`` may send it again)."""
        import httpx  # loaded by __init__: a lookup

        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.ConnectError) and not last:
                raise
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: httpx.HTTPError) -> ServerError:
        return ServerError(
            f"cannot reach the trainyard server at {self.url} ({exc}); {self._what_to_do()}"
        )

    def _what_to_do(self) -> str:
        if self._from_env:
            return (
                "check that a server runs there, or unset TRAINYARD_SERVER_URL to use "
                "this machine's own server"
            )
        return "start it with `trainyard server start` (its log: $TRAINYARD_HOME/server.log)"

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A request whose answer is JSON."""
        return self.request(method, path, **kwargs).json()

    def stream_lines(self, path: str, **params: Any) -> Iterator[str]:
        """Lines of a streamed text answer, as they arrive."""
        import httpx  # loaded by __init__: a lookup

        self._check_server()  # a stream is not sent again: its address is checked first
        try:
            with self._http.stream("GET", path, params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                yield from response.iter_lines()
        except httpx.HTTPError as exc:
            raise ServerError(f"log stream from {self.url} broke: {exc}") from exc

    def stream_text(self, path: str, **params: Any) -> Iterator[str]:
        """The text of an answer in pieces as they arrive (nothing held but a piece; an
        error answer raises before the first piece). With ``follow``, no read timeout: a
        followed log may be quiet for long."""
        import httpx  # loaded by __init__: a lookup

        self._check_server()  # a stream is not sent again: its address is checked first
        timeout = None if params.get("follow") else httpx.USE_CLIENT_DEFAULT
        try:
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                yield from response.iter_text()
        except httpx.HTTPError as exc:
            raise ServerError(f"the answer from {self.url} broke off: {exc}") from exc
