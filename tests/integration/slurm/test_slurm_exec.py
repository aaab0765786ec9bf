"""``workflow exec`` on Slurm (issue 13): the backend names the running task's job and the
node of its step (``SlurmBackend.entry``), and the CLI's command (``srun --overlap --jobid
JOB --nodelist NODE CMD``) runs beside the task in its allocation, its exit status kept;
``rsync`` goes through it both ways, and ``port-forward`` reaches ``python3 -m http.server``
in the task through a relay srun runs beside it. On
the real test cluster; the server's part (auth, RUNNING check) is the same for every backend
and is tested on the local backend (tests/integration/cli/test_interactive_verbs.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from rsync_stats import later_mtime, literal_bytes
from slurm_cluster_support import EngineRunner

from trainyard.backends.base import TaskKey
from trainyard.cli.rsync_copy import _copy_in, _copy_out, copy_once, local_rsync, parse_rsync_args
from trainyard.cli.task_entry import command_argv as _command_argv
from trainyard.cli.task_entry import command_env as _command_env
from trainyard.cli.workflow_interactive import _serve_forward
from trainyard.errors import RefusedError
from trainyard.status import Status

pytest_plugins = ["slurm_fixtures"]

SPEC = """
workflow:
  name: slurm-exec
  tasks:
  - name: t
    command: [sh, -c]
    args: ["echo ready; exec sleep 300"]
"""


def _entry(runner: EngineRunner, key: TaskKey, timeout_s: float = 120) -> dict:
    """The task's entry once it runs and its step shows in squeue."""
    deadline = time.monotonic() + timeout_s
    while True:
        if runner.state(key.workflow_id).tasks[key.task].status == Status.RUNNING:
            try:
                return runner.engine.task_entry(runner.pool.name, key)
            except RefusedError:
                pass
        assert time.monotonic() < deadline, runner.state(key.workflow_id).tasks[key.task]
        time.sleep(1)


def _rsync_delta_through_srun(entry: dict, tmp_path: Path) -> None:
    """Real rsync with ``rsync_rsh`` as its remote shell: ``srun --overlap ... rsync --server``
    on the task's node; a second upload after a one-byte change moves a delta."""
    if local_rsync() is None:  # .ci/run installs it
        pytest.skip("no rsync >= 3.4.0 here: exec and the tar copy were checked, not rsync's delta")
    size = 4 * 1024 * 1024
    (tmp_path / "big").mkdir()
    data = bytearray(os.urandom(size))
    (tmp_path / "big" / "weights.bin").write_bytes(data)
    inside = tmp_path / "on-node-rsync"
    request = parse_rsync_args(["wf", "t", f"{tmp_path}/big:{inside}"])
    said: list[str] = []
    copy_once(request, entry, report=said.append)  # type: ignore[arg-type]
    data[size // 2] ^= 0xFF
    (tmp_path / "big" / "weights.bin").write_bytes(data)
    later_mtime(tmp_path / "big" / "weights.bin")  # else rsync may see it unchanged
    copy_once(request, entry, report=said.append)  # type: ignore[arg-type]
    sizes = [literal_bytes(text) for text in said]
    assert sizes[0] >= size and sizes[1] < size // 50, said
    assert (inside / "big" / "weights.bin").read_bytes() == bytes(data)


def _rsync_both_ways(entry: dict, tmp_path: Path) -> None:
    """``rsync`` goes through the same srun (tar on the task's node, on this machine here)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.txt").write_text("through srun\n")
    inside = f"{tmp_path}/on-node"
    _copy_in(entry, tmp_path / "in", inside)
    assert (Path(inside) / "f.txt").read_text() == "through srun\n"
    _copy_out(entry, f"{inside}/f.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "through srun\n"


def test_exec_runs_beside_the_task_in_its_job(slurm_engine: EngineRunner, tmp_path: Path) -> None:
    spec = tmp_path / "exec.yaml"
    spec.write_text(SPEC)
    wid = slurm_engine.submit_spec(spec)
    try:
        entry = _entry(slurm_engine, TaskKey(wid, "t", 0))
        assert entry["backend"] == "slurm" and entry["job_id"] and entry["node"]
        argv = _command_argv(
            entry, ["sh", "-c", 'echo "$SLURM_JOB_ID $SLURMD_NODENAME"; exit 5'], False
        )
        assert argv[:2] == ["srun", "--overlap"]
        done = subprocess.run(
            argv,
            env=_command_env(entry),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 5, done.stderr
        assert done.stdout.split() == [entry["job_id"], entry["node"]]
        _rsync_both_ways(entry, tmp_path)
        _rsync_delta_through_srun(entry, tmp_path)
    finally:
        slurm_engine.engine.cancel(wid)
        slurm_engine.wait(wid, timeout_s=120)


WEB = """
workflow:
  name: slurm-forward
  tasks:
  - name: srv
    command: [sh, -c]
    args: ["mkdir -p site && echo from-slurm-task > site/index.txt && cd site && exec {{python}} -m http.server {{port}} --bind 127.0.0.1"]
default-values:
  port: 8765
  python: python3
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _forwarded(slurm_engine: EngineRunner, spec: Path) -> Iterator[tuple[str, int]]:
    """Run ``spec``'s task ``srv`` (a server on ``{{port}}``) and forward a local port to it
    as ``workflow port-forward`` does; yields the local (host, port). Cancels at the end."""
    remote = _free_port()
    wid = slurm_engine.submit_spec(spec, (f"port={remote}", f"python={sys.executable}"))
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        entry = _entry(slurm_engine, TaskKey(wid, "srv", 0))
        threading.Thread(target=_serve_forward, args=(listener, entry, remote), daemon=True).start()
        yield listener.getsockname()
    finally:
        listener.close()
        slurm_engine.engine.cancel(wid)
        slurm_engine.wait(wid, timeout_s=120)


def test_port_forward_reaches_a_server_in_the_task(
    slurm_engine: EngineRunner, tmp_path: Path
) -> None:
    spec = tmp_path / "web.yaml"
    spec.write_text(WEB)
    with _forwarded(slurm_engine, spec) as (host, port):
        url = f"http://{host}:{port}/index.txt"
        deadline = time.monotonic() + 90
        while True:  # the server in the task may not listen yet: a relay then finds nothing
            try:
                answer = httpx.get(url, timeout=30)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the task's server never answered"
            time.sleep(1)
        assert answer.text == "from-slurm-task\n"


PROMPT = """
workflow:
  name: slurm-prompt
  tasks:
  - name: srv
    command: [{{python}}, -c]
    args:
    - |
      import socket
      server = socket.create_server(("127.0.0.1", {{port}}))
      while True:
          conn, _ = server.accept()
          conn.sendall(b"ready> ")
          conn.sendall(conn.recv(100).upper())
          conn.close()
default-values:
  port: 8766
  python: python3
"""


def test_port_forward_carries_a_partial_line_at_once(
    slurm_engine: EngineRunner, tmp_path: Path
) -> None:
    """A protocol that writes a prompt without a newline and waits (a REPL, ssh, rsync, a
    websocket frame): slurmstepd holds a task's output until a newline unless srun runs
    ``--unbuffered`` (srun(1)), so without it the client waits for ever."""
    spec = tmp_path / "prompt.yaml"
    spec.write_text(PROMPT)
    with _forwarded(slurm_engine, spec) as local:
        deadline = time.monotonic() + 90
        while True:  # the task's server may not listen yet: the relay then closes at once
            with socket.create_connection(local, timeout=30) as conn:
                try:
                    prompt = conn.recv(100)
                except TimeoutError:
                    prompt = b"(nothing within 30 s)"
                if prompt:
                    assert prompt == b"ready> "
                    conn.sendall(b"hello")
                    assert conn.recv(100) == b"HELLO"
                    break
            assert time.monotonic() < deadline, "the task's server never answered"
            time.sleep(1)
