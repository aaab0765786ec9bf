"""The launcher starts a hosted runner's thread after its reply to the engine (issue 11,
throughput: ``Thread.start`` waits for the new thread to hold the GIL once, up to ~20 ms
while other runner threads run Python, and the engine starts tasks one after the other).
A thread that cannot start still ends visibly: its traceback in its ``out`` file, then
``runner.ended``, as for a runner that failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard.backends.local import launcher as launcher_mod
from trainyard.backends.local.messages import LauncherRequest, parse_request
from trainyard.runner.hosted import ENDED, HostedRunner


def request(tmp_path: Path) -> LauncherRequest:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{not json")  # the thread ends at once, reporting it
    return parse_request(
        json.dumps(
            {
                "op": "run",
                "run_json": str(run_dir / "run.json"),
                "out": str(run_dir / "runner.out"),
                "cwd": str(run_dir),
                "env": {},
                "group": None,
                "mode": "thread",
                "network": None,
            }
        )
    )


def test_the_thread_starts_after_the_reply(tmp_path: Path) -> None:
    launcher = launcher_mod._Launcher("test-start-after-reply", idle_s=1, group_grace_s=1)
    try:
        req = request(tmp_path)
        reply = launcher._handle(req)
        hosted = launcher.hosted[str(tmp_path / "run")]
        assert reply["pid"] and not hosted.is_alive() and launcher.to_start == [hosted]
        launcher._start_hosted()
        hosted.join(30)
        assert launcher.to_start == [] and (tmp_path / "run" / ENDED).exists()
        assert "Error" in (tmp_path / "run" / "runner.out").read_text()  # the bad run.json
    finally:
        launcher.close()


def test_a_thread_that_cannot_start_ends_visibly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: HostedRunner) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(HostedRunner, "start", refuse)
    launcher = launcher_mod._Launcher("test-start-refused", idle_s=1, group_grace_s=1)
    try:
        launcher._handle(request(tmp_path))
        launcher._start_hosted()
        assert launcher.hosted == {} and launcher.runners == {}
        assert (tmp_path / "run" / ENDED).exists()
        assert "can't start new thread" in (tmp_path / "run" / "runner.out").read_text()
    finally:
        launcher.close()
