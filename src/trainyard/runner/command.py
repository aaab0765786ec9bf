"""The user's command as a process: started in its own process group, its stdout and stderr
forwarded line by line to the task log, stopped with its whole tree.

The output pump holds at most ``MAX_LINE_BYTES`` (64 KiB) of output: a longer line is handed
on in pieces of that size, each marked ``cut`` but the last (see ``trainyard.runner.report``),
cut on a UTF-8 character boundary. The pump reads until the command's output closes,
whatever the log does with the lines, so a command never blocks on a full pipe.

When the command's main process exits, whatever it left running (background jobs, daemons)
is killed, as a container's processes die with its main process: the command's process group,
and every child of this process (a child subreaper: orphans re-parent to it) that was not
already its child when the command started, with all their descendants. Children this process
had before (when the runner runs inside a larger program, such as a test) are left alone.
"""

from __future__ import annotations

import codecs
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

import psutil

from trainyard.linux import proctree
from trainyard.linux.cgroups import TaskCgroup
from trainyard.linux.userns import Handshake
from trainyard.runfile import UserNamespace
from trainyard.runner.report import MAX_LINE_BYTES

__all__ = ["CommandProcess", "TASK_UMASK", "read_pieces"]

TASK_UMASK = 0o022
"""The user command's umask (a container's usual one): the runner itself runs with 077 so
that its logs are its owner's only, and the task must not inherit that."""


class CommandProcess:
    """One run of the user's command.

    Args:
        argv: the command and its arguments, tokens resolved.
        env: its whole environment.
        cwd: its working directory.
        on_line: called with each line of its combined stdout/stderr and ``False`` (the line
            keeps its newline, if any), or with a piece of a line longer than
            ``MAX_LINE_BYTES`` and ``True``. What it raises is ignored.
        pid_namespace: the command runs in a PID namespace of its own that dies with its main
            process (bubblewrap): nothing of it can outlive it, so no search for leftovers
            among this process's descendants (a scan of the whole process table).
        userns: the argv starts with a bwrap prefix whose uid map this runner writes
            (``linux.userns``); one without ``args_at`` (podman maps ids itself) asks no
            handshake.
        pass_fds: descriptors the program inherits (``runner.hostenv``'s bwrap arguments).
        cgroup: the task's control group (``linux.cgroups``, made): the program, and
            bwrap's child before it may go on, are moved into it.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        on_line: Callable[[str, bool], None],
        pid_namespace: bool = False,
        userns: UserNamespace | None = None,
        pass_fds: tuple[int, ...] = (),
        cgroup: TaskCgroup | None = None,
    ) -> None:
        self.pass_fds = pass_fds
        self.cgroup = cgroup
        self.pid_namespace = pid_namespace
        self.userns = userns
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.on_line = on_line
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._kill_timer: threading.Timer | None = None
        self._children_before: set[tuple[int, float]] = set()

    def start(self) -> None:
        """Start the command. Raises ``OSError`` (e.g. ``FileNotFoundError``) if it cannot."""
        if not self.pid_namespace:
            self._children_before = {_key(c) for c in _children()}
        handshake = (
            Handshake(self.userns)
            if self.userns is not None and self.userns.args_at is not None
            else None
        )
        start = handshake.popen if handshake else subprocess.Popen
        try:
            self.proc = start(  # type: ignore[operator]
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0,
                umask=TASK_UMASK,
                pass_fds=self.pass_fds,
            )
        except BaseException:
            if handshake is not None:
                handshake.started()
                handshake.close()
            raise
        assert self.proc.stdout is not None
        try:
            if self.cgroup is not None:
                self.cgroup.add(self.proc.pid)
        except OSError as exc:
            if handshake is not None:
                handshake.started()
            raise _with_output(exc, self._abandon(handshake)) from None
        if handshake is not None:
            handshake.started()
            try:
                handshake.finish(before_release=self.cgroup.add if self.cgroup else None)
            except OSError as exc:  # killed before the child could go on unmapped
                raise _with_output(exc, self._abandon(handshake)) from None
        self._pump = threading.Thread(
            target=self._forward, args=(self.proc.stdout,), name="log-pump", daemon=True
        )
        self._pump.start()

    def _abandon(self, handshake: Handshake | None) -> str:
        """Kill what was started (before its command could run), close its pipes, and
        return the last of what it printed (bwrap's or nsenter's own words of why)."""
        assert self.proc is not None and self.proc.stdout is not None
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        if handshake is not None:
            handshake.close()
        said = _drain(self.proc.stdout, ABANDON_OUTPUT_BYTES)
        self.proc.stdout.close()
        return said

    def _forward(self, stream: IO[bytes]) -> None:
        try:
            for text, cut in read_pieces(stream, MAX_LINE_BYTES):
                try:
                    self.on_line(text, cut)
                except Exception:  # noqa: BLE001 - the pump must drain the pipe to the end
                    pass
        finally:
            stream.close()

    def ended_within(self, timeout_s: float) -> bool:
        """Whether the main process ends within ``timeout_s`` seconds (waits that long at
        most; ``wait`` still does the rest)."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def wait(self) -> int:
        """Wait for the main process, kill what it left behind, drain its output.

        Returns:
            Its exit status, ``128 + N`` when signal N killed it.
        """
        assert self.proc is not None
        code = proctree.exit_status(self.proc.wait())
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        self.kill_leftovers()
        if self._pump is not None:
            self._pump.join(timeout=5.0)
        return code

    def terminate(self, grace_s: float) -> None:
        """SIGTERM the command's process group now and SIGKILL it after ``grace_s``.
        Returns at once; safe to call from a signal handler and more than once."""
        self._signal_group(signal.SIGTERM)
        if self._kill_timer is None:
            self._kill_timer = threading.Timer(grace_s, self._signal_group, (signal.SIGKILL,))
            self._kill_timer.daemon = True
            self._kill_timer.start()

    def kill_now(self) -> None:
        """SIGKILL the command's process group now, with no SIGTERM first (a forced stop:
        OSMO's ``workflow cancel --force``). Safe from a signal handler, more than once."""
        self._signal_group(signal.SIGKILL)

    def kill_leftovers(self) -> None:
        """SIGKILL the command's process group and every descendant of this runner's children
        that came after the command started (the command and its orphans), with them."""
        self._signal_group(signal.SIGKILL)
        if not self.pid_namespace:
            new = [c for c in _children() if _key(c) not in self._children_before]
            proctree.send([p for c in new for p in (c, *proctree.descendants(c))], signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


ABANDON_OUTPUT_BYTES = 4096
"""The most of a failed start's own output kept in its error (the end of it)."""


def _drain(stream: IO[bytes], limit_bytes: int, timeout_s: float = 1.0) -> str:
    """What is left to read in ``stream`` (its last ``limit_bytes``), waiting at most
    ``timeout_s`` for its end."""
    data = b""
    deadline = time.monotonic() + timeout_s
    fd = stream.fileno()
    while (left := deadline - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data = (data + chunk)[-limit_bytes:]
    return data.decode("utf-8", "replace").strip()


def _with_output(exc: OSError, said: str) -> OSError:
    """``exc`` with what the program printed added to its message."""
    if not said:
        return exc
    text = " | ".join(line for line in said.splitlines() if line.strip())
    return OSError(exc.errno, f"{exc.strerror or exc}; it said: {text}")


def read_pieces(stream: IO[bytes], limit_bytes: int) -> Iterator[tuple[str, bool]]:
    """``(text, cut)`` for each line of ``stream`` (newline kept) until it ends; a line
    longer than ``limit_bytes`` comes as pieces of at most ``limit_bytes`` bytes with ``cut``
    True, then its last piece with ``cut`` False. Bytes are decoded as UTF-8 (``replace``); a
    character split by a cut is decoded whole in the next piece. Holds one piece at most."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while raw := stream.readline(limit_bytes):
        cut = len(raw) == limit_bytes and not raw.endswith(b"\n")
        yield decoder.decode(raw, final=not cut), cut
    rest = decoder.decode(b"", final=True)
    if rest:
        yield rest, False


def _children() -> list[psutil.Process]:
    try:
        return psutil.Process().children()
    except psutil.Error:
        return []


def _key(proc: psutil.Process) -> tuple[int, float]:
    """A process by pid and create time (a pid alone may be reused)."""
    try:
        return proc.pid, proc.create_time()
    except psutil.Error:
        return proc.pid, 0.0
