"""Specs in: render, parse and validate a spec against its pool, check what it names
(credentials, other workflows, datasets), and submit it (or show a dry run). What a
workflow was submitted with is kept so that it can be submitted again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard import spec as specapi
from trainyard.engine.reconciler import Engine, Submission
from trainyard.errors import ForbiddenError, NotFoundError, SpecError, SpecProblem
from trainyard.pools import Pool
from trainyard.server.answers import BackendShown, DryRunAnswer, SubmitAnswer
from trainyard.server.auth import User, refuse_task_token
from trainyard.server.ownership import readable
from trainyard.server.schema import SpecRequest
from trainyard.server.served_pools import ServedPools
from trainyard.spec.models import WorkflowSpec
from trainyard.store import WorkflowRecord


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


class Submissions:
    """Specs of one engine's workflows: validated, submitted, dry run, submitted again."""

    def __init__(self, engine: Engine, pools: ServedPools) -> None:
        self.engine = engine
        self._pools = pools

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
            chosen.append(self._pools.get(req.pool or spec_pool or req.default_pool))
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
            chosen[-1]
            if chosen
            else self._pools.get(req.pool or doc.workflow.pool or req.default_pool)
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
                    readable(self.engine.store, other, user)
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

    def submit(self, req: SpecRequest, user: User) -> SubmitAnswer:
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

    def dry_run(self, req: SpecRequest, user: User) -> DryRunAnswer:
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
        shown: list[BackendShown] = [
            {"group": g, "text": text} for g, text in self.engine.preview(sub)
        ]
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
    ) -> SubmitAnswer | DryRunAnswer:
        """Submit again the stored request of ``workflow_id`` (its ``--set`` values kept,
        those in ``overrides`` appended, so they win). With ``dry_run``, nothing is stored:
        the answer is ``dry_run``'s."""
        refuse_task_token(user, "submit a workflow")
        record = readable(self.engine.store, workflow_id, user)
        stored = _stored_request(record)
        if overrides is not None:
            stored.set += overrides.set
            stored.set_string += overrides.set_string
            stored.set_env += overrides.set_env
            stored.labels.update(overrides.labels)
            stored.pool = overrides.pool or stored.pool
            stored.priority = overrides.priority or stored.priority
        return self.dry_run(stored, user) if dry_run else self.submit(stored, user)

    def stored_spec(self, workflow_id: str, user: User, *, template: bool = False) -> str:
        """The spec a workflow was submitted with (OSMO ``workflow spec ID``): its rendered
        text (special tokens kept), or with ``template`` the spec as written (the same text
        when it had no template syntax).

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        record = readable(self.engine.store, workflow_id, user)
        if not template or "request" not in record.source:
            return record.spec_text
        return _stored_request(record).spec_text


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
