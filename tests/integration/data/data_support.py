"""Helpers for data tests: file trees, fast retries, and task runs with the real data hook."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainyard.data import storage
from trainyard.runfile import TaskRun
from trainyard.runner.main import Runner
from trainyard.runner.report import read_events


def fast_retries(monkeypatch: pytest.MonkeyPatch, attempts: int = 3) -> None:
    """Retries with a 0.01 s backoff so failure tests end quickly."""
    monkeypatch.setenv("TRAINYARD_DATA_RETRIES", str(attempts))
    monkeypatch.setenv("TRAINYARD_DATA_RETRY_BACKOFF_S", "0.01")


def make_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """Write ``files`` (relative path -> contents) under ``root``; returns ``root``."""
    for rel, contents in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(contents, bytes):
            path.write_bytes(contents)
        else:
            path.write_text(contents)
    root.mkdir(parents=True, exist_ok=True)
    return root


def tree(root: Path) -> dict[str, str]:
    """Relative path -> text of every file under ``root`` (``{}`` when it is missing)."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): p.read_text(errors="replace")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def make_run(tmp_path: Path, script: str, **fields: Any) -> TaskRun:
    """A TaskRun whose ``/`` is private under ``tmp_path`` and whose command runs ``script``."""
    run_dir = tmp_path / f"run-{fields.get('task', 't1')}"
    base: dict[str, Any] = {
        "workflow_id": "wf-data",
        "group": "g",
        "task": "t1",
        "command": ["sh", "/tmp/run.sh"],
        "run_dir": str(run_dir),
        "sandbox": {"root": str(run_dir / "root")},
        "files": [{"path": "/tmp/run.sh", "contents": script}],
    }
    return TaskRun.model_validate({**base, **fields})


def execute(run: TaskRun) -> int:
    """Run an attempt in-process with the data layer's hook; its exit code."""
    return Runner(run).execute()


def log_text(run: TaskRun) -> str:
    return (Path(run.run_dir) / "task.log").read_text()


def exit_event(run: TaskRun) -> tuple[int | None, str]:
    """(exit code, message) of the EXITED event."""
    events, _ = read_events(Path(run.run_dir) / "events.jsonl")
    last = [e for e in events if e.kind == "EXITED"][-1]
    return last.exit_code, last.message


def run_after_puts(monkeypatch: pytest.MonkeyPatch, files: int, action: Callable[[], Any]) -> None:
    """Run ``action`` once ``files`` files were put (a real failure, at a known point)."""
    real = storage.put_file
    done: list[str] = []
    lock = threading.Lock()

    def counting(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        with lock:
            done.append(str(args[2]))
            if len(done) == files:
                action()

    monkeypatch.setattr(storage, "put_file", counting)
