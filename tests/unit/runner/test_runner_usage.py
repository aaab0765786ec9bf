"""The runner's utilisation sampler on a real process tree (psutil): CPU of descendants
counted, memory summed, one JSON line per interval, the interval setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_support import execute

from trainyard.runner import usage
from trainyard.runner.usage import UsageSampler, interval_from_env, read_usage

BUSY_CHILD = (
    "import subprocess, sys; "
    "subprocess.run([sys.executable, '-c', 'import time\\nend = time.time() + 30\\n"
    "while time.time() < end: pass'])"
)


def test_sampler_counts_the_busy_grandchild(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])
    try:
        time.sleep(0.5)  # the child is started
        sampler = UsageSampler(proc.pid, tmp_path, interval_s=0.5)
        sampler.start()
        deadline = time.time() + 20
        while len(read_usage(tmp_path)) < 3 and time.time() < deadline:
            time.sleep(0.2)
        sampler.stop()
    finally:
        proc.kill()
        proc.wait()
    rows = read_usage(tmp_path)
    assert len(rows) >= 3
    assert rows[-1]["processes"] >= 2 and rows[-1]["rss_bytes"] > 1_000_000
    assert max(r["cpu_percent"] for r in rows) > 20  # a loaded machine still gives it some


def test_a_gone_process_gives_empty_samples_not_an_error(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    sampler = UsageSampler(proc.pid, tmp_path, interval_s=60)
    proc.kill()
    proc.wait()
    row = sampler.write_sample()
    assert row["processes"] == 0 and row["cpu_percent"] == 0.0
    assert json.loads((tmp_path / "usage.jsonl").read_text())["processes"] == 0


def test_interval_from_env() -> None:
    assert interval_from_env({}) == 2.0
    assert interval_from_env({"TRAINYARD_USAGE_INTERVAL_S": "0"}) == 0.0
    assert interval_from_env({"TRAINYARD_USAGE_INTERVAL_S": "5"}) == 5.0
    assert interval_from_env({"TRAINYARD_USAGE_INTERVAL_S": "x"}) == 2.0
    assert interval_from_env({"TRAINYARD_USAGE_INTERVAL_S": "-1"}) == 2.0


def test_read_usage_skips_torn_and_foreign_lines(tmp_path: Path) -> None:
    (tmp_path / "usage.jsonl").write_text('{"time_s": 1, "cpu_percent": 1}\n[1]\n{"time_s"')
    assert read_usage(tmp_path) == [{"time_s": 1, "cpu_percent": 1}]


@pytest.fixture(autouse=True)
def _nvml_looked_for_afresh() -> Iterator[None]:
    """Each test finds (or misses) ``pynvml`` itself, and leaves no fake behind."""
    usage._nvml_module.cache_clear()
    yield
    usage._nvml_module.cache_clear()


class _FakeNvml:
    """A stand-in for ``pynvml`` with two devices (the unit test machine has no GPU)."""

    def __init__(self) -> None:
        self.inits = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> object:  # noqa: N802
        return type("U", (), {"gpu": 40 + handle})()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:  # noqa: N802
        return type("M", (), {"used": 1000 * (handle + 1), "total": 8000})()


def test_gpu_rows_follow_the_tasks_cuda_visible_devices(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the launcher's, not the task's
    sampler = UsageSampler(os.getpid(), tmp_path, interval_s=60, cuda_visible_devices="1")
    row = sampler.write_sample()
    assert row["gpus"] == [
        {"index": 1, "util_percent": 41, "memory_used_bytes": 2000, "memory_total_bytes": 8000}
    ]


def test_no_pynvml_means_no_gpu_rows(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as when not installed
    row = UsageSampler(os.getpid(), tmp_path, interval_s=60).write_sample()
    assert "gpus" not in row and row["processes"] >= 1
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())  # looked for once per process
    assert "gpus" not in UsageSampler(os.getpid(), tmp_path, interval_s=60).write_sample()


def test_a_command_ending_before_the_baseline_is_never_walked(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    walks: list[int] = []
    monkeypatch.setattr(usage._Tree, "sample", lambda self: walks.append(1) or (0.0, 0, 0))
    sampler = UsageSampler(os.getpid(), tmp_path, interval_s=60)
    sampler.start()
    sampler.stop()  # a task of `true` ends within milliseconds
    assert walks == [] and read_usage(tmp_path) == []


@pytest.mark.parametrize(
    ("script", "sampled"), [("true", False), ("sleep 1.5", True)], ids=["ends-at-once", "runs-on"]
)
def test_the_runner_starts_a_sampler_only_for_a_command_still_running_after_the_baseline_delay(
    make_run, monkeypatch, script: str, sampled: bool
) -> None:  # noqa: ANN001
    """A command that ends within the baseline delay gets no sampler thread at all (it would
    take no sample: issue 11's 1,000 tasks of `true`); one that runs on is sampled from its
    baseline at that delay, one line per interval, as before."""
    monkeypatch.setenv("TRAINYARD_USAGE_INTERVAL_S", "0.4")
    started: list[float] = []
    real_start = UsageSampler.start
    monkeypatch.setattr(
        UsageSampler,
        "start",
        lambda self: started.append(self.baseline_delay_s) or real_start(self),
    )
    run = make_run(script)
    assert execute(run) == 0
    assert started == ([0.0] if sampled else [])
    rows = read_usage(Path(run.run_dir))
    assert (len(rows) >= 1) is sampled  # sleeps 1.5 s: baseline at 0.4 s, then 0.4 s apart


def test_a_huge_usage_file_is_read_bounded_and_then_only_what_it_gained(tmp_path: Path) -> None:
    """Issue 24: the server read ``usage.jsonl`` whole on every dashboard poll (a task's
    attempt folder can hold a file of any size). Now a call holds at most the file's newest
    ``USAGE_READ_BYTES``, and the next reads only what was appended since."""
    import tracemalloc

    path = tmp_path / "usage.jsonl"
    row = json.dumps({"time_s": 1, "cpu_percent": 1.0, "pad": "x" * 200}) + "\n"
    with path.open("w") as handle:
        for _ in range(40):
            handle.write(row * 5000)  # ~45 MB in all
    tracemalloc.start()
    try:
        rows = read_usage(tmp_path, max_rows=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == 100
    assert peak < 3 * usage.USAGE_READ_BYTES, peak
    with path.open("r+b") as handle:  # spoil what was read: a re-read would show it
        handle.write(b"garbage that is no JSON")
    with path.open("a") as handle:
        handle.write(json.dumps({"time_s": 2, "cpu_percent": 2.0}) + "\n")
    rows = read_usage(tmp_path, max_rows=100)
    assert len(rows) == 100 and rows[-1] == {"time_s": 2, "cpu_percent": 2.0}
    assert rows[0]["time_s"] == 1


def test_a_usage_file_that_is_a_link_or_fifo_gives_no_rows(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"time_s": 1}\n')
    run = tmp_path / "run"
    run.mkdir()
    (run / "usage.jsonl").symlink_to(target)
    assert read_usage(run) == []
    fifo_run = tmp_path / "fifo"
    fifo_run.mkdir()
    os.mkfifo(fifo_run / "usage.jsonl")
    assert read_usage(fifo_run) == []
