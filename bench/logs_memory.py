"""Peak memory of serving and writing big task logs (issue 12, H6), not a timed test.

In a fresh ``TRAINYARD_HOME`` (a real server that the CLI starts, stopped at the end):

1. launcher: a sandboxed task (hosted by the launcher as a thread) prints one line of
   ``--line-mb`` MB without a newline; reports the launcher's peak RSS while it runs
   (``VmHWM`` of ``/proc/PID/status``, sampled until the workflow ends).
2. server and CLI: the ``task.log`` of a finished one-task workflow is grown to ``--log-mb``
   MB of ordinary 100-byte lines; then ``workflow logs ID`` (also ``-n 2``, ``--format-type json`` and
   ``--follow``) is run with stdout to /dev/null. For each: the server's peak RSS above its
   RSS before the command (its peak is reset with ``/proc/PID/clear_refs`` = 5, Linux >= 4.0)
   and the CLI process's own peak RSS (``ru_maxrss`` of the waited child).

Usage:
    PYTHONPATH=src .venv/bin/python bench/logs_memory.py [--log-mb 200] [--line-mb 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

TRAINYARD = str(Path(sys.executable).parent / "trainyard")
MIB = 1 << 20

LONG_LINE = """
workflow:
  name: long-line
  tasks:
  - name: printer
    command: [sh, -c]
    args: ["head -c {size} /dev/zero | tr '\\\\0' a; echo; echo done"]
"""
ECHO = """
workflow:
  name: big-log
  tasks:
  - name: talker
    command: [echo, hello]
"""


def _cli(home: Path, *args: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env["TRAINYARD_HOME"] = str(home)
    return subprocess.run(
        [TRAINYARD, *args], env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, check=False
    )


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _submit(home: Path, text: str, folder: Path, name: str) -> str:
    spec = folder / f"{name}.yaml"
    spec.write_text(text)
    done = _cli(home, "workflow", "submit", str(spec), "-t", "json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


def _status(home: Path, workflow_id: str) -> str:
    done = _cli(home, "workflow", "query", workflow_id, "-t", "json")
    return str(json.loads(done.stdout)["status"])


def _server_pid(home: Path) -> int:
    return int(json.loads((home / "server.json").read_text())["pid"])


def _launcher(server_pid: int) -> psutil.Process | None:
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "trainyard.backends.local.launcher" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def launcher_peak(home: Path, folder: Path, line_mb: int) -> dict[str, Any]:
    """The launcher's peak RSS while a hosted task prints one ``line_mb`` MB line."""
    workflow_id = _submit(home, LONG_LINE.format(size=line_mb * MIB), folder, "long-line")
    peak_kib, before_kib, pid = 0, None, None
    while not _status(home, workflow_id).startswith(("COMPLETED", "FAILED")):
        launcher = _launcher(_server_pid(home))
        if launcher is not None:
            with_pid = launcher.pid
            try:
                if before_kib is None:
                    before_kib, pid = _status_kib(with_pid, "VmRSS"), with_pid
                peak_kib = max(peak_kib, _status_kib(with_pid, "VmHWM"))
            except (OSError, KeyError):
                pass
        time.sleep(0.2)
    return {
        "workflow": workflow_id,
        "status": _status(home, workflow_id),
        "launcher_pid": pid,
        "line_mb": line_mb,
        "launcher_rss_first_seen_mib": (before_kib or 0) / 1024,
        "launcher_peak_rss_mib": peak_kib / 1024,
    }


def _grow_log(path: Path, log_mb: int) -> None:
    line = "2026/01/02 03:04:05 [talker] " + "x" * 70 + "\n"  # 100 bytes
    block = line * 10_000
    with path.open("a") as handle:
        for _ in range(log_mb * MIB // len(block)):
            handle.write(block)


def _measured(home: Path, pid: int, args: list[str]) -> dict[str, Any]:
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before_kib = _status_kib(pid, "VmRSS")
    started = time.monotonic()
    child = subprocess.Popen(
        [TRAINYARD, *args],
        env={**os.environ, "TRAINYARD_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, _, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - started
    return {
        "command": "trainyard " + " ".join(args),
        "seconds": round(seconds, 2),
        "server_rss_before_mib": round(before_kib / 1024, 1),
        "server_peak_above_before_mib": round((_status_kib(pid, "VmHWM") - before_kib) / 1024, 1),
        "cli_peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def server_peaks(home: Path, folder: Path, log_mb: int) -> list[dict[str, Any]]:
    """The server's and CLI's peaks for ``workflow logs`` of a ``log_mb`` MB log."""
    workflow_id = _submit(home, ECHO, folder, "big-log")
    while not _status(home, workflow_id).startswith(("COMPLETED", "FAILED")):
        time.sleep(0.3)
    _grow_log(home / "runs" / workflow_id / "talker" / "0" / "task.log", log_mb)
    pid = _server_pid(home)
    base = ["workflow", "logs", workflow_id]
    return [
        _measured(home, pid, base + extra)
        for extra in ([], ["-n", "2"], ["--format-type", "json"], ["--follow"])
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-mb", type=int, default=200)
    parser.add_argument("--line-mb", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="trainyard-logs-bench-"))
    home = folder / "home"
    home.mkdir()
    try:
        results = {
            "launcher": launcher_peak(home, folder, args.line_mb),
            "server": server_peaks(home, folder, args.log_mb),
        }
    finally:
        _cli(home, "server", "stop")
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    launcher = results["launcher"]
    print(
        f"launcher: {launcher['line_mb']} MB line -> peak RSS "
        f"{launcher['launcher_peak_rss_mib']:.0f} MiB ({launcher['status']})"
    )
    for row in results["server"]:
        print(
            f"{row['command']}: server +{row['server_peak_above_before_mib']:.0f} MiB "
            f"(from {row['server_rss_before_mib']:.0f}), CLI {row['cli_peak_rss_mib']:.0f} MiB, "
            f"{row['seconds']} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
