"""How a runner step ends an attempt early: ``StepFailed`` carries the exit code to report,
``Stopped`` a SIGTERM that came before the command started."""

from __future__ import annotations

__all__ = ["StepFailed", "Stopped"]


class StepFailed(Exception):
    """A runner step failed; ``exit_code`` is what the attempt reports."""

    def __init__(self, exit_code: int, message: str, failure: str | None = None) -> None:
        self.exit_code = exit_code
        self.failure = failure
        """A kind of failure for the engine (``IMAGE_PULL``), else None."""
        super().__init__(message)


class Stopped(Exception):
    """SIGTERM arrived before the command started."""
