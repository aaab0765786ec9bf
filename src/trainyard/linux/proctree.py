"""Process trees: find, check and signal a task's processes (runner and backends share this).

A task's processes are found three ways, because each alone misses some:
- the tree below a known process (``psutil`` children, recursively);
- its session: a process started with ``start_new_session`` leads a session that every
  descendant stays in unless it calls ``setsid`` itself (Linux ``/proc/PID/stat``);
- the runner makes itself a child subreaper, so orphans re-parent to it, not to init.
A pid alone is never trusted: a pid is reused, so a process is "the same" only if its
create time matches the one recorded when it started.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable

import psutil

from trainyard.linux.libc import libc as c_library

__all__ = [
    "same_process",
    "create_time",
    "descendants",
    "session_members",
    "leftovers",
    "send",
    "set_child_subreaper",
    "exit_status",
]

_PR_SET_CHILD_SUBREAPER = 36
_CREATE_TIME_TOLERANCE_S = 0.05


def create_time(pid: int) -> float | None:
    """The create time of ``pid`` (psutil's clock), or None if there is no such process."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def same_process(pid: int, created: float) -> psutil.Process | None:
    """The process ``pid`` if it still runs and was created at ``created`` (not a zombie)."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - created) > _CREATE_TIME_TOLERANCE_S:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    """Every live descendant of ``proc`` (not ``proc`` itself)."""
    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def session_members(sid: int, not_before: float = 0.0) -> list[psutil.Process]:
    """Live processes of session ``sid`` created at or after ``not_before`` (Linux only;
    elsewhere an empty list). ``not_before`` guards against a reused session id."""
    return leftovers({sid: not_before}, trees=False)


def _parent_and_session(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) from ``/proc/PID/stat``, or None when the process is gone."""
    try:  # os.open/os.read, not open(): a scan reads every process's stat
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096)  # ppid and session come early; the line fits anyway
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = stat[stat.rfind(b")") + 2 :].split(None, 4)
    return (int(fields[1]), int(fields[3])) if len(fields) > 3 else None


def _reused(pid: int, created: float) -> bool:
    """True when ``pid`` is now another process than the one created at ``created``."""
    try:
        return abs(psutil.Process(pid).create_time() - created) > _CREATE_TIME_TOLERANCE_S
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def leftovers(leaders: dict[int, float], trees: bool = True) -> list[psutil.Process]:
    """Every live process of the sessions led by ``leaders`` (``{pid: create time}``; members
    created before it are another session that reused the id, and so is the whole session
    when its id is now the pid of another live process, a new session leader such as the
    next task's runner) and, with ``trees``, every descendant of a leader that is still the
    recorded process: one scan of ``/proc`` for all of them (Linux only; elsewhere an empty
    list)."""
    if not sys.platform.startswith("linux") or not leaders:
        return []
    table = {
        pid: ids
        for pid in psutil.pids()
        if pid != os.getpid() and (ids := _parent_and_session(pid)) is not None
    }
    sessions = {
        sid for sid, created in leaders.items() if not (sid in table and _reused(sid, created))
    }
    chosen = {pid for pid, (_ppid, sid) in table.items() if sid in sessions}
    if trees:
        children: dict[int, list[int]] = {}
        for pid, (ppid, _sid) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [pid for pid, created in leaders.items() if same_process(pid, created)]
        while stack:
            pid = stack.pop()
            for child in children.get(pid, []):
                if child not in chosen:
                    chosen.add(child)
                    stack.append(child)
    found: list[psutil.Process] = []
    for pid in chosen:
        try:
            proc = psutil.Process(pid)
            sid = table[pid][1]
            if sid not in leaders or proc.create_time() + _CREATE_TIME_TOLERANCE_S >= leaders[sid]:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def send(procs: Iterable[psutil.Process], sig: signal.Signals) -> int:
    """Send ``sig`` to each process that still exists; returns how many got it."""
    sent = 0
    for proc in procs:
        try:
            proc.send_signal(sig)
            sent += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return sent


def set_child_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux ``prctl``). True if done."""
    if not sys.platform.startswith("linux"):
        return False
    libc = c_library()
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def exit_status(returncode: int) -> int:
    """A ``Popen.returncode`` as a shell reports it: a death by signal N is ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode
