"""Issue 25: an output URL with ``{{workflow_id}}`` is printed resolved (``--wait``, ``query
-f json``): the URL a script follows is where the files are."""

from __future__ import annotations

import json
from pathlib import Path

from cli_e2e_support import Server


def test_wait_and_query_print_the_resolved_output_url(server: Server, tmp_path: Path) -> None:
    storage = server.home / "storage" / "resolved"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""\
workflow:
  name: out-url
  pool: osmo
  tasks:
  - name: t
    command: [sh, -c, "echo hi > {{{{output}}}}/f.txt"]
    outputs:
    - url: file://{storage}/{{{{workflow_id}}}}/
""")
    waited = server.cli("workflow", "submit", str(spec), "--wait")
    assert waited.code == 0, waited.err + waited.out
    workflow_id = next(w for w in server.ids() if w.startswith("out-url-"))
    resolved = f"file://{storage}/{workflow_id}/"
    assert (storage / workflow_id / "f.txt").read_text() == "hi\n"
    assert f"uploaded to {resolved}" in waited.out, waited.out
    assert "{{workflow_id}}" not in waited.out
    queried = server.cli("workflow", "query", workflow_id, "-f", "json").json()
    outputs = [o for g in queried["groups"] for t in g["tasks"] for o in t["outputs"]]
    assert outputs == [resolved], json.dumps(queried)
