"""``runner.nsgate``: the launcher's helper that forbids nested user namespaces in a task's
user namespace without an ``exec`` per task (issue 11, throughput), with a real user
namespace (``unshare -U -r``: root mapped, as bwrap maps it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from trainyard.runner import nsgate

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="joining a user namespace needs root"),
    pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("nsenter")),
                       reason="util-linux unshare and nsenter are not installed"),
]


def _in_new_userns() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["unshare", "-U", "-r", "sleep", "30"])
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{proc.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
        assert time.monotonic() < deadline, "unshare -U did not make a user namespace"
        time.sleep(0.01)
    return proc


def _limit(pid: int) -> str:
    done = subprocess.run(["nsenter", f"--user=/proc/{pid}/ns/user", "--", "cat",
                           "/proc/sys/user/max_user_namespaces"], capture_output=True, text=True,
                          check=True)
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
