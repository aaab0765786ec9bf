"""Periodic checkpoints: upload a task folder to a URL in the background while the command runs.

One thread per checkpoint spec. It uploads the files of ``path`` that match ``regex`` and
changed since its last upload, waits ``frequency_s`` (OSMO: "time between one checkpoint
ending and the next one beginning"), and again; ``finish()`` stops it and uploads once more.
Uploads never block the command and never fail the task: a failed upload is logged and
tried again next time. Each file is uploaded under a temporary name and then renamed
(``DataHook.sync``), so a partial checkpoint is never taken for a complete one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from trainyard.data.runnerhook import DataHook, UploadState
from trainyard.errors import DataError
from trainyard.runfile import RunCheckpoint

__all__ = ["Checkpointer"]


class Checkpointer:
    """Uploads ``local_path`` to ``spec.url`` every ``spec.frequency_s`` seconds.

    Args:
        spec: the checkpoint spec (``url``, ``frequency_s``, ``regex``).
        local_path: ``spec.path`` resolved where the runner sees it.
        hook: moves the bytes.
        log: one-line messages for the task log.
    """

    def __init__(
        self, spec: RunCheckpoint, local_path: Path, hook: DataHook, log: Callable[[str], None]
    ) -> None:
        self.spec = spec
        self.local_path = local_path
        self.hook = hook
        self.log = log
        self.uploads = 0
        self._state: UploadState = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="checkpoint", daemon=True)

    def start(self) -> None:
        """Start the background uploads (the first after ``frequency_s``)."""
        self._thread.start()

    def finish(self, timeout_s: float | None = None) -> None:
        """Stop the thread and upload once more. Safe to call once the command ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.upload_once()

    def upload_once(self) -> int:
        """Upload what changed now; returns the number of files (0 on failure)."""
        with self._lock:
            try:
                count = self.hook.sync(self.local_path, self.spec.url, self.spec.regex, self._state)
            except DataError as exc:
                self.log(f"checkpoint of {self.spec.path} to {self.spec.url} failed: {exc}")
                return 0
        if count:
            self.uploads += 1
            self.log(f"checkpoint: {count} file(s) of {self.spec.path} uploaded to {self.spec.url}")
        return count

    def _loop(self) -> None:
        while not self._stop.wait(self.spec.frequency_s):
            self.upload_once()
