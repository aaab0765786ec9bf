"""Issue 12 H3: ``$TRAINYARD_HOME`` on a 6 MiB tmpfs and a task printing 20 MB. The runner's
log pump used to die with ENOSPC and the task stayed RUNNING forever; now the task ends FAILED
with exit code 2022 and its log says why, in seconds. A real tmpfs, a real server started by
the CLI in that home, a real sandboxed task."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_e2e_support import processes_of, run_cli, wait_gone

SPAM = r"""
workflow:
  name: spam
  tasks:
  - name: printer
    command: [sh, -c]
    args: ["head -c 20000000 /dev/zero | tr '\\0' x | fold -w 100; echo done"]
"""


def _unmount(folder: Path) -> None:
    for _ in range(20):
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    subprocess.run(["umount", "-l", str(folder)], check=True)  # busy: detach it at least


@pytest.fixture()
def small_home(tmp_path: Path) -> Iterator[Path]:
    """A trainyard home on a fresh 6 MiB tmpfs; its server is stopped and the tmpfs
    unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 6 MiB tmpfs needs root")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    home = mount_point / "home"
    home.mkdir()
    try:
        yield home
    finally:
        run_cli(home, "server", "stop", timeout_s=60)
        for proc in wait_gone(processes_of(home), timeout_s=45):
            proc.kill()
        _unmount(mount_point)


def test_a_full_disk_ends_the_task_with_2022_and_says_why(small_home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spam.yaml"
    spec.write_text(textwrap.dedent(SPAM).lstrip())
    started = time.monotonic()
    got = run_cli(
        small_home, "workflow", "submit", str(spec), "--wait", "-t", "json", timeout_s=240
    )
    assert got.code == 1, got.err  # --wait: the workflow did not complete
    final = json.loads(got.out)
    (task,) = [t for g in final["groups"] for t in g["tasks"]]
    assert (final["status"], task["status"], task["exit_code"]) == ("FAILED", "FAILED", 2022)
    assert time.monotonic() - started < 120
    last = run_cli(small_home, "workflow", "logs", final["id"], "-n", "2")
    assert last.code == 0, last.err
    why, code = last.out.splitlines()
    assert "[printer][trainyard] cannot write the task log " in why
    assert "No space left on device; the command was stopped" in why
    assert code.endswith("[printer][trainyard] exit code 2022")
    rows = [
        json.loads(line)
        for line in run_cli(
            small_home, "workflow", "logs", final["id"], "--format-type", "json"
        ).out.splitlines()
    ]
    assert all(r["time"] is not None for r in rows), [r for r in rows if r["time"] is None][
        :3
    ]  # a line torn by the full disk was ended
