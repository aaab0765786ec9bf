"""The engine's resume with the Slurm backend (over a fake of Slurm's commands): an engine
that died before its sbatch ran has its gang started by the next engine, not reported LOST;
one that died after sbatch adopts the queued job instead of submitting a second one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_support import Crash, FakeSlurm

from trainyard import spec
from trainyard.backends.slurm import SlurmBackend
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool
from trainyard.runner.report import EventWriter
from trainyard.status import Status
from trainyard.store import Store

POOL = Pool(
    name="slurm-pool",
    backend="slurm",
    nodes=[NodeSpec(name="ty-node1"), NodeSpec(name="ty-node2")],
    options={"lost_grace_s": 0, "status_interval_s": 1e-9},
)
SPEC = """workflow:
  name: pair
  groups:
  - name: g
    tasks:
    - {name: lead, lead: true, command: [echo, hi]}
    - {name: other, command: [echo, hi]}
"""
TASKS = ("lead", "other")


def _engine(home: Path, fake: FakeSlurm) -> Engine:
    return Engine(
        Store(f"sqlite:///{home / 'db.sqlite'}"),
        home,
        pools={POOL.name: POOL},
        backend_factory=lambda pool, h: SlurmBackend(
            pool, h, commands=fake, python="/usr/bin/python3"
        ),
    )


def _crash_while_starting(home: Path, fake: FakeSlurm, when: str) -> str:
    """Submit, and let the engine die in its first start (``before``/``after`` sbatch)."""
    engine = _engine(home, fake)
    path = home / "pair.yaml"
    path.write_text(SPEC)
    doc = spec.load(path, pool=POOL)
    wid = engine.submit(Submission(spec=doc.workflow, spec_text=SPEC, user="u", pool=POOL)).id
    fake.crash = when
    with pytest.raises(Crash):
        for _ in range(20):
            engine.step()
    fake.crash = None
    return wid


def _age_records(home: Path, wid: str) -> None:
    for path in (home / "slurm" / "attempts" / wid).rglob("*.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "submit_by": 0.0}))


def _finish(engine: Engine, wid: str, job: str, fake: FakeSlurm) -> None:
    """The job runs; every runner reports exit 0; step until the workflow is done."""
    fake.states[job] = ("RUNNING", "None")
    fake.step_names[job] = {t: f"{job}.{i}" for i, t in enumerate(TASKS)}
    for task in TASKS:
        writer = EventWriter(engine.run_dir(wid, task, 0))
        for kind in ("INITIALIZING", "RUNNING"):
            writer.emit(kind)
        writer.emit("EXITED", 0)
    for _ in range(50):
        engine.step()
        if engine.state(wid).status.is_terminal():
            return


def _sbatches(fake: FakeSlurm) -> int:
    return sum(c[0] == "sbatch" for c in fake.calls)


def test_a_gang_never_submitted_is_started_by_the_next_engine(tmp_path: Path) -> None:
    fake = FakeSlurm()
    wid = _crash_while_starting(tmp_path, fake, "before")
    _age_records(tmp_path, wid)
    engine = _engine(tmp_path, fake)
    engine.step()
    assert _sbatches(fake) == 2 and set(fake.states) == {"100"}
    _finish(engine, wid, "100", fake)
    state = engine.state(wid)
    assert state.status.value == "COMPLETED", state
    assert {t.status for t in state.tasks.values()} == {Status.COMPLETED}
    assert all(t.retry_id == 0 for t in state.tasks.values())


def test_a_gang_submitted_before_the_crash_is_adopted_not_submitted_again(tmp_path: Path) -> None:
    fake = FakeSlurm()
    wid = _crash_while_starting(tmp_path, fake, "after")
    _age_records(tmp_path, wid)
    engine = _engine(tmp_path, fake)
    engine.step()
    assert _sbatches(fake) == 1
    record = json.loads((tmp_path / "slurm" / "attempts" / wid / "lead" / "0.json").read_text())
    assert record["job_id"] == "100"
    _finish(engine, wid, "100", fake)
    assert engine.state(wid).status.value == "COMPLETED", engine.state(wid)
    assert all(t.retry_id == 0 for t in engine.state(wid).tasks.values())
