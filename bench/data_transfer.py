"""Benchmark: the data layer's file:// transfers against a plain ``cp -r`` of the same data.

Run: ``.venv/bin/python bench/data_transfer.py [--size-mb 1024] [--files 1000] [--repeat 3]``
(``--size-mb 64 --small-files 2000`` for a quick run; ``--methods 'dataset upload,dataset
download' --layouts files,small`` times only those beside ``cp -r`` on those layouts).

Three layouts of random bytes (``--layouts``, default all): ``files``: ``--size-mb`` MiB as
``--files`` files; ``one``: ``--size-mb`` MiB as one file; ``small``: ``--small-files`` files
of ``--small-kb`` KiB each (many small files: per-file costs dominate). For each, in one temp
dir on one disk (``--dir``, default the system temp dir), it times:

* ``cp -r``                      the baseline (GNU cp, kernel copy)
* ``data upload`` / ``download``  ``trainyard.data.upload`` / ``download`` (url transfers:
                                  per-file temp name + rename, parallel workers, retries armed)
* ``dataset upload`` / ``download``  ``DatasetStore`` (adds the digest of every file both
                                  ways and the manifest; the upload's time includes listing the
                                  source folder, as cp's does)

Every run starts from a synced disk (``os.sync()``, untimed) with a warm page cache for the
source, the same for cp and for trainyard; the methods run interleaved, ``--repeat`` rounds.
It reports each method's best time and two ratios to cp: best to best, and the median of the
per-round ratios (both guard against other load on a shared machine), and the CPU time each
method used (user + system, all its threads; ``cp``'s as a child process), median of rounds,
and its ratio to cp's: on a machine whose CPUs are busy with other work the wall-time ratio
tends to the CPU-time ratio, so the CPU column is the figure that load does not move much.
It prints a Markdown table with MiB/s and the ratios to cp (goal: at least 0.8 for url
transfers and datasets, issues 6 and 11). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
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
    """``files`` files of random bytes summing to ``total_bytes`` under ``root`` (100 per
    folder)."""
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


def cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process (all threads) and its
    waited-for children."""
    mine, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


Times = dict[str, list[tuple[float, float]]]
"""Per method, per round: (wall seconds, CPU seconds)."""


def run_rounds(steps: dict[str, Step], repeat: int) -> Times:
    """Wall and CPU times of each step's action over ``repeat`` rounds. The steps run
    interleaved (one of each per round, in order) so that load from other processes hits them
    alike; the disk is synced (untimed) before each."""
    times: Times = {name: [] for name in steps}
    for _ in range(repeat):
        for name, (prepare, action) in steps.items():
            prepare()
            os.sync()
            cpu_start, start = cpu_s(), time.perf_counter()
            action()
            times[name].append((time.perf_counter() - start, cpu_s() - cpu_start))
    return times


def clear(*paths: Path) -> Callable[[], None]:
    def remove() -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    return remove


def measure(work: Path, src: Path, repeat: int, methods: list[str] | None = None) -> Times:
    """Seconds, per round, for each way of moving ``src``."""
    cp_dst, remote, back = work / "cp", work / "remote", work / "back"
    store, ds_back = work / "store", work / "ds-back"
    mover = Mover()
    url = remote.as_uri()
    datasets = DatasetStore(store.as_uri(), mover)
    steps: dict[str, Step] = {
        "cp -r": (
            clear(cp_dst),
            lambda: subprocess.run(["cp", "-r", str(src), str(cp_dst)], check=True),
        ),
        "data upload": (clear(remote), lambda: upload(url, [f"{src}/"], None, mover)),
        "data download": (clear(back), lambda: download(url, back, None, mover)),
        "dataset upload": (
            clear(store),
            lambda: datasets.upload("bench", plan_uploads([f"{src}/"], None)),
        ),  # listing included, as cp -r's is
        "dataset download": (clear(ds_back), lambda: datasets.download("bench", ds_back)),
    }
    if methods:
        steps = {name: step for name, step in steps.items() if name == "cp -r" or name in methods}
    results = run_rounds(steps, repeat)
    clear(cp_dst, remote, back, store, ds_back)()
    return results


def report(label: str, total_bytes: int, results: Times) -> list[str]:
    """Table rows: best time, its MiB/s, best-to-best ratio to cp, median of the per-round
    ratios (cp's time over this method's time in the same round), median CPU seconds and
    cp's median CPU seconds over this method's."""
    base = [wall for wall, _cpu in results["cp -r"]]
    base_cpu = statistics.median(cpu for _wall, cpu in results["cp -r"])
    rows = []
    for name, rounds in results.items():
        times = [wall for wall, _cpu in rounds]
        best = min(times)
        rate = total_bytes / MiB / best
        median = statistics.median(b / t for b, t in zip(base, times, strict=True))
        cpu = statistics.median(c for _wall, c in rounds)
        rows.append(
            f"| {label} | {name} | {best:.3f} | {rate:,.0f} | {min(base) / best:.2f} "
            f"| {median:.2f} | {cpu:.3f} | {base_cpu / cpu if cpu > 0 else 0:.2f} |"
        )
    return rows


def layouts(
    names: list[str], size_mb: int, files: int, small_files: int, small_kb: int
) -> list[tuple[str, int, int]]:
    """(label, total bytes, files) of each layout named (``files``, ``one``, ``small``).
    Raises SystemExit naming the valid choices for an unknown name."""
    known = {
        "files": (f"{files} files", size_mb * MiB, files),
        "one": ("1 file", size_mb * MiB, 1),
        "small": (
            f"{small_files} files of {small_kb} KiB",
            small_files * small_kb * 1024,
            small_files,
        ),
    }
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"--layouts: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return [known[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB per layout (default 1024)")
    parser.add_argument("--files", type=int, default=1000, help="files in the 'files' layout")
    parser.add_argument(
        "--small-files", type=int, default=10000, help="files in the 'small' layout (default 10000)"
    )
    parser.add_argument(
        "--small-kb", type=int, default=16, help="KiB per file in the 'small' layout (default 16)"
    )
    parser.add_argument(
        "--layouts",
        default="files,one,small",
        help="comma-separated layouts: files, one, small (default all)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per measure; the best is kept")
    parser.add_argument("--dir", type=Path, default=None, help="where the temp dir goes")
    parser.add_argument(
        "--methods",
        default="",
        help="comma-separated methods to time beside "
        "cp -r (default all), e.g. 'dataset upload,dataset download'",
    )
    parser.add_argument(
        "--many-files-only",
        action="store_true",
        help="only the 'files' layout (same as --layouts files)",
    )
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    names = (
        ["files"]
        if args.many_files_only
        else [n.strip() for n in args.layouts.split(",") if n.strip()]
    )
    chosen = layouts(names, args.size_mb, args.files, args.small_files, args.small_kb)
    print(
        f"# data transfer bench: {args.size_mb} MiB, python {platform.python_version()}, "
        f"{os.cpu_count()} cpus, {platform.platform()}"
    )
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(
        "| layout | method | best s | MiB/s | ratio to cp (best) | ratio to cp (median of rounds) "
        "| CPU s (median) | CPU ratio (cp / this) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="trainyard-bench-") as tmp:
        work = Path(tmp)
        for label, total, files in chosen:
            src = make_data(work / f"src-{files}", total, files)
            for row in report(label, total, measure(work, src, args.repeat, methods)):
                print(row, flush=True)
            shutil.rmtree(src)
    print(f"# load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
