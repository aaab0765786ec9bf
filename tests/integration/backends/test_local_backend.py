"""The local backend with real processes: networking, sandbox, stop, recover, LOST."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from local_support import (
    final,
    group_launches,
    isolation_available,
    processes_with,
    task_log,
    wait_final,
    wait_for,
    wait_gone,
)

from trainyard.backends.base import FactKind, TaskKey
from trainyard.backends.local import LaunchRequest, LocalBackend, gpu_count, tracking
from trainyard.backends.local.launcher import address_name
from trainyard.errors import BackendError

needs_busybox = pytest.mark.skipif(
    shutil.which("busybox") is None, reason="busybox (nc -l -p) not installed"
)

SERVER = """echo "hello from $1" > /tmp/hello.txt
nc -w 20 -l -p {port} < /tmp/hello.txt
"""
CLIENT = """i=0
until nc -w 5 {{{{host:server}}}} {port} > /tmp/got.txt && [ -s /tmp/got.txt ]; do
  i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.1
done
echo "received: $(cat /tmp/got.txt)"
"""


def nc_group(backend: LocalBackend, home: Path, workflow_id: str, port: int) -> list:
    script = lambda text: [{"path": "/tmp/run.sh", "contents": text}]  # noqa: E731
    return group_launches(
        backend,
        home,
        workflow_id,
        {
            "server": {
                "image": "busybox",
                "command": ["sh", "/tmp/run.sh", workflow_id],
                "files": script(SERVER.format(port=port)),
            },
            "client": {
                "image": "busybox",
                "command": ["sh", "/tmp/run.sh"],
                "files": script(CLIENT.format(port=port)),
            },
        },
        barrier=True,
    )


@needs_busybox
def test_group_tasks_talk_over_host_token(backend: LocalBackend, home: Path) -> None:
    launches = nc_group(backend, home, "wf-nc", 24831)
    backend.start_group(launches)
    facts = wait_final(backend, [l.key for l in launches])
    assert [final(facts[l.key]).exit_code for l in launches] == [0, 0]
    assert "[client] received: hello from wf-nc" in task_log(launches[1])
    kinds = [f.kind for f in facts[launches[1].key]]
    assert kinds == [FactKind.INITIALIZING, FactKind.RUNNING, FactKind.EXITED]


@needs_busybox
def test_two_workflows_on_the_same_port_do_not_collide(sandboxed: LocalBackend, home: Path) -> None:
    groups = [nc_group(sandboxed, home, wid, 29400) for wid in ("wf-a", "wf-b")]
    for launches in groups:
        sandboxed.start_group(launches)
    keys = [l.key for launches in groups for l in launches]
    facts = wait_final(sandboxed, keys)
    assert [final(facts[k]).exit_code for k in keys] == [0, 0, 0, 0]
    for wid, launches in zip(("wf-a", "wf-b"), groups, strict=False):
        assert f"[client] received: hello from {wid}" in task_log(launches[1])


def test_each_task_has_a_private_tmp(backend: LocalBackend, home: Path) -> None:
    launches = []
    for name in ("one", "two"):
        text = f"echo {name} > /tmp/mine.txt\nsleep 0.5\necho saw $(cat /tmp/mine.txt)\n"
        launches += group_launches(
            backend,
            home,
            "wf-tmp",
            {
                name: {
                    "command": ["sh", "/tmp/run.sh"],
                    "files": [{"path": "/tmp/run.sh", "contents": text}],
                }
            },
            group=name,
        )
    for launch in launches:
        backend.start_group([launch])
    wait_final(backend, [l.key for l in launches])
    assert "[one] saw one" in task_log(launches[0])
    assert "[two] saw two" in task_log(launches[1])
    assert not Path("/tmp/mine.txt").exists() or "one" not in Path("/tmp/mine.txt").read_text()


def test_working_directory_is_root_and_files_land_at_absolute_paths(
    sandboxed: LocalBackend, home: Path
) -> None:
    launches = group_launches(
        sandboxed,
        home,
        "wf-cwd",
        {
            "t": {
                "command": [
                    "sh",
                    "-c",
                    "pwd; cat /app/conf.txt; hostname; echo x > tmp/rel.txt; cat /tmp/rel.txt",
                ],
                "files": [{"path": "/app/conf.txt", "contents": "conf for {{workflow_id}}\n"}],
            }
        },
    )
    sandboxed.start_group(launches)
    facts = wait_final(sandboxed, [launches[0].key])
    assert final(facts[launches[0].key]).exit_code == 0
    lines = [l.split("] ", 1)[1] for l in task_log(launches[0]).splitlines() if "[t] " in l]
    assert lines == ["/", "conf for wf-cwd", "t", "x"]
    assert not Path("/app/conf.txt").exists()


def test_fallback_runs_in_the_private_root_folder(home: Path) -> None:
    backend = LocalBackend(home=home, sandbox="none", network="loopback")
    launches = group_launches(
        backend,
        home,
        "wf-fb",
        {
            "t": {
                "command": ["sh", "-c", "pwd; cat /app/conf.txt"],
                "files": [{"path": "/app/conf.txt", "contents": "conf"}],
            }
        },
    )
    backend.start_group(launches)
    wait_final(backend, [launches[0].key])
    root = launches[0].run_dir / "sandbox" / "root"
    assert f"[t] {root}\n" in task_log(launches[0])
    assert (root / "app" / "conf.txt").read_text() == "conf"


def test_stop_kills_the_whole_tree_without_blocking(backend: LocalBackend, home: Path) -> None:
    marker = f"sleep 7{os.getpid() % 1000:03d}"
    script = (
        f"{marker} &\nsh -c '{marker} & {marker}' &\nsetsid {marker} &\n"
        "trap '' TERM\nwhile true; do sleep 0.2; done\n"
    )
    launches = group_launches(
        backend,
        home,
        "wf-stop",
        {
            "t": {
                "command": ["sh", "/tmp/run.sh"],
                "files": [{"path": "/tmp/run.sh", "contents": script}],
            }
        },
    )
    backend.start_group(launches)
    key = launches[0].key
    wait_for(backend, key, FactKind.RUNNING)
    deadline = time.monotonic() + 10
    while len(processes_with(marker)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with(marker)) >= 4  # four sleeps (and the sh -c holding two)
    started = time.monotonic()
    backend.stop([key])
    backend.stop([key])  # idempotent
    assert time.monotonic() - started < 0.5
    fact = final(wait_final(backend, [key], timeout_s=30)[key])
    assert fact.kind in (FactKind.EXITED, FactKind.LOST)
    assert fact.exit_code != 0
    assert wait_gone(marker) == []


def test_recover_after_dropping_the_backend(backend: LocalBackend, home: Path) -> None:
    launches = group_launches(
        backend,
        home,
        "wf-rec",
        {
            "long": {"command": ["sh", "-c", "echo started; sleep 60"]},
            "short": {"command": ["sh", "-c", "exit 3"]},
        },
    )
    backend.start_group(launches)
    long_key, short_key = (l.key for l in launches)
    wait_for(backend, short_key, FactKind.EXITED)
    wait_for(backend, long_key, FactKind.RUNNING, earlier=True)
    again = LocalBackend(
        home=home, sandbox=backend.sandbox, network=backend.network, stop_grace_s=2.0
    )
    del backend
    ghost = TaskKey("wf-rec", "never-started", 0)
    assert again.recover([long_key, short_key, ghost]) == [long_key]
    facts = again.poll()
    by_key = {k: [f.kind for f in facts if f.key == k] for k in (long_key, short_key, ghost)}
    assert by_key[long_key] == [FactKind.INITIALIZING, FactKind.RUNNING]
    assert by_key[short_key][-1] is FactKind.EXITED
    assert [f.exit_code for f in facts if f.key == short_key][-1] == 3
    assert by_key[ghost] == [FactKind.LOST]
    again.stop([long_key])
    assert final(wait_final(again, [long_key])[long_key]).exit_code not in (0, None)


@pytest.mark.parametrize("outputs", [False, True], ids=["command-only", "with-output"])
def test_killed_runner_is_lost_and_its_command_cleaned_up(
    backend: LocalBackend, home: Path, tmp_path: Path, outputs: bool
) -> None:
    """The process that runs the runner, SIGKILLed: a runner process of its own, or, for a
    sandboxed task that moves no data, the launcher whose thread hosts it (its sandboxes
    die with it)."""
    marker = f"sleep 8{os.getpid() % 1000:03d}"
    task: dict = {"command": ["sh", "-c", f"{marker} & {marker}"]}
    if outputs:
        task["outputs"] = [{"url": f"file://{tmp_path}/bucket/"}]
    launches = group_launches(backend, home, "wf-lost", {"t": task})
    backend.start_group(launches)
    key = launches[0].key
    wait_for(backend, key, FactKind.RUNNING)
    launch = json.loads((Path(launches[0].run_dir) / "launch.json").read_text())
    hosted = backend.sandbox == "bwrap" and not outputs
    assert (launch["hosted_by"] is not None) == hosted
    runner = psutil.Process(launch["pid"])
    forked = "trainyard.backends.local.launcher" in " ".join(runner.parent().cmdline())
    assert forked != hosted  # a forked runner's parent is the launcher; a hosted one's is it
    deadline = time.monotonic() + 10  # RUNNING is reported just before the command starts
    while "sleep" not in _names(runner.children(recursive=True)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert any("sleep" in " ".join(p.cmdline()) for p in runner.children(recursive=True))
    runner.send_signal(signal.SIGKILL)
    fact = final(wait_final(backend, [key])[key])
    assert fact.kind is FactKind.LOST
    assert wait_gone(marker) == []


def _names(procs: list[psutil.Process]) -> list[str]:
    names = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            names.append(proc.name())
    return names


def test_what_a_dead_launcher_left_in_its_session_is_killed(home: Path) -> None:
    """A sandbox that a launcher was starting as it died may have missed asking for
    ``--die-with-parent``: an ended hosted attempt whose launcher is gone takes what is left
    in the launcher's session with it (and a live launcher's session is left alone)."""
    marker = f"sleep 9{os.getpid() % 1000:03d}"
    host = subprocess.Popen(["sh", "-c", f"{marker} & {marker} & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(processes_with(marker)) < 3:  # sh and its two sleeps
        assert time.monotonic() < deadline
        time.sleep(0.02)
    attempt = tracking.Attempt(
        TaskKey("wf", "t", 0),
        home,
        host.pid,
        psutil.Process(host.pid).create_time(),
        hosted="launcher",
    )
    backend = LocalBackend(home=home, sandbox="none", network="loopback")
    backend._kill_leftovers([attempt])
    assert len(processes_with(marker)) == 3 and host.poll() is None  # its host lives
    host.kill()
    host.wait()
    backend._kill_leftovers([attempt])
    assert wait_gone(marker) == []


def test_no_launcher_is_a_backend_error(home: Path) -> None:
    if isolation_available("bwrap", "loopback"):
        pytest.skip("bubblewrap not available")
    backend = LocalBackend(
        home=home, sandbox="bwrap", network="loopback", python="/nonexistent/python3"
    )
    launches = group_launches(backend, home, "wf-se", {"t": {"command": ["true"]}})
    with pytest.raises(BackendError, match="launcher"):
        backend.start_group(launches)


def test_runner_that_dies_before_reporting_is_a_start_error(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(home=home, sandbox="none", network="loopback")
    prepare = LocalBackend._write_run_files

    def spoil(self: LocalBackend, request: LaunchRequest) -> None:
        prepare(self, request)
        (request.run_dir / "run.json").write_text("{not json")

    monkeypatch.setattr(LocalBackend, "_write_run_files", spoil)
    launches = group_launches(backend, home, "wf-se", {"t": {"command": ["true"]}})
    backend.start_group(launches)
    fact = final(wait_final(backend, [launches[0].key])[launches[0].key])
    assert fact.kind is FactKind.START_ERROR and "ValidationError" in fact.message


@needs_busybox
def test_cli_reaches_the_host_server_from_a_task(
    backend: LocalBackend, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        conn, _ = server.accept()
        conn.sendall(b"server-says-hi\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    monkeypatch.setenv("TRAINYARD_SERVER_URL", f"http://127.0.0.1:{port}")
    launches = group_launches(
        backend,
        home,
        "wf-cli",
        {
            "t": {
                "image": "busybox",
                "command": [
                    "sh",
                    "-c",
                    'echo "url=$TRAINYARD_SERVER_URL"; '
                    'nc -w 5 127.0.0.1 ${TRAINYARD_SERVER_URL##*:} </dev/null',
                ],
            }
        },
    )
    backend.start_group(launches)
    facts = wait_final(backend, [launches[0].key])
    server.close()
    assert final(facts[launches[0].key]).exit_code == 0
    text = task_log(launches[0])
    assert f"url=http://127.0.0.1:{port}" in text and "[t] server-says-hi" in text


def test_gpu_slots_become_cuda_visible_devices(backend: LocalBackend, home: Path) -> None:
    launches = group_launches(
        backend,
        home,
        "wf-gpu",
        {"t": {"command": ["sh", "-c", 'echo "cvd=[$CUDA_VISIBLE_DEVICES]"']}},
        gpu_slots=[0],
    )
    backend.start_group(launches)
    wait_final(backend, [launches[0].key])
    expected = "0" if gpu_count() > 0 else ""
    assert f"[t] cvd=[{expected}]" in task_log(launches[0])


def test_data_flows_through_task_inputs_and_file_urls(
    backend: LocalBackend, home: Path, tmp_path: Path
) -> None:
    bucket = tmp_path / "bucket"
    first = group_launches(
        backend,
        home,
        "wf-data",
        {
            "a": {
                "command": [
                    "sh",
                    "-c",
                    "echo payload > {{output}}/data.txt; echo no > {{output}}/x.bin",
                ],
                "outputs": [{"url": f"file://{bucket}/out/", "regex": r"\.txt$"}],
            }
        },
        group="a",
    )
    backend.start_group(first)
    assert final(wait_final(backend, [first[0].key])[first[0].key]).exit_code == 0
    assert sorted(p.name for p in (bucket / "out").iterdir()) == ["data.txt"]
    second = group_launches(
        backend,
        home,
        "wf-data",
        {
            "b": {
                "command": ["sh", "-c", "cat {{input:0}}/data.txt {{input:1}}/data.txt"],
                "inputs": [
                    {"kind": "task", "name": "a", "source": str(first[0].run_dir / "output")},
                    {"kind": "url", "name": "u", "source": f"file://{bucket}/out/"},
                ],
            }
        },
        group="b",
    )
    backend.start_group(second)
    assert final(wait_final(backend, [second[0].key])[second[0].key]).exit_code == 0
    assert task_log(second[0]).count("[b] payload") == 2


def test_restart_in_place_keeps_the_sandbox(backend: LocalBackend, home: Path) -> None:
    script = [
        {
            "path": "/tmp/run.sh",
            "contents": "[ -f /tmp/state ] && echo found $(cat /tmp/state)\necho kept > /tmp/state\n",
        }
    ]
    first = group_launches(
        backend, home, "wf-rs", {"t": {"command": ["sh", "/tmp/run.sh"], "files": script}}
    )
    backend.start_group(first)
    wait_final(backend, [first[0].key])
    second = group_launches(
        backend,
        home,
        "wf-rs",
        {"t": {"command": ["sh", "/tmp/run.sh"], "files": script}},
        retry_id=1,
        restart_in_place=True,
    )
    backend.start_group(second)
    assert final(wait_final(backend, [second[0].key])[second[0].key]).exit_code == 0
    assert "found kept" not in task_log(first[0])
    assert "[t] found kept" in task_log(second[0])


def test_restart_in_place_keeps_the_output_folder(backend: LocalBackend, home: Path) -> None:
    task = {
        "t": {
            "command": [
                "sh",
                "-c",
                "cat {{output}}/model.txt 2>/dev/null; echo step >> {{output}}/model.txt",
            ]
        }
    }
    first = group_launches(backend, home, "wf-ro", task)
    backend.start_group(first)
    wait_final(backend, [first[0].key])
    second = group_launches(backend, home, "wf-ro", task, retry_id=1, restart_in_place=True)
    backend.start_group(second)
    assert final(wait_final(backend, [second[0].key])[second[0].key]).exit_code == 0
    assert "[t] step" in task_log(second[0])  # it read what the first attempt wrote
    assert (second[0].run_dir / "output" / "model.txt").read_text() == "step\nstep\n"


def test_real_gpus_are_not_shared_across_virtual_nodes(
    backend: LocalBackend, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "gpu_count", lambda: 2)  # no GPU here: pretend two
    show = {"command": ["sh", "-c", 'echo "cvd=[$CUDA_VISIBLE_DEVICES]"; sleep 1']}
    groups = [
        group_launches(backend, home, f"wf-gpus-{i}", {"t": show}, gpu_slots=[0]) for i in range(3)
    ]
    for i, launches in enumerate(groups):
        launches[0].node = f"local-{i}"  # slot 0 of three virtual nodes
        backend.start_group(launches)
    wait_final(backend, [launches[0].key for launches in groups])
    shown = [task_log(launches[0]) for launches in groups]
    assert ["[t] cvd=[0]" in shown[0], "[t] cvd=[1]" in shown[1], "[t] cvd=[]" in shown[2]] == [
        True,
        True,
        True,
    ]  # two real GPUs, each lent once; the third task runs as CPU
    assert tracking.GPUS.lent() == {}  # every lease ended with its attempt


def test_after_dropping_the_backend_unstarted_and_gpus_are_known(
    backend: LocalBackend, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "gpu_count", lambda: 1)
    launches = group_launches(
        backend, home, "wf-un", {"t": {"command": ["sleep", "60"]}}, gpu_slots=[0]
    )
    backend.start_group(launches)
    key, ghost = launches[0].key, TaskKey("wf-un", "t", 1)
    again = LocalBackend(
        home=home, sandbox=backend.sandbox, network=backend.network, stop_grace_s=2.0
    )
    assert again.unstarted([key, ghost]) == [ghost]
    tracking.GPUS.give_back(tracking.Attempt(key, None))  # as if this process restarted
    assert again.recover([key]) == [key]
    assert tracking.GPUS.lent() == {0: key}  # the recovered attempt holds its GPU again
    again.stop([key])
    wait_final(again, [key])
    assert tracking.GPUS.lent() == {}


def test_trainyard_venv_and_cli_work_inside_a_task(backend: LocalBackend, home: Path) -> None:
    launches = group_launches(
        backend,
        home,
        "wf-venv",
        {
            "t": {
                "command": [
                    "sh",
                    "-c",
                    "trainyard version && python -c 'import trainyard.runner; print(\"ok\")'",
                ]
            }
        },
    )
    backend.start_group(launches)
    facts = wait_final(backend, [launches[0].key])
    assert final(facts[launches[0].key]).exit_code == 0, task_log(launches[0])
    assert "[t] ok" in task_log(launches[0])


TORCH_SCRIPT = """
import os, torch, torch.distributed as dist
rank = int(os.environ["TRAINYARD_TASK_INDEX"])
dist.init_process_group("gloo", init_method="tcp://{{host:master}}:29400", rank=rank, world_size=2)
value = torch.tensor([rank + 1.0])
dist.all_reduce(value)
print("sum", value.item(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_gloo_rendezvous_over_host_token(backend: LocalBackend, home: Path) -> None:
    pytest.importorskip("torch")
    files = [{"path": "/tmp/train.py", "contents": TORCH_SCRIPT}]
    launches = group_launches(
        backend,
        home,
        "wf-ddp",
        {
            name: {"command": ["python", "/tmp/train.py"], "files": files}
            for name in ("master", "worker")
        },
    )
    backend.start_group(launches)
    facts = wait_final(backend, [l.key for l in launches], timeout_s=120)
    logs = "\n".join(task_log(l)[-1500:] for l in launches)
    assert [final(facts[l.key]).exit_code for l in launches] == [0, 0], logs
    assert all("sum 3.0" in task_log(l) for l in launches), logs


def test_idle_connections_to_the_server_cost_no_launcher_thread_each(
    backend: LocalBackend, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task opens 300 idle connections to the server's forwarded port (1,500 cost 4,504
    threads of the launcher that hosts every user's runners): the relay holds them on one
    event loop, and bytes still flow both ways."""
    server = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept_all() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if not accepted:
                conn.sendall(conn.recv(16))  # the first one echoes
            accepted.append(conn)

    threading.Thread(target=accept_all, daemon=True).start()
    monkeypatch.setenv("TRAINYARD_SERVER_URL", f"http://127.0.0.1:{port}")
    script = (
        "import os, socket, time\n"
        "port = int(os.environ['TRAINYARD_SERVER_URL'].rsplit(':', 1)[1])\n"
        "first = socket.create_connection(('127.0.0.1', port), timeout=30)\n"
        "first.sendall(b'ping'); print('echo', first.recv(16).decode(), flush=True)\n"
        "rest = [socket.create_connection(('127.0.0.1', port), timeout=30) for _ in range(299)]\n"
        "print('opened', 1 + len(rest), flush=True)\n"
        "time.sleep(60)\n"
    )
    launches = group_launches(
        backend, home, "wf-conns", {"t": {"command": ["python3", "-c", script]}}
    )
    backend.start_group(launches)
    try:
        log = launches[0].run_dir / "task.log"
        _until(lambda: log.exists() and "opened 300" in log.read_text(), timeout_s=90)
        _until(lambda: len(accepted) >= 300, timeout_s=30)
        # This backend's launcher and its keepers only: launchers of earlier tests linger
        # for their idle time and hold threads of their own.
        mine = processes_with(address_name(backend.state_dir, backend.python))
        assert mine, "no launcher of this backend found"
        threads = sum(p.num_threads() for p in mine)
        assert threads < 60, f"{threads} threads in the launcher and keepers"
        assert "[t] echo ping" in task_log(launches[0])
    finally:
        backend.stop([launches[0].key])
        server.close()


def _until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.2)


def test_a_failed_sandbox_start_says_why_and_is_tried_again(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a start ended 126 with "bwrap ended before its user namespace was set up"
    and nothing else: what bwrap printed was thrown away. A bwrap that fails once (as a
    passing failure would) now leaves its words in the task log, and the start is retried."""
    fake_dir = Path(tempfile.mkdtemp(prefix="ty-fake-bwrap-"))  # 0755: the task's uid runs it
    fake_dir.chmod(0o755)
    marks = fake_dir / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    real = shutil.which("bwrap")
    (fake_dir / "bwrap").write_text(
        f"#!/bin/sh\ncase \" $* \" in *' --args '*)  # a task's start, not the backend's probe\n"
        f"  if [ ! -e {marks}/failed ]; then touch {marks}/failed\n"
        f"  echo 'fake-bwrap: refused on purpose' >&2; exit 1; fi;; esac\n"
        f"exec {real} \"$@\"\n"
    )
    (fake_dir / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_dir}:{os.environ['PATH']}")
    made = LocalBackend(home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)
    try:
        launches = group_launches(
            made, home, "wf-retry", {"t": {"command": ["sh", "-c", "echo started"]}}
        )
        made.start_group(launches)
        fact = final(wait_final(made, [launches[0].key], timeout_s=90)[launches[0].key])
        text = task_log(launches[0])
        assert fact.exit_code == 0, text
        assert "it said: fake-bwrap: refused on purpose" in text
        assert "trying again (2 of 3)" in text and "[t] started" in text
    finally:
        made.stop(list(made._attempts))
        shutil.rmtree(fake_dir, ignore_errors=True)
