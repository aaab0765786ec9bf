"""A group namespace waits for its first runner longer than its grace after the last one:
the backend asks for it, prepares the attempt, then starts the runner, which on a loaded
machine came after the 5 s grace; the runner's ``nsenter --net=/proc/PID/fd/N`` then found
no descriptor and the start ended 126 ("bwrap ended before its user namespace was set up")."""

from __future__ import annotations

import os
import time

from trainyard.backends.local import launcher as launcher_mod


def _group(idle_for_s: float) -> launcher_mod._Group:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    return launcher_mod._Group(
        os.getpid(), time.time(), False, ns_fd=fd, idle_since=time.monotonic() - idle_for_s
    )


def test_a_group_no_runner_joined_yet_outlives_the_grace() -> None:
    launcher = launcher_mod._Launcher("test-group-grace", idle_s=1, group_grace_s=5)
    try:
        launcher.groups["waiting"] = _group(idle_for_s=10)
        launcher.groups["done"] = _group(idle_for_s=10)
        launcher._joined(1234, "done")
        launcher._left(1234)
        launcher.groups["done"].idle_since -= 10
        launcher._next_expiry = 0.0
        launcher._expire_groups()
        assert "waiting" in launcher.groups and "done" not in launcher.groups
        launcher.groups["waiting"].idle_since -= launcher_mod.UNJOINED_GRACE_S
        launcher._next_expiry = 0.0
        launcher._expire_groups()
        assert "waiting" not in launcher.groups
    finally:
        launcher.close()
