"""The service facade: what the REST API (and tests) call. No HTTP here.

It loads and validates specs (``trainyard.spec``), hands workflows to the engine, shapes
records into the JSON the CLI prints, reads logs, and enforces who may see what: a user
reads and cancels only their own workflows unless an admin.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dataclasses import dataclass

from trainyard import spec as specapi
from trainyard.engine import machine as m
from trainyard.engine.reconciler import Engine, Submission
from trainyard.engine.status import WorkflowStatus
from trainyard.errors import ConfigError, ForbiddenError, NotFoundError, SpecError, SpecProblem
from trainyard.pools import DEFAULT_POOL, Pool
from trainyard.server.auth import User
from trainyard.server.schema import SpecRequest
from trainyard.spec.models import WorkflowSpec
from trainyard.store import WorkflowRecord

__all__ = ["SpecRequest", "LoadedSpec", "LogLine", "Service", "iso"]


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec: its workflow, its rendered text (tokens kept), its pool and what
    it was accepted with but warned about (``spec.SpecDocument.warnings``)."""

    workflow: WorkflowSpec
    rendered_text: str
    pool: Pool
    warnings: tuple[SpecProblem, ...] = ()

    def warnings_json(self) -> list[dict[str, Any]]:
        """The warnings as ``[{"path", "message", "line", "file"}]``."""
        return [w.to_json() for w in self.warnings]


def iso(time_s: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC (``2026-11-22T10:00:00.123456+00:00``), None as None."""
    if time_s is None:
        return None
    return datetime.fromtimestamp(time_s, tz=timezone.utc).isoformat()


@dataclass(frozen=True)
class LogLine:
    """One line of a task's log: its task, attempt and OSMO-format text
    (``YYYY/MM/DD HH:MM:SS [task] text``, UTC)."""

    task: str
    retry_id: int
    text: str

    @property
    def stamp(self) -> str:
        """The line's ``YYYY/MM/DD HH:MM:SS`` prefix (sorts by time)."""
        return self.text[:19]

    def to_json(self) -> dict[str, Any]:
        """``{"time": ISO 8601 UTC or None, "task", "retry_id", "line"}``; ``line`` is the
        text after the time and the ``[task]`` tag (runner lines keep ``[trainyard]``)."""
        try:
            when = datetime.strptime(self.stamp, "%Y/%m/%d %H:%M:%S").replace(tzinfo=timezone.utc)
        except ValueError:
            return {"time": None, "task": self.task, "retry_id": self.retry_id, "line": self.text}
        rest = self.text[20:]
        tag = f"[{self.task}]"
        rest = rest[len(tag):].removeprefix(" ") if rest.startswith(tag) else rest
        return {"time": when.isoformat(), "task": self.task, "retry_id": self.retry_id,
                "line": rest}


def _log_time(line: LogLine) -> str:
    return line.stamp


MAX_QUERY_WAIT_S = 10.0
"""The longest a ``GET /api/workflow/{id}?wait_s=`` long poll is held, seconds."""

MAX_HELD_QUERIES = 8
"""Long polls held at once. Each holds a worker thread of the server (40 in all, shared by
every synchronous route), so many waiting clients never starve the other requests."""

_HELD_QUERIES = threading.BoundedSemaphore(MAX_HELD_QUERIES)


def progress_key(state: m.WorkflowState) -> str:
    """What ``--wait`` prints progress from, as a short key: the workflow's status and each
    task's status, retry id, node and exit code. Two states with equal keys print alike."""
    tasks = ",".join(f"{t.name}:{t.status.value}:{t.retry_id}:{t.node}:{t.exit_code}"
                     for t in state.tasks.values())
    return f"{state.status.value}|{tasks}"


class Service:
    """Operations of the API, for one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------------ specs

    def pool(self, name: str | None) -> Pool:
        """The pool called ``name`` (default ``local``). Raises NotFoundError."""
        name = name or DEFAULT_POOL
        if name not in self.engine.pools:
            pools = ", ".join(sorted(self.engine.pools))
            raise NotFoundError(f"unknown pool {name!r}; pools: {pools}")
        return self.engine.pools[name]

    def load(self, req: SpecRequest) -> LoadedSpec:
        """Render (Jinja sandbox, bounded), parse and validate a spec against its pool:
        ``--pool`` first, else the spec's ``workflow.pool``, else ``local``.

        Raises:
            SpecError: every problem of the spec or of the ``--set`` values; a spec (with
                its files, or rendered) over ``spec.MAX_SPEC_BYTES``.
            NotFoundError: the pool does not exist.
        """
        specapi.check_source_size(req.spec_text, req.files, file=req.spec_name)
        rendered = specapi.render(
            req.spec_text, values=specapi.parse_set_values(req.set),
            set_strings=specapi.parse_set_strings(req.set_string), file=req.spec_name,
        )
        chosen: list[Pool] = []

        def lookup(spec_pool: str | None) -> Pool:
            chosen.append(self.pool(req.pool or spec_pool))
            return chosen[-1]

        doc = specapi.parse(
            rendered, spec_path=req.spec_name, files=req.files,
            set_env=specapi.parse_env(req.set_env), labels=req.labels or None, pool=lookup,
        )
        pool = chosen[-1] if chosen else self.pool(req.pool or doc.workflow.pool)
        return LoadedSpec(doc.workflow, rendered, pool, tuple(doc.warnings))

    def _check_other_workflows(self, workflow: WorkflowSpec, user: User) -> None:
        """Each ``task: WORKFLOW_ID:TASK`` input names a workflow that exists and that
        ``user`` may read (theirs, or any for an admin), so a typo or another user's data is
        refused at submit. Whether that task COMPLETED is checked when the input is
        downloaded (exit code 2010 otherwise), since it may still run now.

        Raises:
            NotFoundError: no such workflow.
            ForbiddenError: another user's workflow and ``user`` is no admin.
        """
        for task in workflow.all_tasks():
            for index, item in enumerate(task.inputs):
                other, _name = specapi.split_task_ref(item.task) if item.task else (None, "")
                if other is None:
                    continue
                where = f"task {task.name!r} input {index} ({item.task})"
                try:
                    self._readable(other, user)
                except NotFoundError:
                    raise NotFoundError(f"{where}: no workflow {other}; check the id with "
                                        "`trainyard workflow list`") from None
                except ForbiddenError as exc:
                    raise ForbiddenError(f"{where}: {exc}") from None

    def submit(self, req: SpecRequest, user: User) -> dict[str, Any]:
        """Validate and start a workflow. Returns ``{"id", "name", "status", "warnings"}``
        (the spec's warnings, ``LoadedSpec.warnings_json``).

        Raises:
            SpecError, NotFoundError: as ``load``; NotFoundError and ForbiddenError also as
                ``_check_other_workflows``.
        """
        loaded = self.load(req)
        self._check_other_workflows(loaded.workflow, user)
        record = self.engine.submit(Submission(
            spec=loaded.workflow, spec_text=loaded.rendered_text, user=user.name,
            pool=loaded.pool, labels=dict(loaded.workflow.labels),
            source=_stored_source(req, loaded), reparse=_reparse_args(req),
        ))
        return {"id": record.id, "name": record.name, "status": record.status,
                "warnings": loaded.warnings_json()}

    def dry_run(self, req: SpecRequest, user: User) -> dict[str, Any]:
        """Validate without storing; with what the pool's backend would be handed.

        Returns:
            ``{"dry_run": true, "name", "pool", "spec": rendered text, "backend": [{"group",
            "text"}], "warnings"}``; ``backend`` holds, on Slurm, each group's sbatch command and script
            (empty for backends without such a rendering).
        """
        loaded = self.load(req)
        self._check_other_workflows(loaded.workflow, user)
        sub = Submission(spec=loaded.workflow, spec_text=loaded.rendered_text, user=user.name,
                         pool=loaded.pool, labels=dict(loaded.workflow.labels))
        shown = [{"group": g, "text": text} for g, text in self.engine.preview(sub)]
        return {"dry_run": True, "name": loaded.workflow.name, "pool": loaded.pool.name,
                "spec": loaded.rendered_text, "backend": shown, "warnings": loaded.warnings_json()}

    def resubmit(self, workflow_id: str, user: User, overrides: SpecRequest | None, *,
                 dry_run: bool = False) -> dict[str, Any]:
        """Submit again the stored request of ``workflow_id`` (its ``--set`` values kept,
        those in ``overrides`` appended, so they win). With ``dry_run``, nothing is stored:
        the answer is ``dry_run``'s."""
        record = self._readable(workflow_id, user)
        stored = _stored_request(record)
        if overrides is not None:
            stored.set += overrides.set
            stored.set_string += overrides.set_string
            stored.set_env += overrides.set_env
            stored.labels.update(overrides.labels)
            stored.pool = overrides.pool or stored.pool
        return self.dry_run(stored, user) if dry_run else self.submit(stored, user)

    # ------------------------------------------------------------------ reads

    def stored_spec(self, workflow_id: str, user: User, *, template: bool = False) -> str:
        """The spec a workflow was submitted with (OSMO ``workflow spec ID``): its rendered
        text (special tokens kept), or with ``template`` the spec as written (the same text
        when it had no template syntax).

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        record = self._readable(workflow_id, user)
        if not template or "request" not in record.source:
            return record.spec_text
        return _stored_request(record).spec_text

    def _readable(self, workflow_id: str, user: User) -> WorkflowRecord:
        record = self.engine.store.get_workflow(workflow_id)
        if not user.admin and record.submitted_by != user.name:
            raise ForbiddenError(
                f"workflow {workflow_id} belongs to {record.submitted_by}; only they or an "
                "admin may read or change it"
            )
        return record

    def query(self, workflow_id: str, user: User, *, verbose: bool = False) -> dict[str, Any]:
        """The workflow in the CLI's JSON shape (``groups[].tasks[]``; ``retries`` when verbose)."""
        record = self._readable(workflow_id, user)
        state = self.engine.state(workflow_id)
        data = _workflow_json(record, state, verbose)
        _add_outputs(data, record, lambda task, retry: self.engine.run_dir(workflow_id, task, retry))
        return data

    def query_when_changed(self, workflow_id: str, user: User, *, known: str | None,
                           wait_s: float, verbose: bool = False,
                           interval_s: float = 0.02) -> tuple[dict[str, Any], str]:
        """``query``, answered as soon as the workflow's progress differs from ``known`` (a
        key this method returned before), or it ended, or ``wait_s`` passed (a long poll:
        ``--wait`` sees the end within ``interval_s`` instead of its own poll interval).

        At most ``MAX_HELD_QUERIES`` are held at once (each holds one of the server's worker
        threads); a query beyond them is answered at once, as without ``known``.

        Args:
            known: the progress key of the client's last answer; None answers at once.
            wait_s: the longest wait, seconds (capped at ``MAX_QUERY_WAIT_S``).
            interval_s: how often the engine's in-memory state is looked at.

        Returns:
            (the ``query`` answer, its progress key).

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        self._readable(workflow_id, user)
        if known is not None and wait_s > 0 and _HELD_QUERIES.acquire(blocking=False):
            try:
                self._hold_while_unchanged(workflow_id, known, min(wait_s, MAX_QUERY_WAIT_S),
                                           interval_s)
            finally:
                _HELD_QUERIES.release()
        data = self.query(workflow_id, user, verbose=verbose)
        return data, progress_key(self.engine.state(workflow_id))

    def _hold_while_unchanged(self, workflow_id: str, known: str, wait_s: float,
                              interval_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            state = self.engine.state(workflow_id)
            if progress_key(state) != known or state.status.is_terminal():
                return
            time.sleep(interval_s)

    def list(self, user: User, *, statuses: list[str] | None = None, name: str | None = None,
             labels: dict[str, str] | None = None, count: int | None = None) -> list[dict[str, Any]]:
        """Workflows visible to ``user``, newest first.

        Raises:
            ConfigError: an unknown status (the valid ones are named) or ``count`` below 1.
        """
        _check_list_filters(statuses, count)
        records = self.engine.store.list_workflows(
            statuses=statuses, name=name, labels=labels, count=count,
            submitted_by=None if user.admin else user.name,
        )
        return [_summary_json(r) for r in records]

    # ------------------------------------------------------------------ changes

    def cancel(self, workflow_id: str, user: User) -> dict[str, Any]:
        """Cancel; returns the workflow summary."""
        self._readable(workflow_id, user)
        self.engine.cancel(workflow_id)
        return _summary_json(self.engine.store.get_workflow(workflow_id))

    def restart(self, workflow_id: str, user: User) -> dict[str, Any]:
        """Run the failed groups of a failed workflow again, keeping completed ones."""
        self._readable(workflow_id, user)
        self.engine.restart(workflow_id)
        return _summary_json(self.engine.store.get_workflow(workflow_id))

    # ------------------------------------------------------------------ logs

    def _log_files(self, workflow_id: str, task: str | None,
                   retry_id: int | None) -> list[tuple[str, int, Path]]:
        """``(task, retry_id, task.log path)`` of every attempt asked for."""
        state = self.engine.state(workflow_id)
        if task is not None and task not in state.tasks:
            names = ", ".join(state.tasks)
            raise NotFoundError(f"workflow {workflow_id} has no task {task!r}; tasks: {names}")
        files = []
        for name, ts in state.tasks.items():
            if task is not None and name != task:
                continue
            retries = [retry_id] if retry_id is not None else range(ts.retry_id + 1)
            files += [(name, r, self.engine.run_dir(workflow_id, name, r) / "task.log")
                      for r in retries]
        return files

    def logs(self, workflow_id: str, user: User, *, task: str | None = None,
             retry_id: int | None = None, last_lines: int | None = None) -> list[LogLine]:
        """Log lines of the workflow (all tasks merged by time), or of one task/attempt;
        with ``last_lines``, only the last that many."""
        self._readable(workflow_id, user)
        streams = [[LogLine(name, r, text) for text in _read_lines(path)]
                   for name, r, path in self._log_files(workflow_id, task, retry_id)]
        return _last(list(heapq.merge(*streams, key=_log_time)), last_lines)

    def follow_logs(self, workflow_id: str, user: User, *, task: str | None = None,
                    retry_id: int | None = None, last_lines: int | None = None,
                    poll_s: float = 0.2) -> Iterator[LogLine]:
        """Log lines as they are written, until the workflow ends and its logs are drained.

        The lines already written come first (only the last ``last_lines`` of them when
        given, merged by time), then every new line as it appears.
        """
        self._readable(workflow_id, user)
        offsets: dict[Path, int] = {}
        first = True
        while True:
            finished = self.engine.state(workflow_id).status.is_terminal()
            fresh = self._new_lines(workflow_id, task, retry_id, offsets)
            yield from _last(fresh, last_lines) if first else fresh
            if finished:
                return
            first = False
            time.sleep(poll_s)

    def _new_lines(self, workflow_id: str, task: str | None, retry_id: int | None,
                   offsets: dict[Path, int]) -> list[LogLine]:
        """Complete lines written since ``offsets`` (advanced), merged by time."""
        streams = [[LogLine(name, r, text) for text in _read_new(path, offsets)]
                   for name, r, path in self._log_files(workflow_id, task, retry_id)]
        return list(heapq.merge(*streams, key=_log_time))

    # ------------------------------------------------------------------ pools

    def pools(self) -> list[dict[str, Any]]:
        """Every pool with its backend and node count."""
        return [
            {"name": p.name, "backend": p.backend, "nodes": len(p.nodes),
             "platforms": sorted(p.platforms), "max_retries": p.max_retries}
            for p in self.engine.pools.values()
        ]

    def resources(self, pool: str | None = None) -> list[dict[str, Any]]:
        """Every node (of ``pool`` when given) with capacity, used and free (cpu, gpu,
        memory_bytes, storage_bytes). Raises NotFoundError for an unknown pool."""
        pools = [self.pool(pool)] if pool else list(self.engine.pools.values())
        rows = []
        for p in pools:
            usage = self.engine.usage(p.name)
            rows += [_node_json(p, node, usage.get(node.name)) for node in p.nodes]
        return rows


def _last(lines: list[LogLine], count: int | None) -> list[LogLine]:
    return lines[-count:] if count else lines


def _check_list_filters(statuses: list[str] | None, count: int | None) -> None:
    """Refuse an unknown workflow status or a count below 1 (ConfigError, HTTP 400)."""
    valid = [s.value for s in WorkflowStatus]
    unknown = [s for s in statuses or [] if s not in valid]
    if unknown:
        raise ConfigError(f"unknown workflow status {', '.join(map(repr, unknown))}; "
                          f"statuses: {', '.join(valid)}")
    if count is not None and count < 1:
        raise ConfigError(f"count must be at least 1, not {count}")


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return path.read_text(errors="replace").splitlines()


def _read_new(path: Path, offsets: dict[Path, int]) -> list[str]:
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(offsets.get(path, 0))
        data = handle.read()
    end = data.rfind(b"\n") + 1
    offsets[path] = offsets.get(path, 0) + end
    return data[:end].decode(errors="replace").splitlines()


def _node_json(pool: Pool, node: Any, used: dict[str, Any] | None) -> dict[str, Any]:
    used = used or {"cpu": 0.0, "gpu": 0, "memory_bytes": 0, "storage_bytes": 0}
    capacity = {"cpu": node.cpu, "gpu": node.gpu, "memory_bytes": node.memory_bytes,
                "storage_bytes": node.storage_bytes}
    free = {k: capacity[k] - used[k] for k in capacity}
    return {"pool": pool.name, "node": node.name, "platform": node.platform,
            "capacity": capacity, "used": used, "free": free}


def _summary_json(record: WorkflowRecord) -> dict[str, Any]:
    return {
        "id": record.id, "name": record.name, "status": record.status, "pool": record.pool,
        "submitted_by": record.submitted_by, "labels": record.labels,
        "submit_time": iso(record.submit_time_s), "end_time": iso(record.end_time_s),
    }


def _attempt_json(a: m.TaskAttempt) -> dict[str, Any]:
    return {"retry_id": a.retry_id, "status": a.status.value, "exit_code": a.exit_code,
            "node": a.node, "start_time": iso(a.start_time_s), "end_time": iso(a.end_time_s)}


def _task_json(t: m.TaskState, verbose: bool) -> dict[str, Any]:
    out = {"name": t.name, "status": t.status.value, "lead": t.lead, "retry_id": t.retry_id,
           "exit_code": t.exit_code, "node": t.node, "start_time": iso(t.start_time_s),
           "end_time": iso(t.end_time_s)}
    if verbose:
        out["retries"] = [_attempt_json(a) for a in t.history]
    return out


def _stored_source(req: SpecRequest, loaded: LoadedSpec) -> dict[str, Any]:
    """What a workflow's record keeps beside its rendered text (``spec_text``), each thing
    once: the request (to submit it again) without its ``localpath`` files (kept in the
    ``reparse`` arguments) and without its text when that is the rendered text (a spec
    without template syntax), and where each task's outputs go (``outputs``, for query)."""
    request = req.model_dump()
    request["files"] = None
    if request["spec_text"] == loaded.rendered_text:
        request["spec_text"] = None
    return {"request": request, "outputs": _targets_of(loaded.workflow)}


def _reparse_args(req: SpecRequest) -> dict[str, Any]:
    """The ``spec.reparse`` arguments that turn the stored rendered text back into the
    workflow (as ``load`` parsed it)."""
    return {"spec_path": req.spec_name, "files": req.files,
            "set_env": specapi.parse_env(req.set_env), "labels": req.labels or None}


def _stored_request(record: WorkflowRecord) -> SpecRequest:
    """The request ``record`` was submitted with (see ``_stored_source``)."""
    request = dict(record.source["request"])
    if request.get("spec_text") is None:
        request["spec_text"] = record.spec_text
    if request.get("files") is None:
        request["files"] = record.source.get("reparse", {}).get("files") or {}
    return SpecRequest.model_validate(request)


def _targets_of(workflow: WorkflowSpec) -> dict[str, list[str]]:
    """Task name -> where its ``outputs`` go (``url`` or ``dataset NAME``)."""
    targets: dict[str, list[str]] = {}
    for task in workflow.all_tasks():
        for out in task.outputs:
            target = out.url or f"dataset {out.dataset.name if out.dataset else None}"
            targets.setdefault(task.name, []).append(target)
    return targets


def _output_targets(record: WorkflowRecord) -> dict[str, list[str]]:
    """Task name -> where its ``outputs`` go (``url`` or ``dataset NAME``), as stored at
    submit (a record stored before ``outputs`` was: from its spec JSON)."""
    if "outputs" in record.source:
        return record.source["outputs"]
    spec = record.source.get("spec") or {}
    tasks = [t for g in spec.get("groups", []) for t in g.get("tasks", [])]
    targets: dict[str, list[str]] = {}
    for task in tasks:
        for out in task.get("outputs") or []:
            target = out.get("url") or f"dataset {(out.get('dataset') or {}).get('name')}"
            targets.setdefault(task["name"], []).append(target)
    return targets


def _add_outputs(data: dict[str, Any], record: WorkflowRecord, run_dir: Any) -> None:
    """Give every task its ``output_dir`` (the ``{{output}}`` folder of its current attempt)
    and ``outputs`` (where the spec uploads it after success)."""
    targets = _output_targets(record)
    for group in data["groups"]:
        for task in group["tasks"]:
            task["output_dir"] = str(run_dir(task["name"], task["retry_id"]) / "output")
            task["outputs"] = targets.get(task["name"], [])


def _workflow_json(record: WorkflowRecord, state: m.WorkflowState, verbose: bool) -> dict[str, Any]:
    groups = [
        {"name": g.name, "status": g.status.value,
         "tasks": [_task_json(state.tasks[t], verbose) for t in g.tasks]}
        for g in state.groups.values()
    ]
    return {**_summary_json(record), "status": state.status.value, "groups": groups}


def spec_error_json(exc: SpecError) -> list[dict[str, Any]]:
    """SpecError as JSON rows (for the API's 422 answer)."""
    return [{"path": p.path, "message": p.message, "line": p.line, "file": p.file}
            for p in exc.problems]


def spec_error_from_json(rows: list[dict[str, Any]]) -> SpecError:
    """The inverse of ``spec_error_json`` (the CLI rebuilds the error it prints)."""
    return SpecError([SpecProblem(**row) for row in rows])
