"""The engine resolves ``task: WORKFLOW_ID:TASK`` inputs (fake backend, real SQLite store)."""

from __future__ import annotations

from pathlib import Path

from trainyard.backends.base import TaskLaunch
from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.store import Store

POOL = Pool(name="local", nodes=[NodeSpec(name="n0")])


def _engine(tmp_path: Path, store_url: str, backend: FakeBackend) -> Engine:
    store = Store(store_url)
    return Engine(store, tmp_path, pools={"local": POOL}, backend_factory=lambda p, h: backend)


def _run(engine: Engine, body: dict) -> str:
    spec = WorkflowSpec.model_validate(body)
    wid = engine.submit(Submission(spec=spec, spec_text="", user="u", pool=POOL)).id
    engine.wait(wid, timeout_s=10)
    return wid


def _input_of_read(backend: FakeBackend) -> dict:
    launch = next(la for la in backend.launches if la.key.task == "read")
    return dict(launch.run["inputs"][0])


def _source_of_read(backend: FakeBackend) -> str:
    return str(_input_of_read(backend)["source"])


def _why_unavailable(backend: FakeBackend) -> str | None:
    return _input_of_read(backend).get("unavailable")


def _consumer(ref: str) -> dict:
    return {
        "name": "consumer",
        "tasks": [{"name": "read", "command": ["x"], "inputs": [{"task": ref}]}],
    }


def _producer_fails_first(launch: TaskLaunch) -> Outcome:
    return Outcome(3 if launch.key.retry_id == 0 else 0)


def test_the_last_attempt_of_a_completed_task_is_read(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(_producer_fails_first)
    engine = _engine(tmp_path, store_url, backend)
    producer = _run(
        engine,
        {
            "name": "producer",
            "tasks": [{"name": "Make", "command": ["x"], "exitActions": {"RESCHEDULE": "3"}}],
        },
    )
    _run(engine, _consumer(f"{producer}:make"))  # names match as task names do
    assert _source_of_read(backend) == str(tmp_path / "runs" / producer / "Make" / "1" / "output")
    assert _why_unavailable(backend) is None


def test_a_failed_task_is_handed_over_as_unavailable_with_the_reason(
    tmp_path: Path, store_url: str
) -> None:
    backend = FakeBackend(lambda launch: Outcome(3 if launch.key.task == "make" else 0))
    engine = _engine(tmp_path, store_url, backend)
    producer = _run(engine, {"name": "producer", "tasks": [{"name": "make", "command": ["x"]}]})
    _run(engine, _consumer(f"{producer}:make"))
    assert _why_unavailable(backend) == f"task make of workflow {producer} is FAILED, not COMPLETED"
    assert _source_of_read(backend) == ""


def test_an_unknown_workflow_or_task_never_breaks_the_engine(
    tmp_path: Path, store_url: str
) -> None:
    backend = FakeBackend()
    engine = _engine(tmp_path, store_url, backend)
    producer = _run(engine, {"name": "producer", "tasks": [{"name": "make", "command": ["x"]}]})
    _run(engine, _consumer("ghost-1:make"))
    assert _why_unavailable(backend) == "no workflow ghost-1"
    backend.launches.clear()
    _run(engine, _consumer(f"{producer}:other"))
    assert _why_unavailable(backend) == f"workflow {producer} has no task other"
