"""The service facade: what the REST API (and tests) call. No HTTP here.

It loads and validates specs (``trainyard.spec``), hands workflows to the engine, shapes
records into the JSON the CLI prints, reads logs, and enforces who may see what: a user
reads and cancels only their own workflows unless an admin.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainyard import spec as specapi
from trainyard.backends.served import load_pool_file
from trainyard.engine import machine as m
from trainyard.engine import reasons
from trainyard.engine.reconciler import Engine, Submission
from trainyard.errors import (
    AuthError,
    BadArgumentError,
    ConfigError,
    ForbiddenError,
    NotFoundError,
    RefusedError,
    SpecError,
    SpecProblem,
)
from trainyard.pools import DEFAULT_POOL, Pool
from trainyard.server import compare
from trainyard.server.answers import (
    AttemptAnswer,
    GroupAnswer,
    TaskAnswer,
    WorkflowAnswer,
    WorkflowSummary,
)
from trainyard.server.auth import User, refuse_task_token
from trainyard.server.logs import (
    FLUSH,
    LogFile,
    LogLine,
    file_size,
    read_detail,
    read_merged,
    tail_offset,
)
from trainyard.server.osmo_filters import ListFilters, TaskFilters, priority_of, retag, tags_of
from trainyard.server.schema import SpecRequest
from trainyard.spec.models import WorkflowSpec
from trainyard.spec.tokens import substitute_tokens
from trainyard.status import Status, WorkflowStatus
from trainyard.store import WorkflowRecord

log = logging.getLogger("trainyard.server.service")

__all__ = [
    "SpecRequest",
    "LoadedSpec",
    "LogLine",
    "LogCursor",
    "Service",
    "iso",
    "FOLLOW_BATCH_BYTES",
]


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
    return datetime.fromtimestamp(time_s, tz=UTC).isoformat()


def _log_time(line: LogLine) -> str:
    return line.stamp


MAX_QUERY_WAIT_S = 10.0
"""The longest a ``GET /api/workflow/{id}?wait_s=`` long poll is held, seconds."""

MAX_HELD_QUERIES = 8
"""Long polls held at once. Each holds a worker thread of the server (40 in all, shared by
every synchronous route), so many waiting clients never starve the other requests."""

_HELD_QUERIES = threading.BoundedSemaphore(MAX_HELD_QUERIES)


def progress_key(state: m.WorkflowState) -> str:
    """What ``--wait`` prints progress from, as a short key: the workflow's status, each
    task's status, retry id, node and exit code, and a digest of its groups' waiting
    reasons. Two states with equal keys print alike."""
    tasks = ",".join(
        f"{t.name}:{t.status.value}:{t.retry_id}:{t.node}:{t.exit_code}"
        for t in state.tasks.values()
    )
    reasons = "\n".join(g.waiting_reason or "" for g in state.groups.values())
    waits = hashlib.blake2s(reasons.encode(), digest_size=6).hexdigest() if reasons.strip() else ""
    return f"{state.status.value}|{tasks}|{waits}"


class Service:
    """Operations of the API, for one engine."""

    def __init__(
        self,
        engine: Engine,
        *,
        refused_pools: dict[str, str] | None = None,
        pools_file: Path | None = None,
    ) -> None:
        """Args:
        pools_file: the ``pools.yaml`` the engine's pools came from; given, it is read
            again whenever its modification time changes (``refresh_pools``), so an
            edit takes effect without a restart. None: the pools never change.
        """
        self.engine = engine
        self.refused_pools = dict(refused_pools or {})
        """Pools of pools.yaml not served (backend not available), with the reason."""
        self.pools_file = pools_file
        self._pools_mtime = _mtime_ns(pools_file)
        self._pools_lock = threading.Lock()
        self._pools_pending: list[str] = []  # busy pools whose edit waits
        self.pools_error: str | None = None
        """Why the last read of ``pools_file`` was refused (the pools in use were kept)."""

    def refresh_pools(self, *, force: bool = False) -> dict[str, Any]:
        """Read ``pools_file`` again when its modification time changed (or ``force``), or
        when an earlier edit waits for a busy pool; serve what it defines
        (``Engine.replace_pools``). A file that does not load is refused whole: the pools
        in use stay, the reason is kept in ``pools_error`` (and logged).

        Returns:
            ``{"pools": [names], "refused": {name: reason}, "kept": [busy pools whose edit
            waits for their workflows], "error": reason or None, "file": path}``.

        Raises:
            ConfigError: with ``force``, the file does not load (says the pools are kept).
        """
        if self.pools_file is None:
            return self._pools_status()
        with self._pools_lock:
            mtime = _mtime_ns(self.pools_file)
            if not force and mtime == self._pools_mtime and not self._pools_pending:
                return self._pools_status()
            self._pools_mtime = mtime
            try:
                pools, refused = load_pool_file(self.pools_file)
            except ConfigError as exc:
                self.pools_error = (
                    f"{exc}; the server keeps serving its pools "
                    f"({', '.join(sorted(self.engine.pools))})"
                )
                log.error("pools file refused: %s", self.pools_error)
                if force:
                    raise ConfigError(self.pools_error) from None
                return self._pools_status()
            self._pools_pending = self.engine.replace_pools(pools)
            self.refused_pools, self.pools_error = refused, None
            return self._pools_status()

    def _pools_status(self) -> dict[str, Any]:
        return {
            "pools": sorted(self.engine.pools),
            "refused": dict(self.refused_pools),
            "kept": list(self._pools_pending),
            "error": self.pools_error,
            "file": str(self.pools_file) if self.pools_file else None,
        }

    def task_token_owner(self, workflow_id: str) -> str:
        """The submitter a task token of ``workflow_id`` acts as (``TokenRegistry``'s
        ``workflow_owner``).

        Raises:
            AuthError: the workflow is unknown or has ended (its tasks' tokens expire with it).
        """
        try:
            record = self.engine.store.get_workflow(workflow_id)
        except NotFoundError:
            raise AuthError("unknown token") from None
        if WorkflowStatus(record.status).is_terminal():
            raise AuthError(
                f"task token of workflow {workflow_id}: the workflow ended "
                f"({record.status}); task tokens expire with their workflow"
            )
        return record.submitted_by

    # ------------------------------------------------------------------ specs

    def pool(self, name: str | None) -> Pool:
        """The pool called ``name`` (default ``local``).

        Raises:
            NotFoundError: no such pool (the pools are named).
            ConfigError: the pool's backend is not available (``pools.refused_pools``).
        """
        self.refresh_pools()
        name = name or DEFAULT_POOL
        if name not in self.engine.pools and name in self.refused_pools:
            raise ConfigError(self.refused_pools[name])
        if name not in self.engine.pools:
            pools = ", ".join(sorted(self.engine.pools))
            raise NotFoundError(f"unknown pool {name!r}; pools: {pools}")
        return self.engine.pools[name]

    def load(self, req: SpecRequest, user: User | None = None) -> LoadedSpec:
        """Render (Jinja sandbox, bounded), parse and validate a spec against its pool:
        ``--pool`` first, else the spec's ``workflow.pool``, else the user's default pool
        (``default_pool``: OSMO's ``profile set pool``), else ``local``. ``file://`` URLs are
        checked against ``user``'s data roots (None: the home owner's, for a spec that is
        only rendered or stored as an app; the submit checks it again as its submitter).

        Raises:
            SpecError: every problem of the spec or of the ``--set`` values; a spec (with
                its files, or rendered) over ``spec.MAX_SPEC_BYTES``.
            NotFoundError: the pool does not exist.
        """
        specapi.check_source_size(req.spec_text, req.files, file=req.spec_name)
        rendered = specapi.render(
            req.spec_text,
            values=specapi.parse_set_values(req.set),
            set_strings=specapi.parse_set_strings(req.set_string),
            file=req.spec_name,
        )
        chosen: list[Pool] = []

        def lookup(spec_pool: str | None) -> Pool:
            chosen.append(self.pool(req.pool or spec_pool or req.default_pool))
            return chosen[-1]

        doc = specapi.parse(
            rendered,
            spec_path=req.spec_name,
            files=req.files,
            set_env=specapi.parse_env(req.set_env),
            labels=req.labels or None,
            pool=lookup,
            user=user.name if user is not None else None,
        )
        pool = (
            chosen[-1] if chosen else self.pool(req.pool or doc.workflow.pool or req.default_pool)
        )
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
                    raise NotFoundError(
                        f"{where}: no workflow {other}; check the id with `trainyard workflow list`"
                    ) from None
                except ForbiddenError as exc:
                    raise ForbiddenError(f"{where}: {exc}") from None

    def _check_datasets(self, workflow: WorkflowSpec, user: User) -> None:
        """Each dataset the workflow reads exists for ``user`` only if shared with them, and
        each it writes is theirs (``data.datasets`` ownership), so that a task does not fail
        later with 2010/2012 for it. A dataset that does not exist yet passes (an upstream
        task may make it). Only on the default dataset store, which the runners use.

        Raises:
            ForbiddenError: names the task, the input or output, and the owner.
        """
        from trainyard.data.datasets import Actor, DatasetStore, parse_ref  # on use

        refs = [
            (task.name, f"input {i}", item.dataset.name, False)
            for task in workflow.all_tasks()
            for i, item in enumerate(task.inputs)
            if item.dataset
        ]
        refs += [
            (task.name, f"output {i}", item.dataset.name, True)
            for task in workflow.all_tasks()
            for i, item in enumerate(task.outputs)
            if item.dataset
        ]
        if not refs or user.admin:
            return
        store = DatasetStore(actor=Actor(user.name, user.admin))
        for task, what, ref, write in refs:
            name, _selector = parse_ref(ref)
            try:
                if write:
                    store.check_may_write(name)
                elif store.versions(name):
                    store.info(name)
            except ForbiddenError as exc:
                raise ForbiddenError(f"task {task!r} {what} (dataset {ref}): {exc}") from None

    def check_credentials(self, workflow: WorkflowSpec, user: User) -> None:
        """Every credential a task of ``workflow`` names is ``user``'s (OSMO refuses the
        submit otherwise, with these words).

        Raises:
            SpecError: one problem per missing name and task: ``Could not find the
                credential: NAME``.
        """
        problems = []
        for task in workflow.all_tasks():
            names = list(task.credentials)
            if not names:
                continue
            try:
                self.engine.credentials.check_names(user.name, names)
            except NotFoundError as exc:
                problems.append(
                    SpecProblem(
                        f"task {task.name} credentials",
                        f"{exc}; store it with `trainyard "
                        "credential set NAME --type GENERIC --payload KEY=VALUE`",
                    )
                )
        if problems:
            raise SpecError(problems)

    def validate(self, req: SpecRequest, user: User) -> LoadedSpec:
        """``load`` (as ``user``) and ``check_credentials``: what ``workflow validate`` answers."""
        loaded = self.load(req, user)
        self.check_credentials(loaded.workflow, user)
        return loaded

    # ------------------------------------------------------------------ credentials

    def set_credential(
        self, user: User, name: str, kind: str, payload: dict[str, str]
    ) -> dict[str, Any]:
        """Create or replace the caller's credential (``CredentialVault.set``); a task token
        may not. Returns ``{"name", "type", "keys"}``, never a value."""
        refuse_task_token(user, "set a credential")
        return self.engine.credentials.set(user.name, name, kind, payload)

    def list_credentials(self, user: User) -> list[dict[str, Any]]:
        """The caller's credentials: ``[{"name", "type", "keys", "create_time"}]``."""
        rows = self.engine.credentials.list_for_user(user.name)
        return [
            {
                "name": r["name"],
                "type": r["type"],
                "keys": r["keys"],
                "create_time": iso(float(r["create_time_s"])),
            }
            for r in rows
        ]

    def delete_credential(self, user: User, name: str) -> dict[str, Any]:
        """Delete the caller's credential; a task token may not. Raises NotFoundError."""
        refuse_task_token(user, "delete a credential")
        self.engine.credentials.delete(user.name, name)
        return {"name": name, "deleted": True}

    def submit(self, req: SpecRequest, user: User) -> dict[str, Any]:
        """Validate and start a workflow. Returns ``{"id", "name", "status", "warnings"}``
        (the spec's warnings, ``LoadedSpec.warnings_json``).

        Raises:
            SpecError, NotFoundError: as ``load``; NotFoundError and ForbiddenError also as
                ``_check_other_workflows``; ForbiddenError as ``_check_datasets``.
        """
        refuse_task_token(user, "submit a workflow")
        loaded = self.validate(req, user)
        self._check_other_workflows(loaded.workflow, user)
        self._check_datasets(loaded.workflow, user)
        record = self.engine.submit(
            Submission(
                spec=loaded.workflow,
                spec_text=loaded.rendered_text,
                user=user.name,
                pool=loaded.pool,
                labels=dict(loaded.workflow.labels),
                source=_stored_source(req, loaded),
                reparse=_reparse_args(req),
            )
        )
        return {
            "id": record.id,
            "name": record.name,
            "status": record.status,
            "warnings": loaded.warnings_json(),
        }

    def dry_run(self, req: SpecRequest, user: User) -> dict[str, Any]:
        """Validate without storing; with what the pool's backend would be handed.

        Returns:
            ``{"dry_run": true, "name", "pool", "spec": rendered text, "backend": [{"group",
            "text"}], "warnings"}``; ``backend`` holds, on Slurm, each group's sbatch command and script
            (empty for backends without such a rendering).
        """
        loaded = self.validate(req, user)
        self._check_other_workflows(loaded.workflow, user)
        sub = Submission(
            spec=loaded.workflow,
            spec_text=loaded.rendered_text,
            user=user.name,
            pool=loaded.pool,
            labels=dict(loaded.workflow.labels),
        )
        shown = [{"group": g, "text": text} for g, text in self.engine.preview(sub)]
        return {
            "dry_run": True,
            "name": loaded.workflow.name,
            "pool": loaded.pool.name,
            "spec": loaded.rendered_text,
            "backend": shown,
            "warnings": loaded.warnings_json(),
        }

    def resubmit(
        self, workflow_id: str, user: User, overrides: SpecRequest | None, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Submit again the stored request of ``workflow_id`` (its ``--set`` values kept,
        those in ``overrides`` appended, so they win). With ``dry_run``, nothing is stored:
        the answer is ``dry_run``'s."""
        refuse_task_token(user, "submit a workflow")
        record = self._readable(workflow_id, user)
        stored = _stored_request(record)
        if overrides is not None:
            stored.set += overrides.set
            stored.set_string += overrides.set_string
            stored.set_env += overrides.set_env
            stored.labels.update(overrides.labels)
            stored.pool = overrides.pool or stored.pool
            stored.priority = overrides.priority or stored.priority
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
        if user.workflow is not None and workflow_id != user.workflow:
            raise ForbiddenError(
                f"a task token of workflow {user.workflow} may not read or "
                f"change workflow {workflow_id}"
            )
        record = self.engine.store.get_workflow(workflow_id)
        if not user.admin and record.submitted_by != user.name:
            raise ForbiddenError(
                f"workflow {workflow_id} belongs to {record.submitted_by}; only they or an "
                "admin may read or change it"
            )
        return record

    def diff(self, workflow_a: str, workflow_b: str, user: User) -> dict[str, Any]:
        """Two workflows side by side (``trainyard workflow diff A B``): the settings that
        differ, final metrics, and whether their saved models are identical tensor by tensor
        (``compare.diff_runs`` gives the shape). Reads model files: may take a while.

        Raises:
            NotFoundError, ForbiddenError: as ``query``, for either workflow.
        """
        facts_a, facts_b = self._facts(workflow_a, user), self._facts(workflow_b, user)
        return compare.diff_runs(facts_a, facts_b)

    def settings(self, workflow_ids: list[str], user: User) -> list[dict[str, Any]]:
        """The settings that differ among workflows (``/compare``): ``[{"field", "values"}]``,
        one value per workflow in the order given (``compare.settings_table``).

        Raises:
            NotFoundError, ForbiddenError: as ``query``, for any of them.
        """
        return compare.settings_table([self._facts(w, user) for w in workflow_ids])

    def _facts(self, workflow_id: str, user: User) -> compare.RunFacts:
        record = self._readable(workflow_id, user)
        try:
            workflow: WorkflowSpec | None = self.engine.spec_of(record)
        except SpecError:
            workflow = None
        pool = self.engine.pools.get(record.pool)
        return compare.run_facts(
            record,
            workflow,
            self.engine.state(workflow_id),
            lambda task, retry: self.engine.run_dir(workflow_id, task, retry),
            pool.backend if pool is not None else "unknown",
        )

    def query(
        self, workflow_id: str, user: User, *, verbose: bool = False, isolation: bool = False
    ) -> WorkflowAnswer:
        """The workflow in the CLI's JSON shape (``groups[].tasks[]``; ``retries`` when
        verbose; with ``isolation``, each task's ``isolation``: the detail lines of how its
        current attempt is isolated, read from the head of its task log, ``read_detail``)."""
        record = self._readable(workflow_id, user)
        state = self.engine.state(workflow_id)
        data = _workflow_json(record, state, verbose)
        if isolation:
            for group in data["groups"]:
                for task in group["tasks"]:
                    path = self.engine.run_dir(workflow_id, task["name"], task["retry_id"])
                    task["isolation"] = read_detail(path / "task.log", task["name"])
        data["priority"], data["tags"] = priority_of(record.source), tags_of(record.source)
        _add_outputs(
            data, record, lambda task, retry: self.engine.run_dir(workflow_id, task, retry)
        )
        return data

    def query_when_changed(
        self,
        workflow_id: str,
        user: User,
        *,
        known: str | None,
        wait_s: float,
        verbose: bool = False,
        isolation: bool = False,
        interval_s: float = 0.25,
    ) -> tuple[WorkflowAnswer, str]:
        """``query``, answered as soon as the workflow's progress differs from ``known`` (a
        key this method returned before), or it ended, or ``wait_s`` passed (a long poll:
        ``--wait`` sees the end as soon as the engine stores it, ``Engine.wait_for_change``,
        instead of at its own poll interval).

        At most ``MAX_HELD_QUERIES`` are held at once (each holds one of the server's worker
        threads); a query beyond them is answered at once, as without ``known``.

        Args:
            known: the progress key of the client's last answer; None answers at once.
            wait_s: the longest wait, seconds (capped at ``MAX_QUERY_WAIT_S``).
            interval_s: the longest between two looks at the engine's state when no change
                is stored (a safety net: every change is stored, and wakes the look).

        Returns:
            (the ``query`` answer, its progress key).

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        self._readable(workflow_id, user)
        if known is not None and wait_s > 0 and _HELD_QUERIES.acquire(blocking=False):
            try:
                self._hold_while_unchanged(
                    workflow_id, known, min(wait_s, MAX_QUERY_WAIT_S), interval_s
                )
            finally:
                _HELD_QUERIES.release()
        data = self.query(workflow_id, user, verbose=verbose, isolation=isolation)
        return data, progress_key(self.engine.state(workflow_id))

    def _hold_while_unchanged(
        self, workflow_id: str, known: str, wait_s: float, interval_s: float
    ) -> None:
        deadline = time.monotonic() + wait_s
        while (remaining := deadline - time.monotonic()) > 0:
            seen = self.engine.changes()  # before the look: a change after it wakes the wait
            state = self.engine.state(workflow_id)
            if progress_key(state) != known or state.status.is_terminal():
                return
            self.engine.wait_for_change(seen, min(interval_s, remaining))

    def list_workflows(
        self,
        user: User,
        *,
        statuses: list[str] | None = None,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        count: int | None = None,
        submitted_by: str | list[str] | None = None,
        pool: str | list[str] | None = None,
        offset: int = 0,
        oldest_first: bool = False,
        submitted_after_s: float | None = None,
        submitted_before_s: float | None = None,
        all_users: bool | None = None,
        filters: ListFilters | None = None,
    ) -> list[WorkflowSummary]:
        """Workflows visible to ``user``, newest first (``oldest_first``: oldest first),
        skipping the first ``offset``; read through ``Store.page_workflows`` (the
        dashboard's query). A non-admin sees only their own workflows. Whose: those of
        ``submitted_by`` (one user or several), else with ``all_users`` False the caller's
        own (OSMO's default), with True everyone's; None (a client before OSMO's flags):
        an admin's everyone's. ``filters``: OSMO's tags, priority, app, no-label.

        Raises:
            BadArgumentError: an unknown status or priority (the valid ones are named), ``count``
                below 1 or ``offset`` below 0.
            ForbiddenError: a non-admin asked for another user's workflows.
        """
        _check_list_filters(statuses, count)
        if offset < 0:
            raise BadArgumentError(f"offset must be 0 or more, not {offset}")
        if user.workflow is not None:  # a task token sees its own workflow only
            return [_summary_json(self._readable(user.workflow, user))]
        users = [submitted_by] if isinstance(submitted_by, str) else list(submitted_by or [])
        others = [u for u in users if u != user.name]
        if not user.admin and others:
            raise ForbiddenError(
                f"only an admin may list the workflows of {others[0]}; you are {user.name}"
            )
        if not user.admin or (not users and all_users is False):
            users = users or [user.name]
        rows, _total = self.engine.store.page_workflows(
            statuses=statuses,
            name=name,
            labels=labels,
            pool=pool,
            offset=offset,
            limit=count or 2**31 - 1,
            oldest_first=oldest_first,
            submitted_by=users or None,
            submitted_after_s=submitted_after_s,
            submitted_before_s=submitted_before_s,
            keep=filters.keep() if filters else None,
        )
        return [_row_summary_json(row) for row in rows]

    def tag(
        self, workflow_ids: list[str], user: User, *, add: list[str], remove: list[str]
    ) -> list[dict[str, Any]]:
        """OSMO's ``workflow tag``: remove ``remove`` from, then add ``add`` to, each
        workflow's tags (the caller's own workflows; an admin's any). All are checked
        before any changes. Returns ``[{"id", "tags"}]``.

        Raises:
            NotFoundError, ForbiddenError: as ``query``; a task token may not tag.
        """
        refuse_task_token(user, "tag a workflow")
        ids = [self._readable(workflow_id, user).id for workflow_id in workflow_ids]
        store = self.engine.store
        return [
            {
                "id": workflow_id,
                "tags": tags_of(
                    store.update_workflow_source(
                        workflow_id, lambda source: retag(source, add, remove)
                    )
                ),
            }
            for workflow_id in ids
        ]

    def tags(self, user: User) -> list[str]:
        """Every tag on a workflow ``user`` may read (OSMO's ``workflow tag`` without
        ``-w``: the tags there are to assign), sorted."""
        found: set[str] = set()

        def collect(row: dict[str, Any]) -> bool:
            found.update(tags_of(row.get("source") or {}))
            return False

        self.engine.store.page_workflows(
            limit=1, keep=collect, submitted_by=None if user.admin else user.name
        )
        return sorted(found)

    def events(self, workflow_id: str, user: User) -> list[dict[str, Any]]:
        """The transitions of every task attempt, oldest first: the runner's events from
        each attempt's ``events.jsonl`` (INITIALIZING, RUNNING, EXITED with its exit code
        and message) and the attempt's end status as the engine recorded it (COMPLETED,
        RESCHEDULED, FAILED*), each with its time.

        Returns:
            ``[{"time": ISO 8601 UTC, "task", "retry_id", "event", "exit_code",
            "message"}]``.

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        from trainyard.runner.report import EVENTS, read_events

        self._readable(workflow_id, user)
        state = self.engine.state(workflow_id)
        rows: list[tuple[float, dict[str, Any]]] = []
        for name, ts in state.tasks.items():
            attempts: list[m.TaskState | m.TaskAttempt] = [*ts.history, ts]
            for a in attempts:
                run_dir = self.engine.run_dir(workflow_id, name, a.retry_id)
                for e in read_events(run_dir / EVENTS)[0]:
                    rows.append(
                        (
                            e.time_s,
                            _event_row(
                                e.time_s,
                                name,
                                a.retry_id,
                                e.kind,
                                e.exit_code,
                                _event_message(e, a),
                            ),
                        )
                    )
                if a.status.is_terminal() and a.end_time_s is not None:
                    rows.append(
                        (
                            a.end_time_s,
                            _event_row(
                                a.end_time_s,
                                name,
                                a.retry_id,
                                a.status.value,
                                a.exit_code,
                                a.failure_reason,
                            ),
                        )
                    )
        return [row for _t, row in sorted(rows, key=lambda r: r[0])]

    def tasks(
        self,
        user: User,
        *,
        workflow_id: str | None = None,
        count: int = 20,
        filters: TaskFilters | None = None,
    ) -> list[dict[str, Any]]:
        """The tasks of one workflow, or of ``user``'s latest ``count`` workflows (an
        admin's: everyone's), each ``{"workflow", "group", "name", "status", "retry_id",
        "node", "exit_code", "start_time", "end_time", "failure_reason", "pool", "user",
        "priority"}``. With ``filters`` (OSMO's ``task list``), ``count`` is the number of
        tasks: those of every workflow the filters' users may see, newest workflow first,
        kept by the filters, then paged by ``filters.offset``.

        Raises:
            NotFoundError, ForbiddenError: as ``query``; BadArgumentError: ``count`` below 1.
        """
        if workflow_id is not None:
            workflows = [self._readable(workflow_id, user)]
        elif filters is None:
            workflows = [
                self.engine.store.get_workflow(w["id"])
                for w in self.list_workflows(user, count=count)
            ]
        else:
            workflows = [
                self.engine.store.get_workflow(w["id"])
                for w in self.list_workflows(
                    user,
                    submitted_by=filters.users or None,
                    all_users=filters.all_users,
                    pool=filters.pools or None,
                )
            ]
        rows = [row for record in workflows for row in self._task_rows(record)]
        if filters is None:
            return rows
        kept = [row for row in rows if filters.keep(row)]
        return kept[filters.offset : filters.offset + count]

    def _task_rows(self, record: WorkflowRecord) -> list[dict[str, Any]]:
        state = self.engine.state(record.id)
        extra = {
            "pool": record.pool,
            "user": record.submitted_by,
            "priority": priority_of(record.source),
        }
        return [
            {
                "workflow": record.id,
                "group": group.name,
                **_task_json(state.tasks[t], False),
                **extra,
            }
            for group in state.groups.values()
            for t in group.tasks
        ]

    # ------------------------------------------------------------------ changes

    def cancel(
        self, workflow_id: str, user: User, *, message: str | None = None, force: bool = False
    ) -> dict[str, Any]:
        """Cancel (idempotent); returns the workflow summary with ``had_ended``: true when
        the workflow had already ended before this call (nothing was cancelled), and
        ``cancel_message``: OSMO's ``--message``, kept with the workflow (the first one
        given). ``force`` (OSMO's ``--force``, "Force cancel task group pods"): no grace
        period, its tasks' processes SIGKILLed at once (``Engine.cancel``); also for a
        workflow already being cancelled."""
        record = self._readable(workflow_id, user)
        refuse_task_token(user, "cancel a workflow")
        had_ended = WorkflowStatus(record.status).is_terminal()
        source = record.source
        if message and not had_ended and not source.get("cancel"):
            source = self.engine.store.update_workflow_source(
                workflow_id,
                lambda old: {
                    **old,
                    "cancel": {"message": message, "by": user.name, "force": force},
                },
            )
        self.engine.cancel(workflow_id, force=force)
        return {
            **_summary_json(self.engine.store.get_workflow(workflow_id)),
            "had_ended": had_ended,
            "cancel_message": (source.get("cancel") or {}).get("message"),
        }

    def task_entry(
        self, workflow_id: str, task: str, user: User, *, retry_id: int | None = None
    ) -> dict[str, Any]:
        """How to enter a running task (``workflow exec``, ``port-forward``, ``rsync``): the
        same rule as ``cancel`` (the workflow's submitter or an admin; never a task token).

        Returns:
            ``{"workflow_id", "task", "retry_id", "status"}`` plus the backend's ``entry``
            (``LocalBackend.entry``: ``backend``, ``machine``, ``pid``, ``created``,
            ``address``, ``run_dir``).

        Raises:
            NotFoundError: no such workflow, task or retry (exit 3).
            ForbiddenError: as ``cancel``.
            RefusedError: the attempt is not running (ended: exit 4), or cannot be entered.
        """
        record = self._readable(workflow_id, user)
        refuse_task_token(user, "exec in a task")
        state = self.engine.state(workflow_id)
        current = state.tasks.get(task)
        if current is None:
            raise NotFoundError(
                f"workflow {workflow_id} has no task {task!r}; its tasks: "
                f"{', '.join(sorted(state.tasks))}"
            )
        retry = current.retry_id if retry_id is None else retry_id
        status = Status(_attempt_status(current, retry, workflow_id))
        if status is not Status.RUNNING:
            when = (
                "has ended"
                if status.is_terminal() or retry != current.retry_id
                else "is not running yet"
            )
            raise RefusedError(
                f"task {task} (retry {retry}) of workflow {workflow_id} {when} "
                f"({status.value}); only a RUNNING task can be entered"
            )
        from trainyard.backends.base import TaskKey

        entry = self.engine.task_entry(record.pool, TaskKey(workflow_id, task, retry))
        return {
            "workflow_id": workflow_id,
            "task": task,
            "retry_id": retry,
            "status": status.value,
            **entry,
        }

    def restart(self, workflow_id: str, user: User, *, pool: str | None = None) -> WorkflowSummary:
        """Run the failed groups of a failed workflow again, keeping completed ones.

        ``pool`` (OSMO's ``restart -p``) must be the workflow's own pool: its completed
        groups' outputs stay where they ran.

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
            RefusedError: as ``Engine.restart``; ``pool`` names another pool.
        """
        record = self._readable(workflow_id, user)
        refuse_task_token(user, "restart a workflow")
        if pool is not None and pool != record.pool:
            raise RefusedError(
                f"workflow {workflow_id} ran on pool {record.pool}; a restart "
                f"stays there (its completed groups' outputs are there): submit "
                f"it again on {pool} with `workflow submit {workflow_id} "
                f"--pool {pool}`"
            )
        self.engine.restart(workflow_id)
        return _summary_json(self.engine.store.get_workflow(workflow_id))

    def delete(self, workflow_ids: list[str], user: User) -> dict[str, Any]:
        """Delete ended workflows (rows and run folders; never their uploads), all or none.
        The same rule as ``cancel``: each must be ``user``'s, unless an admin.

        Returns:
            ``{"deleted": [ids]}``.

        Raises:
            NotFoundError, ForbiddenError: as ``cancel``, for any id (nothing deleted).
            RefusedError: one has not ended (``Engine.delete``).
        """
        for workflow_id in workflow_ids:
            self._readable(workflow_id, user)
        self.engine.delete(workflow_ids)
        return {"deleted": list(dict.fromkeys(workflow_ids))}

    def prune(
        self, older_than_s: float, user: User, *, dry_run: bool = False, limit: int | None = None
    ) -> dict[str, Any]:
        """Delete the ended workflows of ``user`` (every user's, for an admin) that ended
        more than ``older_than_s`` seconds ago, oldest first, at most ``limit`` of them per
        call (each takes tens of ms: a caller asks again while ``more``); one that cannot be
        deleted now (an attempt still stopping) is left and named in ``kept``.

        Returns:
            ``{"deleted": [ids], "kept": [{"id", "reason"}], "more": bool}`` (with
            ``dry_run``, every id that would be deleted, nothing removed).
        """
        records = self.engine.store.list_workflows(
            ended_before_s=time.time() - older_than_s,
            submitted_by=None if user.admin else user.name,
        )
        ids = [r.id for r in reversed(records)]
        if dry_run:
            return {"deleted": ids, "kept": [], "more": False, "dry_run": True}
        more = limit is not None and len(ids) > limit
        ids = ids[:limit] if limit is not None else ids
        deleted, kept = [], []
        for workflow_id in ids:
            try:
                self.engine.delete([workflow_id])
                deleted.append(workflow_id)
            except (RefusedError, NotFoundError) as exc:
                kept.append({"id": workflow_id, "reason": str(exc)})
        return {"deleted": deleted, "kept": kept, "more": more}

    # ------------------------------------------------------------------ logs

    def _log_files(
        self,
        workflow_id: str,
        task: str | None,
        retry_id: int | None,
        *,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> list[LogFile]:
        """The ``task.log`` of every attempt asked for, to be read from its start; with
        ``failed_only``, only of the attempts that failed (FAILED*, or RESCHEDULED: retried
        after a failure); the runner keeps a task's stdout and stderr in one stream, so
        ``logs --error`` means the failed attempts. Without ``verbose`` the files leave out
        the runner's isolation detail lines (``[task][detail]``, issue 28).

        Raises:
            NotFoundError: the workflow has no task ``task``.
        """
        state = self.engine.state(workflow_id)
        if task is not None and task not in state.tasks:
            names = ", ".join(state.tasks)
            raise NotFoundError(f"workflow {workflow_id} has no task {task!r}; tasks: {names}")
        files = []
        for name, ts in state.tasks.items():
            if task is not None and name != task:
                continue
            retries = [retry_id] if retry_id is not None else range(ts.retry_id + 1)
            if failed_only:
                retries = [r for r in retries if r in _failed_attempts(ts)]
            files += [
                LogFile(
                    name,
                    r,
                    self.engine.run_dir(workflow_id, name, r) / "task.log",
                    hide_detail=not verbose,
                )
                for r in retries
            ]
        return files

    def logs(
        self,
        workflow_id: str,
        user: User,
        *,
        task: str | None = None,
        retry_id: int | None = None,
        last_lines: int | None = None,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> Iterator[LogLine]:
        """Log lines of the workflow (all tasks merged by time), or of one task/attempt;
        with ``last_lines``, only the last that many (found from the files' ends).

        Who may read and what exists is checked now; the lines are read as the iterator is
        consumed, with bounded memory (``trainyard.server.logs``), up to where the files
        ended at this call.

        Raises:
            NotFoundError: no such workflow or task.
            ForbiddenError: another user's workflow and ``user`` is no admin.
        """
        self._readable(workflow_id, user)
        files = self._log_files(
            workflow_id, task, retry_id, failed_only=failed_only, verbose=verbose
        )
        ends = {f.path: file_size(f.path) for f in files}
        skip = _start_at_last(files, ends, last_lines, complete_only=False)
        return read_merged(files, ends, follow=False, skip=skip)

    def follow_logs(
        self,
        workflow_id: str,
        user: User,
        *,
        task: str | None = None,
        retry_id: int | None = None,
        last_lines: int | None = None,
        failed_only: bool = False,
        verbose: bool = False,
        poll_s: float = 0.2,
    ) -> Iterator[LogLine | None]:
        """Log lines as they are written, until the workflow ends and its logs are drained
        (a blocking iterator over ``open_follow``'s cursor, for callers with a thread of
        their own; the server's routes drive the cursor from async code instead).

        ``FLUSH`` (None) comes before each wait of ``poll_s``, so that a caller batching
        lines sends what it has.

        Raises:
            NotFoundError, ForbiddenError: as ``logs``.
        """
        cursor = self.open_follow(
            workflow_id,
            user,
            task=task,
            retry_id=retry_id,
            last_lines=last_lines,
            failed_only=failed_only,
            verbose=verbose,
        )
        return _follow_blocking(cursor, poll_s)

    def open_follow(
        self,
        workflow_id: str,
        user: User,
        *,
        task: str | None = None,
        retry_id: int | None = None,
        last_lines: int | None = None,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> LogCursor:
        """A cursor that follows the workflow's logs step by step (``LogCursor.read``): the
        lines already written first (only the last ``last_lines`` of them when given, merged
        by time), then every new line as it appears, until the workflow ended and its logs
        are drained. Who may read and what exists is checked now, before any line (an HTTP
        error, not a broken stream).

        Raises:
            NotFoundError, ForbiddenError: as ``logs``.
        """
        self._readable(workflow_id, user)
        self._log_files(workflow_id, task, retry_id)
        return LogCursor(self, workflow_id, task, retry_id, last_lines, failed_only, verbose)

    # ------------------------------------------------------------------ pools

    def pools(self) -> list[dict[str, Any]]:
        """Every pool with its backend and node count."""
        self.refresh_pools()
        return [
            {
                "name": p.name,
                "backend": p.backend,
                "nodes": len(p.nodes),
                "platforms": sorted(p.platforms),
                "max_retries": p.max_retries,
            }
            for p in self.engine.pools.values()
        ]

    def resources(self, pool: str | None = None) -> list[dict[str, Any]]:
        """Every node (of ``pool`` when given) with capacity, used and free (cpu, gpu,
        memory_bytes, storage_bytes), and ``virtual``: true when the capacity is declared,
        not measured (a pool without ``strict: true``, such as the rehearsal pool ``local``,
        whose virtual nodes share this machine). Raises NotFoundError for an unknown pool."""
        self.refresh_pools()
        pools = [self.pool(pool)] if pool else list(self.engine.pools.values())
        rows = []
        for p in pools:
            usage = self.engine.usage(p.name)
            rows += [_node_json(p, node, usage.get(node.name)) for node in p.nodes]
        return rows


FOLLOW_BATCH_BYTES = 64 * 1024
"""Bytes of lines one follow reads ahead (all its files together): what each waiting
follower may hold, so that hundreds of them stay within tens of MB."""


class LogCursor:
    """One follow of a workflow's logs, read in steps (``read``) by whoever drives it.

    Not thread-safe: one caller at a time (the server's async routes run each ``read`` in
    a worker thread and wait between reads without one). Each step looks at the workflow's
    state once, reads what the files gained since the last step, and never sleeps.
    """

    def __init__(
        self,
        service: Service,
        workflow_id: str,
        task: str | None,
        retry_id: int | None,
        last_lines: int | None,
        failed_only: bool,
        verbose: bool = False,
    ) -> None:
        self._service = service
        self._where = (workflow_id, task, retry_id, failed_only, verbose)
        self._last_lines = last_lines
        self._known: dict[Path, LogFile] = {}
        self._pass: Iterator[LogLine] | None = None
        self._final = False
        self._first = True
        self.ended = False
        """True once the workflow ended and every line was returned."""

    def read(self, max_bytes: int = FOLLOW_BATCH_BYTES) -> tuple[list[LogLine], bool]:
        """The next lines, about ``max_bytes`` of text at most (at least one line when
        there is one).

        Returns:
            ``(lines, wait)``: ``wait`` is true when the files hold nothing more now (the
            caller should wait a poll interval before the next ``read``); false when more
            may be read at once, or the follow ended (``ended``).
        """
        if self.ended:
            return [], False
        if self._pass is None:
            self._pass = self._start_pass()
        lines: list[LogLine] = []
        size = 0
        for line in self._pass:
            lines.append(line)
            size += len(line.text) + 1
            if size >= max_bytes:
                return lines, False
        self._pass = None
        self.ended = self._final
        return lines, not self.ended

    def begin(self) -> bool:
        """Place the cursor where its first pass would start (its last ``last_lines``
        lines, found from the files' ends), reading no line; True when it is then at rest
        (``at_rest``), so that a shared reader may serve it from there. False, leaving the
        first pass to ``read``: the workflow ended, or the last lines of several files must
        be merged to count them (some would be skipped)."""
        if not self._first:
            return self.at_rest()
        if self._service.engine.state(self._where[0]).status.is_terminal():
            return False
        files = self._files()
        ends = {f.path: file_size(f.path) for f in files}
        if _start_at_last(files, ends, self._last_lines, complete_only=True):
            for log in files:
                log.offset = 0
            return False
        self._first = False
        return self.at_rest()

    @property
    def key(self) -> tuple[str, str | None, int | None, bool, bool]:
        """What is followed: ``(workflow_id, task, retry_id, failed_only, verbose)``;
        followers with the same key read the same lines (``streams.LogFeeds`` shares one
        reader)."""
        return self._where

    def at_rest(self) -> bool:
        """Whether a shared reader may take over from here: the first pass is done, no
        pass is in progress, no long line is half skipped and the follow has not ended."""
        return (
            not self._first
            and self._pass is None
            and not self.ended
            and not any(f.skipping for f in self._known.values())
        )

    def offsets(self) -> dict[tuple[str, int], int]:
        """How far each attempt's log was read: ``{(task, retry_id): byte offset}``."""
        return {(f.task, f.retry_id): f.offset for f in self._known.values()}

    def paths(self) -> dict[tuple[str, int], Path]:
        """Each known attempt's ``task.log``: ``{(task, retry_id): path}``."""
        return {(f.task, f.retry_id): f.path for f in self._known.values()}

    def advance(self, task: str, retry_id: int, path: Path, offset: int) -> None:
        """Record that the log of ``(task, retry_id)`` at ``path`` was delivered up to
        ``offset`` by someone else (a shared reader), so that this cursor's next pass goes
        on from there. Only while ``at_rest``."""
        known = self._known.get(path)
        if known is None:
            known = self._known[path] = LogFile(
                task, retry_id, path, hide_detail=not self._where[4]
            )
        known.offset = offset

    def copy(self) -> LogCursor:
        """A new cursor of the same key at the same offsets (its first pass done)."""
        twin = LogCursor(self._service, *self._where[:3], None, self._where[3], self._where[4])
        twin._first = False
        twin._known = {
            p: LogFile(f.task, f.retry_id, p, f.offset, hide_detail=f.hide_detail)
            for p, f in self._known.items()
        }
        return twin

    def _files(self) -> list[LogFile]:
        """The followed attempts' logs now, each at the offset this cursor reached."""
        workflow_id, task, retry_id, failed_only, verbose = self._where
        return [
            self._known.setdefault(f.path, f)
            for f in self._service._log_files(
                workflow_id, task, retry_id, failed_only=failed_only, verbose=verbose
            )
        ]

    def _start_pass(self) -> Iterator[LogLine]:
        """The lines the files gained since the last pass, up to their sizes now."""
        self._final = self._service.engine.state(self._where[0]).status.is_terminal()
        files = self._files()
        ends = {f.path: file_size(f.path) for f in files}
        skip = 0
        if self._first:
            skip = _start_at_last(files, ends, self._last_lines, complete_only=not self._final)
            self._first = False
        return read_merged(
            files, ends, follow=not self._final, skip=skip, batch_bytes=FOLLOW_BATCH_BYTES
        )


def _follow_blocking(cursor: LogCursor, poll_s: float) -> Iterator[LogLine | None]:
    """``cursor``'s lines as one blocking iterator: ``FLUSH`` and a sleep of ``poll_s``
    whenever it has nothing more now."""
    while not cursor.ended:
        lines, wait = cursor.read()
        yield from lines
        if wait:
            yield FLUSH
            time.sleep(poll_s)


def _start_at_last(
    files: list[LogFile], ends: dict[Path, int], count: int | None, *, complete_only: bool
) -> int:
    """With ``count``: move each file's offset to where its last ``count`` lines start (read
    from its end; lines the file hides do not count) and return how many lines of the merge
    to skip so that ``count`` are left; 0 (and offsets kept) without it."""
    if not count:
        return 0
    total = 0
    for log in files:
        log.offset, lines = tail_offset(
            log.path,
            ends[log.path],
            count,
            complete_only=complete_only,
            hide_task=log.task if log.hide_detail else None,
        )
        total += lines
    return max(0, total - count)


def _mtime_ns(path: Path | None) -> int | None:
    """``path``'s modification time (ns), None when there is no such file."""
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except FileNotFoundError:
        return None


def _attempt_failed(status: Status) -> bool:
    """An attempt that failed: FAILED*, or RESCHEDULED (it failed and a new attempt runs)."""
    return status.is_failed() or status is Status.RESCHEDULED


def _failed_attempts(ts: m.TaskState) -> set[int]:
    """The retry ids of ``ts``'s attempts that failed (earlier ones and the current)."""
    failed = {a.retry_id for a in ts.history if _attempt_failed(a.status)}
    return failed | ({ts.retry_id} if _attempt_failed(ts.status) else set())


def _check_list_filters(statuses: list[str] | None, count: int | None) -> None:
    """Refuse an unknown workflow status or a count below 1 (BadArgumentError, HTTP 400)."""
    valid = [s.value for s in WorkflowStatus]
    unknown = [s for s in statuses or [] if s not in valid]
    if unknown:
        raise BadArgumentError(
            f"unknown workflow status {', '.join(map(repr, unknown))}; statuses: {', '.join(valid)}"
        )
    if count is not None and count < 1:
        raise BadArgumentError(f"count must be at least 1, not {count}")


def _node_json(pool: Pool, node: Any, used: dict[str, Any] | None) -> dict[str, Any]:
    used = used or {"cpu": 0.0, "gpu": 0, "memory_bytes": 0, "storage_bytes": 0}
    capacity = {
        "cpu": node.cpu,
        "gpu": node.gpu,
        "memory_bytes": node.memory_bytes,
        "storage_bytes": node.storage_bytes,
    }
    free = {k: capacity[k] - used[k] for k in capacity}
    return {
        "pool": pool.name,
        "node": node.name,
        "platform": node.platform,
        "capacity": capacity,
        "used": used,
        "free": free,
        "virtual": not pool.strict,
    }


def _summary_json(record: WorkflowRecord) -> WorkflowSummary:
    return {
        "id": record.id,
        "name": record.name,
        "status": record.status,
        "pool": record.pool,
        "submitted_by": record.submitted_by,
        "labels": record.labels,
        "submit_time": iso(record.submit_time_s),
        "end_time": iso(record.end_time_s),
    }


def _event_message(event: Any, attempt: m.TaskState | m.TaskAttempt) -> str | None:
    """A runner event's message; the exit of an attempt the engine had already ended with
    a reason (a task stopped because its lead finished) says that reason, as the store does,
    not the runner's "stopped by SIGTERM"."""
    ended_s = attempt.end_time_s
    if (
        event.kind == "EXITED"
        and attempt.failure_reason
        and ended_s is not None
        and event.time_s >= ended_s
    ):
        return attempt.failure_reason
    return event.message or None


def _event_row(
    time_s: float, task: str, retry_id: int, event: str, exit_code: int | None, message: str | None
) -> dict[str, Any]:
    return {
        "time": iso(time_s),
        "task": task,
        "retry_id": retry_id,
        "event": event,
        "exit_code": exit_code,
        "message": message,
    }


def _row_summary_json(row: dict[str, Any]) -> WorkflowSummary:
    """A ``Store.page_workflows`` row in ``_summary_json``'s shape."""
    return {
        "id": row["id"],
        "name": row["name"],
        "status": row["status"],
        "pool": row["pool"],
        "submitted_by": row["submitted_by"],
        "labels": row["labels"] or {},
        "submit_time": iso(row["submit_time_s"]),
        "end_time": iso(row["end_time_s"]),
    }


def _attempt_json(a: m.TaskAttempt) -> AttemptAnswer:
    return {
        "retry_id": a.retry_id,
        "status": a.status.value,
        "exit_code": a.exit_code,
        "node": a.node,
        "start_time": iso(a.start_time_s),
        "end_time": iso(a.end_time_s),
        "failure_reason": a.failure_reason,
        "log_tail": list(a.log_tail),
    }


def _task_json(t: m.TaskState, verbose: bool) -> TaskAnswer:
    out: TaskAnswer = {
        "name": t.name,
        "status": t.status.value,
        "lead": t.lead,
        "retry_id": t.retry_id,
        "exit_code": t.exit_code,
        "node": t.node,
        "start_time": iso(t.start_time_s),
        "end_time": iso(t.end_time_s),
        "failure_reason": t.failure_reason,
        "log_tail": list(t.log_tail),
    }
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
    return {
        "spec_path": req.spec_name,
        "files": req.files,
        "set_env": specapi.parse_env(req.set_env),
        "labels": req.labels or None,
    }


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


def _add_outputs(data: WorkflowAnswer, record: WorkflowRecord, run_dir: Any) -> None:
    """Give every task its ``output_dir`` (the ``{{output}}`` folder of its current attempt)
    and ``outputs`` (where the spec uploads it after success, ``{{workflow_id}}`` resolved as
    the runner resolves it: the URL the files are at)."""
    targets = _output_targets(record)
    tokens = {"workflow_id": record.id}
    for group in data["groups"]:
        for task in group["tasks"]:
            task["output_dir"] = str(run_dir(task["name"], task["retry_id"]) / "output")
            task["outputs"] = [substitute_tokens(t, tokens) for t in targets.get(task["name"], [])]


def _workflow_json(record: WorkflowRecord, state: m.WorkflowState, verbose: bool) -> WorkflowAnswer:
    groups: list[GroupAnswer] = [
        {
            "name": g.name,
            "status": g.status.value,
            "tasks": [_task_json(state.tasks[t], verbose) for t in g.tasks],
        }
        for g in state.groups.values()
    ]
    why = reasons_json(state)
    return {
        **_summary_json(record),
        "status": state.status.value,
        "groups": groups,
        "failure": why["failure"],
        "waiting": why["waiting"],
    }


def reasons_json(state: m.WorkflowState) -> dict[str, Any]:
    """Why the workflow failed and why its groups wait, from the stored state
    (``engine.reasons``): ``{"failure": None | {"task", "group", "retry_id", "status",
    "exit_code", "reason", "log_tail": [lines], "end_time"}, "waiting": [{"group",
    "status", "reason", "since"}]}`` (times ISO 8601 UTC)."""
    failure = reasons.failure_of(state)
    if failure is not None:
        failure["end_time"] = iso(failure.pop("end_time_s"))
    waiting = [
        {**{k: v for k, v in w.items() if k != "since_s"}, "since": iso(w["since_s"])}
        for w in reasons.waits_of(state)
    ]  # ``since`` only, as documented
    return {"failure": failure, "waiting": waiting}


def spec_error_json(exc: SpecError) -> list[dict[str, Any]]:
    """SpecError as JSON rows (for the API's 422 answer)."""
    return [
        {"path": p.path, "message": p.message, "line": p.line, "file": p.file} for p in exc.problems
    ]


def spec_error_from_json(rows: list[dict[str, Any]]) -> SpecError:
    """The inverse of ``spec_error_json`` (the CLI rebuilds the error it prints)."""
    return SpecError([SpecProblem(**row) for row in rows])


def _attempt_status(task: m.TaskState, retry_id: int, workflow_id: str) -> Status:
    """The status of attempt ``retry_id`` of ``task`` (NotFoundError if it never was)."""
    if retry_id == task.retry_id:
        return task.status
    for attempt in task.history:
        if attempt.retry_id == retry_id:
            return attempt.status
    raise NotFoundError(
        f"task {task.name} of workflow {workflow_id} has no retry {retry_id} "
        f"(latest: {task.retry_id})"
    )
