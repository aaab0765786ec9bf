"""trainyard's error hierarchy. Every error the CLI prints is one of these; the class alone sets
the exit code (docs/reference.md, "Exit codes"):

    TrainyardError              1 unless a subclass says otherwise
    ├── SpecError               a spec is refused, a list of SpecProblem (HTTP 422, exit 2)
    ├── BadArgumentError        a bad argument or option value: usage error (HTTP 400, exit 2)
    ├── NotFoundError           unknown workflow, task, pool, app, dataset (HTTP 404, exit 3)
    ├── ConfigError             bad pool or server configuration (exit 4)
    ├── RefusedError            the object's state forbids it (HTTP 409, exit 4);
    │                           EngineLockedError (exit 4), TooBusyError (HTTP 429, exit 4)
    ├── BackendError (exit 5), StoreError (exit 6), DataError (a transfer failed, exit 9)
    └── ServerError             unreachable or an error answer (exit 7); AuthError (HTTP 401,
                                exit 8) and under it ForbiddenError (HTTP 403, exit 8)
Backends and clients translate library errors at their edge with ``raise ... from exc``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "TrainyardError",
    "SpecProblem",
    "SpecError",
    "BadArgumentError",
    "NotFoundError",
    "ConfigError",
    "RefusedError",
    "EngineLockedError",
    "TooBusyError",
    "BackendError",
    "StoreError",
    "ServerError",
    "AuthError",
    "ForbiddenError",
    "DataError",
]


class TrainyardError(Exception):
    """Base of every error trainyard raises on purpose."""

    exit_code: int = 1


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec.

    Attributes:
        path: field path such as ``workflow.groups[0].tasks[1].exitActions.COMPLETE``
            (empty for problems of the whole text, e.g. a YAML syntax error).
        message: what is wrong and what to do, one line.
        line: 1-based line in the rendered spec, where known.
        file: the spec file, where known.
    """

    path: str
    message: str
    line: int | None = None
    file: str | None = None

    def __str__(self) -> str:
        return self._text("")

    def warning_text(self) -> str:
        """The one line printed for a warning: ``file:line: warning: path: message``."""
        return self._text(" warning:")

    def to_json(self) -> dict[str, object]:
        """``{"path", "message", "line", "file"}``; ``SpecProblem(**row)`` reads it back."""
        return {"path": self.path, "message": self.message, "line": self.line, "file": self.file}

    def _text(self, kind: str) -> str:
        where = self.file or "spec"
        if self.line is not None:
            where = f"{where}:{self.line}"
        field = f" {self.path}:" if self.path else ""
        return f"{where}:{kind}{field} {self.message}"


class SpecError(TrainyardError):
    """A spec was refused. ``problems`` lists every problem found, in spec order;
    ``warnings`` what was found besides that would not have refused it."""

    exit_code = 2

    def __init__(
        self, problems: list[SpecProblem], warnings: list[SpecProblem] | None = None
    ) -> None:
        self.problems = list(problems)
        self.warnings = list(warnings or [])
        super().__init__("\n".join(str(p) for p in self.problems))


class BadArgumentError(TrainyardError):
    """A request's argument or option value is invalid (an unknown status or priority, a
    count below 1, a malformed ``KEY=VALUE``): a usage error, exit 2 wherever it is found,
    as click's own usage errors, whether the CLI or the server found it."""

    exit_code = 2
    http_status = 400


class NotFoundError(TrainyardError):
    exit_code = 3


class ConfigError(TrainyardError):
    exit_code = 4


class RefusedError(TrainyardError):
    """The request is well formed but the object's state forbids it (HTTP 409 Conflict)."""

    exit_code = 4
    http_status = 409


class EngineLockedError(RefusedError):
    """Another server holds the one-engine lock of this store or home; the message names
    its pid (``store.lock``)."""


class TooBusyError(RefusedError):
    """The server refuses more of this now (HTTP 429 Too Many Requests): e.g. a user's
    log follows and dashboard streams are at their cap; ask again when one ended."""

    http_status = 429


class BackendError(TrainyardError):
    exit_code = 5


class StoreError(TrainyardError):
    exit_code = 6


class ServerError(TrainyardError):
    exit_code = 7


class AuthError(ServerError):
    exit_code = 8
    http_status = 401


class ForbiddenError(AuthError):
    http_status = 403


class DataError(TrainyardError):
    exit_code = 9
