"""Issue 25: a task stopped because its group's lead finished has one status and OSMO's
reason "Lead task finished" in the store, and query, events, ``--wait``, logs and the
dashboard all say so."""

from __future__ import annotations

import html
import re
from pathlib import Path

import httpx
from cli_e2e_support import Server

SPEC = """\
workflow:
  name: lead-fin
  pool: osmo
  groups:
  - name: g
    tasks:
    - {name: lead, lead: true, command: [sh, -c, "sleep 2; echo lead done"]}
    - {name: side, command: [sh, -c, "sleep 300"]}
"""
REASON = "Lead task finished"


def test_every_view_says_lead_task_finished(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    waited = server.cli("workflow", "submit", str(spec), "--wait")
    assert waited.code == 0, waited.out + waited.err
    workflow_id = next(w for w in server.ids() if w.startswith("lead-fin-"))
    assert re.search(rf"g/side COMPLETED on \S+ \(no exit code\): {REASON}", waited.out), waited.out

    tasks = {t["name"]: t for g in server.query(workflow_id)["groups"] for t in g["tasks"]}
    assert (tasks["side"]["status"], tasks["side"]["failure_reason"]) == ("COMPLETED", REASON)
    assert tasks["side"]["end_time"] is not None
    assert tasks["lead"]["failure_reason"] is None

    shown = server.cli("workflow", "query", workflow_id).out
    assert f"side retry 0 ended: {REASON}" in shown, shown

    events = server.cli("workflow", "events", workflow_id, "--format-type", "json").json()
    side = [(e["event"], e["message"]) for e in events if e["task"] == "side"]
    assert ("COMPLETED", REASON) in side and ("EXITED", REASON) in side, side
    assert not any(m and "SIGTERM" in m for _e, m in side)

    assert f"[side][trainyard] {REASON}: the task is stopped" in server.logs(workflow_id)

    with httpx.Client(base_url=server.url, follow_redirects=True) as web:
        web.post("/login", data={"token": server.token, "next": "/"})
        page = web.get(f"/workflows/{workflow_id}").text
    row = next(r for r in page.split("<tr>") if "<td>side</td>" in r)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    assert html.unescape(cells[7]).strip() == REASON, cells  # Reason
    assert cells[6].strip() not in ("-", ""), cells  # Ended
