"""Benchmark: the runner's cost of the idmapped ``/usr`` and ``/var/lib/dpkg`` layers per task
start (issue 11), not a test. Needs root.

Each round forks a fresh process (a runner is one process per task) that mounts a task's
private layers with ``linux.safefs.mount_overlays``: once the root layer alone
(``idmapped=()``), once with ``sandbox.IDMAPPED`` (one more overlay per folder, and the user
namespace of the idmapping made by a forked child), and once as a task starts now with
apt's layers too: ``sandbox.IDMAPPED`` with apt's folders, the skeleton layer over the root
layer (``sandbox.system_skeleton``) and the ``FRESH`` folders and files made by
``linux.userns.make_fresh``. Prints the median wall time of each.
The layers' folders are made under a temporary folder of ``/var/tmp`` and removed.

Usage:
    sudo PYTHONPATH=src .venv/bin/python bench/idmapped_layers.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trainyard.backends.local.sandbox import (
    IDMAPPED,
    TASK_HOST_UID,
    SandboxPlan,
    fresh_paths,
    overlays,
    skeleton_base,
)
from trainyard.linux.safefs import mount_overlays
from trainyard.linux.userns import make_fresh
from trainyard.runfile import FreshPath, OverlayMount

BEFORE_APT = ("usr", "var/lib/dpkg")
"""``IDMAPPED`` before apt's folders were added."""


def one_start_s(layers: list[OverlayMount], fresh: list[FreshPath] | None = None) -> float:
    """Wall seconds of ``mount_overlays(layers)`` in a fresh forked process."""
    started = time.perf_counter()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 1
        try:
            mount_overlays(layers)
            make_fresh(fresh or [], TASK_HOST_UID, TASK_HOST_UID)
            code = 0
        finally:
            os._exit(code)
    _pid, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("mount_overlays failed (root, overlayfs and idmapped mounts needed)")
    return time.perf_counter() - started


def median_ms(rounds: int, idmapped: tuple[str, ...], top: Path, apt: bool = False) -> float:
    times = []
    for index in range(rounds):
        base = top / f"{len(idmapped)}-{apt}-{index}"
        plan = SandboxPlan(
            root_dir=base / "root",
            hostname="t",
            overlay_dir=base / "overlay",
            host_uid=TASK_HOST_UID,
            idmapped=idmapped,
            skeleton_dir=skeleton_base() if apt else None,
        )
        times.append(one_start_s(overlays(plan), fresh_paths(plan) if apt else None))
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="trainyard-bench-idmap-", dir="/var/tmp"))
    try:
        plain = median_ms(args.rounds, (), top)
        mapped = median_ms(args.rounds, BEFORE_APT, top)
        apt = median_ms(args.rounds, IDMAPPED, top, apt=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(
        f"root layer only: {plain:.1f} ms; + idmapped {', '.join(BEFORE_APT)}: {mapped:.1f} ms; "
        f"+ idmapped {', '.join(IDMAPPED)}, skeleton and fresh paths: {apt:.1f} ms "
        f"(median of {args.rounds} fresh processes)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
