"""Reaching a running task from the CLI: the server's ``entry`` of it, checked to be
enterable from this machine, and the host command that runs a command inside it (the local
backend's ``backends.local.enter``; ``srun --overlap`` on Slurm; ``kubectl exec`` on Kubernetes)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trainyard.cli.client import Client
from trainyard.errors import RefusedError

if TYPE_CHECKING:
    from trainyard.server.answers import TaskEntryAnswer

__all__ = ["task_entry", "command_argv", "command_env"]


def task_entry(
    workflow_id: str, task: str, retry_id: int | None, timeout_s: float = 60.0
) -> TaskEntryAnswer:
    """The server's ``entry`` of the running task, checked to be enterable from here;
    ``timeout_s``: how long to wait for the server's answer (OSMO's connect timeout)."""
    params = {} if retry_id is None else {"retry_id": retry_id}
    entry: TaskEntryAnswer = Client(timeout_s=timeout_s).json(
        "POST", f"/api/workflow/{workflow_id}/task/{task}/entry", params=params
    )
    if entry.get("backend") == "local":
        from trainyard.backends.local.enter import machine_id

        if entry.get("machine") != machine_id():
            raise RefusedError(
                f"task {task} runs on the server's machine, not this one; run this command there"
            )
    elif entry.get("backend") not in ("slurm", "kubernetes"):
        raise RefusedError(f"task {task}: its backend ({entry.get('backend')}) cannot be entered")
    return entry


def command_argv(
    entry: TaskEntryAnswer, command: list[str], tty: bool, *, byte_stream: bool = False
) -> list[str]:
    """The host command that runs ``command`` in the task; ``tty``: with a terminal.
    ``byte_stream``: its output is a protocol (rsync, a forwarded connection), passed on as
    written: on Slurm ``srun --unbuffered``, for slurmstepd otherwise holds a task's output
    until a newline (srun(1) ``-u``) and a peer waiting on a partial line waits for ever.
    ``-u`` gives the command a raw pty for its output: bytes pass unchanged, but a program
    that refuses a terminal (tar's archive) must not take it."""
    if entry["backend"] == "slurm":
        return [
            "srun",
            "--overlap",
            *(["--unbuffered"] if byte_stream and not tty else []),
            f"--jobid={entry['job_id']}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={entry['node']}",
            *(["--pty"] if tty else []),
            *command,
        ]
    if entry["backend"] == "kubernetes":
        return _kubectl_exec(entry, command, tty)
    from trainyard.backends.local.enter import enter_argv

    return enter_argv(int(entry["pid"]), float(entry["created"]), command, tty=tty)


def _kubectl_exec(entry: TaskEntryAnswer, command: list[str], tty: bool) -> list[str]:
    """``kubectl exec`` into the task container of a Kubernetes attempt (the API's exec),
    with the pool's kubeconfig and context where it names them."""
    where = [
        *(["--kubeconfig", str(entry["kubeconfig"])] if entry.get("kubeconfig") else []),
        *(["--context", str(entry["context"])] if entry.get("context") else []),
        "-n",
        str(entry["namespace"]),
    ]
    return [
        "kubectl",
        *where,
        "exec",
        "-i",
        *(["-t"] if tty else []),
        str(entry["pod"]),
        "-c",
        str(entry["container"]),
        "--",
        *command,
    ]


def command_env(entry: TaskEntryAnswer) -> dict[str, str] | None:
    """The environment of the host command: the pool's ``SLURM_CONF`` for srun."""
    if entry["backend"] == "slurm" and entry.get("slurm_conf"):
        return {**os.environ, "SLURM_CONF": str(entry["slurm_conf"])}
    return None
