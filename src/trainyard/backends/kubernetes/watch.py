"""``PodWatch``: a thread keeping the latest state of every trainyard pod of one namespace.

It lists the pods labelled ``SELECTOR``, then watches from the list's resourceVersion (one
request lasts ``WATCH_TIMEOUT_S``), and lists again after an expired or broken watch (after
``RELIST_PAUSE_S``). ``healthy`` is False while the map may be stale.

Design: docs/kubernetes.md, "Status from the cluster, as facts".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from trainyard.backends.kubernetes import names
from trainyard.backends.kubernetes.client import KubeApi
from trainyard.errors import BackendError

__all__ = ["PodWatch", "SELECTOR", "WATCH_TIMEOUT_S", "RELIST_PAUSE_S"]

log = logging.getLogger("trainyard.backends.kubernetes")

SELECTOR = f"{names.MANAGED_BY}=trainyard"
"""The label selector of every pod this backend made."""
WATCH_TIMEOUT_S = 60
"""How long one watch request lasts before the backend opens the next (server side)."""
RELIST_PAUSE_S = 1.0
"""Pause before listing again after a broken watch."""


class PodWatch:
    """A thread keeping the latest state of every trainyard pod of one namespace.

    Args:
        api: the cluster's API (its namespace is the one watched).
        on_event: called (on the watch's thread) after each list and each pod event.
    """

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
        """The latest state of pod ``name``; None when the watch does not know it."""
        with self._lock:
            return self.pods.get(name)

    def put(self, pod: dict[str, Any]) -> None:
        """Record ``pod`` as known now (the create call's answer)."""
        with self._lock:
            self.pods.setdefault(pod["metadata"]["name"], pod)

    def stop(self) -> None:
        """Ask the thread to end (at its next event, or when its request ends)."""
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
