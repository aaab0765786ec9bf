"""Checkpoints: periodic, regex-filtered, atomic (a partial file never has the final name)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from runner_support import MakeRun, execute, log_text

from trainyard.data.runnerhook import FsspecData
from trainyard.runfile import RunCheckpoint
from trainyard.runner.checkpoint import Checkpointer

SIZE = 8 * 1024 * 1024


def test_readers_never_see_a_partial_checkpoint_file(tmp_path: Path) -> None:
    src, dest = tmp_path / "ckpt", tmp_path / "remote"
    src.mkdir()
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            target = dest / "model.pth"
            if target.exists():
                seen.append(target.stat().st_size)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_ in range(5):
            (src / "model.pth").write_bytes(bytes([round_]) * SIZE)
            assert FsspecData().sync(src, f"file://{dest}", None, {}) == 1
    finally:
        done.set()
        thread.join()
    assert seen and set(seen) == {SIZE}
    assert sorted(p.name for p in dest.iterdir()) == ["model.pth"]
    assert (dest / "model.pth").read_bytes() == bytes([4]) * SIZE


def test_sync_skips_unchanged_files(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.pth").write_text("1")
    state: dict[str, tuple[int, int]] = {}
    hook = FsspecData()
    assert hook.sync(src, str(tmp_path / "remote"), None, state) == 1
    assert hook.sync(src, str(tmp_path / "remote"), None, state) == 0
    (src / "a.pth").write_text("22")
    assert hook.sync(src, str(tmp_path / "remote"), None, state) == 1


def test_checkpointer_uploads_periodically_and_at_the_end(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    lines: list[str] = []
    spec = RunCheckpoint(
        path=str(src), url=f"file://{tmp_path / 'remote'}", frequency_s=0.1, regex=r".*\.pth$"
    )
    ckpt = Checkpointer(spec, src, FsspecData(), lines.append)
    ckpt.start()
    (src / "one.pth").write_text("1")
    (src / "skip.txt").write_text("x")
    deadline = time.monotonic() + 5
    while not (tmp_path / "remote" / "one.pth").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "remote" / "one.pth").exists(), "no periodic upload while running"
    (src / "two.pth").write_text("2")
    ckpt.finish()
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == ["one.pth", "two.pth"]
    assert ckpt.uploads >= 2


def test_runner_checkpoints_relative_path_while_command_runs(
    make_run: MakeRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = tmp_path / "remote"
    monkeypatch.setenv("REMOTE", str(remote))  # a host /tmp path in the script would be rewritten
    run = make_run(
        script="mkdir -p experiments/checkpoints\n"
        "echo 1 > experiments/checkpoints/a.pth\n"
        "i=0; while [ ! -f $REMOTE/a.pth ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done\n"
        "[ -f $REMOTE/a.pth ] && echo uploaded-while-running\n"
        "echo 2 > experiments/checkpoints/b.pth\n",
        checkpoints=[
            {
                "path": "experiments/checkpoints",
                "url": f"file://{remote}",
                "frequency_s": 0.1,
                "regex": r".*\.pth",
            }
        ],
    )
    assert execute(run) == 0
    assert "[t1] uploaded-while-running" in log_text(run)
    # .trainyard/ holds the data layer's checkpoint round manifest (trainyard.data.checkpoints)
    assert sorted(p.name for p in remote.iterdir() if p.name != ".trainyard") == ["a.pth", "b.pth"]
