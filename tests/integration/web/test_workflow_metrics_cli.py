"""``trainyard workflow metrics ID`` against a real server and a real sandboxed task: the
runner's utilisation samples and the task's metrics file, as a table and as JSON; the
dashboard's log stream delivers a line within 0.5 s of the task printing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from web_live_server import SPEC, LiveServer, server  # noqa: F401 - the fixture

TRAINYARD = Path(sys.executable).parent / "trainyard"


def _cli(live: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(TRAINYARD_HOME=str(live.home), COLUMNS="200")
    return subprocess.run(
        [str(TRAINYARD), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _wait_end(live: LiveServer, wid: str, timeout_s: float = 180) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = live.api("GET", f"/api/workflow/{wid}").json()["status"]
        if status == "COMPLETED" or status.startswith("FAILED"):
            return status
        time.sleep(0.3)
    raise AssertionError(f"{wid} did not end in {timeout_s} s")


def test_workflow_metrics_table_and_json(server: LiveServer) -> None:  # noqa: F811
    wid = server.api("POST", "/api/workflow", json={"spec_text": SPEC}).json()["id"]
    assert _wait_end(server, wid) == "COMPLETED"
    done = _cli(server, "workflow", "metrics", wid, "-t", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    [summary] = data["summary"]
    assert summary["task"] == "fit" and summary["samples"] >= 3  # 1 s samples over ~8 s
    assert summary["rss_peak_bytes"] > 1_000_000
    [curve] = data["curves"]
    assert curve["file"] == "metrics.jsonl" and [p[0] for p in curve["series"]["loss"]] == [
        1.0,
        2.0,
        3.0,
        4.0,
        5.0,
    ]
    assert curve["x"] == "epoch"  # the data's x axis (issue 28)
    table = _cli(server, "workflow", "metrics", wid)
    assert table.returncode == 0, table.stderr
    assert "utilisation of " + wid in table.stdout and "training curves" in table.stdout
    assert "fit/0" in table.stdout and "0.4" in table.stdout  # the last loss, 2/5
    assert "epoch 5" in table.stdout  # how far it got, on its own x axis


def test_log_stream_delivers_a_line_within_half_a_second(server: LiveServer) -> None:  # noqa: F811
    """The task prints a wall-clock stamp; the SSE reader compares it with its own clock."""
    spec = SPEC.replace(
        'print(f"epoch {epoch} loss {loss:.3f}", flush=True)',
        'print(f"stamp {time.time():.3f}", flush=True)',
    )
    wid = server.api("POST", "/api/workflow", json={"spec_text": spec}).json()["id"]
    delays = []
    cookies = httpx.post(server.url + "/login", data={"token": server.token}).cookies
    with httpx.stream(
        "GET", f"{server.url}/workflows/{wid}/logs/stream?task=fit", cookies=cookies, timeout=180
    ) as answer:
        for raw in answer.iter_lines():
            if raw.startswith("data: {\"") and "stamp " in raw:
                stamp = float(json.loads(raw[6:])["line"].split()[-1])
                delays.append(time.time() - stamp)
    assert len(delays) == 5, delays
    # The first line may have been written before the stream opened; the others are
    # followed. The median is the benchmark's figure (docs/benchmarks.md); one slow line on
    # a loaded 2-core machine is allowed up to 2 s.
    followed = sorted(delays[1:])
    assert (followed[1] + followed[2]) / 2 < 0.5 and followed[-1] < 2.0, delays
