"""The local backend's launcher as a real process: forks runners, holds group namespaces,
answers only its own user, idles out."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from trainyard.backends.local.launcher import LauncherClient, address_name
from trainyard.backends.local.messages import Ping
from trainyard.errors import BackendError
from trainyard.runner.report import read_events


def launcher_process(state_dir: Path) -> psutil.Process:
    name = address_name(state_dir)
    return next(p for p in psutil.process_iter(["cmdline"]) if name in (p.info["cmdline"] or []))


def run_json(tmp_path: Path, name: str, command: list[str]) -> Path:
    run_dir = tmp_path / "runs" / name
    (run_dir / "root").mkdir(parents=True)
    path = run_dir / "run.json"
    path.write_text(
        json.dumps(
            {
                "workflow_id": "wf",
                "group": "g",
                "task": name,
                "command": command,
                "run_dir": str(run_dir),
                "sandbox": {"root": str(run_dir / "root")},
            }
        )
    )
    return path


def wait_exit(run_dir: Path, timeout_s: float = 30.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events, _ = read_events(run_dir / "events.jsonl")
        if events and events[-1].kind == "EXITED":
            return events[-1].exit_code
        time.sleep(0.05)
    return None


@pytest.fixture
def client(tmp_path: Path) -> LauncherClient:
    made = LauncherClient(tmp_path / "state", idle_s=30)
    yield made
    with_pid = [
        p for p in psutil.process_iter(["cmdline"]) if made.name in (p.info["cmdline"] or [])
    ]
    for proc in with_pid:
        proc.kill()


def test_runs_a_task_in_its_own_session_with_the_given_environment(
    client: LauncherClient, tmp_path: Path
) -> None:
    path = run_json(tmp_path, "a", ["sh", "-c", "echo from=$FROM_TEST"])
    env = {**os.environ, "FROM_TEST": "the-request"}
    pid, created = client.run(path, path.parent / "runner.out", path.parent, env, None)
    assert wait_exit(path.parent) == 0
    assert "[a] from=the-request" in (path.parent / "task.log").read_text()
    launcher = launcher_process(client.state_dir)
    assert pid != launcher.pid and abs(created - time.time()) < 120
    again = LauncherClient(client.state_dir)  # a second client finds the same launcher
    assert again.request(Ping())["pid"] == launcher.pid


def test_a_dead_spare_is_passed_over(client: LauncherClient, tmp_path: Path) -> None:
    client.request(Ping())
    launcher = launcher_process(client.state_dir)
    deadline = time.monotonic() + 10
    while len(launcher.children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = {spare.pid for spare in launcher.children()}
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    while killed & {c.pid for c in launcher.children()} and time.monotonic() < deadline + 10:
        time.sleep(0.05)  # reaped: (a spare that dies after taking its job is a START_ERROR)
    path = run_json(tmp_path, "b", ["true"])
    client.run(path, path.parent / "runner.out", path.parent, dict(os.environ), None)
    assert wait_exit(path.parent) == 0


def test_a_group_keeps_one_namespace_and_groups_differ(client: LauncherClient) -> None:
    def inode(argv: list[str]) -> str:
        done = subprocess.run(
            [*argv, "readlink", "/proc/self/ns/net"], capture_output=True, text=True, timeout=20
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    first = client.network("wf/a", [])
    assert inode(first.join_argv()) == inode(client.network("wf/a", []).join_argv())
    other = inode(client.network("wf/b", []).join_argv())
    assert len({inode(first.join_argv()), other, os.readlink("/proc/self/ns/net")}) == 3


def ask(name: str, line: bytes) -> dict[str, object]:
    """Send one raw request line to the launcher ``name``; its JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect("\0" + name)
        sock.sendall(line + b"\n")
        return dict(json.loads(sock.makefile("rb").readline()))


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (b'{"op": "reboot"}', "op"),
        (b'{"op": "stop"}', "run_dir: Field required"),
        (b'{"op": "network", "group": "wf/a", "forward": ["http"]}', "forward.0"),
        (b'{"op": "ping", "as_root": true}', "as_root: Extra inputs are not permitted"),
        (b'{"op": "run_many", "runs": [{"out": "x", "cwd": "/"}]}', "run_json: Field required"),
        (b"not json", "malformed launcher request"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field(
    client: LauncherClient, line: bytes, said: str
) -> None:
    launcher = client.request(Ping())["pid"]
    reply = ask(client.name, line)
    assert set(reply) == {"error"}, reply
    assert "MalformedRequest: malformed launcher request" in str(reply["error"]), reply
    assert said in str(reply["error"]), reply
    assert client.request(Ping())["pid"] == launcher  # it goes on serving


NOBODY_PING = """
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.settimeout(10)
    sock.connect("\\0" + sys.argv[1])
    try:  # the launcher refuses at accept: it may have answered and closed before we speak
        sock.sendall(b'{"op": "ping"}\\n')
    except BrokenPipeError:
        pass
    sys.stdout.write(sock.recv(4096).decode())
"""
SYSTEM_PYTHON = "/usr/bin/python3"  # one that user nobody may run (the venv's may sit in /root)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"no {SYSTEM_PYTHON}")
def test_another_user_is_refused(client: LauncherClient) -> None:
    launcher = client.request(Ping())["pid"]
    asked = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", "-c", NOBODY_PING, client.name],
        user=65534,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert "only this user's processes" in asked.stdout, (asked.stdout, asked.stderr)
    assert '"pid"' not in asked.stdout
    assert client.request(Ping())["pid"] == launcher  # it still serves its own user


def test_an_idle_launcher_exits_and_a_new_one_starts(tmp_path: Path) -> None:
    client = LauncherClient(tmp_path / "state", idle_s=0.3)
    first = client.request(Ping())["pid"]
    psutil.Process(first).wait(timeout=20)
    assert "exiting (idle)" in (tmp_path / "state" / "launcher.log").read_text()
    # the next one idles longer: it must still be there for the SIGTERM on a loaded machine
    second = LauncherClient(tmp_path / "state", idle_s=60).request(Ping())["pid"]
    assert second != first
    os.kill(second, signal.SIGTERM)
    try:
        psutil.Process(second).wait(timeout=60)
    except psutil.TimeoutExpired:  # seen once in a full CI-like run: say what it was doing
        stack = subprocess.run(
            ["cat", f"/proc/{second}/stack", f"/proc/{second}/status"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        os.kill(second, signal.SIGKILL)
        log = (tmp_path / "state" / "launcher.log").read_text()
        raise AssertionError(
            f"launcher {second} ignored SIGTERM for 60 s\n{log}\n{stack}"
        ) from None
    assert "exiting (SIGTERM)" in (tmp_path / "state" / "launcher.log").read_text()


def test_a_released_launcher_exits_once_its_runners_end(
    client: LauncherClient, tmp_path: Path
) -> None:
    path = run_json(tmp_path, "c", ["sleep", "1"])
    client.run(path, path.parent / "runner.out", path.parent, dict(os.environ), None)
    launcher = launcher_process(client.state_dir)
    client.release()
    time.sleep(0.3)
    assert launcher.is_running()  # its runner still runs
    assert wait_exit(path.parent) == 0
    launcher.wait(timeout=20)
    assert "exiting (released)" in (client.state_dir / "launcher.log").read_text()
    LauncherClient(tmp_path / "elsewhere").release()  # none there: nothing starts
    assert not (tmp_path / "elsewhere" / "launcher.log").exists()


def test_an_interpreter_that_does_not_exist_is_a_backend_error(tmp_path: Path) -> None:
    client = LauncherClient(tmp_path / "state", python=str(tmp_path / "no-python"))
    with pytest.raises(BackendError, match="could not start the launcher"):
        client.request(Ping())


def test_a_hosted_runner_is_a_thread_with_the_requests_environment(
    client: LauncherClient, tmp_path: Path
) -> None:
    path = run_json(tmp_path, "h", ["sh", "-c", "echo from=$FROM_TEST; echo pid=$$"])
    env = {**os.environ, "FROM_TEST": "hosted"}
    pid, created = client.run(
        path, path.parent / "runner.out", path.parent, env, "wf/g", mode="thread"
    )
    assert wait_exit(path.parent) == 0
    launcher = launcher_process(client.state_dir)
    assert pid == launcher.pid  # no process of its own
    assert abs(created - launcher.create_time()) < 1
    assert "[h] from=hosted" in (path.parent / "task.log").read_text()
    deadline = time.monotonic() + 10
    while not (path.parent / "runner.ended").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (path.parent / "runner.ended").exists()
    assert client.stop_hosted(path.parent) is False  # ended: nothing to stop


def test_a_hosted_runner_stops_on_request_and_its_exit_code_is_reported(
    client: LauncherClient, tmp_path: Path
) -> None:
    path = run_json(tmp_path, "s", ["sh", "-c", "echo up; sleep 60"])
    client.run(path, path.parent / "runner.out", path.parent, dict(os.environ), None, mode="thread")
    deadline = time.monotonic() + 20
    while "[s] up" not in _text(path.parent / "task.log") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.stop_hosted(path.parent) is True
    assert wait_exit(path.parent) == 143  # SIGTERM, as a runner process reports it
    assert not [
        p
        for p in launcher_process(client.state_dir).children(recursive=True)
        if "sleep" in " ".join(p.cmdline())
    ]


def test_a_hosted_runner_that_cannot_start_leaves_its_traceback_and_ends(
    client: LauncherClient, tmp_path: Path
) -> None:
    path = run_json(tmp_path, "bad", ["true"])
    path.write_text("{not json")
    client.run(path, path.parent / "runner.out", path.parent, dict(os.environ), None, mode="thread")
    deadline = time.monotonic() + 10
    while not (path.parent / "runner.ended").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "ValidationError" in (path.parent / "runner.out").read_text()
    assert read_events(path.parent / "events.jsonl")[0] == []
    assert client.request(Ping())["pid"] == launcher_process(client.state_dir).pid


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.skipif(os.geteuid() != 0, reason="a namespace held as a descriptor needs root")
def test_a_hosted_runner_starts_its_command_in_the_groups_namespace(
    client: LauncherClient, tmp_path: Path
) -> None:
    path = run_json(tmp_path, "n", ["readlink", "/proc/self/ns/net"])
    client.run(
        path,
        path.parent / "runner.out",
        path.parent,
        dict(os.environ),
        "wf/n",
        mode="thread",
        network={"group": "wf/n", "forward": []},
    )
    assert wait_exit(path.parent) == 0
    net = client.network("wf/n", [])  # the namespace the run request made
    assert net.ns_path is not None
    group_ns = f"net:[{os.stat(net.ns_path).st_ino}]"
    assert group_ns != os.readlink("/proc/self/ns/net")
    assert f"[n] {group_ns}" in (path.parent / "task.log").read_text()
    # the launcher's own thread stayed in the host's namespace
    launcher = launcher_process(client.state_dir)
    assert os.readlink(f"/proc/{launcher.pid}/ns/net") == os.readlink("/proc/self/ns/net")
