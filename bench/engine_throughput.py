"""Engine benchmarks (issue 3), not timed tests.

1. Overhead: submit -> both tasks of a 2-task group RUNNING, on the local backend, next to
   starting the same two processes by hand (subprocess.Popen of the same command).
2. Throughput: a workflow of N independent tasks running `true` (default 1,000): tasks/s
   from submit to COMPLETED; and a 10,000-task workflow completing, with peak memory (RSS) of
   the engine process. ``--backend fake`` measures the engine alone (scripted backend).
   As the server does at its start (``server/__main__.py``), the host's folders are looked
   at once (``warm_host_scans``) before the clock starts: a server's first task does not
   wait for that walk (0.6 s of /usr here), so a timed one must not either.

Usage:
    .venv/bin/python bench/engine_throughput.py overhead [--repeat 5]
    .venv/bin/python bench/engine_throughput.py throughput --tasks 1000 [--backend local|fake]
        [--egress on|off]   (each group's namespace with or without pasta, issue 11)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

from trainyard.backends.fake import FakeBackend
from trainyard.backends.local.launcher import address_name
from trainyard.backends.local.sandbox import warm_host_scans
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool, default_local_pool
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status
from trainyard.store import Store


def _engine(home: Path, backend: str, pool: Pool) -> Engine:
    factory = (lambda p, h: FakeBackend()) if backend == "fake" else None
    return Engine(
        Store(f"sqlite:///{home / 'db'}"),
        home,
        pools={pool.name: pool},
        backend_factory=factory,
        poll_interval_s=0.02,
    )


def _gang_spec(command: list[str]) -> WorkflowSpec:
    tasks = [{"name": n, "command": command, "lead": n == "a"} for n in ("a", "b")]
    return WorkflowSpec.model_validate({"name": "gang", "groups": [{"name": "g", "tasks": tasks}]})


def _time_to_running(engine: Engine, pool: Pool, command: list[str]) -> float:
    start = time.perf_counter()
    wid = engine.submit(Submission(_gang_spec(command), "", "bench", pool)).id
    while True:
        tasks = engine.state(wid).tasks.values()
        if all(t.status is Status.RUNNING for t in tasks):
            elapsed = time.perf_counter() - start
            engine.cancel(wid)
            return elapsed
        time.sleep(0.002)


def _by_hand(command: list[str]) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen(command) for _ in range(2)]
    elapsed = time.perf_counter() - start
    for proc in procs:
        proc.kill()
        proc.wait()
    return elapsed


def overhead(repeat: int) -> None:
    command = ["sleep", "30"]
    pool = default_local_pool()
    with tempfile.TemporaryDirectory() as tmp:
        engine = _engine(Path(tmp), "local", pool)
        stop = threading.Event()
        threading.Thread(target=engine.run_forever, args=(stop,), daemon=True).start()
        ours = [_time_to_running(engine, pool, command) for _ in range(repeat)]
        stop.set()
    hand = [_by_hand(command) for _ in range(repeat)]
    med_ours, med_hand = statistics.median(ours), statistics.median(hand)
    print(
        f"submit -> 2 tasks RUNNING: median {med_ours:.3f} s (min {min(ours):.3f}, "
        f"max {max(ours):.3f}) over {repeat}"
    )
    print(f"by hand (2 x Popen):       median {med_hand:.4f} s")
    print(f"overhead: {med_ours - med_hand:.3f} s")


def throughput(n_tasks: int, backend: str, options: dict[str, str], egress: bool = True) -> None:
    nodes = [NodeSpec(name=f"local-{i}", cpu=100_000) for i in range(4)]
    pool = Pool(name="bench", backend="local", nodes=nodes, options=options, egress=egress)
    tasks = [{"name": f"t{i}", "command": ["true"]} for i in range(n_tasks)]
    spec = WorkflowSpec.model_validate({"name": "many", "tasks": tasks})
    with tempfile.TemporaryDirectory() as tmp:
        engine = _engine(Path(tmp), backend, pool)
        if backend == "local":
            warm_host_scans()  # the server's start does it (server/__main__.py)
        sampler = _LauncherCpu(Path(tmp) / "local")
        own_before, busy_before = _own_cpu_s(), _busy_cpu_s()
        start = time.perf_counter()
        wid = engine.submit(Submission(spec, "", "bench", pool)).id
        record = engine.wait(wid, timeout_s=3600)
        elapsed = time.perf_counter() - start
        own, busy = _own_cpu_s() - own_before, _busy_cpu_s() - busy_before
        tasks_cpu, launcher_cpu = sampler.stop()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{n_tasks} tasks ({backend}): {record.status} in {elapsed:.1f} s = "
        f"{n_tasks / elapsed:.1f} tasks/s; peak RSS {rss_mib:.0f} MiB; load average "
        f"{os.getloadavg()[0]:.1f}; egress {'on' if egress else 'off'}"
    )
    print(
        f"CPU per task: engine {1000 * own / n_tasks:.1f} ms, launcher + runners + commands "
        f"{1000 * tasks_cpu / n_tasks:.1f} ms (launcher itself {1000 * launcher_cpu / n_tasks:.1f}); "
        f"machine busy {busy:.1f} CPU-s (any process's)"
    )


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _busy_cpu_s() -> float:
    """The whole machine's non-idle CPU seconds so far (``/proc/stat``; other users' too)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _live_children_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of ``proc``'s children that still run, with the children they reaped: the
    launcher's helpers, which live as long as it does (the egress router's pasta, the user
    namespace gate and its per-task children), and whatever task is running at that moment."""
    total = 0.0
    for child in proc.children():
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


class _LauncherCpu:
    """CPU seconds of the local backend's launcher and its children, reaped (runners, and
    through them the sandboxed commands) or alive (``_live_children_cpu_s``); 0 for the fake
    backend. The launcher's own times are read every 0.2 s (one ``/proc`` file), its live
    children, a walk of the whole process table (~3-5 ms here, in the engine's process),
    every ``CHILDREN_EVERY_S`` and once more at ``stop``: the launcher and its helpers outlive
    the run (it exits only after its idle time), and walking the table five times a second
    took ~5 % of the engine process's samples (py-spy, 2026-11-25)."""

    CHILDREN_EVERY_S = 2.0

    def __init__(self, state_dir: Path) -> None:
        self.name = address_name(state_dir)
        self.last = self.own = self.children = 0.0
        self.proc: psutil.Process | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def stop(self) -> tuple[float, float]:
        """(the launcher's tree, the launcher alone) in CPU seconds."""
        self.done.set()
        self.thread.join()
        self._read(with_children=True)
        return self.last, self.own

    def _sample(self) -> None:
        children_at = 0.0
        while True:
            now = time.monotonic()
            with_children = now - children_at >= self.CHILDREN_EVERY_S
            self._read(with_children)
            if with_children:
                children_at = now
            if self.done.wait(0.2):
                return

    def _read(self, with_children: bool) -> None:
        try:
            self.proc = self.proc or self._find()
            if self.proc is None:
                return
            times = self.proc.cpu_times()
            if with_children:
                self.children = _live_children_cpu_s(self.proc)
            self.own = times.user + times.system
            self.last = self.own + times.children_user + times.children_system + self.children
        except psutil.Error:
            self.proc = None

    def _find(self) -> psutil.Process | None:
        for proc in psutil.process_iter(["cmdline", "ppid"]):
            with contextlib.suppress(psutil.Error):
                if self.name in (proc.info["cmdline"] or []) and (
                    self.name not in psutil.Process(proc.info["ppid"]).cmdline()
                ):
                    return proc  # the launcher, not one of its forked children
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--repeat", type=int, default=5)
    t = sub.add_parser("throughput")
    t.add_argument("--tasks", type=int, default=1000)
    t.add_argument("--backend", choices=("local", "fake"), default="local")
    t.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto")
    t.add_argument("--network", choices=("auto", "netns", "loopback"), default="auto")
    t.add_argument("--egress", choices=("on", "off"), default="on")
    args = parser.parse_args()
    if args.what == "overhead":
        overhead(args.repeat)
    else:
        throughput(
            args.tasks,
            args.backend,
            {"sandbox": args.sandbox, "network": args.network},
            egress=args.egress == "on",
        )


if __name__ == "__main__":
    main()
