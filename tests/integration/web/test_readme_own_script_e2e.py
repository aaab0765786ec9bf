"""The README's "Run your own script", as printed: ``examples/own_script/spec.yaml`` sends its
``train.py`` with ``localpath``, runs it on the local pool through the real CLI and a real
server, and keeps what it wrote to ``{{output}}``; ``--set`` reaches the script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from web_live_server import LiveServer, server  # noqa: F401 - the fixture

pytestmark = [pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[3]
TRAINYARD = Path(sys.executable).parent / "trainyard"


def test_the_readme_own_script_example_runs_as_printed(server: LiveServer) -> None:
    pytest.importorskip("torch", reason="the example trains with torch (make demo installs it)")
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(TRAINYARD_HOME=str(server.home), NO_COLOR="1")
    got = subprocess.run(
        [
            str(TRAINYARD),
            "workflow",
            "submit",
            "examples/own_script/spec.yaml",
            "--set",
            "steps=100",
            "--wait",
            "--logs",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    assert "step 100 loss" in got.stdout and "step 150" not in got.stdout
    model = server.home / "runs" / "my-training-1" / "train" / "0" / "output" / "model" / "model.pt"
    assert model.is_file() and model.stat().st_size > 0
