"""``PodLogs``: each pod's log (the task log ``podmain`` copies to the container's stdout)
copied into its attempt's ``task.log`` here, so ``workflow logs`` (``-f``) and the dashboard
show it: followed while the pod runs, the rest read when it ends; at most ``LOG_LIMIT_BYTES``.

Design: docs/kubernetes.md, "Module: `src/trainyard/backends/kubernetes/backend.py`".
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from trainyard.backends.base import TaskKey
from trainyard.backends.kubernetes.client import KubeApi
from trainyard.backends.kubernetes.manifests import TASK_CONTAINER
from trainyard.errors import BackendError
from trainyard.runner.report import LOG

__all__ = ["PodLogs", "LOG_LIMIT_BYTES"]

log = logging.getLogger("trainyard.backends.kubernetes")

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


class PodLogs:
    """The pods' logs in their attempts' run folders here, one follower thread per
    running pod.

    Args:
        home: ``$TRAINYARD_HOME``; an attempt's log is ``runs/<workflow>/<task>/<retry>/task.log``.
        runs_claim: True when the pool mounts a ``runs_claim`` (the runner writes the file
            there): then nothing is copied.
    """

    def __init__(self, home: Path, *, runs_claim: bool) -> None:
        self.home = home
        self.runs_claim = runs_claim
        self._followers: dict[str, _LogFollower] = {}  # by pod name: running pods' logs

    def path(self, key: TaskKey) -> Path:
        """The attempt's ``task.log`` here."""
        return self.home / "runs" / key.workflow_id / key.task / str(key.retry_id) / LOG

    def follow(self, api: KubeApi | None, pod: str, key: TaskKey) -> None:
        """Start copying the running ``pod``'s log into ``key``'s ``task.log`` as it is
        written (a follower thread; one per pod). Not without an API or with a
        ``runs_claim``."""
        if self.runs_claim or api is None or pod in self._followers:
            return
        self._followers[pod] = _LogFollower(api, pod, self.path(key), LOG_LIMIT_BYTES)

    def keep(self, api: KubeApi | None, pod: str, key: TaskKey) -> None:
        """The ended ``pod``'s whole log in ``key``'s ``task.log``, before the ending fact
        is reported: what its follower copied (stopped now, unless its stream ended by
        itself), then the rest read from the API; the whole log where no follower ran and
        the file is not there. Not with a ``runs_claim`` (the runner wrote it there). At
        most ``LOG_LIMIT_BYTES``; best effort (a failure is logged); never waits for the
        follower."""
        follower = self._followers.pop(pod, None)
        if follower is not None:
            follower.stop()
            if follower.complete:
                return
        path = self.path(key)
        if self.runs_claim or api is None or (follower is None and path.exists()):
            return
        copied = follower.written if follower is not None else 0
        if copied >= LOG_LIMIT_BYTES:
            return
        try:
            data = api.pod_log(pod, TASK_CONTAINER, LOG_LIMIT_BYTES).encode()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as out:
                out.write(data[copied:LOG_LIMIT_BYTES])
        except (BackendError, OSError) as exc:
            log.warning("kubernetes backend: cannot keep the log of pod %s: %s", pod, exc)

    def drop(self, pod: str) -> None:
        """Stop following the log of a pod that is gone (what was copied stays)."""
        follower = self._followers.pop(pod, None)
        if follower is not None:
            follower.stop()

    def close(self) -> None:
        """Stop every follower (what was copied stays)."""
        for follower in self._followers.values():
            follower.stop()
        self._followers.clear()
