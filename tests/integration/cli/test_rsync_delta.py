"""``workflow rsync`` through real rsync over the task's exec (as ``kubectl exec`` is used with
``rsync --rsh``) where rsync is installed here and in the task: a second upload after a
one-byte change moves a delta, not the tree; ``TRAINYARD_RSYNC=`` (empty) or no rsync in the
task keeps the tar copy. Real CLI, real server, a real task in the bubblewrap sandbox.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_e2e_support import Server
from rsync_stats import later_mtime, literal_bytes

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")

ONE = """
workflow:
  name: rsync-delta
  tasks:
  - name: t
    command: [sleep, "600"]
"""
SIZE = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def task(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spec = tmp_path_factory.mktemp("rsync-delta") / "spec.yaml"
    spec.write_text(ONE)
    workflow_id = server.submit(spec)
    server.wait_task(workflow_id, "t", "RUNNING", timeout_s=120)
    yield workflow_id
    server.main("workflow", "cancel", workflow_id)


def _in_task(server: Server, workflow_id: str, script: str) -> str:
    done = server.cli("workflow", "exec", workflow_id, "t", "--", "sh", "-c", script)
    assert done.code == 0, done.err
    return done.out


def test_a_second_upload_after_a_one_byte_change_moves_only_a_delta(
    server: Server, task: str, tmp_path: Path
) -> None:
    src = tmp_path / "code"
    src.mkdir()
    data = bytearray(os.urandom(SIZE))
    (src / "weights.bin").write_bytes(data)
    first = server.cli("workflow", "rsync", task, f"{src}:/osmo/run/workspace", "--verbose")
    assert first.code == 0, first.err
    assert literal_bytes(first.err) >= SIZE  # all of it, the first time
    data[SIZE // 2] ^= 0xFF
    (src / "weights.bin").write_bytes(data)
    later_mtime(src / "weights.bin")  # rsync's quick check: same size and second = unchanged
    second = server.cli("workflow", "rsync", task, f"{src}:/osmo/run/workspace", "--verbose")
    assert second.code == 0, second.err
    assert literal_bytes(second.err) < SIZE // 50  # a block or two, not 4 MiB
    digest = _in_task(server, task, "sha256sum /osmo/run/workspace/code/weights.bin")
    import hashlib

    assert digest.split()[0] == hashlib.sha256(data).hexdigest()


def test_without_rsync_here_the_tar_copy_is_used(server: Server, task: str, tmp_path: Path) -> None:
    src = tmp_path / "tarred"
    src.mkdir()
    (src / "a.txt").write_text("by tar\n")
    done = server.cli(
        "workflow", "rsync", task, f"{src}:/osmo/run/workspace", "--verbose", TRAINYARD_RSYNC=""
    )
    assert done.code == 0, done.err
    assert "Literal data" not in done.err and "through tar" in done.err
    assert _in_task(server, task, "cat /osmo/run/workspace/tarred/a.txt") == "by tar\n"


def test_without_rsync_in_the_task_the_tar_copy_is_used(
    server: Server, task: str, tmp_path: Path
) -> None:
    """``TRAINYARD_RSYNC_PATH`` (rsync's ``--rsync-path``: the program in the task) names none."""
    src = tmp_path / "notask"
    src.mkdir()
    (src / "b.txt").write_text("still copied\n")
    done = server.cli(
        "workflow",
        "rsync",
        task,
        f"{src}:/osmo/run/workspace",
        "--verbose",
        TRAINYARD_RSYNC_PATH="/nonexistent/rsync",
    )
    assert done.code == 0, done.err
    assert "through tar" in done.err
    assert _in_task(server, task, "cat /osmo/run/workspace/notask/b.txt") == "still copied\n"


def test_a_task_path_with_dots_or_options_never_reaches_rsync(
    server: Server, task: str, tmp_path: Path
) -> None:
    """The task's side is named by the user and checked: no '..'; a path that looks like an
    option is a path (rsync's ``--protect-args``: the name is not split or read as one)."""
    src = tmp_path / "opt"
    src.mkdir()
    (src / "c.txt").write_text("c\n")
    dots = server.cli("workflow", "rsync", task, f"{src}:/osmo/run/../../etc")
    assert dots.code == 2 and "without '..'" in dots.err
    odd = server.cli("workflow", "rsync", task, f"{src}/:/osmo/run/workspace/-e sh x")
    assert odd.code == 0, odd.err
    assert _in_task(server, task, "cat '/osmo/run/workspace/-e sh x/c.txt'") == "c\n"
