"""The engine's share of a sandboxed task's start (issue 11), not a timed test.

``LocalBackend.build_task_request`` turns a launch into the runner's input and the bubblewrap
prefix (the sandbox plan, its overlays, binds and folders given to the task): pure Python on
the engine's thread, once per task, before the launcher is asked. CPU time per call over
1,000 one-task launches as the 1,000-task throughput run makes them (``--profile``: where it
goes, cProfile, over another 1,000).

Usage:
    .venv/bin/python bench/sandbox_plan.py [--tasks 1000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from trainyard.backends.base import TaskKey, TaskLaunch
from trainyard.backends.local import Isolation, LocalBackend
from trainyard.backends.local.sandbox import warm_host_scans


def _launch(home: Path, index: int) -> TaskLaunch:
    run_dir = home / "runs" / "many-1" / f"t{index}" / "0"
    body = {
        "workflow_id": "many-1",
        "group": f"t{index}",
        "task": f"t{index}",
        "command": ["true"],
        "run_dir": str(run_dir),
        "hosts": {f"t{index}": "10.0.0.2"},
    }
    return TaskLaunch(
        TaskKey("many-1", f"t{index}", 0), f"t{index}", "local-0", run_dir, body, gpu_slots=[]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        backend = LocalBackend(home=home)
        isolation = Isolation(bwrap=True, netns=True)
        warm_host_scans()  # as the server does at its start
        launches = [_launch(home, i) for i in range(2 * args.tasks + 1)]
        backend.build_task_request(launches[0], isolation)  # first call: imports, probes
        start = time.process_time()
        for launch in launches[1 : args.tasks + 1]:
            backend.build_task_request(launch, isolation)
        per_task_ms = 1000 * (time.process_time() - start) / args.tasks
        print(f"build_task_request: {per_task_ms:.3f} ms CPU per task over {args.tasks}")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for launch in launches[args.tasks + 1 :]:
                backend.build_task_request(launch, isolation)
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
