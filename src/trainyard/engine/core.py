"""The state every phase of the engine shares (one ``EngineCore``, held by reference by the
action runner, the recovery, the step loop and the ``Engine`` facade), and the plumbing: which
pool, scheduler and backend serve a workflow, where an attempt's run folder is, one line in a
task log. See docs/engine.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.backends.base import Backend, TaskFact, TaskKey
from trainyard.backends.served import load_usable_pools
from trainyard.engine import machine as m
from trainyard.engine.live import LiveWorkflow
from trainyard.engine.scheduler import Request, Scheduler, request_of
from trainyard.engine.serialize import state_from_dict
from trainyard.pools import Pool
from trainyard.runner.report import TaskLog
from trainyard.spec.models import WorkflowSpec
from trainyard.store import Store, WorkflowRecord
from trainyard.store.credentials import CredentialVault

__all__ = ["EngineCore"]

log = logging.getLogger("trainyard.engine")


class EngineCore:
    """The engine's shared state (see ``reconciler.Engine`` for the arguments) and its
    plumbing. Its fields are read and changed by every phase, under ``lock`` (the public
    methods of ``Engine`` and ``StepLoop.step`` take it; the phases' methods expect it held).
    """

    def __init__(
        self,
        store: Store,
        home: Path,
        *,
        pools: dict[str, Pool] | None = None,
        spec_loader: Callable[[WorkflowRecord], WorkflowSpec],
        backend_factory: Callable[[Pool, Path], Backend[Any]],
        poll_interval_s: float = 0.05,
    ) -> None:
        self.store = store
        self.home = home
        self.credentials = CredentialVault(store, home)
        """Users' credentials (``store.credentials``): handed to their tasks at launch."""
        self.pools = pools if pools is not None else load_usable_pools()
        self.poll_interval_s = poll_interval_s
        self.spec_loader = spec_loader
        self.backend_factory = backend_factory
        self.lock = threading.RLock()
        self.live: dict[str, LiveWorkflow] = {}
        """The workflows driven now (until their state is stored as ended), by id."""
        self.pool_name: dict[str, str] = {}
        self.schedulers: dict[str, Scheduler] = {}
        self.backends: dict[str, Backend[Any]] = {}
        self.pending: dict[str, list[m.Event]] = {}
        """Events accepted between steps (a submit), handled by the next step."""
        self.woken = threading.Event()
        """Set by ``wake`` (a submit, a backend's fact notification); cleared by the loop."""

    def state(self, workflow_id: str) -> m.WorkflowState:
        """The current state (live or stored). Raises NotFoundError."""
        with self.lock:
            if workflow_id in self.live:
                return self.live[workflow_id].state
        return state_from_dict(self.store.get_workflow(workflow_id).state)

    def run_dir(self, workflow_id: str, task: str, retry_id: int) -> Path:
        """Folder of one task attempt (its log, events and sandbox state)."""
        return self.home / "runs" / workflow_id / task / str(retry_id)

    def wake(self) -> None:
        """Ask ``run_forever`` for a step now rather than at its next tick (a submit, a
        backend's new fact). Returns at once; wake-ups before the step are one step, and a
        loop backing off after failed steps is not hurried."""
        self.woken.set()

    def track(self, wid: str, live: LiveWorkflow) -> None:
        """Drive ``wid`` from now on (until its state is stored as ended)."""
        self.live[wid] = live
        self.pool_name[wid] = live.pool

    def post(self, wid: str, event: m.Event) -> None:
        """Hand ``event`` to the next step (before the backends' facts of that step)."""
        self.pending.setdefault(wid, []).append(event)

    def pool_of(self, wid: str) -> Pool:
        """The pool a driven workflow runs on (KeyError for one not driven)."""
        return self.pools[self.pool_name[wid]]

    def scheduler_of(self, wid: str) -> Scheduler:
        """The scheduler of the workflow's pool, made on first use."""
        pool = self.pool_of(wid)
        if pool.name not in self.schedulers:
            self.schedulers[pool.name] = Scheduler(pool)
        return self.schedulers[pool.name]

    def backend_of(self, wid: str) -> Backend[Any]:
        """The backend of the workflow's pool (``pool_backend``)."""
        return self.pool_backend(self.pool_name[wid])

    def pool_backend(self, pool: str) -> Backend[Any]:
        """The pool's backend, made on first use and asked to wake the engine on new facts.

        Raises:
            BackendError, ConfigError: the backend cannot be made (e.g. an option it refuses).
        """
        if pool not in self.backends:
            backend = self.backend_factory(self.pools[pool], self.home)
            backend.notify_facts(self.wake)  # facts as they happen, where it can
            self.backends[pool] = backend
        return self.backends[pool]

    def poll(self) -> list[TaskFact]:
        """New facts of every backend made so far, in the order each reported them."""
        facts: list[TaskFact] = []
        for backend in list(self.backends.values()):
            facts += backend.poll()
        return facts

    def requests(self, live: LiveWorkflow, group: str) -> dict[str, Request]:
        """What each task of the workflow's ``group`` asks of a node, by task name."""
        spec_group = next(g for g in live.spec.groups if g.name == group)
        return {t.name: request_of(live.spec.resource_of(t)) for t in spec_group.tasks}

    def task_log(self, key: TaskKey, text: str) -> None:
        """Append one trainyard line to the attempt's task log (best effort: a log that
        cannot be written is reported in server.log, the reason stays in the store)."""
        try:
            run_dir = self.run_dir(key.workflow_id, key.task, key.retry_id)
            run_dir.mkdir(parents=True, exist_ok=True)
            task_log = TaskLog(run_dir, key.task)
            try:
                for line in text.splitlines() or [""]:  # sbatch's stderr may have several
                    task_log.runner(line)
            finally:
                task_log.close()
        except OSError as exc:
            log.warning(
                "cannot write the task log of %s/%s/%s: %s",
                key.workflow_id,
                key.task,
                key.retry_id,
                exc,
            )
