"""``workflow exec``, ``port-forward`` and ``rsync`` (issue 13, "Interactive verbs") with the
real CLI, the real server and real tasks on the local backend's bubblewrap sandbox.

What they must show: the command sees the task's own ``/`` and ``/tmp``, its host name, its
network namespace, and has no more privilege than the task (same user namespace, no
capabilities); its exit status is the CLI's; an unknown task exits 3, an ended one 4; only
the submitter or an admin may enter (not another user, not a task token); a forward reaches
``python3 -m http.server`` in the task; rsync copies both ways and refuses what escapes.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from cli_e2e_support import TRAINYARD, Server, cli_env
from tar_attacks import cve_2025_4517

from trainyard.tasktokens import task_token

SLEEPER = """
workflow:
  name: verbs
  tasks:
  - name: t
    command: [sh, -c]
    args: ["echo hello-from-task > /tmp/marker; exec sleep 600"]
"""

WEB = """
workflow:
  name: verbs-web
  tasks:
  - name: srv
    command: [sh, -c]
    args: ["mkdir -p /tmp/site && echo served-from-task > /tmp/site/index.txt && cd /tmp/site && exec {{python}} -m http.server {{port}}"]
    outputs:  # a task with data to move runs in a forked runner (the sleeper: in the launcher)
    - dataset:
        name: verbs-web-out
default-values:
  port: 8765
  python: python3  # the tests give theirs (bound read-only in every sandbox)
"""


def _submit(server: Server, tmp_path: Path, text: str, name: str, *args: str) -> str:
    spec = tmp_path / name
    spec.write_text(text)
    return server.submit(spec, *args)


@pytest.fixture(scope="module")
def running(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A workflow whose task ``t`` runs (and has written /tmp/marker in its sandbox)."""
    workflow_id = _submit(server, tmp_path_factory.mktemp("verbs"), SLEEPER, "sleeper.yaml")
    server.wait_task(workflow_id, "t", "RUNNING", timeout_s=120)
    deadline = time.monotonic() + 60
    while server.cli("workflow", "exec", workflow_id, "t", "--", "cat", "/tmp/marker").code != 0:
        assert time.monotonic() < deadline, "the task never wrote /tmp/marker"
        time.sleep(0.5)
    yield workflow_id
    server.main("workflow", "cancel", workflow_id)


def test_exec_runs_in_the_task_sandbox_without_privileges(server: Server, running: str) -> None:
    script = (
        "cat /tmp/marker; hostname; id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; "
        "readlink /proc/self/ns/user /proc/2/ns/user /proc/self/ns/net /proc/2/ns/net; "
        "unshare -U true 2>/dev/null; echo unshare=$?; test -e /work; echo work=$?"
    )
    done = server.cli("workflow", "exec", running, "t", "--", "sh", "-c", script)
    assert done.code == 0, done.err
    lines = done.out.splitlines()
    assert lines[:3] == ["hello-from-task", "t", "0"]
    assert all(line.endswith("0000000000000000") for line in lines[3:6]), lines[3:6]
    user_self, user_task, net_self, net_task = lines[6:10]
    assert (user_self, net_self) == (user_task, net_task)  # the task's command is pid 2
    assert "unshare=0" not in lines
    host_net = os.readlink("/proc/self/ns/net")
    assert net_self != host_net


def test_exec_exit_status_is_the_commands(server: Server, running: str) -> None:
    assert server.cli("workflow", "exec", running, "t", "--", "sh", "-c", "exit 7").code == 7
    missing = server.cli("workflow", "exec", running, "t", "--", "no-such-program-here")
    assert missing.code == 127 and "no-such-program-here" in missing.err


def test_exec_stdin_reaches_the_command(server: Server, running: str) -> None:
    done = subprocess.run(
        [
            str(TRAINYARD),
            "workflow",
            "exec",
            running,
            "t",
            "--",
            "sh",
            "-c",
            "cat > /tmp/piped; cat /tmp/piped",
        ],
        input="through-stdin\n",
        env=cli_env(server.home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "through-stdin\n"), done.stderr


def test_exec_with_a_terminal_gets_a_terminal_of_its_own(server: Server, running: str) -> None:
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [str(TRAINYARD), "workflow", "exec", running, "t", "--", "sh"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=cli_env(server.home),
        start_new_session=True,
    )
    os.close(slave)
    os.write(master, b"test -t 0 && test -t 1 && echo term=yes; echo answer=$((6*7)); exit 3\n")
    seen = b""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                seen += os.read(master, 65536)
            except OSError:
                break
    assert proc.wait(timeout=30) == 3, seen
    os.close(master)
    text = seen.decode(errors="replace")
    assert "answer=42" in text and "term=yes" in text, text


def test_exec_refuses_unknown_task_and_other_users(server: Server, running: str) -> None:
    unknown = server.cli("workflow", "exec", running, "nope", "--", "true")
    assert unknown.code == 3 and "no task 'nope'" in unknown.err
    added = server.cli("server", "add-user", "verbs-mallory")
    assert added.code == 0, added.err
    other = server.cli(
        "workflow", "exec", running, "t", "--", "true", TRAINYARD_TOKEN=added.out.strip()
    )
    assert other.code == 8 and "belongs to" in other.err
    as_task = server.cli(
        "workflow",
        "exec",
        running,
        "t",
        "--",
        "true",
        TRAINYARD_TOKEN=task_token(server.home, running),
    )
    assert as_task.code == 8 and "task token" in as_task.err


def test_rsync_both_ways_and_refuses_escapes(server: Server, running: str, tmp_path: Path) -> None:
    src = tmp_path / "in dir"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.txt").write_text("beta\n")
    pushed = server.cli("workflow", "rsync", running, "t", str(src), "t:/tmp/pushed")
    assert pushed.code == 0, pushed.err
    seen = server.cli("workflow", "exec", running, "t", "--", "cat", "/tmp/pushed/sub/b.txt")
    assert seen.out == "beta\n", seen.err
    pulled = server.cli("workflow", "rsync", running, "t", "t:/tmp/pushed", str(tmp_path / "out"))
    assert pulled.code == 0, pulled.err
    assert (tmp_path / "out" / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "out" / "sub" / "b.txt").read_text() == "beta\n"
    one = server.cli("workflow", "rsync", running, "t", "t:/tmp/marker", str(tmp_path / "m.txt"))
    assert one.code == 0 and (tmp_path / "m.txt").read_text() == "hello-from-task\n", one.err

    made = server.cli(
        "workflow",
        "exec",
        running,
        "t",
        "--",
        "sh",
        "-c",
        "mkdir -p /tmp/evil && echo x > /tmp/evil/f && ln -sfn /etc /tmp/evil/link",
    )
    assert made.code == 0, made.err
    evil = server.cli("workflow", "rsync", running, "t", "t:/tmp/evil", str(tmp_path / "evil"))
    assert evil.code == 4 and "a symlink to '/etc' (absolute" in evil.err
    assert not (tmp_path / "evil").exists()  # nothing half-made
    dots = server.cli("workflow", "rsync", running, "t", "t:/tmp/../etc", str(tmp_path / "x"))
    assert dots.code == 2 and "without '..'" in dots.err
    neither = server.cli("workflow", "rsync", running, "t", str(src), str(tmp_path / "y"))
    assert neither.code == 2


def test_rsync_download_of_a_forged_archive_writes_nothing_outside(
    server: Server, running: str, tmp_path: Path
) -> None:
    """The task replaces ``tar`` in its own root with one that sends CVE-2025-4517's archive
    (tarfile's ``data`` filter of this Python lets it write outside the destination)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    payload = tmp_path / "payload"
    payload.mkdir()
    staging = tmp_path / "staging"  # the CLI unpacks beside 'got': as deep as this
    (payload / "p.tar").write_bytes(cve_2025_4517(outside, staging).getvalue())
    up = server.cli("workflow", "rsync", running, "t", str(payload), "t:/tmp/payload")
    assert up.code == 0, up.err
    fake = (
        "printf '#!/bin/sh\\nexec cat /tmp/payload/p.tar\\n' > /usr/local/bin/tar && "
        "chmod 755 /usr/local/bin/tar && mkdir -p /tmp/any"
    )
    made = server.cli("workflow", "exec", running, "t", "--", "sh", "-c", fake)
    assert made.code == 0, made.err
    try:
        down = server.cli("workflow", "rsync", running, "t", "t:/tmp/any", str(tmp_path / "got"))
    finally:
        server.cli("workflow", "exec", running, "t", "--", "rm", "-f", "/usr/local/bin/tar")
    assert down.code == 4 and "refused what the task sent" in down.err, down.err
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "got").exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout_s: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=10)
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.5)


def _web_task(server: Server, tmp_path: Path) -> str:
    """A running workflow whose task ``srv`` serves index.txt on its port 8765; its id."""
    workflow_id = _submit(server, tmp_path, WEB, "web.yaml", "--set", f"python={sys.executable}")
    server.wait_task(workflow_id, "srv", "RUNNING", timeout_s=120)
    return workflow_id


def _port_forward(server: Server, workflow_id: str, local: int) -> subprocess.Popen[str]:
    """``trainyard workflow port-forward WORKFLOW srv --port LOCAL:8765``, running."""
    return subprocess.Popen(
        [str(TRAINYARD), "workflow", "port-forward", workflow_id, "srv", "--port", f"{local}:8765"],
        env=cli_env(server.home),
        stderr=subprocess.PIPE,
        text=True,
    )


def test_port_forward_reaches_a_server_in_the_task(server: Server, tmp_path: Path) -> None:
    workflow_id = _web_task(server, tmp_path)
    local = _free_port()
    forward = _port_forward(server, workflow_id, local)
    try:
        answer = _get(f"http://127.0.0.1:{local}/index.txt")
        assert (answer.status_code, answer.text) == (200, "served-from-task\n")
        assert _get(f"http://127.0.0.1:{local}/index.txt").text == "served-from-task\n"
        forward.send_signal(signal.SIGINT)
        assert forward.wait(timeout=30) == 0, forward.stderr.read()
        again = _port_forward(server, workflow_id, local)
        assert _get(f"http://127.0.0.1:{local}/index.txt").status_code == 200
        server.main("workflow", "cancel", workflow_id)
        assert again.wait(timeout=60) == 4
        assert "has ended" in again.stderr.read()
    finally:
        for proc in (forward, locals().get("again")):
            if proc is not None and proc.poll() is None:
                proc.kill()
    server.wait(workflow_id, timeout_s=120)
    ended = server.cli("workflow", "exec", workflow_id, "srv", "--", "true")
    assert ended.code == 4 and "has ended" in ended.err


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """A signal to one thread of ``pid`` (tgkill(2)), as the kernel may pick any thread that
    does not block it for a signal sent to the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(234, pid, tid, signum) != 0:  # SYS_tgkill on x86-64
        raise OSError(ctypes.get_errno(), "tgkill")


@pytest.mark.skipif(
    os.uname().machine != "x86_64", reason="tgkill's syscall number is x86-64's here"
)
def test_port_forward_stops_on_ctrl_c_delivered_to_another_thread(
    server: Server, tmp_path: Path
) -> None:
    """CI saw a port-forward ignore SIGINT for 30 s: the kernel gave the signal to the task
    watcher's thread, and the main thread, blocked in accept(), never ran Python's handler."""
    workflow_id = _web_task(server, tmp_path)
    local = _free_port()
    forward = _port_forward(server, workflow_id, local)
    try:
        assert _get(f"http://127.0.0.1:{local}/index.txt").status_code == 200
        others = [t.id for t in psutil.Process(forward.pid).threads() if t.id != forward.pid]
        assert others, "port-forward runs its task watcher in a thread of its own"
        _tgkill(forward.pid, others[0], signal.SIGINT)
        assert forward.wait(timeout=20) == 0, forward.stderr.read()
        assert "port-forward stopped" in forward.stderr.read()
    finally:
        if forward.poll() is None:
            forward.kill()
        server.main("workflow", "cancel", workflow_id)
    server.wait(workflow_id, timeout_s=120)


def test_exec_never_hands_the_callers_terminal_to_the_task(server: Server, running: str) -> None:
    """stdout a terminal, stdin not: the command writes to a pipe the CLI relays, not to the
    caller's terminal (a task could open it through /proc/PID/fd and push input into it)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [
            str(TRAINYARD),
            "workflow",
            "exec",
            running,
            "t",
            "--",
            "sh",
            "-c",
            "readlink /proc/self/fd/1 /proc/self/fd/2",
        ],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=cli_env(server.home),
    )
    os.close(slave)
    assert proc.wait(timeout=120) == 0
    seen = b""
    while select.select([master], [], [], 0.5)[0]:
        try:
            seen += os.read(master, 65536)
        except OSError:
            break
    os.close(master)
    lines = seen.decode().split()
    assert len(lines) == 2 and all(line.startswith("pipe:") for line in lines), lines


def test_exec_ctrl_c_reaches_the_command(server: Server, running: str) -> None:
    proc = subprocess.Popen(
        [str(TRAINYARD), "workflow", "exec", running, "t", "--", "sleep", "300"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(server.home),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not _sleeping_in_task(server, running):
        assert time.monotonic() < deadline, "the exec'd sleep never started"
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert proc.wait(timeout=30) == 130, proc.stderr.read()


def _sleeping_in_task(server: Server, workflow_id: str) -> bool:
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -qx 'sleep 300 '"
    )
    done = server.cli("workflow", "exec", workflow_id, "t", "--", "sh", "-c", script)
    return done.code == 0  # the task's own is "sleep 600"
