"""``KubernetesBackend``: starts a gang as pods, reports facts from a watch, stops attempts.

``start_group`` makes the workflow's owner ConfigMap, the group's headless Service and
PodGroup, then per attempt a Secret and a Pod (a Pod that exists already is adopted: never
made twice). ``poll`` turns each live attempt's pod state, kept by ``watch.PodWatch``, into
facts (``judge.PodJudge``); ``logs.PodLogs`` copies the pods' logs into the run folders.
``waiting_reason`` gives an Unschedulable pod's message.

Design: docs/kubernetes.md, "Module: `src/trainyard/backends/kubernetes/backend.py`".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.backends.base import (
    Backend,
    TaskFact,
    TaskKey,
    TaskLaunch,
    server_url_for_tasks,
    task_api_env,
)
from trainyard.backends.kubernetes import names
from trainyard.backends.kubernetes.client import AlreadyExists, KubeApi, NotFound
from trainyard.backends.kubernetes.judge import Attempt, PodJudge
from trainyard.backends.kubernetes.logs import PodLogs
from trainyard.backends.kubernetes.manifests import (
    ANNOTATIONS,
    TASK_CONTAINER,
    KubernetesRequest,
    build_request,
    run_secret,
    with_owner,
)
from trainyard.backends.kubernetes.options import KubernetesOptions, parse_options
from trainyard.backends.kubernetes.states import view_of
from trainyard.backends.kubernetes.watch import SELECTOR, PodWatch
from trainyard.errors import BackendError, ConfigError, RefusedError
from trainyard.pools import Pool, trainyard_home
from trainyard.tasktokens import task_token

__all__ = ["KubernetesBackend", "create", "SELECTOR"]

log = logging.getLogger("trainyard.backends.kubernetes")


class KubernetesBackend(Backend[KubernetesRequest]):
    """Runs each task attempt as a pod (see module docstring).

    Args:
        pool: the pool: its ``options`` (``KubernetesOptions``) and nodes.
        home: ``$TRAINYARD_HOME`` (default ``trainyard_home()``).
        api: the cluster's API (tests pass one pointed at an emulator); default: made from
            the options at the first call that needs the cluster, so ``--dry-run`` needs none.

    Raises:
        ConfigError: the pool's options are not valid.
    """

    name = "kubernetes"

    def __init__(self, pool: Pool, home: Path | None = None, *, api: KubeApi | None = None) -> None:
        self.pool = pool
        self.options: KubernetesOptions = parse_options(pool.name, dict(pool.options))
        self.home = Path(home) if home else trainyard_home()
        self._api = api
        self._watch: PodWatch | None = None
        self._wake: Callable[[], None] | None = None
        self._attempts: dict[str, Attempt] = {}  # by pod name
        self._owners: dict[str, str] = {}  # workflow id -> owner ConfigMap uid
        self._logs = PodLogs(self.home, runs_claim=bool(self.options.runs_claim))
        self._judge = PodJudge(self.options, self._logs, self._delete_pod)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ requests

    def build_request(self, launches: list[TaskLaunch]) -> KubernetesRequest:
        """The manifests of one gang start (no side effects, no cluster)."""
        return build_request(
            launches, self.pool, self.options, self.home, server_url=self._server_url()
        )

    def _api_env(self, workflow_id: str) -> dict[str, str]:
        """``TRAINYARD_SERVER_URL`` and the task token for a task of ``workflow_id``: the
        pool's ``server_url`` where set (the server as pods reach it), else
        ``base.task_api_env``'s (empty when no server is known)."""
        if not self.options.server_url:
            return task_api_env(self.home, workflow_id)
        return {
            "TRAINYARD_SERVER_URL": self.options.server_url,
            "TRAINYARD_TOKEN": task_token(self.home, workflow_id),
        }

    def _server_url(self) -> str | None:
        """The server's URL as pods reach it: the pool's ``server_url``, else the server's."""
        return self.options.server_url or server_url_for_tasks(self.home)

    # ------------------------------------------------------------------ Backend API

    def send(self, request: KubernetesRequest) -> None:
        """Create the gang's objects (see module docstring).

        Raises:
            BackendError: the cluster refused an object or cannot be reached; what was
                made before stays (owned by the workflow's ConfigMap).
        """
        launches = request.launches
        api = self._cluster()
        uid = self._owner_uid(api, request)
        owned = [
            with_owner(o, request.owner["metadata"]["name"], uid)
            for o in [request.service]
            + ([request.podgroup] if request.podgroup else [])
            + request.pull_secrets
        ]
        for obj in owned:
            _create_once(api, obj)
        start = names.podgroup_name(
            launches[0].key.workflow_id,
            launches[0].group,
            max(launch.key.retry_id for launch in launches),
        )
        for launch, pod in zip(request.launches, request.pods, strict=True):
            run = request.runs[launch.key]
            run.sandbox.env.update(self._api_env(run.workflow_id))
            owner = request.owner["metadata"]["name"]
            _create_once(api, with_owner(run_secret(launch, run, self.options), owner, uid))
            self._create_pod(api, with_owner(pod, owner, uid), launch.key, start)
        log.info(
            "group %s of %s: %d pod(s) in namespace %s",
            launches[0].group,
            launches[0].key.workflow_id,
            len(launches),
            self.options.namespace,
        )

    def poll(self) -> list[TaskFact]:
        """Facts since the last call, each once (see module docstring)."""
        if self._watch is None:
            return []
        now = time.monotonic()
        with self._lock:
            live = [a for a in self._attempts.values() if not a.done]
        facts: list[TaskFact] = []
        for attempt in live:
            facts += self._judge.facts_of(attempt, self._watch, now)
        with self._lock:
            attempts = list(self._attempts.values())
        return facts + self._judge.gang_timeouts(attempts, now)

    def stop(self, keys: list[TaskKey]) -> None:
        """Delete these attempts' pods with the pool's grace period. Idempotent; returns
        after the delete calls (the pods end later; their exit is reported by ``poll``)."""
        for key in keys:
            attempt = self._attempts.get(_pod_of(key))
            if attempt is None or attempt.done or attempt.stopping:
                continue
            attempt.stopping = True
            self._delete_pod(attempt.pod)

    def kill(self, keys: list[TaskKey]) -> None:
        """Delete these attempts' pods with grace period 0 (OSMO's ``cancel --force``),
        also those already stopping with the pool's grace. Idempotent."""
        for key in keys:
            attempt = self._attempts.get(_pod_of(key))
            if attempt is None or attempt.done:
                continue
            attempt.stopping = True
            self._delete_pod(attempt.pod, grace_s=0)

    def host_of(self, key: TaskKey, node: str) -> str:
        """A stand-in for ``{{host:TASK}}`` (the task's hostname): ``build_request`` writes
        the fully qualified name under the group's Service into the runner input, which
        wins (the group is not known here)."""
        return names.hostname(key.task)

    def recover(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Adopt these attempts after an engine restart; returns those whose pod exists and
        has not ended. An attempt without a pod is reported LOST by ``poll``. When the API
        cannot be reached, every attempt is adopted as alive (the watch tells later)."""
        try:
            pods = _pods_of({k.workflow_id for k in keys}, self._cluster())
        except BackendError as exc:
            log.warning("kubernetes backend: cannot list pods while recovering: %s", exc)
            for key in keys:
                name = _pod_of(key)
                with self._lock:
                    self._attempts.setdefault(name, Attempt(key, name, "", time.monotonic()))
            return list(keys)
        alive = []
        for key in keys:
            name = _pod_of(key)
            pod = pods.get(name)
            start = (pod or {}).get("metadata", {}).get("labels", {}).get(names.START_LABEL, "")
            with self._lock:
                self._attempts.setdefault(name, Attempt(key, name, start, time.monotonic()))
            if pod is not None:
                self._watch_put(pod)
                if view_of(pod).ending is None:
                    alive.append(key)
        return alive

    def unstarted(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Those of ``keys`` that have no pod in the cluster: never created (the API server
        makes a pod whole or not at all), so starting them now cannot run one twice. When
        the cluster cannot be asked, every attempt counts as started."""
        try:
            pods = _pods_of({k.workflow_id for k in keys}, self._cluster())
        except BackendError as exc:
            log.warning("kubernetes backend: cannot tell which attempts exist: %s", exc)
            return []
        return [k for k in keys if _pod_of(k) not in pods and _pod_of(k) not in self._attempts]

    def entry(self, key: TaskKey) -> dict[str, Any]:
        """How to run a command beside the running attempt ``key`` (``workflow exec``,
        ``port-forward``: optional hook): ``{"backend": "kubernetes", "namespace", "pod",
        "container", "kubeconfig", "context", "python": the runner's interpreter in the
        pod}``, for ``kubectl exec`` (the API's exec).

        Raises:
            RefusedError: no pod of the attempt runs now.
        """
        attempt = self._attempts.get(_pod_of(key))
        if attempt is None or attempt.done or not attempt.started:
            raise RefusedError(f"task {key.task} (retry {key.retry_id}) has no running pod")
        return {
            "backend": "kubernetes",
            "namespace": self.options.namespace,
            "pod": attempt.pod,
            "container": TASK_CONTAINER,
            "kubeconfig": self.options.kubeconfig,
            "context": self.options.context,
            "python": f"{self.options.runner_path}/venv/bin/python",
        }

    def notify_facts(self, wake: Callable[[], None]) -> bool:
        """Call ``wake()`` after each pod event of the watch. Returns True."""
        self._wake = wake
        return True

    def waiting_reason(self, key: TaskKey) -> str:
        """Why the attempt's pod waits (the scheduler's Unschedulable message), else ""."""
        attempt = self._attempts.get(_pod_of(key))
        return attempt.waiting if attempt else ""

    def forget(self, workflow_id: str) -> None:
        """Delete everything of ``workflow_id`` in the cluster: its owner ConfigMap (the
        garbage collector deletes what it owns). Idempotent."""
        try:
            self._cluster().delete("ConfigMap", names.owner_name(workflow_id))
        except BackendError as exc:
            log.warning("kubernetes backend: cannot delete workflow %s: %s", workflow_id, exc)
        with self._lock:
            for name in [n for n, a in self._attempts.items() if a.key.workflow_id == workflow_id]:
                del self._attempts[name]
                self._logs.drop(name)
        self._owners.pop(workflow_id, None)

    def close(self) -> None:
        """Stop the watch and the log followers and release the connection pool. Pods keep
        running (a new engine recovers them)."""
        self._logs.close()
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._api is not None:
            self._api.close()

    # ------------------------------------------------------------------ starting

    def _cluster(self) -> KubeApi:
        """The API, its watch started (made at the first call that needs the cluster)."""
        if self._api is None:
            try:
                self._api = KubeApi(self.options)
            except ConfigError as exc:  # the engine hears of a backend that cannot start
                raise BackendError(f"kubernetes pool {self.pool.name!r}: {exc}") from exc
        if self._watch is None:
            self._watch = PodWatch(self._api, self._on_event)
            self._watch.synced.wait(timeout=10)
        return self._api

    def _on_event(self) -> None:
        if self._wake is not None:
            self._wake()

    def _owner_uid(self, api: KubeApi, request: KubernetesRequest) -> str:
        """The uid of the workflow's owner ConfigMap, making it if it is not there."""
        workflow_id = request.launches[0].key.workflow_id
        if workflow_id in self._owners:
            return self._owners[workflow_id]
        try:
            made = api.create(request.owner)
        except AlreadyExists:
            made = api.read_config_map(request.owner["metadata"]["name"])
        uid = str(made["metadata"]["uid"])
        self._owners[workflow_id] = uid
        return uid

    def _create_pod(self, api: KubeApi, pod: dict[str, Any], key: TaskKey, start: str) -> None:
        name = pod["metadata"]["name"]
        with self._lock:
            self._attempts[name] = Attempt(key, name, start, time.monotonic())
        try:
            self._watch_put(api.create(pod))
        except AlreadyExists:
            log.info("kubernetes backend: pod %s exists already: adopted", name)

    def _watch_put(self, pod: dict[str, Any]) -> None:
        if self._watch is not None:
            self._watch.put(pod)

    # ------------------------------------------------------------------ stopping

    def _delete_pod(self, name: str, grace_s: int | None = None) -> None:
        try:
            self._cluster().delete(
                "Pod", name, self.options.stop_grace_s if grace_s is None else grace_s
            )
        except (BackendError, NotFound) as exc:
            log.warning("kubernetes backend: cannot delete pod %s: %s", name, exc)


def _create_once(api: KubeApi, obj: dict[str, Any]) -> None:
    """Create ``obj``; one that exists already (a later start of the group) is fine."""
    try:
        api.create(obj)
    except AlreadyExists:
        pass


def _pods_of(workflows: set[str], api: KubeApi) -> dict[str, dict[str, Any]]:
    """The pods of these workflows now, by name (a fresh list, not the watch's)."""
    found: dict[str, dict[str, Any]] = {}
    for workflow_id in sorted(workflows):
        selector = f"{names.WORKFLOW_LABEL}={names.label_value(workflow_id)}"
        items, _ = api.list_pods(selector)
        for pod in items:
            if pod["metadata"].get("annotations", {}).get(ANNOTATIONS["workflow"]) == workflow_id:
                found[pod["metadata"]["name"]] = pod
    return found


def _pod_of(key: TaskKey) -> str:
    """The name of ``key``'s pod."""
    return names.pod_name(key.workflow_id, key.task, key.retry_id)


def create(pool: Pool, home: Path) -> KubernetesBackend:
    """Registry entry: the Kubernetes backend for ``pool`` with state under ``home``."""
    return KubernetesBackend(pool, home)
