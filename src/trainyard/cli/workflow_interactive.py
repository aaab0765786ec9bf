"""``trainyard workflow exec|port-forward|rsync``: OSMO's interactive verbs.

The CLI asks ``POST /api/workflow/ID/task/TASK/entry`` (the submitter or an admin, never a task
token; the task must be RUNNING, else exit 4; an unknown task exits 3). For a local task the
answer names the task's sandbox init pid and address (``LocalBackend.entry``) and the CLI enters
it itself (``backends.local.enter``), only on the server's machine (same boot id, else
refused). For a Slurm task the answer names the job and the CLI runs ``srun --overlap --jobid
JOB`` on the task's node. Who may enter and why: docs/security.md, "Entering a running task";
usage: docs/interactive.md.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import err_console
from trainyard.cli.rsync_copy import copy_once, parse_rsync_args
from trainyard.cli.task_entry import command_argv, command_env, task_entry
from trainyard.errors import NotFoundError, RefusedError, TrainyardError

if TYPE_CHECKING:
    from trainyard.server.answers import TaskEntryAnswer, WorkflowAnswer

__all__ = ["register", "exec_command", "port_forward", "rsync", "parse_port", "start_upload_daemon"]

WorkflowIdArg = Annotated[
    str, typer.Argument(metavar="WORKFLOW_ID", help="The workflow's id (NAME-N).")
]
TaskArg = Annotated[str, typer.Argument(metavar="TASK", help="The task's name.")]
RetryOpt = Annotated[
    int | None,
    typer.Option(
        "--retry-id",
        "-r",
        help="The attempt (default: the task's current one); it must be RUNNING.",
    ),
]


# ---------------------------------------------------------------------- exec


def _exec_targets(
    workflow_id: str, task: str | None, group: str | None, command: list[str]
) -> tuple[list[str], list[str]]:
    """(the tasks to run in, the command): TASK, or with ``--group`` every task of that
    group (then a word click took for TASK is the command's first)."""
    if group is None:
        if task is None:
            raise typer.BadParameter("give TASK or --group GROUP", param_hint="TASK")
        return [task], command
    if task is not None:
        command = [task, *command]
    query: WorkflowAnswer = Client().json("GET", f"/api/workflow/{workflow_id}")
    tasks = [t["name"] for g in query["groups"] if g["name"] == group for t in g["tasks"]]
    if not tasks:
        groups = ", ".join(g["name"] for g in query["groups"])
        raise NotFoundError(f"workflow {workflow_id} has no group {group!r}; groups: {groups}")
    return tasks, command


def exec_command(
    workflow_id: WorkflowIdArg,
    task: Annotated[
        str | None, typer.Argument(metavar="[TASK]", help="The task's name (or --group).")
    ] = None,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[-- CMD...]", help="The command and its arguments (default: --entry)."
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group", help="Run the command in every task of this group, one after the other."
        ),
    ] = None,
    entry_command: Annotated[
        str,
        typer.Option(
            "--entry",
            help="The command when none follows -- (OSMO's entry point), split as a shell would.",
        ),
    ] = "/bin/bash",
    connect_timeout_s: Annotated[
        int,
        typer.Option(
            "--connect-timeout",
            min=1,
            help="Seconds to wait for the server's answer on how to enter the task.",
        ),
    ] = 60,
    keep_alive: Annotated[
        bool,
        typer.Option(
            "--keep-alive",
            help="OSMO's 'resume the shell if connection is lost': "
            "a session that ends by a signal or a lost connection, not by the "
            "command's own exit, is entered again while the task runs.",
        ),
    ] = False,
    retry_id: RetryOpt = None,
) -> None:
    """Run CMD (default: --entry, /bin/bash) inside a RUNNING task: on the local backend in
    its sandbox (its /, its /tmp, its network, its user namespace without capabilities),
    on Slurm with 'srun --overlap' in its job, on Kubernetes with 'kubectl exec' in its pod's
    task container. With a terminal on stdin it gets a terminal of its own. The command's exit
    status is this command's (with --group: the first
    non-zero one); an ended task exits 4, an unknown one 3. Same rule as cancel: the
    workflow's submitter or an admin."""
    import shlex

    tasks, command = _exec_targets(workflow_id, task, group, list(command or []))
    command = command or shlex.split(entry_command)
    if not command:
        raise typer.BadParameter("--entry is empty", param_hint="--entry")
    codes = [
        _exec_session(workflow_id, name, command, retry_id, connect_timeout_s, keep_alive)
        for name in tasks
    ]
    raise typer.Exit(next((code for code in codes if code), 0))


LOST_SESSION = frozenset(
    {
        -signal.SIGHUP,
        -signal.SIGKILL,
        -signal.SIGPIPE,
        128 + signal.SIGHUP,
        128 + signal.SIGKILL,
        128 + signal.SIGPIPE,
        255,
    }
)
"""Statuses of a session that was lost rather than ended by its command: killed by SIGHUP
(its terminal gone), SIGKILL or SIGPIPE (as the process or as a shell reports it), or 255
(srun's and kubectl's status for a connection that failed)."""


def _exec_session(
    workflow_id: str,
    task: str,
    command: list[str],
    retry_id: int | None,
    timeout_s: float,
    keep_alive: bool,
) -> int:
    """Run ``command`` in one task; with ``keep_alive`` (OSMO's ``--keep-alive``: "resume
    the shell if connection is lost"), a session lost (``LOST_SESSION``) is entered again,
    saying so, until the command ends by itself or the task is no longer RUNNING (its last
    status is then this one's). Returns the exit status."""
    code = _exec_in(workflow_id, task, command, retry_id, timeout_s)
    while keep_alive and code in LOST_SESSION:
        err_console.print("Reconnecting to the exec session...", markup=False)
        try:
            code = _exec_in(workflow_id, task, command, retry_id, timeout_s)
        except TrainyardError as exc:
            err_console.print(f"cannot reconnect: {exc}", markup=False)
            return code
    return code


def _exec_in(
    workflow_id: str, task: str, command: list[str], retry_id: int | None, timeout_s: float
) -> int:
    """Run ``command`` in one task; its exit status."""
    entry = task_entry(workflow_id, task, retry_id, timeout_s)
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    argv = command_argv(entry, command, tty)
    if entry["backend"] in ("slurm", "kubernetes"):
        return subprocess.call(argv, env=command_env(entry))
    return _run_with_pty(argv) if tty else _run_piped(argv)


def _run_piped(argv: list[str]) -> int:
    """Run ``argv`` with pipes relayed to this process's stdin, stdout and stderr, never
    with those themselves: one of them may be the caller's terminal, which a task could open
    through ``/proc/PID/fd`` of the command (same user namespace) and push input into."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    outs = [
        threading.Thread(target=_copy_fd, args=(pipe.fileno(), fd), daemon=True)
        for pipe, fd in ((proc.stdout, 1), (proc.stderr, 2))
    ]
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
    if (
        len(parts) not in (1, 2)
        or len(ports) != len(parts)
        or not all(0 < p < 65536 for p in ports)
    ):
        raise typer.BadParameter(
            f"{text!r} is not LOCAL[:REMOTE] with ports 1-65535", param_hint="--port"
        )
    return ports[0], ports[-1]


def port_forward(
    workflow_id: WorkflowIdArg,
    task: TaskArg,
    port: Annotated[
        str,
        typer.Option(
            "--port",
            metavar="LOCAL[:REMOTE]",
            help="Host loopback port, and the task's port (default: the same).",
        ),
    ],
    host: Annotated[
        str,
        typer.Option("--host", help="The local address to listen on (OSMO's default: localhost)."),
    ] = "localhost",
    udp: Annotated[
        bool,
        typer.Option("--udp", help="OSMO's UDP forwarding: not supported here (exit 4); TCP only."),
    ] = False,
    connect_timeout_s: Annotated[
        int,
        typer.Option(
            "--connect-timeout",
            min=1,
            help="Seconds to wait for the server's answer on how to reach the task.",
        ),
    ] = 60,
    retry_id: RetryOpt = None,
) -> None:
    """Forward 127.0.0.1:LOCAL on this machine to the task's address:REMOTE (local backend:
    inside the task's group network namespace; Slurm: the node's 127.0.0.1:REMOTE, through a
    relay that 'srun --overlap' runs beside the task for each connection) until Ctrl-C, or
    until the task ends (exit 4). Same rule as cancel."""
    local, remote = parse_port(port)
    if udp:
        raise RefusedError(
            "UDP port forwarding is not supported by trainyard; TCP only (drop --udp)"
        )
    entry = task_entry(workflow_id, task, retry_id, connect_timeout_s)
    try:
        listener = socket.create_server((host, local))
    except OSError as exc:
        raise RefusedError(f"cannot listen on {host}:{local}: {exc.strerror or exc}") from None
    where = entry.get("address") or f"node {entry.get('node')} 127.0.0.1"
    typer.echo(f"Forwarding {host}:{local} -> {task} {where}:{remote} (Ctrl-C to stop)", err=True)
    ended = threading.Event()
    alive = (
        _local_alive(entry)
        if entry["backend"] == "local"
        else _entry_alive(workflow_id, task, int(entry["retry_id"]))
    )
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


def _serve_forward(listener: socket.socket, entry: TaskEntryAnswer, remote: int) -> None:
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


def _forward_one(conn: socket.socket, entry: TaskEntryAnswer, remote: int) -> None:
    if entry["backend"] in ("slurm", "kubernetes"):  # a relay beside the task, over exec
        _forward_through_srun(conn, entry, remote)
        return
    from trainyard.backends.local.enter import connect_inside, relay

    try:
        inner = connect_inside(int(entry["pid"]), str(entry["address"]), remote)
    except OSError as exc:
        typer.echo(
            f"port-forward: cannot reach {entry['address']}:{remote} in the task: {exc}", err=True
        )
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


def _forward_through_srun(conn: socket.socket, entry: TaskEntryAnswer, remote: int) -> None:
    """One forwarded connection to a Slurm task: a relay beside the task on its node, its
    stdin and stdout carried by ``srun --overlap``."""
    python = str(entry.get("python") or "python3")  # the runner's interpreter on the nodes
    argv = command_argv(entry, [python, "-c", SRUN_RELAY, str(remote)], False, byte_stream=True)
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=command_env(entry)
    )
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


def _local_alive(entry: TaskEntryAnswer) -> Callable[[], bool]:
    """Whether the local task's sandbox still lives (its init process, by create time)."""
    from trainyard.linux.proctree import same_process

    return lambda: same_process(int(entry["pid"]), float(entry["created"])) is not None


def _entry_alive(workflow_id: str, task: str, retry_id: int) -> Callable[[], bool]:
    """Whether the server still lets the attempt be entered (it runs)."""

    def alive() -> bool:
        try:
            Client().json(
                "POST",
                f"/api/workflow/{workflow_id}/task/{task}/entry",
                params={"retry_id": retry_id},
            )
            return True
        except (RefusedError, NotFoundError):
            return False

    return alive


def _watch_task(
    alive: Callable[[], bool],
    listener: socket.socket,
    ended: threading.Event,
    interval_s: float = 1.0,
) -> None:
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


def _lead_of_first_group(workflow_id: str) -> str:
    """OSMO's default task for rsync: the lead task of the workflow's first group."""
    answer: WorkflowAnswer = Client().json("GET", f"/api/workflow/{workflow_id}")
    groups = answer.get("groups") or []
    tasks = groups[0]["tasks"] if groups else []
    lead = next((t["name"] for t in tasks if t.get("lead")), None)
    if lead is None:
        raise NotFoundError(f"workflow {workflow_id} has no task to copy to or from")
    return str(lead)


def start_upload_daemon(workflow_id: str, paths: str, poll_interval_s: float = 2.0) -> None:
    """OSMO's ``submit --rsync LOCAL:REMOTE``: a detached daemon that uploads LOCAL into the
    lead task of the workflow's first group once it runs, and again on every change, until
    the task ends (``workflow rsync status|stop`` see and stop it). Its lines go to stderr."""
    from trainyard.cli import rsync_daemon

    request = parse_rsync_args([workflow_id, paths])
    if not request.into_task:
        raise typer.BadParameter("--rsync uploads: give LOCAL:REMOTE", param_hint="'--rsync'")
    request = replace(request, task=_lead_of_first_group(workflow_id))
    rsync_daemon.start(request, poll_interval_s, err=True)


def rsync(
    args: Annotated[
        list[str],
        typer.Argument(
            metavar="[upload|download] WORKFLOW_ID [TASK] PATHS", help="See the forms above."
        ),
    ],
    retry_id: RetryOpt = None,
    daemon: Annotated[
        bool,
        typer.Option(
            "--daemon",
            help="Upload again whenever LOCAL changes, in a background process, "
            "until the task ends or 'rsync stop' (upload forms only).",
        ),
    ] = False,
    poll_interval_s: Annotated[
        float,
        typer.Option("--poll-interval", min=0.2, help="Daemon: seconds between looks at LOCAL."),
    ] = 2.0,
    timeout_s: Annotated[
        int,
        typer.Option(
            "--timeout",
            min=1,
            help="Seconds to wait for the server's answer on how to "
            "reach the task (OSMO's connection timeout).",
        ),
    ] = 10,
    no_progress: Annotated[
        bool, typer.Option("--no-progress", help="Print nothing about the copy.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="How the copy was made (rsync's --stats, or tar); daemon: debug lines in "
            "its log too.",
        ),
    ] = False,
    task: Annotated[
        str | None,
        typer.Option("--task", help="'rsync stop ID --task T': only the daemon of that task."),
    ] = None,
    debounce_delay_s: Annotated[
        float,
        typer.Option(
            "--debounce-delay",
            min=0,
            help="Daemon: upload once LOCAL has been still this many seconds.",
        ),
    ] = 0.0,
    reconcile_interval_s: Annotated[
        float | None,
        typer.Option(
            "--reconcile-interval",
            min=1,
            help="Daemon: upload again this often (s) even without a change.",
        ),
    ] = None,
    upload_rate_limit: Annotated[
        int | None,
        typer.Option(
            "--upload-rate-limit", min=1, help="Upload at most this many bytes per second."
        ),
    ] = None,
    max_log_size: Annotated[
        int,
        typer.Option(
            "--max-log-size", min=1024, help="Daemon: rotate its log past this many bytes."
        ),
    ] = 2 * 1024 * 1024,
) -> None:
    """Copy files into or out of a RUNNING task. OSMO's forms: 'rsync ID [TASK]
    LOCAL:REMOTE' and 'rsync upload ID [TASK] LOCAL:REMOTE' upload, 'rsync download ID
    [TASK] REMOTE:LOCAL' downloads (TASK defaults to the lead task of the first group;
    rsync's rule: LOCAL lands inside REMOTE under its own name, its contents do with a
    trailing '/'; /osmo/run/workspace exists in every task). trainyard's form: 'rsync ID
    TASK SRC DST' with TASK:/path on the task's side, either way; DST becomes the copy.
    Uploads run real rsync (delta transfer) over the task's exec where rsync >= 3.4.0 is
    here and in the task; else, and downloads always, through tar in the task (on Slurm: on
    its node), what comes out unpacked refusing members that would land outside the
    destination. Nothing is deleted in the destination. '--daemon' keeps uploading changes (log under
    $XDG_STATE_HOME/trainyard/rsync); 'rsync status' lists daemons, 'rsync stop [ID]' stops
    them. Same rule as cancel."""
    if args and args[0] in ("status", "stop"):
        from trainyard.cli import rsync_daemon

        rsync_daemon.status() if args[0] == "status" else rsync_daemon.stop(args[1:2], task)
        return
    request = parse_rsync_args(args)
    if request.task is None:
        request = replace(request, task=_lead_of_first_group(request.workflow_id))
    assert request.task is not None
    if daemon:
        if not request.into_task:
            raise typer.BadParameter("--daemon uploads; it cannot download", param_hint="--daemon")
        from trainyard.cli import rsync_daemon

        rsync_daemon.start(
            request,
            poll_interval_s,
            verbose=verbose,
            tuning=rsync_daemon.Tuning(
                debounce_delay_s, reconcile_interval_s, max_log_size, upload_rate_limit
            ),
        )
        return
    copy_once(
        request,
        task_entry(request.workflow_id, request.task, retry_id, timeout_s),
        upload_rate_limit,
        (lambda text: typer.echo(text, err=True)) if verbose else None,
    )
    if no_progress:
        return
    typer.echo(
        f"copied {request.local if request.into_task else request.inside} -> "
        f"{request.task + ':' if request.into_task else ''}{request.destination()}",
        err=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``exec``, ``port-forward`` and ``rsync`` to the ``workflow`` sub-app."""
    app.command("exec")(exec_command)
    app.command("port-forward")(port_forward)
    app.command("rsync")(rsync)
