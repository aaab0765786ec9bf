"""``SlurmBackend.unstarted``: after an engine restart, which attempts were surely never
submitted (so the engine starts them instead of reporting them LOST). The index record is
written before sbatch; a record without a job id is looked up by job name and job folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_support import Crash, FakeSlurm, launches

from trainyard.backends.base import FactKind, TaskKey, TaskLaunch, TaskResources
from trainyard.backends.slurm import SlurmBackend
from trainyard.pools import NodeSpec, Pool

POOL = Pool(
    name="slurm-pool",
    backend="slurm",
    nodes=[NodeSpec(name="ty-node1"), NodeSpec(name="ty-node2")],
    options={"lost_grace_s": 0, "status_interval_s": 1e-9},
)
TWO = {"master": TaskResources(cpu=1), "worker": TaskResources(cpu=1)}


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


def _backend(home: Path, fake: FakeSlurm) -> SlurmBackend:
    return SlurmBackend(POOL, home, commands=fake, python="/usr/bin/python3")


def _keys(group: list[TaskLaunch]) -> list[TaskKey]:
    return [launch.key for launch in group]


def _crashed_start(home: Path, fake: FakeSlurm, when: str) -> list[TaskLaunch]:
    """Start the two-task gang with an engine that dies ``before`` or ``after`` sbatch."""
    group = launches(home, TWO)
    fake.crash = when
    with pytest.raises(Crash):
        _backend(home, fake).start_group(group)
    fake.crash = None
    return group


def _record(backend: SlurmBackend, key: TaskKey) -> dict:
    return json.loads(backend.index.path(key).read_text())


def _age_records(backend: SlurmBackend, keys: list[TaskKey]) -> None:
    """Make sbatch's time for these records run out."""
    for key in keys:
        record = _record(backend, key)
        record["submit_by"] = 0.0
        backend.index.path(key).write_text(json.dumps(record))


def test_attempts_without_a_record_are_unstarted_and_submitted_ones_are_not(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    group = launches(tmp_path, TWO)
    _backend(tmp_path, fake).start_group(group)
    never = TaskKey("train-1", "other", 0)
    again = _backend(tmp_path, fake)
    assert again.unstarted([*_keys(group), never]) == [never]
    assert [c[0] for c in fake.calls] == ["sbatch"]  # a job id on record: no need to ask


def test_the_record_is_written_before_sbatch_runs(tmp_path: Path, fake: FakeSlurm) -> None:
    group = _crashed_start(tmp_path, fake, "before")
    record = _record(_backend(tmp_path, fake), group[0].key)
    assert record["job_id"] is None and record["job_name"] == "trainyard:train-1:training"
    assert record["job_dir"] == str(
        tmp_path / "runs" / "train-1" / "_slurm" / "training" / "master.0"
    )


def test_a_crash_before_sbatch_is_unstarted_once_sbatch_time_is_up(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    group = _crashed_start(tmp_path, fake, "before")
    again = _backend(tmp_path, fake)
    assert again.unstarted(_keys(group)) == []  # a dead engine's sbatch may still submit
    _age_records(again, _keys(group))
    assert again.unstarted(_keys(group)) == _keys(group)
    again.start_group(group)
    assert again.recover(_keys(group)) == _keys(group)  # job 100, pending


def test_a_crash_after_sbatch_finds_the_job_by_name_and_folder(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    fake.named["99"] = ("trainyard:train-1:training", "/elsewhere")  # same name, other job
    fake.states["99"] = ("RUNNING", "None")
    group = _crashed_start(tmp_path, fake, "after")
    again = _backend(tmp_path, fake)
    _age_records(again, _keys(group))
    assert again.unstarted(_keys(group)) == []
    assert _record(again, group[0].key)["job_id"] == "100"
    assert _backend(tmp_path, fake).recover(_keys(group)) == _keys(group)


def test_a_job_squeue_forgot_is_found_by_its_output_file(tmp_path: Path, fake: FakeSlurm) -> None:
    group = _crashed_start(tmp_path, fake, "after")
    del fake.states["100"]  # ended longer than MinJobAge ago
    again = _backend(tmp_path, fake)
    _age_records(again, _keys(group))
    job_dir = Path(_record(again, group[0].key)["job_dir"])
    (job_dir / "slurm-100.out").write_text("")
    assert again.unstarted(_keys(group)) == []
    assert _record(again, group[1].key)["job_id"] == "100"


def test_a_runner_trace_counts_as_started(tmp_path: Path, fake: FakeSlurm) -> None:
    group = _crashed_start(tmp_path, fake, "after")
    del fake.states["100"]
    again = _backend(tmp_path, fake)
    _age_records(again, _keys(group))
    (group[1].run_dir / "runner.out").write_text("")
    assert again.unstarted(_keys(group)) == [group[0].key]


def test_when_squeue_cannot_be_asked_nothing_counts_as_unstarted(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    group = _crashed_start(tmp_path, fake, "before")
    again = _backend(tmp_path, fake)
    _age_records(again, _keys(group))
    fake.squeue_down = True
    never = TaskKey("train-1", "other", 0)
    assert again.unstarted([*_keys(group), never]) == [never]


def test_an_adopted_attempt_without_a_job_id_is_lost_only_after_sbatch_time(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    group = _crashed_start(tmp_path, fake, "before")
    again = _backend(tmp_path, fake)
    assert again.recover(_keys(group)) == []
    assert again.poll() == []  # sbatch's time is not up: it may still answer
    _age_records(again, _keys(group))
    later = _backend(tmp_path, fake)
    later.recover(_keys(group))
    assert sorted((f.key.task, f.kind) for f in later.poll()) == [
        ("master", FactKind.LOST),
        ("worker", FactKind.LOST),
    ]


def test_an_adopted_attempt_whose_job_shows_up_later_is_followed(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    group = _crashed_start(tmp_path, fake, "after")
    again = _backend(tmp_path, fake)
    fake.states["100"] = ("COMPLETED", "None")
    again.recover(_keys(group))
    facts = again.poll()  # the job is found by name; it ended without events: LOST
    assert sorted((f.key.task, f.kind) for f in facts) == [
        ("master", FactKind.LOST),
        ("worker", FactKind.LOST),
    ]
    assert "Slurm job 100 COMPLETED" in facts[0].message
