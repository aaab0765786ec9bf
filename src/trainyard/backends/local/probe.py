"""What isolation works on this machine: bubblewrap, group network namespaces, both together.

Probed once per process and settings; a fallback is warned about once. Pool options
``sandbox`` and ``network``: docs/local-backend.md.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainyard.backends.local.netns import ensure_group_network, probe_netns
from trainyard.backends.local.sandbox import probe_bwrap
from trainyard.errors import BackendError
from trainyard.linux import proctree

__all__ = ["Isolation", "probe_isolation", "warn_once"]

log = logging.getLogger("trainyard.backends.local")


@dataclass(frozen=True)
class Isolation:
    """How tasks are isolated on this machine: bubblewrap or not, group namespaces or not."""

    bwrap: bool
    netns: bool


_probed: dict[tuple[str, str, str], Isolation] = {}

_warned: set[str] = set()

_probe_lock = threading.Lock()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning, once per process."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _want(choice: str, name: str, why_not: str | None) -> bool:
    if why_not is None:
        return choice != "none" and choice != "loopback"
    if choice in ("bwrap", "netns"):
        raise BackendError(
            f"local backend: {name} {choice!r} was asked for but fails here: {why_not}"
        )
    return False


def _probe(sandbox: str, network: str, python: str) -> Isolation:
    why_net = probe_netns(python) if network != "loopback" else "not asked for"
    use_net = _want(network, "network", why_net)
    why_bwrap = probe_bwrap() if sandbox != "none" else "not asked for"
    use_bwrap = _want(sandbox, "sandbox", why_bwrap)
    if use_net and use_bwrap and _combined_fails(python):
        use_bwrap = _want(sandbox, "sandbox", "bubblewrap fails inside a network namespace")
    if not use_bwrap and sandbox == "auto":
        warn_once(
            f"local backend: no bubblewrap sandbox ({why_bwrap or 'fails'}); tasks share "
            "the host's /, their /tmp and file paths are rewritten to a private folder"
        )
    if not use_net and network == "auto":
        warn_once(
            f"local backend: no network namespaces ({why_net}); tasks use 127/8 "
            "addresses on the host's loopback and ports bound on 0.0.0.0 can collide"
        )
    return Isolation(bwrap=use_bwrap, netns=use_net)


def probe_isolation(
    sandbox: str = "auto", network: str = "auto", python: str = sys.executable
) -> Isolation:
    """What isolation works here (probed once per process and settings; warns once).

    Raises:
        BackendError: ``bwrap`` or ``netns`` was asked for explicitly and does not work.
    """
    with _probe_lock:
        cached = _probed.get((sandbox, network, python))
        if cached is None:
            cached = _probed[(sandbox, network, python)] = _probe(sandbox, network, python)
        return cached


def _combined_fails(python: str) -> bool:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trainyard-probe-") as tmp:
        net = ensure_group_network(Path(tmp), python=python, idle_s=0.5)
        try:
            return probe_bwrap(net.join_argv()[:-1]) is not None
        finally:
            proctree.send(
                [p for p in (_proc(net.keeper_pid), _proc(net.ns_pid)) if p], signal.SIGKILL
            )


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
