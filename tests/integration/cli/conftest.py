"""End-to-end fixtures: the real ``trainyard`` CLI against a real server process.

One server per test session: the first CLI command starts it in the background (the CLI's
own auto-start) with ``TRAINYARD_HOME`` in a temporary folder; at teardown every workflow
still running is cancelled, ``trainyard server stop`` stops it, and no process of that home
may survive (a task's network keeper idles out within ~20 s).

The OSMO rows that take ~2 minutes are submitted once, at the start of the session
(``osmo_runs``, autouse), so they run while the other files' tests run; the tests of
test_osmo_outcomes.py, which wait for them, are moved to the end of the run.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest
from cli_e2e_support import (
    BACKGROUND_ROWS,
    SPECS,
    TERMINAL,
    Server,
    WaitingSubmit,
    kill_described,
    osmo_pools_yaml,
    processes_of,
    run_cli,
    submit_row,
    wait_gone,
)

OUTCOMES = "test_osmo_outcomes.py"

# A run started as a background job (`make test &`, `nohup ... &`) inherits SIGINT ignored
# (POSIX: a non-interactive shell's `&`), and an ignored signal stays ignored across exec:
# every CLI a test starts could not be stopped with Ctrl-C, which the Ctrl-C tests check.
# A handler (unlike SIG_IGN) is reset to the default in the children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that wait for the long OSMO rows last, after everything else."""
    items.sort(key=lambda item: item.path.name == OUTCOMES)  # stable: order kept otherwise


def _cancel_everything(server: Server) -> None:
    running = [
        w["id"]
        for w in server.main("workflow", "list", "-a", "-t", "json").json()
        if not w["status"].startswith(TERMINAL)
    ]
    for workflow_id in running:
        server.main("workflow", "cancel", workflow_id)
    for workflow_id in running:
        server.wait(workflow_id, timeout_s=60)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real server, started by the CLI itself on its first command; stopped at the end."""
    home = tmp_path_factory.mktemp("trainyard-home")
    (home / "pools.yaml").write_text(osmo_pools_yaml())
    # The home goes to each CLI call (run_cli, Server.main), never into this process's
    # environment: this fixture lives to the end of the whole run, and every process a later
    # test started would inherit it and count as this server's leftover below.
    first = run_cli(home, "workflow", "list", "-t", "json")
    assert first.code == 0, first.err + (home / "server.log").read_text()
    assert json.loads(first.out) == []
    made = Server(home)
    yield made
    _cancel_everything(made)
    stopped = run_cli(home, "server", "stop")
    assert (stopped.code, stopped.out.strip()) == (0, "trainyard server stopped"), stopped.err
    left = kill_described(wait_gone(processes_of(home), timeout_s=45))
    assert not left, f"processes outlived the session: {left}"


@pytest.fixture(scope="session", autouse=True)
def osmo_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, WaitingSubmit]]:
    """Every background row started at once as ``submit --wait`` (by row id); none when the
    OSMO specs are not beside the repository, or when no collected test needs them. A
    process still waiting at the end (a test failed first) is stopped."""
    wanted = any(item.path.name == OUTCOMES for item in request.session.items)
    if not SPECS.is_dir() or not wanted:
        yield {}
        return
    server: Server = request.getfixturevalue("server")
    runs = {row.id: submit_row(server, row) for row in BACKGROUND_ROWS}
    yield runs
    for run in runs.values():
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.communicate()
