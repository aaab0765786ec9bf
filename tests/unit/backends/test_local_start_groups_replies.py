"""How ``LocalBackend.start_groups`` reads the launcher's per-task replies (issue 11): a gang
with a task the launcher did not start fails, and its tasks that did start are stopped (all or
none); the other gangs of the same request are not touched. The launcher is a stub here (its
own side: tests/unit/backends/test_launcher_run_many.py); no sandbox is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.local import LocalBackend
from trainyard.backends.local.messages import RunSpec
from trainyard.errors import BackendError


class StubLauncher:
    """Starts nothing; refuses the runs whose run folder ends with ``refused``."""

    name = "stub"

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.requests: list[list[str]] = []

    def run_many(self, runs: list[RunSpec], env: dict[str, str]) -> list[Any]:
        self.requests.append([Path(r.cwd).parent.name for r in runs])
        return [
            BackendError("launcher: no")
            if Path(r.cwd).parent.name == self.refused
            else (4242, 1.5, True)
            for r in runs
        ]

    def release(self) -> None:
        pass


def launch(home: Path, group: str, task: str, tasks: list[str]) -> TaskLaunch:
    run_dir = home / "runs" / "wf" / task / "0"
    run = {
        "workflow_id": "wf",
        "group": group,
        "task": task,
        "command": ["true"],
        "run_dir": str(run_dir),
        "group_tasks": tasks,
        "task_index": tasks.index(task),
        "lead_task": tasks[0],
        "hosts": {},
    }
    return TaskLaunch(key=TaskKey("wf", task, 0), group=group, node="n", run_dir=run_dir, run=run)


def test_a_task_the_launcher_refused_fails_its_gang_only(tmp_path: Path) -> None:
    backend = LocalBackend(home=tmp_path, sandbox="none", network="loopback")
    stub = StubLauncher(refused="worker")
    backend._launcher = stub  # type: ignore[assignment]
    stopped: list[TaskKey] = []
    backend.stop = stopped.extend  # type: ignore[method-assign]
    pair = [
        launch(tmp_path, "g", "lead", ["lead", "worker"]),
        launch(tmp_path, "g", "worker", ["lead", "worker"]),
    ]
    alone = [launch(tmp_path, "h", "alone", ["alone"])]
    results = backend.start_groups([pair, alone])
    assert isinstance(results[0], BackendError) and "launcher: no" in str(results[0])
    assert results[1] is None
    assert stopped == [pair[0].key]  # the lead had started: stopped with its gang
    assert backend._attempts[alone[0].key].pid == 4242
    assert sorted(name for request in stub.requests for name in request) == [
        "alone",
        "lead",
        "worker",
    ]
