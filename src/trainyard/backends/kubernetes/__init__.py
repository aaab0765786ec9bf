"""The Kubernetes backend: one Pod per task attempt, one headless Service per group, a
PodGroup per gang start for the pool's gang scheduler, everything of a workflow owned by one
ConfigMap (see ``manifests.py`` for the mapping, ``backend.py`` for the lifecycle,
``watch.py`` for the pod watch, ``judge.py`` for pods' states as attempts' facts,
``logs.py`` for the pods' logs here, ``states.py`` for the table from pod states to facts,
``options.py`` for the pool options, ``client.py`` for the API edge, ``podmain.py`` for what
the task container runs).

The registry (``trainyard.backends.BACKENDS``) names ``trainyard.backends.kubernetes:create``.
The ``kubernetes`` client library (extra ``kubernetes``) is imported only when a pool's backend
first talks to its cluster: ``--dry-run`` and ``build_request`` need neither it nor a cluster.
"""

from __future__ import annotations

from trainyard.backends.kubernetes.backend import KubernetesBackend, create
from trainyard.backends.kubernetes.manifests import KubernetesRequest, build_request
from trainyard.backends.kubernetes.options import KubernetesOptions, parse_options
from trainyard.backends.kubernetes.states import PodView, view_of

__all__ = [
    "KubernetesBackend",
    "create",
    "KubernetesRequest",
    "build_request",
    "KubernetesOptions",
    "parse_options",
    "PodView",
    "view_of",
]
