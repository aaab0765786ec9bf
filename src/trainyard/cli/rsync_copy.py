"""``workflow rsync``'s copies: its forms parsed into an ``RsyncRequest``, and one copy made.

An upload runs real rsync (delta transfer) with the task's exec as its remote shell
(``rsync_rsh``; as ``kubectl exec`` is used with ``rsync --rsh``) where rsync >= 3.4.0 is
here (``$TRAINYARD_RSYNC``, default ``rsync`` on PATH; empty: never) and in the task
(``$TRAINYARD_RSYNC_PATH``, default ``rsync``); else, and for every download, through tar in
the task, unpacking refused for members that would land outside the destination. Nothing is
deleted in the destination. Design: docs/interactive.md."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, cast

import typer

from trainyard.cli.task_entry import command_argv, command_env
from trainyard.errors import RefusedError

if TYPE_CHECKING:
    import tarfile

    from trainyard.server.answers import TaskEntryAnswer

__all__ = [
    "split_task_path",
    "RsyncRequest",
    "parse_rsync_args",
    "copy_once",
    "local_rsync",
    "Throttled",
    "MIN_RSYNC_VERSION",
]

MIN_RSYNC_VERSION = (3, 4, 0)
"""The oldest local rsync used: 3.4.0 fixed the flaws by which a malicious remote end reads
or writes this machine's files (CVE-2024-12084 to -12088)."""
_NO_RSYNC_IN_TASK = 99
"""The exit status of the task's check when it has no rsync (``_prepare_rsync``)."""
Report = Callable[[str], object]


def _task_path(inside: str, shown: str) -> str:
    """A path in the task, checked: absolute, not ``/``, without ``..`` (``shown`` names it
    in the error)."""
    pure = PurePosixPath(inside)
    if not pure.is_absolute() or ".." in pure.parts or str(pure) == "/":
        raise typer.BadParameter(
            f"{shown}: the task's path must be absolute, not '/', without '..'"
        )
    return str(pure)


def split_task_path(task: str, src: str, dst: str) -> tuple[str, str, bool]:
    """Which of ``src``/``dst`` is the task's side (``TASK:/path``).

    Returns:
        ``(local path, task path, into_task)``.

    Raises:
        typer.BadParameter: neither or both name the task; the task path is not absolute or
            has ``..`` (it could only mean a place outside the path the user named).
    """
    prefix = f"{task}:"
    sides = [p.startswith(prefix) for p in (src, dst)]
    if sides.count(True) != 1:
        raise typer.BadParameter(
            f"exactly one of SRC and DST must be {prefix}/PATH (the task's "
            "side); the other is a path on this machine"
        )
    into_task = sides[1]
    inside = (dst if into_task else src)[len(prefix) :]
    return (src if into_task else dst), _task_path(inside, f"{prefix}{inside}"), into_task


@dataclass(frozen=True)
class RsyncRequest:
    """One ``workflow rsync``, whichever form it was given in.

    Attributes:
        workflow_id: the workflow.
        task: the task's name; None: the lead task of the first group (OSMO's default).
        local: the path on this machine (``~`` expanded).
        inside: the path in the task (absolute, checked).
        into_task: upload (True) or download.
        copy_is_target: True: the copy *becomes* the destination (trainyard's ``SRC DST``);
            False: rsync's rule (OSMO's ``LOCAL:REMOTE``): the source lands *inside* the
            destination folder under its own name, or its contents do when it ends in ``/``.
    """

    workflow_id: str
    task: str | None
    local: str
    inside: str
    into_task: bool
    copy_is_target: bool = False

    def destination(self) -> str:
        """Where the copy lands (the path ``_copy_in``/``_copy_out`` make)."""
        if self.copy_is_target:
            return self.inside if self.into_task else self.local
        source = self.local if self.into_task else self.inside
        folder = self.inside if self.into_task else self.local
        if source.endswith("/"):
            return folder
        name = os.path.basename(source.rstrip("/"))
        return str(PurePosixPath(folder) / name) if self.into_task else os.path.join(folder, name)


RSYNC_VERBS = ("upload", "download")


def parse_rsync_args(args: list[str]) -> RsyncRequest:
    """The forms ``workflow rsync`` accepts (see ``rsync``'s help).

    Raises:
        typer.BadParameter: none of the forms, or a bad path.
    """
    verb = args[0] if args and args[0] in RSYNC_VERBS else None
    rest = args[1:] if verb else args
    if verb is None and len(rest) == 4:
        workflow_id, task, src, dst = rest
        local, inside, into_task = split_task_path(task, src, dst)
        return RsyncRequest(workflow_id, task, local, inside, into_task, copy_is_target=True)
    if len(rest) not in (2, 3):
        raise typer.BadParameter(
            "expected WORKFLOW_ID [TASK] LOCAL:REMOTE (upload), download WORKFLOW_ID [TASK] "
            "REMOTE:LOCAL, or WORKFLOW_ID TASK SRC DST with TASK:/PATH on one side"
        )
    into_task = verb != "download"
    local, inside = _split_pair(rest[-1], into_task)
    return RsyncRequest(
        rest[0], rest[1] if len(rest) == 3 else None, os.path.expanduser(local), inside, into_task
    )


def _split_pair(text: str, into_task: bool) -> tuple[str, str]:
    """``LOCAL:REMOTE`` (upload) or ``REMOTE:LOCAL`` (download) to ``(local, remote)``; the
    remote path is absolute, so an upload splits at the last ``:``, a download at the first."""
    form = "LOCAL:REMOTE" if into_task else "REMOTE:LOCAL"
    first, sep, second = text.rpartition(":") if into_task else text.partition(":")
    if not sep or not first or not second:
        raise typer.BadParameter(
            f"{text!r} is not {form} (e.g. ./src:/osmo/run/workspace)", param_hint=form
        )
    local, remote = (first, second) if into_task else (second, first)
    checked = _task_path(remote, remote)
    return local, checked + ("/" if remote.endswith("/") and checked != "/" else "")


def copy_once(
    request: RsyncRequest,
    entry: TaskEntryAnswer,
    rate_bytes_per_s: int | None = None,
    report: Report | None = None,
) -> None:
    """Make one copy of ``request`` through the task's ``entry``; an upload at most
    ``rate_bytes_per_s`` (OSMO's ``--upload-rate-limit``; None: as fast as it goes).
    ``report``: given how the copy was made (rsync's ``--stats``, or that tar made it).

    Raises:
        typer.BadParameter: the local source is missing.
        RefusedError: the copy failed or what the task sent was refused.
    """
    if request.into_task:
        local = Path(request.local)
        if not local.exists():
            raise typer.BadParameter(f"{local}: no such file or folder", param_hint="SRC")
        program = local_rsync()
        if program and _rsync_in(
            entry, program, local, request.destination(), rate_bytes_per_s, report
        ):
            return
        _copy_in(entry, local, request.destination(), rate_bytes_per_s)
        if report is not None:
            report(f"copied {local} through tar (no rsync >= 3.4.0 here or in the task)")
    else:
        if (
            not request.copy_is_target
            and Path(request.local).exists()
            and not Path(request.local).is_dir()
        ):
            raise typer.BadParameter(
                f"{request.local}: a download's LOCAL must be a folder (REMOTE lands inside it)",
                param_hint="REMOTE:LOCAL",
            )
        _copy_out(entry, request.inside, Path(request.destination()))
        if report is not None:
            report(f"copied {request.inside} through tar (downloads are checked as tar unpacks)")


def local_rsync() -> str | None:
    """The rsync program to use here: ``$TRAINYARD_RSYNC`` (empty: none), else ``rsync`` on
    PATH; None when missing or older than ``MIN_RSYNC_VERSION``."""
    name = os.environ.get("TRAINYARD_RSYNC", "rsync")
    program = shutil.which(name) if name else None
    if program is None:
        return None
    try:
        said = subprocess.run(
            [program, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"version (\d+)\.(\d+)\.(\d+)", said)
    if not found or tuple(map(int, found.groups())) < MIN_RSYNC_VERSION:
        return None
    return program


def _rsync_in(
    entry: TaskEntryAnswer,
    program: str,
    local: Path,
    inside: str,
    rate_bytes_per_s: int | None,
    report: Report | None,
) -> bool:
    """Upload ``local`` to ``inside`` (the copy becomes ``inside``) with rsync, the task's
    exec as its remote shell. Returns False, having copied nothing, when the task has no
    rsync. The remote paths travel inside rsync's protocol (``--protect-args``), never
    through a shell; the task's rsync runs in the task, with its rights only.

    Raises:
        RefusedError: rsync failed.
    """
    remote_program = os.environ.get("TRAINYARD_RSYNC_PATH") or "rsync"
    folder = inside if local.is_dir() else str(PurePosixPath(inside).parent)
    if not _prepare_rsync(entry, remote_program, folder):
        return False
    rsh = " ".join(shlex.quote(part) for part in (sys.executable, "-m", "trainyard.cli.rsync_rsh"))
    argv = [
        program,
        "--recursive",
        "--links",
        "--perms",
        "--times",
        "--protect-args",
        "--blocking-io",
        f"--rsh={rsh}",
        f"--rsync-path={remote_program}",
        *([f"--bwlimit={max(1, rate_bytes_per_s // 1024)}"] if rate_bytes_per_s else []),
        *(["--stats"] if report is not None else []),
        "--",
        f"{local}/" if local.is_dir() else str(local),
        f"task:{inside}/" if local.is_dir() else f"task:{inside}",
    ]
    from trainyard.cli.rsync_rsh import ENTRY_ENV

    done = subprocess.run(
        argv,
        env={**os.environ, ENTRY_ENV: json.dumps(entry)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    _check_copy(done.returncode, f"rsync into {inside} in the task")
    if report is not None:
        report(done.stdout.strip())
    return True


def _prepare_rsync(entry: TaskEntryAnswer, remote_program: str, folder: str) -> bool:
    """In the task: whether ``remote_program`` is there, and if so make ``folder``.
    Raises RefusedError when the folder cannot be made."""
    script = f'command -v -- "$1" >/dev/null 2>&1 || exit {_NO_RSYNC_IN_TASK}; mkdir -p -- "$2"'
    code = _in_task(entry, ["sh", "-c", script, "sh", remote_program, folder]).wait()
    if code == _NO_RSYNC_IN_TASK:
        return False
    _check_copy(code, f"making {folder} in the task")
    return True


def _in_task(entry: TaskEntryAnswer, command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    # not byte_stream: srun --unbuffered gives a pty, and tar refuses to write to a terminal
    return subprocess.Popen(command_argv(entry, command, False), env=command_env(entry), **kwargs)


def _owner_reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


class Throttled:
    """A binary stream that lets through at most ``rate_bytes_per_s`` on average (it sleeps
    when ahead), for an upload's archive."""

    CHUNK_BYTES = 64 * 1024

    def __init__(self, stream: Any, rate_bytes_per_s: int) -> None:
        self.stream, self.rate = stream, rate_bytes_per_s
        self.started, self.sent = time.monotonic(), 0

    def write(self, data: bytes) -> int:
        for start in range(0, len(data), self.CHUNK_BYTES):
            chunk = data[start : start + self.CHUNK_BYTES]
            self.stream.write(chunk)
            self.sent += len(chunk)
            ahead_s = self.sent / self.rate - (time.monotonic() - self.started)
            if ahead_s > 0:
                time.sleep(ahead_s)
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


def _copy_in(
    entry: TaskEntryAnswer, local: Path, inside: str, rate_bytes_per_s: int | None = None
) -> None:
    import tarfile  # here, not at the CLI's start

    where = inside if local.is_dir() else str(PurePosixPath(inside).parent)
    script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -f - -C "$1"'
    proc = _in_task(entry, ["sh", "-c", script, "sh", where], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    out = proc.stdin if rate_bytes_per_s is None else Throttled(proc.stdin, rate_bytes_per_s)
    try:
        # Throttled has the write() and flush() that a "w|" stream uses
        with tarfile.open(fileobj=cast(IO[bytes], out), mode="w|") as archive:
            name = "." if local.is_dir() else PurePosixPath(inside).name
            archive.add(local, arcname=name, filter=_owner_reset)
    except BrokenPipeError:
        pass
    finally:
        proc.stdin.close()
    _check_copy(proc.wait(), f"unpacking into {inside} in the task")


def _copy_out(entry: TaskEntryAnswer, inside: str, local: Path) -> None:
    """Unpack into a temporary folder beside ``local`` first: a refused archive leaves
    nothing half-made at ``local``."""
    import tempfile

    is_dir = _in_task(entry, ["test", "-d", inside]).wait() == 0
    path = PurePosixPath(inside)
    argv = (
        ["tar", "-c", "-f", "-", "-C", inside, "."]
        if is_dir
        else ["tar", "-c", "-f", "-", "-C", str(path.parent), path.name]
    )
    local.absolute().parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".trainyard-rsync-", dir=local.absolute().parent))
    try:
        _unpack(_in_task(entry, argv, stdout=subprocess.PIPE), inside, staging)
        _place(staging if is_dir else staging / path.name, local)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unpack(proc: subprocess.Popen[bytes], inside: str, staging: Path) -> None:
    """Extract the task's tar stream into ``staging`` with ``safe_untar.extract``: absolute
    names, '..', links out of it, devices and names through a link are refused, whatever
    Python's own ``tarfile`` filters let through (CVE-2025-4517)."""
    import tarfile

    from trainyard.cli import safe_untar

    assert proc.stdout is not None
    try:
        safe_untar.extract(proc.stdout, staging)
    except safe_untar.UnsafeArchive as exc:
        proc.kill()
        proc.wait()
        raise RefusedError(f"refused what the task sent from {inside}: {exc}") from None
    except tarfile.TarError as exc:
        _check_copy(proc.wait(), f"packing {inside} in the task")
        raise RefusedError(f"what the task sent from {inside} is no archive: {exc}") from None
    _check_copy(proc.wait(), f"packing {inside} in the task")


def _place(copied: Path, local: Path) -> None:
    """Move the unpacked copy to ``local`` (``safe_untar.place``: a file or a new folder as a
    whole, into an existing folder entry by entry, never through a link found there)."""
    from trainyard.cli import safe_untar

    if copied.is_dir() and not local.is_dir():  # the staging folder itself: mkdtemp made it 0700
        umask = os.umask(0)
        os.umask(umask)
        copied.chmod(0o777 & ~umask)
    try:
        safe_untar.place(copied, local)
    except safe_untar.UnsafeArchive as exc:
        raise RefusedError(f"refused to place the copy at {local}: {exc}") from None


def _check_copy(code: int, what: str) -> None:
    if code != 0:
        raise RefusedError(f"{what} failed (exit {code}); see the message above")
