"""A Kubernetes API for the backend's tests: kmock's KubernetesEmulator served by
``kmock.Server`` on loopback (real HTTP, the official client talks to it through a kubeconfig
file), run in an asyncio loop of its own thread.

The emulator stores objects and serves create/read/list/watch/patch/delete, and runs no
controllers: ``Kubelet`` plays the kubelet (pod status Pending -> Running -> Succeeded or
Failed, evictions, image pull errors) and ``collect_garbage`` plays the garbage collector
(objects whose owner is gone are deleted), through the same API. The emulator gives no uids,
so ``UidEmulator`` adds one to each object it creates, as an API server does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import kmock
from kubernetes import client as k8s
from kubernetes import config

NAMESPACE = "trainyard"
RESOURCES = (
    "v1/pods",
    "v1/services",
    "v1/secrets",
    "v1/configmaps",
    "scheduling.run.ai/v2alpha2/podgroups",
    "scheduling.volcano.sh/v1beta1/podgroups",
    "scheduling.x-k8s.io/v1alpha1/podgroups",
)


class UidEmulator(kmock.KubernetesEmulator):
    """The emulator, giving each created object a ``metadata.uid``; ``pod_creates`` lists
    the name of every pod a create request asked for, refused or not. Each pod's log (the
    ``log`` subresource) is a ``LogFeed`` (``logs``), empty until the test writes it."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.pod_creates: list[str] = []
        self.logs: dict[str, LogFeed] = {}

    def log_of(self, pod: str) -> LogFeed:
        """``pod``'s log, served from now on (call in the emulator's loop)."""
        if pod not in self.logs:
            self.logs[pod] = LogFeed(asyncio.get_running_loop())
            self[f"get /api/v1/namespaces/{NAMESPACE}/pods/{pod}/log"] << self.logs[pod].serve
        return self.logs[pod]

    async def _handle(self, request: Any) -> Any:  # type: ignore[override]
        data = getattr(request, "data", None)
        if getattr(request, "action", None) == kmock.action.CREATE and isinstance(data, dict):
            data.setdefault("metadata", {}).setdefault("uid", str(uuid.uuid4()))
            if data.get("kind") == "Pod":
                self.pod_creates.append(str(data["metadata"].get("name")))
                self.log_of(str(data["metadata"].get("name")))
        return await super()._handle(request)


class EmulatorClient:
    """Reading and driving an emulator through its API (``kubeconfig`` names it)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        configuration = k8s.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        self.core = k8s.CoreV1Api(k8s.ApiClient(configuration))

    # ------------------------------------------------------------------ reading

    def objects(self, kind: str) -> list[dict[str, Any]]:
        """Every stored object of a built-in kind (``pods``, ``services``, ``secrets``,
        ``configmaps``) in the namespace, as JSON."""
        lister = {
            "pods": self.core.list_namespaced_pod,
            "services": self.core.list_namespaced_service,
            "secrets": self.core.list_namespaced_secret,
            "configmaps": self.core.list_namespaced_config_map,
        }[kind]
        data = json.loads(lister(NAMESPACE, _preload_content=False).data)
        return list(data.get("items") or [])

    def pod(self, name: str) -> dict[str, Any] | None:
        return next((p for p in self.objects("pods") if p["metadata"]["name"] == name), None)

    def pods_of(self, workflow_id: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.objects("pods")
            if p["metadata"].get("annotations", {}).get("trainyard.io/workflow-id") == workflow_id
        ]

    def left_of(self, workflow_id: str) -> list[str]:
        """``kind/name`` of every object labelled with the workflow (nothing left behind)."""
        left = []
        for kind in ("pods", "services", "secrets", "configmaps"):
            left += [
                f"{kind}/{o['metadata']['name']}"
                for o in self.objects(kind)
                if o["metadata"].get("labels", {}).get("trainyard.io/workflow") == workflow_id
            ]
        return left

    # ------------------------------------------------------------------ controllers

    def collect_garbage(self) -> int:
        """Delete every object whose owner (by uid) is gone, as the garbage collector does.
        Returns how many were deleted."""
        uids = {o["metadata"].get("uid") for kind in ("configmaps",) for o in self.objects(kind)}
        deleted = 0
        for kind, delete in (
            ("pods", self.core.delete_namespaced_pod),
            ("services", self.core.delete_namespaced_service),
            ("secrets", self.core.delete_namespaced_secret),
        ):
            for obj in self.objects(kind):
                owners = obj["metadata"].get("ownerReferences") or []
                if owners and not any(o["uid"] in uids for o in owners):
                    delete(obj["metadata"]["name"], NAMESPACE)
                    deleted += 1
        return deleted


class Emulator(EmulatorClient):
    """The emulator on ``http://127.0.0.1:<port>`` in this process (a thread runs its loop);
    ``kubeconfig`` (in ``folder``) names it."""

    def __init__(self, folder: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._handler, self._server = self._call(self._start())
        self.url = str(self._server.url).rstrip("/")
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "test-token"}}],
                    "contexts": [
                        {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
                    ],
                }
            )
        )
        super().__init__(kubeconfig)

    def set_log(self, pod: str, text: str) -> None:
        """``text`` written to the task container's log of ``pod`` (``feed_log``)."""
        self.feed_log(pod).write(text)

    def feed_log(self, pod: str) -> LogFeed:
        """The task container's log of ``pod`` (the emulator has no containers: a reaction
        answers the log subresource): a request gets what was written so far, a ``follow``
        one then each later ``write`` until the container ends (``end_log``)."""

        async def made() -> LogFeed:
            return self._handler.log_of(pod)

        return self._call(made())  # type: ignore[no-any-return]

    def end_log(self, pod: str) -> None:
        """The container of ``pod`` ended: its followed log ends (``Kubelet`` calls it)."""
        self.feed_log(pod).close()

    def requests_to_create_pods(self) -> list[str]:
        """Names of every pod a create request asked for, in order."""
        return list(self._handler.pod_creates)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _start(self) -> tuple[Any, Any]:
        handler = UidEmulator()
        for resource in RESOURCES:  # an emulator knows a resource once declared or used
            handler.resources[resource] = {}
        await handler.__aenter__()
        server = kmock.Server(handler)
        await server.__aenter__()
        return handler, server

    async def _stop(self) -> None:
        """End open watches first (the emulator streams them forever), then the server."""
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.sleep(0)
        await self._server.__aexit__(None, None, None)
        await self._handler.__aexit__(None, None, None)

    def close(self) -> None:
        """Stop serving (idempotent): the API is unreachable from then on."""
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class LogFeed:
    """A container log growing while it is served (``Emulator.feed_log``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._chunks: list[bytes] = []
        self._closed = False
        self._changed = asyncio.Event()

    def write(self, text: str) -> None:
        """Append ``text`` (from any thread)."""
        self._loop.call_soon_threadsafe(self._add, text.encode())

    def close(self) -> None:
        """The container ended: every stream ends after what was written."""
        self._loop.call_soon_threadsafe(self._end)

    def _add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._changed.set()

    def _end(self) -> None:
        self._closed = True
        self._changed.set()

    def serve(self, request: Any) -> Any:
        """What one request is served: the log so far; with ``follow=true``, a stream of it
        and of each later chunk until closed."""
        if str(request.params.get("follow", "")).lower() != "true":
            return b"".join(self._chunks)
        return self._stream()

    async def _stream(self) -> Any:
        sent = 0
        while True:
            while sent < len(self._chunks):
                sent += 1
                yield self._chunks[sent - 1]
            if self._closed:
                return
            self._changed.clear()
            await self._changed.wait()


def serve(folder: Path) -> None:
    """Run an emulator until killed, its kubeconfig in ``folder`` (for benchmarks that keep
    the emulator's serving out of the measured process)."""
    Emulator(folder)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    import sys

    serve(Path(sys.argv[1]))


class Kubelet:
    """Moves pods through their lifecycle as a kubelet would, by patching their status."""

    def __init__(self, emulator: EmulatorClient) -> None:
        self.api = emulator.core
        self.emulator = emulator

    def _end_log(self, name: str) -> None:
        """The container ended: a followed log ends (an emulator in this process only)."""
        if isinstance(self.emulator, Emulator):
            self.emulator.end_log(name)

    def _status(self, name: str, status: dict[str, Any]) -> None:
        self.api.patch_namespaced_pod(name, NAMESPACE, {"status": status})

    def run(self, name: str) -> None:
        self._status(
            name,
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "task",
                        "ready": True,
                        "restartCount": 0,
                        "image": "i",
                        "imageID": "",
                        "state": {"running": {"startedAt": "2026-11-26T00:00:00Z"}},
                    }
                ],
            },
        )

    def exit(
        self,
        name: str,
        code: int,
        message: str = "",
        *,
        report: bool = True,
        reason: str = "Completed",
    ) -> None:
        """The task container ends with ``code``; with ``report``, the runner's termination
        message (what podmain writes) carries it."""
        terminated: dict[str, Any] = {"exitCode": min(code, 255), "reason": reason}
        if report:
            terminated["message"] = json.dumps(
                {"kind": "EXITED", "time_s": 1.0, "exit_code": code, "message": message}
            )
        self._end_log(name)
        self._status(
            name,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [
                    {
                        "name": "task",
                        "ready": False,
                        "restartCount": 0,
                        "image": "i",
                        "imageID": "",
                        "state": {"terminated": terminated},
                    }
                ],
            },
        )

    def image_pull_error(self, name: str) -> None:
        self._status(
            name,
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "task",
                        "ready": False,
                        "restartCount": 0,
                        "image": "i",
                        "imageID": "",
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": "Back-off pulling image \"nope:1\"",
                            }
                        },
                    }
                ],
            },
        )

    def evict(self, name: str, *, ran: bool = True) -> None:
        """Node-pressure eviction: the pod Failed with reason Evicted; with ``ran``, its task
        container was stopped with SIGTERM and the runner reported 143 (stopped)."""
        status: dict[str, Any] = {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
        }
        if ran:
            report = json.dumps(
                {"kind": "EXITED", "time_s": 1.0, "exit_code": 143, "message": "stopped by SIGTERM"}
            )
            status["containerStatuses"] = [
                {
                    "name": "task",
                    "ready": False,
                    "restartCount": 0,
                    "image": "i",
                    "imageID": "",
                    "state": {
                        "terminated": {"exitCode": 143, "reason": "Error", "message": report}
                    },
                }
            ]
        self._end_log(name)
        self._status(name, status)

    def unschedulable(self, name: str, message: str) -> None:
        self._status(
            name,
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                    }
                ],
            },
        )
