"""The task's environment reaches the task only, never a host-side program.

A spec's ``environment:`` is the submitter's: ``PATH``, ``LD_PRELOAD`` or
``CONTAINERS_STORAGE_CONF`` given to ``nsenter``, ``bwrap``, ``podman`` or ``conmon`` (which
run as the host's root) would run code the task wrote with the host's privileges. So the
programs of a sandbox prefix start by absolute path with the runner's own environment (its
backend's: no spec sets it), and the task's variables cross as data the runtime hands on:

- bwrap: ``--args FD`` (a memfd, bwrap(1)) holding ``--clearenv`` and one ``--setenv NAME
  VALUE`` per variable, so no value is on a command line either;
- a runtime with an env file flag (``SandboxSettings.env_flag``: podman's ``--env-file``,
  apptainer's): a 0600 file in the run folder, one ``NAME=VALUE`` per line.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HostStart", "host_start", "EnvRefused", "ENV_FILE"]

ENV_FILE = "task.env"
"""The env file's name in the run folder (closed to the task: the run folder is not shown)."""


class EnvRefused(ValueError):
    """A variable cannot cross to the runtime as asked (the message names it)."""


@dataclass
class HostStart:
    """What starts a sandboxed command: ``argv`` (first element absolute), the host
    environment, and descriptors to hand to the child (``close`` them after the start)."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = field(default_factory=tuple)

    def close(self) -> None:
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass


def host_start(
    prefix: list[str],
    command: list[str],
    task_env: dict[str, str],
    visible: dict[str, str],
    host_env: dict[str, str],
    env_flag: str | None,
    shell_quoted: bool,
    run_dir: Path,
    env_defaults: dict[str, str] | None = None,
) -> HostStart:
    """How to start ``prefix + command`` so that only the command gets ``task_env``.

    Args:
        prefix: the sandbox prefix (``nsenter ... bwrap ... --`` or ``podman run ... IMAGE``);
            empty: the command runs as a plain process and gets ``task_env`` itself.
        command: the task's command and arguments, resolved.
        task_env: the command's whole environment.
        visible: the task's own variables (what an env file carries; ``PATH`` is left to the
            image).
        host_env: the environment the prefix's programs get.
        env_flag: the runtime's env file flag, or None.
        shell_quoted: the runtime reads the env file as shell text (apptainer), not verbatim
            (podman).
        run_dir: the attempt's run folder (where the env file goes).
        env_defaults: variables the env file starts with, which ``visible`` overrides (its
            ``PATH`` included: the image's).
    Raises:
        EnvRefused: a value holds a line break, which an env file cannot carry.
        FileNotFoundError: the prefix's first program is not on the host's PATH.
    """
    if not prefix:
        return HostStart([*command], task_env)
    prefix = [_absolute(prefix[0], host_env), *prefix[1:]]
    if env_flag:
        own = {k: v for k, v in visible.items() if k != "PATH"}
        path = _write_env_file(run_dir / ENV_FILE, {**(env_defaults or {}), **own}, shell_quoted)
        return HostStart([*prefix[:-1], env_flag, str(path), prefix[-1], *command], host_env)
    at = bwrap_options_end(prefix)
    if at is None:  # e.g. nsenter alone: no boundary, the command runs with its privileges
        return HostStart([*prefix, *command], task_env)
    fd = _args_memfd(
        ["--clearenv", *(a for k in sorted(task_env) for a in ("--setenv", k, task_env[k]))]
    )
    return HostStart([*prefix[:at], "--args", str(fd), *prefix[at:], *command], host_env, (fd,))


def bwrap_options_end(prefix: list[str]) -> int | None:
    """The index of the ``--`` that ends bwrap's options in ``prefix``, or None without
    bwrap."""
    for index, arg in enumerate(prefix):
        if os.path.basename(arg) == "bwrap":
            rest = prefix[index:]
            return index + rest.index("--") if "--" in rest else None
    return None


def _absolute(program: str, host_env: dict[str, str]) -> str:
    if program.startswith("/"):
        return program
    found = shutil.which(program, path=host_env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(2, f"{program}: not found on the host's PATH")
    return found


def _args_memfd(args: list[str]) -> int:
    """A memfd holding ``args`` NUL-separated, at offset 0, inheritable."""
    fd = os.memfd_create("trainyard-env", 0)  # no MFD_CLOEXEC: bwrap reads it
    data = b"".join(arg.encode("utf-8", "surrogateescape") + b"\0" for arg in args)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_env_file(path: Path, variables: dict[str, str], shell_quoted: bool) -> Path:
    lines = []
    for name in sorted(variables):
        value = variables[name]
        if "\n" in value or "\r" in value:
            raise EnvRefused(
                f"environment variable {name} holds a line break, which the "
                "container runtime's env file cannot carry; pass it in a file "
                "(files:) instead"
            )
        lines.append(f"{name}={shlex.quote(value) if shell_quoted else value}\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(lines)
    return path
