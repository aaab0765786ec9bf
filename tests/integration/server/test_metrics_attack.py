"""Issue 24, "GET /api/workflow/ID/metrics loads the whole metrics file": a task writes a
huge ``metrics.jsonl`` into its output and the metrics API is asked for it, three at once, as
the workflow page polls. Against a real server: the server's peak memory grows by far less
than the file, the answer is a chart's worth of points, and asking again is fast (cached by
file offset)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import Live

FILE_MB = 300

WRITER = f"""
workflow:
  name: metrics-bomb
  tasks:
  - name: t
    command: [python3, -c]
    args:
    - |
      import json, sys
      rows = "".join(json.dumps({{"step": i, "loss": 1 / (i + 1), "acc": 0.5}}) + "\\n"
                     for i in range(20000))
      with open(sys.argv[1] + "/metrics.jsonl", "w") as out:
          while out.tell() < {FILE_MB} << 20:
              out.write(rows)
      print("written", flush=True)
      import time; time.sleep(600)
    - "{{{{output}}}}"
"""


def peak_rss_bytes(live: Live) -> int:
    """The server process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{live.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_three_metrics_requests_on_a_300_mb_file_keep_the_server_small(live: Live) -> None:
    wid = live.submit(WRITER)
    live.wait_running(wid)
    deadline = time.monotonic() + 180
    while "written" not in live.api("GET", f"/api/workflow/{wid}/logs").text:
        assert time.monotonic() < deadline, "the task did not write its metrics file"
        time.sleep(1)
    before = peak_rss_bytes(live)
    started = time.monotonic()
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(lambda _: live.api("GET", f"/api/workflow/{wid}/metrics"), range(3))
        )
    took_s = time.monotonic() - started
    grown = peak_rss_bytes(live) - before
    assert all(a.status_code == 200 for a in answers), answers[0].text
    assert grown < 100 << 20, f"the server grew {grown >> 20} MB for a {FILE_MB} MB file"
    series = answers[0].json()["curves"][0]["series"]
    assert set(series) == {"loss", "acc"} and 10 < len(series["loss"]) <= 1001
    started = time.monotonic()
    assert live.api("GET", f"/api/workflow/{wid}/metrics").status_code == 200
    assert time.monotonic() - started < 2.0, "a second read of an unchanged file is not cached"
    assert took_s < 60, took_s
