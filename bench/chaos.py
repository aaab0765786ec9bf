"""Fault injection (issue 12): workflows through the real CLI and server on the real local
backend while the server, the backend's launcher, task runners and task commands are killed
(SIGKILL) at random moments; then what the promise "kill anything, lose nothing" says.

What it submits (``--workflows N``, a seeded mix, commands of 1-10 s):

- ``gang``: one group of 2-4 tasks, a lead and workers that all use ``{{host:lead}}``,
  ``ignoreNonleadStatus`` true or false at random;
- ``dag``: 2-3 groups in a chain, each task reads its upstream task's output
  (``inputs: [{task: ...}]``) and checks it; the last one's output goes to a dataset;
- ``reschedule``: one task with ``exitActions: {RESCHEDULE: 42}`` and a checkpoint of
  ``/tmp/ckpt`` under the home's storage: attempt 0 saves a marker and exits 42, attempt 1
  must find the marker in its ``url`` input (else it exits 3) and writes an output URL.

Every task command first writes one file ``start.<ns>`` under ``{{output}}/chaos/``: a
start marker the harness reads from the attempt's run folder afterwards (``{{output}}`` is
writable whether or not the sandbox shows host folders such as the home); the runner's
RUNNING events in the run folder count as starts too (a second runner of one attempt may
die before its command writes a marker).

Kills (``--kills K`` moments, seeded, over the submissions and a little after; kind chosen
at random; a kind with no target at that moment falls back to another): ``server`` (SIGKILL
the pid of ``server.json``, then ``trainyard server start`` 0.5-3 s later, as a user would;
half the time a command or runner is killed while it is down, counted as a kill of its own),
``launcher`` (the process that answers the launcher protocol's ``ping`` on the abstract
socket ``trainyard-launcher-<hash of <home>/local>-...`` named in its command line; the
runners it hosts as threads die with it), ``runner`` (a forked runner: the
pid of a run folder's ``launch.json`` without ``hosted_by``, its create time checked),
``command`` (the outermost ``bwrap`` of an attempt's sandbox).

What is expected (``expected_statuses``, pure): a kill *hits* an attempt when it ended it
before the attempt reported its exit (no ``EXITED`` in ``events.jsonl`` at the kill): a
killed runner or launcher-hosted runner is exit 3001 (FAILED_BACKEND_ERROR), a killed
command 137, neither covered by an exit action, so a FAIL. A hit fails the workflow when
it hits the lead, or any task of a group with ``ignoreNonleadStatus: false``, before the
lead exited; within ``AMBIGUOUS_S`` of the lead's exit either outcome is accepted. A server
kill changes no outcome.

Report: lost workflows (submitted, never ended or gone), tasks run twice (two starts of one
attempt, or a retry that no exit action asked for), wrong final statuses, missing
outputs of COMPLETED workflows, and after ``trainyard server stop``: leaked processes (any
process whose command line names the home or its launcher, or whose environment has the
home or a workflow id of the run; killed once counted), network namespaces (held by
those, new in ``/run/netns``, or nsfs mounts under the home) and mounts under the home.
Exit status 1 when any count is non-zero, 2 on a usage error.

Usage:
    .venv/bin/python bench/chaos.py [--workflows 20] [--kills 5] [--seed 1] [--json PATH]
                                    [--kinds server,launcher,runner,command]
                                    [--timeout-s 600] [--keep-home]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "TaskPlan",
    "GroupPlan",
    "WorkflowPlan",
    "Hit",
    "Report",
    "make_plans",
    "render_spec",
    "classify_hit",
    "expected_statuses",
    "extra_starts",
    "build_report",
    "format_table",
    "find_leaks",
    "main",
]

RESCHEDULE_CODE = 42
RESUME_FAILED_CODE = 3
SUBMIT_ESTIMATE_S = 1.0  # one CLI submit on the loaded 2-core VM: kills spread over them
AMBIGUOUS_S = 3.0  # a hit this close to the lead's exit may go either way (engine poll order)
KILL_KINDS = ("server", "launcher", "runner", "command")
KILL_WEIGHTS = (2, 2, 3, 3)
COUNTS = (
    "lost_workflows",
    "tasks_run_twice",
    "wrong_statuses",
    "missing_outputs",
    "leaked_processes",
    "leaked_namespaces",
    "leaked_mounts",
)


# ---------------------------------------------------------------------- plans (pure)


@dataclass(frozen=True)
class TaskPlan:
    """One task: its name, whether it leads its group, how long it sleeps."""

    name: str
    lead: bool
    sleep_s: int
    reschedule: bool = False


@dataclass(frozen=True)
class GroupPlan:
    """One group (a gang) of the plan, in DAG order (each group feeds the next in a dag)."""

    name: str
    tasks: tuple[TaskPlan, ...]
    ignore_nonlead: bool = True


@dataclass(frozen=True)
class WorkflowPlan:
    """One workflow the harness submits: its kind (gang, dag, reschedule) and groups."""

    index: int
    kind: str
    groups: tuple[GroupPlan, ...]

    @property
    def name(self) -> str:
        return f"chaos-{self.kind}-{self.index}"

    def task(self, name: str) -> tuple[GroupPlan, TaskPlan]:
        """The group and task named ``name``. Raises KeyError when there is none."""
        for group in self.groups:
            for task in group.tasks:
                if task.name == name:
                    return group, task
        raise KeyError(name)


def make_plans(count: int, rng: random.Random) -> list[WorkflowPlan]:
    """``count`` workflows, kinds in turn (gang, dag, reschedule), sizes and sleeps from ``rng``."""
    makers = (_gang_plan, _dag_plan, _reschedule_plan)
    return [makers[i % 3](i, rng) for i in range(count)]


def _gang_plan(index: int, rng: random.Random) -> WorkflowPlan:
    size = rng.randint(2, 4)
    tasks = tuple(
        TaskPlan("lead" if i == 0 else f"worker{i}", i == 0, rng.randint(1, 10))
        for i in range(size)
    )
    return WorkflowPlan(index, "gang", (GroupPlan("gang", tasks, rng.random() < 0.5),))


def _dag_plan(index: int, rng: random.Random) -> WorkflowPlan:
    groups = tuple(
        GroupPlan(f"step{i}", (TaskPlan(f"t{i}", True, rng.randint(1, 5)),))
        for i in range(rng.randint(2, 3))
    )
    return WorkflowPlan(index, "dag", groups)


def _reschedule_plan(index: int, rng: random.Random) -> WorkflowPlan:
    task = TaskPlan("trainer", True, rng.randint(1, 5), reschedule=True)
    return WorkflowPlan(index, "reschedule", (GroupPlan("train", (task,)),))


# ---------------------------------------------------------------------- specs


_MARK = (
    'mkdir -p {{output}}/chaos && echo "$TRAINYARD_RETRY_ID %s" '
    '> {{output}}/chaos/start.$(date +%%s%%N); '
)


def render_spec(plan: WorkflowPlan, storage_url: str) -> str:
    """The OSMO spec text of ``plan`` (JSON is YAML); ``storage_url`` is a ``file://`` folder
    for checkpoints and output URLs."""
    groups = [_group_spec(plan, i, storage_url) for i in range(len(plan.groups))]
    return json.dumps({"workflow": {"name": plan.name, "groups": groups}}, indent=1)


def _group_spec(plan: WorkflowPlan, index: int, storage_url: str) -> dict[str, Any]:
    group = plan.groups[index]
    tasks = [_task_spec(plan, index, task, storage_url) for task in group.tasks]
    return {"name": group.name, "ignoreNonleadStatus": group.ignore_nonlead, "tasks": tasks}


def _task_spec(plan: WorkflowPlan, index: int, task: TaskPlan, storage_url: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": task.name, "lead": task.lead, "command": ["sh", "-c"]}
    if plan.kind == "gang":
        spec["args"] = [_MARK % "{{host:lead}}" + f"sleep {task.sleep_s}"]
    elif plan.kind == "dag":
        spec.update(_dag_task(plan, index, task))
    else:
        spec.update(_reschedule_task(task, storage_url))
    return spec


def _dag_task(plan: WorkflowPlan, index: int, task: TaskPlan) -> dict[str, Any]:
    check = ""
    spec: dict[str, Any] = {}
    if index > 0:
        upstream = plan.groups[index - 1].tasks[0].name
        spec["inputs"] = [{"task": upstream}]
        check = f'grep -qx "from {upstream}" {{{{input:0}}}}/data.txt || exit 4; '
    if index == len(plan.groups) - 1:
        spec["outputs"] = [{"dataset": {"name": plan.name}}]
    spec["args"] = [
        _MARK % "dag" + check + f"sleep {task.sleep_s}; "
        f'echo "from {task.name}" > {{{{output}}}}/data.txt'
    ]
    return spec


def _reschedule_task(task: TaskPlan, storage_url: str) -> dict[str, Any]:
    base = f"{storage_url}/{{{{workflow_id}}}}"
    script = (
        _MARK % "reschedule" + "mkdir -p /tmp/ckpt; "
        'if [ -f {{input:0}}/marker ]; then '
        f'  sleep {task.sleep_s}; echo resumed > {{{{output}}}}/result; exit 0; fi; '
        f'[ "$TRAINYARD_RETRY_ID" = 0 ] || exit {RESUME_FAILED_CODE}; '
        f"sleep {task.sleep_s}; echo saved > /tmp/ckpt/marker; exit {RESCHEDULE_CODE}"
    )
    return {
        "args": [script],
        "exitActions": {"RESCHEDULE": RESCHEDULE_CODE},
        "checkpoint": [{"path": "/tmp/ckpt", "url": f"{base}/ckpt", "frequency": 1}],
        "inputs": [{"url": f"{base}/ckpt"}],
        "outputs": [{"url": f"{base}/out"}],
    }


# ---------------------------------------------------------------------- expectations (pure)


@dataclass(frozen=True)
class Hit:
    """A kill that ended an attempt before it reported its exit.

    ``lead_exit_s``: when the lead of the task's group reported its exit (the lead's own
    attempt current at the kill), None when it never did (killed, or it is the lead).
    """

    workflow_id: str
    task: str
    retry_id: int
    kind: str
    time_s: float
    lead_exit_s: float | None = None


def classify_hit(plan: WorkflowPlan, hit: Hit, ambiguous_s: float = AMBIGUOUS_S) -> str:
    """``"decisive"`` (the workflow must fail), ``"ambiguous"`` (it may or may not) or
    ``"moot"`` (no effect on the status).

    Rules (OSMO "Lead task", "ignoreNonleadStatus", "Exit actions"): a hit is an exit code
    that no exit action covers (3001 or 137), so a FAIL; it ends the group when it hits the
    lead, or a non-lead of a group with ``ignoreNonleadStatus: false`` while the lead still
    runs; after the lead exited the group is over and the hit is moot.
    """
    group, task = plan.task(hit.task)
    if task.lead:
        return "decisive"
    if group.ignore_nonlead:
        return "moot"
    if hit.lead_exit_s is None or hit.lead_exit_s > hit.time_s + ambiguous_s:
        return "decisive"
    if hit.lead_exit_s < hit.time_s - ambiguous_s:
        return "moot"
    return "ambiguous"


def expected_statuses(
    plan: WorkflowPlan, hits: Iterable[Hit], ambiguous_s: float = AMBIGUOUS_S
) -> frozenset[str]:
    """The final workflow statuses allowed for ``plan`` after ``hits`` (its own only).

    Every task of these plans completes when nothing hits it (the reschedule task after
    one RESCHEDULE), so the answer is {COMPLETED}, {FAILED} when a decisive hit happened,
    or both when only ambiguous ones did. A server kill is never a hit.
    """
    kinds = {classify_hit(plan, h, ambiguous_s) for h in hits}
    if "decisive" in kinds:
        return frozenset({"FAILED"})
    if "ambiguous" in kinds:
        return frozenset({"COMPLETED", "FAILED"})
    return frozenset({"COMPLETED"})


def extra_starts(plan: WorkflowPlan, starts: Mapping[tuple[str, int], int]) -> list[str]:
    """The attempts of ``plan`` that started more often than allowed: ``starts`` maps
    (task, retry id) to how many start markers it left. One start per attempt; a retry id
    above 0 only for a RESCHEDULE task, and only 1 (its one rescheduling exit)."""
    found = []
    for (task_name, retry_id), count in sorted(starts.items()):
        _, task = plan.task(task_name)
        allowed_retry = 1 if task.reschedule else 0
        if count > 1:
            found.append(f"{task_name} retry {retry_id} started {count} times")
        if retry_id > allowed_retry:
            found.append(f"{task_name} retry {retry_id} started with no exit action asking")
    return found


@dataclass
class Report:
    """Counts and their details. ``counts`` keys: ``COUNTS``; every one should be 0."""

    workflows: int
    kills: dict[str, int]
    counts: dict[str, int]
    details: dict[str, list[str]]
    statuses: dict[str, int]
    wall_s: float
    home: str = ""
    seed: int | None = None
    kinds: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(self.counts.values())


def build_report(
    plans: Mapping[str, WorkflowPlan],
    final: Mapping[str, str | None],
    hits: Sequence[Hit],
    starts: Mapping[str, Mapping[tuple[str, int], int]],
    missing_outputs: Sequence[str],
    leaks: Mapping[str, list[str]],
    kills: Mapping[str, int],
    wall_s: float,
) -> Report:
    """Compare what happened with what was expected.

    Args:
        plans: workflow id -> its plan (only workflows whose submission printed an id).
        final: workflow id -> its status at the end (None: not found any more).
        hits: every hit of the run.
        starts: workflow id -> (task, retry id) -> start markers found.
        missing_outputs: one line per output a COMPLETED workflow should have left.
        leaks: ``processes``, ``namespaces``, ``mounts`` -> one line per leak.
        kills: kill kind -> how many were done.
        wall_s: how long the run took.
    """
    details: dict[str, list[str]] = {name: [] for name in COUNTS}
    statuses: dict[str, int] = {}
    for wf_id, plan in sorted(plans.items()):
        status = final.get(wf_id)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status is None or status in ("PENDING", "WAITING", "RUNNING"):
            details["lost_workflows"].append(f"{wf_id}: {status or 'gone'}")
            continue
        allowed = expected_statuses(plan, [h for h in hits if h.workflow_id == wf_id])
        if status not in allowed:
            why = (
                ", ".join(
                    f"{h.kind} killed {h.task} retry {h.retry_id}"
                    for h in hits
                    if h.workflow_id == wf_id
                )
                or "no hit"
            )
            details["wrong_statuses"].append(
                f"{wf_id}: {status}, expected {'/'.join(sorted(allowed))} ({why})"
            )
    for wf_id, plan in sorted(plans.items()):
        details["tasks_run_twice"] += [
            f"{wf_id}: {line}" for line in extra_starts(plan, starts.get(wf_id, {}))
        ]
    details["missing_outputs"] = list(missing_outputs)
    for kind in ("processes", "namespaces", "mounts"):
        details[f"leaked_{kind}"] = list(leaks.get(kind, []))
    counts = {name: len(details[name]) for name in COUNTS}
    return Report(len(plans), dict(kills), counts, details, statuses, wall_s)


def format_table(report: Report) -> str:
    """The report for people: one row per count, then the details of non-zero ones."""
    lines = [
        f"chaos: {report.workflows} workflows, kills "
        + ", ".join(f"{k} {v}" for k, v in report.kills.items())
        + f", {report.wall_s:.0f} s",
        "final statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(report.statuses.items())),
        "",
        f"{'check':<20} {'count':>5}",
        f"{'-' * 20} {'-' * 5}",
    ]
    lines += [f"{name:<20} {report.counts[name]:>5}" for name in COUNTS]
    for name in COUNTS:
        for detail in report.details[name][:20]:
            lines.append(f"  {name}: {detail}")
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the real run


class Cli:
    """Runs ``trainyard`` (this interpreter's) against one home."""

    def __init__(self, home: Path) -> None:
        self.home = home
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
        }
        env.update(TRAINYARD_HOME=str(home), COLUMNS="200")
        self.env = env

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        script = Path(sys.executable).parent / "trainyard"
        prefix = [str(script)] if script.exists() else [sys.executable, "-m", "trainyard.cli.main"]
        argv = [*prefix, *args]
        try:
            return subprocess.run(
                argv, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(
                argv, 124, str(exc.stdout or ""), f"timed out after {timeout_s} s"
            )


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return _rows(run_dir / "events.jsonl")


def _rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a runner's events), [] when it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def _exit_time(run_dir: Path) -> float | None:
    for row in _events(run_dir):
        if row.get("kind") == "EXITED":
            return float(row["time_s"])
    return None


def _ping(name: str) -> int | None:
    """The pid of the launcher that answers on abstract socket ``name`` (its protocol:
    ``{"op": "ping"}`` -> ``{"pid": int}``), None when none answers."""
    with (
        contextlib.suppress(OSError, ValueError, KeyError),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
    ):
        sock.settimeout(5.0)
        sock.connect("\0" + name)
        sock.sendall(b'{"op": "ping"}\n')
        return int(json.loads(sock.recv(4096))["pid"])
    return None


def _attempt_of(run_dir: Path) -> tuple[str, str, int]:
    return run_dir.parent.parent.name, run_dir.parent.name, int(run_dir.name)


class Chaos:
    """One run: a fresh home, the submissions, the killer thread, the checks."""

    def __init__(self, home: Path, rng: random.Random, kinds: Sequence[str] = KILL_KINDS) -> None:
        self.home = home
        self.kinds = tuple(kinds)
        self.cli = Cli(home)
        self.rng = rng
        self.storage_dir = home / "storage" / "chaos"  # under the pool's data roots
        self.storage_url = self.storage_dir.as_uri()
        self.plans: dict[str, WorkflowPlan] = {}
        self.hits: list[Hit] = []
        self.kills: dict[str, int] = {k: 0 for k in (*KILL_KINDS, "no_target")}
        self.notes: list[str] = []
        self.lock = threading.Lock()
        self.log: list[str] = []
        self.started_s = time.time()
        folder = hashlib.sha256(os.path.realpath(home / "local").encode()).hexdigest()[:16]
        self.launcher_prefix = f"trainyard-launcher-{folder}-"

    # -------------------------------------------------------------- submissions

    def submit(self, plan: WorkflowPlan, spec_dir: Path) -> None:
        path = spec_dir / f"{plan.name}.yaml"
        path.write_text(render_spec(plan, self.storage_url))
        done = self.cli.run("workflow", "submit", str(path))
        marker = "Workflow submitted: "
        if done.returncode != 0 or marker not in done.stdout:
            self.notes.append(
                f"submit of {plan.name} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-200:]}"
            )
            return
        wf_id = done.stdout.split(marker)[1].split()[0]
        with self.lock:
            self.plans[wf_id] = plan

    # -------------------------------------------------------------- targets

    def run_dirs(self) -> list[Path]:
        """Every attempt's run folder in the home (``runs/WF/TASK/RETRY``), also of a
        workflow whose ``submit`` has not printed its id yet: it may run already."""
        return [p for p in (self.home / "runs").glob("*/*/*") if p.name.isdigit()]

    def _live_runner(self, run_dir: Path) -> psutil.Process | None:
        try:
            launch = json.loads((run_dir / "launch.json").read_text())
        except (OSError, ValueError):
            return None
        if launch.get("hosted_by") or (run_dir / "runner.ended").exists():
            return None
        with contextlib.suppress(psutil.Error, KeyError, TypeError):
            proc = psutil.Process(int(launch["pid"]))
            if abs(proc.create_time() - float(launch["created"])) < 0.05:
                return proc
        return None

    def _hosted(self, run_dir: Path) -> bool:
        """Whether a live launcher hosts the attempt's runner now (its pid and create time
        in ``launch.json`` still match, and the thread has not ended)."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, psutil.Error):
            launch = json.loads((run_dir / "launch.json").read_text())
            if not launch.get("hosted_by") or (run_dir / "runner.ended").exists():
                return False
            proc = psutil.Process(int(launch["pid"]))
            return abs(proc.create_time() - float(launch["created"])) < 0.05
        return False

    def _sandboxes(self) -> list[tuple[psutil.Process, Path]]:
        """Outermost bwrap of each attempt: (process, run folder)."""
        runs = str(self.home / "runs") + "/"
        found = []
        for proc in psutil.process_iter(["name", "cmdline", "ppid"]):
            cmd = proc.info["cmdline"] or []
            if proc.info["name"] != "bwrap" or len(cmd) < 3 or not cmd[2].startswith(runs):
                continue
            with contextlib.suppress(psutil.Error):
                if psutil.Process(proc.info["ppid"]).name() == "bwrap":
                    continue
                found.append((proc, Path(cmd[2]).parent.parent))
        return found

    def launchers(self) -> list[psutil.Process]:
        """The live launchers of this home's backend folder: the processes that answer a
        ``ping`` on the abstract socket named in their command line (a forked runner or a
        spare has the same command line, but does not answer)."""
        names = set()
        for proc in psutil.process_iter(["cmdline"]):
            names |= {
                part for part in proc.info["cmdline"] or [] if part.startswith(self.launcher_prefix)
            }
        found = []
        for name in sorted(names):
            pid = _ping(name)
            with contextlib.suppress(psutil.Error):
                if pid is not None:
                    found.append(psutil.Process(pid))
        return found

    # -------------------------------------------------------------- kills

    def kill_one(self) -> None:
        kinds = [k for k in KILL_KINDS if k in self.kinds]
        weights = [w for k, w in zip(KILL_KINDS, KILL_WEIGHTS, strict=False) if k in self.kinds]
        first = self.rng.choices(kinds, weights)[0]
        order = [first] + self.rng.sample([k for k in kinds if k != first], len(kinds) - 1)
        for kind in order:
            at_s = time.time() - self.started_s
            what = getattr(self, f"_kill_{kind}")()
            if what:
                self.kills[kind] += 1
                self.log.append(f"{at_s:.1f} s: {kind} {what}")
                return
        self.kills["no_target"] += 1

    def _kill_server(self) -> str | None:
        try:
            info = json.loads((self.home / "server.json").read_text())
            proc = psutil.Process(int(info["pid"]))
            if abs(proc.create_time() - float(info["create_time_s"])) > 0.05:
                return None  # server.json of a dead server (its pid reused)
        except (OSError, ValueError, KeyError, psutil.Error):
            return None
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
            time.sleep(self.rng.uniform(0.3, 1.5))
            also = self._kill_while_down()
            time.sleep(self.rng.uniform(0.2, 1.5))
            done = self.cli.run("server", "start", timeout_s=60)
            if done.returncode != 0:
                self.notes.append(
                    f"server start after a kill: exit {done.returncode}: "
                    f"{(done.stderr or done.stdout).strip()[-200:]}"
                )
            return f"pid {proc.pid}{also}, restarted: exit {done.returncode}"
        return None

    def _kill_while_down(self) -> str:
        """Half the time, a command or runner killed while no server runs (what the engine
        must read from the run folder after its restart: issue 12's H2)."""
        kinds = [k for k in ("command", "runner") if k in self.kinds]
        if not kinds or self.rng.random() < 0.5:
            return ""
        kind = self.rng.choice(kinds)
        what = getattr(self, f"_kill_{kind}")()
        if not what:
            return ""
        self.kills[kind] += 1
        return f" + while down: {kind} {what}"

    def _kill_launcher(self) -> str | None:
        mains = self.launchers()
        if not mains:
            return None
        hosted = [d for d in self.run_dirs() if self._hosted(d)]
        before = {d: _exit_time(d) for d in hosted}
        now = time.time()
        for proc in mains:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        hit = [d for d in hosted if before[d] is None]
        for run_dir in hit:
            self._hit(run_dir, "launcher", now)
        return f"pid {' '.join(str(p.pid) for p in mains)}, hit {len(hit)} hosted runner(s)"

    def _kill_runner(self) -> str | None:
        live = [(d, p) for d in self.run_dirs() if (p := self._live_runner(d)) is not None]
        if not live:
            return None
        run_dir, proc = self.rng.choice(live)
        now = time.time()
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            return None
        time.sleep(0.2)
        hit = _exit_time(run_dir) is None  # it had not reported its exit: a hit
        if hit:
            self._hit(run_dir, "runner", now)
        return f"pid {proc.pid} of {'/'.join(map(str, _attempt_of(run_dir)))}, hit {hit}"

    def _kill_command(self) -> str | None:
        live = self._sandboxes()
        if not live:
            return None
        proc, run_dir = self.rng.choice(live)
        reported = _exit_time(run_dir) is not None
        now = time.time()
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            return None
        if not reported:
            self._hit(run_dir, "command", now)
        return f"bwrap pid {proc.pid} of {'/'.join(map(str, _attempt_of(run_dir)))}, hit {not reported}"

    def _hit(self, run_dir: Path, kind: str, now: float) -> None:
        wf_id, task, retry_id = _attempt_of(run_dir)
        with self.lock:
            self.hits.append(Hit(wf_id, task, retry_id, kind, now))

    def finish_hits(self) -> None:
        """Fill in each hit's ``lead_exit_s`` from the lead's attempt current at the kill."""
        for i, hit in enumerate(self.hits):
            plan = self.plans.get(hit.workflow_id)
            if plan is None:  # its submission printed no id: not judged
                continue
            group, task = plan.task(hit.task)
            if task.lead:
                continue
            lead = next(t for t in group.tasks if t.lead)
            runs = self.home / "runs" / hit.workflow_id / lead.name
            exits = [t for d in runs.glob("*") if (t := _exit_time(d)) is not None]
            self.hits[i] = Hit(**{**asdict(hit), "lead_exit_s": min(exits, default=None)})

    # -------------------------------------------------------------- the end

    def wait_all(self, deadline: float) -> dict[str, str | None]:
        """Each submitted workflow's status once all ended (or at ``deadline``); a workflow
        of this run the server lists but whose submission printed no id is noted (a
        submission cut by a server kill that was stored anyway)."""
        statuses: dict[str, str | None] = {wf_id: None for wf_id in self.plans}
        while time.monotonic() < deadline:
            done = self.cli.run("workflow", "list", "-t", "json", "--count", "100000")
            if done.returncode == 0:
                rows = {r["id"]: r["status"] for r in json.loads(done.stdout)}
                statuses = {wf_id: rows.get(wf_id) for wf_id in self.plans}
                ghosts = sorted(set(rows) - set(self.plans))
                if all(s not in (None, "PENDING", "WAITING", "RUNNING") for s in statuses.values()):
                    self.notes += [
                        f"listed but its submit printed no id: {g} ({rows[g]})" for g in ghosts
                    ]
                    return statuses
            time.sleep(3)
        return statuses

    def starts(self) -> dict[str, dict[tuple[str, int], int]]:
        """workflow id -> (task, retry id) -> how many times the attempt started: the
        larger of its command's start markers and its runner's RUNNING events (over every
        ``events*.jsonl``: the backend renames the old one when a run folder is used again;
        a second runner may fail or be stopped before its command writes a marker)."""
        found: dict[str, dict[tuple[str, int], int]] = {wf_id: {} for wf_id in self.plans}
        for run_dir in self.run_dirs():
            wf_id, task, retry_id = _attempt_of(run_dir)
            if wf_id not in found:
                continue
            markers = len(list((run_dir / "output" / "chaos").glob("start.*")))
            running = sum(
                1
                for events in run_dir.glob("events*.jsonl")
                for row in _rows(events)
                if row.get("kind") == "RUNNING"
            )
            if max(markers, running):
                found[wf_id][(task, retry_id)] = max(markers, running)
        return found

    def missing_outputs(self, final: Mapping[str, str | None]) -> list[str]:
        missing = []
        for wf_id, plan in self.plans.items():
            if final.get(wf_id) != "COMPLETED":
                continue
            if plan.kind == "dag" and not (self.home / "datasets" / plan.name).is_dir():
                missing.append(f"{wf_id}: dataset {plan.name}")
            if plan.kind == "reschedule" and not any(
                (self.storage_dir / wf_id / "out").rglob("result")
            ):
                missing.append(f"{wf_id}: {self.storage_url}/{wf_id}/out/result")
        return missing


# ---------------------------------------------------------------------- leaks


def _net_ns(pid: int | str) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/ns/net")
    return None


def home_processes(
    home: Path, launcher_prefix: str, workflow_ids: Iterable[str] = ()
) -> list[psutil.Process]:
    """Every process whose command line names ``home`` or its launcher, or whose
    environment has ``TRAINYARD_HOME=home`` (the server and what it started) or
    ``TRAINYARD_WORKFLOW_ID`` of one of ``workflow_ids`` (what a task left running)."""
    found = []
    me = os.getpid()
    ids = set(workflow_ids)
    for proc in psutil.process_iter(["cmdline", "pid"]):
        if proc.info["pid"] == me:
            continue
        cmd = " ".join(proc.info["cmdline"] or [])
        hit = str(home) in cmd or launcher_prefix in cmd
        if not hit:
            with contextlib.suppress(psutil.Error):
                env = proc.environ()
                hit = (
                    env.get("TRAINYARD_HOME") == str(home)
                    or env.get("TRAINYARD_WORKFLOW_ID", "") in ids
                )
        if hit:
            found.append(proc)
    return found


def find_leaks(
    home: Path, launcher_prefix: str, netns_before: set[str], workflow_ids: Iterable[str] = ()
) -> dict[str, list[str]]:
    """Processes, network namespaces and mounts of ``home`` left after the server stopped."""
    procs = home_processes(home, launcher_prefix, workflow_ids)
    host_ns = _net_ns("self")
    processes, namespaces = [], set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            processes.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}")
            ns = _net_ns(proc.pid)
            if ns and ns != host_ns:
                namespaces.add(f"{ns} (pid {proc.pid})")
            namespaces |= {f"{link} (fd of pid {proc.pid})" for link in _ns_fds(proc.pid)}
    namespaces |= {f"/run/netns/{n}" for n in _run_netns() - netns_before}
    mounts = [line for line in _mounts() if line.split()[1].startswith(str(home))]
    namespaces |= {f"nsfs mount {line.split()[1]}" for line in mounts if line.split()[2] == "nsfs"}
    return {"processes": processes, "namespaces": sorted(namespaces), "mounts": mounts}


def _ns_fds(pid: int) -> set[str]:
    links = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("net:["):
                    links.add(link)
    return links


def _run_netns() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir("/run/netns"))
    return set()


def _mounts() -> list[str]:
    with contextlib.suppress(OSError):
        return Path("/proc/mounts").read_text().splitlines()
    return []


def wait_no_leaks(
    home: Path,
    prefix: str,
    netns_before: set[str],
    timeout_s: float,
    workflow_ids: Iterable[str] = (),
) -> dict[str, list[str]]:
    """``find_leaks`` until it finds none or ``timeout_s`` passed (things take a moment to
    exit after ``server stop``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        leaks = find_leaks(home, prefix, netns_before, workflow_ids)
        if not any(leaks.values()) or time.monotonic() > deadline:
            return leaks
        time.sleep(1)


# ---------------------------------------------------------------------- main


def run(
    workflows: int,
    kills: int,
    seed: int,
    timeout_s: float,
    home: Path,
    kinds: Sequence[str] = KILL_KINDS,
) -> Report:
    """Submit ``workflows``, do ``kills`` kills of ``kinds`` meanwhile, wait, stop the
    server, check."""
    rng = random.Random(seed)
    plans = make_plans(workflows, rng)
    chaos = Chaos(home, random.Random(seed + 1), kinds)
    netns_before = _run_netns()
    spec_dir = home / "chaos-specs"
    spec_dir.mkdir(parents=True)
    started = time.monotonic()
    active_s = max(20.0, workflows * SUBMIT_ESTIMATE_S) + 10.0  # submissions and after
    moments = sorted(rng.uniform(2.0, active_s) for _ in range(kills))
    killer = threading.Thread(target=_killer, args=(chaos, moments, started), daemon=True)
    killer.start()
    for plan in plans:
        chaos.submit(plan, spec_dir)
        time.sleep(rng.uniform(0.0, 0.5))
    killer.join()
    final = chaos.wait_all(started + timeout_s)
    chaos.finish_hits()
    stop = chaos.cli.run("server", "stop", timeout_s=60)
    if stop.returncode != 0:
        chaos.notes.append(f"server stop: exit {stop.returncode}: {stop.stderr.strip()[-200:]}")
    leaks = wait_no_leaks(home, chaos.launcher_prefix, netns_before, 20.0, list(chaos.plans))
    for proc in home_processes(
        home, chaos.launcher_prefix, list(chaos.plans)
    ):  # counted: now clean up
        with contextlib.suppress(psutil.Error):
            proc.kill()
    report = build_report(
        chaos.plans,
        final,
        chaos.hits,
        chaos.starts(),
        chaos.missing_outputs(final),
        leaks,
        chaos.kills,
        time.monotonic() - started,
    )
    report.home, report.seed, report.kinds = str(home), seed, list(kinds)
    report.notes = chaos.notes + [f"kill at {line}" for line in chaos.log]
    return report


def _killer(chaos: Chaos, moments: list[float], started: float) -> None:
    for moment in moments:
        time.sleep(max(0.0, started + moment - time.monotonic()))
        try:
            chaos.kill_one()
        except Exception as exc:  # noqa: BLE001 - a failed kill is reported, not fatal
            chaos.notes.append(f"kill failed: {exc!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=20, help="how many to submit")
    parser.add_argument("--kills", type=int, default=5, help="how many SIGKILLs to send")
    parser.add_argument("--seed", type=int, default=1, help="seeds the mix and the kills")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="give up waiting for workflows to end after this long",
    )
    parser.add_argument(
        "--kinds",
        default=",".join(KILL_KINDS),
        help=f"comma-separated kinds of kill to use (of {','.join(KILL_KINDS)})",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON here")
    parser.add_argument(
        "--keep-home",
        action="store_true",
        help="keep the temporary TRAINYARD_HOME (kept anyway when a count is not 0)",
    )
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if args.workflows < 1 or args.kills < 0:
        parser.error("--workflows must be 1 or more and --kills 0 or more")
    if not kinds or set(kinds) - set(KILL_KINDS):
        parser.error(f"--kinds: choose from {', '.join(KILL_KINDS)} (given {args.kinds!r})")
    home = Path(tempfile.mkdtemp(prefix="trainyard-chaos-"))
    report = run(args.workflows, args.kills, args.seed, args.timeout_s, home, kinds)
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=1) + "\n")
    if report.failed or args.keep_home:
        print(f"home kept: {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
