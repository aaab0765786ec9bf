"""A runner hosted by a thread (``trainyard.runner.hosted``), in this process."""

from __future__ import annotations

import time
from pathlib import Path

from runner_support import MakeRun, event_kinds, log_text, write_run_json

from trainyard.runner.hosted import ENDED, HostedRunner, hostable


def test_runs_the_attempt_over_the_given_environment(make_run: MakeRun) -> None:
    run = make_run(script="echo got=$ONLY_IN_REQUEST")
    path = write_run_json(run)
    hosted = HostedRunner(
        path, path.parent / "runner.out", {"ONLY_IN_REQUEST": "yes", "PATH": "/usr/bin:/bin"}
    )
    hosted.start()
    hosted.join(30)
    assert not hosted.is_alive()
    assert event_kinds(run)[-1] == ("EXITED", 0)
    assert "[t1] got=yes" in log_text(run)
    assert (path.parent / ENDED).exists()


def test_a_stop_before_the_thread_runs_means_no_command(make_run: MakeRun) -> None:
    marker = Path(make_run().run_dir).parent / "ran"
    run = make_run(script=f"touch {marker}")
    path = write_run_json(run)
    hosted = HostedRunner(path, path.parent / "runner.out", {"PATH": "/usr/bin:/bin"})
    hosted.stop()
    hosted.start()
    hosted.join(30)
    assert event_kinds(run)[-1] == ("EXITED", 143)
    assert not marker.exists()


def test_a_stop_during_the_command_ends_it(make_run: MakeRun) -> None:
    run = make_run(script="echo up; sleep 60")
    path = write_run_json(run)
    hosted = HostedRunner(path, path.parent / "runner.out", {"PATH": "/usr/bin:/bin"})
    hosted.start()
    deadline = time.monotonic() + 20
    while "[t1] up" not in (log_text(run) if Path(run.run_dir, "task.log").exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    hosted.stop()
    hosted.join(30)
    assert time.monotonic() - started < 10
    assert event_kinds(run)[-1] == ("EXITED", 143)


def test_a_run_json_that_does_not_load_is_written_to_out(tmp_path: Path) -> None:
    path = tmp_path / "run" / "run.json"
    path.parent.mkdir()
    path.write_text("[]")
    hosted = HostedRunner(path, path.parent / "runner.out", {})
    hosted.start()
    hosted.join(30)
    assert "ValidationError" in (path.parent / "runner.out").read_text()
    assert (path.parent / ENDED).exists()


def test_only_sandboxed_tasks_without_data_are_hostable(make_run: MakeRun) -> None:
    mounted = {"mounts": {"/": "/tmp/x"}}
    assert hostable(make_run(sandbox=mounted))
    assert not hostable(make_run())  # no PID namespace: leftovers need a process of its own
    output = [{"url": "file:///tmp/out"}]
    assert not hostable(make_run(sandbox=mounted, outputs=output))
    checkpoint = [{"path": "/ckpt", "url": "file:///tmp/ck", "frequency_s": 5}]
    assert not hostable(make_run(sandbox=mounted, checkpoints=checkpoint))
