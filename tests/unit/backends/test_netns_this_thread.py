"""``netns.on_this_thread``: the calling thread makes (or joins) a network namespace and is
back in its own afterwards, also when the work fails (issue 11: the launcher makes each
group's namespace on its main loop instead of a thread started and joined per group)."""

from __future__ import annotations

import os

import pytest

from trainyard.backends.local import netns

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="making a network namespace needs root (CAP_SYS_ADMIN)"
)


def _mine() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def test_the_thread_is_back_in_its_namespace_after_making_one() -> None:
    before = _mine()
    fd, _listeners = netns.namespace_fd(())
    try:
        assert _mine() == before
        assert os.fstat(fd).st_ino != before  # the new namespace, held by the descriptor
    finally:
        os.close(fd)


def test_the_thread_is_back_when_the_work_fails() -> None:
    before = _mine()

    def fails() -> None:
        fd, _ = netns.namespace_fd(())
        try:
            netns.join_namespace(f"/proc/self/fd/{fd}")
            assert _mine() != before
        finally:
            os.close(fd)
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        netns.on_this_thread(fails)
    assert _mine() == before
