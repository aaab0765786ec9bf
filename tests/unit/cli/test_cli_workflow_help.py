"""``trainyard workflow --help`` (issue 28): was 129 lines of every verb's whole docstring.
Now the verbs in groups, OSMO's order inside each (shared/osmo-cli.txt), one short line
each; the details stay in each verb's own ``--help``. Run as a user would: a real process."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

GROUPS = {
    "Run": ["submit", "restart", "validate", "spec", "schema"],
    "Watch": ["logs", "events", "query", "list", "metrics", "diff"],
    "Manage": ["cancel", "tag", "delete", "prune"],
    "Reach a running task": ["exec", "port-forward", "rsync"],
}


def _help(*args: str) -> list[str]:
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
    got = subprocess.run(
        [sys.executable, "-c", "from trainyard.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    return got.stdout.splitlines()


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return _help("workflow", "--help")


def test_workflow_help_is_short(lines: list[str]) -> None:
    assert len(lines) <= 45, "\n".join(lines)


def test_each_verb_has_one_line_in_its_group_in_osmos_order(lines: list[str]) -> None:
    text = "\n".join(lines)
    order: list[str] = []
    for title, verbs in GROUPS.items():
        assert re.search(rf"─ {re.escape(title)} ─", text), text
        order.append(title)
        for verb in verbs:
            rows = [line for line in lines if re.match(rf"│ {re.escape(verb)} ", line)]
            assert len(rows) == 1, (verb, text)
            order.append(verb)
    positions = [
        text.index(f"─ {item} ─") if item in GROUPS else text.index(f"│ {item} ") for item in order
    ]
    assert positions == sorted(positions), order


def test_the_details_stay_in_the_verbs_own_help() -> None:
    text = "\n".join(_help("workflow", "cancel", "--help"))
    assert "FAILED_CANCELED" in text and "--force" in text
