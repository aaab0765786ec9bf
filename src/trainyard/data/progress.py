"""Transfer progress: a small protocol the movers call, a silent default, and rich bars for
the CLI (rich is imported only when bars are made). Calls may come from several worker
threads at once."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

__all__ = ["TransferProgress", "NullProgress", "RichProgress"]


class TransferProgress(Protocol):
    """What a transfer reports while it runs (thread-safe implementations only)."""

    def start(self, label: str, files: int, total_bytes: int) -> None:
        """A transfer of ``files`` files, ``total_bytes`` bytes in all, begins."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes moved."""

    def file_done(self, rel: str) -> None:
        """One more file is complete."""

    def finish(self) -> None:
        """The transfer ended (successfully or not)."""


class NullProgress:
    """Reports nothing (the runner's default: it logs throughput instead)."""

    def start(self, label: str, files: int, total_bytes: int) -> None:
        return None

    def advance(self, nbytes: int) -> None:
        return None

    def file_done(self, rel: str) -> None:
        return None

    def finish(self) -> None:
        return None


class RichProgress:
    """A rich progress bar on stderr: bytes, speed, time left, files done.

    Use as a context manager around the transfers; ``enabled=False`` (for ``--quiet`` or
    JSON output) draws nothing.
    """

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        from rich.console import Console  # imported here: the task runner never draws bars
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[files]}"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self._lock = threading.Lock()
        self._task: TaskID | None = None
        self._files_total = 0
        self._files_done = 0

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.stop()

    def start(self, label: str, files: int, total_bytes: int) -> None:
        with self._lock:
            self._files_total, self._files_done = files, 0
            self._task = self._bar.add_task(label, total=total_bytes, files=self._files_text())

    def advance(self, nbytes: int) -> None:
        with self._lock:
            if self._task is not None:
                self._bar.advance(self._task, nbytes)

    def file_done(self, rel: str) -> None:
        with self._lock:
            self._files_done += 1
            if self._task is not None:
                self._bar.update(self._task, files=self._files_text())

    def finish(self) -> None:
        with self._lock:
            if self._task is not None:
                self._bar.refresh()
            self._task = None

    def _files_text(self) -> str:
        return f"{self._files_done}/{self._files_total} files"
