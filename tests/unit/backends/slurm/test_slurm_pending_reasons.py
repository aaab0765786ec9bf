"""A pending Slurm job's reason (squeue ``%r``) is the attempt's waiting reason (issue 28):
the backend says why the gang's job waits, in Slurm's word and in plain words."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_support import FakeSlurm, launches

from trainyard.backends.base import TaskResources
from trainyard.backends.slurm import SlurmBackend
from trainyard.backends.slurm.states import pending_reason
from trainyard.pools import NodeSpec, Pool

POOL = Pool(
    name="slurm-pool",
    backend="slurm",
    nodes=[NodeSpec(name="ty-node1")],
    options={"partition": "batch", "lost_grace_s": 0, "status_interval_s": 1e-9},
)


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def backend(tmp_path: Path, fake: FakeSlurm) -> SlurmBackend:
    return SlurmBackend(POOL, tmp_path, commands=fake, python="/usr/bin/python3")


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("Resources", "waits for resources"),
        ("Priority", "higher priority"),
        ("ReqNodeNotAvail", "not available"),
        ("QOSMaxJobsPerUserLimit", "per user"),
        ("SomethingNew", "SomethingNew"),
    ],
)
def test_each_reason_is_said_in_slurms_word_and_plain_words(reason: str, words: str) -> None:
    text = pending_reason("100", reason)
    assert text.startswith(f"Slurm job 100 is PENDING ({reason})") and words in text, text


def test_a_pending_job_gives_its_tasks_a_waiting_reason_until_it_runs(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = launches(backend.home, {"t": TaskResources(cpu=1)})
    backend.start_group(group)
    key = group[0].key
    assert backend.waiting_reason(key) == ""
    fake.states["100"] = ("PENDING", "Resources")
    backend.poll()
    assert backend.waiting_reason(key).startswith("Slurm job 100 is PENDING (Resources)")
    fake.states["100"] = ("RUNNING", "None")
    fake.step_names["100"] = {"t": "100.0"}
    backend.poll()
    assert backend.waiting_reason(key) == ""
