"""A pending Slurm job's reason (squeue ``%r``) is the attempt's waiting reason (issue 28):
the backend says why the gang's job waits, in Slurm's word and in plain words."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_support import FakeSlurm, launches

from trainyard.backends.base import TaskResources
from trainyard.backends.slurm import SlurmBackend
from trainyard.backends.slurm.commands import Holder, expand_hostlist, parse_holders
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


def test_a_job_waiting_for_resources_names_the_jobs_it_waits_behind(
    backend: SlurmBackend, fake: FakeSlurm
) -> None:
    group = launches(backend.home, {"t": TaskResources(cpu=1)})
    backend.start_group(group)
    key = group[0].key
    fake.holding = [Holder("7", "gpu-hog", "bob", "ty-node1")]
    fake.states["100"] = ("PENDING", "Resources")
    backend.poll()
    why = backend.waiting_reason(key)
    assert why.startswith("Slurm job 100 is PENDING (Resources): it waits for resources"), why
    assert why.endswith("; behind Slurm job 7 'gpu-hog' of bob on ty-node1"), why
    fake.states["100"] = ("PENDING", "BeginTime")  # another reason: nobody to wait behind
    backend.poll()
    assert "behind" not in backend.waiting_reason(key)
    fake.states["100"], fake.squeue_down = ("PENDING", "Resources"), False
    fake.holding = [Holder(str(j), "j", "u", "n1") for j in range(5)]
    backend.poll()
    assert backend.waiting_reason(key).endswith("Slurm job 2 'j' of u on n1 and 2 more")


def test_hostlists_and_running_jobs_are_read_from_squeues_words() -> None:
    assert expand_hostlist("ty-node[1-2,5],gpu3") == {"ty-node1", "ty-node2", "ty-node5", "gpu3"}
    assert expand_hostlist("n[08-10]") == {"n08", "n09", "n10"}
    assert expand_hostlist("") == set()
    running = "7|hog|bob|ty-node[1-2]\n8|small|ann|ty-node2\n\n9|far|cy|other1\n"
    assert [h.job_id for h in parse_holders(running, {"ty-node1"})] == ["7"]
    assert [h.job_id for h in parse_holders(running, None)] == ["7", "8", "9"]
    assert parse_holders(running, {"ty-node2"})[1] == Holder("8", "small", "ann", "ty-node2")
