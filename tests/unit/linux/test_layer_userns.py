"""The idmapped layers' user namespace is made once per process (``safefs._layer_userns``)
but never handed out stale: seen in the Slurm conformance run, a launcher's spare runner
process inherited the cached descriptor number after closing every descriptor it did not
know, and the task failed to start ("idmapping /usr: Bad file descriptor")."""

from __future__ import annotations

import os

import pytest

from trainyard.linux import safefs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="mapping a user namespace to 65534 needs root"
)


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


def _in_child(body) -> int:  # noqa: ANN001 - a callable run in a forked child: its exit code
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            code = body()
        finally:
            os._exit(code)
    _pid, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_launchers_spare_keeps_the_namespace_and_makes_none() -> None:
    """Issue 15: a forked runner (a spare of the launcher, which closes every descriptor it
    does not know) used to fork a child to make its own namespace, ~8 ms on the start of
    the gang's task with an output. It now keeps the launcher's and makes none."""
    from trainyard.backends.local.launcher_process import forget_in_child

    made = safefs._layer_userns(65534, 65534)
    assert made in safefs.layer_userns_fds()

    def body() -> int:
        forget_in_child(keep=set())

        def no_new_namespace(*_args: object, **_kwargs: object) -> int:
            raise AssertionError("made a namespace again")

        safefs._mapped_userns = no_new_namespace  # type: ignore[assignment]
        return 0 if safefs._layer_userns(65534, 65534) == made and _is_userns(made) else 2

    assert _in_child(body) == 0


def test_the_kept_descriptor_is_close_on_exec() -> None:
    """So no task's command (bubblewrap, podman: exec'd by the runner) inherits it."""
    import fcntl

    fd = safefs._layer_userns(65534, 65534)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
