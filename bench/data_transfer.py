"""Benchmark: the data layer's file:// transfers against a plain ``cp -r`` of the same data.

Run: ``.venv/bin/python bench/data_transfer.py [--size-mb 1024] [--files 1000] [--repeat 3]``
(``--size-mb 64`` for a quick run; ``--methods 'dataset upload,dataset download'
--many-files-only`` times only those beside ``cp -r``).

Two layouts of ``--size-mb`` MiB of random bytes: ``--files`` files, and one file. For each,
in one temp dir on one disk (``--dir``, default the system temp dir), it times:

* ``cp -r``                      the baseline (GNU cp, kernel copy)
* ``data upload`` / ``download``  ``trainyard.data.upload`` / ``download`` (url transfers:
                                  per-file temp name + rename, parallel workers, retries armed)
* ``dataset upload`` / ``download``  ``DatasetStore`` (adds sha256 of every file both ways and
                                  the manifest), for information

Every run starts from a synced disk (``os.sync()``, untimed) with a warm page cache for the
source, the same for cp and for trainyard; the methods run interleaved, ``--repeat`` rounds.
It reports each method's best time and two ratios to cp: best to best, and the median of the
per-round ratios (both guard against other load on a shared machine). It prints a
Markdown table with MiB/s and the ratio to cp (goal: at least 0.8 for url transfers). Not a
test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainyard.data import DatasetStore, Mover, download, upload
from trainyard.data.transfer import plan_uploads

MiB = 1024 * 1024


def make_data(root: Path, total_bytes: int, files: int) -> Path:
    """``files`` files of random bytes summing to ``total_bytes`` under ``root``."""
    root.mkdir(parents=True)
    size = total_bytes // files
    block = os.urandom(min(size, 8 * MiB))
    for index in range(files):
        path = root / f"d{index // 100:03}" / f"part-{index:05}.bin"
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as handle:
            left = size
            while left > 0:
                handle.write(block[:left])
                left -= len(block)
    return root


Step = tuple[Callable[[], None], Callable[[], object]]
"""(prepare, action): ``prepare`` (untimed) clears the destination."""


def run_rounds(steps: dict[str, Step], repeat: int) -> dict[str, list[float]]:
    """Wall times of each step's action over ``repeat`` rounds. The steps run interleaved
    (one of each per round, in order) so that load from other processes hits them alike; the
    disk is synced (untimed) before each."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):
        for name, (prepare, action) in steps.items():
            prepare()
            os.sync()
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return times


def clear(*paths: Path) -> Callable[[], None]:
    def remove() -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    return remove


def measure(work: Path, src: Path, repeat: int,
            methods: list[str] | None = None) -> dict[str, list[float]]:
    """Seconds, per round, for each way of moving ``src``."""
    cp_dst, remote, back = work / "cp", work / "remote", work / "back"
    store, ds_back = work / "store", work / "ds-back"
    mover = Mover()
    url = remote.as_uri()
    files = plan_uploads([f"{src}/"], None)
    datasets = DatasetStore(store.as_uri(), mover)
    steps: dict[str, Step] = {
        "cp -r": (clear(cp_dst), lambda: subprocess.run(["cp", "-r", str(src), str(cp_dst)], check=True)),
        "data upload": (clear(remote), lambda: upload(url, [f"{src}/"], None, mover)),
        "data download": (clear(back), lambda: download(url, back, None, mover)),
        "dataset upload": (clear(store), lambda: datasets.upload("bench", files)),
        "dataset download": (clear(ds_back), lambda: datasets.download("bench", ds_back)),
    }
    if methods:
        steps = {name: step for name, step in steps.items() if name == "cp -r" or name in methods}
    results = run_rounds(steps, repeat)
    clear(cp_dst, remote, back, store, ds_back)()
    return results


def report(label: str, total_bytes: int, results: dict[str, list[float]]) -> list[str]:
    """Table rows: best time, its MiB/s, best-to-best ratio to cp, median of the per-round
    ratios (cp's time over this method's time in the same round)."""
    base = results["cp -r"]
    rows = []
    for name, times in results.items():
        best = min(times)
        rate = total_bytes / MiB / best
        median = statistics.median(b / t for b, t in zip(base, times, strict=True))
        rows.append(f"| {label} | {name} | {best:.2f} | {rate:,.0f} | {min(base) / best:.2f} "
                    f"| {median:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB per layout (default 1024)")
    parser.add_argument("--files", type=int, default=1000, help="files in the many-files layout")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measure; the best is kept")
    parser.add_argument("--dir", type=Path, default=None, help="where the temp dir goes")
    parser.add_argument("--methods", default="", help="comma-separated methods to time beside "
                        "cp -r (default all), e.g. 'dataset upload,dataset download'")
    parser.add_argument("--many-files-only", action="store_true",
                        help="skip the one-file layout")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    total = args.size_mb * MiB
    print(f"# data transfer bench: {args.size_mb} MiB, python {platform.python_version()}, "
          f"{os.cpu_count()} cpus, {platform.platform()}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print("| layout | method | best s | MiB/s | ratio to cp (best) | ratio to cp (median of rounds) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="trainyard-bench-") as tmp:
        work = Path(tmp)
        layouts = [(f"{args.files} files", args.files)]
        layouts += [] if args.many_files_only else [("1 file", 1)]
        for label, files in layouts:
            src = make_data(work / f"src-{files}", total, files)
            for row in report(label, total, measure(work, src, args.repeat, methods)):
                print(row, flush=True)
            shutil.rmtree(src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
