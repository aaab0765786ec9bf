"""Carrying out the state machine's actions: queue a gang, start it on its backend (a retry
held until its stopped earlier attempts ended), stop attempts, release placements.

``ActionRunner`` works on the shared ``EngineCore``; it owns the attempts being stopped and
the retry starts held back for them. Each start that fails becomes an event
(``GroupStartFailed``) for the next round of the step; see docs/engine.md.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from trainyard.backends.base import Backend, TaskKey, TaskLaunch
from trainyard.engine import machine as m
from trainyard.engine.core import EngineCore
from trainyard.engine.launch import InputUnavailable, LaunchContext, build_launches
from trainyard.engine.live import RETRY_START_WAIT_S, DeferredStart, still_to_start
from trainyard.errors import BackendError, ConfigError, NotFoundError
from trainyard.spec.fields import name_key
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status

__all__ = ["ActionRunner"]

log = logging.getLogger("trainyard.engine")


class ActionRunner:
    """Carries out ``machine.Action``s on the schedulers and backends of ``core`` (callers
    hold ``core.lock``). What the other phases use of it: ``carry_out``, ``start_deferred``
    and ``note_ended`` (the step loop), ``enqueue``, ``start_when_ready`` and
    ``note_stopping`` (recovery), ``kill`` and ``upstream_output`` (the facade)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._stopping: set[TaskKey] = set()  # stops sent, no ending fact seen yet
        self._ended_now: set[TaskKey] = set()  # ending facts of the step under way
        self._deferred: list[DeferredStart] = []  # retry starts held for stopping attempts
        # Each submitter's DATA credentials, read once per ``carry_out`` (None outside one):
        # a query and a decryption per gang made a step of 1,000 one-task gangs ~14 ms a gang.
        self._data_credentials_read: dict[str, list[dict[str, str]]] | None = None

    def carry_out(self, actions: list[tuple[str, m.Action]]) -> dict[str, list[m.Event]]:
        """Carry out ``actions`` in order; a run of consecutive starts goes to the backends
        together (``_start_many``), every other action after the starts before it. Returns
        the events they yield (a start that failed), by workflow."""
        follow_up: dict[str, list[m.Event]] = {}
        starts: list[tuple[str, m.StartTasks]] = []
        self._data_credentials_read = {}
        try:
            for wid, action in actions:
                if isinstance(action, m.StartTasks):
                    starts.append((wid, action))
                    continue
                _add_events(follow_up, self._start_many(starts))
                starts = []
                _add_events(follow_up, [(wid, self._carry_out_one(wid, action))])
            _add_events(follow_up, self._start_many(starts))
        finally:
            self._data_credentials_read = None
        return follow_up

    def note_ended(self, keys: set[TaskKey]) -> None:
        """The attempts whose ending facts the step under way applies: no longer stopping,
        and not to be marked stopping by a stop of this step."""
        self._ended_now = keys
        self._stopping -= keys

    def note_stopping(self, keys: list[TaskKey]) -> None:
        """Stops were sent for ``keys`` (recovery); a retry of theirs waits until they end."""
        self._stopping.update(keys)

    def kill(self, wid: str) -> None:
        """Stop at once (``Backend.kill``) the attempts of the workflow still stopping."""
        keys = [k for k in self._stopping if k.workflow_id == wid]
        if not keys:
            return
        try:
            backend = self.core.backend_of(wid)
        except (BackendError, ConfigError):
            return
        backend.kill(keys)

    def _start_many(
        self,
        starts: list[tuple[str, m.StartTasks]],
    ) -> list[tuple[str, m.Event | None]]:
        """Start these gangs (retries held back as ``start_when_ready`` holds them), one
        ``start_group`` each, in order (not batched: docs/engine.md "Starts one gang at a
        time"). Each gang's outcome is what ``_start`` would give it: None, or
        GroupStartFailed."""
        ready: list[tuple[str, m.StartTasks]] = []
        for wid, action in starts:
            if self._earlier_stopping(wid, action):
                self.start_when_ready(wid, action)  # held back (a DeferredStart)
            else:
                ready.append((wid, action))
        by_backend: dict[int, list[tuple[int, Backend[Any], list[TaskLaunch]]]] = {}
        outcome: dict[int, m.Event | None] = {}
        for index, (wid, action) in enumerate(ready):
            made = self._launches(wid, action)
            if isinstance(made, tuple):
                by_backend.setdefault(id(made[0]), []).append((index, *made))
            else:
                outcome[index] = made
        for gangs in by_backend.values():
            for (index, backend, launches), error in zip(gangs, _start_groups(gangs), strict=True):
                wid, action = ready[index]
                outcome[index] = self._start_failed(wid, action, backend, launches, error)
        return [(wid, outcome.get(index)) for index, (wid, _action) in enumerate(ready)]

    def _carry_out_one(self, wid: str, action: m.Action) -> m.Event | None:
        """Carry out one action; returns the event it yields (a start that failed)."""
        if isinstance(action, m.RequestPlacement):
            self.enqueue(wid, action.group)
        elif isinstance(action, m.StartTasks):
            return self.start_when_ready(wid, action)
        elif isinstance(action, m.StopTasks):
            for task, retry_id in action.tasks if action.reason else ():
                self.core.task_log(
                    TaskKey(wid, task, retry_id), f"{action.reason}: the task is stopped"
                )
            self._stop(wid, action.tasks)
        elif isinstance(action, m.ReleaseGroup):
            self.core.scheduler_of(wid).release((wid, action.group))
        return None

    def enqueue(self, wid: str, group: str) -> None:
        """Queue the gang; its age (for backfill) counts from when it went SCHEDULING, also
        across an engine restart."""
        live = self.core.live.get(wid)
        if live is not None:
            since_s = live.state.groups[group].scheduling_since_s
            waited_s = max(0.0, time.time() - since_s) if since_s is not None else 0.0
            self.core.scheduler_of(wid).enqueue(
                (wid, group),
                self.core.requests(live, group),
                now_s=time.monotonic() - waited_s,
                rank=live.rank,
            )

    def start_when_ready(
        self, wid: str, action: m.StartTasks, only: frozenset[TaskKey] | None = None
    ) -> m.Event | None:
        """Start ``action``'s attempts (``only`` those keys, when given) now, or hold the
        start back (``start_deferred`` makes it) while earlier attempts of its tasks are
        being stopped. Returns GroupStartFailed when the backend refuses, else None."""
        waiting = self._earlier_stopping(wid, action)
        if waiting:
            deadline = time.monotonic() + RETRY_START_WAIT_S
            self._deferred.append(DeferredStart(wid, action, waiting, deadline, only))
            return None
        return self._start(wid, action, only)

    def _start(
        self, wid: str, action: m.StartTasks, only: frozenset[TaskKey] | None = None
    ) -> m.Event | None:
        """Start ``action``'s attempts (``only`` those keys, when given; the launches are
        built for the whole action all the same, so a gang's barrier is the same). Returns
        GroupStartFailed when the backend refuses, else None."""
        made = self._launches(wid, action, only)
        if not isinstance(made, tuple):
            return made
        backend, launches = made
        error: BackendError | None = None
        try:
            backend.start_group(launches)
        except BackendError as exc:
            error = exc
        return self._start_failed(wid, action, backend, launches, error)

    def _launches(
        self,
        wid: str,
        action: m.StartTasks,
        only: frozenset[TaskKey] | None = None,
    ) -> tuple[Backend[Any], list[TaskLaunch]] | m.Event | None:
        """The backend and the launches of ``action``'s start (``only`` those keys, when
        given); None for a workflow no longer driven, GroupStartFailed when its pool has no
        usable backend."""
        core = self.core
        live = core.live.get(wid)
        if live is None:
            return None
        try:
            backend = core.backend_of(wid)
        except (BackendError, ConfigError) as exc:  # e.g. a pool option its backend refuses
            reason = f"the pool {core.pool_of(wid).name!r} has no usable backend: {exc}"
            log.warning("workflow %s group %s did not start: %s", wid, action.group, reason)
            return m.GroupStartFailed(time.time(), action.group, reason, backend_error=True)
        placements = core.scheduler_of(wid).placement_of((wid, action.group))
        ctx = LaunchContext(
            home=core.home,
            workflow_id=wid,
            spec=live.spec,
            state=live.state,
            placements=placements,
            backend=backend,
            pool=core.pool_of(wid),
            upstream_output=self.upstream_output,
            user=live.user,
            credentials=self._credentials_of(live.user, live.spec, action.group),
            data_credentials=self._data_credentials_of(live.user),
            registry_credentials=self._registry_credentials_of(live.user, live.spec, action.group),
        )
        launches = build_launches(ctx, action)
        if only is not None:
            launches = [launch for launch in launches if launch.key in only]
        return backend, launches

    def _data_credentials_of(self, user: str | None) -> list[dict[str, str]]:
        """The submitter's DATA credentials (``CredentialVault.data_payloads``), read once
        per ``carry_out`` and user."""
        if not user:
            return []
        read = self._data_credentials_read
        if read is None:
            return self.core.credentials.data_payloads(user)
        if user not in read:
            read[user] = self.core.credentials.data_payloads(user)
        return read[user]

    def _registry_credentials_of(
        self, user: str | None, spec: WorkflowSpec, group: str
    ) -> list[dict[str, str]]:
        """The submitter's REGISTRY credentials, when a task of the group names an image
        (decrypted only then)."""
        images = [t.image for g in spec.groups if g.name == group for t in g.tasks if t.image]
        if not images or user is None:
            return []
        return self.core.credentials.registry_payloads(user)

    def _credentials_of(
        self, user: str | None, spec: WorkflowSpec, group: str
    ) -> dict[str, tuple[str, dict[str, str]]]:
        """The submitter's credentials that the group's tasks name, decrypted (``{name:
        (type, payload)}``); a name they no longer have is absent (the runner then fails
        the task with OSMO's words)."""
        names = [n for g in spec.groups if g.name == group for t in g.tasks for n in t.credentials]
        if not names or user is None:
            return {}
        return self.core.credentials.payloads(user, names)

    def _start_failed(
        self,
        wid: str,
        action: m.StartTasks,
        backend: Backend[Any],
        launches: list[TaskLaunch],
        error: BackendError | None,
    ) -> m.Event | None:
        """What a start's outcome yields: None when it started; else the reason in each
        task's log and GroupStartFailed."""
        if error is None:
            return None
        log.warning("workflow %s group %s did not start: %s", wid, action.group, error)
        for launch in launches:
            self.core.task_log(
                launch.key, f"the {backend.name} backend could not start the task: {error}"
            )
        return m.GroupStartFailed(time.time(), action.group, str(error), backend_error=True)

    def _stop(self, wid: str, tasks: tuple[tuple[str, int], ...]) -> None:
        """Stop these attempts of the workflow; they count as stopping until they end."""
        keys = [TaskKey(wid, task, retry) for task, retry in tasks]
        try:
            backend = self.core.backend_of(wid)
        except (BackendError, ConfigError):
            return  # no backend could be made, so none of these ever started
        self._stopping.update(k for k in keys if k not in self._ended_now)
        backend.stop(keys)

    def _earlier_stopping(self, wid: str, action: m.StartTasks) -> set[TaskKey]:
        """Earlier attempts of ``action``'s tasks that were stopped and have not ended."""
        newest = dict(action.tasks)
        return {
            k
            for k in self._stopping
            if k.workflow_id == wid and k.task in newest and k.retry_id < newest[k.task]
        }

    def start_deferred(self) -> list[tuple[str, m.Event]]:
        """Make the held retry starts whose stopped attempts have ended (or waited too long);
        returns the events of those the backend refused."""
        now, events, held = time.monotonic(), [], []
        for item in self._deferred:
            item.waiting &= self._stopping
            if item.waiting and now < item.deadline:
                held.append(item)
                continue
            if item.waiting:
                log.warning(
                    "workflow %s group %s: starting the retry although %d stopped "
                    "attempt(s) did not end within %.0f s",
                    item.workflow_id,
                    item.action.group,
                    len(item.waiting),
                    RETRY_START_WAIT_S,
                )
            live = self.core.live.get(item.workflow_id)
            keys = (
                item.only
                if item.only is not None
                else [TaskKey(item.workflow_id, t, r) for t, r in item.action.tasks]
            )
            keys = frozenset(k for k in keys if live and still_to_start(live.state, k))
            event = self._start(item.workflow_id, item.action, only=keys) if keys else None
            if event is not None:
                events.append((item.workflow_id, event))
        self._deferred = held
        return events

    def upstream_output(self, ref: str, current_wid: str) -> Path:
        """Output folder of the completed attempt of a task (``TASK`` or ``WORKFLOW_ID:TASK``).

        A task of this workflow has COMPLETED when its downstream starts (the DAG says so).
        A task of another workflow is read only if its last attempt COMPLETED; the
        server already refused, at submit, an unknown workflow or another user's.

        Raises:
            NotFoundError: this workflow has no such task (a bug: the spec checks refuse it).
            InputUnavailable: the other workflow or task is gone, or it did not COMPLETE; the
                task's input then fails with exit code 2010 and the reason in its log.
        """
        core = self.core
        wid, _, task = ref.rpartition(":")
        if not wid or wid == current_wid:
            state = core.state(current_wid)
            if task not in state.tasks:
                raise NotFoundError(f"workflow {current_wid} has no task {task!r}")
            return core.run_dir(current_wid, task, state.tasks[task].retry_id) / "output"
        try:
            state = core.state(wid)
        except NotFoundError:
            raise InputUnavailable(f"no workflow {wid}") from None
        found = next((t for t in state.tasks.values() if name_key(t.name) == name_key(task)), None)
        if found is None:
            raise InputUnavailable(f"workflow {wid} has no task {task}")
        if found.status is not Status.COMPLETED:
            raise InputUnavailable(
                f"task {found.name} of workflow {wid} is {found.status.value}, not COMPLETED"
            )
        return core.run_dir(wid, found.name, found.retry_id) / "output"


def _add_events(into: dict[str, list[m.Event]], events: list[tuple[str, m.Event | None]]) -> None:
    """Append each event that is not None to its workflow's list in ``into``."""
    for wid, event in events:
        if event is not None:
            into.setdefault(wid, []).append(event)


def _start_groups(
    gangs: list[tuple[int, Backend[Any], list[TaskLaunch]]],
) -> list[BackendError | None]:
    """Start ``gangs`` (all of one backend), one ``start_group`` each: the backend answers
    each gang before the next is handed over, which paces the local launcher's runner threads
    (a batch of up to 32 tasks started at once made them contend: ``_start_many``). Returns
    each gang's error or None."""
    backend = gangs[0][1]
    errors: list[BackendError | None] = []
    for _index, _backend, launches in gangs:
        try:
            backend.start_group(launches)
            errors.append(None)
        except BackendError as exc:
            errors.append(exc)
    return errors
