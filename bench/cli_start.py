"""Benchmark: the CLI's start and submit request, two source trees side by side.

Run: ``.venv/bin/python bench/cli_start.py [--runs N] [--server-side] [--command ARGS]
TREE_SRC [TREE_SRC ...]``, e.g. ``bench/cli_start.py /work/main/src src`` (each a folder put
first on ``PYTHONPATH``).

What: ``trainyard workflow submit examples/torchrun_multinode/train.yaml --set
n_gpus_per_node=1 --dry-run`` (start, import, spec, the request answered, exit), or the
command line ``--command`` names (split as a shell would: ``--command=--help``,
``--command "workflow list"``), against one
warm server in a temporary ``TRAINYARD_HOME`` (started with the first tree's code, so the
server's own part is the same for every tree), the trees alternating (the order flips each
round) after one warm-up run each (byte code written). Prints the best and the median wall
time and CPU time (user + system of the CLI process) of each tree, and the load average.

``--importtime``: also, per tree, the sum of the import times that ``python -X importtime``
reports for the same command (``PYTHONPROFILEIMPORTTIME=1``; each module's own time, the
``self`` column) and how many modules it imported: less distorted by a loaded machine than
the wall time, though not free of it.

``--server-side``: instead, the server's own time for the same request (``POST /api/workflow``
with the example's body, dry run and submit), in one process per tree through FastAPI's
TestClient over the fake backend: 3 warm-up requests, then the best and the median of
``--runs`` more.

Not a test: figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrun_multinode" / "train.yaml"
COMMAND = ["workflow", "submit", str(EXAMPLE), "--set", "n_gpus_per_node=1", "--dry-run"]


def timed_run(src: str, env: dict[str, str], command: list[str]) -> tuple[float, float]:
    """One CLI run of ``command`` with ``src`` first on PYTHONPATH: (wall s, CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [str(BIN / "trainyard"), *command],
        env={**env, "PYTHONPATH": src},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall_s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_time(src: str, env: dict[str, str], command: list[str]) -> tuple[float, int]:
    """One CLI run of ``command`` under ``-X importtime``: (sum of the modules' own import
    times in s, number of modules imported)."""
    done = subprocess.run(
        [str(BIN / "trainyard"), *command],
        env={**env, "PYTHONPATH": src, "PYTHONPROFILEIMPORTTIME": "1"},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    self_us = [
        int(line.split(":", 1)[1].split("|")[0])
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    ]
    return sum(self_us) / 1e6, len(self_us)


def order(trees: list[str], round_index: int) -> list[str]:
    """The trees in round ``round_index``: as given on even rounds, reversed on odd ones."""
    return trees if round_index % 2 == 0 else trees[::-1]


def summary(runs: list[tuple[float, float]]) -> str:
    """``best wall (median) / best CPU (median)`` of (wall s, CPU s) runs."""
    walls, cpus = [w for w, _c in runs], [c for _w, c in runs]
    return (
        f"wall {min(walls):.3f} s (median {statistics.median(walls):.3f}), "
        f"CPU {min(cpus):.3f} s (median {statistics.median(cpus):.3f})"
    )


SERVER_SIDE = """
import statistics, sys, tempfile, time
from pathlib import Path
from fastapi.testclient import TestClient
from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.store import Store
home, runs = Path(tempfile.mkdtemp()), int(sys.argv[2])
backend = FakeBackend(lambda launch: Outcome(0, polls=2))
engine = Engine(Store(f"sqlite:///{home / 'db'}"), home, pools={"local": default_local_pool()},
                backend_factory=lambda pool, home: backend)
body = {"spec_text": Path(sys.argv[1]).read_text(), "spec_name": "train.yaml",
        "set": ["n_gpus_per_node=1"]}
with TestClient(create_app(Service(engine), TokenRegistry(home))) as client:
    auth = {"Authorization": "Bearer " + (home / "token").read_text().strip()}
    for dry_run in (True, False):
        times = []
        for _ in range(3 + runs):
            started = time.perf_counter()
            answer = client.post("/api/workflow", params={"dry_run": dry_run}, json=body, headers=auth)
            times.append(time.perf_counter() - started)
            assert answer.status_code == 200, answer.text
        times = times[3:]
        print(f"{'dry run' if dry_run else 'submit'} {min(times) * 1000:.1f} ms "
              f"(median {statistics.median(times) * 1000:.1f})", end="; ")
"""
"""The server's side: one process per tree (argv: the spec, the number of timed requests)."""


def server_side(trees: list[str], runs: int) -> None:
    """Print each tree's server time for the example's dry run and submit."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for src in trees:
        done = subprocess.run(
            [sys.executable, "-c", SERVER_SIDE, str(EXAMPLE), str(runs)],
            env={**env, "PYTHONPATH": src},
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"  {src}: server side: {done.stdout.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="source folders (PYTHONPATH) to compare")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--server-side",
        action="store_true",
        help="time the server's handling of the request instead",
    )
    parser.add_argument(
        "--command",
        default=shlex.join(COMMAND),
        help="the CLI's arguments to time, as one shell-quoted string (default: the dry run)",
    )
    parser.add_argument(
        "--importtime",
        action="store_true",
        help="also the sum of -X importtime's own times per tree (median of the runs)",
    )
    args = parser.parse_args()
    command = shlex.split(args.command)
    trees = [str(Path(t).resolve()) for t in args.trees]
    if args.server_side:
        server_side(trees, args.runs)
        return
    with tempfile.TemporaryDirectory(prefix="cli-start-") as home:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(TRAINYARD_HOME=home)
        env.pop("TRAINYARD_SERVER_URL", None)
        subprocess.run(
            [str(BIN / "trainyard"), "server", "start"],
            check=True,
            env={**env, "PYTHONPATH": trees[0]},
            stdout=subprocess.DEVNULL,
        )
        try:
            for src in trees:  # warm-up: byte code, the server's first render
                timed_run(src, env, command)
            results: dict[str, list[tuple[float, float]]] = {t: [] for t in trees}
            imports: dict[str, list[tuple[float, int]]] = {t: [] for t in trees}
            for index in range(args.runs):
                for src in order(trees, index):
                    results[src].append(timed_run(src, env, command))
                    if args.importtime:
                        imports[src].append(import_time(src, env, command))
        finally:
            subprocess.run(
                [str(BIN / "trainyard"), "server", "stop"], env=env, stdout=subprocess.DEVNULL
            )
    print(
        f"{shlex.join(command)}: best of {args.runs}, load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    for src, runs in results.items():
        print(f"  {src}: {summary(runs)}")
        if imports[src]:
            totals = [total for total, _count in imports[src]]
            print(
                f"    -X importtime: {statistics.median(totals):.3f} s summed (best "
                f"{min(totals):.3f}), {imports[src][-1][1]} modules"
            )


if __name__ == "__main__":
    main()
