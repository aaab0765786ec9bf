"""The manual launcher starts one process per slot with torchrun's environment."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from trainyard.training.launch import LaunchPlan, build_parser, launch, plan_from_args, worker_env

DUMP_ENV = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TRAINYARD_NODE", "OMP_NUM_THREADS"]
out = sys.argv[1]
with open(f"{out}/{os.environ['RANK']}.json", "w") as f:
    json.dump({**{k: os.environ.get(k) for k in keys}, "argv": sys.argv[2:]}, f)
"""


def _plan(**changes) -> LaunchPlan:
    base = dict(
        offset=2,
        size=2,
        world_size=4,
        master_addr="m",
        master_port=29400,
        command=(sys.executable, "-c", "pass"),
        node="n",
    )
    return LaunchPlan(**{**base, **changes})


def test_worker_environment_matches_torchrun() -> None:
    env = worker_env(_plan(), 1, {"PATH": "/bin"})
    assert {
        k: env[k]
        for k in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "OMP_NUM_THREADS",
        )
    } == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "m",
        "MASTER_PORT": "29400",
        "OMP_NUM_THREADS": "1",
    }
    assert worker_env(_plan(), 0, {"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"offset": 3}, "do not fit in --world_size 4"),
        ({"size": 0}, "--size must be at least 1"),
        ({"offset": -1}, "do not fit"),
        ({"master_port": 70000}, "--master_port"),
    ],
)
def test_inconsistent_plans_are_refused(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        _plan(**changes).check()


def test_the_command_line_passes_the_rest_to_the_target(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "--offset",
            "0",
            "--size",
            "1",
            "--world_size",
            "2",
            "-m",
            "trainyard.training.train",
            "--total_epochs",
            "3",
            "--lr",
            "0.1",
        ]
    )
    plan = plan_from_args(args)
    assert plan.command == (
        sys.executable,
        "-m",
        "trainyard.training.train",
        "--total_epochs",
        "3",
        "--lr",
        "0.1",
    )


def test_each_process_gets_its_rank(tmp_path: Path) -> None:
    script = tmp_path / "dump.py"
    script.write_text(DUMP_ENV)
    plan = _plan(
        offset=1,
        size=2,
        world_size=3,
        command=(sys.executable, str(script), str(tmp_path), "--x", "1"),
    )
    assert launch(plan, base_env={"PATH": "/usr/bin:/bin"}) == 0
    dumps = {int(p.stem): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(dumps) == [1, 2]
    assert [dumps[r]["LOCAL_RANK"] for r in (1, 2)] == ["0", "1"]
    assert {d["WORLD_SIZE"] for d in dumps.values()} == {"3"} and dumps[1]["argv"] == ["--x", "1"]


def test_one_failure_stops_the_others_and_sets_the_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "work.py"
    script.write_text(
        "import os, sys, time\nif os.environ['LOCAL_RANK'] == '1': sys.exit(7)\ntime.sleep(60)\n"
    )
    started = time.monotonic()
    code = launch(
        _plan(offset=0, size=3, world_size=3, command=(sys.executable, str(script))), grace_s=5
    )
    assert code == 7
    assert time.monotonic() - started < 20
