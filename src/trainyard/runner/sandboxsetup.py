"""The sandbox an attempt gets before its command: volume mounts' host folders checked,
private writable layers mounted, the spec's files written following no symlink, the task's
own Python environment made, its folders given to its user namespace's uid."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from trainyard.linux.safefs import (
    idmap_in_place,
    mount_overlays,
    private_mount_namespace,
    write_inside,
)
from trainyard.linux.userns import give_to_task as give_folders
from trainyard.linux.userns import give_tree, make_fresh
from trainyard.runfile import TaskRun
from trainyard.runner.failures import StepFailed
from trainyard.runner.pyenv import TASK_VENV, make_task_venv
from trainyard.runner.taskpaths import TaskPaths
from trainyard.status import ExitCode

__all__ = ["SandboxSetup"]


class SandboxSetup:
    """Prepares the sandbox the backend asked for (``run.sandbox``).

    Args:
        run: the attempt.
        paths: its text and path rules.
        say: writes one runner line to the task log.
    """

    def __init__(self, run: TaskRun, paths: TaskPaths, say: Callable[[str], None]) -> None:
        self.run = run
        self.paths = paths
        self.say = say
        self.task_venv_bin: str | None = None
        """The task's own environment's ``bin`` as the task sees it, once made
        (``runner.pyenv``): first on its PATH."""

    def mount(self) -> None:
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

    def write_files(self) -> None:
        """Write the spec's files (tokens resolved, mode 0755). Raises StepFailed(256)."""
        for item in self.run.files:
            target = self.paths.local_path(item.path)
            inside = item.path if item.path.startswith("/") else f"/{item.path}"
            if self.run.sandbox.mounts and not self.run.sandbox.writable(inside):
                raise StepFailed(
                    ExitCode.INIT_FAILURE,
                    f"cannot write {item.path}: read-only in the task's sandbox",
                )
            try:
                self._write_file(item.path, target, self.paths.prepare(item.contents))
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
            self.say(f"no Python environment of the task's own ({exc}); pip install may fail")
            return
        self.task_venv_bin = seen


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
