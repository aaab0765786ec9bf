"""Benchmark: training throughput (images/second) of trainyard's DDP trainer under torchrun.

Run: ``.venv/bin/python bench/training_throughput.py [--epochs E] [--model mlp|cnn] [--repeat R]``,
or ``... --launch-compare [--repeat R] [--epochs E]``.

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
test: numbers depend on the machine and on what else runs on it.

``--launch-compare`` measures what launching through trainyard costs the training itself:

- *trainyard 2x1*: ``examples/torchrun_multinode/train.yaml`` (``--set n_gpus_per_node=1``)
  submitted to the real engine on the local pool: two task runners, each task in its
  sandbox and the group's network namespace, torchrun started by the task's script;
- *by hand 2x1*: the same two ``torchrun`` command lines (``--nnodes 2 --nproc_per_node 1``,
  static rendezvous, the same trainer arguments) started directly on the host's loopback;
- *by hand 1x1*: one node of one process (the scaling baseline).

Each run's figure is the median over epochs 2..E of the trainer's ``Epoch Throughput``
(``metrics.jsonl``); the runs are interleaved (the order rotates each repeat) and each mode
reports the median over repeats, with the paired ratios trainyard/by hand (goal >= 0.97)
and 2x1/1x1. ``OMP_NUM_THREADS=1`` for every mode (the task runners inherit it).
The wall time the launch adds (CLI, engine, barrier, upload, ``--wait``) is measured by
``bench/launch_overhead.py``, which reuses ``run_config`` for its by-hand side.
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
import threading
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
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    commands = [
        [
            str(BIN / "torchrun"),
            "--nnodes",
            str(nodes),
            "--nproc_per_node",
            str(procs),
            "--node_rank",
            str(rank),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            "-m",
            "trainyard.training.train",
            "--total_epochs",
            str(args.epochs),
            "--batch_size",
            str(args.batch_size),
            "--model",
            args.model,
            "--snapshot_path",
            str(folder / f"node{rank}" / "snapshot.pth"),
        ]
        for rank in range(nodes)
    ]
    started = time.perf_counter()
    procs_ = [
        subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    errors = [p.communicate()[1] for p in procs_]
    wall_s = time.perf_counter() - started
    if any(p.returncode for p in procs_):
        raise SystemExit(f"{nodes}x{procs} failed:\n" + "\n".join(e[-2000:] for e in errors))
    records = [
        json.loads(line) for line in (folder / "node0" / "metrics.jsonl").read_text().splitlines()
    ]
    epochs = [r for r in records if r["event"] == "epoch"]
    summary = records[-1]
    return Result(
        config=f"{nodes} node{'s' if nodes > 1 else ''} x {procs} process{'es' if procs > 1 else ''}",
        world_size=nodes * procs,
        epoch_images_per_s=statistics.median(
            r["throughput_images_per_s"] for r in epochs[1:] or epochs
        ),
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


# ---------------------------------------------------------------------- --launch-compare

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrun_multinode" / "train.yaml"
MODES = ("trainyard 2x1", "by hand 2x1", "by hand 1x1")


@dataclass(frozen=True)
class Run:
    mode: str
    repeat: int
    epoch_images_per_s: float
    wall_s: float
    val_accuracy: float
    load: float


def _epoch_median(metrics: Path) -> tuple[float, float]:
    """(median epoch images/s over epochs 2..E, final validation accuracy) of one run."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    summary = next(r for r in records if r["event"] == "summary")
    return (
        statistics.median(r["throughput_images_per_s"] for r in epochs[1:] or epochs),
        summary["final_val_accuracy"],
    )


class TrainyardLauncher:
    """The real engine on the local pool under a temporary home, stepped by a thread."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        os.environ["TRAINYARD_HOME"] = str(home)  # the task runners' dataset store
        os.environ.pop("TRAINYARD_DATASET_URL", None)
        from trainyard.engine.reconciler import Engine
        from trainyard.pools import default_local_pool
        from trainyard.store import Store

        self.pool = default_local_pool()
        self.engine = Engine(
            Store(f"sqlite:///{home / 'db.sqlite'}"), home, pools={self.pool.name: self.pool}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.engine.run_forever, args=(self._stop,), daemon=True
        )
        self._thread.start()

    def run(self, args: argparse.Namespace) -> tuple[Path, float]:
        """Submit the two-node example, wait; (the master's metrics.jsonl, submit-to-end s)."""
        from trainyard import spec
        from trainyard.engine.reconciler import Submission

        values = {
            "n_gpus_per_node": 1,
            "n_epochs": args.epochs,
            "batch_size": args.batch_size,
            "master_port": free_port(),
        }
        doc = spec.load(EXAMPLE, set_values=values, pool=self.pool)
        started = time.perf_counter()
        record = self.engine.submit(
            Submission(spec=doc.workflow, spec_text="", user="bench", pool=self.pool)
        )
        done = self.engine.wait(record.id, timeout_s=900)
        wall_s = time.perf_counter() - started
        run_dir = self.engine.run_dir(record.id, "master", 0)
        if done.status != "COMPLETED":
            tail = (run_dir / "task.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"trainyard run {record.id} ended {done.status}:\n{tail}")
        return run_dir / "output" / "models" / "metrics.jsonl", wall_s

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def launch_compare(args: argparse.Namespace) -> list[Run]:
    if args.model != "mlp":
        raise SystemExit("--launch-compare trains what the example trains: --model mlp")
    os.environ["OMP_NUM_THREADS"] = "1"
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        launcher = TrainyardLauncher(Path(tmp) / "home")
        try:
            for repeat in range(args.repeat):
                order = MODES[repeat % len(MODES) :] + MODES[: repeat % len(MODES)]
                for mode in order:
                    folder = Path(tmp) / f"{repeat}-{mode.replace(' ', '-')}"
                    if mode.startswith("trainyard"):
                        metrics, wall_s = launcher.run(args)
                    else:
                        nodes = 2 if mode.endswith("2x1") else 1
                        wall_s = run_config(nodes, 1, args, folder).wall_s
                        metrics = folder / "node0" / "metrics.jsonl"
                    images_per_s, accuracy = _epoch_median(metrics)
                    runs.append(
                        Run(mode, repeat, images_per_s, wall_s, accuracy, os.getloadavg()[0])
                    )
                    print(
                        f"  repeat {repeat + 1}/{args.repeat} {mode}: {images_per_s:,.0f} images/s "
                        f"(wall {wall_s:.1f} s, load {runs[-1].load:.1f})",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            launcher.close()
    return runs


def launch_table(runs: list[Run]) -> str:
    by_mode = {m: [r for r in runs if r.mode == m] for m in MODES}
    median = {m: statistics.median(r.epoch_images_per_s for r in rs) for m, rs in by_mode.items()}
    lines = [
        "| launch | runs | epoch images/s (median of runs) | min - max | wall s (median) | val acc |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, rs in by_mode.items():
        values = [r.epoch_images_per_s for r in rs]
        lines.append(
            f"| {mode} | {len(rs)} | {median[mode]:,.0f} | {min(values):,.0f} - {max(values):,.0f} "
            f"| {statistics.median(r.wall_s for r in rs):.1f} "
            f"| {statistics.median(r.val_accuracy for r in rs):.4f} |"
        )

    def paired(a: str, b: str) -> list[float]:
        return [
            x.epoch_images_per_s / y.epoch_images_per_s
            for x, y in zip(by_mode[a], by_mode[b], strict=False)
        ]

    ratio = paired("trainyard 2x1", "by hand 2x1")
    scaling = paired("by hand 2x1", "by hand 1x1")
    lines += [
        "",
        f"trainyard / by hand (2x1): {median['trainyard 2x1'] / median['by hand 2x1']:.3f} "
        f"(paired per repeat: {', '.join(f'{x:.3f}' for x in ratio)}; goal >= 0.97)",
        f"2 nodes x 1 / 1 x 1 (by hand): {median['by hand 2x1'] / median['by hand 1x1']:.3f} "
        f"(paired per repeat: {', '.join(f'{x:.3f}' for x in scaling)})",
        f"load average (1 min) after each run: {', '.join(f'{r.load:.1f}' for r in runs)}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["1x1", "2x1"], help="NODESxPROCS items")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--launch-compare",
        action="store_true",
        help="trainyard-launched 2x1 against the same torchrun by hand, and 2x1 against 1x1",
    )
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.launch_compare:
        load_before = os.getloadavg()
        runs = launch_compare(args)
        print(
            f"Launch comparison: digits, --model mlp, {args.epochs} epochs, batch {args.batch_size} per "
            f"process, gloo, OMP_NUM_THREADS=1; {cpus} CPUs, {platform.python_implementation()} "
            f"{platform.python_version()}; load average {load_before[0]:.1f} / {load_before[1]:.1f} "
            f"(1 / 5 min) at the start; {args.repeat} repeats interleaved"
        )
        print()
        print(launch_table(runs))
        return 0
    shapes = [tuple(int(x) for x in c.lower().split("x")) for c in args.configs]
    results = [best(nodes, procs, args) for nodes, procs in shapes]
    print(
        f"Training throughput: digits, --model {args.model}, {args.epochs} epochs, batch {args.batch_size} "
        f"per process, gloo, torchrun by hand; {cpus} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end; best of {args.repeat}"
    )
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
