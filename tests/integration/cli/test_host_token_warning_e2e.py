"""Issue 25: a ``{{host:NAME}}`` naming no task is a warning (OSMO accepts the spec; the
token stays as written and fails at run time), ``validate --strict`` refuses it."""

from __future__ import annotations

from pathlib import Path

from cli_e2e_support import Server

SPEC = """\
workflow:
  name: host-typo
  pool: osmo
  groups:
  - name: nim
    tasks:
    - {name: run-server, lead: true, command: [sh, -c, "sleep 1"]}
    - {name: nim-client, command: [sh, -c, "echo peer={{host:nim-server}}"]}
"""
HINT = "no task named 'nim-server'; group 'nim' has run-server, nim-client"


def test_validate_warns_strict_refuses_submit_runs(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    checked = server.cli("workflow", "validate", str(spec))
    assert checked.code == 0, checked.err
    assert HINT in checked.err and "warning" in checked.err
    strict = server.cli("workflow", "validate", str(spec), "--strict")
    assert strict.code == 2 and HINT in strict.err
    workflow_id = server.submit(spec)
    assert server.wait(workflow_id)["status"] == "COMPLETED"
    assert "peer={{host:nim-server}}" in server.logs(workflow_id)
