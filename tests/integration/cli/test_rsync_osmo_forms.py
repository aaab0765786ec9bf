"""``workflow rsync`` in OSMO's forms (issue 13; OSMO user guide, Interactive > Rsync) with the
real CLI, the real server and real tasks on the local backend's bubblewrap sandbox:
``/osmo/run/workspace`` exists and is writable in every task; ``rsync ID LOCAL:REMOTE`` goes
to the lead task of the first group, ``rsync ID TASK LOCAL:REMOTE`` to TASK, with rsync's rule
for where a folder lands; ``rsync download``; ``--daemon`` uploads what changes, logs under
``$XDG_STATE_HOME/trainyard/rsync`` and ends by itself when the task ends.
(trainyard's own ``rsync ID TASK SRC DST``: test_interactive_verbs.py.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli_e2e_support import Server

# The lead is the second task: the default must be the group's lead, not its first task.
PAIR = """
workflow:
  name: rsync-osmo
  groups:
  - name: first
    tasks:
    - name: helper
      command: [sleep, "600"]
    - name: boss
      lead: true
      command: [sleep, "600"]
  - name: second
    tasks:
    - name: other
      command: [sleep, "600"]
"""

SHORT = """
workflow:
  name: rsync-daemon
  tasks:
  - name: t
    command: [sleep, "600"]
"""


def _submit(server: Server, folder: Path, text: str) -> str:
    spec = folder / "spec.yaml"
    spec.write_text(text)
    return server.submit(spec)


@pytest.fixture(scope="module")
def pair(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A workflow whose first group's two tasks run (its lead second), and a second group."""
    workflow_id = _submit(server, tmp_path_factory.mktemp("rsync-osmo"), PAIR)
    for task in ("helper", "boss"):
        server.wait_task(workflow_id, task, "RUNNING", timeout_s=120)
    yield workflow_id
    server.main("workflow", "cancel", workflow_id)


def _in_task(server: Server, workflow_id: str, task: str, script: str) -> str:
    done = server.cli("workflow", "exec", workflow_id, task, "--", "sh", "-c", script)
    assert done.code == 0, done.err
    return done.out


def _tree(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha\n")
    (folder / "sub" / "b.txt").write_text("beta\n")
    return folder


def test_the_workspace_exists_and_is_writable_in_every_task(server: Server, pair: str) -> None:
    for task in ("helper", "boss"):
        seen = _in_task(server, pair, task, "cd /osmo/run/workspace && touch mine && ls")
        assert seen.split() == ["mine"]  # each task's own, empty at first


def test_osmo_form_uploads_to_the_lead_of_the_first_group(
    server: Server, pair: str, tmp_path: Path
) -> None:
    src = _tree(tmp_path / "my path")
    done = server.cli("workflow", "rsync", pair, f"{src}:/osmo/run/workspace")
    assert done.code == 0, done.err
    assert "boss:/osmo/run/workspace/my path" in done.err
    assert _in_task(server, pair, "boss", "cat '/osmo/run/workspace/my path/sub/b.txt'") == "beta\n"
    assert _in_task(server, pair, "helper", "ls /osmo/run/workspace").split() == ["mine"]


def test_osmo_forms_with_a_task_contents_and_download(
    server: Server, pair: str, tmp_path: Path
) -> None:
    src = _tree(tmp_path / "src")
    up = server.cli("workflow", "rsync", "upload", pair, "helper", f"{src}/:/osmo/run/workspace/in")
    assert up.code == 0, up.err
    listed = _in_task(server, pair, "helper", "cd /osmo/run/workspace/in && find . | sort")
    assert listed.split() == [".", "./a.txt", "./sub", "./sub/b.txt"]  # the contents, not src/
    into = tmp_path / "down"
    into.mkdir()
    down = server.cli(
        "workflow", "rsync", "download", pair, "helper", f"/osmo/run/workspace/in:{into}"
    )
    assert down.code == 0, down.err
    assert (into / "in" / "sub" / "b.txt").read_text() == "beta\n"
    (tmp_path / "file").write_text("x")
    not_folder = server.cli(
        "workflow",
        "rsync",
        "download",
        pair,
        "helper",
        f"/osmo/run/workspace/in:{tmp_path / 'file'}",
    )
    assert not_folder.code == 2 and "must be a folder" in not_folder.err
    bad = server.cli("workflow", "rsync", pair, str(src))
    assert bad.code == 2 and "LOCAL:REMOTE" in bad.err
    missing = server.cli("workflow", "rsync", pair, f"{tmp_path / 'nope'}:/osmo/run/workspace")
    assert missing.code == 2 and "no such file or folder" in missing.err


def test_daemon_uploads_changes_and_ends_with_the_task(server: Server, tmp_path: Path) -> None:
    workflow_id = _submit(server, tmp_path, SHORT)
    server.wait_task(workflow_id, "t", "RUNNING", timeout_s=120)
    state = tmp_path / "state"
    src = _tree(tmp_path / "code")
    started = server.cli(
        "workflow",
        "rsync",
        workflow_id,
        f"{src}:/osmo/run/workspace",
        "--daemon",
        "--poll-interval",
        "0.5",
        XDG_STATE_HOME=str(state),
    )
    assert started.code == 0, started.err
    pid = int(started.out.split("PID ")[1].split()[0])
    log = state / "trainyard" / "rsync" / f"rsync_daemon_{workflow_id}_t.log"
    assert f"tail -f {log}" in started.out
    daemon = psutil.Process(pid)
    try:
        _eventually(server, workflow_id, "cat /osmo/run/workspace/code/a.txt", "alpha\n")
        (src / "sub" / "new.txt").write_text("written after the start\n")
        _eventually(
            server,
            workflow_id,
            "cat /osmo/run/workspace/code/sub/new.txt",
            "written after the start\n",
        )
        again = server.cli(
            "workflow",
            "rsync",
            workflow_id,
            f"{src}:/osmo/run/workspace",
            "--daemon",
            XDG_STATE_HOME=str(state),
        )
        assert again.code == 4 and f"pid {pid}" in again.err
        listed = server.cli("workflow", "rsync", "status", XDG_STATE_HOME=str(state))
        assert f"{pid}  RUNNING  {workflow_id} t" in listed.out
        server.main("workflow", "cancel", workflow_id)
        daemon.wait(timeout=60)  # not our child: psutil gives no exit status
    finally:
        if daemon.is_running():
            daemon.kill()
    text = log.read_text()
    assert "Uploaded" in text and "no longer running; rsync daemon stops" in text, text
    assert not list(log.parent.glob("*.pid"))


def _eventually(
    server: Server, workflow_id: str, script: str, expected: str, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        done = server.cli("workflow", "exec", workflow_id, "t", "--", "sh", "-c", script)
        if done.out == expected:
            return
        assert time.monotonic() < deadline, f"never saw {expected!r}: {done.out!r} {done.err!r}"
        time.sleep(0.5)


def test_rsync_stop_ends_a_daemon(server: Server, pair: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    src = _tree(tmp_path / "stopped")
    started = server.cli(
        "workflow",
        "rsync",
        pair,
        "helper",
        f"{src}:/osmo/run/workspace",
        "--daemon",
        XDG_STATE_HOME=str(state),
    )
    assert started.code == 0, started.err
    daemon = psutil.Process(int(started.out.split("PID ")[1].split()[0]))
    pid_file = state / "trainyard" / "rsync" / f"rsync_daemon_{pair}_helper.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists():  # written once the daemon runs
        assert time.monotonic() < deadline and daemon.is_running(), "the daemon never started"
        time.sleep(0.2)
    try:
        stopped = server.cli("workflow", "rsync", "stop", pair, XDG_STATE_HOME=str(state))
        assert stopped.code == 0 and f"stopped rsync daemon {daemon.pid}" in stopped.out
        daemon.wait(timeout=60)
    finally:
        if daemon.is_running():
            daemon.kill()
    assert not pid_file.exists()
    none = server.cli("workflow", "rsync", "status", XDG_STATE_HOME=str(state))
    assert none.out.strip() == "no rsync daemons"
