"""API load benchmark (issue 4), loopback only, not a timed test.

N concurrent submissions (default 100, one thread each, released together by a barrier) of a
one-task workflow running ``true``, through the REST API with httpx, against a real server
that this script starts in a fresh ``TRAINYARD_HOME`` (the CLI's background start) and stops
at the end. Every submission must be accepted (HTTP 200) and every workflow must COMPLETE.

Reports: p50/p99/max latency of the submit calls, the time until all are accepted, and the
time from the first submit until every workflow is terminal.

``--network loopback`` runs the local pool without per-group network namespaces, to show
what the per-group network namespaces cost.

Usage:
    .venv/bin/python bench/api_load.py [--submissions 100] [--network auto|loopback]
                                       [--timeout-s 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

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
        if len(status) == len(ids) and all(s.startswith(("COMPLETED", "FAILED"))
                                           for s in status.values()):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all terminal after {timeout_s}s: {status}")
        time.sleep(0.5)


def run(count: int, timeout_s: float, home: Path, network: str = "auto") -> dict[str, object]:
    os.environ["TRAINYARD_HOME"] = str(home)
    if network != "auto":
        (home / "pools.yaml").write_text(
            f"pools:\n  local:\n    backend: local\n    options: {{network: {network}}}\n")
    info = process.start_background(home)
    token = (home / "token").read_text().strip()
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    try:
        with httpx.Client(base_url=info.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=120, limits=limits) as client:
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
        "submissions": count, "accepted": len(ids), "completed": completed,
        "submit_p50_ms": round(1000 * statistics.median(latencies), 1),
        "submit_p99_ms": round(1000 * percentile(latencies, 99), 1),
        "submit_max_ms": round(1000 * max(latencies), 1),
        "all_accepted_s": round(accepted_s, 2), "all_completed_s": round(done_s, 2),
        "network": network, "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=100)
    parser.add_argument("--network", choices=("auto", "loopback"), default="auto",
                        help="the local pool's network option")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainyard-api-load-") as tmp:
        report = run(args.submissions, args.timeout_s, Path(tmp), args.network)
    if args.json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        print(f"{key:>16}: {value}")
    if report["completed"] != args.submissions:
        raise SystemExit("not every workflow completed")


if __name__ == "__main__":
    main()
