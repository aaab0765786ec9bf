"""The credentials of one attempt: checked before anything runs, the environment-form ones
handed to the command, the path-form ones written (one file per key, 0600, the task's own,
following no symlink) and removed at the end (``runner.credentials`` holds the pure rules)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from pathlib import Path

from trainyard.linux.safefs import remove_inside, write_inside
from trainyard.runfile import TaskRun
from trainyard.runner.credentials import CredentialProblem, credential_env, credential_files
from trainyard.runner.failures import StepFailed
from trainyard.runner.hostenv import ENV_FILE
from trainyard.status import ExitCode

__all__ = ["TaskCredentials"]


class TaskCredentials:
    """Checks, writes and removes an attempt's credentials.

    Args:
        run: the attempt.
        run_dir: its run folder (the runtime's env file there is removed with the files).
        say: writes one runner line to the task log.
    """

    def __init__(self, run: TaskRun, run_dir: Path, say: Callable[[str], None]) -> None:
        self.run = run
        self.run_dir = run_dir
        self.say = say
        self.env: dict[str, str] = {}
        """The variables the spec's environment-form credentials give the command."""
        self.written: list[tuple[str, str]] = []
        """``(base, relative)`` of each credential file written, removed at the end."""

    def check(self) -> None:
        """Every credential the spec names is there, with the keys its variables name
        (``runner.credentials``). Raises StepFailed(256, INIT_FAILURE) with OSMO's words."""
        try:
            self.env = credential_env(self.run)
            credential_files(self.run)
        except CredentialProblem as exc:
            raise StepFailed(ExitCode.INIT_FAILURE, str(exc)) from exc

    def _place(self, path: str) -> tuple[str, str]:
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

    def write(self) -> None:
        """Write the path-form credentials, one file per key, mode 0600, the task's own,
        following no symlink. Raises StepFailed(256)."""
        userns = self.run.sandbox.userns
        owner = (userns.host_uid, userns.host_gid) if userns else None
        for name, path, value in credential_files(self.run):
            base, rest = self._place(path)
            try:
                write_inside(base, rest, value, mode=0o600, owner=owner)
            except OSError as exc:
                raise StepFailed(
                    ExitCode.INIT_FAILURE, f"credential {name}: cannot write {path}: {exc}"
                ) from exc
            self.written.append((base, rest))
        if self.written:
            self.say(f"credentials: {len(self.written)} file(s) written")

    def remove(self) -> None:
        """Remove the credential files written (best effort, following no symlink), and the
        runtime's env file (``hostenv.ENV_FILE``: the task's variables, its credentials'
        among them), which the runtime read when the container was made."""
        for base, rest in self.written:
            try:
                remove_inside(base, rest)
            except OSError:
                pass
        self.written = []
        try:
            (self.run_dir / ENV_FILE).unlink(missing_ok=True)
        except OSError:
            pass
