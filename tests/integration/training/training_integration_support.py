"""Helpers for the training kit's integration tests: real torchrun processes standing in for
nodes on this machine, example specs run the way a task runner would run them, and example
specs submitted to the real engine on the local pool (``EngineRun``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

BIN = Path(sys.executable).parent
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TIMEOUT_S = 180

__all__ = [
    "BIN",
    "EXAMPLES",
    "free_port",
    "Node",
    "run_nodes",
    "torchrun_cmd",
    "metrics",
    "task_scripts",
    "run_task_scripts",
    "EngineRun",
    "runner",
    "task_processes",
    "kill",
    "wait_until",
]


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


def run_nodes(
    commands: Sequence[Sequence[str]], cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> list[Node]:
    """Start all commands at once (a gang), wait for all. Each node's output goes to a file,
    so a node that nobody reads yet never blocks on a full pipe. On timeout every trainer
    prints its threads' stacks (SIGUSR1, see ``trainyard.training.train``), every process
    group is killed, and the AssertionError carries each node's output tail with the stacks."""
    with tempfile.TemporaryDirectory(prefix="nodes-") as folder:
        files = [
            open(Path(folder) / f"node{i}.txt", "w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            for i in range(len(commands))
        ]
        procs = [
            subprocess.Popen(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=_env(env),
                start_new_session=True,
            )
            for cmd, out in zip(commands, files, strict=False)
        ]
        try:
            deadline = time.monotonic() + TIMEOUT_S
            hung = not all(_ended_by(p, deadline) for p in procs)
            if hung:
                _dump_trainer_stacks(procs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        outputs = []
        for out in files:
            out.seek(0)
            outputs.append(out.read())
            out.close()
    if hung:
        tails = "\n".join(
            f"== node {i} (exit {p.returncode}), last 6000 characters\n{text[-6000:]}"
            for i, (p, text) in enumerate(zip(procs, outputs, strict=False))
        )
        raise AssertionError(
            f"the nodes did not finish in {TIMEOUT_S} s; their stacks and output:\n{tails}"
        )
    return [Node(p.returncode, out) for p, out in zip(procs, outputs, strict=False)]


def _ended_by(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False


def _dump_trainer_stacks(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGUSR1 to every trainer process under ``procs`` (not torchrun itself, whom it would
    kill); give them a moment to write their stacks."""
    for proc in procs:
        try:
            found = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for child in found:
            try:
                line = " ".join(child.cmdline())
                if "trainyard.training.train" in line and "torchrun" not in line:
                    child.send_signal(signal.SIGUSR1)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                pass
    time.sleep(2)


def torchrun_cmd(
    node_rank: int, nnodes: int, nproc: int, port: int, train_args: Sequence[str]
) -> list[str]:
    """``torchrun`` for one stand-in node of a static rendezvous at 127.0.0.1:port."""
    return [
        str(BIN / "torchrun"),
        "--nnodes",
        str(nnodes),
        "--nproc_per_node",
        str(nproc),
        "--node_rank",
        str(node_rank),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        "-m",
        "trainyard.training.train",
        *train_args,
    ]


def metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def task_scripts(spec: Path, set_values: Mapping[str, Any]) -> dict[str, str]:
    """Each task's first file (its run script) of a validated example, tokens unresolved."""
    from trainyard.spec.api import load

    doc = load(spec, set_values=dict(set_values))
    return {task.name: task.files[0].contents for task in doc.workflow.all_tasks()}


def run_task_scripts(
    scripts: Mapping[str, str],
    sandbox: Path,
    inputs: Mapping[str, Path] | None = None,
    workflow_id: str = "wf-test",
) -> dict[str, Node]:
    """Run each task's script with bash as a task runner would: tokens resolved
    (``{{host:*}}`` -> 127.0.0.1, ``{{output}}`` and ``/tmp`` private to the task), all tasks
    started together. Returns each task's exit code and output."""
    from trainyard.spec.tokens import substitute_tokens

    commands = []
    for name, script in scripts.items():
        root = sandbox / name
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        values = {
            "output": str(root / "output"),
            "workflow_id": workflow_id,
            **{f"host:{task}": "127.0.0.1" for task in scripts},
        }
        if inputs and name in inputs:
            values["input:0"] = str(inputs[name])
        text = substitute_tokens(script.replace("/tmp/", f"{root}/tmp/"), values)
        (root / "run.sh").write_text(text)
        commands.append(["bash", str(root / "run.sh")])
    return dict(zip(scripts, run_nodes(commands, cwd=sandbox), strict=False))


class EngineRun:
    """The real ``Engine`` with the local backend on the ``local`` pool, its store and runs
    under ``home``, stepped by a background thread once ``start()`` is called (``submit``
    only stores, so a test may act between a submit and the first start of a task).

    Tasks find their dataset store through ``TRAINYARD_HOME``: point it at ``home`` first.
    """

    def __init__(self, home: Path) -> None:
        from trainyard.engine.reconciler import Engine
        from trainyard.pools import default_local_pool
        from trainyard.store import Store

        self.home = home
        self.pool = default_local_pool()
        self.engine = Engine(
            Store(f"sqlite:///{home / 'db.sqlite'}"), home, pools={self.pool.name: self.pool}
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.submitted: list[str] = []

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.engine.run_forever, args=(self._stop,), daemon=True
            )
            self._thread.start()

    def submit(self, path: Path, values: Mapping[str, Any]) -> str:
        """Render, validate and submit a spec with these ``--set`` values; returns its id."""
        from trainyard import spec
        from trainyard.engine.reconciler import Submission

        doc = spec.load(path, set_values=dict(values), pool=self.pool)
        record = self.engine.submit(
            Submission(spec=doc.workflow, spec_text=path.read_text(), user="tester", pool=self.pool)
        )
        self.submitted.append(record.id)
        return record.id

    def wait(self, workflow_id: str, timeout_s: float = TIMEOUT_S) -> str:
        """The workflow's final status."""
        self.start()
        return self.engine.wait(workflow_id, timeout_s).status

    def state(self, workflow_id: str) -> Any:
        return self.engine.state(workflow_id)

    def run_dir(self, workflow_id: str, task: str, retry_id: int = 0) -> Path:
        return self.engine.run_dir(workflow_id, task, retry_id)

    def log(self, workflow_id: str, task: str, retry_id: int = 0) -> str:
        path = self.run_dir(workflow_id, task, retry_id) / "task.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self, workflow_id: str) -> str:
        """Every attempt's task log, for assertion messages (the tail matters most)."""
        paths = sorted((self.home / "runs" / workflow_id).glob("*/*/task.log"))
        return "\n".join(
            f"== {p.parent.parent.name} retry {p.parent.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in paths
        )

    def close(self) -> None:
        for workflow_id in self.submitted:
            self.engine.cancel(workflow_id)
        deadline = time.monotonic() + 30
        while (
            self.submitted
            and time.monotonic() < deadline
            and any(not self.state(w).status.is_terminal() for w in self.submitted)
        ):
            time.sleep(0.2)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def task_processes(workflow_id: str, task: str) -> list[psutil.Process]:
    """The processes of a task's command (its shell, torchrun, the trainers): those whose
    environment names the task, as the task runner sets it for the command. The runner itself
    is not among them."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if (
            env.get("TRAINYARD_WORKFLOW_ID") == workflow_id
            and env.get("TRAINYARD_TASK_NAME") == task
        ):
            found.append(proc)
    return found


def kill(procs: Iterable[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.05) -> Any:
    """Poll ``check`` until it returns something true; that value. AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineRun]:
    """An ``EngineRun`` under a fresh home that the task runners inherit as
    ``TRAINYARD_HOME`` (their dataset store); import it into a test module to use it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.delenv("TRAINYARD_DATASET_URL", raising=False)
    made = EngineRun(home)
    yield made
    made.close()
