"""Spec warnings on the command line, without a server: stderr, ``-t json``, ``--strict``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainyard.cli.main import main

REPEATED = """workflow:
  name: gh
  tasks:
  - name: t
    command: [sh, /tmp/entry.sh]
    files:
    - path: /tmp/entry.sh
      contents: echo hi
      path: /tmp/{last}.sh
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.delenv("TRAINYARD_SERVER_URL", raising=False)
    monkeypatch.delenv("TRAINYARD_TOKEN", raising=False)
    return home


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def spec_file(tmp_path: Path, last: str = "entry") -> str:
    path = tmp_path / "gh.yaml"
    path.write_text(REPEATED.format(last=last))
    return str(path)


def test_validate_warns_on_stderr_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path)
    code, out, err = run(capsys, "workflow", "validate", path)
    assert (code, out) == (0, "Workflow validation succeeded.\n")
    assert err == (
        f"{path}:9: warning: workflow.tasks[0].files[0].path: key 'path' is given twice "
        "in one mapping (lines 7 and 9) with the same value; it is used once, as OSMO "
        "does; remove one\n"
    )


def test_validate_json_has_its_own_warnings_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, last="other")
    code, out, err = run(capsys, "workflow", "validate", path, "-t", "json")
    data = json.loads(out)
    assert (code, data["valid"], "problems" in data) == (0, True, False)
    (warning,) = data["warnings"]
    assert (warning["path"], warning["line"], warning["file"]) == (
        "workflow.tasks[0].files[0].path",
        9,
        path,
    )
    assert "the value of line 9 ('/tmp/other.sh') is used" in warning["message"]
    assert "warning:" in err


def test_strict_makes_warnings_problems_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path)
    code, out, err = run(capsys, "workflow", "validate", path, "--strict", "-t", "json")
    data = json.loads(out)
    assert (code, data["valid"], data["warnings"]) == (2, False, [])
    assert [(p["path"], p["line"]) for p in data["problems"]] == [
        ("workflow.tasks[0].files[0].path", 9)
    ]
    assert err.startswith(f"{path}:9: workflow.tasks[0].files[0].path: key 'path' is given twice")
    clean = tmp_path / "clean.yaml"
    clean.write_text(REPEATED.replace("      path: /tmp/{last}.sh\n", ""))
    assert run(capsys, "workflow", "validate", str(clean), "--strict")[0] == 0


def test_strict_with_problems_lists_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        REPEATED.format(last="entry").replace("command: [sh, /tmp/entry.sh]", "command: []")
    )
    code, out, err = run(capsys, "workflow", "validate", str(path), "-t", "json")
    data = json.loads(out)
    assert code == 2 and len(data["problems"]) == 1 and len(data["warnings"]) == 1
    assert "command is empty" in err and "warning: workflow.tasks[0].files[0].path" in err
    code, out, _err = run(capsys, "workflow", "validate", str(path), "--strict", "-t", "json")
    assert code == 2 and len(json.loads(out)["problems"]) == 2


def test_spec_prints_the_text_and_the_warning_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, last="other")
    code, out, err = run(capsys, "workflow", "spec", path)
    assert (code, out) == (0, REPEATED.format(last="other"))
    assert err.startswith(f"{path}:9: warning: ")
