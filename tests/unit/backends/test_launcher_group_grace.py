"""A group namespace waits for its first runner longer than its grace after the last one:
the backend asks for it, prepares the attempt, then starts the runner, which on a loaded
machine came after the 5 s grace; the runner's ``nsenter --net=/proc/PID/fd/N`` then found
no descriptor and the start ended 126 ("bwrap ended before its user namespace was set up")."""

from __future__ import annotations

import os
import time

from trainyard.backends.local import launcher as launcher_mod
from trainyard.backends.local.launcher_groups import UNJOINED_GRACE_S, GroupNamespace


def _group(idle_for_s: float) -> GroupNamespace:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    return GroupNamespace(
        os.getpid(), time.time(), False, ns_fd=fd, idle_since=time.monotonic() - idle_for_s
    )


def test_a_group_no_runner_joined_yet_outlives_the_grace() -> None:
    launcher = launcher_mod._Launcher("test-group-grace", idle_s=1, group_grace_s=5)
    try:
        launcher.networks.groups["waiting"] = _group(idle_for_s=10)
        launcher.networks.groups["done"] = _group(idle_for_s=10)
        launcher._joined(1234, "done")
        launcher._left(1234)
        launcher.networks.groups["done"].idle_since -= 10
        launcher.networks._next_expiry = 0.0
        launcher.networks.expire()
        assert "waiting" in launcher.networks.groups and "done" not in launcher.networks.groups
        launcher.networks.groups["waiting"].idle_since -= UNJOINED_GRACE_S
        launcher.networks._next_expiry = 0.0
        launcher.networks.expire()
        assert "waiting" not in launcher.networks.groups
    finally:
        launcher.close()
