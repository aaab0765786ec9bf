"""Helpers for the training kit's integration tests: real torchrun processes standing in for
nodes on this machine, and example specs run the way a task runner would run them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

BIN = Path(sys.executable).parent
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TIMEOUT_S = 180

__all__ = ["BIN", "EXAMPLES", "free_port", "Node", "run_nodes", "torchrun_cmd", "metrics",
           "task_scripts", "run_task_scripts"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # torchrun and python of this venv
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra or {})
    return env


@dataclass
class Node:
    """One stand-in node: a process (torchrun, the launcher or a task script) and its output."""

    returncode: int
    output: str


def run_nodes(commands: Sequence[Sequence[str]], cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> list[Node]:
    """Start all commands at once (a gang), wait for all; kill every process group on timeout."""
    procs = [subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=cwd, env=_env(env), start_new_session=True) for cmd in commands]
    try:
        outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [Node(p.returncode, out) for p, out in zip(procs, outputs)]


def torchrun_cmd(node_rank: int, nnodes: int, nproc: int, port: int, train_args: Sequence[str]) -> list[str]:
    """``torchrun`` for one stand-in node of a static rendezvous at 127.0.0.1:port."""
    return [str(BIN / "torchrun"), "--nnodes", str(nnodes), "--nproc_per_node", str(nproc),
            "--node_rank", str(node_rank), "--master_addr", "127.0.0.1", "--master_port", str(port),
            "-m", "trainyard.training.train", *train_args]


def metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def task_scripts(spec: Path, set_values: Mapping[str, Any]) -> dict[str, str]:
    """Each task's first file (its run script) of a validated example, tokens unresolved."""
    from trainyard.spec.api import load

    doc = load(spec, set_values=dict(set_values))
    return {task.name: task.files[0].contents for task in doc.workflow.all_tasks()}


def run_task_scripts(scripts: Mapping[str, str], sandbox: Path, inputs: Mapping[str, Path] | None = None,
                     workflow_id: str = "wf-test") -> dict[str, Node]:
    """Run each task's script with bash as a task runner would: tokens resolved
    (``{{host:*}}`` -> 127.0.0.1, ``{{output}}`` and ``/tmp`` private to the task), all tasks
    started together. Returns each task's exit code and output."""
    from trainyard.spec.tokens import substitute_tokens

    commands = []
    for name, script in scripts.items():
        root = sandbox / name
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        values = {"output": str(root / "output"), "workflow_id": workflow_id,
                  **{f"host:{task}": "127.0.0.1" for task in scripts}}
        if inputs and name in inputs:
            values["input:0"] = str(inputs[name])
        text = substitute_tokens(script.replace("/tmp/", f"{root}/tmp/"), values)
        (root / "run.sh").write_text(text)
        commands.append(["bash", str(root / "run.sh")])
    return dict(zip(scripts, run_nodes(commands, cwd=sandbox)))
