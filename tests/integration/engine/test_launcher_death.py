"""Issue 12, "launcher dead": the local backend's launcher (``backends.local.launcher``) killed
with SIGKILL while tasks run, through the real engine. A task whose runner was a thread of
the launcher fails at once with OSMO's backend error (FAILED_BACKEND_ERROR, 3001) and a reason
that names the launcher; a task whose runner is a process of its own runs on to its real end;
the next start brings up a new launcher; nothing hangs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from trainyard import spec
from trainyard.backends.local import probe_isolation
from trainyard.engine.reconciler import Engine, Submission
from trainyard.errors import BackendError
from trainyard.pools import default_local_pool
from trainyard.status import ExitCode, Status, WorkflowStatus
from trainyard.store import Store

PROMPT_S = 60.0
"""Far longer than the loss takes to see (about a second), far shorter than the tasks."""

HOSTED = """
workflow:
  name: hosted
  tasks:
  - name: t
    command: [sh, -c, "{{marker}} & {{marker}}"]
"""

FORKED = """
workflow:
  name: forked
  tasks:
  - name: t
    command: [sh, -c, "sleep 6; echo made > '{{output}}/made.txt'"]
    outputs:
    - url: {{bucket}}
"""

QUICK = """
workflow:
  name: quick
  tasks:
  - name: t
    command: [echo, after the launcher died]
"""


def _bwrap_missing() -> str | None:
    try:
        return None if probe_isolation("auto", "auto").bwrap else "no bubblewrap sandbox here"
    except BackendError as exc:
        return str(exc)


class _Run:
    """The engine on the ``local`` pool, stepped by a background thread."""

    def __init__(self, home: Path, data_root: Path, url: str) -> None:
        base = default_local_pool()  # + a data root for the file:// bucket of FORKED
        self.pool = base.model_copy(update={"options": {"allowed_data_roots": [str(data_root)]}})
        self.engine = Engine(Store(url), home, pools={self.pool.name: self.pool})
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.engine.run_forever, args=(self._stop,), daemon=True
        )
        self._thread.start()

    def submit(self, text: str, **values: object) -> str:
        doc = spec.load(text, set_values=values, pool=self.pool)
        return self.engine.submit(
            Submission(spec=doc.workflow, spec_text=text, user="tester", pool=self.pool)
        ).id

    def wait_running(self, wid: str, timeout_s: float = PROMPT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while self.engine.state(wid).tasks["t"].status is not Status.RUNNING:
            assert time.monotonic() < deadline, self.engine.state(wid).tasks["t"]
            time.sleep(0.1)

    def launch(self, wid: str) -> dict:
        return json.loads((self.engine.run_dir(wid, "t", 0) / "launch.json").read_text())

    def close(self) -> None:
        for wid in list(self.engine.core.live):
            self.engine.cancel(wid)
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.close()


@pytest.fixture
def run(tmp_path: Path, store_url: str) -> Iterator[_Run]:
    home = tmp_path / "home dir"
    home.mkdir()
    made = _Run(home, tmp_path / "bucket", store_url)
    yield made
    made.close()


def _gone(marker: str, timeout_s: float = 20) -> bool:
    """Whether no process runs ``marker`` (within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for proc in psutil.process_iter(["cmdline"]):
            if marker in " ".join(proc.info["cmdline"] or []):
                alive.append(proc)
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _kill(pid: int) -> None:
    proc = psutil.Process(pid)
    assert "trainyard.backends.local.launcher" in " ".join(proc.cmdline())
    os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.skipif(
    _bwrap_missing() is not None, reason=f"hosted runners need bubblewrap: {_bwrap_missing()}"
)
def test_a_hosted_task_fails_at_once_with_a_clear_reason_and_a_new_launcher_starts(
    run: _Run,
) -> None:
    marker = f"sleep 3{os.getpid() % 1000:03d}"
    wid = run.submit(HOSTED, marker=marker)
    run.wait_running(wid)
    launch = run.launch(wid)
    assert launch["hosted_by"], launch  # its runner is a thread of the launcher
    deadline = time.monotonic() + PROMPT_S
    while _gone(marker, timeout_s=0.1):  # the command has started
        assert time.monotonic() < deadline
    killed_at = time.monotonic()
    _kill(launch["pid"])

    run.engine.wait(wid, timeout_s=PROMPT_S)
    assert time.monotonic() - killed_at < PROMPT_S
    task = run.engine.state(wid).tasks["t"]
    assert (task.status, task.exit_code) == (
        Status.FAILED_BACKEND_ERROR,
        int(ExitCode.BACKEND_ERROR),
    )
    assert task.failure_reason and f"launcher (pid {launch['pid']})" in task.failure_reason
    assert "died" in task.failure_reason
    log = (run.engine.run_dir(wid, "t", 0) / "task.log").read_text()
    assert task.failure_reason in log

    assert _gone(marker), "the task's processes outlived its launcher"

    quick = run.submit(QUICK)
    assert run.engine.wait(quick, timeout_s=PROMPT_S).status == WorkflowStatus.COMPLETED
    assert run.launch(quick)["pid"] != launch["pid"]  # hosted by a new launcher


def test_a_task_with_its_own_runner_process_outlives_the_launcher(
    run: _Run, tmp_path: Path
) -> None:
    bucket = (tmp_path / "bucket").as_uri() + "/"
    wid = run.submit(FORKED, bucket=bucket)
    run.wait_running(wid)
    launch = run.launch(wid)
    assert launch["hosted_by"] is None, launch  # it moves data: a process of its own
    launcher = psutil.Process(launch["pid"]).parent()
    assert launcher is not None
    _kill(launcher.pid)

    assert run.engine.wait(wid, timeout_s=PROMPT_S).status == WorkflowStatus.COMPLETED
    assert run.engine.state(wid).tasks["t"].exit_code == 0
    assert (tmp_path / "bucket" / "made.txt").read_text().strip() == "made"
