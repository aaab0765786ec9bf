"""``linux.nsgate``: the launcher's helper that forbids nested user namespaces in a task's
user namespace without an ``exec`` per task (issue 11, throughput), with a real user
namespace (``unshare -U -r``: root mapped, as bwrap maps it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from trainyard.linux import nsgate

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="joining a user namespace needs root"),
    pytest.mark.skipif(
        not (shutil.which("unshare") and shutil.which("nsenter")),
        reason="util-linux unshare and nsenter are not installed",
    ),
]


@pytest.fixture(autouse=True)
def _no_gate_left() -> object:
    """Each test's gate ends with it: a gate started in the test process would otherwise live
    as long as pytest, with its environment (a session fixture's ``TRAINYARD_HOME``), and be
    counted as that session's leftover process."""
    yield
    sock, proc = nsgate._state.get("sock"), nsgate._state.get("proc")
    nsgate._state.clear()
    if sock is not None:
        sock.close()  # the gate reads its end and exits
    if isinstance(proc, subprocess.Popen):
        proc.wait(timeout=10)


def _in_new_userns() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["unshare", "-U", "-r", "sleep", "30"])
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{proc.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
        assert time.monotonic() < deadline, "unshare -U did not make a user namespace"
        time.sleep(0.01)
    return proc


def _limit(pid: int) -> str:
    done = subprocess.run(
        [
            "nsenter",
            f"--user=/proc/{pid}/ns/user",
            "--",
            "cat",
            "/proc/sys/user/max_user_namespaces",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_gate_sets_the_task_namespace_limit_to_zero() -> None:
    assert nsgate.start() is None and nsgate.running()
    proc = _in_new_userns()
    try:
        assert _limit(proc.pid) != "0"
        assert nsgate.forbid_nested(proc.pid) is True
        assert _limit(proc.pid) == "0"
        assert open("/proc/sys/user/max_user_namespaces").read().strip() != "0"  # the host's
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_that_is_gone_is_an_error_not_a_silent_success() -> None:
    assert nsgate.start() is None
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(OSError):
        nsgate.forbid_nested(proc.pid)
    assert nsgate.running()  # the gate itself goes on


def test_a_forked_child_has_no_gate(tmp_path) -> None:
    assert nsgate.start() is None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if nsgate.forbid_nested(os.getpid()) is False else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_child_forked_while_another_thread_asks_the_gate_does_not_hang() -> None:
    """The launcher forks spare runners while hosted runner threads ask the gate: a child
    forked while the gate's lock was held must not wait for it (it hung before the command,
    the task RUNNING until its exec timeout)."""
    assert nsgate.start() is None
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with nsgate._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: a deadlock is killed by the alarm
            signal.alarm(5)
            os._exit(0 if nsgate.forbid_nested(os.getpid()) is False else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0  # -SIGALRM when it waited for the lock


def test_the_gate_ends_with_its_launcher_while_a_forked_child_lives() -> None:
    """A forked runner must not keep the gate's socket open: the gate exits when the process
    that started it ends, not when its last forked runner does."""
    code = (
        "import os, sys, time\n"
        "from trainyard.linux import nsgate\n"
        "assert nsgate.start() is None\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os.close(1); time.sleep(30); os._exit(0)\n"
        "print(nsgate._state['proc'].pid, child, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=30,
        check=True,
    )
    gate_pid, child_pid = (int(pid) for pid in done.stdout.split())
    gate = psutil.Process(gate_pid)
    try:
        gate.wait(timeout=10)
    except psutil.TimeoutExpired:
        gate.kill()
        raise AssertionError("the gate outlived the process that started it") from None
    finally:
        os.kill(child_pid, signal.SIGKILL)
