"""``KubernetesBackend``: starts a gang as pods, reports facts from a watch, stops attempts.

``start_group`` makes the workflow's owner ConfigMap, the group's headless Service and
PodGroup, then per attempt a Secret and a Pod (a Pod that exists already is adopted: never
made twice). ``poll`` turns each live attempt's pod state into facts (``states.view_of``);
a pod gone without an ending is LOST after ``lost_grace_s``; while the API cannot be
reached no attempt is judged gone. ``waiting_reason`` gives an Unschedulable pod's message.

Design: docs/kubernetes.md, "Module: `src/trainyard/backends/kubernetes/backend.py`".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.backends.base import (
    Backend,
    FactKind,
    TaskFact,
    TaskKey,
    TaskLaunch,
    server_url_for_tasks,
    task_api_env,
)
from trainyard.backends.kubernetes import names
from trainyard.backends.kubernetes.client import AlreadyExists, KubeApi, NotFound
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
from trainyard.errors import BackendError, ConfigError, RefusedError
from trainyard.pools import Pool, trainyard_home
from trainyard.runner.report import LOG
from trainyard.status import STOPPED_EXIT_CODE, ExitCode
from trainyard.tasktokens import task_token

__all__ = ["KubernetesBackend", "create", "SELECTOR"]

log = logging.getLogger("trainyard.backends.kubernetes")

SELECTOR = f"{names.MANAGED_BY}=trainyard"
WATCH_TIMEOUT_S = 60
"""How long one watch request lasts before the backend opens the next (server side)."""
RELIST_PAUSE_S = 1.0
"""Pause before listing again after a broken watch."""


LOG_LIMIT_BYTES = 64 * 1024**2
"""At most this much of a pod's log is copied into the server's run folder."""


class _LogFollower:
    """A thread copying a running pod's log, as it is written, into the attempt's
    ``task.log`` here (appending; at most ``limit_bytes``), so ``workflow logs -f`` and the
    dashboard, which follow that file, show the lines as they come.

    ``complete`` is True once the stream ended by itself (the container ended) with every
    byte copied; ``written`` counts the bytes copied. Once ``stop`` returned, nothing more is
    written (a write and the stop take one lock), so the caller may append the rest."""

    def __init__(self, api: KubeApi, pod: str, path: Path, limit_bytes: int) -> None:
        self.api, self.pod, self.path, self.limit_bytes = api, pod, path, limit_bytes
        self.written = 0
        self.complete = False
        self.finished = threading.Event()
        self._response: Any = None
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"k8s-log-{pod}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop copying (no write after this returns) and close the stream; idempotent."""
        with self._lock:
            self._stopped = True
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 (closing a broken stream: nothing to do)
                pass

    def _opened(self, response: Any) -> None:
        self._response = response
        if self._stopped:
            self.stop()

    def _run(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as out:
                for chunk in self.api.follow_pod_log(self.pod, TASK_CONTAINER, self._opened):
                    with self._lock:
                        if self._stopped:
                            return
                        room = self.limit_bytes - self.written
                        out.write(chunk[:room])
                        out.flush()
                        self.written += min(len(chunk), room)
                    if len(chunk) > room:
                        return
            with self._lock:
                self.complete = not self._stopped
        except (BackendError, OSError) as exc:
            if not self._stopped:
                log.info(
                    "kubernetes backend: following the log of pod %s stopped: %s", self.pod, exc
                )
        finally:
            self.finished.set()


@dataclass
class _Attempt:
    key: TaskKey
    pod: str
    start: str  # the gang start (PodGroup name) it belongs to
    sent_s: float  # time.monotonic() of its start
    started: bool = False
    done: bool = False
    stopping: bool = False
    gone_since: float | None = None
    waiting: str = ""


class _PodWatch:
    """A thread keeping the latest state of every trainyard pod of one namespace."""

    def __init__(self, api: KubeApi, on_event: Callable[[], None]) -> None:
        self.api = api
        self.on_event = on_event
        self.pods: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.healthy = False
        """True while ``pods`` is the cluster's (the last list worked and its watch has not
        broken since); a pod missing from a stale map proves nothing."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="k8s-pod-watch", daemon=True)
        self._thread.start()

    def get(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.pods.get(name)

    def put(self, pod: dict[str, Any]) -> None:
        """Record ``pod`` as known now (the create call's answer)."""
        with self._lock:
            self.pods.setdefault(pod["metadata"]["name"], pod)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
                for kind, pod in self.api.watch_pods(SELECTOR, version, WATCH_TIMEOUT_S):
                    self._apply(kind, pod)
                    if self._stop.is_set():
                        return
            except BackendError as exc:
                self.healthy = False
                log.info("kubernetes backend: pod watch: %s; listing again", exc)
                self._stop.wait(RELIST_PAUSE_S)
            except Exception as exc:  # a broken stream (urllib3): log, pause, list again
                self.healthy = False
                if not self._stop.is_set():
                    log.warning("kubernetes backend: pod watch broke (%r); listing again", exc)
                self._stop.wait(RELIST_PAUSE_S)

    def _relist(self) -> str:
        items, version = self.api.list_pods(SELECTOR)
        with self._lock:
            self.pods = {p["metadata"]["name"]: p for p in items}
        self.healthy = True
        self.synced.set()
        self.on_event()
        return version

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name")
        if not name:
            return
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
        self.on_event()


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
        self._watch: _PodWatch | None = None
        self._wake: Callable[[], None] | None = None
        self._attempts: dict[str, _Attempt] = {}  # by pod name
        self._owners: dict[str, str] = {}  # workflow id -> owner ConfigMap uid
        self._followers: dict[str, _LogFollower] = {}  # by pod name: running pods' logs
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
            facts += self._judge(attempt, now)
        return facts + self._gang_timeouts(now)

    def stop(self, keys: list[TaskKey]) -> None:
        """Delete these attempts' pods with the pool's grace period. Idempotent; returns
        after the delete calls (the pods end later; their exit is reported by ``poll``)."""
        for key in keys:
            attempt = self._attempts.get(self._pod_of(key))
            if attempt is None or attempt.done or attempt.stopping:
                continue
            attempt.stopping = True
            self._delete_pod(attempt.pod)

    def kill(self, keys: list[TaskKey]) -> None:
        """Delete these attempts' pods with grace period 0 (OSMO's ``cancel --force``),
        also those already stopping with the pool's grace. Idempotent."""
        for key in keys:
            attempt = self._attempts.get(self._pod_of(key))
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
            pods = self._pods_of({k.workflow_id for k in keys}, self._cluster())
        except BackendError as exc:
            log.warning("kubernetes backend: cannot list pods while recovering: %s", exc)
            for key in keys:
                name = self._pod_of(key)
                with self._lock:
                    self._attempts.setdefault(name, _Attempt(key, name, "", time.monotonic()))
            return list(keys)
        alive = []
        for key in keys:
            name = self._pod_of(key)
            pod = pods.get(name)
            start = (pod or {}).get("metadata", {}).get("labels", {}).get(names.START_LABEL, "")
            with self._lock:
                self._attempts.setdefault(name, _Attempt(key, name, start, time.monotonic()))
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
            pods = self._pods_of({k.workflow_id for k in keys}, self._cluster())
        except BackendError as exc:
            log.warning("kubernetes backend: cannot tell which attempts exist: %s", exc)
            return []
        return [
            k for k in keys if self._pod_of(k) not in pods and self._pod_of(k) not in self._attempts
        ]

    def entry(self, key: TaskKey) -> dict[str, Any]:
        """How to run a command beside the running attempt ``key`` (``workflow exec``,
        ``port-forward``: optional hook): ``{"backend": "kubernetes", "namespace", "pod",
        "container", "kubeconfig", "context", "python": the runner's interpreter in the
        pod}``, for ``kubectl exec`` (the API's exec).

        Raises:
            RefusedError: no pod of the attempt runs now.
        """
        attempt = self._attempts.get(self._pod_of(key))
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
        attempt = self._attempts.get(self._pod_of(key))
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
                self._drop_follower(name)
        self._owners.pop(workflow_id, None)

    def close(self) -> None:
        """Stop the watch and the log followers and release the connection pool. Pods keep
        running (a new engine recovers them)."""
        for follower in self._followers.values():
            follower.stop()
        self._followers.clear()
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
            self._watch = _PodWatch(self._api, self._on_event)
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
            self._attempts[name] = _Attempt(key, name, start, time.monotonic())
        try:
            self._watch_put(api.create(pod))
        except AlreadyExists:
            log.info("kubernetes backend: pod %s exists already: adopted", name)

    def _watch_put(self, pod: dict[str, Any]) -> None:
        if self._watch is not None:
            self._watch.put(pod)

    def _pods_of(self, workflows: set[str], api: KubeApi) -> dict[str, dict[str, Any]]:
        """The pods of these workflows now, by name (a fresh list, not the watch's)."""
        found: dict[str, dict[str, Any]] = {}
        for workflow_id in sorted(workflows):
            selector = f"{names.WORKFLOW_LABEL}={names.label_value(workflow_id)}"
            items, _ = api.list_pods(selector)
            for pod in items:
                if (
                    pod["metadata"].get("annotations", {}).get(ANNOTATIONS["workflow"])
                    == workflow_id
                ):
                    found[pod["metadata"]["name"]] = pod
        return found

    @staticmethod
    def _pod_of(key: TaskKey) -> str:
        return names.pod_name(key.workflow_id, key.task, key.retry_id)

    # ------------------------------------------------------------------ observing

    def _judge(self, attempt: _Attempt, now: float) -> list[TaskFact]:
        """The attempt's new facts from its pod's latest state."""
        assert self._watch is not None
        pod = self._watch.get(attempt.pod)
        if pod is None:
            if not self._watch.healthy:  # the API cannot be reached: nothing is known
                attempt.gone_since = None
                return []
            return self._gone(attempt, now)
        attempt.gone_since = None
        view = view_of(pod)
        facts = []
        if view.started and not attempt.started:
            attempt.started = True
            self._follow_log(attempt)
            stamp = time.time()
            facts += [
                TaskFact(attempt.key, FactKind.INITIALIZING, stamp),
                TaskFact(attempt.key, FactKind.RUNNING, stamp),
            ]
        if view.waiting != attempt.waiting:
            attempt.waiting = view.waiting
            if view.waiting:
                log.info("kubernetes backend: pod %s waits: %s", attempt.pod, view.waiting)
        if view.ending is not None:
            attempt.done = True
            self._keep_log(attempt)
            facts.append(
                TaskFact(attempt.key, view.ending, time.time(), view.exit_code, view.message)
            )
        return facts

    def _log_path(self, key: TaskKey) -> Path:
        return self.home / "runs" / key.workflow_id / key.task / str(key.retry_id) / LOG

    def _follow_log(self, attempt: _Attempt) -> None:
        """Start copying the running pod's log into its ``task.log`` here as it is written
        (``_LogFollower``). Not with a ``runs_claim`` (the runner writes the file there)."""
        if self.options.runs_claim or self._api is None or attempt.pod in self._followers:
            return
        self._followers[attempt.pod] = _LogFollower(
            self._api, attempt.pod, self._log_path(attempt.key), LOG_LIMIT_BYTES
        )

    def _keep_log(self, attempt: _Attempt) -> None:
        """The ended pod's whole log (the task log ``podmain`` copied to its stdout) in the
        attempt's run folder here, ``task.log``, so ``workflow logs`` shows it (and the
        engine its last lines) before the ending fact is reported: what its follower copied
        (stopped now, unless its stream ended by itself), then the rest read from the API;
        the whole log where no follower ran and the file is not there. Not with a
        ``runs_claim`` (the runner wrote it there). At most ``LOG_LIMIT_BYTES``; best effort;
        never waits for the follower."""
        follower = self._followers.pop(attempt.pod, None)
        if follower is not None:
            follower.stop()
            if follower.complete:
                return
        path = self._log_path(attempt.key)
        if self.options.runs_claim or self._api is None or (follower is None and path.exists()):
            return
        copied = follower.written if follower is not None else 0
        if copied >= LOG_LIMIT_BYTES:
            return
        try:
            data = self._api.pod_log(attempt.pod, TASK_CONTAINER, LOG_LIMIT_BYTES).encode()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as out:
                out.write(data[copied:LOG_LIMIT_BYTES])
        except (BackendError, OSError) as exc:
            log.warning("kubernetes backend: cannot keep the log of pod %s: %s", attempt.pod, exc)

    def _gone(self, attempt: _Attempt, now: float) -> list[TaskFact]:
        """A pod missing from the watch: EXITED 143 if stopped here, else LOST after
        ``lost_grace_s``."""
        if attempt.gone_since is None:
            attempt.gone_since = now
        if now - attempt.gone_since < self.options.lost_grace_s:
            return []
        attempt.done = True
        self._drop_follower(attempt.pod)
        if attempt.stopping:
            return [
                TaskFact(
                    attempt.key,
                    FactKind.EXITED,
                    time.time(),
                    STOPPED_EXIT_CODE,
                    "stopped: its pod was deleted",
                )
            ]
        view = view_of(None)
        return [
            TaskFact(
                attempt.key, FactKind.LOST, time.time(), None, f"pod {attempt.pod}: {view.message}"
            )
        ]

    def _drop_follower(self, pod: str) -> None:
        """Stop following the log of a pod that is gone (what was copied stays)."""
        follower = self._followers.pop(pod, None)
        if follower is not None:
            follower.stop()

    def _gang_timeouts(self, now: float) -> list[TaskFact]:
        """``scheduler: none``: every start whose pods are not all running within
        ``gang_timeout_s`` is deleted whole; its live attempts exit with OSMO's 3005
        (START_TIMEOUT: the engine's FAILED_START_TIMEOUT)."""
        if self.options.scheduler != "none":
            return []
        with self._lock:
            starts: dict[str, list[_Attempt]] = {}
            for attempt in self._attempts.values():
                starts.setdefault(attempt.start, []).append(attempt)
        facts = []
        for start, attempts in starts.items():
            late = now - min(a.sent_s for a in attempts) > self.options.gang_timeout_s
            live = [a for a in attempts if not a.done]
            if late and live and not all(a.started for a in attempts):
                facts += self._end_gang(start, live)
        return facts

    def _end_gang(self, start: str, live: list[_Attempt]) -> list[TaskFact]:
        message = (
            f"gang {start}: not all its pods ran within gang_timeout_s="
            f"{self.options.gang_timeout_s:g} s; deleted so that it holds nothing"
        )
        log.warning("kubernetes backend: %s", message)
        facts = []
        for attempt in live:
            attempt.done = True
            self._drop_follower(attempt.pod)
            self._delete_pod(attempt.pod, grace_s=0)
            facts.append(
                TaskFact(
                    attempt.key, FactKind.EXITED, time.time(), int(ExitCode.START_TIMEOUT), message
                )
            )
        return facts

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


def create(pool: Pool, home: Path) -> KubernetesBackend:
    """Registry entry: the Kubernetes backend for ``pool`` with state under ``home``."""
    return KubernetesBackend(pool, home)
