"""The Slurm backend on the real test cluster: host tokens across nodes, heterogeneous jobs,
awkward paths, cancel, a killed runner, Slurm's own output in the run folders."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from slurm_cluster_support import EngineRunner

from trainyard.pools import Pool
from trainyard.status import Status

pytest_plugins = ["slurm_fixtures"]

pytestmark = pytest.mark.slow

SERVER = """import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["PORT"]))); s.listen(1)
print("server on", os.environ["SLURMD_NODENAME"], flush=True)
c, _ = s.accept(); c.sendall(os.environ["SLURMD_NODENAME"].encode()); c.close()
"""
CLIENT = """import os, socket, sys, time
for _ in range(200):
    try:
        c = socket.create_connection((sys.argv[1], int(os.environ["PORT"])), timeout=2); break
    except OSError:
        time.sleep(0.1)
print("client on", os.environ["SLURMD_NODENAME"], "got", c.recv(100).decode(), "from", sys.argv[1])
"""


def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.splitlines())


def _talk_spec(tmp_path: Path, port: int, server_cpu: int, client_cpu: int) -> Path:
    path = tmp_path / "talk.yaml"
    path.write_text(f"""workflow:
  name: talk
  resources:
    server: {{cpu: {server_cpu}, memory: 256Mi}}
    client: {{cpu: {client_cpu}, memory: 128Mi}}
  groups:
  - name: pair
    tasks:
    - name: server
      lead: true
      resource: server
      command: [python, /tmp/server.py]
      environment: {{PORT: "{port}"}}
      files:
      - path: /tmp/server.py
        contents: |
{_indent(SERVER, 10)}    - name: client
      resource: client
      command: [python, /tmp/client.py, "{{{{host:server}}}}"]
      environment: {{PORT: "{port}"}}
      files:
      - path: /tmp/client.py
        contents: |
{_indent(CLIENT, 10)}""")
    return path


@pytest.mark.parametrize(
    ("server_cpu", "client_cpu"), [(1, 1), (2, 1)], ids=["homogeneous", "heterogeneous"]
)
def test_host_token_reaches_the_task_on_the_other_node(
    slurm_engine: EngineRunner, tmp_path: Path, server_cpu: int, client_cpu: int
) -> None:
    wid = slurm_engine.submit_spec(_talk_spec(tmp_path, 24900 + server_cpu, server_cpu, client_cpu))
    assert slurm_engine.wait(wid, 180).status == "COMPLETED", slurm_engine.state(wid)
    server_log, client_log = slurm_engine.log(wid, "server"), slurm_engine.log(wid, "client")
    server_node = server_log.split("server on ")[1].split()[0]
    client_node = client_log.split("client on ")[1].split()[0]
    assert server_node != client_node
    assert f"got {server_node} from 127.0.0." in client_log


def test_awkward_home_paths_survive_sbatch_and_srun(slurm_pool: Pool, weird_home: Path) -> None:
    runner = EngineRunner(weird_home, slurm_pool)
    try:
        hello = weird_home / "hello world.yaml"  # the repo's own, so it runs without ../shared
        hello.write_text(
            "workflow:\n  name: hello-osmo\n  tasks:\n  - name: hello\n"
            "    image: ubuntu:24.04\n    command: [echo]\n    args: [Hello from OSMO!]\n"
        )
        wid = runner.submit_spec(hello)
        assert runner.wait(wid, 120).status == "COMPLETED"
        assert "Hello from OSMO!" in runner.log(wid, "hello")
        job_dir = weird_home / "runs" / wid / "_slurm" / "hello" / "hello.0"
        assert list(job_dir.glob("slurm-*.out")) and (job_dir / "job.sbatch").exists()
        assert (weird_home / "runs" / wid / "hello" / "0" / "runner.out").exists()
    finally:
        runner.close()


def _sleeper_spec(tmp_path: Path, name: str, marker: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    task = "    - name: {t}\n      command: [sh, -c, 'sleep 300 # {m}']\n"
    path.write_text(
        f"workflow:\n  name: {name}\n  groups:\n  - name: g\n    tasks:\n"
        + task.format(t="a", m=marker)
        + "      lead: true\n"
        + task.format(t="b", m=marker)
    )
    return path


def _wait_running(runner: EngineRunner, wid: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(t.status is Status.RUNNING for t in runner.state(wid).tasks.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"not running after {timeout_s}s: {runner.state(wid)}")


def _processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def _squeue(pool: Pool, *args: str) -> str:
    env = {**os.environ, "SLURM_CONF": str(pool.options["slurm_conf"])}
    return subprocess.run(
        ["squeue", "--noheader", *args], capture_output=True, text=True, env=env, timeout=20
    ).stdout


def test_cancel_ends_the_job_and_every_process(
    slurm_engine: EngineRunner, slurm_pool: Pool, tmp_path: Path
) -> None:
    marker = f"trainyard-cancel-{os.getpid()}-{time.time_ns()}"
    wid = slurm_engine.submit_spec(_sleeper_spec(tmp_path, "sleepers", marker))
    _wait_running(slurm_engine, wid)
    assert len(_processes_with(marker)) >= 2
    slurm_engine.engine.cancel(wid)
    assert slurm_engine.wait(wid, 30).status == "FAILED_CANCELED"
    deadline = time.monotonic() + 30
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == []
    assert "trainyard:sleepers" not in _squeue(
        slurm_pool, "--states=RUNNING,PENDING", "--format=%j"
    )


def _runner_of(run_json: str) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[-2:] == ["trainyard.runner", run_json] and not cmd[0].endswith("srun"):
            return proc
    raise AssertionError(f"no runner process for {run_json}")


def test_a_killed_lead_runner_is_a_backend_error_and_ends_the_gang(
    slurm_engine: EngineRunner, tmp_path: Path
) -> None:
    marker = f"trainyard-kill-{os.getpid()}-{time.time_ns()}"
    wid = slurm_engine.submit_spec(_sleeper_spec(tmp_path, "victims", marker))
    _wait_running(slurm_engine, wid)
    _runner_of(str(slurm_engine.engine.run_dir(wid, "a", 0) / "run.json")).send_signal(
        signal.SIGKILL
    )
    assert slurm_engine.wait(wid, 60).status == "FAILED"
    assert slurm_engine.state(wid).tasks["a"].status is Status.FAILED_BACKEND_ERROR
    # The killed runner's command is an orphan that proctrack/linuxproc (the test cluster's
    # process tracking) no longer sees; proctrack/cgroup on a real cluster ends it.
    time.sleep(2)
    for proc in _processes_with(marker):
        proc.kill()


def test_a_gang_held_in_slurms_queue_reaches_its_queue_timeout(
    slurm_engine: EngineRunner, slurm_pool: Pool, tmp_path: Path
) -> None:
    env = {**os.environ, "SLURM_CONF": str(slurm_pool.options["slurm_conf"])}
    hold = subprocess.run(
        # all of both nodes' memory (--mem=0): the partition oversubscribes cores, not memory
        [
            "sbatch",
            "--parsable",
            "--mem=0",
            "--nodes=2",
            f"--partition={slurm_pool.options['partition']}",
            "--job-name=trainyard-test-hold",
            "--output=/dev/null",
            "--wrap=sleep 300",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    ).stdout.strip()
    try:
        deadline = (
            time.monotonic() + 120
        )  # both nodes taken (once other jobs left) before trainyard asks
        while "RUNNING" not in _squeue(slurm_pool, f"--jobs={hold}", "--format=%T"):
            assert time.monotonic() < deadline, "the holding job never started"
            time.sleep(0.2)
        path = _sleeper_spec(tmp_path, "queued", f"never-{time.time_ns()}")
        path.write_text(
            path.read_text().replace(
                "workflow:\n", "workflow:\n  timeout:\n    queue_timeout: 4s\n", 1
            )
        )
        wid = slurm_engine.submit_spec(path)
        record = slurm_engine.wait(wid, 60)
        assert record.status == "FAILED_QUEUE_TIMEOUT", slurm_engine.state(wid)
        assert {t.status for t in slurm_engine.state(wid).tasks.values()} == {
            Status.FAILED_QUEUE_TIMEOUT
        }
        deadline = time.monotonic() + 30  # its pending job is cancelled, not left in the queue
        while "trainyard:queued" in _squeue(slurm_pool, "--format=%j"):
            assert time.monotonic() < deadline, _squeue(slurm_pool, "--format=%j %T")
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", hold], env=env, timeout=30, check=False)
