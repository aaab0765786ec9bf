"""Several gangs ready in one step are started one ``start_group`` each, even where the
backend offers ``start_groups`` (measured slower on the local backend, issue 11: its
launcher's runner threads contended; docs/benchmarks-history.md "Batched starts turned off"); each
gang's outcome stays its own."""

from __future__ import annotations

from pathlib import Path

from trainyard.backends.base import TaskLaunch
from trainyard.backends.fake import FakeBackend
from trainyard.engine.reconciler import Engine, Submission
from trainyard.errors import BackendError
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status, WorkflowStatus
from trainyard.store import Store

POOL = Pool(name="local", nodes=[NodeSpec(name="n0", cpu=1000)])


class BatchingBackend(FakeBackend):
    """The fake backend with ``start_groups``: gangs whose first task is in ``refused`` fail
    (only they); every call is recorded."""

    def __init__(self, refused: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.refused = refused
        self.batches: list[list[list[str]]] = []
        self.singles: list[list[str]] = []

    def start_groups(self, groups: list[list[TaskLaunch]]) -> list[BackendError | None]:
        self.batches.append([[launch.key.task for launch in group] for group in groups])
        results: list[BackendError | None] = []
        for group in groups:
            if group[0].key.task in self.refused:
                results.append(BackendError(f"refused {group[0].key.task}"))
            else:
                super().start_group(group)
                results.append(None)
        return results

    def start_group(self, launches: list[TaskLaunch]) -> None:
        self.singles.append([launch.key.task for launch in launches])
        if launches[0].key.task in self.refused:
            raise BackendError(f"refused {launches[0].key.task}")
        super().start_group(launches)


def _engine(tmp_path: Path, store_url: str, backend: FakeBackend) -> Engine:
    store = Store(store_url)
    return Engine(store, tmp_path, pools={"local": POOL}, backend_factory=lambda p, h: backend)


def _submit(engine: Engine, body: dict) -> str:
    spec = WorkflowSpec.model_validate(body)
    return engine.submit(Submission(spec=spec, spec_text="", user="alice", pool=POOL)).id


def _tasks(count: int) -> list[dict]:
    return [{"name": f"t{i}", "command": ["true"]} for i in range(count)]


def test_gangs_ready_together_start_one_call_each(tmp_path: Path, store_url: str) -> None:
    backend = BatchingBackend()
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, {"name": "many", "tasks": _tasks(5)})
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.COMPLETED
    assert backend.singles == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]
    assert backend.batches == []


def test_a_refused_gang_among_several_fails_alone(tmp_path: Path, store_url: str) -> None:
    backend = BatchingBackend(refused=frozenset({"t2"}))
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, {"name": "one-bad", "tasks": _tasks(4)})
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.FAILED
    tasks = engine.state(wid).tasks
    assert tasks["t2"].status is Status.FAILED_BACKEND_ERROR
    assert tasks["t2"].failure_reason == "refused t2"
    assert {n: tasks[n].status for n in ("t0", "t1", "t3")} == dict.fromkeys(
        ("t0", "t1", "t3"), Status.COMPLETED
    )
    log = (engine.run_dir(wid, "t2", 0) / "task.log").read_text()
    assert "the fake backend could not start the task: refused t2" in log


def test_a_lone_start_uses_start_group(tmp_path: Path, store_url: str) -> None:
    backend = BatchingBackend()
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        {
            "name": "chain",
            "groups": [
                {"name": "a", "tasks": [{"name": "a", "command": ["true"], "lead": True}]},
                {
                    "name": "b",
                    "tasks": [
                        {"name": "b", "command": ["true"], "lead": True, "inputs": [{"task": "a"}]}
                    ],
                },
            ],
        },
    )
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.COMPLETED
    assert backend.singles == [["a"], ["b"]] and backend.batches == []


def test_a_backend_without_the_hook_gets_one_start_group_per_gang(
    tmp_path: Path, store_url: str
) -> None:
    backend = FakeBackend(refuse_start=lambda launches: launches[0].key.task == "t1")
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, {"name": "plain", "tasks": _tasks(3)})
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.FAILED
    tasks = engine.state(wid).tasks
    assert tasks["t1"].status is Status.FAILED_BACKEND_ERROR
    assert tasks["t0"].status is Status.COMPLETED and tasks["t2"].status is Status.COMPLETED
