"""The local backend's task sandbox: bubblewrap (``bwrap``) arguments that give a task what a
container gives it in OSMO.

Layout inside the sandbox:
- ``/`` is the task's own folder ``<run_dir>/sandbox/root`` (on disk, so it survives a RESTART
  in place); new top-level folders (``/app``, ``/experiments``) and ``/tmp`` live there, so
  two tasks' ``/tmp/run.sh`` never meet.
- every top-level folder of the host's ``/`` is bound at its place: system folders read-only
  (``READ_ONLY_TOP``), the others (``/home``, ``/root``, ``/work``, ``/mnt`` ...) read-write so
  that caches and ``file://`` URLs behave as for a plain process; symlinks are re-created;
  a folder empty on the host (``/srv``) is an empty folder of the task's own and top-level
  files (``/.dockerenv``) are left out: each mount makes bwrap slower (it reads
  ``/proc/self/mountinfo`` once per mount, so the cost grows with the square of their number).
- ``/dev`` is the host's (GPUs) with a private ``/dev/shm``; ``/proc`` is the task's own PID
  namespace; ``/sys`` is read-only.
- paths the runner needs that the above hides or makes read-only (a run folder under
  ``/tmp``, the venv, the barrier folder) are bound again at the same path (``extra_binds``),
  so every path in ``run.json`` means the same inside and outside.
- PID, IPC and UTS namespaces are private: ``hostname`` is the task's name and ``/etc/hosts``
  maps the group's task names to their addresses. The working directory is ``/``.

The network namespace is not bwrap's: the backend joins the group's (see ``netns``) before
bwrap starts.

The task runner stays outside: it writes the task's files where the sandbox shows them
(``sandbox_mounts``) and runs only the command through the ``bwrap`` prefix, with
``--die-with-parent``: when the runner dies, bwrap's init dies and the kernel kills everything
left in the task's PID namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SandboxPlan", "bwrap_argv", "sandbox_mounts", "needs_bind", "probe_bwrap",
           "READ_ONLY_TOP", "hosts_file_text"]

READ_ONLY_TOP = frozenset({
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "boot", "opt", "var",
    "run", "snap", "nix",
})
"""Top-level host folders a task sees read-only; any other folder it sees read-write."""

_HANDLED_APART = frozenset({"tmp", "proc", "dev", "sys", "lost+found"})
_PRIVATE_TOP = frozenset({"tmp"})


@dataclass(frozen=True)
class SandboxPlan:
    """What one task's sandbox looks like (see module docstring).

    Attributes:
        root_dir: host folder that becomes ``/``.
        hostname: the task's host name.
        hosts_file: host file bound read-only at ``/etc/hosts`` (None: the host's).
        writable: host paths bound read-write at the same path.
        readonly: host paths bound read-only at the same path.
    """

    root_dir: Path
    hostname: str
    hosts_file: Path | None = None
    writable: tuple[str, ...] = ()
    readonly: tuple[str, ...] = ()
    host_root: Path = field(default=Path("/"))


def _top(path: str) -> str:
    parts = Path(path).parts
    return parts[1] if len(parts) > 1 else ""


def needs_bind(path: str, writable: bool, host_root: Path = Path("/")) -> bool:
    """Whether ``path`` must be bound again to be seen (and written, if ``writable``)
    inside the sandbox, given the top-level binds. Symlinks are resolved first."""
    real = os.path.realpath(path)
    if real == "/":
        return False
    top = _top(real)
    if top in _PRIVATE_TOP or top in _HANDLED_APART:
        return True
    if not (host_root / top).exists():
        return True
    return writable and top in READ_ONLY_TOP


def _has_symlink(path: Path, target: str) -> bool:
    return path.is_symlink() and os.readlink(path) == target


def _top_level_args(host_root: Path, root_dir: Path) -> list[str]:
    """Mirror the host's top-level entries; a symlink already in ``root_dir`` (an earlier
    start of the same sandbox) is kept, as bwrap refuses to make it again."""
    args: list[str] = []
    for entry in sorted(os.scandir(host_root), key=lambda e: e.name):
        if entry.name in _HANDLED_APART:
            continue
        target = f"/{entry.name}"
        if entry.is_symlink():
            link = os.readlink(entry.path)
            if not _has_symlink(root_dir / entry.name, link):
                args += ["--symlink", link, target]
        elif entry.is_dir() and _is_empty(entry.path):
            args += ["--dir", target]  # nothing to show: a folder of the sandbox's own
        elif entry.is_dir():
            args += ["--ro-bind" if entry.name in READ_ONLY_TOP else "--bind", entry.path, target]
    return args  # top-level files (/.dockerenv) belong to the host's image, not the task's


def _is_empty(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _system_args(host_root: Path) -> list[str]:
    args = ["--dev-bind", "/dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc"]
    if (host_root / "sys").is_dir():
        args += ["--ro-bind", "/sys", "/sys"]
    return args


def _extra_binds(plan: SandboxPlan) -> list[str]:
    """Same-path binds, parents before children. A private top-level folder itself
    (``/tmp``) is never bound: that would hand the task the host's."""
    binds = [(os.path.realpath(p), "--ro-bind") for p in plan.readonly]
    binds += [(os.path.realpath(p), "--bind") for p in plan.writable]
    args: list[str] = []
    done: list[tuple[str, str]] = []
    for real, flag in sorted(set(binds), key=lambda b: (len(Path(b[0]).parts), b[0])):
        if any(flag == f and _under(real, d) for d, f in done):
            continue  # a folder already bound the same way shows it (bwrap's cost grows
            # with every mount: it reads /proc/self/mountinfo for each)
        if len(Path(real).parts) > 2 or _top(real) not in _PRIVATE_TOP | _HANDLED_APART:
            args += [flag, real, real]
            done.append((real, flag))
    return args


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def bwrap_argv(plan: SandboxPlan, bwrap: str = "bwrap") -> list[str]:
    """The ``bwrap ... --`` prefix that runs a program in the sandbox of ``plan``."""
    args = [bwrap, "--bind", str(plan.root_dir), "/"]
    args += _top_level_args(plan.host_root, plan.root_dir)
    args += _system_args(plan.host_root)
    args += _extra_binds(plan)
    if plan.hosts_file is not None:
        args += ["--ro-bind", str(plan.hosts_file), "/etc/hosts"]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", plan.hostname]
    return [*args, "--die-with-parent", "--chdir", "/", "--"]


def sandbox_mounts(plan: SandboxPlan) -> tuple[dict[str, str], list[str]]:
    """What the sandbox of ``plan`` shows where, for a process outside it.

    Returns:
        ``{path inside: host path}`` (``/`` is the root folder; the host's top-level entries
        and the same-path binds are themselves) and the entries bound read-only. Feeds
        ``SandboxSettings.mounts`` and ``readonly``.
    """
    mounts = {"/": str(plan.root_dir)}
    readonly: set[str] = set()
    for entry in os.scandir(plan.host_root):
        if entry.name in _HANDLED_APART or not entry.is_dir() or (
                not entry.is_symlink() and _is_empty(entry.path)):
            continue  # top-level files are not shown; empty folders are the sandbox's own
        mounts[f"/{entry.name}"] = entry.path
        if entry.name in READ_ONLY_TOP or entry.is_symlink():
            readonly.add(f"/{entry.name}")
    for path, flag in [(p, True) for p in plan.readonly] + [(p, False) for p in plan.writable]:
        real = os.path.realpath(path)
        if real != "/":
            mounts[real] = real
            (readonly.add if flag else readonly.discard)(real)
    return mounts, sorted(readonly)


def hosts_file_text(hosts: dict[str, str]) -> str:
    """``/etc/hosts`` for a task: localhost plus one line per task of its group."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{name}" for name, address in sorted(hosts.items())]
    return "\n".join(lines) + "\n"


def probe_bwrap(prefix: list[str] | None = None, bwrap: str = "bwrap") -> str | None:
    """Run ``true`` in a minimal sandbox (after ``prefix``, e.g. an ``nsenter`` prefix).
    Returns None if bubblewrap works here, else why not."""
    if shutil.which(bwrap) is None:
        return f"{bwrap} is not installed"
    argv = [*(prefix or []), bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev",
            "--proc", "/proc", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
