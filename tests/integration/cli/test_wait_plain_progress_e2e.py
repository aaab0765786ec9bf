"""``trainyard workflow submit --wait`` into a pipe, a real process against the real server
(issue 15, fifth pass): its progress and final lines are written without rich (never
imported: its 13-18 ms of CPU competed with the gang's start), and read as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_e2e_support import Server

SPEC = "workflow:\n  name: plain-wait\n  tasks:\n  - name: t\n    command: [echo, hi]\n"


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_wait_into_a_pipe_prints_progress_without_importing_rich(
    server: Server, tmp_path: Path, fmt: str
) -> None:
    spec = tmp_path / "plain.yaml"
    spec.write_text(SPEC)
    got = server.cli(
        "workflow",
        "submit",
        str(spec),
        "--wait",
        "-t",
        fmt,
        PYTHONPROFILEIMPORTTIME="1",
        FORCE_COLOR="",
        TTY_COMPATIBLE="",
    )
    assert got.code == 0, got.err
    imports = [line for line in got.err.splitlines() if line.startswith("import time:")]
    assert imports and not [line for line in imports if " rich" in line], "rich imported"
    shown = got.err if fmt == "json" else got.out
    lines = [line for line in shown.splitlines() if not line.startswith("import time:")]
    # the node is the session pool's: whichever default pool earlier tests of the session left
    assert any(re.search(r"\bt COMPLETED on \S+ \(exit 0\)$", line) for line in lines), lines
    assert any(
        line.startswith("Workflow plain-wait-") and " COMPLETED after " in line for line in lines
    ), lines
    assert not any("[dim]" in line for line in lines), lines
    if fmt == "json":
        assert json.loads(got.out)["status"] == "COMPLETED"
