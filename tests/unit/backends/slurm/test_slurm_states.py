"""The Slurm state table and the parsers of recorded Slurm command output."""

from __future__ import annotations

import pytest

from trainyard.backends.base import FactKind
from trainyard.backends.slurm.commands import (
    base_job_id,
    parse_sacct,
    parse_sbatch,
    parse_squeue,
    parse_steps,
    parse_workdirs,
)
from trainyard.backends.slurm.options import parse_options
from trainyard.backends.slurm.states import SLURM_STATES, UNKNOWN, fact_for_state, is_alive
from trainyard.errors import BackendError, ConfigError

# squeue(1) "JOB STATE CODES" as of Slurm 22.05-23.11
SQUEUE_STATES = [
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "CONFIGURING",
    "COMPLETING",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PENDING",
    "PREEMPTED",
    "RUNNING",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "REQUEUED",
    "RESIZING",
    "REVOKED",
    "SIGNALING",
    "SPECIAL_EXIT",
    "STAGE_OUT",
    "STOPPED",
    "SUSPENDED",
    "TIMEOUT",
]


def test_every_documented_state_is_in_the_table() -> None:
    assert sorted(SLURM_STATES) == sorted(SQUEUE_STATES)


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"])
def test_alive_states_give_no_fact(state: str) -> None:
    assert is_alive(state)


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("COMPLETED", FactKind.LOST),
        ("CANCELLED by 0", FactKind.LOST),
        ("TIMEOUT", FactKind.LOST),
        ("NODE_FAIL", FactKind.LOST),
        ("OUT_OF_MEMORY", FactKind.LOST),
        ("FAILED", FactKind.LOST),
        ("BOOT_FAIL", FactKind.START_ERROR),
        ("COMPLETED+", FactKind.LOST),
        (UNKNOWN, FactKind.LOST),
        ("SOMETHING_NEW", FactKind.LOST),
    ],
)
def test_ended_and_unknown_states(state: str, kind: FactKind) -> None:
    assert not is_alive(state)
    assert fact_for_state(state) is kind


def test_sbatch_parsable_output() -> None:
    assert parse_sbatch("1234\n") == "1234"
    assert parse_sbatch("1234;cluster-a\n") == "1234"
    with pytest.raises(BackendError):
        parse_sbatch("sbatch: error: Batch job submission failed\n")


def test_squeue_output_with_heterogeneous_components() -> None:
    recorded = "12|RUNNING|None\n13+0|RUNNING|None\n13+1|PENDING|Resources\n14|COMPLETED|None\n"
    assert parse_squeue(recorded) == {
        "12": ("RUNNING", "None"),
        "13": ("PENDING", "Resources"),
        "14": ("COMPLETED", "None"),
    }


def test_squeue_steps_output() -> None:
    recorded = "11.0|beta\n11.1|alpha\n11.batch|batch\n13+1.0|client\n"
    assert parse_steps(recorded) == {
        "11": {"beta": "11.0", "alpha": "11.1", "batch": "11.batch"},
        "13": {"client": "13+1.0"},
    }


def test_sacct_output() -> None:
    assert parse_sacct("7|CANCELLED by 0\n8|COMPLETED\n8.batch|COMPLETED\n") == {
        "7": "CANCELLED by 0",
        "8": "COMPLETED",
    }


def test_squeue_workdir_output_keeps_awkward_paths_whole() -> None:
    recorded = "21|/shared/it's a \"weird\" home $HOME %j/x|y\n22+0|/a b\n22+1|/a b\n"
    assert parse_workdirs(recorded) == {
        "21": "/shared/it's a \"weird\" home $HOME %j/x|y",
        "22": "/a b",
    }


def test_base_job_id() -> None:
    assert [base_job_id(j) for j in ("5", "5+1", "5.0", "5+1.2", "5_3")] == ["5"] * 5


def test_bad_pool_options_name_the_pool_and_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        parse_options("gpu-pool", {"partiton": "batch"})
    assert "gpu-pool" in str(err.value) and "partition" in str(err.value)
    with pytest.raises(ConfigError):
        parse_options("gpu-pool", {"partition": "batch; rm -rf /"})
