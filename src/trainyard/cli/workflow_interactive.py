"""``trainyard workflow exec|port-forward|rsync``: OSMO's interactive verbs.

Design (README "Interactive verbs"): the CLI asks the server ``POST
/api/workflow/ID/task/TASK/entry`` (the rule of ``cancel``: the submitter or an admin, never
a task token; the task must be RUNNING, else exit 4; an unknown task exits 3). For a local
task the server's backend answers where the task's sandbox is (``LocalBackend.entry``: the
pid of its bwrap init process and the task's address) and the CLI enters it itself
(``backends.enter``), on the same machine only: the answer carries the server's boot id and
the CLI refuses when it differs (a remote server's tasks run on its machine, not here). The
server is the gate of trainyard's rule; the entering itself needs the OS privileges the
local backend runs with (root here), so a person who could already ``nsenter`` as root is
not stopped by it, and one who could not cannot do it through trainyard either. For a Slurm
task the answer names the job, and the CLI runs ``srun --overlap --jobid JOB`` on the node
of the task.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainyard.cli.client import Client
from trainyard.errors import NotFoundError, RefusedError

if TYPE_CHECKING:
    import tarfile

__all__ = ["register", "exec_command", "port_forward", "rsync", "parse_port", "split_task_path",
           "RsyncRequest", "parse_rsync_args", "copy_once"]

WorkflowIdArg = Annotated[str, typer.Argument(metavar="WORKFLOW_ID", help="The workflow's id (NAME-N).")]
TaskArg = Annotated[str, typer.Argument(metavar="TASK", help="The task's name.")]
RetryOpt = Annotated[int | None, typer.Option(
    "--retry-id", "-r", help="The attempt (default: the task's current one); it must be RUNNING.")]


def _entry(workflow_id: str, task: str, retry_id: int | None) -> dict[str, Any]:
    """The server's ``entry`` of the running task, checked to be enterable from here."""
    params = {} if retry_id is None else {"retry_id": retry_id}
    entry = Client().json("POST", f"/api/workflow/{workflow_id}/task/{task}/entry", params=params)
    if entry.get("backend") == "local":
        from trainyard.backends.enter import machine_id

        if entry.get("machine") != machine_id():
            raise RefusedError(f"task {task} runs on the server's machine, not this one; run "
                               "this command there")
    elif entry.get("backend") != "slurm":
        raise RefusedError(f"task {task}: its backend ({entry.get('backend')}) cannot be entered")
    return entry


def _command_argv(entry: dict[str, Any], command: list[str], tty: bool) -> list[str]:
    """The host command that runs ``command`` in the task."""
    if entry["backend"] == "slurm":
        return ["srun", "--overlap", f"--jobid={entry['job_id']}", "--nodes=1", "--ntasks=1",
                f"--nodelist={entry['node']}", *(["--pty"] if tty else []), *command]
    from trainyard.backends.enter import enter_argv

    return enter_argv(int(entry["pid"]), float(entry["created"]), command, tty=tty)


def _command_env(entry: dict[str, Any]) -> dict[str, str] | None:
    """The environment of the host command: the pool's ``SLURM_CONF`` for srun."""
    if entry["backend"] == "slurm" and entry.get("slurm_conf"):
        return {**os.environ, "SLURM_CONF": str(entry["slurm_conf"])}
    return None


# ---------------------------------------------------------------------- exec


def exec_command(workflow_id: WorkflowIdArg, task: TaskArg,
                 command: Annotated[list[str], typer.Argument(
                     metavar="-- CMD...", help="The command and its arguments.")],
                 retry_id: RetryOpt = None) -> None:
    """Run CMD inside a RUNNING task: on the local backend in its sandbox (its /, its /tmp,
    its network, its user namespace without capabilities), on Slurm with 'srun --overlap'
    in its job. With a terminal on stdin it gets a terminal of its own. The command's exit
    status is this command's; an ended task exits 4, an unknown one 3. Same rule as cancel:
    the workflow's submitter or an admin."""
    if not command:
        raise typer.BadParameter("give the command after --", param_hint="CMD")
    entry = _entry(workflow_id, task, retry_id)
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    argv = _command_argv(entry, command, tty)
    if entry["backend"] == "slurm":
        code = subprocess.call(argv, env=_command_env(entry))
    else:
        code = _run_with_pty(argv) if tty else _run_piped(argv)
    raise typer.Exit(code)


def _run_piped(argv: list[str]) -> int:
    """Run ``argv`` with pipes relayed to this process's stdin, stdout and stderr, never
    with those themselves: one of them may be the caller's terminal, which a task could open
    through ``/proc/PID/fd`` of the command (same user namespace) and push input into."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    outs = [threading.Thread(target=_copy_fd, args=(pipe.fileno(), fd), daemon=True)
            for pipe, fd in ((proc.stdout, 1), (proc.stderr, 2))]
    for thread in outs:
        thread.start()
    threading.Thread(target=_feed, args=(proc.stdin,), daemon=True).start()
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            continue  # the command got the same Ctrl-C (same process group); its status tells
    for thread in outs:
        thread.join()
    return code


def _copy_fd(src: int, dst: int) -> None:
    while data := os.read(src, 65536):
        os.write(dst, data)


def _feed(pipe: Any) -> None:
    """Copy this process's stdin to ``pipe`` until EOF (or the command stops reading)."""
    try:
        while data := os.read(0, 65536):
            pipe.write(data)
            pipe.flush()
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _run_with_pty(argv: list[str]) -> int:
    """Run ``argv`` on a new pty (never the caller's terminal: a task could push input into
    it) and relay the caller's terminal to it, raw, until it exits."""
    import termios
    import tty as ttymod

    master, slave = os.openpty()
    _copy_size(master)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    saved = termios.tcgetattr(0)
    old = signal.signal(signal.SIGWINCH, lambda *_a: _copy_size(master))
    ttymod.setraw(0, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead
    try:
        _relay_pty(master)
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old)
        os.close(master)
    return proc.wait()


def _copy_size(master: int) -> None:
    import fcntl
    import termios

    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        pass


def _relay_pty(master: int) -> None:
    while True:
        try:
            readable, _, _ = select.select([0, master], [], [])
        except InterruptedError:
            continue
        if master in readable:
            try:
                data = os.read(master, 65536)
            except OSError:
                return  # EIO: the command and its children closed the terminal
            if not data:
                return
            os.write(1, data)
        if 0 in readable:
            data = os.read(0, 65536)
            if not data:
                return
            os.write(master, data)


# ---------------------------------------------------------------------- port-forward


def parse_port(text: str) -> tuple[int, int]:
    """``LOCAL[:REMOTE]`` to ``(local, remote)`` (REMOTE defaults to LOCAL).

    Raises:
        typer.BadParameter: not one or two port numbers 1-65535.
    """
    parts = text.split(":")
    try:
        ports = [int(p) for p in parts]
    except ValueError:
        ports = []
    if len(parts) not in (1, 2) or len(ports) != len(parts) or not all(0 < p < 65536 for p in ports):
        raise typer.BadParameter(f"{text!r} is not LOCAL[:REMOTE] with ports 1-65535",
                                 param_hint="--port")
    return ports[0], ports[-1]


def port_forward(workflow_id: WorkflowIdArg, task: TaskArg,
                 port: Annotated[str, typer.Option(
                     "--port", metavar="LOCAL[:REMOTE]",
                     help="Host loopback port, and the task's port (default: the same).")],
                 retry_id: RetryOpt = None) -> None:
    """Forward 127.0.0.1:LOCAL on this machine to the task's address:REMOTE (local backend:
    inside the task's group network namespace; Slurm: the node's 127.0.0.1:REMOTE, through a
    relay that 'srun --overlap' runs beside the task for each connection) until Ctrl-C, or
    until the task ends (exit 4). Same rule as cancel."""
    local, remote = parse_port(port)
    entry = _entry(workflow_id, task, retry_id)
    try:
        listener = socket.create_server(("127.0.0.1", local))
    except OSError as exc:
        raise RefusedError(f"cannot listen on 127.0.0.1:{local}: {exc.strerror or exc}") from None
    where = entry.get("address") or f"node {entry.get('node')} 127.0.0.1"
    typer.echo(f"Forwarding 127.0.0.1:{local} -> {task} {where}:{remote} (Ctrl-C to stop)",
               err=True)
    ended = threading.Event()
    alive = (_local_alive(entry) if entry["backend"] == "local"
             else _entry_alive(workflow_id, task, int(entry["retry_id"])))
    threading.Thread(target=_watch_task, args=(alive, listener, ended), daemon=True).start()
    try:
        _serve_forward(listener, entry, remote)
    except KeyboardInterrupt:
        typer.echo("port-forward stopped", err=True)
        return
    finally:
        listener.close()
    if ended.is_set():
        raise RefusedError(f"task {task} has ended; port-forward stopped")


ACCEPT_WAKE_S = 0.5
"""How often the accepting main thread wakes: Ctrl-C is often delivered to another thread
(a relay's, the task watcher's), which does not interrupt the main thread's ``accept``;
Python runs the handler (KeyboardInterrupt) only when the main thread comes back."""


def _serve_forward(listener: socket.socket, entry: dict[str, Any], remote: int) -> None:
    listener.settimeout(ACCEPT_WAKE_S)
    while True:
        try:
            conn, _addr = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return  # closed: the task ended
        conn.settimeout(None)
        threading.Thread(target=_forward_one, args=(conn, entry, remote), daemon=True).start()


def _forward_one(conn: socket.socket, entry: dict[str, Any], remote: int) -> None:
    if entry["backend"] == "slurm":
        _forward_through_srun(conn, entry, remote)
        return
    from trainyard.backends.enter import connect_inside, relay

    try:
        inner = connect_inside(int(entry["pid"]), str(entry["address"]), remote)
    except OSError as exc:
        typer.echo(f"port-forward: cannot reach {entry['address']}:{remote} in the task: {exc}",
                   err=True)
        conn.close()
        return
    relay(conn, inner)


SRUN_RELAY = """
import os, socket, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def up():
    while data := os.read(0, 65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
"""
"""Runs on a Slurm task's node (``srun --overlap``, with the runner's interpreter): one
connection to the node's 127.0.0.1:PORT, relayed to srun's stdin and stdout."""


def _forward_through_srun(conn: socket.socket, entry: dict[str, Any], remote: int) -> None:
    """One forwarded connection to a Slurm task: a relay beside the task on its node, its
    stdin and stdout carried by ``srun --overlap``."""
    python = str(entry.get("python") or "python3")  # the runner's interpreter on the nodes
    argv = _command_argv(entry, [python, "-c", SRUN_RELAY, str(remote)], False)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=_command_env(entry))
    assert proc.stdin is not None and proc.stdout is not None

    def up() -> None:
        try:
            while data := conn.recv(65536):
                proc.stdin.write(data)  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass

    threading.Thread(target=up, daemon=True).start()
    try:
        while data := os.read(proc.stdout.fileno(), 65536):
            conn.sendall(data)
    except OSError:
        pass
    finally:
        conn.close()
        proc.wait()


def _local_alive(entry: dict[str, Any]) -> Callable[[], bool]:
    """Whether the local task's sandbox still lives (its init process, by create time)."""
    from trainyard.runner.proctree import same_process

    return lambda: same_process(int(entry["pid"]), float(entry["created"])) is not None


def _entry_alive(workflow_id: str, task: str, retry_id: int) -> Callable[[], bool]:
    """Whether the server still lets the attempt be entered (it runs)."""
    def alive() -> bool:
        try:
            Client().json("POST", f"/api/workflow/{workflow_id}/task/{task}/entry",
                          params={"retry_id": retry_id})
            return True
        except (RefusedError, NotFoundError):
            return False
    return alive


def _watch_task(alive: Callable[[], bool], listener: socket.socket,
                ended: threading.Event, interval_s: float = 1.0) -> None:
    """Close ``listener`` once the task is gone (``alive`` asked every ``interval_s``)."""
    while alive():
        threading.Event().wait(interval_s)
    ended.set()
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


# ---------------------------------------------------------------------- rsync


def _task_path(inside: str, shown: str) -> str:
    """A path in the task, checked: absolute, not ``/``, without ``..`` (``shown`` names it
    in the error)."""
    pure = PurePosixPath(inside)
    if not pure.is_absolute() or ".." in pure.parts or str(pure) == "/":
        raise typer.BadParameter(f"{shown}: the task's path must be absolute, not '/', "
                                 "without '..'")
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
        raise typer.BadParameter(f"exactly one of SRC and DST must be {prefix}/PATH (the task's "
                                 "side); the other is a path on this machine")
    into_task = sides[1]
    inside = (dst if into_task else src)[len(prefix):]
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
            "REMOTE:LOCAL, or WORKFLOW_ID TASK SRC DST with TASK:/PATH on one side")
    into_task = verb != "download"
    local, inside = _split_pair(rest[-1], into_task)
    return RsyncRequest(rest[0], rest[1] if len(rest) == 3 else None,
                        os.path.expanduser(local), inside, into_task)


def _split_pair(text: str, into_task: bool) -> tuple[str, str]:
    """``LOCAL:REMOTE`` (upload) or ``REMOTE:LOCAL`` (download) to ``(local, remote)``; the
    remote path is absolute, so an upload splits at the last ``:``, a download at the first."""
    form = "LOCAL:REMOTE" if into_task else "REMOTE:LOCAL"
    first, sep, second = text.rpartition(":") if into_task else text.partition(":")
    if not sep or not first or not second:
        raise typer.BadParameter(f"{text!r} is not {form} (e.g. ./src:/osmo/run/workspace)",
                                 param_hint=form)
    local, remote = (first, second) if into_task else (second, first)
    checked = _task_path(remote, remote)
    return local, checked + ("/" if remote.endswith("/") and checked != "/" else "")


def _lead_of_first_group(workflow_id: str) -> str:
    """OSMO's default task for rsync: the lead task of the workflow's first group."""
    groups = Client().json("GET", f"/api/workflow/{workflow_id}").get("groups") or []
    tasks = groups[0]["tasks"] if groups else []
    lead = next((t["name"] for t in tasks if t.get("lead")), None)
    if lead is None:
        raise NotFoundError(f"workflow {workflow_id} has no task to copy to or from")
    return str(lead)


def rsync(args: Annotated[list[str], typer.Argument(
              metavar="[upload|download] WORKFLOW_ID [TASK] PATHS",
              help="See the forms above.")],
          retry_id: RetryOpt = None,
          daemon: Annotated[bool, typer.Option(
              "--daemon", help="Upload again whenever LOCAL changes, in a background process, "
                               "until the task ends or 'rsync stop' (upload forms only).")] = False,
          poll_interval_s: Annotated[float, typer.Option(
              "--poll-interval", min=0.2, help="Daemon: seconds between looks at LOCAL.")] = 2.0,
          ) -> None:
    """Copy files into or out of a RUNNING task. OSMO's forms: 'rsync ID [TASK]
    LOCAL:REMOTE' and 'rsync upload ID [TASK] LOCAL:REMOTE' upload, 'rsync download ID
    [TASK] REMOTE:LOCAL' downloads (TASK defaults to the lead task of the first group;
    rsync's rule: LOCAL lands inside REMOTE under its own name, its contents do with a
    trailing '/'; /osmo/run/workspace exists in every task). trainyard's form: 'rsync ID
    TASK SRC DST' with TASK:/path on the task's side, either way; DST becomes the copy.
    Copies run through tar in the task (on Slurm: on its node); what comes out is unpacked
    refusing members that would land outside the destination. Nothing is deleted in the
    destination. '--daemon' keeps uploading changes (log under
    $XDG_STATE_HOME/trainyard/rsync); 'rsync status' lists daemons, 'rsync stop [ID]' stops
    them. Same rule as cancel."""
    if args and args[0] in ("status", "stop"):
        from trainyard.cli import rsync_daemon

        rsync_daemon.status() if args[0] == "status" else rsync_daemon.stop(args[1:2])
        return
    request = parse_rsync_args(args)
    if request.task is None:
        request = replace(request, task=_lead_of_first_group(request.workflow_id))
    assert request.task is not None
    if daemon:
        if not request.into_task:
            raise typer.BadParameter("--daemon uploads; it cannot download", param_hint="--daemon")
        from trainyard.cli import rsync_daemon

        rsync_daemon.start(request, poll_interval_s)
        return
    copy_once(request, _entry(request.workflow_id, request.task, retry_id))
    typer.echo(f"copied {request.local if request.into_task else request.inside} -> "
               f"{request.task + ':' if request.into_task else ''}{request.destination()}",
               err=True)


def copy_once(request: RsyncRequest, entry: dict[str, Any]) -> None:
    """Make one copy of ``request`` through the task's ``entry``.

    Raises:
        typer.BadParameter: the local source is missing.
        RefusedError: the copy failed or what the task sent was refused.
    """
    if request.into_task:
        _copy_in(entry, Path(request.local), request.destination())
    else:
        if not request.copy_is_target and Path(request.local).exists() \
                and not Path(request.local).is_dir():
            raise typer.BadParameter(f"{request.local}: a download's LOCAL must be a folder "
                                     "(REMOTE lands inside it)", param_hint="REMOTE:LOCAL")
        _copy_out(entry, request.inside, Path(request.destination()))


def _in_task(entry: dict[str, Any], command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(_command_argv(entry, command, False), env=_command_env(entry), **kwargs)


def _owner_reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _copy_in(entry: dict[str, Any], local: Path, inside: str) -> None:
    import tarfile  # here, not at the CLI's start

    if not local.exists():
        raise typer.BadParameter(f"{local}: no such file or folder", param_hint="SRC")
    where = inside if local.is_dir() else str(PurePosixPath(inside).parent)
    script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -f - -C "$1"'
    proc = _in_task(entry, ["sh", "-c", script, "sh", where], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|") as archive:
            name = "." if local.is_dir() else PurePosixPath(inside).name
            archive.add(local, arcname=name, filter=_owner_reset)
    except BrokenPipeError:
        pass
    finally:
        proc.stdin.close()
    _check_copy(proc.wait(), f"unpacking into {inside} in the task")


def _copy_out(entry: dict[str, Any], inside: str, local: Path) -> None:
    """Unpack into a temporary folder beside ``local`` first: a refused archive leaves
    nothing half-made at ``local``."""
    import tempfile
    is_dir = _in_task(entry, ["test", "-d", inside]).wait() == 0
    path = PurePosixPath(inside)
    argv = (["tar", "-c", "-f", "-", "-C", inside, "."] if is_dir
            else ["tar", "-c", "-f", "-", "-C", str(path.parent), path.name])
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
    Python's own ``tarfile`` filters let through."""
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


def register(app: typer.Typer) -> None:
    """Add ``exec``, ``port-forward`` and ``rsync`` to the ``workflow`` sub-app."""
    app.command("exec")(exec_command)
    app.command("port-forward")(port_forward)
    app.command("rsync")(rsync)
