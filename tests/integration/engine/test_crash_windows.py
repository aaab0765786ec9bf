"""Crash windows of the engine (issue 12, "after any crash the recorded status is what
happened; no task is started twice unless its exit action says so"), with real processes and
a real SIGKILL at the exact moment.

Phase 1: an engine in a process of its own (``DRIVER``) submits the workflow and runs until
it SIGKILLs itself at the fault's moment: after storing a gang's start and before making it,
halfway through starting a gang (the launcher made its starts, the engine never read the
reply: the launcher records each start in ``launch.json`` before replying), after reading an
exit and before storing it, after storing
a retry and before starting it, and after starting a retry and before storing anything more.
Phase 2: a new engine on the same store and home (this process) finishes the workflow. Each
attempt's command logs a ``ran`` line, so the task logs tell how many times each attempt ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.engine.reconciler import Engine
from trainyard.pools import Pool, default_local_pool
from trainyard.status import Status, WorkflowStatus
from trainyard.store import Store

TIMEOUT_S = 120

DRIVER = r'''
import os, signal, sys, threading
from pathlib import Path
from trainyard import spec
from trainyard.backends.local import backend as local
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import Pool, default_local_pool
from trainyard.store import Store

home, fault, text = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]).read_text()


def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def retry_of(launches):
    return max(launch.key.retry_id for launch in launches)


start_group, run_many, save_states = (local.LocalBackend.start_group,
                                      local.LauncherClient.run_many, Store.save_states)
if fault == "start-stored-not-made":
    local.LocalBackend.start_group = die
elif fault == "gang-half-started":
    def made_not_heard(self, runs, env):
        run_many(self, runs, env)  # the launcher started the gang; its reply is never read
        die()

    local.LauncherClient.run_many = made_not_heard
elif fault == "exit-read-not-stored":
    def save(self, updates):
        if any(t["exit_code"] is not None for _s, _e, state in updates.values()
               for t in state["tasks"]):
            die()
        return save_states(self, updates)

    Store.save_states = save
elif fault == "retry-stored-not-started":
    def start(self, launches):
        return die() if retry_of(launches) >= 1 else start_group(self, launches)

    local.LocalBackend.start_group = start
elif fault == "retry-started-not-stored":
    def start(self, launches):
        start_group(self, launches)
        if retry_of(launches) >= 1:
            die()

    local.LocalBackend.start_group = start
elif fault == "retry-peers-stopping":
    stop_tasks = local.LocalBackend.stop

    def stopping(self, keys):
        return die() if keys else stop_tasks(self, keys)

    local.LocalBackend.stop = stopping
else:
    raise SystemExit(f"unknown fault {fault}")

pool = default_local_pool()
pool = pool.model_copy(update={"options": {**pool.options, "sandbox": sys.argv[5]}})
engine = Engine(Store(sys.argv[6]), home, pools={pool.name: pool})
doc = spec.load(text, pool=pool)
record = engine.submit(Submission(spec=doc.workflow, spec_text=text, user="tester", pool=pool))
print(record.id, flush=True)
stop = threading.Event()
threading.Timer(float(sys.argv[4]), stop.set).start()
engine.run_forever(stop)
raise SystemExit(3)  # the fault never came
'''

GANG = """
workflow:
  name: gang
  groups:
  - name: g
    tasks:
    - name: lead
      lead: true
      command: [sh, -c, "echo ran $TRAINYARD_RETRY_ID; sleep 2"]
    - name: worker
      command: [sh, -c, "echo ran $TRAINYARD_RETRY_ID; sleep 1"]
"""

FAILS = """
workflow:
  name: fails
  tasks:
  - name: t
    command: [sh, -c, "echo ran $TRAINYARD_RETRY_ID; exit 3"]
"""

RETRIED = """
workflow:
  name: retried
  tasks:
  - name: t
    command: [sh, -c, "echo ran $TRAINYARD_RETRY_ID; sleep 1; [ $TRAINYARD_RETRY_ID -ge 1 ] || exit 3"]
    exitActions:
      RESCHEDULE: "3"
"""


STUBBORN = """
workflow:
  name: stubborn
  groups:
  - name: g
    ignoreNonleadStatus: false
    tasks:
    - name: lead
      lead: true
      command: [sh, -c, "trap 'echo term' TERM; echo ran $TRAINYARD_RETRY_ID; i=0; while [ $TRAINYARD_RETRY_ID -eq 0 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; sleep 1"]
    - name: worker
      command: [sh, -c, "echo ran $TRAINYARD_RETRY_ID; [ $TRAINYARD_RETRY_ID -ge 1 ] || exit 7"]
      exitActions:
        RESTART: "7"
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "crash home"
    made.mkdir()
    return made


def _pool(sandbox: str) -> Pool:
    pool = default_local_pool()
    return pool.model_copy(update={"options": {**pool.options, "sandbox": sandbox}})


def _crash(home: Path, url: str, fault: str, text: str, sandbox: str = "auto") -> str:
    """Phase 1: submit ``text`` in an engine process on the store at ``url`` that SIGKILLs
    itself at ``fault`` (on PostgreSQL: with its transaction open, when the fault is in one)."""
    spec_file = home.parent / "spec.yaml"
    spec_file.write_text(text)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(home),
            fault,
            str(spec_file),
            str(TIMEOUT_S),
            sandbox,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 30,
        env=os.environ.copy(),
    )
    assert done.returncode == -9, f"exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout.split()[0]


class _Engine:
    """Phase 2: a new engine on the same store, stepped by a background thread."""

    def __init__(self, home: Path, url: str, sandbox: str = "auto") -> None:
        pool = _pool(sandbox)
        self.home = home
        self.engine = Engine(Store(url), home, pools={pool.name: pool})
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.engine.run_forever, args=(self._stop,), daemon=True
        )
        self._thread.start()

    def runs(self, wid: str, task: str) -> list[int]:
        """The retry id of every ``ran`` line in every attempt's log, in order."""
        found = []
        for log in sorted((self.home / "runs" / wid / task).glob("*/task.log")):
            found += [
                int(n) for n in re.findall(rf"\[{task}\] ran (\d+)$", log.read_text(), re.MULTILINE)
            ]
        return sorted(found)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.close()


@pytest.fixture
def after(home: Path) -> Iterator[list[_Engine]]:
    made: list[_Engine] = []
    yield made
    for engine in made:
        engine.close()


def _resume(home: Path, url: str, after: list[_Engine], sandbox: str = "auto") -> _Engine:
    engine = _Engine(home, url, sandbox)
    after.append(engine)
    return engine


@pytest.mark.parametrize("fault", ["start-stored-not-made", "gang-half-started"])
def test_a_gang_whose_start_was_cut_short_runs_each_task_once(
    home: Path, store_url: str, after: list[_Engine], fault: str
) -> None:
    wid = _crash(home, store_url, fault, GANG)
    engine = _resume(home, store_url, after)
    assert engine.engine.wait(wid, TIMEOUT_S).status == WorkflowStatus.COMPLETED
    assert engine.runs(wid, "lead") == [0] and engine.runs(wid, "worker") == [0]


def test_an_exit_read_but_not_stored_is_read_again(
    home: Path, store_url: str, after: list[_Engine]
) -> None:
    wid = _crash(home, store_url, "exit-read-not-stored", FAILS)
    engine = _resume(home, store_url, after)
    assert engine.engine.wait(wid, TIMEOUT_S).status == WorkflowStatus.FAILED
    task = engine.engine.state(wid).tasks["t"]
    assert (task.status, task.exit_code, task.retry_id) == (Status.FAILED, 3, 0)
    assert engine.runs(wid, "t") == [0]


@pytest.mark.parametrize("fault", ["retry-stored-not-started", "retry-started-not-stored"])
def test_a_retry_cut_short_runs_once(
    home: Path, store_url: str, after: list[_Engine], fault: str
) -> None:
    wid = _crash(home, store_url, fault, RETRIED)
    engine = _resume(home, store_url, after)
    assert engine.engine.wait(wid, TIMEOUT_S).status == WorkflowStatus.COMPLETED
    task = engine.engine.state(wid).tasks["t"]
    assert (task.status, task.exit_code, task.retry_id) == (Status.COMPLETED, 0, 1)
    assert [a.exit_code for a in task.history] == [3]
    assert engine.runs(wid, "t") == [0, 1]


def _event_time(run_dir: Path, kind: str) -> float:
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == kind:
            return float(event["time_s"])
    raise AssertionError(f"no {kind} in {run_dir}")


def test_a_retry_whose_peers_were_being_stopped_waits_for_them_after_a_restart(
    home: Path, store_url: str, after: list[_Engine]
) -> None:
    """The worker exits 7 (RESTART): its gang is stopped and restarted in place. The engine
    stores the new attempts, then dies as it is about to stop the lead. The new engine stops
    the lead's old attempt and must not start its next one (in the same sandbox) while the
    old one still runs."""
    # no bubblewrap: its sandbox would end the lead's shell on SIGTERM at once, and the lead
    # must take its time (the runner SIGKILLs it after its stop grace, 5 s)
    wid = _crash(home, store_url, "retry-peers-stopping", STUBBORN, sandbox="none")
    engine = _resume(home, store_url, after, sandbox="none")
    assert engine.engine.wait(wid, TIMEOUT_S).status == WorkflowStatus.COMPLETED
    assert engine.runs(wid, "worker") == [0, 1]
    # the lead's first command may have been stopped before it started: never twice
    assert engine.runs(wid, "lead") in ([0, 1], [1])
    runs = home / "runs" / wid / "lead"
    assert _event_time(runs / "0", "EXITED") <= _event_time(runs / "1", "INITIALIZING")
