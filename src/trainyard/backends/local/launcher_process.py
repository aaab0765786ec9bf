"""The launcher's children and its log: spares forked ahead of need, each waiting on a pipe
for its job and then becoming a task runner (``become_runner``); what every forked child
closes first (``forget_in_child``); reaping those children, and only them (``Children``);
one line of the launcher's log (``say``).
Design: docs/local-backend.md, "Module: `src/trainyard/backends/local/launcher.py`".
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

from trainyard.backends.local.messages import RunSpec, parse_run
from trainyard.linux import proctree, safefs

__all__ = ["Children", "become_runner", "forget_in_child", "say"]


@dataclass
class _Spare:
    """A forked child waiting for its job on ``job_fd``'s pipe (EOF: exit unused)."""

    pid: int
    created: float
    job_fd: int


class Children:
    """The processes a launcher forked and has not reaped yet: spares waiting for a job,
    runners, namespace holders (``launcher_groups``).

    Args:
        spare_count: how many spares the launcher keeps waiting (``short_of_spares``).
    """

    def __init__(self, spare_count: int = 2) -> None:
        self.pids: set[int] = set()  # every process forked and not yet reaped
        self.spares: list[_Spare] = []
        self.spare_count = spare_count

    def short_of_spares(self) -> bool:
        """Whether fewer than ``spare_count`` spares wait."""
        return len(self.spares) < self.spare_count

    def add_spare(self) -> None:
        """Fork a spare: it waits for its job (a ``RunSpec``'s JSON) on a pipe, then becomes
        that runner and exits with its exit code; EOF without a job: it exits 0."""
        job_r, job_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a spare, then the runner (never returns)
            code = 1
            try:
                forget_in_child(keep={job_r})
                job = _read_all(job_r)
                if not job:  # the launcher closed without a job for it
                    os._exit(0)
                code = become_runner(parse_run(job))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - whatever happens, the child must exit here
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(job_r)
        self.pids.add(pid)
        self.spares.append(_Spare(pid, proctree.create_time(pid) or time.time(), job_w))

    def hand_job(self, job: bytes) -> tuple[int, float]:
        """Give ``job`` (a ``RunSpec``'s JSON) to the first spare still alive, one forked now
        if none waits. Returns the (pid, create time) of the spare that runs it."""
        while True:
            if not self.spares:
                self.add_spare()
            spare = self.spares.pop(0)
            try:
                _write_all(spare.job_fd, job)
                break
            except BrokenPipeError:  # that spare died; take the next
                continue
            finally:
                os.close(spare.job_fd)
        return spare.pid, spare.created

    def reap(self) -> list[int]:
        """Reap the processes this launcher forked, and only those: ``waitpid(-1)`` would
        take the commands of hosted runners from under their threads' own ``wait``.
        Returns the pids that ended (a spare among them is forgotten)."""
        ended = []
        for pid in list(self.pids):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == 0:
                continue
            self.pids.discard(pid)
            for spare in [spare for spare in self.spares if spare.pid == pid]:
                os.close(spare.job_fd)
                self.spares.remove(spare)
            ended.append(pid)
        return ended

    def close(self) -> None:
        """Close every spare's pipe (EOF: each spare exits unused)."""
        for spare in self.spares:
            os.close(spare.job_fd)
        self.spares.clear()


def become_runner(run: RunSpec) -> int:
    """In a spare: become the task runner of ``run`` (its own session, stdin ``/dev/null``,
    stdout and stderr appended to ``run.out``, the environment replaced by ``run.env``).
    Returns the runner's exit code."""
    os.setsid()
    out = os.open(run.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    forget_in_child(keep=set())
    os.chdir(run.cwd)
    os.environ.clear()
    os.environ.update(run.env or {})
    sys.argv = ["python -m trainyard.runner", run.run_json]
    from trainyard.runner.main import main as runner_main

    return runner_main([run.run_json])


def forget_in_child(keep: set[int]) -> None:
    """In a forked child: default signal handlers, and no descriptor of the launcher's
    (listener, channels, client sockets) left open except ``keep``, 0-2 and the
    idmapped layers' user namespaces (``safefs.layer_userns_fds``: close-on-exec, so
    no task's command gets them)."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    keep = keep | safefs.layer_userns_fds()  # the runner's overlays use them
    for fd in _open_fds():
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def say(line: str) -> None:
    """Write ``line``, stamped (UTC), to the launcher's log (its stderr)."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime())
    sys.stderr.write(f"{stamp} {line}\n")
    sys.stderr.flush()


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))
