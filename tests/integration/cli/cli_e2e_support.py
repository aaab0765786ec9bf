"""Helpers of the end-to-end CLI tests: running the CLI (as a process or in-process), the
session's server as the CLI sees it, processes of a home, and the OSMO rows.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_process import BIN, TERMINAL, Result, cli_env, wait_for_status

from trainyard.cli.main import main

TRAINYARD = BIN / "trainyard"
SPECS = (Path(__file__).resolve().parents[3] / ".." / "shared" / "osmo-specs").resolve()
OSMO_PLATFORMS = ("ovx-a40", "ovx-l40", "dgx-h100", "agx-orin-jp6")


def osmo_pools_yaml() -> str:
    """A pool like OSMO's test deployment (8 GPUs, 64 CPUs, 512Gi, 2Ti per node)."""
    nodes = "\n".join(
        f"    - {{name: {p}-0, platform: {p}, gpu: 8, cpu: 64, memory: 512Gi, storage: 2Ti}}"
        for p in OSMO_PLATFORMS
    )
    return f"pools:\n  osmo:\n    backend: local\n    nodes:\n{nodes}\n"


def run_cli(home: Path, *args: str, timeout_s: float = 300, **env: str) -> Result:
    """``trainyard ARGS`` as a real process."""
    done = subprocess.run(
        [str(TRAINYARD), *args],
        env=cli_env(home, **env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def run_main(*args: str) -> Result:
    """``trainyard ARGS`` in this process (``cli.main.main``), output captured."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return Result(code, out.getvalue(), err.getvalue())


def processes_of(home: Path) -> list[psutil.Process]:
    """Processes started for ``home``: its path on their command line or TRAINYARD_HOME=home,
    and their descendants (a task's own command names neither)."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in mine:
            continue
        try:
            hit = any(str(home) in arg for arg in proc.info["cmdline"] or [])
            hit = hit or proc.environ().get("TRAINYARD_HOME") == str(home)
            if hit:
                found[proc.pid] = proc
                found.update((c.pid, c) for c in proc.children(recursive=True))
        except (psutil.Error, OSError):
            continue
    return list(found.values())


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process ended; the ones still alive after ``timeout_s``."""
    _gone, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def kill_described(procs: list[psutil.Process]) -> list[str]:
    """Kill ``procs`` (leftovers ``wait_gone`` found), each described first: pid, parent,
    user and command line (a killed one turns zombie, whose command line psutil refuses)."""
    described = []
    for proc in procs:
        try:
            with proc.oneshot():
                described.append(
                    f"{proc.pid} (parent {proc.ppid()}, {proc.username()}): "
                    f"{' '.join(proc.cmdline())}"
                )
            proc.kill()
        except psutil.Error as exc:
            described.append(f"{proc.pid}: {exc}")
    return described


@dataclass
class Server:
    """The session's server, seen from the CLI: its home, URL and admin token."""

    home: Path

    @property
    def url(self) -> str:
        return json.loads((self.home / "server.json").read_text())["url"]

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def cli(self, *args: str, timeout_s: float = 300, **env: str) -> Result:
        """The CLI as a real process."""
        return run_cli(self.home, *args, timeout_s=timeout_s, **env)

    def main(self, *args: str) -> Result:
        """The CLI in-process, with this server's TRAINYARD_HOME (other session fixtures,
        such as the Slurm tests' runner home, may have pointed the variable elsewhere)."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRAINYARD_HOME", str(self.home))
            patch.delenv("TRAINYARD_SERVER_URL", raising=False)
            patch.delenv("TRAINYARD_TOKEN", raising=False)
            return run_main(*args)

    def submit(self, spec: Path | str, *args: str) -> str:
        """Submit without waiting; the workflow id."""
        return self.main("workflow", "submit", str(spec), *args, "-t", "json").json()["id"]

    def query(self, workflow_id: str, *, verbose: bool = False) -> dict[str, Any]:
        extra = ("--verbose",) if verbose else ()
        return self.main("workflow", "query", workflow_id, *extra, "-t", "json").json()

    def ids(self) -> set[str]:
        return {w["id"] for w in self.main("workflow", "list", "-a", "-t", "json").json()}

    def logs(self, workflow_id: str, *args: str) -> str:
        got = self.main("workflow", "logs", workflow_id, *args)
        assert got.code == 0, got.err
        return got.out

    def wait(
        self, workflow_id: str, *, timeout_s: float = 240, until: tuple[str, ...] = TERMINAL
    ) -> dict[str, Any]:
        """Poll ``workflow query ID -t json`` until its status starts with one of ``until``."""
        return wait_for_status(
            lambda: self.query(workflow_id), workflow_id, timeout_s=timeout_s, until=until
        )

    def wait_task(self, workflow_id: str, task: str, status: str, timeout_s: float = 60) -> None:
        """Poll until ``task`` of the workflow has ``status``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            tasks = {t["name"]: t for g in self.query(workflow_id)["groups"] for t in g["tasks"]}
            if tasks[task]["status"] == status:
                return
            time.sleep(0.3)
        raise AssertionError(f"{workflow_id}/{task} never {status}: {tasks[task]}")


# ---------------------------------------------------------------------------- OSMO rows


@dataclass(frozen=True)
class Row:
    """One "Must reach the outcome" row, run by ``submit --wait``. ``{storage}`` in an
    argument stands for the session's data_filter folder; ``{id}`` in a log line for the id."""

    spec: str
    args: tuple[str, ...] = ()
    outcome: str = "COMPLETED"
    logs: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.spec}[{' '.join(self.args)}]" if self.args else self.spec


def data_filter_dir(home: Path) -> Path:
    """``storage_url`` of tutorials/data_filter.yaml, with .txt, .json and .bin files, below
    the home's storage folder (the local pool's default data root)."""
    root = home / "storage" / "data-filter"
    source = root / "source-data"
    source.mkdir(parents=True, exist_ok=True)
    for name, text in (("keep.txt", "text\n"), ("skip.json", "{}\n"), ("skip.bin", "bin\n")):
        (source / name).write_text(text)
    return root


BACKGROUND_ROWS = [
    # the ~2-minute rows first, so they start first
    Row("tutorials/combination_workflow_complex.yaml"),
    Row("tests/exec_timeout.yaml", outcome="FAILED_EXEC_TIMEOUT"),
    Row("tests/group_actions.yaml", ("ignore_nonlead_status=true",)),
    Row("tests/group_actions.yaml", ("ignore_nonlead_status=false",), outcome="FAILED"),
    Row(
        "tutorials/token_example.yaml",
        logs=("Running experiment: my-experiment", "Workflow ID: {id}"),
    ),
    Row("tutorials/parallel_tasks.yaml"),
    Row(
        "tutorials/serial_workflow.yaml",
        logs=("a line: Data from task 1", "a line: Data from task 2"),
    ),
    Row("tutorials/group_tasks.yaml"),
    # The client calls `nc` once, with no retry, as the server starts listening: the spec
    # races (in OSMO too), so only the resolved address is checked here; the connection over
    # {{host:server}} is checked by tests/parallel_workflow_v2.yaml, whose client retries.
    Row("tutorials/group_tasks_communication.yaml", logs=("[client] Calling server at 127.",)),
    Row("tutorials/combination_workflow_simple.yaml"),
    Row("tutorials/resources_basic.yaml"),
    Row("tutorials/data_filter.yaml", ("storage_url={storage}",), logs=("keep.txt",)),
    Row("tests/serial_workflow.yaml", logs=("Data from task 1", "a line: Data from task 2")),
    Row("tests/parallel_workflow_v2.yaml", logs=("[client] hello",)),
    Row("tests/parallel_workflow_leader_exits.yaml", outcome="FAILED"),
    Row("tests/exit_actions.yaml", logs=("exit code 15",)),
    Row(
        "scenarios/workflow_labels.yaml",
        ("exit_code=0", "team_yaml=research"),
        logs=("workflow-labels scenario task",),
    ),
    Row("scenarios/workflow_labels.yaml", ("exit_code=1",), outcome="FAILED"),
]
"""Rows waited on together; the quick ``--wait`` rows are tests of test_osmo_outcomes.py."""


class WaitingSubmit:
    """``trainyard workflow submit SPEC [--set ...] --wait -t json`` running as a real
    process: it exits 0 only when the workflow COMPLETED, and its stdout is one JSON document,
    the final ``workflow query`` object (progress goes to stderr)."""

    def __init__(self, server: Server, row: Row) -> None:
        storage = data_filter_dir(server.home).as_uri()
        args = [a.format(storage=storage) for a in row.args]
        argv = [
            str(TRAINYARD),
            "workflow",
            "submit",
            str(SPECS / row.spec),
            *(["--set", *args] if args else []),
            "--wait",
            "-t",
            "json",
        ]
        self.proc = subprocess.Popen(
            argv,
            env=cli_env(server.home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._done: tuple[int, dict[str, Any], str] | None = None

    def result(self, timeout_s: float = 300) -> tuple[int, dict[str, Any], str]:
        """(exit code, final workflow object, stderr), once the process has ended."""
        if self._done is None:
            out, err = self.proc.communicate(timeout=timeout_s)
            try:
                final = json.loads(out)
            except json.JSONDecodeError as exc:
                raise AssertionError(
                    f"exit {self.proc.returncode}; stdout is not one JSON "
                    f"document ({exc}): {out!r} {err}"
                ) from None
            self._done = (self.proc.returncode, final, err)
        return self._done

    def workflow_id(self) -> str:
        return self.result()[1]["id"]


def submit_row(server: Server, row: Row) -> WaitingSubmit:
    """Start ``row`` as ``trainyard workflow submit ... --wait -t json`` (not waited on)."""
    return WaitingSubmit(server, row)
