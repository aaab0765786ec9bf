"""The command of one attempt: its environment and argv (``$(VAR)`` resolved), started behind
the backend's sandbox prefix (``runner.hostenv``) in its control group, sampled for usage,
stopped on request. A start that fails for a passing reason is tried ``START_TRIES`` times."""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from trainyard.linux.cgroups import TaskCgroup
from trainyard.runfile import TaskRun
from trainyard.runner.checkpoint import Checkpointer
from trainyard.runner.command import CommandProcess
from trainyard.runner.credfiles import TaskCredentials
from trainyard.runner.hostenv import EnvRefused, HostStart, host_start
from trainyard.runner.report import TaskLog
from trainyard.runner.sandboxsetup import SandboxSetup
from trainyard.runner.taskpaths import TaskPaths
from trainyard.runner.text import expand_vars
from trainyard.runner.usage import UsageSampler, baseline_delay, interval_from_env

__all__ = ["TaskCommand", "task_environment", "venv_bin"]

START_TRIES = 3
START_RETRY_DELAY_S = 0.5
TRANSIENT_START_ERRNOS = frozenset({errno.ECHILD, errno.ETIMEDOUT, errno.EAGAIN})
"""A sandbox start that failed with one of these (bwrap ended, or said nothing in time,
before its user namespace was set up) is tried again: seen once in 23 under load ~40."""


def venv_bin() -> str:
    """The folder of the interpreter running trainyard (``torchrun``, ``trainyard``, ``python``)."""
    return str(Path(sys.executable).parent)


def task_environment(run: TaskRun, base: Mapping[str, str]) -> dict[str, str]:
    """The trainyard variables a task gets (its distributed identity), without the spec's.

    Args:
        run: the attempt.
        base: the environment to extend (for PATH).
    """
    path = [venv_bin(), *run.sandbox.path_prepend, base.get("PATH", os.defpath)]
    env = {
        "TRAINYARD_WORKFLOW_ID": run.workflow_id,
        "OSMO_WORKFLOW_ID": run.workflow_id,
        "TRAINYARD_TASK_NAME": run.task,
        "TRAINYARD_GROUP": run.group,
        "TRAINYARD_RETRY_ID": str(run.retry_id),
        "TRAINYARD_GROUP_TASKS": ",".join(run.group_tasks),
        "TRAINYARD_TASK_INDEX": str(run.task_index),
        "TRAINYARD_OUTPUT": str(run.output_dir),
        "PATH": os.pathsep.join(p for p in path if p),
    }
    lead = run.lead_name
    if lead is not None:
        env["TRAINYARD_LEAD_TASK"] = lead
        own = "127.0.0.1" if lead == run.task else None
        if (host := run.hosts.get(lead, own)) is not None:
            env["TRAINYARD_LEAD_HOST"] = host
    if run.sandbox.root:
        env["TMPDIR"] = f"{run.sandbox.root.rstrip('/')}/tmp"
    return env


class TaskCommand:
    """Starts, watches and stops an attempt's command (``process`` once started).

    Args:
        run: the attempt.
        paths: its text and path rules.
        log: its task log (the command's output goes there).
        base_env: the environment the task's own is laid over.
        stop: set when the attempt is to stop (a start is not tried again then).
        credentials: the attempt's credentials (their variables reach the command).
        setup: the attempt's sandbox setup (the task's own Python environment).
    """

    def __init__(
        self,
        run: TaskRun,
        paths: TaskPaths,
        log: TaskLog,
        base_env: Mapping[str, str],
        stop: threading.Event,
        credentials: TaskCredentials,
        setup: SandboxSetup,
    ) -> None:
        self.run = run
        self.paths = paths
        self.log = log
        self.base_env = base_env
        self.stop = stop
        self.credentials = credentials
        self.setup = setup
        self.process: CommandProcess | None = None
        self.oom_killed = False

    def environment(self) -> tuple[dict[str, str], dict[str, str]]:
        """(the command's whole environment, the part ``$(VAR)`` may reference)."""
        own = {k: self.paths.prepare(v) for k, v in self.run.environment.items()}
        own.update(self.credentials.env)
        own.update(task_environment(self.run, {**self.base_env, **own}))
        if self.setup.task_venv_bin is not None:
            own["PATH"] = os.pathsep.join([self.setup.task_venv_bin, own["PATH"]])
        own.update(self.run.sandbox.env)
        return {**self.host_environment(), **own}, own

    def argv(self, visible: dict[str, str]) -> list[str]:
        """The task's command and args with paths, tokens and ``$(VAR)`` resolved (what runs
        behind the sandbox prefix, if any)."""
        raw = [*self.run.command, *self.run.args]
        return [expand_vars(self.paths.prepare(part), visible) for part in raw]

    def host_environment(self) -> dict[str, str]:
        """The environment of the sandbox prefix's programs (bwrap, podman, nsenter): the
        runner's own, less the server's ``TRAINYARD_*``; never the spec's
        (``runner.hostenv``)."""
        return {k: v for k, v in self.base_env.items() if not _servers_own(k)}

    def host_start(
        self, command: list[str], env: dict[str, str], visible: dict[str, str]
    ) -> HostStart:
        """How to start ``command`` behind the sandbox prefix (``hostenv.host_start``).
        Raises ``EnvRefused`` or ``FileNotFoundError``."""
        sandbox = self.run.sandbox
        return host_start(
            sandbox.command_prefix,
            command,
            env,
            visible,
            self.host_environment(),
            sandbox.env_flag,
            sandbox.env_file_shell,
            Path(self.run.run_dir),
            sandbox.env_defaults,
        )

    def run_to_end(self, checkpoints: Callable[[], list[Checkpointer]]) -> int:
        """Run the command with the checkpoints ``checkpoints()`` makes once it started;
        returns its exit status (126, 127 when it cannot start, the cause in the task log)."""
        env, visible = self.environment()
        command = self.argv(visible)
        missing = self.unstartable(command, env)
        if missing is not None:
            self.log.runner(missing[1])
            return missing[0]
        cgroup = self.task_cgroup()
        code = self.start(command, env, visible, cgroup)
        if code is not None:
            if cgroup is not None:
                cgroup.remove()
            return code
        assert self.process is not None
        running = checkpoints()
        if self.stop.is_set():
            self.process.terminate(self.run.stop_grace_s)
        for checkpoint in running:
            checkpoint.start()
        sampler = self._start_usage(env.get("CUDA_VISIBLE_DEVICES"))
        code = self.process.wait()
        if sampler is not None:
            sampler.stop()
        for checkpoint in running:
            checkpoint.finish()
        if cgroup is not None:
            self.oom_killed = cgroup.oom_kills() > 0 and code != 0
            cgroup.remove()
        return code

    def start(
        self,
        command: list[str],
        env: dict[str, str],
        visible: dict[str, str],
        cgroup: TaskCgroup | None,
    ) -> int | None:
        """Start the command behind the sandbox prefix as ``self.process``; None when it
        runs, else the exit status to report (126, 127), the cause in the task log. A start
        that fails for a passing reason (bwrap ended or went silent before its user
        namespace was set up: seen under heavy load) is tried ``START_TRIES`` times."""
        for attempt in range(1, START_TRIES + 1):
            try:
                start = self.host_start(command, env, visible)
            except EnvRefused as exc:
                self.log.runner(f"cannot start the command: {exc}")
                return 126
            except FileNotFoundError as exc:
                self.log.runner(f"cannot start the sandbox: {exc}")
                return 127
            self.process = CommandProcess(
                start.argv,
                start.env,
                self.paths.cwd(),
                self.log.command,
                pid_namespace=bool(self.run.sandbox.mounts),
                userns=self.run.sandbox.userns,
                pass_fds=start.pass_fds,
                cgroup=cgroup,
            )
            try:
                self.process.start()
                return None
            except OSError as exc:
                transient = exc.errno in TRANSIENT_START_ERRNOS and attempt < START_TRIES
                self.log.runner(
                    f"cannot start {start.argv[0]!r}: {exc}"
                    + (f"; trying again ({attempt + 1} of {START_TRIES})" if transient else "")
                )
                if not transient or self.stop.wait(START_RETRY_DELAY_S * attempt):
                    return 127 if isinstance(exc, FileNotFoundError) else 126
            finally:
                start.close()
        return 126  # not reached: the last try returns above

    def terminate(self, force: bool = False) -> None:
        """Stop the command if it runs: SIGTERM to its process group, then SIGKILL after
        ``stop_grace_s`` (``force``: SIGKILL now). Safe from a signal handler."""
        if self.process is None:
            return
        if force:
            self.process.kill_now()
        else:
            self.process.terminate(self.run.stop_grace_s)

    def task_cgroup(self) -> TaskCgroup | None:
        """The task's control group with its limits set (``linux.cgroups``), or None when
        the backend asks for none or the kernel refuses one (said in the task log: the
        task then runs without limits, as on a pool with ``limits: false``)."""
        limits = self.run.sandbox.limits
        if limits is None or not (limits.memory_bytes or limits.pids_max or limits.cpu):
            return None
        name = f"{self.run.workflow_id}-{self.run.task}-{self.run.retry_id}-{os.getpid()}"
        cgroup = TaskCgroup(name.replace("/", "_"), limits)
        try:
            cgroup.create()
        except OSError as exc:
            self.log.runner(f"limits not applied: {exc}")
            return None
        return cgroup

    def oom_message(self, code: int) -> str:
        """OOMKilled (Kubernetes' reason) when the OOM killer ended the task's command."""
        if not self.oom_killed:
            return ""
        limits = self.run.sandbox.limits
        limit = limits.memory_bytes if limits is not None else 0
        return (
            f"OOMKilled: the task went over its memory limit ({limit} bytes, the spec's "
            f"resources memory) and the kernel killed it (exit {code})"
        )

    def _start_usage(self, cuda_visible_devices: str | None = None) -> UsageSampler | None:
        """Sample the command's CPU/memory (and GPUs) into ``usage.jsonl`` (runner.usage);
        None when turned off, or when the command ends within the sampler's baseline delay
        (waited for here: a sampler would take no sample of it)."""
        interval_s = interval_from_env()
        if interval_s <= 0 or self.process is None or self.process.proc is None:
            return None
        if self.process.ended_within(baseline_delay(interval_s)):
            return None  # never sampled anyway: no thread for it (~1,000 tasks/s of `true`)
        try:
            sampler = UsageSampler(
                self.process.proc.pid,
                Path(self.run.run_dir),
                interval_s,
                cuda_visible_devices,
                baseline_delay_s=0.0,
            )
            sampler.start()
        except (psutil.Error, OSError):
            return None
        return sampler

    def unstartable(self, command: list[str], env: dict[str, str]) -> tuple[int, str] | None:
        """With ``mounts`` (the command starts behind a sandbox prefix, which would report a
        missing program as its own failure): (127 or 126, why) when the command cannot start,
        as a shell reports it; None when it can, or without ``mounts``."""
        if not self.run.sandbox.mounts or not command or self.run.sandbox.env_flag:
            return None
        program = command[0]
        if "/" in program:
            candidates = [program if program.startswith("/") else f"/{program}"]
        else:
            folders = env.get("PATH", os.defpath).split(os.pathsep)
            candidates = [f"{folder.rstrip('/')}/{program}" for folder in folders if folder]
        found = False
        for candidate in candidates:  # in PATH order; the first executable one is enough
            place = self.paths.local_path(candidate)
            if os.path.isfile(place):
                if os.access(place, os.X_OK):
                    return None
                found = True
        if not found:
            return 127, f"cannot start {program!r}: no such file"
        return 126, f"cannot start {program!r}: not executable"


def _servers_own(name: str) -> bool:
    """Whether a variable of the runner's environment is the server's own and never reaches
    the task: every ``TRAINYARD_*`` (its home, store URL, token, retention: a task gets its own
    ``TRAINYARD_*`` from ``task_environment`` and the backend, e.g. a task token)."""
    return name.startswith("TRAINYARD_")
