"""The local backend: every task is a task runner on this machine, its command sandboxed.

Modules:
    backend    ``LocalBackend``: starts gangs, reports facts, stops, recovers
    launcher   the long-lived process that forks runners or hosts them as threads
    sandbox    the bubblewrap sandbox of a task (``SandboxPlan`` -> bwrap argv, mounts)
    container  a task of a podman image (``podman run`` argv, its root, its user)
    netns      a group's network namespace and its keeper process
    router     the launcher's egress router (pasta behind a veth)
    rtnl       netlink requests for the router
    wakeup     the socket runners signal their events on (``notify_facts``)
    enter      entering a running task (``workflow exec``)

Names are imported on first use, so that the helper processes started as
``python -m trainyard.backends.local.X`` do not load the whole backend. See
docs/local-backend.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.backends.local.backend import (GpuLeases, GroupRequest, Isolation,
                                                  LaunchRequest, LocalBackend, create,
                                                  gpu_count, loopback_address,
                                                  probe_isolation)

__all__ = ["LocalBackend", "Isolation", "LaunchRequest", "GroupRequest", "GpuLeases",
           "probe_isolation", "loopback_address", "gpu_count", "create"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'trainyard.backends.local' has no attribute {name!r}")
    return getattr(importlib.import_module("trainyard.backends.local.backend"), name)
