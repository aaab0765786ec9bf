"""``trainyard workflow submit --wait`` into a pipe, a real process against the real server:
its progress and final lines are plain text (no terminal control sequences, no rich markup),
and read as before. (Plain typer imports rich whenever it is installed, for its help and
errors; the CLI no longer hides it, so only the output is held plain here.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_e2e_support import Server

SPEC = "workflow:\n  name: plain-wait\n  tasks:\n  - name: t\n    command: [echo, hi]\n"


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_wait_into_a_pipe_prints_plain_progress(server: Server, tmp_path: Path, fmt: str) -> None:
    spec = tmp_path / "plain.yaml"
    spec.write_text(SPEC)
    got = server.cli(
        "workflow",
        "submit",
        str(spec),
        "--wait",
        "-t",
        fmt,
        FORCE_COLOR="",
        TTY_COMPATIBLE="",
    )
    assert got.code == 0, got.err
    shown = got.err if fmt == "json" else got.out
    assert "\x1b[" not in shown and "\r" not in shown, shown  # no colours, no live redraws
    lines = shown.splitlines()
    # the node is the session pool's: whichever default pool earlier tests of the session left
    assert any(re.search(r"\bt COMPLETED on \S+ \(exit 0\)$", line) for line in lines), lines
    assert any(
        line.startswith("Workflow plain-wait-") and " COMPLETED after " in line for line in lines
    ), lines
    assert not any("[dim]" in line for line in lines), lines
    if fmt == "json":
        assert json.loads(got.out)["status"] == "COMPLETED"
