"""SlurmBackend over a fake of Slurm's commands: what it writes, submits, reports and cancels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_support import FakeSlurm, launches

from trainyard.backends.base import FactKind, TaskKey, TaskResources
from trainyard.backends.slurm import SlurmBackend
from trainyard.errors import BackendError
from trainyard.pools import NodeSpec, Pool
from trainyard.runner.report import EventWriter

POOL = Pool(
    name="slurm-pool",
    backend="slurm",
    nodes=[NodeSpec(name="ty-node1"), NodeSpec(name="ty-node2", hostname="gpu-b02")],
    options={"partition": "batch", "lost_grace_s": 0, "status_interval_s": 1e-9},
)
TWO = {"master": TaskResources(cpu=1), "worker": TaskResources(cpu=1)}


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def backend(tmp_path: Path, fake: FakeSlurm) -> SlurmBackend:
    return SlurmBackend(POOL, tmp_path, commands=fake, python="/usr/bin/python3")


def _emit(backend: SlurmBackend, key: TaskKey, kind: str, code: int | None = None) -> None:
    EventWriter(backend.home / "runs" / key.workflow_id / key.task / str(key.retry_id)).emit(
        kind, code
    )


def _kinds(facts: list) -> list[tuple[str, FactKind]]:
    return [(f.key.task, f.kind) for f in facts]


def _running(backend: SlurmBackend, fake: FakeSlurm, *steps: str) -> list:
    """Start the two-task gang (job 100) and make the job run with these steps."""
    group = launches(backend.home, TWO)
    backend.start_group(group)
    fake.states["100"] = ("RUNNING", "None")
    fake.step_names["100"] = {name: f"100.{i}" for i, name in enumerate(TWO) if name in steps}
    return group


def test_start_writes_run_json_and_script_then_submits_once(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = launches(backend.home, TWO)
    backend.start_group(group)
    request = backend.build_request(group)
    assert request.script_path.read_text() == request.script
    run = json.loads((group[0].run_dir / "run.json").read_text())
    assert run["hosts_env"] == "TRAINYARD_HOSTS"
    assert (group[0].run_dir / "sandbox" / "root" / "tmp").is_dir()
    assert [c[0] for c in fake.calls] == ["sbatch"]
    assert fake.calls[0][1:] == tuple(request.sbatch_argv)


def test_dry_run_writes_nothing_and_submits_nothing(backend: SlurmBackend, fake: FakeSlurm) -> None:
    text = backend.dry_run(launches(backend.home, TWO))
    assert "#SBATCH --partition=batch" in text and "srun" in text
    assert fake.calls == [] and not (backend.home / "runs").exists()


def test_refused_submission_is_a_backend_error(backend: SlurmBackend, fake: FakeSlurm) -> None:
    fake.refuse = "sbatch exited 1: Requested node configuration is not available"
    with pytest.raises(BackendError, match="node configuration"):
        backend.start_group(launches(backend.home, TWO))


def test_events_become_facts_once_each(backend: SlurmBackend, fake: FakeSlurm) -> None:
    group = _running(backend, fake, "master", "worker")
    _emit(backend, group[0].key, "INITIALIZING")
    _emit(backend, group[0].key, "RUNNING")
    assert _kinds(backend.poll()) == [
        ("master", FactKind.INITIALIZING),
        ("master", FactKind.RUNNING),
    ]
    _emit(backend, group[0].key, "EXITED", 0)
    facts = backend.poll()
    assert _kinds(facts) == [("master", FactKind.EXITED)] and facts[0].exit_code == 0
    assert backend.poll() == []


def test_job_that_ended_without_the_runner_reporting_is_lost(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = launches(backend.home, TWO)
    backend.start_group(group)
    fake.states["100"] = ("NODE_FAIL", "None")
    facts = backend.poll()
    assert sorted(_kinds(facts)) == [("master", FactKind.LOST), ("worker", FactKind.LOST)]
    assert "NODE_FAIL" in facts[0].message
    assert backend.poll() == []


def test_boot_failure_is_a_start_error(backend: SlurmBackend, fake: FakeSlurm) -> None:
    backend.start_group(launches(backend.home, {"a": TaskResources()}))
    fake.states["100"] = ("BOOT_FAIL", "None")
    assert _kinds(backend.poll()) == [("a", FactKind.START_ERROR)]


def test_job_forgotten_by_slurm_is_lost(backend: SlurmBackend, fake: FakeSlurm) -> None:
    backend.start_group(launches(backend.home, {"a": TaskResources()}))
    del fake.states["100"]
    assert _kinds(backend.poll()) == [("a", FactKind.LOST)]


def test_step_gone_while_job_runs_is_lost_but_not_before_it_started(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = _running(backend, fake, "master")
    _emit(backend, group[0].key, "INITIALIZING")
    assert _kinds(backend.poll()) == [("master", FactKind.INITIALIZING)]
    fake.step_names["100"] = {"worker": "100.1"}
    assert _kinds(backend.poll()) == [("master", FactKind.LOST)]


def test_exit_written_during_the_grace_period_wins(tmp_path: Path, fake: FakeSlurm) -> None:
    pool = POOL.model_copy(update={"options": {**POOL.options, "lost_grace_s": 60}})
    backend = SlurmBackend(pool, tmp_path, commands=fake, python="python3")
    group = launches(tmp_path, {"a": TaskResources()})
    backend.start_group(group)
    fake.states["100"] = ("COMPLETED", "None")
    assert backend.poll() == []
    _emit(backend, group[0].key, "EXITED", 3)
    assert _kinds(backend.poll()) == [("a", FactKind.EXITED)]


def test_squeue_failure_reports_nothing_and_raises_nothing(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    backend.start_group(launches(backend.home, TWO))
    fake.squeue_down = True
    assert backend.poll() == []


def test_squeue_is_asked_at_most_every_status_interval(tmp_path: Path, fake: FakeSlurm) -> None:
    pool = POOL.model_copy(update={"options": {"status_interval_s": 3600}})
    backend = SlurmBackend(pool, tmp_path, commands=fake, python="python3")
    backend.start_group(launches(tmp_path, TWO))
    for _ in range(5):
        backend.poll()
    assert [c[0] for c in fake.calls].count("squeue") == 1


def test_stopping_every_live_attempt_cancels_the_job(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = launches(backend.home, TWO)
    backend.start_group(group)
    backend.stop([launch.key for launch in group])
    backend.stop([launch.key for launch in group])
    assert fake.cancelled() == ["100", "100"]


def test_stopping_part_of_a_job_cancels_those_steps_only(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = _running(backend, fake, "master", "worker")
    backend.stop([group[1].key])
    assert fake.cancelled() == ["100.1"]


def test_stopping_a_step_that_has_not_started_cancels_it_when_it_shows(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = _running(backend, fake, "master")
    backend.stop([group[1].key])
    assert fake.cancelled() == []
    fake.step_names["100"] = {"master": "100.0", "worker": "100.1"}
    backend.poll()
    assert fake.cancelled() == ["100.1"]


def test_a_new_backend_recovers_attempts_from_the_index(
    backend: SlurmBackend, fake: FakeSlurm, tmp_path: Path
) -> None:
    group = launches(tmp_path, TWO)
    backend.start_group(group)
    fake.states["100"] = ("RUNNING", "None")
    again = SlurmBackend(POOL, tmp_path, commands=fake, python="python3")
    unknown = TaskKey("train-1", "ghost", 0)
    assert again.recover([group[0].key, unknown]) == [group[0].key]
    _emit(again, group[0].key, "INITIALIZING")
    fake.step_names["100"] = {"master": "100.0", "worker": "100.1"}
    assert sorted(_kinds(again.poll())) == [
        ("ghost", FactKind.LOST),
        ("master", FactKind.INITIALIZING),
    ]
    again.stop([group[1].key])
    assert fake.cancelled() == ["100.1"]


def test_restart_in_place_moves_the_earlier_sandbox_and_output(
    backend: SlurmBackend, tmp_path: Path
) -> None:
    first = launches(tmp_path, {"a": TaskResources()})
    backend.start_group(first)
    (first[0].run_dir / "sandbox" / "root" / "kept.txt").write_text("state")
    (first[0].run_dir / "output" / "models").mkdir(parents=True)
    (first[0].run_dir / "output" / "models" / "snapshot.pth").write_text("epoch 3")
    again = launches(tmp_path, {"a": TaskResources()}, retry_id=1)
    again[0].restart_in_place = True
    backend.start_group(again)
    assert (again[0].run_dir / "sandbox" / "root" / "kept.txt").read_text() == "state"
    assert (again[0].run_dir / "output" / "models" / "snapshot.pth").read_text() == "epoch 3"
    assert (again[0].run_dir / "sandbox" / "root" / "tmp").is_dir()


def test_restart_in_place_takes_each_folder_from_the_latest_attempt_that_has_it(
    backend: SlurmBackend, tmp_path: Path
) -> None:
    first = launches(tmp_path, {"a": TaskResources()})
    backend.start_group(first)
    (first[0].run_dir / "output").mkdir()
    (first[0].run_dir / "output" / "from-0.txt").write_text("0")
    second = launches(tmp_path, {"a": TaskResources()}, retry_id=1)  # a fresh start: no move
    backend.start_group(second)
    assert not (second[0].run_dir / "output").exists()
    (second[0].run_dir / "sandbox" / "root" / "from-1.txt").write_text("1")
    third = launches(tmp_path, {"a": TaskResources()}, retry_id=2)
    third[0].restart_in_place = True
    backend.start_group(third)
    assert (third[0].run_dir / "output" / "from-0.txt").read_text() == "0"
    assert (third[0].run_dir / "sandbox" / "root" / "from-1.txt").read_text() == "1"


def test_a_start_made_again_keeps_the_files_it_already_took_over(
    backend: SlurmBackend, tmp_path: Path
) -> None:
    first = launches(tmp_path, {"a": TaskResources()})
    backend.start_group(first)
    (first[0].run_dir / "output").mkdir()
    (first[0].run_dir / "output" / "old.txt").write_text("old")
    again = launches(tmp_path, {"a": TaskResources()}, retry_id=1)
    again[0].restart_in_place = True
    backend.start_group(again)
    (again[0].run_dir / "output" / "new.txt").write_text("new")
    backend.start_group(again)  # after an engine restart: the same attempt once more
    assert sorted(p.name for p in (again[0].run_dir / "output").iterdir()) == ["new.txt", "old.txt"]


def test_host_of_is_the_placed_nodes_host_name_until_slurm_says(backend: SlurmBackend) -> None:
    key = TaskKey("w", "t", 0)
    assert backend.host_of(key, "ty-node1") == "ty-node1"
    assert backend.host_of(key, "ty-node2") == "gpu-b02"


SECRET = "slurmScrub_9f9f_value"
DATA_SECRET = "dataScrub_7a7a_value"


def _with_credentials(group: list) -> list:
    for launch in group:
        launch.run["credentials"] = [
            {"name": "hf", "env": {"HF_TOKEN": "token"}, "values": {"token": SECRET}}
        ]
        launch.run["data_credentials"] = [
            {"endpoint": "s3://b", "access_key_id": "AKIDXX", "access_key": DATA_SECRET}
        ]
    return group


def _holds_secret(group: list) -> list[str]:
    return [
        launch.key.task
        for launch in group
        if SECRET in (text := (launch.run_dir / "run.json").read_text()) or DATA_SECRET in text
    ]


def test_stopping_an_attempt_before_its_runner_read_run_json_scrubs_its_credentials(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    """Issue 25: a job cancelled while pending never runs the runner, which is what takes
    the values out of run.json (0600 but on shared storage, kept): stop takes them out."""
    group = _with_credentials(launches(backend.home, TWO))
    backend.start_group(group)
    assert _holds_secret(group) == ["master", "worker"]  # delivered for the runner
    backend.stop([launch.key for launch in group])
    assert _holds_secret(group) == []
    run = json.loads((group[0].run_dir / "run.json").read_text())
    assert run["credentials"][0]["name"] == "hf" and run["credentials"][0]["values"] is None
    assert oct((group[0].run_dir / "run.json").stat().st_mode & 0o777) == "0o600"


def test_an_attempt_whose_job_ended_without_its_runner_keeps_no_credential(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = _with_credentials(launches(backend.home, TWO))
    backend.start_group(group)
    fake.states["100"] = ("CANCELLED", "None")  # e.g. scancel by an admin, while pending
    assert sorted(_kinds(backend.poll()))[0][1] is not None
    assert _holds_secret(group) == []
