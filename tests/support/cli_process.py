"""The ``trainyard`` and ``osmo`` programs as real processes, shared by the CLI's end-to-end
tests (tests/integration/cli) and OSMO's command lines (tests/conformance/cli): the
environment a CLI process gets for a home, and what one run gave."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
"""This environment's ``bin``: the ``trainyard`` and ``osmo`` console scripts."""
TERMINAL = ("COMPLETED", "FAILED")
"""Statuses a workflow ends in (``startswith``: ``FAILED_...`` too)."""


@dataclass(frozen=True)
class Result:
    """What one CLI run gave; ``line`` is its command line where the caller kept it."""

    code: int
    out: str
    err: str
    line: str = ""

    def json(self) -> Any:
        """stdout as JSON; fails, naming the run, when it exited other than 0."""
        where = f"{self.line}: " if self.line else ""
        assert self.code == 0, f"{where}exit {self.code}: {self.err}"
        return json.loads(self.out)


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI process for ``home``: no inherited server URL or token, this
    environment's ``bin`` first on PATH, wide output; ``extra`` on top."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(TRAINYARD_HOME=str(home), PATH=f"{BIN}:{env.get('PATH', '')}", COLUMNS="200")
    env.update(extra)
    return env


def wait_for_status(
    query: Callable[[], dict[str, Any]],
    workflow_id: str,
    *,
    timeout_s: float,
    until: tuple[str, ...] = TERMINAL,
) -> dict[str, Any]:
    """Call ``query`` (the workflow's ``query -t json``) every 0.5 s until its status starts
    with one of ``until``; that answer. Fails, naming the status, after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        data = query()
        if data["status"].startswith(until):
            return data
        assert time.monotonic() < deadline, f"{workflow_id} still {data['status']}"
        time.sleep(0.5)
