"""The console script ends right after its command (``cli.main.exit_now``, issue 15) and
loses nothing: piped output complete, exit codes as before, in-process callers unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.cli.main import main


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRAINYARD_HOME": str(home)},
        timeout=120,
    )


def test_piped_output_is_complete_and_the_status_is_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = _cli("workflow", "schema", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert main(["workflow", "schema"]) == 0  # in process: returns, does not exit
    assert done.stdout == capsys.readouterr().out
    assert json.loads(done.stdout)


def test_errors_keep_their_exit_codes_and_messages(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workflow:\n  name: x\n  tasks: []\n")
    refused = _cli("workflow", "validate", str(bad), "--local", home=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip(), refused
    usage = _cli("workflow", "no-such-command", home=tmp_path)
    assert usage.returncode == 2 and "no-such-command" in usage.stderr
