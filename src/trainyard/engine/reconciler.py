"""The engine's API facade: ``Engine`` drives every unfinished workflow of one store, and
``Submission`` is a validated workflow ready to be stored and run.

``Engine`` holds the engine's phases, separate objects sharing one ``core.EngineCore``:
``actions.ActionRunner`` (carrying out the state machine's actions on backends),
``recovery.Recovery`` (after a restart), ``steploop.StepLoop`` (the step and its loop). How
they fit together: docs/engine.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard import backends
from trainyard.backends.base import Backend, TaskKey
from trainyard.engine import homestore, retention
from trainyard.engine import machine as m
from trainyard.engine.actions import ActionRunner
from trainyard.engine.core import EngineCore
from trainyard.engine.launch import LaunchContext, build_launches
from trainyard.engine.live import LiveWorkflow, rank_of
from trainyard.engine.plan import build_state, default_exit_actions_of
from trainyard.engine.recovery import Recovery
from trainyard.engine.scheduler import Placement, Scheduler, request_of
from trainyard.engine.serialize import state_from_dict, state_to_dict
from trainyard.engine.steploop import StepLoop
from trainyard.errors import RefusedError
from trainyard.pools import Pool
from trainyard.spec.api import reparse
from trainyard.spec.models import WorkflowSpec
from trainyard.status import WorkflowStatus
from trainyard.store import Store, WorkflowRecord

__all__ = ["Engine", "Submission"]

log = logging.getLogger("trainyard.engine")


@dataclass
class Submission:
    """A validated workflow ready to be stored and run.

    ``reparse``: the keyword arguments of ``spec.reparse`` (``spec_path``, ``files``,
    ``set_env``, ``labels``; JSON values) that turn ``spec_text``, the rendered text, back
    into ``spec``. When given, the text is the one copy of the spec that is stored, and
    ``spec`` is rebuilt from it after a restart; without it (``spec_text`` may then be
    anything), ``spec`` is stored as JSON beside the text.
    """

    spec: WorkflowSpec
    spec_text: str
    user: str
    pool: Pool
    labels: dict[str, str] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    reparse: dict[str, Any] | None = None


class Engine:
    """Drives every unfinished workflow of one store.

    Args:
        store: the store (the one truth).
        home: ``$TRAINYARD_HOME``; runs live under ``home/runs/<workflow>/<task>/<retry>``.
        pools: pools by name (default: ``backends.served.load_usable_pools()``).
        spec_loader: rebuilds a ``WorkflowSpec`` from a stored record's ``source`` after a
            restart.
        backend_factory: makes a pool's backend (default: ``backends.get_backend``).
        poll_interval_s: the tick: the longest time between two steps of ``run_forever``.

    Thread safety: public methods take one lock; ``run_forever`` calls ``step`` in a loop.
    On construction it resumes the store's unfinished workflows (``recovery``).

    Its phases (docs/engine.md): ``core`` (the shared state), ``actions``, ``recovery``,
    ``loop``.
    """

    def __init__(
        self,
        store: Store,
        home: Path,
        *,
        pools: dict[str, Pool] | None = None,
        spec_loader: Callable[[WorkflowRecord], WorkflowSpec] | None = None,
        backend_factory: Callable[[Pool, Path], Backend[Any]] | None = None,
        poll_interval_s: float = 0.05,
    ) -> None:
        self.core = EngineCore(
            store,
            home,
            pools=pools,
            spec_loader=spec_loader or _spec_from_source,
            backend_factory=backend_factory or _default_backend,
            poll_interval_s=poll_interval_s,
        )
        self.store = store
        self.home = home
        self.credentials = self.core.credentials
        """Users' credentials (``store.credentials``): handed to their tasks at launch."""
        self.actions = ActionRunner(self.core)
        self.recovery = Recovery(self.core, self.actions)
        self.loop = StepLoop(self.core, self.actions, self.recovery)
        homestore.bind_home(home, store)  # before anything of the home is used
        self.recovery.resume()

    @property
    def pools(self) -> dict[str, Pool]:
        """The pools served, by name (``replace_pools`` changes them)."""
        return self.core.pools

    def state(self, workflow_id: str) -> m.WorkflowState:
        """The current state (live or stored). Raises NotFoundError."""
        return self.core.state(workflow_id)

    def run_dir(self, workflow_id: str, task: str, retry_id: int) -> Path:
        """Folder of one task attempt (its log, events and sandbox state)."""
        return self.core.run_dir(workflow_id, task, retry_id)

    def wake(self) -> None:
        """Ask ``run_forever`` for a step now (``EngineCore.wake``). Returns at once."""
        self.core.wake()

    def step(self) -> None:
        """One pass of the loop (``StepLoop.step``)."""
        self.loop.step()

    def run_forever(self, stop: threading.Event) -> None:
        """Step until ``stop`` is set (``StepLoop.run_forever``)."""
        self.loop.run_forever(stop)

    def wait(self, workflow_id: str, timeout_s: float | None = None) -> WorkflowRecord:
        """Block until the workflow is finished; returns the stored record. Raises
        TimeoutError after ``timeout_s`` (``StepLoop.wait``)."""
        return self.loop.wait(workflow_id, timeout_s)

    def changes(self) -> int:
        """A counter that grows each time changed workflow states are stored; pass it to
        ``wait_for_change``."""
        return self.loop.changes()

    def wait_for_change(self, seen: int, timeout_s: float) -> bool:
        """Block until states were stored after ``changes()`` returned ``seen``, or
        ``timeout_s`` passed. Returns whether they were."""
        return self.loop.wait_for_change(seen, timeout_s)

    def submit(self, sub: Submission) -> WorkflowRecord:
        """Store a workflow; the loop's next ``step`` starts it (so a submit answers at once,
        without waiting for processes to start). Nothing is stored if building its state
        fails. Returns the stored record (status PENDING).

        Raises:
            RefusedError: a group can never be placed on the pool, even empty (its tasks
                cannot be packed onto the nodes together): it would wait forever.
        """
        self.pools.setdefault(sub.pool.name, sub.pool)
        _refuse_unplaceable(sub)

        def make_state(workflow_id: str) -> tuple[str, dict[str, Any]]:
            state = build_state(
                workflow_id,
                sub.spec,
                max_retries=sub.pool.max_retries,
                default_exit_actions=default_exit_actions_of(sub.pool),
                now_s=time.time(),
            )
            return state.status.value, state_to_dict(state)

        source = {**sub.source, **_spec_source(sub)}
        with self.core.lock:
            record = self.store.create_workflow(
                name=sub.spec.name,
                pool=sub.pool.name,
                submitted_by=sub.user,
                labels=sub.labels,
                spec_text=sub.spec_text,
                source=source,
                make_state=make_state,
            )
            self.core.track(
                record.id,
                LiveWorkflow(
                    state_from_dict(record.state),
                    sub.spec,
                    sub.pool.name,
                    sub.user,
                    rank_of(source),
                ),
            )
            self.core.post(record.id, m.Submitted(time.time()))
        self.wake()
        return record

    def preview(self, sub: Submission) -> list[tuple[str, str]]:
        """What submitting ``sub`` now would hand its pool's backend, for ``--dry-run``: per
        group, in plan order, the backend's own rendering of the group's first start
        (``dry_run(launches)``: the sbatch command and script on Slurm). Every task is on the
        first node it could get; ids and paths are those the next submission would get.
        Stores nothing, starts nothing. A group whose rendering is empty is left out."""
        backend = self.core.backends.get(sub.pool.name) or self.core.backend_factory(
            sub.pool, self.home
        )
        wid = self.store.peek_workflow_id(sub.spec.name)
        state = build_state(
            wid,
            sub.spec,
            max_retries=sub.pool.max_retries,
            default_exit_actions=default_exit_actions_of(sub.pool),
            now_s=time.time(),
        )
        previews = []
        for group in sub.spec.groups:
            names = [t.name for t in group.tasks]
            ctx = LaunchContext(
                home=self.home,
                workflow_id=wid,
                spec=sub.spec,
                state=state,
                placements={
                    n: Placement(sub.pool.nodes[0].name if sub.pool.nodes else "") for n in names
                },
                backend=backend,
                pool=sub.pool,
                upstream_output=_preview_output(self.home, wid, self.actions.upstream_output),
            )
            action = m.StartTasks(group.name, tuple((n, 0) for n in names))
            text = backend.dry_run(build_launches(ctx, action))
            if text:
                previews.append((group.name, text))
        return previews

    def cancel(self, workflow_id: str, *, force: bool = False) -> None:
        """Cancel a workflow: every process stopped, status FAILED_CANCELED. Idempotent;
        a finished workflow is left as it is. What the backend already saw happen is applied
        first (one ``step``): a workflow whose last task had already exited is recorded as it
        ended, not as cancelled. ``force`` (OSMO's ``workflow cancel --force``, "Force cancel
        task group pods in the cluster"): its attempts are stopped with no grace period
        (``Backend.kill``), those of an earlier cancel too. Raises NotFoundError for an
        unknown id."""
        with self.core.lock:
            if workflow_id in self.core.live:
                self.loop.step()
            if workflow_id not in self.core.live:
                self.store.get_workflow(workflow_id)  # raises NotFoundError
                return
            self.loop.apply_until_settled({workflow_id: [m.CancelRequested(time.time())]})
            if force:
                self.actions.kill(workflow_id)

    def restart(self, workflow_id: str) -> None:
        """Run a failed workflow's groups that did not complete again (new retry ids), keeping
        the completed ones and their outputs (OSMO ``workflow restart``).

        Raises:
            NotFoundError: unknown workflow.
            RefusedError: it is still running, or it COMPLETED (nothing to restart).
        """
        with self.core.lock:
            record = self.store.get_workflow(workflow_id)
            state = state_from_dict(record.state)
            if workflow_id in self.core.live or not state.status.is_terminal():
                raise RefusedError(
                    f"workflow {workflow_id} is {state.status}; only a finished, "
                    "failed workflow can be restarted"
                )
            if state.status is WorkflowStatus.COMPLETED:
                raise RefusedError(
                    f"workflow {workflow_id} COMPLETED; submit it again instead "
                    f"(`trainyard workflow submit {workflow_id}`)"
                )
            self.core.track(
                workflow_id,
                LiveWorkflow(
                    state,
                    self.core.spec_loader(record),
                    record.pool,
                    record.submitted_by,
                    rank_of(record.source),
                ),
            )
            self.loop.apply_until_settled({workflow_id: [m.Restarted(time.time())]})

    def delete(self, workflow_ids: list[str], *, keep_records: bool = False) -> None:
        """Delete ended workflows: their store rows (unless ``keep_records``) and their run
        folders (``home/runs/ID``: logs, task folders, ``{{output}}`` folders); never what
        they uploaded (datasets, output URLs). All of them or none: every id is checked
        before anything is removed. Who may delete is the caller's check.

        Raises:
            NotFoundError: an unknown id.
            RefusedError: one has not ended (cancel it first), an attempt of it still runs
                (it is stopped now; delete again once it is gone), or a file system is
                mounted in its run folder.
        """
        with self.core.lock:
            records = [self.store.get_workflow(wid) for wid in dict.fromkeys(workflow_ids)]
            running = [r for r in records if r.id in self.core.live or r.end_time_s is None]
            if running:
                r = running[0]
                raise RefusedError(
                    f"workflow {r.id} is {self.state(r.id).status.value}; only an ended workflow "
                    f"can be deleted: cancel it first (`trainyard workflow cancel {r.id}`)"
                )
            self._refuse_if_still_running(records)
            folders = [self.home / "runs" / r.id for r in records]
            mounted = [point for folder in folders for point in retention.mounts_under(folder)]
            if mounted:
                raise RefusedError(
                    f"file systems are mounted in run folders to delete "
                    f"({', '.join(mounted)}); unmount them first"
                )
            if not keep_records:
                self.store.delete_workflows([r.id for r in records])
                self._forget(records)
        for folder in folders:
            retention.remove_run_folder(folder)

    def _forget(self, records: list[WorkflowRecord]) -> None:
        """Let each pool's backend drop what it keeps of deleted workflows
        (``Backend.forget``)."""
        for record in records:
            if record.pool in self.pools:
                self.core.pool_backend(record.pool).forget(record.id)

    def _refuse_if_still_running(self, records: list[WorkflowRecord]) -> None:
        """Stop the attempts of these ended workflows that the backend still finds alive
        (``Recovery.stop_alive``, as after a restart), and refuse while there are any."""
        alive = self.recovery.stop_alive(records)
        if alive:
            raise RefusedError(
                "attempts of ended workflows still run and are being stopped now: "
                + ", ".join(f"{k.workflow_id}/{k.task}/{k.retry_id}" for k in alive)
                + "; delete again in a few seconds"
            )

    def usage(self, pool_name: str) -> dict[str, dict[str, Any]]:
        """What placed tasks use of each node of a pool: cpu, gpu, memory_bytes, storage_bytes."""
        with self.core.lock:
            scheduler = self.core.schedulers.get(pool_name)
            if scheduler is None:
                return {}
            return {
                name: {
                    "cpu": u.cpu,
                    "gpu": len(u.gpu_slots),
                    "memory_bytes": u.memory_bytes,
                    "storage_bytes": u.storage_bytes,
                }
                for name, u in scheduler.usage.items()
            }

    def task_entry(self, pool: str, key: TaskKey) -> dict[str, Any]:
        """How to enter the running attempt ``key`` on ``pool`` (``Backend.entry``:
        ``workflow exec``).

        Raises:
            RefusedError: the pool's backend cannot enter a task, or refuses (see the hook).
        """
        backend = self.core.backends.get(pool)  # a running task's pool has one; none is made here
        if backend is None:
            raise RefusedError(f"the engine runs nothing on pool {pool} now")
        return dict(backend.entry(key))

    def spec_of(self, record: WorkflowRecord) -> WorkflowSpec:
        """The parsed spec a stored workflow runs (as the engine rebuilds it after a restart).

        Raises:
            SpecError: the stored spec no longer parses.
        """
        return self.core.spec_loader(record)

    def replace_pools(self, pools: dict[str, Pool]) -> list[str]:
        """Serve ``pools`` from now on (``pools.yaml`` was edited), without a restart.

        A pool that unfinished workflows use keeps its current definition while any of them
        runs or waits (its scheduler holds their placements and its backend their
        processes): its name is returned, and the caller offers the edit again later. A
        pool that changed or went away and is idle loses its scheduler and its backend
        (closed), so the next workflow on it gets ones built from the new definition.

        Returns:
            The names of the pools kept as they were because workflows use them.
        """
        with self.core.lock:
            busy = {self.core.pool_name[wid] for wid in self.core.live}
            result, kept = dict(pools), []
            for name, old in self.pools.items():
                if pools.get(name) == old:
                    continue
                if name in busy:
                    result[name] = old
                    kept.append(name)
                    continue
                self.core.schedulers.pop(name, None)
                backend = self.core.backends.pop(name, None)
                if backend is not None:
                    backend.close()
            self.core.pools = result
            return sorted(kept)

    def close(self) -> None:
        """Close and forget backends (their tasks keep running; a new Engine recovers them)."""
        for backend in self.core.backends.values():
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing one must not keep the others open
                log.exception("closing backend %s", backend.name)
        self.core.backends.clear()


def _refuse_unplaceable(sub: Submission) -> None:
    """RefusedError for a gang that the scheduler could not place on the empty pool
    (``spec.poolfit`` already refused one that asks more than a node, or than the pool in
    total; this is the rest: tasks that fit one by one but cannot be packed together)."""
    scheduler = Scheduler(sub.pool)
    for group in sub.spec.groups:
        requests = {t.name: request_of(sub.spec.resource_of(t)) for t in group.tasks}
        if not scheduler.fits_empty(requests):
            raise RefusedError(
                f"group {group.name!r}: its {len(group.tasks)} tasks start together but "
                f"cannot be placed together on pool {sub.pool.name!r} even when it is "
                f"empty ({len(sub.pool.nodes)} nodes); ask for less per task or use fewer "
                "tasks"
            )


def _preview_output(
    home: Path, wid: str, upstream_output: Callable[[str, str], Path]
) -> Callable[[str, str], Path]:
    """``upstream_output`` for a preview of workflow ``wid``: its own tasks' outputs are
    where its first attempts will write them (under ``home``)."""

    def output(ref: str, current: str) -> Path:
        upstream, _, task = ref.rpartition(":")
        if upstream and upstream != wid:
            return upstream_output(ref, current)
        return home / "runs" / wid / task / "0" / "output"

    return output


def _default_backend(pool: Pool, home: Path) -> Backend[Any]:
    return backends.get_backend(pool, home)


def _spec_source(sub: Submission) -> dict[str, Any]:
    """What a stored workflow keeps to rebuild its spec: the arguments that parse its
    rendered text again (stored once, in the record's ``spec_text``), or the spec as JSON."""
    if sub.reparse is not None:
        return {"reparse": sub.reparse}
    return {"spec": sub.spec.model_dump(mode="json", by_alias=True)}


def _spec_from_source(record: WorkflowRecord) -> WorkflowSpec:
    if "spec" in record.source:
        return WorkflowSpec.model_validate(record.source["spec"])
    return reparse(record.spec_text, **record.source["reparse"]).workflow
