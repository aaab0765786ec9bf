"""The idmapped layers' user namespace is made once per process (``safefs._layer_userns``)
but never handed out stale: seen in the Slurm conformance run, a launcher's spare runner
process inherited the cached descriptor number after closing every descriptor it did not
know, and the task failed to start ("idmapping /usr: Bad file descriptor")."""

from __future__ import annotations

import os

import pytest

from trainyard.runner import safefs

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="mapping a user namespace to 65534 needs root")


def _is_userns(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").startswith("user:[")


def test_the_namespace_is_made_once_and_again_when_its_descriptor_is_gone() -> None:
    first = safefs._layer_userns(65534, 65534)
    assert _is_userns(first) and safefs._layer_userns(65534, 65534) == first
    os.close(first)
    stand_in = os.open("/dev/null", os.O_RDONLY)  # likely the same number, another file
    try:
        again = safefs._layer_userns(65534, 65534)
        assert _is_userns(again) and again != stand_in
    finally:
        os.close(stand_in)


def test_a_forked_process_that_closed_its_descriptors_makes_its_own() -> None:
    safefs._layer_userns(65534, 65534)
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.closerange(3, 1024)
            code = 0 if _is_userns(safefs._layer_userns(65534, 65534)) else 2
        finally:
            os._exit(code)
    _pid, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
