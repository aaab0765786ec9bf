"""``trainyard workflow rsync ... --daemon``: keep uploading a local path into a running task.

As OSMO's (user guide, Interactive > Rsync, "Daemon"): the command starts a detached
process and prints its pid and its log,
``$XDG_STATE_HOME/trainyard/rsync/rsync_daemon_<workflow>_<task>.log`` (default
``~/.local/state``). The daemon uploads once at start, then looks at the local path every
``poll_interval_s`` seconds (file sizes and modification times) and uploads again after a
change (through the same copy as a single ``rsync``: rsync's delta transfer where rsync is
installed here and in the task, else the whole path by tar; nothing is deleted in the task,
as in OSMO). It ends by itself once the task no longer runs (the server refuses
its entry), on SIGTERM (``rsync stop``), or after a failed upload that the task's end does
not explain (logged). Its pid file sits beside the log: ``rsync status`` lists the daemons,
``rsync stop [WORKFLOW_ID]`` stops them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from trainyard.cli.rsync_copy import RsyncRequest, copy_once
from trainyard.cli.task_entry import task_entry
from trainyard.errors import NotFoundError, RefusedError, TrainyardError

if TYPE_CHECKING:
    from trainyard.server.answers import WorkflowAnswer

__all__ = ["state_dir", "log_path", "start", "status", "stop", "snapshot", "main"]

log = logging.getLogger("trainyard.rsync")

ALIVE_CHECK_S = 5.0
"""Between two uploads, how often the daemon asks the server whether the task still runs."""


def state_dir() -> Path:
    """The daemons' folder: ``$XDG_STATE_HOME/trainyard/rsync`` (``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "trainyard" / "rsync"


def log_path(workflow_id: str, task: str) -> Path:
    """The log of the daemon of ``workflow_id``'s ``task`` (its pid file: ``.pid``)."""
    return state_dir() / f"rsync_daemon_{workflow_id}_{task}.log"


def start(
    request: RsyncRequest,
    poll_interval_s: float,
    *,
    err: bool = False,
    verbose: bool = False,
    tuning: Tuning | None = None,
) -> None:
    """Start the daemon detached (its own session, stdin closed, output to its log) and say
    where it logs (on stderr with ``err``). One daemon per workflow and task: a running one is refused (exit 4).

    Raises:
        RefusedError: a daemon already uploads to that task.
    """
    assert request.task is not None
    logfile = log_path(request.workflow_id, request.task)
    logfile.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    running = _alive_pid(logfile.with_suffix(".pid"))
    if running is not None:
        raise RefusedError(
            f"an rsync daemon (pid {running}) already uploads to "
            f"{request.workflow_id} {request.task}; 'trainyard workflow rsync "
            f"stop {request.workflow_id}' stops it"
        )
    argv = [
        sys.executable,
        "-m",
        "trainyard.cli.rsync_daemon",
        json.dumps(asdict(request)),
        str(poll_interval_s),
        json.dumps(asdict(tuning or Tuning())),
        *(["--verbose"] if verbose else []),
    ]
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    typer.echo(f"Rsync daemon started in detached process: PID {proc.pid}", err=err)
    typer.echo(f"To view daemon logs: tail -f {logfile}", err=err)


def status() -> None:
    """Print one line per daemon: pid, RUNNING or STOPPED, workflow, task, paths, log."""
    rows = []
    for pid_file in sorted(state_dir().glob("rsync_daemon_*.pid")):
        info = _read_pid_file(pid_file)
        if info is None:
            continue
        state = "RUNNING" if _alive_pid(pid_file) is not None else "STOPPED"
        rows.append(
            f"{info['pid']:>7}  {state:<8} {info['workflow_id']} {info['task']} "
            f"{info['local']} -> {info['destination']}  log {pid_file.with_suffix('.log')}"
        )
    typer.echo("\n".join(rows) if rows else "no rsync daemons")


def stop(workflow_ids: list[str], task: str | None = None) -> None:
    """SIGTERM every running daemon (of ``workflow_ids[0]`` when given, and of its ``task``
    when given: OSMO's ``rsync stop ID --task T``); say which."""
    stopped = 0
    for pid_file in sorted(state_dir().glob("rsync_daemon_*.pid")):
        info = _read_pid_file(pid_file)
        if info is None or (workflow_ids and info["workflow_id"] != workflow_ids[0]):
            continue
        if task is not None and info["task"] != task:
            continue
        pid = _alive_pid(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            stopped += 1
            typer.echo(f"stopped rsync daemon {pid} ({info['workflow_id']} {info['task']})")
    if not stopped:
        typer.echo("no rsync daemon was running")


def _read_pid_file(pid_file: Path) -> dict[str, object] | None:
    try:
        info = json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def _alive_pid(pid_file: Path) -> int | None:
    """The pid of the daemon that wrote ``pid_file`` while it still runs (same process: by
    its start time, as a pid is reused), else None."""
    info = _read_pid_file(pid_file)
    if info is None:
        return None
    from trainyard.linux.proctree import same_process

    pid, created = info["pid"], info.get("created", 0.0)
    if not isinstance(pid, int) or not isinstance(created, (int, float)):
        return None
    return pid if same_process(pid, created) is not None else None


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (mtime_ns, size)}`` of ``path`` (a file, or everything under a
    folder, links not followed); what the daemon compares between looks."""
    if not path.is_dir():
        try:
            found = path.stat()
        except OSError:
            return {}
        return {"": (found.st_mtime_ns, found.st_size)}
    seen: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(folder, name)
            try:
                found = os.lstat(full)
            except OSError:
                continue
            seen[os.path.relpath(full, path)] = (found.st_mtime_ns, found.st_size)
    return seen


@dataclass(frozen=True)
class Tuning:
    """OSMO's daemon flags: ``debounce_s`` (upload once LOCAL has not changed for this long;
    0: at the first look that sees a change), ``reconcile_s`` (upload again this often even
    without a change, so an upload lost to a broken connection is made good; None: never),
    ``max_log_bytes`` (the log is rotated past this size, one old copy kept)."""

    debounce_s: float = 0.0
    reconcile_s: float | None = None
    max_log_bytes: int = 2 * 1024 * 1024
    rate_bytes_per_s: int | None = None
    """OSMO's ``--upload-rate-limit``: each upload at most this fast (None: no limit)."""


class _Stop(Exception):
    """SIGTERM: stop between uploads."""


def _upload(request: RsyncRequest, rate_bytes_per_s: int | None = None) -> None:
    assert request.task is not None
    entry = task_entry(request.workflow_id, request.task, None)
    copy_once(request, entry, rate_bytes_per_s, log.debug)


def _due(
    seen: dict[str, tuple[int, int]],
    uploaded: dict[str, tuple[int, int]] | None,
    changed_at: float,
    uploaded_at: float,
    tuning: Tuning,
    now: float,
) -> bool:
    """Whether to upload now: LOCAL differs from what was uploaded and has been still for
    ``debounce_s``, or ``reconcile_s`` passed since the last upload."""
    if seen != uploaded:
        return now - changed_at >= tuning.debounce_s
    return tuning.reconcile_s is not None and now - uploaded_at >= tuning.reconcile_s


def run(request: RsyncRequest, poll_interval_s: float, tuning: Tuning | None = None) -> int:
    """The daemon's loop (see module docstring). Returns its exit status: 0 when the task
    ended or it was stopped, 1 after an upload failed while the task still ran."""
    assert request.task is not None
    tuning = tuning or Tuning()
    stop_now = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_a: stop_now.set())
    uploaded: dict[str, tuple[int, int]] | None = None
    last_seen: dict[str, tuple[int, int]] | None = None
    changed_at = uploaded_at = time.monotonic()
    next_check = time.monotonic() + ALIVE_CHECK_S
    log.info(
        "Starting rsync daemon: %s -> %s %s:%s (every %.1f s)",
        request.local,
        request.workflow_id,
        request.task,
        request.destination(),
        poll_interval_s,
    )
    if not _wait_started(request, stop_now, poll_interval_s):
        log.info("Task %s ended before it ran; rsync daemon stops", request.task)
        return 0
    while not stop_now.is_set():
        seen, now = snapshot(Path(request.local)), time.monotonic()
        if seen != last_seen:
            last_seen, changed_at = seen, now
            log.debug("Change seen in %s (%d entries)", request.local, len(seen))
        if _due(seen, uploaded, changed_at, uploaded_at, tuning, now) or uploaded is None:
            try:
                _upload(request, tuning.rate_bytes_per_s)
            except (RefusedError, NotFoundError) as exc:
                if not _task_runs(request):
                    log.info("Task %s is no longer running; rsync daemon stops", request.task)
                    return 0
                log.error("Upload failed: %s", exc)
                return 1
            except TrainyardError as exc:
                log.error("Upload failed: %s", exc)
                return 1
            uploaded, uploaded_at = seen, time.monotonic()
            log.info("Uploaded %s (%d entries)", request.local, len(seen))
        elif time.monotonic() >= next_check:
            if not _task_runs(request):
                log.info("Task %s is no longer running; rsync daemon stops", request.task)
                return 0
            next_check = time.monotonic() + ALIVE_CHECK_S
        stop_now.wait(poll_interval_s)
    log.info("Stopped")
    return 0


def _wait_started(request: RsyncRequest, stop_now: threading.Event, poll_interval_s: float) -> bool:
    """Wait until the task runs (a daemon started by ``workflow submit --rsync`` starts
    before its task); False when the workflow ended first or the daemon was stopped."""
    from trainyard.cli.client import Client

    while not stop_now.is_set():
        if _task_runs(request):
            return True
        query: WorkflowAnswer = Client().json("GET", f"/api/workflow/{request.workflow_id}")
        status = query["status"]
        if status.startswith(("COMPLETED", "FAILED")):
            return False
        stop_now.wait(poll_interval_s)
    return False


def _task_runs(request: RsyncRequest) -> bool:
    """Whether the server still lets the task be entered (it runs)."""
    assert request.task is not None
    try:
        task_entry(request.workflow_id, request.task, None)
        return True
    except (RefusedError, NotFoundError):
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.cli.rsync_daemon REQUEST_JSON POLL_INTERVAL_S [TUNING_JSON]
    [--verbose]`` (what ``start`` runs): write the pid file, run, remove the pid file.
    ``--verbose`` (OSMO's): debug lines too; the log rotates past ``Tuning.max_log_bytes``."""
    from logging.handlers import RotatingFileHandler

    args = sys.argv[1:] if argv is None else argv
    request = RsyncRequest(**json.loads(args[0]))
    assert request.task is not None
    extra = [a for a in args[2:] if a != "--verbose"]
    tuning = Tuning(**json.loads(extra[0])) if extra else Tuning()
    level = logging.DEBUG if "--verbose" in args[2:] else logging.INFO
    handler = RotatingFileHandler(
        log_path(request.workflow_id, request.task), maxBytes=tuning.max_log_bytes, backupCount=1
    )
    logging.basicConfig(
        level=level, format="%(asctime)s - %(process)d - %(message)s", handlers=[handler]
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    logging.getLogger("httpcore").setLevel(logging.WARNING)  # nor its wire steps (--verbose)
    pid_file = log_path(request.workflow_id, request.task).with_suffix(".pid")
    from trainyard.linux.proctree import create_time

    pid_file.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "created": create_time(os.getpid()) or 0.0,
                "workflow_id": request.workflow_id,
                "task": request.task,
                "local": request.local,
                "destination": request.destination(),
            }
        )
    )
    try:
        return run(request, float(args[1]), tuning)
    finally:
        pid_file.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
