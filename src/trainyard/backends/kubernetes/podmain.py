"""``python -m trainyard.backends.kubernetes.podmain RUN_JSON [TERMINATION_LOG]``: what a
pod's task container runs (the task's image, trainyard's runner copied in by the init
container).

It runs the task runner on ``RUN_JSON``, copying ``<run_dir>/task.log`` to its stdout as it
grows (``kubectl logs``), then writes the runner's EXITED event (one JSON line: kind, time_s,
exit_code, message; cut to the kubelet's 4096 bytes) to the termination message file (default
``/dev/termination-log``; Kubernetes docs, "Customizing the termination message"), where the
backend reads the exact exit code (service codes such as 2010 exceed 255). Exits with the
runner's code (at most 255).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import TextIO

from trainyard.runner.report import EVENTS, LOG, read_events

__all__ = ["main", "TERMINATION_LOG", "termination_message", "MESSAGE_LIMIT_BYTES", "copy_log"]

TERMINATION_LOG = "/dev/termination-log"
MESSAGE_LIMIT_BYTES = 4096
"""The kubelet reads at most this much of the termination message file."""


def termination_message(run_dir: Path, code: int) -> str:
    """The last EXITED event of ``run_dir/events.jsonl`` as one JSON line under
    ``MESSAGE_LIMIT_BYTES`` (its message cut from the front); an EXITED event with ``code``
    when the runner wrote none."""
    events, _ = read_events(run_dir / EVENTS, 0)
    last = next((e for e in reversed(events) if e.kind == "EXITED"), None)
    record = {
        "kind": "EXITED",
        "time_s": last.time_s if last else 0.0,
        "exit_code": last.exit_code if last and last.exit_code is not None else code,
        "message": last.message if last else "",
    }
    text = json.dumps(record)
    while len(text.encode()) > MESSAGE_LIMIT_BYTES and len(str(record["message"])) > 3:
        record["message"] = (
            "..." + str(record["message"])[len(text.encode()) - MESSAGE_LIMIT_BYTES + 3 :]
        )
        text = json.dumps(record)
    return text


def copy_log(path: Path, out: TextIO, done: threading.Event, interval_s: float = 0.2) -> None:
    """Copy ``path`` (the runner's ``task.log``, OSMO's log format) to ``out`` as it grows,
    until ``done`` is set and the file is read to its end: the container's log, which the
    API serves (``kubectl logs``, and the backend copies it into the server's run folder).
    A file not there yet is waited for."""
    offset = 0
    while True:
        finished = done.is_set()
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
        except OSError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            out.write(chunk.decode("utf-8", errors="replace"))
            out.flush()
        if finished:
            return
        done.wait(interval_s)


def main(argv: list[str] | None = None) -> int:
    """Run the attempt, write the termination message, return the runner's code."""
    from trainyard.runfile import load_run
    from trainyard.runner.main import main as run

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print(
            "usage: python -m trainyard.backends.kubernetes.podmain RUN_JSON [TERMINATION_LOG]",
            file=sys.stderr,
        )
        return 2
    run_dir = Path(load_run(Path(args[0])).run_dir)
    done = threading.Event()
    tee = threading.Thread(target=copy_log, args=(run_dir / LOG, sys.stdout, done), daemon=True)
    tee.start()
    code = run([args[0]])
    done.set()
    tee.join(timeout=10)
    target = Path(args[1] if len(args) == 2 else TERMINATION_LOG)
    try:
        target.write_text(termination_message(run_dir, code))
    except (OSError, ValueError) as exc:  # the container's exit code still tells
        print(f"trainyard: cannot write the termination message: {exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
