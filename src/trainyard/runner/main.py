"""The task runner: one attempt of one task, the same program on every backend (OSMO's
sidecar plays this part). ``Runner.execute`` reports INITIALIZING, prepares the sandbox
(3003), downloads inputs (2010), writes files and credentials (256), passes the barrier
(2024), reports RUNNING, runs the command with its checkpoints, uploads outputs after success
only (2012) and reports EXITED. A task log that cannot be written stops the command (2022);
SIGTERM stops the attempt (never exit 0). Each step lives in its own object: ``TaskPaths``,
``TaskCredentials``, ``SandboxSetup``, ``TaskData``, ``TaskCommand``; docs/architecture.md
tells the whole order.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO

from trainyard.data.runnerhook import DataHook
from trainyard.linux import proctree
from trainyard.runfile import TaskRun
from trainyard.runner.barrier import BarrierTimeout, wait_for_group
from trainyard.runner.checkpoint import Checkpointer
from trainyard.runner.credentials import secrets_of
from trainyard.runner.credfiles import TaskCredentials
from trainyard.runner.failures import StepFailed, Stopped
from trainyard.runner.report import (
    FACTS_SOCKET_ENV,
    LOG_FAILED_EXIT_CODE,
    EventWriter,
    TaskLog,
    reserve_space,
)
from trainyard.runner.sandboxsetup import SandboxSetup
from trainyard.runner.taskcommand import TaskCommand, task_environment
from trainyard.runner.taskdata import TaskData
from trainyard.runner.taskpaths import TaskPaths
from trainyard.status import STOPPED_EXIT_CODE, ExitCode

__all__ = ["Runner", "StepFailed", "task_environment"]


class Runner:
    """Runs one ``TaskRun``. ``execute()`` does every step and returns the exit code.

    Args:
        run: the attempt.
        hook: the data layer (default: loaded on first use).
        echo: a stream that gets a copy of every task log line.
        base_env: the environment the task's own is laid over (default ``os.environ``; a
            runner hosted as a thread gets its backend's, see ``trainyard.runner.hosted``).
    """

    def __init__(
        self,
        run: TaskRun,
        hook: DataHook | None = None,
        echo: IO[str] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.base_env: Mapping[str, str] = os.environ if base_env is None else base_env
        self.run = run
        self.run_dir = Path(run.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventWriter(self.run_dir, notify=self.base_env.get(FACTS_SOCKET_ENV))
        self.reserve = reserve_space(self.run_dir)
        self.log = TaskLog(self.run_dir, run.task, echo=echo, on_failure=self._on_log_failure)
        self.log.secrets = secrets_of(run)
        self.forced = False
        """A forced stop was asked (``request_stop(force=True)``: SIGKILL, no SIGTERM)."""
        run.hosts = run.runtime_hosts(self.base_env)
        self.stop = threading.Event()
        self.paths = TaskPaths(run)
        self.credentials = TaskCredentials(run, self.run_dir, self.log.runner)
        self.setup = SandboxSetup(run, self.paths, self.log.runner)
        self.data = TaskData(run, self.paths, self.log.runner, hook)
        self.command = TaskCommand(
            run, self.paths, self.log, self.base_env, self.stop, self.credentials, self.setup
        )

    def pass_barrier(self) -> None:
        """Wait for the group. Raises StepFailed(2024) on timeout, Stopped on SIGTERM."""
        barrier = self.run.barrier
        if not barrier.enabled:
            return
        self.log.runner(f"barrier: waiting for {', '.join(barrier.tasks)}")
        try:
            if not wait_for_group(barrier, self.run.task, self.run.retry_id, self.stop):
                raise Stopped()
        except BarrierTimeout as exc:
            raise StepFailed(ExitCode.BARRIER_FAILED, str(exc)) from exc
        self.log.runner("barrier: every task of the group is ready")

    def run_command(self) -> int:
        """Run the command with its checkpoints; returns its exit status."""
        return self.command.run_to_end(self._checkpoints)

    def _checkpoints(self) -> list[Checkpointer]:
        """The spec's checkpoints whose URLs the pool's data roots allow (tokens resolved)."""
        return [
            Checkpointer(
                c.model_copy(update={"url": self.paths.storage_url(c.url)}),
                self.paths.local_path(c.path),
                self.data.hook_for(c.url),
                self.log.runner,
            )
            for c in self.run.checkpoints
            if self.data.checkpoint_allowed(c.url)
        ]

    # ------------------------------------------------------------------ whole attempt

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """SIGTERM/SIGINT handler: stop the attempt (see ``request_stop``)."""
        self.request_stop()

    def request_stop(self, force: bool = False) -> None:
        """Stop the attempt: before the command, no command runs; during it, its process
        group gets SIGTERM, then SIGKILL after ``stop_grace_s`` (``force``: SIGKILL now, no
        SIGTERM). Returns at once; safe to call from a signal handler, from another thread
        and more than once."""
        self.forced = self.forced or force
        self.stop.set()
        self.command.terminate(force)

    def _on_log_failure(self, _exc: OSError) -> None:
        """The task log cannot be written: stop the command (``_check_log`` then fails the
        attempt). Called once, from whichever thread wrote the line."""
        command = getattr(self, "command", None)  # None: before the command object exists
        if command is not None:
            command.terminate()

    def _check_log(self) -> None:
        """Raises StepFailed(2022) once a line of the task log could not be written."""
        failure = self.log.failure
        if failure is None:
            return
        dropped = (
            f"; {self.log.dropped_lines} line(s) of its output dropped"
            if self.log.dropped_lines
            else ""
        )
        raise StepFailed(
            LOG_FAILED_EXIT_CODE,
            f"cannot write the task log {self.log.path}: "
            f"{failure.strerror or failure}; the command was stopped{dropped}",
        )

    def _header(self) -> None:
        """One short line (attempt, group, node, isolation, image), then the backend's full
        isolation description as ``[detail]`` lines (shown with ``logs --verbose``)."""
        run = self.run
        box = run.sandbox
        lines = box.description.splitlines()
        where = box.summary or (lines[0] if lines else f"image {run.image or '-'}")
        self.log.runner(
            f"workflow {run.workflow_id} task {run.task} retry {run.retry_id} "
            f"(group {run.group}, task {run.task_index + 1} of {len(run.group_tasks)}"
            f"{', lead' if run.lead else ''}): {where}"
        )
        for line in lines:
            self.log.detail(line)

    def _steps(self) -> tuple[int, str]:
        self._header()
        if self.run.sandbox.start_error:
            raise StepFailed(
                ExitCode.START_ERROR,
                self.run.sandbox.start_error,
                "IMAGE_PULL" if self.run.sandbox.missing_image else None,
            )
        self.setup.mount()
        self.credentials.check()
        self.run.output_path.mkdir(parents=True, exist_ok=True)
        self.data.download_inputs()
        self.setup.write_files()
        self.credentials.write()
        self.setup.make_python_env()
        self.setup.give_to_task()
        mark_stage(self.run_dir, "barrier_start")
        self.pass_barrier()
        if self.stop.is_set():
            raise Stopped()
        self._check_log()
        self.events.emit("RUNNING")
        code = self.run_command()
        self._check_log()
        mark_stage(self.run_dir, "command_exit")
        if self.stop.is_set():
            return code or STOPPED_EXIT_CODE, (
                "stopped by SIGKILL (a forced cancel: no SIGTERM first)"
                if self.forced
                else "stopped by SIGTERM"
            )
        if code == 0:
            self.data.upload_outputs()
            mark_stage(self.run_dir, "upload_end")
        return code, self.command.oom_message(code)

    def execute(self) -> int:
        """Run every step; always reports EXITED (unless killed with SIGKILL)."""
        self.events.emit("INITIALIZING")
        failure = None
        try:
            code, message = self._steps()
        except StepFailed as exc:
            code, message, failure = int(exc.exit_code), str(exc), exc.failure
        except Stopped:
            code, message = STOPPED_EXIT_CODE, "stopped by SIGTERM before the command ran"
        except Exception as exc:  # the attempt must still report an exit
            code, message = int(ExitCode.UNKNOWN_RUNTIME), f"runner error: {exc!r}"
        self.credentials.remove()
        if self.reserve is not None:  # its space is for what follows (disk full)
            self.reserve.unlink(missing_ok=True)
        if message:
            self.log.runner(message)
        self.log.runner(f"exit code {code}")
        self.events.emit("EXITED", exit_code=code, message=message, failure=failure)
        self.log.close()
        return code


def mark_stage(run_dir: Path, stage: str) -> None:
    """Append ``{"stage", "time_s"}`` to ``run_dir/timings.jsonl``: when a runner step ended
    (``barrier_start``: the preparation before the barrier, ``command_exit``, ``upload_end``),
    for ``bench/launch_overhead.py``'s breakdown. Best
    effort: a failed write never fails the attempt."""
    try:
        with open(run_dir / "timings.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({"stage": stage, "time_s": time.time()}) + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.runner RUN_JSON``: run the attempt, exit with its code (max 255)."""
    from trainyard.runfile import load_run

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainyard.runner RUN_JSON", file=sys.stderr)
        return 2
    os.umask(0o077)  # task.log, events.jsonl: the owner's only (the command gets 022 back)
    runner = Runner(load_run(Path(args[0])))
    proctree.set_child_subreaper()
    signal.signal(signal.SIGTERM, runner.on_signal)
    signal.signal(signal.SIGINT, runner.on_signal)
    code = runner.execute()
    return min(code, 255)
