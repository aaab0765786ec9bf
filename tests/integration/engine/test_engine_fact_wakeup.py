"""A runner's events reach the engine as they are written, not at its next tick (issue 15):
with the engine's tick at 300 s, a workflow can only end within the test's limit if its
runner's datagrams (``backends.local.wakeup``) woke the engine for its INITIALIZING, RUNNING and
EXITED. Both kinds of local runner are checked: one hosted as a thread of the launcher (a
task that moves no data) and a forked one (a task with an output URL). The task's own
environment does not name the socket.

The real engine, local backend, launcher, runners and bubblewrap sandbox.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import require_bwrap

from trainyard import spec
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import Pool, default_local_pool
from trainyard.runner.report import FACTS_SOCKET_ENV
from trainyard.status import WorkflowStatus
from trainyard.store import Store

TICK_S = 300.0
LIMIT_S = 120.0  # a loaded 2-core machine starts a sandboxed task in seconds, not minutes

SPEC = """
workflow:
  name: wake-{{kind}}
  tasks:
  - name: t
    command: [sh, -c, "env > {{output}}/env"]
{% if kind == 'forked' %}
    outputs:
    - url: "file://{{dest}}/"
{% endif %}
"""


@pytest.fixture
def engine(tmp_path: Path, store_url: str) -> Iterator[tuple[Engine, Pool]]:
    require_bwrap()
    base = default_local_pool()
    pool = Pool(
        name=base.name,
        nodes=base.nodes,  # the outputs' folder is a data root
        options={**base.options, "sandbox": "bwrap", "allowed_data_roots": [str(tmp_path)]},
    )
    home = tmp_path / "home"
    home.mkdir()
    made = Engine(Store(store_url), home, pools={pool.name: pool}, poll_interval_s=TICK_S)
    stop = threading.Event()
    thread = threading.Thread(target=made.run_forever, args=(stop,), daemon=True)
    thread.start()
    yield made, pool
    stop.set()
    made.wake()
    thread.join(timeout=30)
    made.close()
    assert not thread.is_alive()


@pytest.mark.parametrize("kind", ["hosted", "forked"])
def test_a_workflow_ends_at_its_runners_events_not_at_the_tick(
    engine: tuple[Engine, Pool],
    tmp_path: Path,
    kind: str,
) -> None:
    made, pool = engine
    dest = tmp_path / "dest"
    doc = spec.load(SPEC, set_values={"kind": kind, "dest": str(dest)}, pool=pool)
    started = time.monotonic()
    wid = made.submit(Submission(spec=doc.workflow, spec_text=SPEC, user="tester", pool=pool)).id
    while not made.state(wid).status.is_terminal():
        sockets = list((made.home / "local").glob("facts-*.sock"))
        assert sockets or time.monotonic() - started < 10, (
            f"no facts socket under {made.home / 'local'} (a path over 107 bytes cannot be "
            "one: run the tests with a shorter temporary folder)"
        )
        assert time.monotonic() - started < LIMIT_S, made.state(wid)
        time.sleep(0.05)
    assert made.state(wid).status is WorkflowStatus.COMPLETED
    launch = (made.run_dir(wid, "t", 0) / "launch.json").read_text()
    assert ('"hosted_by": null' in launch) is (kind == "forked")
    env = (made.run_dir(wid, "t", 0) / "output" / "env").read_text()
    assert "TRAINYARD_WORKFLOW_ID=" in env and FACTS_SOCKET_ENV not in env
    if kind == "forked":
        assert (dest / "env").exists()
