"""Utilisation sampling: the runner writes ``<run_dir>/usage.jsonl`` while the command runs.

Every ``interval_s`` (default 2 s, ``TRAINYARD_USAGE_INTERVAL_S``; 0 turns it off) one line is
appended and flushed: ``{"time_s", "cpu_percent", "rss_bytes", "processes", "gpus": [{"index",
"util_percent", "memory_used_bytes", "memory_total_bytes"}]}``. ``cpu_percent`` (100 = one core)
and ``rss_bytes`` sum the command's process tree (psutil). ``gpus`` only where ``pynvml``
(``nvidia-ml-py``) is installed and NVML starts: the task's ``CUDA_VISIBLE_DEVICES`` (all when
unset). Read by the dashboard and ``trainyard workflow metrics``; cost: docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import psutil

__all__ = [
    "USAGE",
    "baseline_delay",
    "UsageSampler",
    "read_usage",
    "interval_from_env",
    "sample_tree",
]

USAGE = "usage.jsonl"
DEFAULT_INTERVAL_S = 2.0
BASELINE_DELAY_S = 0.5
"""Seconds after the command's start before the first (baseline) reading."""


def baseline_delay(interval_s: float) -> float:
    """Seconds after the command's start when its CPU baseline is taken: ``BASELINE_DELAY_S``,
    at most one interval. A command that ends sooner is never sampled."""
    return min(interval_s, BASELINE_DELAY_S)


def interval_from_env(env: dict[str, str] | None = None) -> float:
    """The sampling interval: ``TRAINYARD_USAGE_INTERVAL_S`` (seconds, 0 = off), else 2.

    A value that is not a number, or negative, falls back to the default."""
    raw = (env if env is not None else os.environ).get("TRAINYARD_USAGE_INTERVAL_S")
    try:
        value = float(raw) if raw is not None else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value >= 0 else DEFAULT_INTERVAL_S


class _Tree:
    """The psutil handles of a process tree, kept between samples so that ``cpu_percent``
    measures the time since the previous sample (psutil's non-blocking form)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.known: dict[int, psutil.Process] = {}

    def sample(self) -> tuple[float, int, int]:
        """(cpu percent since last sample, rss bytes, process count) of the live tree."""
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return 0.0, 0, 0
        cpu, rss, alive = 0.0, 0, {}
        for proc in procs:
            handle = self.known.get(proc.pid, proc)
            try:
                with handle.oneshot():
                    cpu += handle.cpu_percent(None)
                    rss += handle.memory_info().rss
                alive[proc.pid] = handle
            except psutil.Error:
                continue
        self.known = alive
        return cpu, rss, len(alive)


def sample_tree(pid: int) -> tuple[float, int, int]:
    """One sample of a fresh tree (its cpu percent is 0: psutil needs two readings)."""
    return _Tree(pid).sample()


@functools.cache
def _nvml_module() -> Any | None:
    """``pynvml`` (nvidia-ml-py), or None when it is not installed; looked for once per
    process (a failed import searches ``sys.path`` again each time: ~0.4 ms per task in a
    launcher hosting runners)."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def _gpu_reader(visible: str | None = None) -> Any | None:
    """A function returning the GPU rows of the devices ``visible`` names (the task's
    ``CUDA_VISIBLE_DEVICES``; all when None or empty), or None without ``pynvml`` or NVML."""
    pynvml = _nvml_module()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver or no GPU: no GPU rows
        return None
    count = pynvml.nvmlDeviceGetCount()
    indexes = (
        [int(i) for i in visible.split(",") if i.strip().isdigit()]
        if visible
        else list(range(count))
    )

    def read() -> list[dict[str, Any]]:
        rows = []
        for index in indexes:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # noqa: BLE001 - a device that vanished is skipped
                continue
            rows.append(
                {
                    "index": index,
                    "util_percent": util.gpu,
                    "memory_used_bytes": mem.used,
                    "memory_total_bytes": mem.total,
                }
            )
        return rows

    return read


class UsageSampler:
    """A daemon thread appending one ``usage.jsonl`` line per interval for a process tree.

    Args:
        pid: the command's process (its descendants are included).
        run_dir: the attempt's folder; the file is ``run_dir/usage.jsonl``.
        interval_s: seconds between samples (> 0).
        cuda_visible_devices: the task's ``CUDA_VISIBLE_DEVICES`` (the GPUs sampled; None or
            empty: all). The task's, not this process's: a runner hosted by the launcher
            shares the launcher's environment.
    """

    def __init__(
        self,
        pid: int,
        run_dir: Path,
        interval_s: float = DEFAULT_INTERVAL_S,
        cuda_visible_devices: str | None = None,
        baseline_delay_s: float | None = None,
    ) -> None:
        self.path = Path(run_dir) / USAGE
        self.interval_s = interval_s
        self.baseline_delay_s = (
            baseline_delay(interval_s) if baseline_delay_s is None else baseline_delay_s
        )
        self._tree = _Tree(pid)
        self._visible = cuda_visible_devices
        self._gpus: Any | None = None
        self._gpus_looked = False  # NVML is looked for at the first sample, not per start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainyard-usage", daemon=True)

    def start(self) -> None:
        """Start the thread. It takes the CPU baseline after ``BASELINE_DELAY_S`` (at most one
        interval; ``baseline_delay_s`` when given: a caller that waited already), then one
        sample per interval: a command that ends sooner is never walked,
        so short tasks pay no process-tree walk (each walk reads every ``/proc/PID/stat`` of
        the machine, ~3 ms with a few hundred processes)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (idempotent); waits at most one interval."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 1)

    def _loop(self) -> None:
        if self._stop.wait(self.baseline_delay_s):
            return
        self._tree.sample()
        while not self._stop.wait(self.interval_s):
            self.write_sample()

    def write_sample(self) -> dict[str, Any]:
        """Append one sample and return it."""
        cpu, rss, count = self._tree.sample()
        row: dict[str, Any] = {
            "time_s": round(time.time(), 3),
            "cpu_percent": round(cpu, 1),
            "rss_bytes": rss,
            "processes": count,
        }
        if not self._gpus_looked:
            self._gpus, self._gpus_looked = _gpu_reader(self._visible), True
        if self._gpus is not None:
            row["gpus"] = self._gpus()
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        return row


USAGE_READ_BYTES = 4 << 20
"""The most one ``read_usage`` call reads of one file (its newest part)."""
MAX_USAGE_LINE_BYTES = 64 << 10
"""A longer line is skipped without being held."""
MAX_CACHED_USAGE_FILES = 256
"""Usage files whose rows are kept between calls (the least recently read go first)."""


@dataclass
class _UsageRows:
    """What was read of one usage file: up to ``offset`` (a line's start), its last rows."""

    ino: int
    max_rows: int
    offset: int = 0
    rows: deque[dict[str, Any]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)


_CACHE: OrderedDict[str, _UsageRows] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _cached(path: Path, ino: int, max_rows: int) -> _UsageRows:
    key = str(path)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        if entry is None or entry.ino != ino or entry.max_rows != max_rows:
            entry = _CACHE[key] = _UsageRows(ino, max_rows, rows=deque(maxlen=max_rows))
        _CACHE.move_to_end(key)
        while len(_CACHE) > MAX_CACHED_USAGE_FILES:
            _CACHE.popitem(last=False)
        return entry


def read_usage(run_dir: Path, max_rows: int = 5000) -> list[dict[str, Any]]:
    """The samples of one attempt, oldest first (a torn last line waits until complete); at
    most the last ``max_rows`` (about 2.8 h at 2 s).

    Bounded in time and memory whatever the file's size (the dashboard polls it): what was read
    is cached by file (path and inode) with the offset it reached, so a call reads only what the
    file gained since, at most ``USAGE_READ_BYTES`` (a file that grew more is read from that far
    before its end; the older rows are skipped). A shorter file, or another file at the path, is
    read again from its start; a line over ``MAX_USAGE_LINE_BYTES`` is skipped; a link or a file
    that is not regular gives no rows.
    """
    path = Path(run_dir) / USAGE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return []
        entry = _cached(path, st.st_ino, max_rows)
        with entry.lock:
            if st.st_size < entry.offset:
                entry.offset = 0
                entry.rows.clear()
            _read_new(handle, entry, st.st_size)
            return list(entry.rows)


def _read_new(handle: BinaryIO, entry: _UsageRows, size: int) -> None:
    """Add the complete lines between ``entry.offset`` and ``size`` (the last
    ``USAGE_READ_BYTES`` of them) to ``entry.rows``."""
    if size - entry.offset > USAGE_READ_BYTES:
        handle.seek(size - USAGE_READ_BYTES)
        handle.readline(MAX_USAGE_LINE_BYTES)  # the rest of a line cut in two
        entry.offset = handle.tell()
    handle.seek(entry.offset)
    while entry.offset < size:
        raw = handle.readline(min(MAX_USAGE_LINE_BYTES, size - entry.offset))
        if not raw.endswith(b"\n") and len(raw) < MAX_USAGE_LINE_BYTES:
            return  # a line still being written: read it when complete
        entry.offset += len(raw)
        if raw.endswith(b"\n"):
            row = _usage_row(raw)
            if row is not None:
                entry.rows.append(row)


def _usage_row(raw: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(raw)
    except ValueError:
        return None
    if isinstance(row, dict) and isinstance(row.get("time_s"), (int, float)):
        return row
    return None
