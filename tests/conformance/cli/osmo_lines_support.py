"""The ``osmo`` program as OSMO's command-line tests drive it: one real process per command
line, against the server of a home of its own (``conftest.osmo``)."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli_process import BIN, Result, cli_env, wait_for_status

OSMO = BIN / "osmo"
"""The ``osmo`` console script of this environment (argv[0] ends in ``osmo``)."""

HELLO = """workflow:
  name: hello-osmo
  tasks:
  - name: hello
    command: [sh, -c, 'echo "Hello from OSMO!"']
"""

FAILING = """workflow:
  name: broken
  tasks:
  - name: crash
    command: [sh, -c, 'echo about to fail; exit 3']
"""

TEMPLATED = """workflow:
  name: {{ workflow_name }}
  tasks:
  - name: hello
    command: [sh, -c, 'echo "{{ message }}"']
default-values:
  workflow_name: templated
  message: hi
"""

Ran = Result
"""One ``osmo`` run: its command line (``line``), exit status and output."""


@dataclass
class Osmo:
    """The ``osmo`` program against the module's server; ``values`` fill ``{name}`` in
    command lines."""

    home: Path
    root: Path
    values: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return cli_env(self.home)

    def run(self, line: str, **values: str) -> Ran:
        """Run ``line`` (an OSMO command line, ``{name}`` filled from ``values`` and the
        fixture's) as a real process, argv[0] ``osmo``."""
        filled = line.format(**{**self.values, **values})
        argv = shlex.split(filled)
        assert argv[0] == "osmo", line
        done = subprocess.run(
            [str(OSMO), *argv[1:]],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return Ran(done.returncode, done.stdout, done.stderr, line=filled)

    def ok(self, line: str, **values: str) -> Ran:
        ran = self.run(line, **values)
        assert ran.code == 0, f"{ran.line}: exit {ran.code}\n{ran.out}\n{ran.err}"
        return ran

    def submit(self, spec: str, *args: str) -> str:
        """Submit ``spec`` (a file name under ``root``); the workflow id."""
        extra = " ".join(shlex.quote(a) for a in args)
        return self.ok(f"osmo workflow submit {self.root / spec} -t json {extra}").json()["id"]

    def query(self, workflow_id: str) -> dict[str, Any]:
        return self.ok(f"osmo workflow query {workflow_id} -t json").json()

    def wait(self, workflow_id: str, timeout_s: float = 120) -> dict[str, Any]:
        """Poll until the workflow ended; its query."""
        return wait_for_status(lambda: self.query(workflow_id), workflow_id, timeout_s=timeout_s)
