"""``backends.local.enter``: finding a task's sandbox init refuses clearly when there is none; the
entering program checks its arguments (the entering itself is tested with real sandboxes in
tests/integration/cli/test_interactive_verbs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from trainyard.backends.local.enter import enter_argv, find_sandbox_init, main
from trainyard.errors import RefusedError


def test_a_runner_that_is_gone_or_reused_means_the_task_ended(tmp_path: Path) -> None:
    me = psutil.Process()
    with pytest.raises(RefusedError, match="runner is gone"):
        find_sandbox_init(me.pid, me.create_time() - 100, tmp_path)  # a reused pid


def test_a_runner_without_a_bwrap_child_has_no_sandbox(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = psutil.Process()
        with pytest.raises(RefusedError, match="no bubblewrap sandbox"):
            find_sandbox_init(me.pid, me.create_time(), tmp_path)
    finally:
        child.kill()
        child.wait()


def test_the_entering_program_wants_pid_created_and_a_command() -> None:
    assert main(["1", "2.0"]) == 2
    assert main(["1", "2.0", "--", "true"][:3]) == 2
    assert enter_argv(12, 3.5, ["ls", "-l"], tty=True, python="py") == [
        "py",
        "-m",
        "trainyard.backends.local.enter",
        "12",
        "3.5",
        "--tty",
        "--",
        "ls",
        "-l",
    ]


def test_a_process_that_is_not_the_recorded_one_is_not_entered() -> None:
    me = psutil.Process()
    code = main([str(os.getpid()), repr(me.create_time() - 50), "--", "true"])
    assert code == 125
