"""Process-tree helpers against real processes (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from trainyard.linux import proctree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def session_leader() -> subprocess.Popen[bytes]:
    """``sleep`` leading a session of its own, with a child in that session."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)  # the group at once: a child forked after a scan too
    proc.wait()


def _pids(procs: list[psutil.Process]) -> set[int]:
    return {p.pid for p in procs}


def test_leftovers_finds_the_recorded_leaders_session(session_leader) -> None:
    created = psutil.Process(session_leader.pid).create_time()
    deadline = time.monotonic() + 5  # the shell forks its child before it execs
    while len(proctree.session_members(session_leader.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    found = proctree.leftovers({session_leader.pid: created})
    assert session_leader.pid in _pids(found) and len(found) == 2


def test_a_session_whose_id_now_leads_another_process_is_left_alone(session_leader) -> None:
    """An ended runner's pid reused by a new session leader (the next task's runner): killing
    the old runner's leftovers must not touch the new session."""
    created = psutil.Process(session_leader.pid).create_time()
    assert proctree.leftovers({session_leader.pid: created - 100.0}) == []
