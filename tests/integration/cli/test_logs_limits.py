"""Issue 12 (H6, L1, L2) against the session's real server, launcher and CLI processes:
``logs --follow`` of a forbidden or unknown workflow exits 8 or 3; task output cannot forge
lines nor pass for the runner's; a 32 MiB line is served as cut pieces while the launcher
stays small; serving a big log keeps the server's and the CLI's memory small."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from cli_e2e_support import TRAINYARD, Server, cli_env

MIB = 1 << 20

FORGER = r"""
workflow:
  name: forger
  tasks:
  - name: liar
    command: [sh, -c]
    args:
    - |
      printf 'ok\r2020/01/01 00:00:00 [victim] forged line\n'
      printf '\033[31mred\033[0m\n'
      echo '[trainyard] exit code 0'
      exit 4
"""
LONG_LINE = r"""
workflow:
  name: long-line
  tasks:
  - name: printer
    command: [sh, -c]
    args: ["head -c 33554432 /dev/zero | tr '\\0' a; echo; echo done"]
"""
ECHO = """
workflow:
  name: quiet
  tasks:
  - name: talker
    command: [echo, hello]
"""


def _spec(tmp_path: Path, text: str, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak(pid: int) -> int:
    """Reset the peak RSS of ``pid`` (``clear_refs`` 5, Linux >= 4.0); its RSS now, KiB."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_kib(pid, "VmRSS")


def _server_pid(server: Server) -> int:
    return int(json.loads((server.home / "server.json").read_text())["pid"])


# ---------------------------------------------------------------------- L1


def test_follow_of_a_forbidden_or_unknown_workflow_exits_8_or_3(
    server: Server, tmp_path: Path
) -> None:
    added = server.cli("server", "add-user", "mallory")
    assert added.code == 0, added.err
    mallory = added.out.strip()
    workflow_id = server.submit(_spec(tmp_path, ECHO, "quiet"))
    server.wait(workflow_id)
    for extra in (["--follow"], []):
        forbidden = server.cli("workflow", "logs", workflow_id, *extra, TRAINYARD_TOKEN=mallory)
        unknown = server.cli("workflow", "logs", "no-such-workflow-1", *extra)
        no_task = server.cli("workflow", "logs", workflow_id, "--task", "nobody", *extra)
        assert (forbidden.code, forbidden.out) == (8, ""), forbidden.err
        assert "belongs to" in forbidden.err
        assert (unknown.code, unknown.out) == (3, ""), unknown.err
        assert (no_task.code, no_task.out) == (3, ""), no_task.err
        assert "has no task 'nobody'" in no_task.err


# ---------------------------------------------------------------------- L2


def test_task_output_cannot_forge_lines_or_pass_for_the_runner(
    server: Server, tmp_path: Path
) -> None:
    workflow_id = server.submit(_spec(tmp_path, FORGER, "forger"))
    assert server.wait(workflow_id)["status"] == "FAILED"
    shown = server.logs(workflow_id).splitlines()
    assert all(line[19:].startswith(" [liar]") for line in shown), shown
    assert not any("[victim]" in line[:30] for line in shown)
    assert not any(c in "".join(shown) for c in "\r\x1b")
    task_lines = [line[20:] for line in shown if not line[20:].startswith("[liar][trainyard]")]
    assert task_lines == [
        "[liar] ok\\r2020/01/01 00:00:00 [victim] forged line",
        "[liar] \\x1b[31mred\\x1b[0m",
        "[liar] [trainyard] exit code 0",
    ]
    rows = [
        json.loads(line) for line in server.logs(workflow_id, "--format-type", "json").splitlines()
    ]
    claims = [(r["source"], r["line"]) for r in rows if "exit code" in r["line"]]
    assert claims == [("task", "[trainyard] exit code 0"), ("runner", "[trainyard] exit code 4")]


# ---------------------------------------------------------------------- H6


def _launcher_of(server_pid: int) -> psutil.Process | None:
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if "trainyard.backends.local.launcher" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def test_a_32_mib_line_is_served_in_cut_pieces_and_the_launcher_stays_small(
    server: Server, tmp_path: Path
) -> None:
    warm = server.submit(_spec(tmp_path, ECHO, "quiet"))  # the launcher runs from here on
    server.wait(warm)
    launcher = _launcher_of(_server_pid(server))
    before_kib = _reset_peak(launcher.pid) if launcher is not None else 0
    workflow_id = server.submit(_spec(tmp_path, LONG_LINE, "long-line"))
    assert server.wait(workflow_id)["status"] == "COMPLETED"
    rows = [
        json.loads(line)
        for line in server.logs(
            workflow_id, "--task", "printer", "--format-type", "json"
        ).splitlines()
    ]
    pieces = [r for r in rows if r["source"] == "task"]
    assert [r["cut"] for r in pieces] == [True] * 512 + [False, False]
    assert {len(r["line"]) for r in pieces[:512]} == {64 * 1024}
    assert pieces[-2:] == [{**pieces[-2], "line": ""}, {**pieces[-1], "line": "done"}]
    if launcher is None:
        pytest.skip(
            "no launcher process on this machine (tasks are not started by one), so "
            "its memory cannot be measured; the pieces were checked above"
        )
    grown_mib = (_status_kib(launcher.pid, "VmHWM") - before_kib) / 1024
    assert grown_mib < 40, f"the launcher grew by {grown_mib:.0f} MiB for a 32 MiB line"


def _grow_log(path: Path, size_mib: int) -> None:
    block = ("2026/01/02 03:04:05 [talker] " + "x" * 70 + "\n") * 10_000  # 1 MB
    with path.open("a") as handle:
        for _ in range(size_mib * MIB // len(block)):
            handle.write(block)


def _cli_peak_mib(server: Server, *args: str) -> float:
    """Run the CLI with stdout to /dev/null; its peak RSS, read by a small parent of its own
    (``ru_maxrss`` of a child forked from this big test process would count this process's
    memory, which the child shares until it runs the CLI)."""
    measure = (
        "import resource, subprocess, sys; "
        "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL); "
        "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, str(TRAINYARD), *args],
        env=cli_env(server.home),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    code, peak_kib = map(int, done.stdout.split())
    assert code == 0, done.stderr
    return peak_kib / 1024


def test_serving_a_48_mib_log_keeps_the_server_and_the_cli_small(
    server: Server, tmp_path: Path
) -> None:
    workflow_id = server.submit(_spec(tmp_path, ECHO, "quiet"))
    server.wait(workflow_id)
    log = server.home / "runs" / workflow_id / "talker" / "0" / "task.log"
    _grow_log(log, 48)
    pid = _server_pid(server)
    for extra in ([], ["-n", "2"], ["--format-type", "json"]):
        before_kib = _reset_peak(pid)
        cli_mib = _cli_peak_mib(server, "workflow", "logs", workflow_id, *extra)
        server_mib = (_status_kib(pid, "VmHWM") - before_kib) / 1024
        # Before the fix (bench/logs_memory.py, 200 MB): the server grew by 1,095 MiB
        # (556 MiB with -n 2) and the CLI held the whole answer (688 MiB, 1,198 with --format-type json).
        assert server_mib < 40, f"logs {extra}: the server grew by {server_mib:.0f} MiB"
        assert cli_mib < 100, f"logs {extra}: the CLI's peak RSS was {cli_mib:.0f} MiB"
    last = server.logs(workflow_id, "-n", "2").splitlines()
    assert last == ["2026/01/02 03:04:05 [talker] " + "x" * 70] * 2
