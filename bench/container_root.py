"""Benchmark: what an image task's own writable root costs per start (issue 11, images), not a
test. Needs root, podman and an image in podman's local storage.

Starts image tasks running ``true`` one after another through a real ``LocalBackend`` (its
runner, podman) and times each from ``start_group`` to its exit fact; alternates rounds with
the container's own root (the image's layers under a layer of the attempt's, mounted by the
runner: ``backends.local.container_image.root_overlay``) and with podman's own container layer (the
runner told it cannot mount overlayfs), so both see the same load. Prints the median of each
round. Homes are made under a temporary folder and removed.

Usage:
    sudo PYTHONPATH=src .venv/bin/python bench/container_root.py --image IMAGE [--tasks 9] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trainyard.backends.base import FactKind, TaskKey, TaskLaunch
from trainyard.backends.local import LocalBackend
from trainyard.backends.local import isolation as local
from trainyard.pools import default_local_pool

_FINAL = (FactKind.EXITED, FactKind.LOST, FactKind.START_ERROR)


def _launch(home: Path, backend: LocalBackend, image: str, index: int) -> TaskLaunch:
    key = TaskKey(f"bench-{index}", "t", 0)
    run_dir = home / "runs" / key.workflow_id / "t" / "0"
    run = {
        "workflow_id": key.workflow_id,
        "group": "g",
        "task": "t",
        "lead": True,
        "lead_task": "t",
        "group_tasks": ["t"],
        "run_dir": str(run_dir),
        "image": image,
        "command": ["true"],
        "hosts": {"t": backend.host_of(key, "local-0")},
    }
    return TaskLaunch(key=key, group="g", node="local-0", run_dir=run_dir, run=run)


def one_start_s(backend: LocalBackend, launch: TaskLaunch, timeout_s: float = 120) -> float:
    """Seconds from ``start_group`` to the task's exit fact (which must be exit code 0)."""
    started = time.monotonic()
    backend.start_group([launch])
    while time.monotonic() - started < timeout_s:
        for fact in backend.poll():
            if fact.key == launch.key and fact.kind in _FINAL:
                if fact.exit_code != 0:
                    raise SystemExit(f"task failed: {(launch.run_dir / 'task.log').read_text()}")
                return time.monotonic() - started
        time.sleep(0.01)
    raise SystemExit(f"no exit in {timeout_s}s")


def round_median_s(image: str, tasks: int, own_root: bool) -> float:
    """The median start-to-exit time of ``tasks`` image tasks in a fresh home."""
    original = local.overlay_supported
    local.overlay_supported = original if own_root else (lambda: False)
    home = Path(tempfile.mkdtemp(prefix="container-root-bench-"))
    try:
        pool = default_local_pool().model_copy(update={"images": {"*": "podman"}})
        backend = LocalBackend(pool, home=home, sandbox="bwrap", network="netns")
        times = [one_start_s(backend, _launch(home, backend, image, i)) for i in range(tasks)]
        backend.close()
        return statistics.median(times)
    finally:
        local.overlay_supported = original
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="an image in podman's local storage")
    parser.add_argument("--tasks", type=int, default=9, help="tasks per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each kind, alternated")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for own_root in (False, True):
            median_s = round_median_s(args.image, args.tasks, own_root)
            kind = "own root" if own_root else "podman layer"
            print(f"{kind:13s} median start-to-exit {median_s:.3f} s over {args.tasks} tasks")


if __name__ == "__main__":
    main()
