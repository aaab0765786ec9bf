"""The backend's edge to the Kubernetes API: the official ``kubernetes`` client (the optional
extra ``kubernetes``), objects in and out as plain JSON dicts, its errors translated into
trainyard's (STYLE.md #7).

Only what the backend needs: create an object (built-in or a PodGroup), read one, list and
watch pods by label, delete with a grace period. The client library is imported here only,
when a Kubernetes pool's backend first talks to its cluster.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainyard.backends.kubernetes.manifests import PODGROUP_KINDS
from trainyard.backends.kubernetes.options import KubernetesOptions
from trainyard.errors import BackendError, ConfigError

__all__ = ["KubeApi", "AlreadyExists", "NotFound", "WatchExpired"]

LOG_CHUNK_BYTES = 64 * 1024
"""The most bytes one read of a followed pod log returns (less as soon as some came)."""

_PLURALS = {"ConfigMap": "config_map", "Service": "service", "Secret": "secret", "Pod": "pod"}
"""Built-in kinds -> the CoreV1Api method suffix."""


class AlreadyExists(BackendError):
    """HTTP 409 on create: an object of that name is there (a retried start)."""


class NotFound(BackendError):
    """HTTP 404: no such object."""


class WatchExpired(BackendError):
    """HTTP 410 on a watch: the resource version is too old; list again."""


def _translate(exc: Exception, what: str) -> BackendError:
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None) or str(exc)
    text = f"kubernetes API: {what}: {status or ''} {body}".strip()
    if status == 409:
        return AlreadyExists(text)
    if status == 404:
        return NotFound(text)
    if status == 410:
        return WatchExpired(text)
    return BackendError(text)


class KubeApi:
    """One cluster's API for one namespace (see module docstring).

    Args:
        options: the pool's options (``kubeconfig``, ``context``, ``namespace``).

    Raises:
        ConfigError: the ``kubernetes`` package is not installed, or no cluster is configured
            (no kubeconfig and not inside a pod).
    """

    def __init__(self, options: KubernetesOptions) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:
            raise ConfigError(
                "the kubernetes backend needs the kubernetes client: "
                "pip install 'trainyard[kubernetes]'"
            ) from exc
        self.namespace = options.namespace
        configuration = client.Configuration()
        kubeconfig = (
            options.kubeconfig
            or os.environ.get("KUBECONFIG")
            or str(Path.home() / ".kube" / "config")
        )
        try:
            if Path(kubeconfig.split(os.pathsep)[0]).exists():
                config.load_kube_config(
                    config_file=kubeconfig,
                    context=options.context,
                    client_configuration=configuration,
                )
            else:
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise ConfigError(
                f"kubernetes backend: no cluster configured ({exc}); set "
                "options.kubeconfig or KUBECONFIG"
            ) from exc
        self._api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._api_client)
        self.custom = client.CustomObjectsApi(self._api_client)
        self._exception = client.ApiException

    # ------------------------------------------------------------------ objects

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` in the namespace; returns it as stored (with its uid).

        Raises:
            AlreadyExists: an object of that kind and name exists.
            BackendError: any other refusal or a connection failure.
        """
        kind = obj["kind"]
        what = f"create {kind} {obj['metadata']['name']}"
        try:
            if kind == "PodGroup":
                group, version, plural = self._custom(obj["apiVersion"])
                return _json(
                    self.custom.create_namespaced_custom_object(
                        group, version, self.namespace, plural, obj, _preload_content=False
                    )
                )
            method = getattr(self.core, f"create_namespaced_{_PLURALS[kind]}")
            return _json(method(self.namespace, obj, _preload_content=False))
        except (self._exception, OSError) as exc:
            raise _translate(exc, what) from exc
        except Exception as exc:  # urllib3's errors: the cluster cannot be reached
            raise BackendError(f"kubernetes API: {what}: {exc}") from exc

    def read_config_map(self, name: str) -> dict[str, Any]:
        """The ConfigMap ``name``. Raises NotFound, BackendError."""
        try:
            return _json(
                self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
            )
        except (self._exception, OSError) as exc:
            raise _translate(exc, f"read ConfigMap {name}") from exc

    def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """(pods matching the label ``selector``, the list's resourceVersion)."""
        try:
            body = _json(
                self.core.list_namespaced_pod(
                    self.namespace, label_selector=selector, _preload_content=False
                )
            )
        except (self._exception, OSError) as exc:
            raise _translate(exc, f"list pods {selector}") from exc
        except Exception as exc:
            raise BackendError(f"kubernetes API: list pods: {exc}") from exc
        return list(body.get("items") or []), str(body["metadata"].get("resourceVersion", ""))

    def watch_pods(
        self, selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, pod) from a watch of the pods matching ``selector`` since
        ``resource_version``; ends after ``timeout_s`` (the server closes the watch).

        Raises:
            WatchExpired: the version is too old (list again).
            BackendError: the watch failed.
        """
        from kubernetes import watch

        stream = watch.Watch()
        try:
            for event in stream.stream(
                self.core.list_namespaced_pod,
                self.namespace,
                label_selector=selector,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                _request_timeout=(10, timeout_s + 10),
                allow_watch_bookmarks=False,
            ):
                raw = event.get("raw_object") or {}
                if event.get("type") == "ERROR":
                    raise _translate(_StatusError(raw), "watch pods")
                yield str(event.get("type")), raw
        except (self._exception, OSError) as exc:
            raise _translate(exc, "watch pods") from exc
        finally:
            stream.stop()

    def pod_log(self, name: str, container: str, limit_bytes: int) -> str:
        """A container's log, its first ``limit_bytes`` at most (the API's pod log with
        ``limitBytes``). Raises NotFound, BackendError."""
        try:
            response = self.core.read_namespaced_pod_log(
                name,
                self.namespace,
                container=container,
                limit_bytes=limit_bytes,
                _preload_content=False,
            )
        except (self._exception, OSError) as exc:
            raise _translate(exc, f"log of pod {name}") from exc
        # _preload_content=False answers urllib3's response, not the str the client's types say
        return bytes(response.data).decode("utf-8", errors="replace")  # type: ignore[attr-defined]

    def follow_pod_log(
        self, name: str, container: str, opened: Callable[[Any], None] = lambda _r: None
    ) -> Iterator[bytes]:
        """A container's log from its start, as it is written (the API's pod log with
        ``follow=true``), in chunks; ends when the container ends. ``opened(response)`` gets
        the HTTP response first, so another thread can ``close()`` it to stop the reading.
        Raises NotFound, BackendError (also from the iteration: a broken stream)."""
        try:
            response = self.core.read_namespaced_pod_log(
                name, self.namespace, container=container, follow=True, _preload_content=False
            )
        except Exception as exc:  # ApiException, urllib3's connection errors
            raise _translate(exc, f"log of pod {name}") from exc
        opened(response)
        try:
            # _preload_content=False: urllib3's response, not the str the client's types say
            yield from response.stream(LOG_CHUNK_BYTES, decode_content=True)  # type: ignore[attr-defined]
        except Exception as exc:  # urllib3's protocol and read errors of a broken stream
            raise BackendError(f"kubernetes API: log of pod {name}: {exc!r}") from exc
        finally:
            response.release_conn()  # type: ignore[attr-defined]

    def delete(
        self, kind: str, name: str, grace_s: int | None = None, api_version: str = "v1"
    ) -> None:
        """Delete an object (children with it: ``propagationPolicy: Background``).
        Idempotent: a missing object is not an error."""
        body: dict[str, object] = {"propagationPolicy": "Background"}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        try:
            if kind == "PodGroup":
                group, version, plural = self._custom(api_version)
                # the client sends a dict body as it is (its types ask a V1DeleteOptions)
                self.custom.delete_namespaced_custom_object(
                    group,
                    version,
                    self.namespace,
                    plural,
                    name,
                    body=body,  # type: ignore[arg-type]
                    _preload_content=False,
                )
                return
            method = getattr(self.core, f"delete_namespaced_{_PLURALS[kind]}")
            method(name, self.namespace, body=body, _preload_content=False)
        except (self._exception, OSError) as exc:
            error = _translate(exc, f"delete {kind} {name}")
            if not isinstance(error, NotFound):
                raise error from exc

    def close(self) -> None:
        """Release the connection pool."""
        self._api_client.close()

    @staticmethod
    def _custom(api_version: str) -> tuple[str, str, str]:
        group, _, version = api_version.partition("/")
        plural = next((p for v, p in PODGROUP_KINDS.values() if v == api_version), "podgroups")
        return group, version, plural


class _StatusError(Exception):
    """A watch's ERROR event (a Status object) as an exception with its code."""

    def __init__(self, status: dict[str, Any]) -> None:
        super().__init__(status.get("message", "watch error"))
        self.status = status.get("code")
        self.body = status.get("message", "")


def _json(response: Any) -> dict[str, Any]:
    """The JSON body of a raw (``_preload_content=False``) response."""
    return dict(json.loads(response.data))
