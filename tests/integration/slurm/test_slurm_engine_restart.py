"""An engine that dies while starting a gang on the Slurm test cluster, and the engine after
it: a gang never submitted is started (not reported LOST); a gang submitted just before the
death is found in Slurm's queue by its job name and folder and adopted, not submitted twice.
Also: squeue finds a job by name and working directory whatever its path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from trainyard import spec
from trainyard.backends.slurm import SlurmBackend
from trainyard.backends.slurm.commands import SlurmCommands
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import Pool
from trainyard.status import Status
from trainyard.store import Store

pytest_plugins = ["slurm_fixtures"]

pytestmark = pytest.mark.slow

SPEC = """workflow:
  name: {name}
  groups:
  - name: pair
    tasks:
    - {{name: lead, lead: true, command: [sh, -c, "echo lead ran; sleep 2"]}}
    - {{name: other, command: [sh, -c, "echo other ran"]}}
"""


class Crash(BaseException):
    """The engine's process dies here."""


class DyingSlurm(SlurmCommands):
    """Slurm's real commands; ``submit`` dies before sbatch (``when="before"``) or right
    after sbatch queued the job (``"after"``)."""

    def __init__(self, slurm_conf: str | None, when: str) -> None:
        super().__init__(slurm_conf)
        self.when = when

    def submit(self, argv: list[str]) -> str:
        if self.when == "before":
            raise Crash
        super().submit(argv)
        raise Crash


def _engine(home: Path, pool: Pool, dying: str | None = None) -> Engine:
    conf = pool.options.get("slurm_conf")
    factory = (
        None
        if dying is None
        else (lambda p, h: SlurmBackend(p, h, commands=DyingSlurm(conf, dying)))
    )
    return Engine(
        Store(f"sqlite:///{home / 'db.sqlite'}"),
        home,
        pools={pool.name: pool},
        backend_factory=factory,
    )


def _die_while_starting(home: Path, pool: Pool, when: str) -> str:
    path = home / "pair.yaml"
    path.write_text(SPEC.format(name=f"restart-{when}"))
    doc = spec.load(path, pool=pool)
    engine = _engine(home, pool, when)
    wid = engine.submit(
        Submission(spec=doc.workflow, spec_text=path.read_text(), user="t", pool=pool)
    ).id
    with pytest.raises(Crash):
        for _ in range(100):
            engine.step()
    return wid


def _jobs_of(pool: Pool, wid: str) -> dict[str, str]:
    return SlurmCommands(pool.options.get("slurm_conf")).jobs_named(f"trainyard:{wid}:pair")


def _finished(home: Path, pool: Pool, wid: str) -> Engine:
    engine = _engine(home, pool)
    record = engine.wait(wid, timeout_s=120)
    assert record.status == "COMPLETED", engine.state(wid)
    assert all(
        (t.status, t.retry_id) == (Status.COMPLETED, 0) for t in engine.state(wid).tasks.values()
    )
    return engine


def test_a_gang_never_submitted_is_started_by_the_next_engine(
    slurm_pool: Pool, runner_home: Path, tmp_path: Path
) -> None:
    wid = _die_while_starting(tmp_path, slurm_pool, "before")
    for record in (tmp_path / "slurm" / "attempts" / wid).rglob("*.json"):
        assert json.loads(record.read_text())["job_id"] is None  # written before sbatch
        record.write_text(json.dumps({**json.loads(record.read_text()), "submit_by": 0}))
    engine = _finished(tmp_path, slurm_pool, wid)
    assert len(_jobs_of(slurm_pool, wid)) == 1
    assert "lead ran" in (engine.run_dir(wid, "lead", 0) / "task.log").read_text()


def test_a_gang_submitted_before_the_death_is_adopted_not_submitted_again(
    slurm_pool: Pool, runner_home: Path, tmp_path: Path
) -> None:
    wid = _die_while_starting(tmp_path, slurm_pool, "after")
    (job,) = _jobs_of(slurm_pool, wid)
    engine = _finished(tmp_path, slurm_pool, wid)
    assert list(_jobs_of(slurm_pool, wid)) == [job]
    record = json.loads((tmp_path / "slurm" / "attempts" / wid / "other" / "0.json").read_text())
    assert record["job_id"] == job
    assert "other ran" in (engine.run_dir(wid, "other", 0) / "task.log").read_text()


def test_squeue_finds_a_job_by_name_and_awkward_working_directory(
    slurm_pool: Pool, weird_home: Path
) -> None:
    conf = slurm_pool.options.get("slurm_conf")
    env = {**os.environ, **({"SLURM_CONF": str(conf)} if conf else {})}
    name = f"trainyard:lookup-{os.getpid()}:g"
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--chdir={weird_home}",
            f"--partition={slurm_pool.options['partition']}",
            "--output=/dev/null",
            "--wrap=true",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    ).stdout.strip()
    assert SlurmCommands(conf).jobs_named(name) == {job: str(weird_home)}
