"""A cap on the size of a request body, before FastAPI reads and parses it.

Every body the API takes is a spec request (spec text, its ``localpath`` files, options),
so the cap follows ``spec.MAX_SPEC_BYTES``: ``MAX_BODY_BYTES`` leaves room for the worst JSON
escaping of a spec under the limit (6 bytes for ``\\u0001``), so it never refuses one that
the exact check after parsing (``Submissions.load``) would accept. A body over the cap answers
HTTP 413 with the API's spec-refusal shape (``kind: SpecError``), so the CLI exits 2. A
declared ``Content-Length`` is refused at once; a body sent without one is counted as it
arrives and refused when it passes the cap.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from trainyard.spec.size import MAX_SPEC_BYTES, describe_bytes

__all__ = ["MAX_BODY_BYTES", "BodyLimit", "BodyTooLarge", "body_too_large_response"]

MAX_BODY_BYTES = 6 * MAX_SPEC_BYTES + 64 * 1024
"""The largest request body the server reads: 24 MiB and 64 KiB."""

Scope = dict[str, Any]


class BodyTooLarge(HTTPException):
    """A request body past ``MAX_BODY_BYTES`` (raised while it is read)."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(status_code=413)
        self.size_bytes, self.limit_bytes = size_bytes, limit_bytes


def body_too_large_response(
    size_bytes: int, limit_bytes: int, *, at_least: bool = False
) -> JSONResponse:
    """HTTP 413 in the API's error shape: one spec problem naming both sizes."""
    size = ("more than " if at_least else "") + describe_bytes(size_bytes)
    message = (
        f"the request is {size}, over the limit of {describe_bytes(limit_bytes)} for a "
        f"spec request (a spec may have {describe_bytes(MAX_SPEC_BYTES)} of text); make "
        "it smaller (large data belongs in a dataset or a URL input)"
    )
    row = {"path": "", "message": message, "line": None, "file": None}
    return JSONResponse({"kind": "SpecError", "detail": [row], "warnings": []}, status_code=413)


async def on_body_too_large(_request: Request, exc: Exception) -> JSONResponse:
    """The exception handler for ``BodyTooLarge``."""
    assert isinstance(exc, BodyTooLarge)
    return body_too_large_response(exc.size_bytes, exc.limit_bytes, at_least=True)


class BodyLimit:
    """ASGI middleware refusing bodies over ``max_bytes`` (see module doc)."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await body_too_large_response(declared, self.max_bytes)(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Any) -> Any:
        received = 0

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(received, self.max_bytes)
            return message

        return counted


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
