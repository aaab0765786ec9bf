"""Issue 25: OSMO's ``workflow cancel --force`` and ``workflow exec --keep-alive`` do what
OSMO's CLI says, through ``osmo`` against the real server and real tasks.

- ``cancel --force`` ("Force cancel task group pods in the cluster"): no grace period, the
  tasks' processes get SIGKILL with no SIGTERM first: a runner in the launcher (hosted) says
  so, a runner process of its own (a task with an output) is killed with its command before
  it can say anything, and a task that traps SIGTERM never runs its trap. A plain cancel
  sends SIGTERM first, and each runner says so.
- ``exec --keep-alive`` ("resume the shell if connection is lost"): a session that is killed
  (not ended by its command) is entered again, saying "Reconnecting to the exec session...";
  without the flag the CLI ends with the lost session.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from cli_e2e_support import BIN, Server, cli_env

TRAPPER = """
workflow:
  name: {name}
  groups:
  - name: g
    tasks:
    - name: hosted
      lead: true
      command: [sh, -c]
      args: ["trap 'echo got-TERM; exit 0' TERM; echo up; while :; do sleep 0.1; done"]
    - name: forked
      command: [sh, -c]
      args: ["trap 'echo got-TERM; exit 0' TERM; echo up; while :; do sleep 0.1; done"]
      outputs:  # a task with data to move runs in a runner process of its own
      - dataset:
          name: {name}-out
"""


def _osmo(server: Server, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "osmo"), *args],
        env=cli_env(server.home),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _log(server: Server, workflow_id: str, task: str) -> str:
    """The task's log file (``workflow logs`` of a running task follows it)."""
    path = server.home / "runs" / workflow_id / task / "0" / "task.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _up(server: Server, workflow_id: str, tasks: tuple[str, ...]) -> None:
    """Wait until each task has printed ``up`` (its trap is set)."""
    deadline = time.monotonic() + 120
    for task in tasks:
        while "] up\n" not in _log(server, workflow_id, task):
            assert time.monotonic() < deadline, f"{workflow_id}/{task} never said up"
            time.sleep(0.3)


def _cancelled_logs(server: Server, tmp_path: Path, name: str, *flags: str) -> dict[str, str]:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(TRAPPER.format(name=name))
    workflow_id = server.submit(spec)
    _up(server, workflow_id, ("hosted", "forked"))
    done = _osmo(server, "workflow", "cancel", workflow_id, *flags)
    assert done.returncode == 0, done.stderr
    assert server.wait(workflow_id, timeout_s=120)["status"] == "FAILED_CANCELED"
    return {task: _log(server, workflow_id, task) for task in ("hosted", "forked")}


def test_a_plain_cancel_sends_sigterm_first(server: Server, tmp_path: Path) -> None:
    """The control: each runner gets (or passes on) SIGTERM and says so. (Whether the
    command's trap then runs before its sandbox ends is a race of the sandbox's own.)"""
    logs = _cancelled_logs(server, tmp_path, "trap-plain")
    assert all("stopped by SIGTERM" in text for text in logs.values()), logs


def test_cancel_force_kills_with_no_sigterm_first(server: Server, tmp_path: Path) -> None:
    logs = _cancelled_logs(server, tmp_path, "trap-force", "--force")
    assert not any("got-TERM" in text for text in logs.values()), logs
    assert "stopped by SIGKILL (a forced cancel" in logs["hosted"], logs["hosted"]
    assert "SIGTERM" not in logs["forked"], logs["forked"]  # its runner was SIGKILLed too


SLEEPER = """
workflow:
  name: keep-alive
  tasks:
  - name: t
    command: [sh, -c]
    args: ["echo up; exec sleep 600"]
"""

LOSES_ITS_FIRST_SESSION = (
    "if [ -e /tmp/{mark} ]; then echo second-session; exit 0; fi; "
    "touch /tmp/{mark}; echo first-session; kill -9 $$"
)


def test_exec_keep_alive_enters_again_after_a_lost_session(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "sleeper.yaml"
    spec.write_text(SLEEPER)
    workflow_id = server.submit(spec)
    server.wait_task(workflow_id, "t", "RUNNING", timeout_s=120)
    try:
        once = _osmo(
            server,
            "workflow",
            "exec",
            workflow_id,
            "t",
            "--entry",
            f"sh -c '{LOSES_ITS_FIRST_SESSION.format(mark='a')}'",
        )
        assert "first-session" in once.stdout and once.returncode != 0, once
        assert "second-session" not in once.stdout and "Reconnecting" not in once.stderr
        kept = _osmo(
            server,
            "workflow",
            "exec",
            workflow_id,
            "t",
            "--keep-alive",
            "--entry",
            f"sh -c '{LOSES_ITS_FIRST_SESSION.format(mark='b')}'",
        )
        assert kept.returncode == 0, kept
        assert kept.stdout.split() == ["first-session", "second-session"], kept
        assert "Reconnecting to the exec session..." in kept.stderr
        ended = _osmo(
            server,
            "workflow",
            "exec",
            workflow_id,
            "t",
            "--keep-alive",
            "--entry",
            "sh -c 'exit 3'",
        )
        assert ended.returncode == 3 and "Reconnecting" not in ended.stderr  # its own exit
    finally:
        server.main("workflow", "cancel", workflow_id)
