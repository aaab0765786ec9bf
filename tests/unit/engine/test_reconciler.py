"""The reconciler over the fake backend and a real SQLite store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine, Submission
from trainyard.engine.serialize import state_from_dict
from trainyard.errors import RefusedError, SpecError
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status, WorkflowStatus
from trainyard.store import Store


def _spec(body: dict) -> WorkflowSpec:
    return WorkflowSpec.model_validate(body)


def _task(name: str, **extra: object) -> dict:
    return {"name": name, "command": ["true"], **extra}


POOL = Pool(name="local", nodes=[NodeSpec(name=f"n{i}", gpu=8) for i in range(2)])


def _engine(tmp_path: Path, store_url: str, backend: FakeBackend) -> Engine:
    store = Store(store_url)
    return Engine(store, tmp_path, pools={"local": POOL}, backend_factory=lambda p, h: backend)


def _submit(engine: Engine, spec: WorkflowSpec) -> str:
    return engine.submit(Submission(spec=spec, spec_text="", user="alice", pool=POOL)).id


def test_serial_tasks_complete_in_dependency_order(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend()
    engine = _engine(tmp_path, store_url, backend)
    spec = _spec(
        {
            "name": "serial",
            "groups": [
                {"name": "a", "tasks": [_task("a", lead=True)]},
                {"name": "b", "tasks": [_task("b", lead=True, inputs=[{"task": "a"}])]},
            ],
        }
    )
    wid = _submit(engine, spec)
    assert wid == "serial-1"
    record = engine.wait(wid, timeout_s=10)
    assert record.status == WorkflowStatus.COMPLETED
    assert [launch.key.task for launch in backend.launches] == ["a", "b"]
    b_input = backend.launches[1].run["inputs"][0]
    assert b_input["source"].endswith("serial-1/a/0/output")


def test_gang_waits_for_room_then_runs(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(lambda launch: Outcome(0, polls=3))
    engine = _engine(tmp_path, store_url, backend)
    big = {
        "name": "big",
        "resources": {"default": {"gpu": 8}},
        "groups": [{"name": "g", "tasks": [_task("m", lead=True), _task("w")]}],
    }
    first, second = _submit(engine, _spec(big)), _submit(engine, _spec(big))
    engine.step()
    assert engine.state(second).groups["g"].status is Status.SCHEDULING
    assert engine.wait(first, 10).status == "COMPLETED"
    assert engine.wait(second, 10).status == "COMPLETED"
    nodes = {launch.node for launch in backend.launches[:2]}
    assert nodes == {"n0", "n1"}


def test_reschedule_runs_a_new_attempt_with_next_retry_id(tmp_path: Path, store_url: str) -> None:
    def script(launch: TaskLaunch) -> Outcome:
        return Outcome(3 if launch.key.retry_id == 0 else 0)

    backend = FakeBackend(script)
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine, _spec({"name": "r", "tasks": [_task("t", exitActions={"RESCHEDULE": "3"})]})
    )
    assert engine.wait(wid, 10).status == "COMPLETED"
    assert [launch.key.retry_id for launch in backend.launches] == [0, 1]
    assert backend.launches[1].run_dir.name == "1"


def test_cancel_stops_running_tasks(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(lambda launch: Outcome(None))
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, _spec({"name": "c", "tasks": [_task("t")]}))
    engine.step()
    engine.cancel(wid)
    record = engine.wait(wid, 10)
    assert record.status == WorkflowStatus.FAILED_CANCELED
    assert [k.task for k in backend.stopped] == ["t"]


def test_start_failure_fails_the_group(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(refuse_start=lambda launches: True)
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, _spec({"name": "s", "tasks": [_task("t")]}))
    record = engine.wait(wid, 10)
    assert record.status == WorkflowStatus.FAILED
    assert engine.state(wid).tasks["t"].status is Status.FAILED_BACKEND_ERROR


def test_engine_restart_resumes_from_the_store(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(lambda launch: Outcome(0, polls=2))
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine, _spec({"name": "k", "tasks": [_task("a"), _task("b", inputs=[{"task": "a"}])]})
    )
    engine.step()
    engine.close()
    again = _engine(tmp_path, store_url, backend)  # same backend: its tasks "kept running"
    assert again.wait(wid, 10).status == "COMPLETED"
    assert [launch.key.task for launch in backend.launches] == ["a", "b"]


class _DeafBackend(FakeBackend):
    """Ignores stops while ``deaf``: an engine that stored a stop and died before sending it."""

    deaf = True

    def stop(self, keys: list[TaskKey]) -> None:
        if not self.deaf:
            super().stop(keys)


def test_a_restarted_engine_stops_what_had_ended_in_the_store_but_still_runs(
    tmp_path: Path, store_url: str
) -> None:
    backend = _DeafBackend(lambda launch: Outcome(None if launch.key.task == "w" else 0, polls=3))
    engine = _engine(tmp_path, store_url, backend)
    gang = _submit(
        engine,
        _spec(
            {
                "name": "gang",
                "groups": [{"name": "g", "tasks": [_task("lead", lead=True), _task("w")]}],
            }
        ),
    )
    forever = _submit(engine, _spec({"name": "forever", "tasks": [_task("w")]}))
    assert engine.wait(gang, 10).status == "COMPLETED"  # its worker "w" was to be stopped
    for _ in range(5):
        engine.step()
    engine.cancel(forever)
    assert engine.wait(forever, 10).status == "FAILED_CANCELED"
    engine.close()
    assert (
        backend.stopped == []
        and len(backend.recover([TaskKey(gang, "w", 0), TaskKey(forever, "w", 0)])) == 2
    )  # both still "run"
    backend.deaf = False
    _engine(tmp_path, store_url, backend)
    assert sorted(backend.stopped) == sorted([TaskKey(gang, "w", 0), TaskKey(forever, "w", 0)])


class _SlowStopBackend(FakeBackend):
    """Stopped attempts keep running until ``let_go`` (a runner uploading its last checkpoint)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.asked: list[TaskKey] = []

    def stop(self, keys: list[TaskKey]) -> None:
        self.asked += keys

    def let_go(self) -> None:
        super().stop(self.asked)


def test_a_retry_starts_once_its_stopped_peers_have_ended(tmp_path: Path, store_url: str) -> None:
    backend = _SlowStopBackend(
        lambda launch: Outcome(
            3
            if launch.key == TaskKey(launch.key.workflow_id, "w", 0)
            else None
            if launch.key.task == "lead" and launch.key.retry_id == 0
            else 0,
            polls=2,
        )
    )
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        _spec(
            {
                "name": "g",
                "groups": [
                    {
                        "name": "g",
                        "ignoreNonleadStatus": False,
                        "tasks": [
                            _task("lead", lead=True),
                            _task("w", exitActions={"RESCHEDULE": "3"}),
                        ],
                    }
                ],
            }
        ),
    )
    for _ in range(8):
        engine.step()
    assert backend.asked == [TaskKey(wid, "lead", 0)]  # w exited 3: its peer is stopped
    started = [(la.key.task, la.key.retry_id) for la in backend.launches]
    assert started == [("lead", 0), ("w", 0)]  # retry 1 waits for lead/0 to end
    backend.let_go()
    assert engine.wait(wid, 10).status == "COMPLETED"
    started = [(la.key.task, la.key.retry_id) for la in backend.launches]
    assert started == [("lead", 0), ("w", 0), ("lead", 1), ("w", 1)]


def test_refused_state_stores_nothing(tmp_path: Path, store_url: str) -> None:
    engine = _engine(tmp_path, store_url, FakeBackend())
    bad = _spec({"name": "bad", "tasks": [_task("t", inputs=[{"task": "nope"}])]})
    with pytest.raises(SpecError, match="unknown task 'nope'"):
        _submit(engine, bad)
    assert engine.store.list_workflows() == []


def test_restart_reruns_only_groups_that_did_not_complete(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(
        lambda launch: Outcome(1 if (launch.key.task, launch.key.retry_id) == ("b", 0) else 0)
    )
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        _spec(
            {
                "name": "re",
                "tasks": [
                    _task("a"),
                    _task("b", inputs=[{"task": "a"}]),
                    _task("c", inputs=[{"task": "b"}]),
                ],
            }
        ),
    )
    assert engine.wait(wid, 10).status == "FAILED"
    assert engine.state(wid).tasks["c"].status is Status.FAILED_UPSTREAM
    engine.restart(wid)
    record = engine.wait(wid, 10)
    assert record.status == "COMPLETED" and record.end_time_s is not None
    runs = [(launch.key.task, launch.key.retry_id) for launch in backend.launches]
    assert runs == [("a", 0), ("b", 0), ("b", 1), ("c", 1)]
    c_input = [launch for launch in backend.launches if launch.key.task == "c"][0].run["inputs"][0]
    assert c_input["source"].endswith("re-1/b/1/output")
    assert [h.status for h in engine.state(wid).tasks["b"].history] == [Status.FAILED]


def test_restart_refuses_a_completed_workflow(tmp_path: Path, store_url: str) -> None:
    engine = _engine(tmp_path, store_url, FakeBackend())
    wid = _submit(engine, _spec({"name": "ok", "tasks": [_task("a")]}))
    engine.wait(wid, 10)
    with pytest.raises(RefusedError, match="submit it again"):
        engine.restart(wid)


def test_gpu_slots_survive_an_engine_restart(tmp_path: Path, store_url: str) -> None:
    backend = FakeBackend(lambda launch: Outcome(None))
    engine = _engine(tmp_path, store_url, backend)
    spec = _spec({"name": "g", "resources": {"default": {"gpu": 6}}, "tasks": [_task("a")]})
    wid = _submit(engine, spec)
    engine.step()
    slots = engine.state(wid).tasks["a"].gpu_slots
    assert len(slots) == 6
    again = _engine(tmp_path, store_url, backend)
    assert again.usage("local")[backend.launches[0].node]["gpu"] == 6


def test_preview_renders_each_group_for_a_slurm_pool_and_stores_nothing(
    tmp_path: Path, store_url: str
) -> None:
    from trainyard.backends.slurm import SlurmBackend

    pool = Pool(
        name="slurm-pool",
        backend="slurm",
        options={"partition": "batch"},
        nodes=[NodeSpec(name="n1"), NodeSpec(name="n2")],
    )
    store = Store(store_url)
    engine = Engine(
        store,
        tmp_path,
        pools={pool.name: pool},
        backend_factory=lambda p, h: SlurmBackend(p, h, python="/usr/bin/python3"),
    )
    spec = _spec(
        {
            "name": "train",
            "groups": [
                {"name": "prep", "tasks": [_task("fetch")]},
                {"name": "fit", "tasks": [_task("master", lead=True), _task("worker")]},
            ],
        }
    )
    shown = engine.preview(Submission(spec, "", "alice", pool))
    assert [group for group, _text in shown] == ["prep", "fit"]
    fit = shown[1][1]
    assert fit.startswith("$ sbatch ") and "#SBATCH --nodes=2" in fit and "--partition=batch" in fit
    assert "train-1" in fit and "/usr/bin/python3 -m trainyard.runner" in fit
    assert store.list_workflows() == [] and store.peek_workflow_id("train") == "train-1"
    assert not (tmp_path / "runs").exists()


def test_preview_is_empty_for_a_backend_without_a_rendering(tmp_path: Path, store_url: str) -> None:
    engine = _engine(tmp_path, store_url, FakeBackend())
    spec = _spec({"name": "one", "tasks": [_task("a")]})
    assert engine.preview(Submission(spec, "", "alice", POOL)) == []


class _EngineDied(Exception):
    """Stands for the engine process being killed in the middle of a step."""


class _Dying(FakeBackend):
    """A fake whose engine 'dies' in a start that ``dies_on`` picks, after making the first
    ``made`` launches of it; ``revive()`` ends that (the restarted engine's starts happen)."""

    def __init__(
        self,
        script: Callable[[TaskLaunch], Outcome] | None = None,
        *,
        dies_on: Callable[[list[TaskLaunch]], bool] = lambda launches: True,
        made: int = 0,
    ) -> None:
        super().__init__(script)
        self.dies_on, self.made, self.alive = dies_on, made, False

    def start_group(self, launches: list[TaskLaunch]) -> None:
        if self.alive or not self.dies_on(launches):
            return super().start_group(launches)
        super().start_group(launches[: self.made])
        raise _EngineDied

    def revive(self) -> _Dying:
        self.alive = True
        return self


def test_a_workflow_submitted_just_before_a_restart_still_runs(
    tmp_path: Path, store_url: str
) -> None:
    backend = FakeBackend()
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, _spec({"name": "p", "tasks": [_task("a")]}))
    engine.close()  # dies before its next step: Submitted was only in memory
    again = _engine(tmp_path, store_url, backend)
    assert again.wait(wid, 5).status == "COMPLETED"
    assert [launch.key.task for launch in backend.launches] == ["a"]


def test_restart_keeps_the_scheduling_queue_in_submission_order(
    tmp_path: Path, store_url: str
) -> None:
    backend = FakeBackend(lambda launch: Outcome(None))
    engine = _engine(tmp_path, store_url, backend)
    big = {
        "resources": {"default": {"gpu": 8}},
        "groups": [{"name": "group", "tasks": [_task("m", lead=True), _task("w")]}],
    }
    blocker = _submit(engine, _spec({"name": "blocker", **big}))
    first = _submit(engine, _spec({"name": "first", **big}))
    second = _submit(engine, _spec({"name": "second", **big}))
    engine.step()
    assert engine.state(second).groups["group"].status is Status.SCHEDULING
    engine.close()
    again = _engine(tmp_path, store_url, backend)
    again.cancel(blocker)  # its nodes go to the head of the queue at once
    assert again.state(first).groups["group"].status is Status.INITIALIZING
    assert again.state(second).groups["group"].status is Status.SCHEDULING


def test_a_start_stored_but_never_made_is_made_after_a_restart(
    tmp_path: Path, store_url: str
) -> None:
    backend = _Dying()
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        _spec(
            {"name": "s", "groups": [{"name": "g", "tasks": [_task("m", lead=True), _task("w")]}]}
        ),
    )
    with pytest.raises(_EngineDied):
        engine.step()
    stored = state_from_dict(engine.store.get_workflow(wid).state)
    assert stored.tasks["m"].status is Status.INITIALIZING  # stored, never started
    again = _engine(tmp_path, store_url, backend.revive())
    assert again.wait(wid, 5).status == "COMPLETED"
    assert again.state(wid).tasks["m"].exit_code == 0
    assert [(launch.key.task, launch.key.retry_id) for launch in backend.launches] == [
        ("m", 0),
        ("w", 0),
    ]
    assert backend.launches[0].run["barrier"]["enabled"] is True


def test_only_the_never_started_part_of_a_gang_is_started_after_a_restart(
    tmp_path: Path, store_url: str
) -> None:
    backend = _Dying(lambda launch: Outcome(0, polls=2), made=1)
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        _spec(
            {"name": "h", "groups": [{"name": "g", "tasks": [_task("m", lead=True), _task("w")]}]}
        ),
    )
    with pytest.raises(_EngineDied):
        engine.step()
    again = _engine(tmp_path, store_url, backend.revive())  # the same machine: "m" kept running
    assert again.wait(wid, 5).status == "COMPLETED"
    started = [(launch.key.task, launch.run["barrier"]["folder"]) for launch in backend.launches]
    assert [task for task, _folder in started] == ["m", "w"]
    assert started[0][1] == started[1][1]  # one barrier for the whole gang


def test_a_restart_in_place_stored_but_never_made_is_made_in_place(
    tmp_path: Path, store_url: str
) -> None:
    backend = _Dying(
        lambda launch: Outcome(7 if launch.key.retry_id == 0 else 0),
        dies_on=lambda launches: launches[0].key.retry_id > 0,
    )
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine, _spec({"name": "ip", "tasks": [_task("t", exitActions={"RESTART": "7"})]})
    )
    with pytest.raises(_EngineDied):
        engine.wait(wid, 5)
    again = _engine(tmp_path, store_url, backend.revive())
    assert again.wait(wid, 5).status == "COMPLETED"
    retry = backend.launches[-1]
    assert (retry.key.retry_id, retry.restart_in_place) == (1, True)


def test_facts_read_together_are_applied_in_the_order_they_happened(
    tmp_path: Path, store_url: str
) -> None:
    """Issue 12, H2: after a restart one poll reads a lead's exit (later) before a worker's
    exit (earlier); the worker's failure must still decide the gang."""
    import time as _time

    from trainyard.backends.base import FactKind, TaskFact

    backend = FakeBackend(lambda launch: Outcome(None))
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        _spec(
            {
                "name": "h2",
                "groups": [
                    {
                        "name": "g",
                        "ignoreNonleadStatus": False,
                        "tasks": [_task("lead", lead=True), _task("worker")],
                    }
                ],
            }
        ),
    )
    engine.step()
    engine.step()
    assert engine.state(wid).tasks["worker"].status is Status.RUNNING
    now = _time.time()
    backend.poll = lambda: [  # type: ignore[method-assign]
        TaskFact(TaskKey(wid, "lead", 0), FactKind.EXITED, now + 14, exit_code=0),
        TaskFact(TaskKey(wid, "worker", 0), FactKind.EXITED, now + 6, exit_code=3),
    ]
    engine.step()
    state = engine.state(wid)
    assert state.status is WorkflowStatus.FAILED
    assert (state.tasks["worker"].status, state.tasks["worker"].exit_code) == (Status.FAILED, 3)
    assert state.tasks["lead"].status is Status.FAILED


def test_a_gang_that_can_never_be_placed_is_refused_at_submit(
    tmp_path: Path, store_url: str
) -> None:
    """Issue 12, H4: three tasks of 10 cores on two nodes of 16 fit one by one and in total
    (30 of 32), but never together: refused, nothing stored."""
    pool = Pool(name="local", nodes=[NodeSpec(name=f"n{i}", cpu=16) for i in range(2)])
    store = Store(store_url)
    engine = Engine(
        store, tmp_path, pools={"local": pool}, backend_factory=lambda p, h: FakeBackend()
    )
    spec = _spec(
        {
            "name": "packed",
            "resources": {"default": {"cpu": 10}},
            "groups": [{"name": "g", "tasks": [_task("a", lead=True), _task("b"), _task("c")]}],
        }
    )
    with pytest.raises(RefusedError, match="group 'g': its 3 tasks .* cannot be placed together"):
        engine.submit(Submission(spec=spec, spec_text="", user="alice", pool=pool))
    assert store.list_workflows() == []


def test_a_small_workflow_is_not_held_behind_a_gang_that_does_not_fit_now(
    tmp_path: Path, store_url: str
) -> None:
    """Issue 12, H4: backfill (within Pool.backfill_age_s) through the engine."""
    backend = FakeBackend(lambda launch: Outcome(None))  # run until stopped
    engine = _engine(tmp_path, store_url, backend)
    hog = _submit(
        engine, _spec({"name": "hog", "resources": {"default": {"gpu": 8}}, "tasks": [_task("h")]})
    )
    engine.step()
    big = _submit(
        engine,
        _spec(
            {
                "name": "big",
                "resources": {"default": {"gpu": 8}},
                "groups": [{"name": "g", "tasks": [_task("m", lead=True), _task("w")]}],
            }
        ),
    )
    small = _submit(
        engine,
        _spec({"name": "small", "resources": {"default": {"gpu": 1}}, "tasks": [_task("s")]}),
    )
    engine.step()
    engine.step()
    assert engine.state(hog).status is WorkflowStatus.RUNNING
    assert engine.state(big).groups["g"].status is Status.SCHEDULING
    assert engine.state(small).status is WorkflowStatus.RUNNING


def test_a_backend_error_is_the_tasks_failure_reason_and_in_its_log(
    tmp_path: Path, store_url: str
) -> None:
    """Issue 12: why a backend failed is stored per task and written to the task's log."""
    backend = FakeBackend(refuse_start=lambda launches: True)
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, _spec({"name": "be", "tasks": [_task("t")]}))
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.FAILED
    task = engine.state(wid).tasks["t"]
    assert (task.status, task.exit_code) == (Status.FAILED_BACKEND_ERROR, 3001)
    assert task.failure_reason == "fake backend refused the group"
    log = (engine.run_dir(wid, "t", 0) / "task.log").read_text()
    assert "[t][trainyard] the fake backend could not start the task: fake backend refused" in log
    again = _engine(tmp_path, store_url, backend)  # stored: a new engine reads it back
    assert again.state(wid).tasks["t"].failure_reason == "fake backend refused the group"


def test_a_lost_task_keeps_what_the_backend_saw(tmp_path: Path, store_url: str) -> None:
    import time as _time

    from trainyard.backends.base import FactKind, TaskFact

    backend = FakeBackend(lambda launch: Outcome(None))
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, _spec({"name": "lost", "tasks": [_task("t")]}))
    engine.step()
    engine.step()
    backend.poll = lambda: [
        TaskFact(  # type: ignore[method-assign]
            TaskKey(wid, "t", 0), FactKind.LOST, _time.time(), None, "Slurm job 7 NODE_FAIL"
        )
    ]
    engine.step()
    task = engine.state(wid).tasks["t"]
    assert (task.status, task.failure_reason) == (
        Status.FAILED_BACKEND_ERROR,
        "Slurm job 7 NODE_FAIL",
    )
    log = (engine.run_dir(wid, "t", 0) / "task.log").read_text()
    assert "the fake backend reports the task LOST: Slurm job 7 NODE_FAIL" in log


def test_a_never_started_task_whose_gang_ended_meanwhile_is_not_started(
    tmp_path: Path, store_url: str
) -> None:
    """The engine died after starting "m" of the gang, not "w"; "m" failed (1) while no
    engine ran. The restarted engine reads that exit first: the gang failed, "w" never runs."""
    import time as _time

    from trainyard.backends.base import FactKind, TaskFact

    backend = _Dying(lambda launch: Outcome(None), made=1)
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(
        engine,
        _spec(
            {
                "name": "gone",
                "groups": [{"name": "g", "tasks": [_task("m", lead=True), _task("w")]}],
            }
        ),
    )
    with pytest.raises(_EngineDied):
        engine.step()
    key, now = TaskKey(wid, "m", 0), _time.time()
    left = [
        TaskFact(key, FactKind.INITIALIZING, now),
        TaskFact(key, FactKind.RUNNING, now),
        TaskFact(key, FactKind.EXITED, now + 1, exit_code=1),
    ]  # what "m" left meanwhile
    backend._attempts[key].done = True
    poll = backend.poll
    backend.poll = lambda: [left.pop(0) for _ in list(left)] + poll()  # type: ignore[method-assign]
    again = _engine(tmp_path, store_url, backend.revive())
    assert again.wait(wid, 5).status == "FAILED"
    assert again.state(wid).tasks["m"].exit_code == 1
    assert [launch.key.task for launch in backend.launches] == ["m"]


def test_a_cancel_after_the_last_task_exited_keeps_what_happened(
    tmp_path: Path, store_url: str
) -> None:
    """The task exited 0 and the backend has that fact, not yet read, when the cancel comes:
    the workflow COMPLETED, it is not recorded FAILED_CANCELED."""
    backend = FakeBackend(lambda launch: Outcome(0, polls=1))
    engine = _engine(tmp_path, store_url, backend)
    wid = _submit(engine, _spec({"name": "done", "tasks": [_task("t")]}))
    engine.step()  # started
    engine.step()  # RUNNING
    assert engine.state(wid).tasks["t"].status is Status.RUNNING
    engine.cancel(wid)  # the backend's next poll says: EXITED 0
    assert engine.state(wid).status is WorkflowStatus.COMPLETED
    assert engine.state(wid).tasks["t"].exit_code == 0


def test_a_gang_keeps_its_queue_age_across_a_restart(tmp_path: Path, store_url: str) -> None:
    """Backfill's age bound counts from when the gang went SCHEDULING, not from the restart:
    a gang that waited longer than backfill_age_s still holds the queue afterwards."""
    import time as _time

    pool = Pool(
        name="local", nodes=[NodeSpec(name=f"n{i}", gpu=8) for i in range(2)], backfill_age_s=30
    )
    backend = FakeBackend(lambda launch: Outcome(None))
    store = Store(store_url)
    engine = Engine(store, tmp_path, pools={"local": pool}, backend_factory=lambda p, h: backend)
    engine.submit(
        Submission(
            spec=_spec(
                {"name": "hog", "resources": {"default": {"gpu": 8}}, "tasks": [_task("h")]}
            ),
            spec_text="",
            user="a",
            pool=pool,
        )
    )
    engine.step()
    big = engine.submit(
        Submission(
            spec=_spec(
                {
                    "name": "big",
                    "resources": {"default": {"gpu": 8}},
                    "groups": [{"name": "g", "tasks": [_task("m", lead=True), _task("w")]}],
                }
            ),
            spec_text="",
            user="a",
            pool=pool,
        )
    ).id
    engine.step()
    state = engine.state(big)
    state.groups["g"].scheduling_since_s = _time.time() - 60  # it has waited a minute
    from trainyard.engine.serialize import state_to_dict

    store.save_states({big: (state.status.value, None, state_to_dict(state))})
    engine.close()
    again = Engine(store, tmp_path, pools={"local": pool}, backend_factory=lambda p, h: backend)
    small = again.submit(
        Submission(
            spec=_spec(
                {"name": "small", "resources": {"default": {"gpu": 1}}, "tasks": [_task("s")]}
            ),
            spec_text="",
            user="a",
            pool=pool,
        )
    ).id
    again.step()
    again.step()
    assert again.state(small).status is WorkflowStatus.PENDING  # held behind "big"


def test_gangs_started_in_one_step_read_their_submitters_data_credentials_once(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submitter's DATA credentials are read (one query, one decryption each) once per
    step's starts, not once per gang: 1,000 one-task gangs made as many queries."""
    backend = FakeBackend()
    engine = _engine(tmp_path, store_url, backend)
    engine.core.credentials.set(
        "alice", "store", "DATA", {"access_key_id": "k", "access_key": "s", "endpoint": "s3://b"}
    )
    store = engine.core.credentials.store
    reads: list[str] = []
    real_rows = store.credential_rows

    def counted(user: str):  # type: ignore[no-untyped-def]
        reads.append(user)
        return real_rows(user)

    monkeypatch.setattr(store, "credential_rows", counted)
    spec = _spec({"name": "many", "tasks": [_task(f"t{i}") for i in range(5)]})
    wid = _submit(engine, spec)
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.COMPLETED
    assert len(backend.launches) == 5
    assert reads == ["alice"]
