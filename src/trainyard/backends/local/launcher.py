"""The local backend's launcher: one long-lived process per backend folder that forks task
runners and holds the groups' network namespaces (a small node agent, as a kubelet is).

Protocol: a Unix stream socket in Linux's abstract namespace, answering only processes of
its own user (``SO_PEERCRED``); one JSON request line per connection, one JSON reply line
(``{"error": "..."}`` on failure). Message types, shared by both ends:
``backends.local.messages``. The launcher exits after ``idle_s`` without work, or on SIGTERM.
Here: the client (backend side) and the request loop; the groups' namespaces:
``launcher_groups``; its spares, runner processes and log: ``launcher_process``.

Design: docs/local-backend.md, "Module: `src/trainyard/backends/local/launcher.py`".
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import hashlib
import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Literal, cast

import trainyard
from trainyard.backends.local import netns
from trainyard.backends.local.launcher_groups import GroupNetworks
from trainyard.backends.local.launcher_process import Children, say
from trainyard.backends.local.messages import (
    ErrorReply,
    LauncherRequest,
    Network,
    NetworkReply,
    NetworkSpec,
    PidReply,
    Ping,
    Release,
    Run,
    RunMany,
    RunManyReply,
    RunReply,
    RunSpec,
    StartReply,
    Stop,
    StopReply,
    parse_request,
)
from trainyard.errors import BackendError
from trainyard.linux import nsgate, proctree
from trainyard.runner.hosted import ENDED, HostedRunner

__all__ = ["LauncherClient", "address_name", "fingerprint", "serve", "main"]

LOG = "launcher.log"
_READ_LIMIT = 1 << 20


# ---------------------------------------------------------------------- fingerprint


def fingerprint(python: str = sys.executable) -> str:
    """12 hex digits naming this interpreter and this trainyard code (paths, sizes, mtimes)."""
    digest = hashlib.sha256(os.path.realpath(python).encode())
    root = Path(trainyard.__file__).resolve().parent
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


# ---------------------------------------------------------------------- client (backend side)


class LauncherClient:
    """Talks to the launcher of ``state_dir``, starting one if none answers.

    Args:
        state_dir: the local backend's folder (the socket and the launcher's log live there).
        python: the interpreter that runs the launcher (and so every runner).
        idle_s: how long a launcher with no request and no child lives on.
    """

    def __init__(
        self,
        state_dir: Path,
        python: str = sys.executable,
        idle_s: float = 300.0,
        start_timeout_s: float = 20.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.python = python
        self.idle_s = idle_s
        self.start_timeout_s = start_timeout_s
        self.name = address_name(self.state_dir, python)
        self._lock = threading.Lock()

    def run(
        self,
        run_json: Path,
        out: Path,
        cwd: Path,
        env: dict[str, str],
        group: str | None,
        mode: Literal["process", "thread"] = "process",
        network: NetworkSpec | None = None,
    ) -> tuple[int, float]:
        """Start a runner for ``run_json``: a forked process, or (``mode="thread"``) a thread
        of the launcher. Returns (pid, create time) of the process that runs it.

        Args:
            network: the group's namespace: (thread only, as root) the
                thread joins that group's namespace, made as by ``network`` if need be, so
                the command starts in it with no ``nsenter`` and no request of its own.

        Raises:
            BackendError: no launcher answers, or it could not start the runner.
        """
        reply = cast(
            StartReply,
            self.request(
                Run(
                    run_json=str(run_json),
                    out=str(out),
                    cwd=str(cwd),
                    env=env,
                    group=group,
                    mode=mode,
                    network=network,
                )
            ),
        )
        return int(reply["pid"]), float(reply["created"])

    def run_many(
        self, runs: list[RunSpec], env: dict[str, str]
    ) -> list[tuple[int, float, bool] | BackendError]:
        """Start several runners with one request (``run_many``, see the module docstring).

        Args:
            runs: one start per runner (``run``'s arguments; ``env`` optional), with
                optionally ``launch_json`` (a path) and ``launch``: the launcher writes
                ``launch`` with the start's ``pid`` and ``created`` there before it
                replies (``_record``).
            env: the environment of every run that names none.

        Returns:
            Per run, in order: (pid, create time of the process that runs it, whether
            ``launch_json`` was written), or the ``BackendError`` that says why that one
            did not start.

        Raises:
            BackendError: no launcher answers (none of them started).
        """
        results = cast(RunManyReply, self.request(RunMany(env=env, runs=runs)))["results"]
        if len(results) != len(runs):
            raise BackendError(f"launcher: {len(results)} replies to {len(runs)} starts")
        return [_started_or_error(r) for r in results]

    def stop_hosted(self, run_dir: Path, name: str | None = None, force: bool = False) -> bool:
        """Stop the hosted runner of ``run_dir`` (starts no launcher).

        Args:
            run_dir: the attempt's run folder.
            name: the launcher that hosts it (default this client's; an older launcher,
                of code since changed, keeps hosting what it started).
            force: SIGKILL its command now, no SIGTERM first (``LocalBackend.kill``).

        Returns:
            Whether its thread still runs; False also when no launcher answers (none:
            nothing it hosted is left).
        """
        try:
            reply = cast(StopReply, self._send(Stop(run_dir=str(run_dir), force=force), name))
            return bool(reply.get("running"))
        except (OSError, BackendError, ValueError):
            return False

    def network(self, group: str, forward: list[int], egress: bool = True) -> netns.GroupNetwork:
        """The namespace of ``group`` (made if none is alive; with ``egress``, pasta is
        attached to it and ends with it).

        Raises:
            BackendError: no launcher answers, or the namespace could not be made.
        """
        reply = cast(
            NetworkReply, self.request(Network(group=group, forward=forward, egress=egress))
        )
        return netns.GroupNetwork(
            int(reply["launcher_pid"]),
            int(reply["ns_pid"]),
            float(reply["ns_created"]),
            bool(reply["user_ns"]),
            reply.get("ns_path"),
        )

    def release(self) -> None:
        """Ask a running launcher to exit as soon as no runner of it is left (starts none)."""
        try:
            self._send(Release())
        except (OSError, BackendError, ValueError):
            pass

    def request(self, message: LauncherRequest) -> dict[str, Any]:
        """Send one request, starting a launcher first when none answers. Returns the
        launcher's reply (the TypedDict of ``messages`` that answers ``message``'s op)."""
        try:
            return self._send(message)
        except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, _NoReply):
            # none, or one that was exiting (released or idle) and dropped the request
            self._start()
            return self._send(message)

    def _send(self, message: LauncherRequest, name: str | None = None) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30.0)
            sock.connect(_abstract(name or self.name))
            sock.sendall(message.model_dump_json().encode() + b"\n")
            reply = _read_line(sock)
        if not reply:
            raise _NoReply(
                f"the launcher {self.name} closed without a reply (see {self.state_dir / LOG})"
            )
        data = json.loads(reply)
        if "error" in data:
            raise BackendError(f"launcher: {data['error']}")
        return dict(data)

    def _start(self) -> None:
        """Start a launcher unless another process just did (an exclusive lock file)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.state_dir / "launcher.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._answers():
                return
            argv = [
                self.python,
                "-m",
                "trainyard.backends.local.launcher",
                self.name,
                "--idle-s",
                str(self.idle_s),
            ]
            try:
                with open(self.state_dir / LOG, "ab") as log:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                        close_fds=True,
                    )
            except OSError as exc:
                raise BackendError(f"could not start the launcher ({self.python}): {exc}") from exc
            deadline = time.monotonic() + self.start_timeout_s
            while time.monotonic() < deadline:
                if self._answers():
                    return
                if proc.poll() is not None:
                    break
                time.sleep(0.01)
            with contextlib.suppress(OSError):
                proc.kill()
            tail = (self.state_dir / LOG).read_text(errors="replace")[-500:].strip()
            raise BackendError(f"the launcher did not start (log {self.state_dir / LOG}): {tail}")

    def _answers(self) -> bool:
        try:
            self._send(Ping())
            return True
        except (OSError, BackendError, ValueError):
            return False


def _started_or_error(reply: RunReply | ErrorReply) -> tuple[int, float, bool] | BackendError:
    """One start's answer in a ``run_many`` reply: (pid, create time, recorded), or why not."""
    if "error" in reply:
        return BackendError(f"launcher: {cast(ErrorReply, reply)['error']}")
    started = cast(RunReply, reply)
    return int(started["pid"]), float(started["created"]), bool(started.get("recorded"))


class _NoReply(BackendError):
    """The launcher closed the connection without answering (it was exiting)."""


def address_name(state_dir: Path, python: str = sys.executable) -> str:
    """The launcher's abstract socket name for a backend folder and this code."""
    folder = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:16]
    return f"trainyard-launcher-{folder}-{fingerprint(python)}"


def _abstract(name: str) -> str:
    return "\0" + name


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < _READ_LIMIT:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return b"".join(chunks)


# ---------------------------------------------------------------------- launcher (server side)


class _Launcher:
    """The launcher's state and its request loop: runners started (forked by a spare of
    ``children``, or hosted by a thread), by group; the groups' namespaces (``networks``)."""

    def __init__(
        self, name: str, idle_s: float, group_grace_s: float, spare_count: int = 2
    ) -> None:
        self.name = name
        self.idle_s = idle_s
        self.runners: dict[int | str, str | None] = {}  # pid or hosted run folder -> group
        self.hosted: dict[str, HostedRunner] = {}
        self.to_start: list[HostedRunner] = []  # hosted runners to start once replied
        self.children = Children(spare_count)
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.last_request = time.monotonic()
        self.created = proctree.create_time(os.getpid()) or time.time()
        self.networks = GroupNetworks(self.selector, self.children, self.created, group_grace_s)
        self.released = False

    # -------------------------------------------------------------- main loop

    def bind(self) -> bool:
        """Listen on the socket; False when another launcher already holds the name."""
        try:
            self.listener.bind(_abstract(self.name))
        except OSError:
            return False
        self.listener.listen(128)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        return True

    def loop(self) -> None:
        """Serve requests and relay ports until SIGTERM, release or idle (``_done``)."""
        while not self._done():
            short = self.children.short_of_spares()
            ready = self.selector.select(timeout=0.0 if short else 0.05)
            for key, _mask in ready:
                if key.fileobj is self.listener:
                    self._accept()
                elif key.data[0] == "egress":
                    self.networks.finish_egress(self.networks.groups.get(key.data[1]))
                else:
                    self.networks.relay(key.data, key.fileobj)  # type: ignore[arg-type]
            if not ready and self.children.short_of_spares():
                self.children.add_spare()  # only when no request waits: off the path
            self._reap()
            self._reap_hosted()
            self.networks.expire()

    def _done(self) -> bool:
        if _TERMINATED.is_set():
            return True
        if self.released and not self.runners:
            return True
        idle = time.monotonic() - self.last_request > self.idle_s
        return idle and not self.runners and not self.networks.groups

    def close(self) -> None:
        """Let the spares exit unused, stop listening, drop every group's namespace."""
        self.children.close()
        self.selector.close()
        self.listener.close()
        self.networks.close()

    # -------------------------------------------------------------- requests

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10.0)
            self.last_request = time.monotonic()
            try:
                if _peer_uid(conn) != os.getuid():
                    raise PermissionError("only this user's processes may use the launcher")
                reply: object = self._handle(parse_request(_read_line(conn)))
            except Exception as exc:  # every request gets an answer
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")
        self._start_hosted()

    def _start_hosted(self) -> None:
        """Start the threads of the runners ``_host`` took, after its reply went out: the
        engine starts tasks one after the other, and ``Thread.start`` waits for the new
        thread to hold the GIL once, which takes one or more switch intervals (5 ms each)
        while other runner threads run Python (median 19 ms with 3 busy threads, against
        0.08 ms with none). Before the main loop goes on, so ``_reap_hosted`` never sees
        an unstarted thread. One that cannot start ends as a runner that failed: its
        traceback in its ``out`` file, then ``runner.ended``."""
        while self.to_start:
            hosted = self.to_start.pop(0)
            try:
                hosted.start()
            except Exception:  # noqa: BLE001 - the backend must see it end
                with open(hosted.out, "a", encoding="utf-8") as handle:
                    handle.write(traceback.format_exc())
                (hosted.run_dir / ENDED).touch()
                self.hosted.pop(str(hosted.run_dir), None)
                self._left(str(hosted.run_dir))

    def _handle(
        self, request: LauncherRequest
    ) -> PidReply | StopReply | NetworkReply | StartReply | RunManyReply:
        """The reply to one request (parsed: ``messages.parse_request``)."""
        if isinstance(request, Ping):
            return {"pid": os.getpid()}
        if isinstance(request, Release):
            self.released = True
            return {"pid": os.getpid()}
        if isinstance(request, Stop):
            hosted = self.hosted.get(request.run_dir)
            if hosted is not None:
                hosted.stop(force=request.force)
            return {"running": hosted is not None and hosted.is_alive()}
        self.released = False  # an engine uses it again
        if isinstance(request, Network):
            return self.networks.network(request)
        if isinstance(request, Run):
            return self._run(request)
        return {"results": [self._run_one_of(run, request.env) for run in request.runs]}

    def _run_one_of(self, run: RunSpec, env: dict[str, str]) -> RunReply | ErrorReply:
        """One start of a ``run_many`` request: its reply, or its own error. With
        ``launch_json``, the start is recorded there first (``_record``)."""
        try:
            started = self._run(run if run.env is not None else run.model_copy(update={"env": env}))
        except Exception as exc:  # noqa: BLE001 - one bad start must not stop the others
            return {"error": f"{type(exc).__name__}: {exc}"}
        reply: RunReply = {"pid": started["pid"], "created": started["created"]}
        if run.launch_json:
            reply["recorded"] = _record(Path(run.launch_json), {**run.launch, **started})
        return reply

    def _run(self, run: RunSpec) -> StartReply:
        """Hand the job to a spare (forked earlier, waiting on a pipe) or fork one now; or,
        for ``mode: thread``, to a thread of this process."""
        if run.mode == "thread":
            return self._host(run, run.group)
        job = run.model_dump_json(exclude={"op"}).encode()  # a RunSpec, also for a Run
        pid, created = self.children.hand_job(job)
        self._joined(pid, run.group)
        return {"pid": pid, "created": created}

    def _host(self, run: RunSpec, group: str | None) -> StartReply:
        join = self.networks.hosted_join(run.network)
        hosted = HostedRunner(Path(run.run_json), Path(run.out), run.env or {}, first=join)
        key = str(hosted.run_dir)
        if key in self.hosted:
            raise ValueError(f"a runner for {key} already runs")
        self.to_start.append(hosted)  # started once the reply is out (``_start_hosted``)
        self.hosted[key] = hosted
        self._joined(key, group)
        return {"pid": os.getpid(), "created": self.created}

    # -------------------------------------------------------------- runners

    def _joined(self, runner: int | str, group: str | None) -> None:
        self.runners[runner] = group
        self.networks.joined(runner, group)

    def _left(self, runner: int | str) -> None:
        self.networks.left(runner, self.runners.pop(runner, None))

    def _reap(self) -> None:
        for pid in self.children.reap():
            self._left(pid)

    def _reap_hosted(self) -> None:
        for key in [k for k, hosted in self.hosted.items() if not hosted.is_alive()]:
            del self.hosted[key]
            self._left(key)


def _record(path: Path, data: dict[str, object]) -> bool:
    """Write a start's record (the attempt's ``launch.json``: what the backend sent in
    ``launch``, with the ``pid`` and ``created`` of the process that runs it) as the
    backend would, 0600, whole or not at all. Returns False, said in the log, when it
    cannot: the backend then writes it itself after the reply."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(data))
        partial.replace(path)
    except OSError as exc:
        say(f"launcher: could not record the start in {path}: {exc}")
        return False
    return True


def serve(name: str, idle_s: float = 300.0, group_grace_s: float = 5.0) -> int:
    """The launcher's main loop (see module docstring). Returns 0 when it idled out, 3 when
    another launcher already holds ``name``."""
    import trainyard.runner.main  # noqa: F401 - imported once here, inherited by every fork
    from trainyard.data.runnerhook import load_data_hook

    load_data_hook()  # the data layer (fsspec) too, for tasks with inputs, outputs, checkpoints
    _raise_open_files_limit()  # hosted runners keep their logs and pipes open in this process
    gc.freeze()  # what is imported now is never collected: a child's GC pass leaves it unshared
    if os.geteuid() == 0:  # hosted runners' user namespaces: no exec per task (linux.nsgate)
        why_not = nsgate.start()
        if why_not is not None:
            say(f"launcher: {why_not}; each task's user namespace is set up with nsenter")

    launcher = _Launcher(name, idle_s, group_grace_s)
    if not launcher.bind():
        say(f"launcher {name}: another launcher holds the name; exiting")
        return 3
    signal.signal(signal.SIGTERM, _on_sigterm)
    say(f"launcher {name}: serving (pid {os.getpid()})")
    why = ""
    try:
        launcher.loop()
    except BaseException as exc:
        why = str(exc) if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
        raise
    finally:
        launcher.close()
        why = why or (
            "SIGTERM" if _TERMINATED.is_set() else "released" if launcher.released else "idle"
        )
        say(f"launcher {name}: exiting ({why})")
    return 0


def _raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (at most 1 << 16): each hosted runner holds a
    few descriptors (its log, its command's output pipe) of this one process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


_TERMINATED = threading.Event()
"""Set by SIGTERM; the loop ends at its next turn (at most ~0.05 s). Raising SystemExit in the
handler was lost when the signal landed inside logging's lock release, where Python ignores
exceptions: the launcher then ran on until idle (CI: 'ignored SIGTERM for 60 s')."""


def _on_sigterm(signum: int, _frame: object) -> None:
    _TERMINATED.set()


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.backends.local.launcher NAME [--idle-s S] [--group-grace-s S]``."""
    parser = argparse.ArgumentParser(prog="python -m trainyard.backends.local.launcher")
    parser.add_argument("name", help="abstract socket name (address_name)")
    parser.add_argument("--idle-s", type=float, default=300.0)
    parser.add_argument("--group-grace-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    return serve(args.name, args.idle_s, args.group_grace_s)


if __name__ == "__main__":
    sys.exit(main())
