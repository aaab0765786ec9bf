"""Slurm backend benchmark (issue 7), not a timed test.

Time from submit to every task of a 2-node group running, on the Slurm cluster of
``scripts/slurm-cluster.sh start`` (pool ``slurm-local``):

- trainyard: ``Engine.submit`` of a 2-task group (command ``sleep 60``) until both tasks are
  RUNNING in the engine (the runners passed the barrier and reported; the engine saw it), and
  until the later of the two runners' RUNNING events (when the commands started);
- the same job by hand: the batch script and runner inputs trainyard builds for that group
  (``SlurmBackend.build_request``), written to disk and submitted with the ``sbatch`` command
  line, until the later runner RUNNING event (trainyard's engine and store left out);
- bare Slurm by hand: ``sbatch`` of the same shape (``--nodes=2 --ntasks-per-node=1``, one
  ``srun --nodes=1 --ntasks=1 --relative=I`` step per task) whose steps write a time stamp and
  sleep (no task runner), until both stamps exist.

Each run waits for the previous job to leave the nodes. Goal: trainyard within 1 s of by hand.

Usage:
    scripts/slurm-cluster.sh start
    .venv/bin/python bench/slurm_submit.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.slurm import SlurmBackend
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import Pool, load_pools
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status
from trainyard.store import Store

SLURM_DIR = Path(os.environ.get("TRAINYARD_SLURM_DIR", "/tmp/trainyard-slurm"))

BY_HAND = """#!/bin/bash
#SBATCH --job-name=bench-by-hand
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
srun --nodes=1 --ntasks=1 --relative=0 bash -c 'date +%s.%N > {stamps}/0; sleep 60' &
srun --nodes=1 --ntasks=1 --relative=1 bash -c 'date +%s.%N > {stamps}/1; sleep 60' &
wait
"""


def _slurm(pool: Pool, *argv: str) -> str:
    env = {**os.environ, "SLURM_CONF": str(pool.options["slurm_conf"])}
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, check=True).stdout


def _wait_idle(pool: Pool) -> None:
    _slurm(pool, "scancel", "--user", os.environ.get("USER", "root"))
    while _slurm(pool, "squeue", "--noheader"):
        time.sleep(0.05)
    time.sleep(0.5)


def _gang() -> WorkflowSpec:
    tasks = [{"name": n, "command": ["sleep", "60"], "lead": n == "a"} for n in ("a", "b")]
    return WorkflowSpec.model_validate({"name": "bench", "groups": [{"name": "g", "tasks": tasks}]})


def _running_event_s(engine: Engine, wid: str) -> float:
    times = []
    for task in ("a", "b"):
        events = engine.run_dir(wid, task, 0) / "events.jsonl"
        lines = [json.loads(line) for line in events.read_text().splitlines()]
        times.append(next(e["time_s"] for e in lines if e["kind"] == "RUNNING"))
    return max(times)


def trainyard_once(engine: Engine, pool: Pool) -> tuple[float, float]:
    """(seconds to RUNNING seen by the engine, seconds to the later RUNNING event)."""
    wall = time.time()
    start = time.perf_counter()
    wid = engine.submit(Submission(_gang(), "", "bench", pool)).id
    while not all(t.status is Status.RUNNING for t in engine.state(wid).tasks.values()):
        engine.step()
        time.sleep(0.005)
    seen = time.perf_counter() - start
    engine.cancel(wid)
    return seen, _running_event_s(engine, wid) - wall


def _launches(home: Path, workflow_id: str) -> list[TaskLaunch]:
    names = ["a", "b"]
    out = []
    for index, name in enumerate(names):
        run_dir = home / "runs" / workflow_id / name / "0"
        run = {
            "workflow_id": workflow_id,
            "group": "g",
            "task": name,
            "lead": index == 0,
            "lead_task": "a",
            "command": ["sleep", "60"],
            "group_tasks": names,
            "task_index": index,
            "run_dir": str(run_dir),
            "barrier": {
                "enabled": True,
                "tasks": names,
                "folder": str(home / "runs" / workflow_id / "_barrier" / "g" / "0"),
            },
        }
        out.append(TaskLaunch(TaskKey(workflow_id, name, 0), "g", f"node{index}", run_dir, run))
    return out


def same_job_once(pool: Pool, home: Path, count: int) -> float:
    """Seconds from ``sbatch`` of trainyard's own script to the later RUNNING event."""
    launches = _launches(home, f"by-hand-{count}")
    request = SlurmBackend(pool, home).build_request(launches)
    for launch in launches:
        launch.run_dir.mkdir(parents=True)
        (launch.run_dir / "run.json").write_text(request.runs[launch.key].model_dump_json())
    request.job_dir.mkdir(parents=True)
    request.script_path.write_text(request.script)
    wall = time.time()
    _slurm(pool, *request.sbatch_argv)
    events = [launch.run_dir / "events.jsonl" for launch in launches]
    while not all(e.exists() and '"RUNNING"' in e.read_text() for e in events):
        time.sleep(0.005)
    return (
        max(
            json.loads(line)["time_s"]
            for e in events
            for line in e.read_text().splitlines()
            if '"RUNNING"' in line
        )
        - wall
    )


def by_hand_once(pool: Pool, folder: Path) -> float:
    """Seconds from sbatch to both steps' time stamps."""
    stamps = Path(tempfile.mkdtemp(dir=folder))
    script = stamps / "job.sbatch"
    script.write_text(BY_HAND.format(stamps=stamps))
    wall = time.time()
    _slurm(pool, "sbatch", "--parsable", f"--output={stamps}/out", str(script))
    while not all((stamps / str(i)).exists() and (stamps / str(i)).read_text() for i in (0, 1)):
        time.sleep(0.005)
    return max(float((stamps / str(i)).read_text()) for i in (0, 1)) - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    pool = load_pools(SLURM_DIR / "pools.yaml")["slurm-local"]
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        home = Path(tmp)
        engine = Engine(
            Store(f"sqlite:///{home / 'db'}"), home, pools={pool.name: pool}, poll_interval_s=0.005
        )
        seen, started, same_job, bare = [], [], [], []
        for count in range(args.repeat):
            _wait_idle(pool)
            engine_s, event_s = trainyard_once(engine, pool)
            seen.append(engine_s)
            started.append(event_s)
            _wait_idle(pool)
            same_job.append(same_job_once(pool, home, count))
            _wait_idle(pool)
            bare.append(by_hand_once(pool, home))
        _wait_idle(pool)
    for label, values in (
        ("trainyard, RUNNING in the engine", seen),
        ("trainyard, commands started (runner RUNNING events)", started),
        ("same job by hand: sbatch of trainyard's script", same_job),
        ("bare by hand: sbatch + 2 srun steps, no runner", bare),
    ):
        print(
            f"{label}: median {statistics.median(values):.3f} s, "
            f"min {min(values):.3f} s, max {max(values):.3f} s (n={len(values)})"
        )
    for label, values in (("same job by hand", same_job), ("bare by hand", bare)):
        print(
            f"trainyard (engine) - {label}, medians: "
            f"{statistics.median(seen) - statistics.median(values):+.3f} s"
        )


if __name__ == "__main__":
    main()
