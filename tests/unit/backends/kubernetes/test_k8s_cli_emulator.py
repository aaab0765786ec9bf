"""What a user sees of a workflow on a Kubernetes pool, through the real CLI and server (the
server's app in a thread, its engine on a pool pointed at kmock's API emulator; the test
plays the kubelet): the scheduler's Unschedulable message as the group's waiting reason in
``workflow query`` (text and ``-t json``), and a running pod's log lines in ``workflow logs``
(following, a real process) as they are written (issue 26)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_emulator import NAMESPACE, Emulator, Kubelet
from served_cli import cli, served

REPO = Path(__file__).resolve().parents[4]
SPEC = REPO / "examples" / "torchrun_multinode" / "train.yaml"
TIMEOUT_S = 30
WHY = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


@pytest.fixture
def home(tmp_path: Path, emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example's ``k8s`` pool pointed at the emulator, its server up, the CLI on it."""
    home = tmp_path / "home"
    home.mkdir()
    pools = yaml.safe_load((REPO / "examples" / "kubernetes" / "pools.yaml").read_text())
    pools["pools"]["k8s"]["options"] = {
        "namespace": NAMESPACE,
        "lost_grace_s": 0.2,
        "kubeconfig": str(emulator.kubeconfig),
    }
    (home / "pools.yaml").write_text(yaml.safe_dump(pools))
    with served(home, monkeypatch):
        yield home


def _submit(capsys: pytest.CaptureFixture[str], emulator: Emulator) -> tuple[str, list[str]]:
    """The seed spec submitted to ``k8s``: its id and its two pods' names, once made."""
    cli(capsys, "workflow", "submit", str(SPEC), "--pool", "k8s")
    [row] = json.loads(cli(capsys, "workflow", "list", "-t", "json"))
    wid = row["id"] if "id" in row else row["name"]
    deadline = time.monotonic() + TIMEOUT_S
    while len(pods := emulator.pods_of(wid)) < 2:
        assert time.monotonic() < deadline, "the pods were not made"
        time.sleep(0.05)
    return wid, sorted(p["metadata"]["name"] for p in pods)


def _query_until(capsys: pytest.CaptureFixture[str], wid: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    while not done(data := json.loads(cli(capsys, "workflow", "query", wid, "-t", "json"))):
        assert time.monotonic() < deadline, data.get("waiting")
        time.sleep(0.1)
    return data


def test_query_shows_the_schedulers_unschedulable_message(
    home: Path, emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    wid, pods = _submit(capsys, emulator)
    Kubelet(emulator).unschedulable(pods[1], WHY)
    data = _query_until(capsys, wid, lambda d: bool(d["waiting"]))
    assert data["waiting"] == [
        {
            "group": "training",
            "status": "INITIALIZING",
            "reason": f"task worker: Unschedulable: {WHY}",
            "since": data["waiting"][0]["since"],
        }
    ]
    text = cli(capsys, "workflow", "query", wid)
    assert f"Waiting: group training INITIALIZING: task worker: Unschedulable: {WHY}" in " ".join(
        text.split()
    )
    cli(capsys, "workflow", "cancel", wid)


def test_logs_follow_shows_a_running_pods_lines_as_they_come(
    home: Path, emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    wid, pods = _submit(capsys, emulator)
    kubelet = Kubelet(emulator)
    for pod in pods:
        kubelet.run(pod)
    _query_until(capsys, wid, lambda d: d["status"] == "RUNNING")
    follow = subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", "workflow", "logs", wid, "--task", "master"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    lines: queue.Queue[str] = queue.Queue()
    assert follow.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout], daemon=True)
    reader.start()
    try:
        emulator.set_log(pods[0], "2026/11/27 00:00:00 [master] epoch 1 loss 0.9\n")
        assert lines.get(timeout=TIMEOUT_S) == "2026/11/27 00:00:00 [master] epoch 1 loss 0.9\n"
        assert emulator.pod(pods[0])["status"]["phase"] == "Running"  # the line came live
        emulator.set_log(pods[0], "2026/11/27 00:00:09 [master] epoch 2 loss 0.4\n")
        assert lines.get(timeout=TIMEOUT_S) == "2026/11/27 00:00:09 [master] epoch 2 loss 0.4\n"
        for pod in reversed(pods):  # the lead last: its end stops (deletes) the others' pods
            kubelet.exit(pod, 0)
        assert follow.wait(TIMEOUT_S) == 0  # the workflow ended: so does the follow
        reader.join(TIMEOUT_S)
        assert lines.empty()  # no line twice
    finally:
        follow.kill()
        follow.wait()
