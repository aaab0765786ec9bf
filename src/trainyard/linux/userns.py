"""The task's user namespace, set up by the runner (``UserNamespace``): uid 0 inside is an
unprivileged host uid (``HOST_UID``), so files of the host's root that others may not read
(``/etc/shadow``, a Slurm cluster's ``munge.key``) stay unreadable to the task, as in a pod.

As a rootless runtime does with ``newuidmap`` (bwrap's ``--userns-block-fd``): bwrap starts as
``HOST_UID`` (``Handshake.popen``), the runner adds ``--info-fd``/``--userns-block-fd``
(``insert_fds``), then writes the child's ``uid_map``/``gid_map`` and sets
``user.max_user_namespaces`` to 0 (``Handshake.finish``). ``give_to_task`` gives the folders
the task writes to ``HOST_UID`` (following no symlink); ``make_fresh`` the ones it gets empty.
The steps and why: docs/security.md, "The task's user namespace".
"""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterable

from trainyard.linux import nsgate, thread_ids
from trainyard.runfile import FreshPath, UserNamespace

__all__ = ["Handshake", "insert_fds", "give_to_task", "give_tree", "make_fresh"]

HANDSHAKE_TIMEOUT_S = 30.0


def insert_fds(argv: list[str], at: int, info_fd: int, block_fd: int) -> list[str]:
    """``argv`` with ``--info-fd INFO --userns-block-fd BLOCK`` inserted at index ``at``."""
    return [*argv[:at], "--info-fd", str(info_fd), "--userns-block-fd", str(block_fd), *argv[at:]]


class Handshake:
    """The two pipes between the runner and one bwrap start. ``pass_fds`` go to Popen; call
    ``started`` right after Popen, then ``finish``."""

    def __init__(self, userns: UserNamespace) -> None:
        self.userns = userns
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()
        for fd in (self.info_r, self.block_w):
            os.set_inheritable(fd, False)

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` (bwrap's prefix and command, perhaps after ``nsenter ... --``) with
        ``subprocess.Popen(**kwargs)``: the pipes' ends named (``argv``) and passed, and bwrap
        run as ``host_uid``/``host_gid`` with no supplementary group, the uid the map makes
        uid 0 inside, so its command is that uid with no further program to switch to it.
        Call ``started`` right after, also when this raises.

        How the ids are switched, cheapest first: by ``nsenter --setuid --setgid`` when one
        already comes first (it joins the group's network namespace as the host's root,
        then switches); by the calling thread itself around the start (``thread_ids``: no
        program more; bwrap then starts in ``/``, where its ``--chdir`` goes anyway, as the
        run folder may be closed to that uid); else by an ``nsenter`` put first. Not
        ``Popen``'s ``user``/``group``: with them CPython forks instead of ``vfork``, which
        in the launcher (~40 MB, many threads) cost ~2.5 ms of CPU per task
        (docs/benchmarks-history.md).

        Raises:
            OSError: something other than ``nsenter`` or bwrap comes first (EINVAL), or the
                start failed.
        """
        argv = self.argv(argv)
        ids = [f"--setuid={self.userns.host_uid}", f"--setgid={self.userns.host_gid}"]
        kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), *self.pass_fds)  # type: ignore[misc]
        first = os.path.basename(argv[0])
        if first == "nsenter":
            return subprocess.Popen([argv[0], *ids, *argv[1:]], **kwargs)  # type: ignore[call-overload]
        if first != "bwrap":
            raise OSError(
                errno.EINVAL,
                f"cannot start {argv[0]!r} as uid "
                f"{self.userns.host_uid}: bwrap or nsenter expected",
            )
        if not thread_ids.available():
            return subprocess.Popen(["nsenter", *ids, "--", *argv], **kwargs)  # type: ignore[call-overload]
        kwargs["cwd"] = "/"
        with thread_ids.as_ids(self.userns.host_uid, self.userns.host_gid):
            return subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]

    @property
    def pass_fds(self) -> tuple[int, int]:
        return self.info_w, self.block_r

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` with the pipes' ends named where bwrap reads them."""
        assert self.userns.args_at is not None, "no handshake without bwrap's prefix"
        return insert_fds(argv, self.userns.args_at, self.info_w, self.block_r)

    def started(self) -> None:
        """Close the child's ends here (after Popen)."""
        os.close(self.info_w)
        os.close(self.block_r)

    def close(self) -> None:
        for fd in (self.info_r, self.block_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def finish(
        self,
        timeout_s: float = HANDSHAKE_TIMEOUT_S,
        before_release: Callable[[int], None] | None = None,
    ) -> None:
        """Map the ids of bwrap's child, forbid nested user namespaces, let it go on.

        Raises:
            OSError: bwrap ended first, or a step was refused (names it). The pipes are
                then still open, so bwrap's child stays blocked: kill it, then ``close``.
        """
        pid = self._child_pid(timeout_s)
        if before_release is not None:  # e.g. into the task's control group, while blocked
            before_release(pid)
        maps = {
            "uid_map": f"0 {self.userns.host_uid} 1\n{self.userns.host_root_as} 0 1\n",
            "gid_map": f"0 {self.userns.host_gid} 1\n{self.userns.host_root_as} 0 1\n",
        }
        for name, text in maps.items():
            with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as handle:
                handle.write(text)
        _no_nested_userns(pid)
        os.write(self.block_w, b"1")
        self.close()

    def _child_pid(self, timeout_s: float) -> int:
        data = b""
        deadline = time.monotonic() + timeout_s
        while not data.rstrip().endswith(b"}"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.info_r], [], [], left)[0]:
                raise OSError(errno.ETIMEDOUT, "bwrap did not report its child in time")
            chunk = os.read(self.info_r, 4096)
            if not chunk:
                raise OSError(errno.ECHILD, "bwrap ended before its user namespace was set up")
            data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except (ValueError, KeyError, TypeError) as exc:
            raise OSError(errno.EPROTO, f"bwrap's info: {data[:200]!r}") from exc


def _no_nested_userns(pid: int) -> None:
    """Set ``user.max_user_namespaces`` to 0 in the user namespace of ``pid``. The sysctl
    belongs to the namespace of the process that opens it, and ``setns`` into a user
    namespace needs a single-threaded caller, so a child does it: ``nsenter --user`` (as its
    creator's uid, root, it has every capability there) then ``sh`` writes the file. Spawned
    (``vfork`` + ``exec``), not forked: a ``fork`` of the launcher, which hosts runners as
    threads, cost ~2 ms plus the copy-on-write faults of its ~40 MB after it, per task.
    Where the process has a gate (``linux.nsgate``, the launcher's), its child does it
    instead: no ``exec`` at all."""
    try:
        if nsgate.forbid_nested(pid):
            return
    except OSError as exc:
        raise OSError(
            errno.EPERM, f"cannot forbid nested user namespaces in the task's: {exc}"
        ) from exc
    argv = [
        "nsenter",
        f"--user=/proc/{pid}/ns/user",
        "--",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces",
    ]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=True,
            timeout=HANDSHAKE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(
            errno.EPERM, f"cannot forbid nested user namespaces in the task's: {exc}"
        ) from exc
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()[:200]
        raise OSError(errno.EPERM, f"cannot forbid nested user namespaces in the task's: {why}")


def give_to_task(paths: Iterable[str], uid: int, gid: int) -> None:
    """Make each folder of ``paths`` (made if missing: mode 0755, 1777 for a ``tmp``) owned
    by ``uid``:``gid``, following no symlink (a link there is refused). Raises OSError."""
    for path in paths:
        try:
            os.mkdir(path, 0o755)
            if os.path.basename(path) == "tmp":
                os.chmod(path, 0o1777)
        except FileExistsError:
            pass
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)


def give_tree(top: str, uid: int, gid: int, files: bool) -> None:
    """Make every folder below ``top`` (and, with ``files``, every file) owned by
    ``uid``:``gid``; links are neither followed nor changed. Missing ``top``: nothing."""
    if not os.path.isdir(top) or os.path.islink(top):
        return
    for _folder, dirs, names, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in [*dirs, *(names if files else [])]:
            try:
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass


def make_fresh(paths: Iterable[FreshPath], uid: int, gid: int) -> None:
    """Make each ``FreshPath`` (see there): empty (or its ``text``), owned by ``uid``:``gid``,
    in place of what was there, following no symlink below its ``base``. One whose parent
    folder is missing, or is a link or a file (the task's own doing, in an earlier attempt:
    its layout is its own), is skipped; one already owned by ``uid`` is kept as it is
    (RESTART).
    Removing a folder of a lower layer through an overlay's merged view and making it again
    makes it opaque: the host's entries below it are hidden, not copied.

    Raises:
        OSError: a step was refused (the layer's file system, or ``relative`` malformed).
    """
    for item in paths:
        parts = [p for p in item.relative.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise OSError(errno.EINVAL, f"not a path below {item.base}: {item.relative!r}")
        fd = _open_parent(item.base, parts[:-1])
        if fd is None:
            continue
        try:
            _replace(fd, parts[-1], item, uid, gid)
        finally:
            os.close(fd)


def _open_parent(base: str, parents: list[str]) -> int | None:
    """A descriptor of ``base/parents``, each step opened with ``O_NOFOLLOW``; None when a
    folder on the way is missing, a link or a file. Raises OSError otherwise."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(base, flags)
    except FileNotFoundError:
        return None
    for name in parents:
        try:
            next_fd = os.open(name, flags, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return None
            raise
        os.close(fd)
        fd = next_fd
    return fd


def _replace(dir_fd: int, name: str, item: FreshPath, uid: int, gid: int) -> None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    if info is not None:
        if info.st_uid == uid:
            return  # the task's already (an earlier attempt's, kept by RESTART)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: follows no link below it
        else:
            os.unlink(name, dir_fd=dir_fd)
    if item.is_dir:
        os.mkdir(name, item.mode, dir_fd=dir_fd)
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    else:
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            item.mode,
            dir_fd=dir_fd,
        )
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, item.mode)
        data = item.text.encode()
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
