"""The batch request: golden scripts, and the script run by bash against fake Slurm commands
(so shell quoting of awkward paths is checked by a real shell, not by eye)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from slurm_support import WEIRD_HOME, WEIRD_PYTHON, check_golden, launches

from trainyard.backends.base import TaskResources
from trainyard.backends.slurm import SlurmOptions, build_request
from trainyard.backends.slurm.script import HOSTS_ENV, SlurmBatchRequest
from trainyard.runfile import TaskRun

GiB = 1024**3
EVEN = TaskResources(cpu=2, gpu=1, memory_bytes=4 * GiB)
FULL_OPTIONS = SlurmOptions(
    partition="batch",
    account="ml-team",
    qos="high",
    sbatch_args=["--exclusive", "--comment=a b"],
    srun_args=["--mpi=none"],
)


def _request(
    tasks: dict[str, TaskResources],
    options: SlurmOptions | None = None,
    home: Path = WEIRD_HOME,
    **fields: object,
) -> SlurmBatchRequest:
    return build_request(
        launches(home, tasks, **fields), options or SlurmOptions(), home, WEIRD_PYTHON
    )


def test_homogeneous_gang_golden() -> None:
    request = _request({"master": EVEN, "worker": EVEN}, FULL_OPTIONS, exec_timeout_s=3600)
    check_golden("homogeneous.txt", request.render())


def test_heterogeneous_gang_golden() -> None:
    small = TaskResources(cpu=0.5, memory_bytes=1000)
    request = _request(
        {"server": EVEN, "client": small, "probe": TaskResources()}, exec_timeout_s=90
    )
    assert request.heterogeneous
    check_golden("heterogeneous.txt", request.render())


def test_single_task_without_resources_or_timeout_golden() -> None:
    check_golden("single.txt", _request({"hello": TaskResources()}).render())


def test_mixed_resources_max_gives_every_node_the_largest_request() -> None:
    small = TaskResources(cpu=1, memory_bytes=GiB)
    request = _request({"a": EVEN, "b": small}, SlurmOptions(mixed_resources="max"))
    assert not request.heterogeneous
    assert request.header[-5:] == [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --mem=4096M",
        "#SBATCH --gres=gpu:1",
    ]


def test_requests_option_drops_resources_slurm_is_not_asked_for() -> None:
    request = _request(
        {"a": EVEN, "b": TaskResources(cpu=2, gpu=8, memory_bytes=4 * GiB)},
        SlurmOptions(requests=["memory"]),
    )
    assert not request.heterogeneous
    assert [h for h in request.header if "cpus" in h or "gres" in h] == []
    assert "#SBATCH --mem=4096M" in request.header


def test_time_limit_is_exec_timeout_plus_margin_in_whole_minutes() -> None:
    request = _request({"a": TaskResources()}, SlurmOptions(time_margin_s=30), exec_timeout_s=61)
    assert "#SBATCH --time=2" in request.header


def test_paths_never_go_on_sbatch_lines() -> None:
    script = _request({"a": EVEN, "b": EVEN}, FULL_OPTIONS).script
    sbatch_lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert not any(str(WEIRD_HOME) in line for line in sbatch_lines)


def test_percent_in_paths_is_doubled_for_slurm_file_names() -> None:
    request = _request({"a": TaskResources()})
    assert any(a.startswith("--output=") and "%%j" in a for a in request.steps[0].argv)
    assert request.sbatch_argv[3].endswith("%%j/runs/train-1/_slurm/training/a.0/slurm-%j.out")


def test_runner_input_reads_hosts_from_the_environment_and_has_a_private_root() -> None:
    request = _request({"a": TaskResources(), "b": TaskResources()})
    run = next(iter(request.runs.values()))
    assert run.hosts_env == HOSTS_ENV
    assert run.sandbox.root == f"{WEIRD_HOME}/runs/train-1/a/0/sandbox/root"
    assert run.sandbox.command_prefix == []


def test_tasks_get_the_server_url_when_there_is_one() -> None:
    launched = launches(WEIRD_HOME, {"a": TaskResources()})
    plain = build_request(launched, SlurmOptions(), WEIRD_HOME, WEIRD_PYTHON)
    assert next(iter(plain.runs.values())).sandbox.env == {}
    served = build_request(
        launched, SlurmOptions(), WEIRD_HOME, WEIRD_PYTHON, server_url="http://head:8765"
    )
    env = next(iter(served.runs.values())).sandbox.env
    assert env == {"TRAINYARD_SERVER_URL": "http://head:8765"}


def test_container_runtime_prefixes_the_command_with_apptainer_exec() -> None:
    options = SlurmOptions(container="apptainer", container_args=["--nv"])
    run = next(iter(_request({"a": TaskResources()}, options, image="ubuntu:22.04").runs.values()))
    assert run.sandbox.command_prefix == [
        "apptainer",
        "exec",
        "--cleanenv",
        "--nv",
        "--bind",
        f"{WEIRD_HOME}/runs",
        "docker://ubuntu:22.04",
    ]
    # the task's variables reach the container in an env file, not apptainer's environment
    assert (run.sandbox.env_flag, run.sandbox.env_file_shell) == ("--env-file", True)
    sif = next(iter(_request({"a": TaskResources()}, options, image="/img/u.sif").runs.values()))
    assert sif.sandbox.command_prefix[-1] == "/img/u.sif"


def test_an_empty_gang_is_refused() -> None:
    with pytest.raises(ValueError):
        build_request([], SlurmOptions(), WEIRD_HOME, WEIRD_PYTHON)


# --------------------------------------------------------------------------- run by bash

FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") tr ',' '\\n' <<<"$3" ;;
  "-o show") IFS=, read -ra n <<<"$4"; for x in "${n[@]}"; do
      echo "NodeName=$x Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.${x##*node} NodeHostName=$x Port=0"; done ;;
esac
"""

FAKE_SRUN = (
    """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD"], "a") as out:
    out.write(json.dumps({"argv": ["srun", *sys.argv[1:]], "hosts": os.environ.get("%s")}) + "\\n")
"""
    % HOSTS_ENV
)


def _run_script(request: SlurmBatchRequest, tmp_path: Path, env: dict[str, str]) -> list[dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(request.script)
    record = tmp_path / "record.jsonl"
    full_env = {
        **os.environ,
        **env,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RECORD": str(record),
    }
    subprocess.run(["bash", str(script)], env=full_env, check=True, timeout=30)
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_bash_runs_each_srun_step_with_exact_arguments_and_the_hosts(tmp_path: Path) -> None:
    home = tmp_path / "it's a \"weird\" home $HOME %j"
    request = _request({"master": EVEN, "worker": EVEN}, FULL_OPTIONS, home=home)
    calls = _run_script(request, tmp_path, {"SLURM_JOB_NODELIST": "node1,node2"})
    assert sorted(c["argv"] for c in calls) == sorted(step.argv for step in request.steps)
    assert {json.dumps(json.loads(c["hosts"]), sort_keys=True) for c in calls} == {
        json.dumps({"master": "10.0.0.1", "worker": "10.0.0.2"}, sort_keys=True)
    }


def test_bash_maps_heterogeneous_components_to_their_nodes(tmp_path: Path) -> None:
    request = _request({"a": EVEN, "b": TaskResources(cpu=1)})
    env = {
        "SLURM_JOB_NODELIST_HET_GROUP_0": "node7",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "node3",
        "SLURM_JOB_NODELIST": "node7",
    }
    calls = _run_script(request, tmp_path, env)
    assert json.loads(calls[0]["hosts"]) == {"a": "10.0.0.7", "b": "10.0.0.3"}
    assert sorted(c["argv"][1] for c in calls) == ["--het-group=0", "--het-group=1"]


def test_the_runner_merges_the_hosts_variable_over_its_hosts() -> None:
    run = TaskRun(
        workflow_id="w",
        group="g",
        task="a",
        command=["true"],
        run_dir="/r",
        hosts={"a": "placeholder", "b": "placeholder"},
        hosts_env=HOSTS_ENV,
    )
    assert run.runtime_hosts({HOSTS_ENV: '{"a": "10.0.0.1"}'}) == {
        "a": "10.0.0.1",
        "b": "placeholder",
    }
    assert run.runtime_hosts({HOSTS_ENV: "not json"}) == run.hosts
    assert run.runtime_hosts({}) == run.hosts


def test_render_shows_the_command_line_shell_quoted() -> None:
    request = _request({"a": TaskResources()}, FULL_OPTIONS)
    first = request.render().splitlines()[0]
    assert shlex.split(first[2:]) == request.sbatch_argv
