"""The API's 413 for a request body over ``MAX_BODY_BYTES``, as a spec refusal.

FastAPI's own limit (``FastAPI(max_body_size=...)``, ``server.app``) counts the body as it
arrives and raises a 413 that ``on_body_too_large`` answers in the API's error shape
(``kind: SpecError``: the CLI exits 2). A body whose declared ``Content-Length`` is over the
limit, Starlette's limiter answers itself with a plain-text 413, replacing whatever the app
sends (``starlette.middleware.body_limit``, 1.10: no hook for that answer);
``DeclaredTooLarge``, wrapped outside it, answers those first.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trainyard.spec.size import MAX_SPEC_BYTES, describe_bytes

__all__ = ["MAX_BODY_BYTES", "DeclaredTooLarge", "body_too_large_response", "on_body_too_large"]

MAX_BODY_BYTES = 6 * MAX_SPEC_BYTES + 64 * 1024
"""The largest request body the server reads: 24 MiB and 64 KiB. Every body is a spec
request: this leaves room for the worst JSON escaping (6 bytes for ``\\u0001``) of a spec
under ``spec.MAX_SPEC_BYTES``, so it never refuses a spec that the exact check after parsing
(``Service.load``) accepts."""


def body_too_large_response(size: str) -> JSONResponse:
    """HTTP 413 in the API's error shape: one spec problem naming ``size`` (the request's,
    e.g. ``describe_bytes(n)``) and the limit."""
    message = (
        f"the request is {size}, over the limit of {describe_bytes(MAX_BODY_BYTES)} for a "
        f"spec request (a spec may have {describe_bytes(MAX_SPEC_BYTES)} of text); make "
        "it smaller (large data belongs in a dataset or a URL input)"
    )
    row = {"path": "", "message": message, "line": None, "file": None}
    return JSONResponse({"kind": "SpecError", "detail": [row], "warnings": []}, status_code=413)


async def on_body_too_large(_request: Request, _exc: Exception) -> JSONResponse:
    """The app's handler for status 413: FastAPI's limit, passed while the body arrived."""
    return body_too_large_response(f"more than {describe_bytes(MAX_BODY_BYTES)}")


class DeclaredTooLarge:
    """ASGI middleware: a request declaring a ``Content-Length`` over ``MAX_BODY_BYTES``
    gets ``body_too_large_response`` at once; any other goes on to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = _content_length(scope) if scope["type"] == "http" else None
        if declared is not None and declared > MAX_BODY_BYTES:
            await body_too_large_response(describe_bytes(declared))(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
