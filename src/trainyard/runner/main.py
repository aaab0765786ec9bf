"""The task runner: one attempt of one task, the same program on every backend.

Steps (OSMO's sidecar plays this part): report INITIALIZING -> prepare the sandbox the backend
asked for: volume mounts' host folders exist, private writable layers mounted (failure: exit
3003, START_ERROR) -> download inputs (failure: exit 2010) -> write files, following no
symlink inside a sandbox (failure: 256) -> barrier (timeout: 2024) -> report RUNNING ->
run the command with periodic checkpoints -> upload outputs after success only (failure:
2012) -> report EXITED with the exit code.

Text handling, in this order, for command, args, environment values and file contents:
``/tmp`` rewriting when the backend gave no private ``/`` (``sandbox.root``), special tokens
(``trainyard.spec.tokens``), then, for command and args only, Kubernetes' ``$(VAR)``.

Disk full: when a line of the task log cannot be written, the command is stopped as by SIGTERM
and the attempt ends with 2022 (``LOG_FAILED_EXIT_CODE``) and a message saying why; the runner
writes its last lines and EXITED into the space it set aside at the start
(``report.reserve_space``).

SIGTERM (or SIGINT) stops the attempt: the command's process group gets SIGTERM, then SIGKILL
after ``stop_grace_s``; outputs are not uploaded and the exit code reported is never 0
(143 when the command itself exited 0).
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

import psutil

from trainyard import dataroots
from trainyard.data.runnerhook import DataHook, load_data_hook
from trainyard.data.scrub import scrub
from trainyard.errors import DataError
from trainyard.linux import proctree
from trainyard.linux.cgroups import TaskCgroup
from trainyard.linux.safefs import (
    idmap_in_place,
    mount_overlays,
    private_mount_namespace,
    remove_inside,
    write_inside,
)
from trainyard.linux.userns import give_to_task as give_folders
from trainyard.linux.userns import give_tree, make_fresh
from trainyard.runfile import TaskRun
from trainyard.runner.barrier import BarrierTimeout, wait_for_group
from trainyard.runner.checkpoint import Checkpointer
from trainyard.runner.command import CommandProcess
from trainyard.runner.credentials import (
    CredentialProblem,
    credential_env,
    credential_files,
    secrets_of,
)
from trainyard.runner.hostenv import ENV_FILE, EnvRefused, HostStart, host_start
from trainyard.runner.pyenv import TASK_VENV, make_task_venv
from trainyard.runner.report import (
    FACTS_SOCKET_ENV,
    LOG_FAILED_EXIT_CODE,
    EventWriter,
    TaskLog,
    reserve_space,
)
from trainyard.runner.text import PathRewriter, expand_vars
from trainyard.runner.usage import UsageSampler, baseline_delay, interval_from_env
from trainyard.spec.tokens import substitute_tokens, token_values
from trainyard.status import STOPPED_EXIT_CODE, ExitCode

if TYPE_CHECKING:
    from trainyard.data.config import DataConfig

__all__ = ["Runner", "StepFailed", "task_environment"]

START_TRIES = 3
START_RETRY_DELAY_S = 0.5
TRANSIENT_START_ERRNOS = frozenset({errno.ECHILD, errno.ETIMEDOUT, errno.EAGAIN})
"""A sandbox start that failed with one of these (bwrap ended, or said nothing in time,
before its user namespace was set up) is tried again: seen once in 23 under load ~40."""


class StepFailed(Exception):
    """A runner step failed; ``exit_code`` is what the attempt reports."""

    def __init__(self, exit_code: int, message: str, failure: str | None = None) -> None:
        self.exit_code = exit_code
        self.failure = failure
        """A kind of failure for the engine (``IMAGE_PULL``), else None."""
        super().__init__(message)


class _Stopped(Exception):
    """SIGTERM arrived before the command started."""


def venv_bin() -> str:
    """The folder of the interpreter running trainyard (``torchrun``, ``trainyard``, ``python``)."""
    return str(Path(sys.executable).parent)


def task_environment(run: TaskRun, base: dict[str, str]) -> dict[str, str]:
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
        self.credential_env: dict[str, str] = {}
        self.credential_written: list[tuple[str, str]] = []
        self.forced = False
        """A forced stop was asked (``request_stop(force=True)``: SIGKILL, no SIGTERM)."""
        self._data_hooks: dict[str, DataHook] = {}
        self.task_venv_bin: str | None = None
        """The task's own environment's ``bin`` as the task sees it, once made
        (``runner.pyenv``): first on its PATH."""
        """``(base, relative)`` of each credential file written, removed at the end."""
        self._hook = hook
        run.hosts = run.runtime_hosts(self.base_env)
        self.stop = threading.Event()
        self.command: CommandProcess | None = None
        self.oom_killed = False
        self.rewriter = self._rewriter()
        self.tokens = token_values(
            [i.name if i.kind == "task" else None for i in run.inputs],
            input_dirs=[str(run.input_path(n)) for n in range(len(run.inputs))],
            output_dir=str(run.output_dir),
            workflow_id=run.workflow_id,
            hosts=run.hosts,
        )

    @property
    def hook(self) -> DataHook:
        """The data layer, loaded on first use: a task that moves no data never imports it."""
        if self._hook is None:
            self._hook = load_data_hook(self.log.runner)
            if self.run.user is not None and hasattr(self._hook, "actor"):
                from trainyard.data.datasets import Actor  # the data layer, when present

                self._hook.actor = Actor(self.run.user)
        return self._hook

    def hook_for(self, url: str) -> DataHook:
        """The data hook for ``url``: with the submitter's DATA credential whose endpoint
        starts it (the longest), its keys, region and ``override_url`` (OSMO's "Data"
        credentials), else ``hook``."""
        match = next(
            (d for d in self.run.data_credentials if url.startswith(d.get("endpoint", "\0"))), None
        )
        if match is None:
            return self.hook
        endpoint = match["endpoint"]
        if endpoint not in self._data_hooks:
            from trainyard.data.hook import DataLayerHook  # the data layer, on use

            hook = DataLayerHook(self.log.runner, config=data_config_with(match))
            if self.run.user is not None:
                from trainyard.data.datasets import Actor

                hook.actor = Actor(self.run.user)
            self._data_hooks[endpoint] = hook
        return self._data_hooks[endpoint]

    def _rewriter(self) -> PathRewriter | None:
        """Without a private ``/``: what moves under ``sandbox.root``: ``/tmp``, every file's
        own path, and top-level folders of files and checkpoints that the host lacks."""
        root = self.run.sandbox.root
        if not root:
            return None
        files = [f.path for f in self.run.files if f.path.startswith("/")]
        files += [c.path for c in self.run.credentials if c.path is not None]
        paths = files + [c.path for c in self.run.checkpoints if c.path.startswith("/")]
        tops = {"/" + Path(p).parts[1] for p in paths if len(Path(p).parts) > 1}
        return PathRewriter(root, {"/tmp", *files, *(t for t in tops if not Path(t).exists())})

    # ------------------------------------------------------------------ text

    def prepare(self, text: str) -> str:
        """Rewrite private paths (no private ``/``) and resolve special tokens in ``text``."""
        if self.rewriter is not None:
            text = self.rewriter.rewrite(text)
        return substitute_tokens(text, self.tokens)

    def environment(self) -> tuple[dict[str, str], dict[str, str]]:
        """(the command's whole environment, the part ``$(VAR)`` may reference)."""
        own = {k: self.prepare(v) for k, v in self.run.environment.items()}
        own.update(self.credential_env)
        own.update(task_environment(self.run, {**self.base_env, **own}))
        if self.task_venv_bin is not None:
            own["PATH"] = os.pathsep.join([self.task_venv_bin, own["PATH"]])
        own.update(self.run.sandbox.env)
        base = {k: v for k, v in self.base_env.items() if not _servers_own(k)}
        return {**base, **own}, own

    def argv(self, visible: dict[str, str]) -> list[str]:
        """The task's command and args with paths, tokens and ``$(VAR)`` resolved (what runs
        behind the sandbox prefix, if any)."""
        raw = [*self.run.command, *self.run.args]
        return [expand_vars(self.prepare(part), visible) for part in raw]

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
            self.run_dir,
            sandbox.env_defaults,
        )

    def cwd(self) -> str:
        """The command's working directory: ``/``, or the private root without one (with
        ``mounts`` the sandbox prefix sets ``/`` inside; the prefix starts in the run folder)."""
        if self.run.sandbox.mounts:
            return self.run.run_dir
        return self.run.sandbox.root or "/"

    def storage_url(self, url: str) -> str:
        """A storage URL with its special tokens resolved (``{{workflow_id}}``); never
        path-rewritten: it names storage outside the task."""
        return substitute_tokens(url, self.tokens)

    def local_path(self, path: str) -> Path:
        """Where a spec path (absolute, or relative to the working directory ``/``) is for
        this process: the same path, its place under the private root, or (``mounts``) the
        host path the sandbox shows there."""
        mounts = self.run.sandbox
        if mounts.mounts:
            return Path(mounts.host_path(path if path.startswith("/") else f"/{path}"))
        if self.rewriter is None:
            return Path("/", path)
        if path.startswith("/"):
            return Path(self.rewriter.rewrite(path))
        return Path(self.rewriter.place(path))

    # ------------------------------------------------------------------ data roots

    def data_url_problem(self, url: str) -> str | None:
        """Why ``url`` may not be used (``trainyard.dataroots``), None when it may; symlinks
        are resolved now, just before the transfer."""
        if self.run.data_roots is None:
            return None
        home = Path(self.run.data_home or "/nonexistent-trainyard-home")
        return dataroots.url_problem(url, self.run.data_roots, home)

    def check_data_url(self, url: str, code: int, what: str) -> None:
        """Raise StepFailed(``code``) when ``url`` is outside the pool's data roots."""
        problem = self.data_url_problem(url)
        if problem:
            raise StepFailed(code, f"{what}: refused: {problem}")

    def data_url_allowed(self, url: str) -> bool:
        """For a checkpoint (which never fails the task): logs and skips a refused URL."""
        problem = self.data_url_problem(self.storage_url(url))
        if problem:
            self.log.runner(f"checkpoint to {scrub(url)} refused: {problem}")
        return problem is None

    # ------------------------------------------------------------------ steps

    def prepare_sandbox(self) -> None:
        """What the backend asked for before anything else: every ``volumes`` host path
        exists, and the private writable layers (``overlays``) are mounted for this thread.
        Raises StepFailed(3003, START_ERROR): the task cannot start as its spec says."""
        sandbox = self.run.sandbox
        for inside, host in sorted(sandbox.volumes.items()):
            if not os.path.isdir(host):
                raise StepFailed(
                    ExitCode.START_ERROR,
                    f"volume mount {host}:{inside}: host folder {host} does not "
                    "exist (or is not a folder); create it or fix volumeMounts",
                )
        try:
            mount_overlays(sandbox.overlays)
        except OSError as exc:
            raise StepFailed(
                ExitCode.START_ERROR, f"cannot make the task's private writable root: {exc}"
            ) from exc
        if sandbox.userns is not None and sandbox.volumes:
            try:
                if not sandbox.overlays:
                    private_mount_namespace()
                idmap_in_place(
                    sorted(set(sandbox.volumes.values())),
                    sandbox.userns.host_uid,
                    sandbox.userns.host_gid,
                )
            except OSError as exc:
                raise StepFailed(
                    ExitCode.START_ERROR, f"volume mounts: cannot map them to the task's uid: {exc}"
                ) from exc

    def give_to_task(self) -> None:
        """With a user namespace (``sandbox.userns``): the folders the task writes become its
        host uid's, and its ``fresh`` folders and files are made (``linux.userns``). Raises
        StepFailed(3003, START_ERROR)."""
        userns = self.run.sandbox.userns
        if userns is None:
            return
        uid, gid = userns.host_uid, userns.host_gid
        data_uid = uid if userns.data_uid is None else userns.data_uid
        data_gid = gid if userns.data_gid is None else userns.data_gid
        try:
            give_folders(userns.own, uid, gid)
            give_folders([str(self.run.output_path)], data_uid, data_gid)
            give_tree(str(self.run.output_path), data_uid, data_gid, files=True)
            for index in range(len(self.run.inputs)):
                give_tree(str(self.run.input_path(index)), data_uid, data_gid, files=True)
                give_folders([str(self.run.input_path(index))], data_uid, data_gid)
            for top in userns.own_dirs_below:
                give_tree(top, uid, gid, files=False)
            make_fresh(userns.fresh, uid, gid)
        except OSError as exc:
            raise StepFailed(
                ExitCode.START_ERROR, f"cannot give the task its folders: {exc}"
            ) from exc

    def download_inputs(self) -> None:
        """Fetch every input into its folder. Raises StepFailed(2010)."""
        for index, item in enumerate(self.run.inputs):
            dest = self.run.input_path(index)
            if item.unavailable is not None:
                raise StepFailed(
                    ExitCode.DOWNLOAD_FAILED,
                    f"input {index} ({item.kind} {item.name}): {item.unavailable}",
                )
            if item.kind == "url":
                item = item.model_copy(update={"source": self.storage_url(item.source)})
                self.check_data_url(item.source, ExitCode.DOWNLOAD_FAILED, f"input {index}")
            try:
                hook = self.hook_for(item.source) if item.kind == "url" else self.hook
                count = hook.download(item, dest)
            except DataError as exc:
                raise StepFailed(ExitCode.DOWNLOAD_FAILED, f"input {index}: {exc}") from exc
            line = f"input {index} ({item.kind} {item.name}): {count} file(s) in {dest}"
            self.log.runner(scrub(line))

    def write_files(self) -> None:
        """Write the spec's files (tokens resolved, mode 0755). Raises StepFailed(256)."""
        for item in self.run.files:
            target = self.local_path(item.path)
            inside = item.path if item.path.startswith("/") else f"/{item.path}"
            if self.run.sandbox.mounts and not self.run.sandbox.writable(inside):
                raise StepFailed(
                    ExitCode.INIT_FAILURE,
                    f"cannot write {item.path}: read-only in the task's sandbox",
                )
            try:
                self._write_file(item.path, target, self.prepare(item.contents))
            except OSError as exc:
                raise StepFailed(ExitCode.INIT_FAILURE, f"cannot write {item.path}: {exc}") from exc

    def _write_file(self, path: str, target: Path, text: str) -> None:
        """Write one file: into a sandbox's folders following no symlink the task made
        (``safefs.write_inside``), else (no sandbox: the host's own paths) plainly."""
        sandbox = self.run.sandbox
        if sandbox.mounts:
            base, rest = sandbox.host_split(path if path.startswith("/") else f"/{path}")
            owner = (sandbox.userns.host_uid, sandbox.userns.host_gid) if sandbox.userns else None
            write_inside(base, rest, text, owner=owner)
        elif sandbox.root and _under(str(target), sandbox.root):
            write_inside(sandbox.root, os.path.relpath(target, sandbox.root), text)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o755)

    def check_credentials(self) -> None:
        """Every credential the spec names is there, with the keys its variables name
        (``runner.credentials``). Raises StepFailed(256, INIT_FAILURE) with OSMO's words."""
        try:
            self.credential_env = credential_env(self.run)
            credential_files(self.run)
        except CredentialProblem as exc:
            raise StepFailed(ExitCode.INIT_FAILURE, str(exc)) from exc

    def _credential_place(self, path: str) -> tuple[str, str]:
        """``(base, relative)`` where a path-form credential file goes: inside the task's
        private root only (never a volume, an input or output folder, a read-only bind).
        Raises StepFailed(256)."""
        sandbox = self.run.sandbox
        if sandbox.mounts:
            base, rest = sandbox.host_split(path)
            if base != sandbox.mounts.get("/") or not sandbox.writable(path):
                raise StepFailed(
                    ExitCode.INIT_FAILURE,
                    f"credential folder {posixpath.dirname(path)}: not in the "
                    "task's own root (a mounted folder); choose a path such as "
                    "/root/.creds",
                )
            return base, rest
        if sandbox.root:
            return sandbox.root, path.lstrip("/")
        raise StepFailed(
            ExitCode.INIT_FAILURE,
            f"credential folder {posixpath.dirname(path)}: this backend gives "
            "the task no private root to write it in",
        )

    def write_credentials(self) -> None:
        """Write the path-form credentials, one file per key, mode 0600, the task's own,
        following no symlink. Raises StepFailed(256)."""
        userns = self.run.sandbox.userns
        owner = (userns.host_uid, userns.host_gid) if userns else None
        for name, path, value in credential_files(self.run):
            base, rest = self._credential_place(path)
            try:
                write_inside(base, rest, value, mode=0o600, owner=owner)
            except OSError as exc:
                raise StepFailed(
                    ExitCode.INIT_FAILURE, f"credential {name}: cannot write {path}: {exc}"
                ) from exc
            self.credential_written.append((base, rest))
        if self.credential_written:
            self.log.runner(f"credentials: {len(self.credential_written)} file(s) written")

    def make_python_env(self) -> None:
        """The task's own Python environment in its root (``runner.pyenv``), so that
        ``pip install`` works and lands there; not in a container (its image has its own
        Python) nor without a private root. One that cannot be made is said in the log and
        the task runs without it."""
        sandbox = self.run.sandbox
        if sandbox.env_flag is not None:
            return
        if sandbox.mounts:
            base, rest = sandbox.host_split(TASK_VENV)
            if base != sandbox.mounts.get("/") or not sandbox.writable(TASK_VENV):
                return
            seen = f"{TASK_VENV}/bin"
        elif sandbox.root:
            base, rest = sandbox.root, TASK_VENV.lstrip("/")
            seen = f"{sandbox.root.rstrip('/')}{TASK_VENV}/bin"
        else:
            return
        userns = sandbox.userns
        try:
            make_task_venv(base, rest, (userns.host_uid, userns.host_gid) if userns else None)
        except OSError as exc:
            self.log.runner(
                f"no Python environment of the task's own ({exc}); pip install may fail"
            )
            return
        self.task_venv_bin = seen

    def remove_credentials(self) -> None:
        """Remove the credential files written (best effort, following no symlink), and the
        runtime's env file (``hostenv.ENV_FILE``: the task's variables, its credentials'
        among them), which the runtime read when the container was made."""
        for base, rest in self.credential_written:
            try:
                remove_inside(base, rest)
            except OSError:
                pass
        self.credential_written = []
        try:
            (self.run_dir / ENV_FILE).unlink(missing_ok=True)
        except OSError:
            pass

    def pass_barrier(self) -> None:
        """Wait for the group. Raises StepFailed(2024) on timeout, _Stopped on SIGTERM."""
        barrier = self.run.barrier
        if not barrier.enabled:
            return
        self.log.runner(f"barrier: waiting for {', '.join(barrier.tasks)}")
        try:
            if not wait_for_group(barrier, self.run.task, self.run.retry_id, self.stop):
                raise _Stopped()
        except BarrierTimeout as exc:
            raise StepFailed(ExitCode.BARRIER_FAILED, str(exc)) from exc
        self.log.runner("barrier: every task of the group is ready")

    def run_command(self) -> int:
        """Run the command with its checkpoints; returns its exit status."""
        env, visible = self.environment()
        command = self.argv(visible)
        missing = self.unstartable(command, env)
        if missing is not None:
            self.log.runner(missing[1])
            return missing[0]
        cgroup = self.task_cgroup()
        code = self.start_command(command, env, visible, cgroup)
        if code is not None:
            if cgroup is not None:
                cgroup.remove()
            return code
        assert self.command is not None
        checkpoints = [
            Checkpointer(
                c.model_copy(update={"url": self.storage_url(c.url)}),
                self.local_path(c.path),
                self.hook_for(c.url),
                self.log.runner,
            )
            for c in self.run.checkpoints
            if self.data_url_allowed(c.url)
        ]
        if self.stop.is_set():
            self.command.terminate(self.run.stop_grace_s)
        for checkpoint in checkpoints:
            checkpoint.start()
        sampler = self._start_usage(env.get("CUDA_VISIBLE_DEVICES"))
        code = self.command.wait()
        if sampler is not None:
            sampler.stop()
        for checkpoint in checkpoints:
            checkpoint.finish()
        if cgroup is not None:
            self.oom_killed = cgroup.oom_kills() > 0 and code != 0
            cgroup.remove()
        return code

    def start_command(
        self,
        command: list[str],
        env: dict[str, str],
        visible: dict[str, str],
        cgroup: TaskCgroup | None,
    ) -> int | None:
        """Start the command behind the sandbox prefix as ``self.command``; None when it
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
            self.command = CommandProcess(
                start.argv,
                start.env,
                self.cwd(),
                self.log.command,
                pid_namespace=bool(self.run.sandbox.mounts),
                userns=self.run.sandbox.userns,
                pass_fds=start.pass_fds,
                cgroup=cgroup,
            )
            try:
                self.command.start()
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
        if interval_s <= 0 or self.command is None or self.command.proc is None:
            return None
        if self.command.ended_within(baseline_delay(interval_s)):
            return None  # never sampled anyway: no thread for it (~1,000 tasks/s of `true`)
        try:
            sampler = UsageSampler(
                self.command.proc.pid,
                self.run_dir,
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
            place = self.local_path(candidate)
            if os.path.isfile(place):
                if os.access(place, os.X_OK):
                    return None
                found = True
        if not found:
            return 127, f"cannot start {program!r}: no such file"
        return 126, f"cannot start {program!r}: not executable"

    def upload_outputs(self) -> None:
        """Upload the output folder to every output. Raises StepFailed(2012)."""
        for target in self.run.outputs:
            if target.url is not None:
                url = self.storage_url(target.url)
                target = target.model_copy(update={"url": url})
                self.check_data_url(url, ExitCode.UPLOAD_FAILED, "output")
            where = scrub(target.url or (target.dataset.name if target.dataset else "?"))
            try:
                hook = self.hook_for(target.url) if target.url else self.hook
                count = hook.upload(self.run.output_path, target)
            except DataError as exc:
                raise StepFailed(ExitCode.UPLOAD_FAILED, f"output to {where}: {exc}") from exc
            self.log.runner(f"output: {count} file(s) uploaded to {where}")

    # ------------------------------------------------------------------ whole attempt

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """SIGTERM/SIGINT handler: stop the attempt (see module docstring)."""
        self.request_stop()

    def request_stop(self, force: bool = False) -> None:
        """Stop the attempt: before the command, no command runs; during it, its process
        group gets SIGTERM, then SIGKILL after ``stop_grace_s`` (``force``: SIGKILL now, no
        SIGTERM). Returns at once; safe to call from a signal handler, from another thread
        and more than once."""
        self.forced = self.forced or force
        self.stop.set()
        if self.command is not None:
            if force:
                self.command.kill_now()
            else:
                self.command.terminate(self.run.stop_grace_s)

    def _on_log_failure(self, _exc: OSError) -> None:
        """The task log cannot be written: stop the command (``_check_log`` then fails the
        attempt). Called once, from whichever thread wrote the line."""
        if self.command is not None:
            self.command.terminate(self.run.stop_grace_s)

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
        self.prepare_sandbox()
        self.check_credentials()
        self.run.output_path.mkdir(parents=True, exist_ok=True)
        self.download_inputs()
        self.write_files()
        self.write_credentials()
        self.make_python_env()
        self.give_to_task()
        mark_stage(self.run_dir, "barrier_start")
        self.pass_barrier()
        if self.stop.is_set():
            raise _Stopped()
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
            self.upload_outputs()
            mark_stage(self.run_dir, "upload_end")
        return code, self.oom_message(code)

    def execute(self) -> int:
        """Run every step; always reports EXITED (unless killed with SIGKILL)."""
        self.events.emit("INITIALIZING")
        failure = None
        try:
            code, message = self._steps()
        except StepFailed as exc:
            code, message, failure = int(exc.exit_code), str(exc), exc.failure
        except _Stopped:
            code, message = STOPPED_EXIT_CODE, "stopped by SIGTERM before the command ran"
        except Exception as exc:  # the attempt must still report an exit
            code, message = int(ExitCode.UNKNOWN_RUNTIME), f"runner error: {exc!r}"
        self.remove_credentials()
        if self.reserve is not None:  # its space is for what follows (disk full)
            self.reserve.unlink(missing_ok=True)
        if message:
            self.log.runner(message)
        self.log.runner(f"exit code {code}")
        self.events.emit("EXITED", exit_code=code, message=message, failure=failure)
        self.log.close()
        return code


def data_config_with(payload: dict[str, str]) -> DataConfig:
    """The data settings (``trainyard.data.config``) with a DATA credential's keys for S3:
    ``access_key_id``/``access_key`` as fsspec's ``key``/``secret``, ``region`` as the
    client's region, ``override_url`` (an S3-compatible store) as the endpoint."""
    import dataclasses

    from trainyard.data.config import load_config

    config = load_config()
    s3 = dict(config.storage_options.get("s3", {}))
    s3.update(key=payload["access_key_id"], secret=payload["access_key"])
    if payload.get("region"):
        s3["client_kwargs"] = {**s3.get("client_kwargs", {}), "region_name": payload["region"]}
    options = {**config.storage_options, "s3": s3, "s3a": s3}
    return dataclasses.replace(
        config,
        storage_options=options,
        s3_endpoint_url=payload.get("override_url") or config.s3_endpoint_url,
    )


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _servers_own(name: str) -> bool:
    """Whether a variable of the runner's environment is the server's own and never reaches
    the task: every ``TRAINYARD_*`` (its home, store URL, token, retention: a task gets its own
    ``TRAINYARD_*`` from ``task_environment`` and the backend, e.g. a task token)."""
    return name.startswith("TRAINYARD_")


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
