"""Helpers for Slurm backend unit tests: launches under awkward paths, a recording fake of
Slurm's commands, golden-file comparison."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.backends.base import TaskKey, TaskLaunch, TaskResources
from trainyard.backends.slurm.commands import Holder, SlurmCommands
from trainyard.errors import BackendError

GOLDEN = Path(__file__).parent / "golden"
WEIRD_HOME = Path("/shared/it's a \"weird\" home $HOME %j")
WEIRD_PYTHON = "/opt/try yard/bin/python"


def launches(
    home: Path,
    tasks: dict[str, TaskResources],
    *,
    workflow_id: str = "train-1",
    group: str = "training",
    retry_id: int = 0,
    exec_timeout_s: float | None = None,
    image: str | None = None,
) -> list[TaskLaunch]:
    """One launch per task of a gang, run folders under ``home/runs``."""
    names = list(tasks)
    out = []
    for index, (name, res) in enumerate(tasks.items()):
        run_dir = home / "runs" / workflow_id / name / str(retry_id)
        run: dict[str, Any] = {
            "workflow_id": workflow_id,
            "group": group,
            "task": name,
            "retry_id": retry_id,
            "lead": index == 0,
            "lead_task": names[0],
            "image": image,
            "command": ["sh", "-c", "echo hi"],
            "hosts": {n: "placeholder" for n in names},
            "group_tasks": names,
            "task_index": index,
            "run_dir": str(run_dir),
        }
        out.append(
            TaskLaunch(
                key=TaskKey(workflow_id, name, retry_id),
                group=group,
                node=f"ty-node{index + 1}",
                run_dir=run_dir,
                run=run,
                resources=res,
                exec_timeout_s=exec_timeout_s,
            )
        )
    return out


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``golden/<name>``; ``UPDATE_GOLDEN=1`` rewrites the file."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{name} differs from its golden file (UPDATE_GOLDEN=1)"


class Crash(BaseException):
    """The engine's process dies here (nothing after it runs)."""


@dataclass
class FakeSlurm(SlurmCommands):
    """Slurm's commands, scripted: jobs get ids 100, 101, ...; states and steps are set by
    the test; every call is recorded in ``calls``. ``crash`` makes ``submit`` die before
    sbatch runs (``"before"``) or after the job is queued (``"after"``)."""

    states: dict[str, tuple[str, str]] = field(default_factory=dict)
    step_names: dict[str, dict[str, str]] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    refuse: str | None = None
    squeue_down: bool = False
    crash: str | None = None
    next_id: int = 100
    named: dict[str, tuple[str, str]] = field(default_factory=dict)  # job -> (name, workdir)
    holding: list[Holder] = field(default_factory=list)  # running jobs pending ones wait behind

    def __post_init__(self) -> None:
        super().__init__(None)

    def submit(self, argv: list[str]) -> str:
        self.calls.append(("sbatch", *argv))
        if self.crash == "before":
            raise Crash
        if self.refuse:
            raise BackendError(self.refuse)
        job = str(self.next_id)
        self.next_id += 1
        self.states[job] = ("PENDING", "None")
        self.named[job] = (_job_name(Path(argv[-1])), _chdir(argv))
        if self.crash == "after":
            raise Crash
        return job

    def jobs_named(self, name: str) -> dict[str, str]:
        self.calls.append(("squeue-name", name))
        if self.squeue_down:
            raise BackendError("squeue exited 1: Unable to contact slurm controller")
        return {j: d for j, (n, d) in self.named.items() if n == name and j in self.states}

    def job_states(self, job_ids: Any) -> dict[str, tuple[str, str]]:
        self.calls.append(("squeue", *sorted(job_ids)))
        if self.squeue_down:
            raise BackendError("squeue exited 1: Unable to contact slurm controller")
        return {j: self.states[j] for j in job_ids if j in self.states}

    def steps(self, job_ids: Any) -> dict[str, dict[str, str]]:
        self.calls.append(("steps", *sorted(job_ids)))
        return {j: self.step_names[j] for j in job_ids if j in self.step_names}

    def holders(self, job_id: str) -> list[Holder]:
        self.calls.append(("holders", job_id))
        if self.squeue_down:
            raise BackendError("squeue exited 1: Unable to contact slurm controller")
        return list(self.holding)

    def cancel(self, target: str) -> None:
        self.calls.append(("scancel", target))

    def cancelled(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "scancel"]


def _job_name(script: Path) -> str:
    """``--job-name`` of a batch script's ``#SBATCH`` lines."""
    prefix = "#SBATCH --job-name="
    return next(
        line[len(prefix) :] for line in script.read_text().splitlines() if line.startswith(prefix)
    )


def _chdir(argv: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith("--chdir="))
