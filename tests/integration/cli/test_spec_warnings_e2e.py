"""Issue 14 end to end: a key given twice in one mapping runs as in OSMO (the last value
wins) through the real CLI and server, warned about on ``validate`` (``-t json`` list,
``--strict``), ``spec`` and ``submit``; the task runs with the value OSMO would use."""

from __future__ import annotations

import json
from pathlib import Path

from cli_e2e_support import Server, run_cli

# OSMO cookbook, GitHub integration example: `path` repeated with the same value.
COOKBOOK = """workflow:
  name: cookbook-dupkey
  tasks:
  - name: clone
    command: [sh, /tmp/entry.sh]
    files:
    - path: /tmp/entry.sh
      contents: |-
        echo cookbook entry ran
      path: /tmp/entry.sh
"""
# Different values: OSMO (PyYAML) runs the last.
DIFFERENT = """workflow:
  name: dupkey-differs
  tasks:
  - name: t
    command: [sh, -c]
    args: ["echo FIRST value ran"]
    args: ["echo LAST value ran"]
"""


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_validate_and_spec_through_the_server_warn_and_strict_refuses(
    server: Server, tmp_path: Path
) -> None:
    path = _file(tmp_path, "gh.yaml", COOKBOOK)
    warning = (
        f"{path}:10: warning: workflow.tasks[0].files[0].path: key 'path' is given twice "
        "in one mapping (lines 7 and 10) with the same value"
    )
    checked = server.cli("workflow", "validate", path)
    assert checked.code == 0 and checked.out == "Workflow validation succeeded.\n"
    assert checked.err.startswith(warning), checked.err
    as_json = server.cli("workflow", "validate", path, "-t", "json")
    data = json.loads(as_json.out)
    assert (as_json.code, data["valid"], data["server"]) == (0, True, server.url)
    assert [(w["path"], w["line"]) for w in data["warnings"]] == [
        ("workflow.tasks[0].files[0].path", 10)
    ]
    strict = server.cli("workflow", "validate", path, "--strict", "-t", "json")
    assert strict.code == 2 and json.loads(strict.out)["valid"] is False
    assert strict.err.startswith(f"{path}:10: workflow.tasks[0].files[0].path: key 'path'")
    shown = server.cli("workflow", "spec", path)
    assert (shown.code, shown.out) == (0, COOKBOOK) and shown.err.startswith(warning)


def test_submit_warns_and_runs_what_osmo_runs(server: Server, tmp_path: Path) -> None:
    cookbook = server.cli("workflow", "submit", _file(tmp_path, "gh.yaml", COOKBOOK))
    assert cookbook.code == 0 and "Workflow submitted: cookbook-dupkey-" in cookbook.out
    assert "warning: workflow.tasks[0].files[0].path: key 'path' is given twice" in cookbook.err
    differs = server.cli("workflow", "submit", _file(tmp_path, "d.yaml", DIFFERENT), "-t", "json")
    answer = json.loads(differs.out)
    (warning,) = answer["warnings"]
    assert (
        warning["line"] == 7
        and "the value of line 7 (['echo LAST value ran']) is used" in warning["message"]
    )
    assert "warning: workflow.tasks[0].args" in differs.err
    cookbook_id = cookbook.out.split("Workflow submitted: ")[1].strip()
    assert server.wait(cookbook_id)["status"] == "COMPLETED"
    assert "cookbook entry ran" in server.logs(cookbook_id)
    assert server.wait(answer["id"])["status"] == "COMPLETED"
    logs = server.logs(answer["id"])
    assert "LAST value ran" in logs and "FIRST value ran" not in logs


def test_validate_without_a_server_warns_the_same(tmp_path: Path) -> None:
    home = tmp_path / "no server"
    path = _file(tmp_path, "d.yaml", DIFFERENT)
    got = run_cli(home, "workflow", "validate", path, "-t", "json")
    assert got.code == 0 and json.loads(got.out)["server"] is None
    assert json.loads(got.out)["warnings"][0]["line"] == 7
    assert not (home / "server.json").exists()
