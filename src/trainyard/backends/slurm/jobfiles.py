"""The files a gang's Slurm job needs on the shared filesystem, written before ``sbatch``:
each task's run folder (fresh events, a private ``/tmp``, its ``run.json``, 0600) and the
batch script in the job folder. A RESTART in place (exit action) first takes over the task's
sandbox and ``{{output}}`` folder from its latest earlier attempt (``ADOPTED``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainyard.backends.attempts import write_private
from trainyard.backends.base import TaskKey
from trainyard.backends.slurm.script import SlurmBatchRequest
from trainyard.runner.report import EVENTS

__all__ = ["ADOPTED", "write_job_files"]

ADOPTED = ("sandbox", "output")
"""Folders of a run folder that a RESTART in place takes over from the attempt before."""

EarlierRunDirs = Callable[[TaskKey, Path], list[Path]]
"""``(key, run_dir) -> run folders of the task's earlier attempts, latest first``."""


def write_job_files(request: SlurmBatchRequest, earlier_run_dirs: EarlierRunDirs) -> None:
    """Write the run folders of ``request``'s tasks and its batch script (run files and
    script private, 0600); ``earlier_run_dirs`` names where a RESTART in place finds the
    task's files. Raises OSError."""
    request.job_dir.mkdir(parents=True, exist_ok=True)
    for launch in request.launches:
        run_dir = Path(launch.run_dir)
        _fresh_run_dir(run_dir)
        if launch.restart_in_place:
            _adopt_files(run_dir, earlier_run_dirs(launch.key, run_dir))
        _private_tmp(run_dir)
        run = request.runs[launch.key]
        write_private(run_dir / "run.json", run.model_dump_json())
    write_private(request.script_path, request.script)


def _fresh_run_dir(run_dir: Path) -> None:
    """Make the run folder; set aside events of an earlier use."""
    run_dir.mkdir(parents=True, exist_ok=True)
    events = run_dir / EVENTS
    if events.exists():
        events.rename(run_dir / f"events.{time.time_ns()}.jsonl")


def _adopt_files(run_dir: Path, earlier: list[Path]) -> None:
    """RESTART in place: move each of ``ADOPTED`` (sandbox, ``{{output}}``) into ``run_dir``
    from the first of ``earlier`` (run folders, latest first) that has it; a folder
    ``run_dir`` already has is left alone (a start made again after an engine restart)."""
    for name in ADOPTED:
        found = next((d / name for d in earlier if (d / name).is_dir()), None)
        if found is not None and not (run_dir / name).exists():
            found.rename(run_dir / name)


def _private_tmp(run_dir: Path) -> None:
    """The task's private ``/tmp`` (``sandbox/root/tmp``, sticky and world-writable)."""
    tmp = run_dir / "sandbox" / "root" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o1777)
