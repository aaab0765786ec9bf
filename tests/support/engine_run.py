"""The engine on a local pool with the real bubblewrap sandbox (and podman for image tasks,
where asked), stepped by a background thread: submit a spec, wait, read a task's log and
output. Shared by the isolation tests of ``tests/integration/engine`` and
``tests/integration/backends`` (this folder is on pytest's ``pythonpath``)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from trainyard import spec
from trainyard.backends.local import probe_isolation
from trainyard.engine.reconciler import Engine, Submission
from trainyard.errors import BackendError
from trainyard.pools import Pool, default_local_pool
from trainyard.store import Store

TIMEOUT_S = 180


def require_bwrap() -> None:
    """Skip (saying why) where the bubblewrap sandbox cannot run."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (Debian package bubblewrap) is not installed")
    try:
        probe_isolation("bwrap", "auto")
    except BackendError as exc:
        pytest.skip(f"the bubblewrap sandbox does not work here: {exc}")


class EngineRun:
    """The engine on a local pool (``options`` added to the default local pool's; ``images``
    as the pool's ``images:`` setting, e.g. ``{"*": "podman"}`` to run image tasks in
    podman), on the store at ``url`` (default: SQLite in ``home``), stepped by a background
    thread."""

    def __init__(
        self,
        home: Path,
        url: str | None = None,
        images: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.home = home
        base = default_local_pool()
        self.pool = Pool(
            name=base.name,
            nodes=base.nodes,
            images=dict(images or {}),
            options={**base.options, "sandbox": "bwrap", **options},
        )
        self.engine = Engine(
            Store(url or f"sqlite:///{home / 'db.sqlite'}"), home, pools={self.pool.name: self.pool}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.engine.run_forever, args=(self._stop,), daemon=True
        )
        self._thread.start()

    def run(self, text: str, **values: object) -> str:
        """Validate ``text`` with these ``--set`` values, submit it, wait; returns its id."""
        doc = spec.load(text, set_values=values, pool=self.pool)
        record = self.engine.submit(
            Submission(spec=doc.workflow, spec_text=text, user="tester", pool=self.pool)
        )
        self.engine.wait(record.id, TIMEOUT_S)
        return record.id

    def log(self, wid: str, task: str, retry_id: int = 0) -> str:
        path = self.engine.run_dir(wid, task, retry_id) / "task.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def output(self, wid: str, task: str, name: str, retry_id: int = 0) -> str:
        return (self.engine.run_dir(wid, task, retry_id) / "output" / name).read_text()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.close()
