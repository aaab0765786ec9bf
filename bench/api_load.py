"""API load benchmark (issue 4), loopback only, not a timed test.

N concurrent submissions (default 100, one thread each, released together by a barrier) of a
one-task workflow running ``true``, through the REST API with httpx, against a real server
that this script starts in a fresh ``TRAINYARD_HOME`` (the CLI's background start) and stops
at the end. Every submission must be accepted (HTTP 200) and every workflow must COMPLETE.

Reports: p50/p99/max latency of the submit calls, the time until all are accepted, and the
time from the first submit until every workflow is terminal.

``--network loopback`` runs the local pool without per-group network namespaces, to show
what the per-group network namespaces cost.

``--streams`` (issue 24) measures instead whether the API stays responsive under log
streams: one task prints fast (``--lines-per-s``), ``--followers`` clients follow its log
(``GET /api/workflow/ID/logs?follow=true``, with the task's own token) and ``--sse``
dashboard streams read it (``/workflows/ID/logs/stream?lines=100000``), each read by one
selector loop of this script as fast as it comes; meanwhile, for ``--seconds``,
``/api/health`` is timed every 0.1 s and ``workflow submit`` (``POST /api/workflow``)
every 2 s, each on a new connection, and the server's RSS is sampled. Reports health and
submit p50/p99/max, the server's RSS at the start, its peak and at the end, how many
streams answered 200 and the log bytes they received.

Usage:
    .venv/bin/python bench/api_load.py [--submissions 100] [--network auto|loopback]
                                       [--timeout-s 600] [--json]
    .venv/bin/python bench/api_load.py --streams [--followers 200] [--sse 20]
                                       [--seconds 30] [--lines-per-s 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from trainyard import tasktokens
from trainyard.server import process

SPEC = """
workflow:
  name: load
  tasks:
  - name: t
    command: ["true"]
"""


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of ``values`` (pct in 0..100)."""
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def submit_concurrently(client: httpx.Client, count: int) -> list[tuple[float, httpx.Response]]:
    """``count`` submissions at once; (latency_s, response) of each."""
    barrier = threading.Barrier(count)

    def one(_index: int) -> tuple[float, httpx.Response]:
        barrier.wait()
        start = time.perf_counter()
        answer = client.post("/api/workflow", json={"spec_text": SPEC})
        return time.perf_counter() - start, answer

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def wait_all_terminal(client: httpx.Client, ids: set[str], timeout_s: float) -> dict[str, str]:
    """Poll the list until every id is COMPLETED or FAILED*; status by id."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = client.get("/api/workflow", params={"name": "load"}).json()
        status = {w["id"]: w["status"] for w in rows if w["id"] in ids}
        if len(status) == len(ids) and all(
            s.startswith(("COMPLETED", "FAILED")) for s in status.values()
        ):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all terminal after {timeout_s}s: {status}")
        time.sleep(0.5)


def run(count: int, timeout_s: float, home: Path, network: str = "auto") -> dict[str, object]:
    os.environ["TRAINYARD_HOME"] = str(home)
    if network != "auto":
        (home / "pools.yaml").write_text(
            f"pools:\n  local:\n    backend: local\n    options: {{network: {network}}}\n"
        )
    info = process.start_background(home)
    token = (home / "token").read_text().strip()
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    try:
        with httpx.Client(
            base_url=info.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
            limits=limits,
        ) as client:
            started = time.perf_counter()
            results = submit_concurrently(client, count)
            accepted_s = time.perf_counter() - started
            refused = [r.text for _, r in results if r.status_code != 200]
            if refused:
                raise SystemExit(f"{len(refused)} submissions refused, first: {refused[0]}")
            ids = {r.json()["id"] for _, r in results}
            status = wait_all_terminal(client, ids, timeout_s)
            done_s = time.perf_counter() - started
    finally:
        process.stop(home)
    latencies = [lat for lat, _ in results]
    completed = sum(s == "COMPLETED" for s in status.values())
    return {
        "submissions": count,
        "accepted": len(ids),
        "completed": completed,
        "submit_p50_ms": round(1000 * statistics.median(latencies), 1),
        "submit_p99_ms": round(1000 * percentile(latencies, 99), 1),
        "submit_max_ms": round(1000 * max(latencies), 1),
        "all_accepted_s": round(accepted_s, 2),
        "all_completed_s": round(done_s, 2),
        "network": network,
        "cpus": os.cpu_count(),
    }


PRINTER = """
workflow:
  name: printer
  tasks:
  - name: t
    command: [python3, -c]
    args:
    - |
      import sys, time
      rate = int(sys.argv[1])
      i = 0
      while True:
          for _ in range(rate // 20):
              print(f"line {i} of a task that prints fast, as a training loop's logging does")
              i += 1
          sys.stdout.flush()
          time.sleep(0.05)
    - "{rate}"
"""


class StreamReaders:
    """Raw HTTP GETs held open and drained by one selector thread (no thread per stream)."""

    def __init__(self, url: str) -> None:
        self.where = urlsplit(url)
        self.selector = selectors.DefaultSelector()
        self.bytes_read = 0
        self.ok = 0
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)

    def open(self, path: str, token: str) -> None:
        sock = socket.create_connection((self.where.hostname, self.where.port), timeout=30)
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {self.where.netloc}\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, data={"first": True})
        self.opened += 1

    def start(self) -> None:
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                try:
                    chunk = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                if key.data["first"] and chunk:
                    key.data["first"] = False
                    self.ok += chunk.startswith(b"HTTP/1.1 200")
                self.bytes_read += len(chunk)
                if not chunk:
                    self.selector.unregister(key.fileobj)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def drain_streams(url: str, paths: list[tuple[str, str]], stop: Any, out: Any) -> None:
    """Open a stream of each (path, token) and read them all until ``stop`` is set; then put
    (answered 200, opened, bytes read) on ``out`` (run in a process of its own)."""
    readers = StreamReaders(url)
    for path, token in paths:
        readers.open(path, token)
    readers.start()
    stop.wait()
    readers.close()
    out.put((readers.ok, readers.opened, readers.bytes_read))


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` now."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def health_s(url: str, timeout_s: float = 10.0) -> float:
    """Seconds for one ``GET /api/health`` on a new connection, from connect to the whole
    answer; a raw socket, so that the client's own cost (an httpx client and its TLS
    context per call) stays out of the number. ``timeout_s`` when it took longer."""
    where = urlsplit(url)
    start = time.monotonic()
    try:
        with socket.create_connection((where.hostname, where.port), timeout=timeout_s) as sock:
            sock.sendall(
                f"GET /api/health HTTP/1.1\r\nHost: {where.netloc}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except TimeoutError:
        return timeout_s
    if not answer.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"health answered {answer[:100]!r}")
    return time.monotonic() - start


def timed_calls(url: str, token: str, seconds: float) -> tuple[list[float], list[float]]:
    """(health latencies, submit latencies) over ``seconds``: health every 0.1 s, a submit
    every 2 s, each on a new connection; a call over 10 s counts as 10 s."""
    health, submits = [], []
    deadline = time.monotonic() + seconds
    next_submit = time.monotonic()
    auth = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        health.append(health_s(url))
        if time.monotonic() >= next_submit:
            next_submit += 2.0
            start = time.monotonic()
            try:
                httpx.post(
                    url + "/api/workflow", json={"spec_text": SPEC}, headers=auth, timeout=10
                ).raise_for_status()
            except httpx.TimeoutException:
                pass
            submits.append(time.monotonic() - start)
        time.sleep(0.1)
    return health, submits


def _wait_running(client: httpx.Client, workflow_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get(f"/api/workflow/{workflow_id}").json()["status"] != "RUNNING":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{workflow_id} not RUNNING after {timeout_s}s")
        time.sleep(0.5)


def run_streams(
    home: Path, followers: int, sse: int, seconds: float, lines_per_s: int
) -> dict[str, object]:
    """The ``--streams`` measurement (see the module docstring)."""
    os.environ["TRAINYARD_HOME"] = str(home)
    info = process.start_background(home)
    token = (home / "token").read_text().strip()
    rss = [rss_bytes(info.pid)]
    try:
        with httpx.Client(
            base_url=info.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client:
            answer = client.post(
                "/api/workflow", json={"spec_text": PRINTER.replace("{rate}", str(lines_per_s))}
            )
            answer.raise_for_status()
            printer = answer.json()["id"]
            _wait_running(client, printer, 120)
            time.sleep(3)  # a log of some thousand lines already
            task_token = tasktokens.task_token(home, printer)
            paths = [(f"/api/workflow/{printer}/logs?follow=true", task_token)] * followers
            paths += [(f"/workflows/{printer}/logs/stream?lines=100000", token)] * sse
            drained, stop_drain = multiprocessing.Queue(), multiprocessing.Event()
            drainer = multiprocessing.Process(
                target=drain_streams, args=(info.url, paths, stop_drain, drained)
            )
            drainer.start()  # a process of its own: it does not slow this one's timing
            sampler_stop = threading.Event()

            def sample() -> None:
                while not sampler_stop.wait(0.5):
                    rss.append(rss_bytes(info.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            health, submits = timed_calls(info.url, token, seconds)
            sampler_stop.set()
            sampler.join()
            rss.append(rss_bytes(info.pid))
            stop_drain.set()
            ok, opened, bytes_read = drained.get(timeout=60)
            drainer.join(timeout=30)
            client.post(f"/api/workflow/{printer}/cancel")
    finally:
        process.stop(home)
    return {
        "followers": followers,
        "sse": sse,
        "seconds": seconds,
        "lines_per_s": lines_per_s,
        "streams_ok": ok,
        "streams_opened": opened,
        "log_mb_read": round(bytes_read / 2**20, 1),
        "health_calls": len(health),
        "health_p50_ms": round(1000 * statistics.median(health), 1),
        "health_p99_ms": round(1000 * percentile(health, 99), 1),
        "health_max_ms": round(1000 * max(health), 1),
        "submits": len(submits),
        "submit_p50_ms": round(1000 * statistics.median(submits), 1),
        "submit_max_ms": round(1000 * max(submits), 1),
        "rss_start_mb": round(rss[0] / 2**20, 1),
        "rss_peak_mb": round(max(rss) / 2**20, 1),
        "rss_end_mb": round(rss[-1] / 2**20, 1),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=100)
    parser.add_argument(
        "--network",
        choices=("auto", "loopback"),
        default="auto",
        help="the local pool's network option",
    )
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument(
        "--streams",
        action="store_true",
        help="measure health and submit under log followers and SSE streams",
    )
    parser.add_argument("--followers", type=int, default=200)
    parser.add_argument("--sse", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--lines-per-s", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainyard-api-load-") as tmp:
        if args.streams:
            report = run_streams(
                Path(tmp), args.followers, args.sse, args.seconds, args.lines_per_s
            )
        else:
            report = run(args.submissions, args.timeout_s, Path(tmp), args.network)
    if args.json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        print(f"{key:>16}: {value}")
    if not args.streams and report["completed"] != args.submissions:
        raise SystemExit("not every workflow completed")


if __name__ == "__main__":
    main()
