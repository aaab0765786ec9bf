"""``linux.thread_ids.as_ids``: one thread starts a program as another uid while the
process's other threads stay root, and the thread is root again after (the launcher starts
each task's bwrap so, from a runner thread among many)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from trainyard.linux import thread_ids

pytestmark = pytest.mark.skipif(
    not thread_ids.available(), reason="switching a thread's ids needs root on x86-64 or arm64"
)


def test_a_program_started_in_the_block_runs_as_the_uid_while_other_threads_stay_root(
    tmp_path: Path,
) -> None:
    seen: dict[str, object] = {}
    inside = threading.Event()
    looked = threading.Event()

    def body() -> None:
        with thread_ids.as_ids(65534, 65533):
            seen["in_block"] = (os.getresuid(), os.getresgid(), os.getgroups())
            seen["out"] = subprocess.run(
                ["sh", "-c", "id -u; id -g; id -G; grep -E '^Cap(Prm|Eff):' /proc/self/status"],
                capture_output=True,
                text=True,
                cwd="/",
                check=True,
            ).stdout.split()
            inside.set()
            looked.wait(10)
        seen["after"] = (os.getresuid(), os.getresgid(), os.getgroups())
        os.chown(tmp_path / "f", 1234, 1234)  # still privileged

    (tmp_path / "f").write_text("x")
    groups = os.getgroups()
    thread = threading.Thread(target=body)
    thread.start()
    assert inside.wait(10)
    main_ids = (os.getresuid(), os.getresgid())  # the main thread, while the other is 65534
    looked.set()
    thread.join(10)
    assert main_ids == ((0, 0, 0), (0, 0, 0))
    assert seen["in_block"] == ((65534, 65534, 0), (65533, 65533, 0), [])
    assert seen["out"] == [
        "65534",
        "65533",
        "65533",
        "CapPrm:",
        "0000000000000000",
        "CapEff:",
        "0000000000000000",
    ]
    assert seen["after"] == ((0, 0, 0), (0, 0, 0), groups)
    assert (tmp_path / "f").stat().st_uid == 1234


def test_the_ids_come_back_when_the_block_raises() -> None:
    result: dict[str, object] = {}

    def body() -> None:
        try:
            with thread_ids.as_ids(65534, 65534):
                subprocess.Popen(["/nonexistent/program"])
        except OSError as exc:
            result["error"] = exc.errno
        result["after"] = os.getresuid()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)
    assert result == {"error": 2, "after": (0, 0, 0)}
