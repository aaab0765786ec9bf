"""A task runner hosted as a thread of a long-lived process (the local backend's launcher)
instead of a process of its own (a forked runner costs several times its CPU).

A backend may host a runner this way (``hostable``) only when the command runs in a bubblewrap
sandbox (whose processes all end with its first one, which dies with the thread:
``--die-with-parent``) and the task moves no data (the data layer reads credentials from the
process environment, which for a thread is the launcher's). The thread leaves in the run folder
the same ``events.jsonl`` and ``task.log`` as a runner process, anything uncaught in
``runner.out``, and ``runner.ended`` (``ENDED``) once done: the backend's sign that the runner
is gone. Why and what it saves: docs/local-backend.md, "Runners as threads".
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from trainyard.runfile import TaskRun, load_run
from trainyard.runner.main import Runner

__all__ = ["HostedRunner", "hostable", "DATA_FIELDS", "ENDED"]

ENDED = "runner.ended"
"""Written in the run folder when a hosted runner's thread ends (whatever happened)."""

DATA_FIELDS = ("inputs", "outputs", "checkpoints")
"""The ``TaskRun`` fields that make a task move data (and so never hosted)."""


def hostable(run: TaskRun) -> bool:
    """Whether ``run`` may be run by a thread (see module docstring): its command starts
    behind a sandbox with a PID namespace (``sandbox.mounts``: bubblewrap) and it has no
    inputs, outputs or checkpoints."""
    return bool(run.sandbox.mounts) and not any(getattr(run, f) for f in DATA_FIELDS)


class HostedRunner:
    """One attempt run by a thread.

    Args:
        run_json: the attempt's ``run.json`` (its folder is the run folder).
        out: the file that gets what the runner could not report itself (appended).
        env: the environment the task's own is laid over (the backend's).
        first: called on the thread before anything else (the launcher moves the thread into
            the group's network namespace there, so the command starts in it); what it raises
            ends the attempt as a malformed ``run.json`` does.
    """

    def __init__(
        self,
        run_json: Path,
        out: Path,
        env: Mapping[str, str],
        first: Callable[[], None] | None = None,
    ) -> None:
        self.first = first
        self.run_json = Path(run_json)
        self.out = Path(out)
        self.env = dict(env)
        self._runner: Runner | None = None
        self._stop_wanted = False
        self._stop_force = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._main, daemon=True, name=f"runner {self.run_json.parent}"
        )

    @property
    def run_dir(self) -> Path:
        """The attempt's run folder."""
        return self.run_json.parent

    def start(self) -> None:
        """Start the thread; returns at once."""
        (self.run_dir / ENDED).unlink(missing_ok=True)
        self._thread.start()

    def is_alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread (at most ``timeout_s``)."""
        self._thread.join(timeout_s)

    def stop(self, force: bool = False) -> None:
        """Stop the attempt as SIGTERM stops a runner process (``Runner.request_stop``;
        ``force``: its command SIGKILLed at once); a stop before the runner exists takes
        effect as it starts. Returns at once."""
        with self._lock:
            self._stop_wanted = True
            self._stop_force = self._stop_force or force
            runner = self._runner
        if runner is not None:
            runner.request_stop(force)

    def _main(self) -> None:
        try:
            if self.first is not None:
                self.first()
            runner = Runner(load_run(self.run_json), base_env=self.env)
            with self._lock:
                self._runner = runner
                if self._stop_wanted:
                    runner.request_stop(self._stop_force)
            runner.execute()
        except BaseException:  # noqa: BLE001 - a thread's end must always be visible
            with open(self.out, "a", encoding="utf-8") as handle:
                handle.write(traceback.format_exc())
        finally:
            (self.run_dir / ENDED).touch()
