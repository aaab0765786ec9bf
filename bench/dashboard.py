"""Dashboard benchmarks (issue 13), rough, not timed tests.

1. List page: a store holding ``--workflows`` (default 10,000) workflows; the server time of
   ``GET /`` (first page, a deep page, a status filter, a label filter), measured in-process
   with FastAPI's TestClient (no network), median and max of ``--repeat`` requests.
2. Log follow: a real server (``python -m trainyard.server``) in a fresh home runs a task that
   prints its wall-clock time every 1.5 s; the dashboard's SSE stream is read and each line's
   delay from print to arrival measured.
3. Utilisation sampling: CPU seconds of one ``UsageSampler.write_sample`` on process trees of
   1, 5 and 20 processes, and the share of one core that costs at the default 2 s interval.

Usage:
    .venv/bin/python bench/dashboard.py [--workflows 10000] [--repeat 20] [--skip-follow]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def bench_list(count: int, repeat: int) -> dict[str, dict[str, float]]:
    """Median and max milliseconds of the list page's requests over ``count`` workflows."""
    from fastapi.testclient import TestClient

    from trainyard.backends.fake import FakeBackend, Outcome
    from trainyard.engine.reconciler import Engine
    from trainyard.engine.serialize import state_to_dict
    from trainyard.pools import default_local_pool
    from trainyard.server.app import create_app
    from trainyard.server.auth import TokenRegistry
    from trainyard.server.service import Service
    from trainyard.store import Store
    from trainyard.store.db import _Workflow

    home = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    store = Store(f"sqlite:///{home / 'db'}")
    engine = Engine(
        store,
        home,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: FakeBackend(lambda launch: Outcome(0)),
    )
    state = state_to_dict(_one_task_state())
    started = time.perf_counter()
    with store._tx() as session:  # one transaction: the bench's setup, not what it measures
        for i in range(count):
            session.add(
                _Workflow(
                    id=f"bench-{i + 1}",
                    seq=i + 1,
                    name="bench",
                    status="COMPLETED" if i % 3 else "FAILED",
                    pool="local",
                    submitted_by="bench",
                    labels={"shard": str(i % 10)},
                    submit_time_s=1.7e9 + i,
                    end_time_s=1.7e9 + i + 5,
                    spec_text="workflow: {}\n" * 40,
                    source={},
                    state=state,
                )
            )
    print(f"stored {count} workflows in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    tokens = TokenRegistry(home)
    bearer = {"Authorization": f"Bearer {(home / 'token').read_text().strip()}"}
    queries = {
        "first page (50)": "/",
        "page 100 (50)": f"/?page={count // 100}",
        "status=FAILED": "/?status=FAILED",
        "label shard=3": "/?label=shard%3D3",
        "200 per page": "/?per_page=200",
    }
    results = {}
    with TestClient(create_app(Service(engine), tokens, run_engine=False)) as client:
        for name, path in queries.items():
            client.get(path, headers=bearer)  # warm
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                answer = client.get(path, headers=bearer)
                times.append((time.perf_counter() - t0) * 1000)
                assert answer.status_code == 200, answer.text[:200]
            assert answer.text.count('class="wf-link"') == (200 if "per_page" in path else 50)
            results[name] = {
                "median_ms": round(statistics.median(times), 1),
                "max_ms": round(max(times), 1),
            }
        t0 = time.perf_counter()
        client.get("/api/workflow?count=50", headers=bearer)  # loads every row, then cuts
        results["for comparison: GET /api/workflow?count=50"] = {
            "median_ms": round((time.perf_counter() - t0) * 1000, 1),
            "max_ms": 0.0,
        }
    shutil.rmtree(home, ignore_errors=True)
    return results


def _one_task_state():  # noqa: ANN202 - engine.machine types, imported late
    from trainyard.engine import machine as m

    groups = {"g": m.GroupState("g", ["t"])}
    return m.WorkflowState("bench", groups, {"t": m.TaskState("t", "g", True)})


FOLLOW_SPEC = """
workflow:
  name: follow
  tasks:
  - name: clock
    image: ubuntu:24.04
    command: [python3, -c]
    args: ["import time\\nfor i in range(12):\\n    time.sleep(1.5)\\n    print('stamp %.3f' % time.time(), flush=True)"]
"""


def bench_follow() -> dict[str, float]:
    """Delays (s) from a task's print to the SSE line arriving, over a real server."""
    home = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    env = {**os.environ, "TRAINYARD_HOME": str(home)}
    env.pop("TRAINYARD_SERVER_URL", None)
    env.pop("TRAINYARD_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "trainyard.server"], env=env)
    try:
        while not (home / "server.json").exists():
            time.sleep(0.1)
        url = json.loads((home / "server.json").read_text())["url"]
        token = (home / "token").read_text().strip()
        wid = httpx.post(
            url + "/api/workflow",
            json={"spec_text": FOLLOW_SPEC},
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
        ).json()["id"]
        delays = []
        with httpx.stream(
            "GET",
            f"{url}/workflows/{wid}/logs/stream",
            timeout=120,
            headers={"Authorization": f"Bearer {token}"},
        ) as answer:
            for raw in answer.iter_lines():
                if raw.startswith('data: {"') and "stamp " in raw:
                    delays.append(time.time() - float(json.loads(raw[6:])["line"].split()[-1]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    followed = delays[1:]  # the first may predate the stream
    return {
        "lines": len(followed),
        "median_s": round(statistics.median(followed), 3),
        "max_s": round(max(followed), 3),
    }


def bench_sampling(samples: int = 200) -> dict[str, dict[str, float]]:
    """CPU seconds per sample, and % of one core at the default interval, per tree size."""
    from trainyard.runner.usage import DEFAULT_INTERVAL_S, UsageSampler

    results = {}
    for size in (1, 5, 20):
        code = (
            "import subprocess, sys, time\n"
            f"kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']) "
            f"for _ in range({size - 1})]\ntime.sleep(120)"
        )
        root = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(1.5)
        folder = Path(tempfile.mkdtemp(prefix="bench-usage-"))
        sampler = UsageSampler(root.pid, folder, DEFAULT_INTERVAL_S)
        sampler.write_sample()
        t0 = time.process_time()
        for _ in range(samples):
            row = sampler.write_sample()
        per_sample_s = (time.process_time() - t0) / samples
        import psutil

        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()
        shutil.rmtree(folder, ignore_errors=True)
        results[f"{row['processes']} processes"] = {
            "cpu_ms_per_sample": round(per_sample_s * 1000, 3),
            "core_percent_at_2s": round(per_sample_s / DEFAULT_INTERVAL_S * 100, 3),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--skip-follow", action="store_true")
    args = parser.parse_args()
    report = {"list_page": bench_list(args.workflows, args.repeat), "sampling": bench_sampling()}
    if not args.skip_follow:
        report["log_follow"] = bench_follow()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
