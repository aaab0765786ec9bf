"""Benchmark: training throughput (images/second) of trainyard's DDP trainer under torchrun.

Run: ``.venv/bin/python bench/training_throughput.py [--epochs E] [--model mlp|cnn] [--repeat R]``.

Each configuration starts one ``torchrun`` per stand-in node on this machine (static
rendezvous at 127.0.0.1, gloo, ``OMP_NUM_THREADS=1``) running
``-m trainyard.training.train`` on the bundled digits, and reads the trainer's own figures
from ``metrics.jsonl``:

- *epoch images/s*: median over epochs 2..E of images / training time of the epoch (epoch 1
  is warm-up), as printed in ``Epoch Throughput:``;
- *run images/s*: the ``Training Summary`` throughput (all epochs, validation and snapshots
  included);
- *wall s*: from starting the torchrun processes to the last one exiting (Python and torch
  start-up, rendezvous, training, tear-down).

Configurations (a): 1 node x 1 process, 2 nodes x 1 process (the scaling of two "nodes" on
a 2-core machine). ``--configs`` takes ``NODESxPROCS`` items, e.g. ``1x1 2x1 1x2 2x2``.
It prints a Markdown table; the best of R repeats (by epoch images/s) is reported. Not a
test: numbers depend on the machine and on what else runs on it. The comparison with runs
launched by trainyard itself comes later.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Result:
    config: str
    world_size: int
    epoch_images_per_s: float
    run_images_per_s: float
    train_s: float
    wall_s: float
    val_accuracy: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(nodes: int, procs: int, args: argparse.Namespace, folder: Path) -> Result:
    """Train once with ``nodes`` torchrun processes of ``procs`` workers each."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = [
        [str(BIN / "torchrun"), "--nnodes", str(nodes), "--nproc_per_node", str(procs),
         "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port),
         "-m", "trainyard.training.train", "--total_epochs", str(args.epochs),
         "--batch_size", str(args.batch_size), "--model", args.model,
         "--snapshot_path", str(folder / f"node{rank}" / "snapshot.pth")]
        for rank in range(nodes)
    ]
    started = time.perf_counter()
    procs_ = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for c in commands]
    errors = [p.communicate()[1] for p in procs_]
    wall_s = time.perf_counter() - started
    if any(p.returncode for p in procs_):
        raise SystemExit(f"{nodes}x{procs} failed:\n" + "\n".join(e[-2000:] for e in errors))
    records = [json.loads(line) for line in (folder / "node0" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    summary = records[-1]
    return Result(
        config=f"{nodes} node{'s' if nodes > 1 else ''} x {procs} process{'es' if procs > 1 else ''}",
        world_size=nodes * procs,
        epoch_images_per_s=statistics.median(r["throughput_images_per_s"] for r in epochs[1:] or epochs),
        run_images_per_s=summary["throughput_images_per_s"],
        train_s=summary["total_time_s"],
        wall_s=wall_s,
        val_accuracy=summary["final_val_accuracy"],
    )


def best(nodes: int, procs: int, args: argparse.Namespace) -> Result:
    results = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
            results.append(run_config(nodes, procs, args, Path(tmp)))
    return max(results, key=lambda r: r.epoch_images_per_s)


def table(results: list[Result]) -> str:
    base = results[0].epoch_images_per_s
    lines = [
        "| configuration | world size | epoch images/s | speed-up | run images/s | train s | wall s | val acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.config} | {r.world_size} | {r.epoch_images_per_s:,.0f} | {r.epoch_images_per_s / base:.2f}x "
            f"| {r.run_images_per_s:,.0f} | {r.train_s:.2f} | {r.wall_s:.1f} | {r.val_accuracy:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["1x1", "2x1"], help="NODESxPROCS items")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    shapes = [tuple(int(x) for x in c.lower().split("x")) for c in args.configs]
    results = [best(nodes, procs, args) for nodes, procs in shapes]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"Training throughput: digits, --model {args.model}, {args.epochs} epochs, batch {args.batch_size} "
          f"per process, gloo, torchrun by hand; {cpus} CPUs, {platform.python_implementation()} "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end; best of {args.repeat}")
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
