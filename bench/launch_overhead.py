"""Benchmark: the wall time of a 2-node DDP job through trainyard against the same job by hand.

Run: ``.venv/bin/python bench/launch_overhead.py [--pairs N] [--epochs E] [--no-upload-mode]``.

Issue 15's pair, alternating (the order flips each pair), under a temporary ``TRAINYARD_HOME``
with a warm server (started and given one warm-up workflow before the timed runs):

- *trainyard*: ``trainyard workflow submit examples/torchrun_multinode/train.yaml --set
  n_gpus_per_node=1 ... --wait``, timed from starting the CLI process to its exit (the
  output dataset uploaded, and checked to exist afterwards);
- *trainyard, no upload* (``--no-upload-mode``): the same spec with its ``outputs:`` removed,
  so the ratio can be given with and without the output upload;
- *by hand*: two ``torchrun --nnodes 2 --nproc_per_node 1 --node_rank 0|1 --master_addr
  127.0.0.1 ... -m trainyard.training.train --total_epochs E --batch_size B`` processes
  (``bench/training_throughput.py``'s ``run_config``), from starting them to the last exit.

It prints the medians, the paired ratio trainyard / by hand (median of the per-pair ratios,
with min - max), and a breakdown of where each trainyard run's time went, median over runs,
from what the product records (the store's submit time, ``events.jsonl``'s INITIALIZING,
RUNNING and EXITED times, the runner's ``timings.jsonl`` stage marks, the dataset version's
create time) and what this bench sees itself (the CLI start and exit, and a thread that reads
the store every 5 ms to see when the workflow's status becomes COMPLETED):

- *CLI start, import, spec, submit request*: CLI process start -> the store's submit time;
- *engine placement and runner start*: submit -> the first task's INITIALIZING;
- *gang start skew + runner preparation*: the first INITIALIZING -> the last task's
  ``barrier_start`` mark (sandbox, inputs, files: the slowest task's);
- *barrier passed*: the last ``barrier_start`` -> the last RUNNING;
- *command (torchrun, training)*: the last RUNNING -> the lead's command exit;
- *output upload after training*: the lead's command exit -> its upload end;
- *runner end report*: the lead's upload end -> the workflow's end time in the store (the
  EXITED event that ended it);
- *engine notices the end*: that end time -> COMPLETED seen in the store;
- *--wait notices the end, CLI exit*: COMPLETED in the store -> the CLI process exits.

Not a test: figures depend on the machine and on what else runs on it (on a shared 2-core
machine the pairs alternate so the load hits both sides alike).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_throughput import BIN, EXAMPLE, free_port, run_config  # noqa: E402

STAGES = (
    "CLI start, import, spec, submit request",
    "engine placement and runner start",
    "gang start skew + runner preparation",
    "barrier passed",
    "command (torchrun, training)",
    "output upload after training",
    "runner end report",
    "engine notices the end",
    "--wait notices the end, CLI exit",
)


@dataclass
class TrainyardRun:
    mode: str
    wall_s: float
    stages_s: dict[str, float] = field(default_factory=dict)


def no_upload_spec(folder: Path) -> Path:
    """The example without its ``outputs:`` block (the same training, nothing uploaded)."""
    text = EXAMPLE.read_text()
    stripped = re.sub(r"\n      outputs:.*?\n\n", "\n\n", text, count=1, flags=re.S)
    if stripped == text:
        raise SystemExit(f"{EXAMPLE}: no outputs block found to remove")
    path = folder / "train-no-upload.yaml"
    path.write_text(stripped)
    return path


class StoreWatch:
    """A thread that reads the store every ``interval_s`` and keeps the first time each
    workflow was seen with a terminal status (the engine's decision, as --wait sees it)."""

    def __init__(self, db: Path, interval_s: float = 0.005) -> None:
        self.db, self.interval_s = db, interval_s
        self.ended: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        while not self._stop.wait(self.interval_s):
            try:
                rows = conn.execute(
                    "SELECT id, status FROM workflows WHERE end_time_s IS NOT NULL"
                ).fetchall()
            except sqlite3.Error:
                continue
            now = time.time()
            for wid, status in rows:
                self.ended.setdefault(wid, (status, now))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _events(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record["kind"], record["time_s"])
    return out


def _timings(path: Path) -> dict[str, float]:
    """The runner's stage marks (``timings.jsonl``); empty for a runner that writes none."""
    if not path.exists():
        return {}
    return {r["stage"]: r["time_s"] for r in map(json.loads, path.read_text().splitlines())}


def breakdown(
    home: Path, wid: str, cli_start: float, cli_end: float, watch: StoreWatch
) -> dict[str, float]:
    """Where one trainyard run's wall time went (see the module docstring); seconds. The
    command's end is the lead's (the group ends with its lead, ``ignoreNonleadStatus``)."""
    conn = sqlite3.connect(f"file:{home / 'trainyard.db'}?mode=ro", uri=True, timeout=10)
    submit_s, end_s = conn.execute(
        "SELECT submit_time_s, end_time_s FROM workflows WHERE id = ?", (wid,)
    ).fetchone()
    conn.close()
    runs = home / "runs" / wid
    tasks = ("master", "worker")
    events = {t: _events(runs / t / "0" / "events.jsonl") for t in tasks}
    marks = {t: _timings(runs / t / "0" / "timings.jsonl") for t in tasks}
    lead = marks["master"]
    init = min(e["INITIALIZING"] for e in events.values())
    running = max(e["RUNNING"] for e in events.values())
    ready = max(marks[t].get("barrier_start", events[t]["RUNNING"]) for t in tasks)
    command_exit = lead.get("command_exit", events["master"]["EXITED"])
    upload_end = lead.get("upload_end", command_exit)
    completed = watch.ended.get(wid, ("?", cli_end))[1]
    return dict(
        zip(
            STAGES,
            (
                submit_s - cli_start,
                init - submit_s,
                ready - init,
                running - ready,
                command_exit - running,
                upload_end - command_exit,
                end_s - upload_end,
                completed - end_s,
                cli_end - completed,
            ),
            strict=False,
        )
    )


def submit(
    spec: Path, home: Path, args: argparse.Namespace, env: dict[str, str]
) -> tuple[str, float, float]:
    """One ``trainyard workflow submit --wait``; (workflow id, CLI start, CLI end) in Unix s."""
    command = [
        str(BIN / "trainyard"),
        "workflow",
        "submit",
        str(spec),
        "--set",
        "n_gpus_per_node=1",
        f"n_epochs={args.epochs}",
        f"batch_size={args.batch_size}",
        f"master_port={free_port()}",
        "--wait",
        "--format",
        "json",
    ]
    start = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    end = time.time()
    if done.returncode != 0:
        raise SystemExit(
            f"trainyard run failed ({done.returncode}):\n{done.stderr[-3000:]}\n{done.stdout[-2000:]}"
        )
    result = json.loads(done.stdout)
    if result["status"] != "COMPLETED":
        raise SystemExit(f"trainyard run ended {result['status']}")
    return result["id"], start, end


def uploaded_snapshots(home: Path) -> int:
    """How many ``snapshot.pth`` the output dataset's versions hold (one more per run)."""
    return len(list((home / "datasets" / "torchrun-multinode-model").rglob("snapshot.pth")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument(
        "--no-upload-mode",
        action="store_true",
        help="also run the spec without its outputs (ratio without the upload)",
    )
    args = parser.parse_args(argv)
    args.model = "mlp"  # what the example trains (run_config's argument)
    # Byte code is written as for any installed program: with PYTHONDONTWRITEBYTECODE set
    # (it is in some shells here), a module changed since its .pyc was written (after a merge)
    # is compiled from source again in every run of either side: ~1 ms per module, ~25 ms
    # for the CLI's ~30 when none is written (issue 15, fourth pass).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="trainyard-launch-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {
            **os.environ,
            "TRAINYARD_HOME": str(home),
            "OMP_NUM_THREADS": "1",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        env.pop("TRAINYARD_DATASET_URL", None)
        env.pop("TRAINYARD_SERVER", None)
        os.environ["OMP_NUM_THREADS"] = "1"
        subprocess.run(
            [str(BIN / "trainyard"), "server", "start"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        plain = no_upload_spec(Path(tmp))
        modes = ["by hand", "trainyard"] + (["trainyard, no upload"] if args.no_upload_mode else [])
        watch = StoreWatch(home / "trainyard.db")
        walls: dict[str, list[float]] = {m: [] for m in modes}
        runs: list[TrainyardRun] = []
        try:
            submit(EXAMPLE, home, args, env)  # warm-up: server, launcher, page cache
            for pair in range(args.pairs):
                order = modes if pair % 2 == 0 else list(reversed(modes))
                for mode in order:
                    if mode == "by hand":
                        wall_s = run_config(2, 1, args, Path(tmp) / f"hand-{pair}").wall_s
                    else:
                        spec = EXAMPLE if mode == "trainyard" else plain
                        before = uploaded_snapshots(home)
                        wid, start, end = submit(spec, home, args, env)
                        if uploaded_snapshots(home) != before + (mode == "trainyard"):
                            raise SystemExit(
                                f"{wid}: expected {int(mode == 'trainyard')} new "
                                "snapshot.pth in the output dataset"
                            )
                        time.sleep(0.1)  # the watch thread's last look
                        wall_s = end - start
                        runs.append(
                            TrainyardRun(mode, wall_s, breakdown(home, wid, start, end, watch))
                        )
                    walls[mode].append(wall_s)
                    print(
                        f"  pair {pair + 1}/{args.pairs} {mode}: {wall_s:.2f} s (load {os.getloadavg()[0]:.1f})",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            watch.close()
            subprocess.run(
                [str(BIN / "trainyard"), "server", "stop"], env=env, stdout=subprocess.DEVNULL
            )
    print(
        f"Launch overhead: examples/torchrun_multinode/train.yaml, 2 nodes x 1 process, {args.epochs} epochs, "
        f"batch {args.batch_size}, gloo, OMP_NUM_THREADS=1; {os.cpu_count()} CPUs; {args.pairs} alternating "
        f"pairs; load average {os.getloadavg()[0]:.1f} at the end"
    )
    print()
    print(
        "| launch | runs | wall s (median) | min - max | paired ratio to by hand (median) | min - max |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        ratios = [a / b for a, b in zip(walls[mode], walls["by hand"], strict=False)]
        print(
            f"| {mode} | {len(walls[mode])} | {statistics.median(walls[mode]):.2f} "
            f"| {min(walls[mode]):.2f} - {max(walls[mode]):.2f} | {statistics.median(ratios):.3f}x "
            f"| {min(ratios):.3f} - {max(ratios):.3f} |"
        )
    for mode in modes[1:]:
        mine = [r for r in runs if r.mode == mode]
        print()
        print(f"Where {mode}'s time goes (median over {len(mine)} runs, seconds):")
        print()
        print("| stage | s (median) | min - max |")
        print("|---|---:|---:|")
        for stage in STAGES:
            values = [r.stages_s[stage] for r in mine]
            print(
                f"| {stage} | {statistics.median(values):.3f} | {min(values):.3f} - {max(values):.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
