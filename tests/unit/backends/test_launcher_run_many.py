"""The launcher's ``run_many``: several starts in one request (issue 11, throughput), each
answered on its own (one bad start fails alone), each recorded in its ``launch_json`` before
the reply (an engine killed while waiting for the reply still finds what was started)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainyard.backends.local import launcher as launcher_mod
from trainyard.backends.local.messages import LauncherRequest, parse_request


def run(tmp_path: Path, name: str, launch_json: str | None = None) -> dict[str, object]:
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=True)
    (run_dir / "run.json").write_text("{not json")  # the thread ends at once, reporting it
    return {
        "run_json": str(run_dir / "run.json"),
        "out": str(run_dir / "runner.out"),
        "cwd": str(run_dir),
        "group": None,
        "mode": "thread",
        "network": None,
        "launch_json": launch_json or str(run_dir / "launch.json"),
        "launch": {"group": name, "hosted_by": "me", "gpus": []},
    }


def parsed(message: dict[str, object]) -> LauncherRequest:
    """The request as the launcher reads it off its socket."""
    return parse_request(json.dumps(message))


def test_each_start_is_answered_and_recorded_on_its_own(tmp_path: Path) -> None:
    launcher = launcher_mod._Launcher("test-run-many", idle_s=1, group_grace_s=1)
    try:
        twice = run(tmp_path, "a", launch_json=str(tmp_path / "a-again.json"))
        reply = launcher._handle(
            parsed(
                {
                    "op": "run_many",
                    "env": {"FROM": "batch"},
                    "runs": [run(tmp_path, "a"), twice, run(tmp_path, "b")],
                }
            )
        )
        first, again, second = reply["results"]
        assert first["pid"] == os.getpid() and first["recorded"] is True
        assert "already runs" in again["error"] and not (tmp_path / "a-again.json").exists()
        assert second["pid"] == os.getpid() and second["recorded"] is True
        record = json.loads((tmp_path / "b" / "launch.json").read_text())
        assert record == {
            "group": "b",
            "hosted_by": "me",
            "gpus": [],
            "pid": os.getpid(),
            "created": second["created"],
        }
        assert (tmp_path / "b" / "launch.json").stat().st_mode & 0o777 == 0o600
        assert launcher.hosted[str(tmp_path / "a")].env == {"FROM": "batch"}
        launcher._start_hosted()
        for hosted in list(launcher.hosted.values()):
            hosted.join(30)
    finally:
        launcher.close()


def test_a_start_that_cannot_be_recorded_says_so(tmp_path: Path) -> None:
    launcher = launcher_mod._Launcher("test-run-many-unrecorded", idle_s=1, group_grace_s=1)
    try:
        missing = str(tmp_path / "no such folder" / "launch.json")
        reply = launcher._handle(
            parsed({"op": "run_many", "env": {}, "runs": [run(tmp_path, "c", launch_json=missing)]})
        )
        assert reply["results"][0]["recorded"] is False  # the backend writes it itself
        launcher._start_hosted()
        launcher.hosted[str(tmp_path / "c")].join(30)
    finally:
        launcher.close()
