"""The local backend: every task is a task runner on this machine, its command sandboxed.

``backend`` (``LocalBackend``), ``isolation`` (bubblewrap, podman, none), ``sandbox`` (bwrap
plans), ``container``, ``container_image`` and ``image_pull`` (podman), ``launcher``,
``launcher_groups`` and ``launcher_process`` (forks or hosts runners), ``netns``, ``router``
and ``rtnl`` (group networks, egress), ``wakeup`` (runners' event socket), ``enter``
(``workflow exec``). Names are imported on first use, so that the helper processes
(``python -m trainyard.backends.local.X``) do not load the whole backend. See
docs/local-backend.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.backends.local.backend import (
        GpuLeases,
        GroupRequest,
        Isolation,
        LaunchRequest,
        LocalBackend,
        create,
        gpu_count,
        loopback_address,
        probe_isolation,
    )

__all__ = [
    "LocalBackend",
    "Isolation",
    "LaunchRequest",
    "GroupRequest",
    "GpuLeases",
    "probe_isolation",
    "loopback_address",
    "gpu_count",
    "create",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'trainyard.backends.local' has no attribute {name!r}")
    return getattr(importlib.import_module("trainyard.backends.local.backend"), name)
