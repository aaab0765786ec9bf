"""Issue 15: the runner's part of launch latency (barrier released promptly; stage marks)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from runner_support import MakeRun, execute

from trainyard.runfile import Barrier
from trainyard.runner.barrier import mark_ready, wait_for_group


def test_barrier_passes_soon_after_the_last_mark_not_a_whole_poll_interval_later(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "rdv"
    barrier = Barrier(
        enabled=True, folder=str(folder), tasks=["t1", "t2"], timeout_s=60, poll_interval_s=5.0
    )
    late = threading.Timer(0.2, mark_ready, (folder, "t2", 0))
    late.start()
    started = time.monotonic()
    assert wait_for_group(barrier, "t1", 0)
    waited_s = time.monotonic() - started
    late.join()
    assert 0.19 <= waited_s < 2.5, f"barrier passed {waited_s:.2f}s after start (poll 5 s)"


def test_barrier_still_times_out_and_stops(tmp_path: Path) -> None:
    barrier = Barrier(
        enabled=True,
        folder=str(tmp_path / "rdv"),
        tasks=["t1", "t2"],
        timeout_s=0.3,
        poll_interval_s=0.1,
    )
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert wait_for_group(barrier, "t1", 0, stop) is False


def _stages(run_dir: Path) -> list[str]:
    path = run_dir / "timings.jsonl"
    return [json.loads(line)["stage"] for line in path.read_text().splitlines()]


def test_stage_marks_barrier_start_command_exit_then_upload_end_after_success(
    make_run: MakeRun,
    tmp_path: Path,
) -> None:
    run = make_run(
        script="echo 1 > {{output}}/a.json\n", outputs=[{"url": f"file://{tmp_path / 'bucket'}/"}]
    )
    before = time.time()
    assert execute(run) == 0
    assert _stages(Path(run.run_dir)) == ["barrier_start", "command_exit", "upload_end"]
    times = [
        json.loads(line)["time_s"]
        for line in (Path(run.run_dir) / "timings.jsonl").read_text().splitlines()
    ]
    assert before <= times[0] <= times[1] <= times[2] <= time.time()


def test_no_upload_mark_after_a_failed_command(make_run: MakeRun, tmp_path: Path) -> None:
    run = make_run(script="exit 3\n", outputs=[{"url": f"file://{tmp_path / 'bucket'}/"}])
    assert execute(run) == 3
    assert _stages(Path(run.run_dir)) == ["barrier_start", "command_exit"]
