"""Issue 12 H1: exactly one engine per store, whatever the CLIs do at once.

Real processes only: CLIs started together, real servers, ``kill -9`` and ``SIGSTOP``. Each
test has its own home (with a space and a quote in its path)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli_e2e_support import TRAINYARD, cli_env, kill_described, processes_of, run_cli, wait_gone

ECHO = """workflow:
  name: echo-once
  tasks:
  - name: say
    image: busybox
    command: [sh, -c]
    args: ["echo said-once"]
"""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    made = tmp_path / "one engine's home"
    made.mkdir()
    yield made
    run_cli(made, "server", "stop")
    left = kill_described(wait_gone(processes_of(made), timeout_s=30))
    assert not left, f"processes outlived the test: {left}"


def servers_of(home: Path) -> list[psutil.Process]:
    """Live ``python -m trainyard.server`` processes of ``home``."""
    found = []
    for proc in processes_of(home):
        try:
            if "trainyard.server" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def lock_pid(home: Path) -> int:
    return int(json.loads((home / "server.lock").read_text())["pid"])


def test_five_submits_at_once_start_one_server_and_run_each_workflow_once(
    home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "echo.yaml"
    spec.write_text(ECHO)
    procs = [
        subprocess.Popen(
            [str(TRAINYARD), "workflow", "submit", str(spec), "--wait", "-t", "json"],
            env=cli_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for code, _out, err in results:
        assert code == 0, f"exit {code}: {err}\n{(home / 'server.log').read_text()}"
    finals = [json.loads(out) for _code, out, _err in results]
    assert sorted(f["id"] for f in finals) == [f"echo-once-{n}" for n in range(1, 6)]
    assert {f["status"] for f in finals} == {"COMPLETED"}
    assert len(servers_of(home)) == 1, [p.cmdline() for p in servers_of(home)]
    assert servers_of(home)[0].pid == lock_pid(home)
    assert not (home / "server.failed").exists()  # no second server even tried to start
    for final in finals:  # every task ran once: one attempt, one line of output
        task = final["groups"][0]["tasks"][0]
        assert (task["retry_id"], task["exit_code"]) == (0, 0)
        attempts = sorted(p.name for p in (home / "runs" / final["id"] / "say").iterdir())
        assert attempts == ["0"]
        log = run_cli(home, "workflow", "logs", final["id"])
        assert log.out.count("said-once") == 1, log.out


def test_the_cli_finds_the_server_by_its_lock_not_by_server_json(home: Path) -> None:
    first = run_cli(home, "workflow", "list", "-t", "json")
    assert first.code == 0, first.err
    pid = lock_pid(home)
    (home / "server.json").unlink()
    again = run_cli(home, "workflow", "list", "-t", "json")
    assert (again.code, again.out.strip()) == (0, "[]"), again.err
    assert [p.pid for p in servers_of(home)] == [pid]
    status = run_cli(home, "server", "status", "-t", "json")
    assert status.json()["pid"] == pid
    stopped = run_cli(home, "server", "stop")  # server.json is still gone
    assert (stopped.code, stopped.out.strip()) == (0, "trainyard server stopped"), stopped.err
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert servers_of(home) == []


def test_a_server_that_answers_slowly_is_waited_for_never_replaced(home: Path) -> None:
    assert run_cli(home, "server", "start").code == 0
    pid = lock_pid(home)
    os.kill(pid, signal.SIGSTOP)  # it answers nothing while stopped: slower than any timeout
    try:
        waiting = subprocess.Popen(
            [str(TRAINYARD), "workflow", "list", "-t", "json"],
            env=cli_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(6)  # the old CLI started a second server after 2 s
        assert waiting.poll() is None
        assert [p.pid for p in servers_of(home)] == [pid]
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = waiting.communicate(timeout=120)
    assert (waiting.returncode, out.strip()) == (0, "[]"), err
    assert [p.pid for p in servers_of(home)] == [pid]


def test_a_second_server_refuses_to_start_and_names_the_holder(home: Path) -> None:
    assert run_cli(home, "server", "start").code == 0
    pid = lock_pid(home)
    second = subprocess.run(
        [sys.executable, "-m", "trainyard.server"],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 4, second.stderr
    assert f"pid {pid}" in second.stderr and "trainyard server stop" in second.stderr
    assert [p.pid for p in servers_of(home)] == [pid]


def test_two_homes_on_one_sqlite_store_get_one_engine(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other home"
    other.mkdir()
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    try:
        first = run_cli(home, "workflow", "list", TRAINYARD_DATABASE_URL=url)
        assert first.code == 0, first.err
        pid = lock_pid(home)
        second = run_cli(other, "workflow", "list", TRAINYARD_DATABASE_URL=url)
        assert second.code == 4, second.err
        assert f"the store {tmp_path / 'shared.db'} is in use" in second.err
        assert f"pid {pid}" in second.err
        assert servers_of(other) == []
    finally:
        run_cli(other, "server", "stop")


def test_after_kill_9_the_next_cli_starts_one_new_server(home: Path) -> None:
    assert run_cli(home, "workflow", "list").code == 0
    old = psutil.Process(lock_pid(home))
    old.kill()
    assert not wait_gone([old], timeout_s=10)
    procs = [
        subprocess.Popen(
            [str(TRAINYARD), "workflow", "list", "-t", "json"],
            env=cli_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert (proc.returncode, out.strip()) == (0, "[]"), err
    new = servers_of(home)
    assert [p.pid for p in new] == [lock_pid(home)] and new[0].pid != old.pid
