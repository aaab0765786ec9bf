"""Retry transient storage errors with exponential backoff, and say so in the log.

Transient: lost or refused connections, timeouts, throttling and 5xx answers, a checksum
that did not match (bytes damaged in flight). Everything else (missing file, no permission,
bad bucket, exclusive create refused) fails at once: retrying cannot help.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trainyard.data.scrub import scrub

__all__ = ["RetryPolicy", "ChecksumMismatch", "is_transient", "with_retry"]

T = TypeVar("T")

_TRANSIENT_NAMES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ClientConnectionError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ProtocolError",
        "HTTPClientError",
    }
)
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EPIPE,
        errno.EAGAIN,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
    }
)
_TRANSIENT_WORDS = (
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttl",
    "TooManyRequests",
    "503",
    "500 ",
    "502",
    "504",
)
_PERMANENT = (
    FileNotFoundError,
    PermissionError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
)
_MAX_BACKOFF_S = 30.0


class ChecksumMismatch(OSError):
    """The bytes read back do not have the sha256 the manifest says (transient)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one file.

    Attributes:
        attempts: tries in all (1 = no retry).
        backoff_s: pause before the second try; doubled before each next one, at most 30 s.
    """

    attempts: int = 5
    backoff_s: float = 0.5

    def delay_s(self, failed_attempts: int) -> float:
        """The pause after ``failed_attempts`` (1, 2, ...) failures."""
        return min(self.backoff_s * 2 ** (failed_attempts - 1), _MAX_BACKOFF_S)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _one_is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ChecksumMismatch | ConnectionError | TimeoutError):
        return True
    if type(exc).__name__ in _TRANSIENT_NAMES:
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    return any(word in str(exc) for word in _TRANSIENT_WORDS)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying may help: ``exc`` or an error it was raised from is transient, and
    the outermost error is not a plain missing-file or permission error."""
    if isinstance(exc, _PERMANENT):
        return False
    return any(_one_is_transient(e) for e in _chain(exc))


def with_retry(
    action: Callable[[], T], what: object, policy: RetryPolicy, log: Callable[[str], None]
) -> T:
    """Run ``action``; on a transient error log it, wait, and run it again.

    Args:
        action: the operation (must be safe to repeat: a whole-file transfer is).
        what: the file or object, for the log (its ``str``, taken only when logging;
            scrubbed before it is written).
        policy: attempts and backoff.
        log: one-line messages ("retrying ... in 0.5 s: cause").

    Returns:
        What ``action`` returned.

    Raises:
        Exception: the last error, once it is permanent or the attempts are used up.
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised when final
            if attempt >= policy.attempts or not is_transient(exc):
                raise
            delay = policy.delay_s(attempt)
            log(
                scrub(
                    f"transient error on {what} (attempt {attempt} of {policy.attempts}), "
                    f"retrying in {delay:.1f} s: {type(exc).__name__}: {exc}"
                )
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
