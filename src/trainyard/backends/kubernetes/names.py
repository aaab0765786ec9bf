"""Names and labels of the objects trainyard makes in a cluster. Pure functions.

Rules (Kubernetes docs, "Object Names and IDs", "Labels and Selectors"): a DNS-1123 label
(pods' ``hostname``/``subdomain``, namespaces) is at most 63 characters of ``[a-z0-9-]``,
alphanumeric at both ends; a DNS-1035 label (Services) also starts with a letter; a label
value is at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends, or empty.
Every name is built from trainyard's own (workflow id, group, task, retry id); one changed to
fit (a character replaced, or cut to 63) gets 8 hex digits of the SHA-256 of the original
parts, so two originals never share a name (``a_b`` and ``a-b`` give two hostnames).
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "dns_label",
    "label_value",
    "LABEL_LIMIT",
    "MANAGED_BY",
    "WORKFLOW_LABEL",
    "GROUP_LABEL",
    "TASK_LABEL",
    "RETRY_LABEL",
    "START_LABEL",
    "NAME_ANNOTATION",
    "owner_name",
    "service_name",
    "pod_name",
    "hostname",
    "podgroup_name",
    "workflow_labels",
]

LABEL_LIMIT = 63
MANAGED_BY = "app.kubernetes.io/managed-by"
WORKFLOW_LABEL = "trainyard.io/workflow"
GROUP_LABEL = "trainyard.io/group"
TASK_LABEL = "trainyard.io/task"
RETRY_LABEL = "trainyard.io/retry-id"
START_LABEL = "trainyard.io/start"
"""The PodGroup (gang start) a pod belongs to: ``podgroup_name``."""
NAME_ANNOTATION = "trainyard.io/name"
"""The object's trainyard name as given (workflow id, task, ...), never cut."""

_BAD = re.compile(r"[^a-z0-9-]+")
_BAD_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


def dns_label(*parts: str, limit: int = LABEL_LIMIT, letter_first: bool = False) -> str:
    """``parts`` joined with ``-`` as a DNS-1123 label of at most ``limit`` characters
    (DNS-1035 with ``letter_first``). Lowercased; runs of other characters become ``-``;
    a name changed beyond lowercasing, or cut, ends ``-<8 hex digits>`` of the original
    parts. Raises ValueError for ``limit`` < 10."""
    if limit < 10:
        raise ValueError("a DNS label made here needs room for its digest (limit >= 10)")
    raw = "-".join(parts)
    clean = _BAD.sub("-", raw.lower()).strip("-")
    if letter_first and not clean[:1].isalpha():
        clean = f"x-{clean}".rstrip("-")
    if clean == raw.lower() and len(clean) <= limit and clean:
        return clean
    head = clean[: limit - 9].rstrip("-")
    return f"{head}-{_digest(*parts)}" if head else f"x{_digest(*parts)}"


def label_value(value: str) -> str:
    """``value`` as a label value: other characters become ``_``; cut to 63 characters with
    a digest as ``dns_label`` does; never ends with a non-alphanumeric."""
    clean = _BAD_LABEL.sub("_", value).strip("-_.")
    if clean == value and len(clean) <= LABEL_LIMIT:
        return clean
    head = clean[: LABEL_LIMIT - 9].rstrip("-_.")
    return f"{head}-{_digest(value)}" if head else _digest(value)


def owner_name(workflow_id: str) -> str:
    """The workflow's owner ConfigMap: ``ty-<workflow id>``."""
    return dns_label("ty", workflow_id)


def service_name(workflow_id: str, group: str) -> str:
    """The group's headless Service (DNS-1035): ``ty-<workflow id>-<group>``."""
    return dns_label("ty", workflow_id, group, letter_first=True)


def pod_name(workflow_id: str, task: str, retry_id: int) -> str:
    """The attempt's Pod (and its run Secret): ``ty-<workflow id>-<task>-<retry id>``."""
    return dns_label("ty", workflow_id, task, str(retry_id))


def hostname(task: str) -> str:
    """The task's pod ``hostname`` (``{{host:TASK}}``'s first label): the task name."""
    return dns_label(task)


def podgroup_name(workflow_id: str, group: str, generation: int) -> str:
    """The PodGroup of one start of a gang: ``ty-<workflow id>-<group>-g<generation>``."""
    return dns_label("ty", workflow_id, group, f"g{generation}")


def pull_secret_name(workflow_id: str, registry: str) -> str:
    """The workflow's image pull Secret for one registry: ``ty-<workflow id>-pull-<registry>``
    (a registry's ``.`` and ``:`` make it end with a digest)."""
    return dns_label("ty", workflow_id, "pull", registry)


def workflow_labels(workflow_id: str) -> dict[str, str]:
    """The labels every object of a workflow carries (``kubectl get all -l`` finds them)."""
    return {MANAGED_BY: "trainyard", WORKFLOW_LABEL: label_value(workflow_id)}
