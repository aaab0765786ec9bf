"""Helpers for runner tests: a TaskRun with a private root under tmp_path."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainyard.data.runnerhook import FsspecData
from trainyard.runfile import TaskRun
from trainyard.runner.main import Runner
from trainyard.runner.report import read_events

MakeRun = Callable[..., TaskRun]


@pytest.fixture
def make_run(tmp_path: Path) -> MakeRun:
    """``make_run(script=..., **fields)``: a TaskRun whose ``/`` is ``tmp_path/root``."""

    def build(script: str | None = None, **fields: Any) -> TaskRun:
        run_dir = tmp_path / f"run-{fields.get('task', 't1')}"
        base: dict[str, Any] = {
            "workflow_id": "wf-7",
            "group": "g",
            "task": "t1",
            "command": ["sh", "/tmp/run.sh"],
            "run_dir": str(run_dir),
            "sandbox": {"root": str(run_dir / "root")},
        }
        if script is not None:
            base["files"] = [{"path": "/tmp/run.sh", "contents": script}]
        return TaskRun.model_validate({**base, **fields})

    return build


def execute(run: TaskRun) -> int:
    """Run an attempt in-process with the runner's own data hook; return its exit code."""
    return Runner(run, hook=FsspecData()).execute()


def event_kinds(run: TaskRun) -> list[tuple[str, int | None]]:
    events, _ = read_events(Path(run.run_dir) / "events.jsonl")
    return [(e.kind, e.exit_code) for e in events]


def log_text(run: TaskRun) -> str:
    return (Path(run.run_dir) / "task.log").read_text()


def write_run_json(run: TaskRun) -> Path:
    path = Path(run.run_dir) / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.model_dump(mode="json")))
    return path
