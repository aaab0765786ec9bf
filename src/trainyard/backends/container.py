"""Task images as OCI containers (podman) on the local backend.

Where the pool maps an image to the ``podman`` runtime (``images: podman`` in pools.yaml, see
``backends.images``) and podman is installed, the task's command runs in that image: the
runner stays on the host (same barrier, same files, same environment and tokens, same exit
code) and puts ``podman run ... IMAGE`` before the command, as it puts ``bwrap ... --`` there
otherwise (``SandboxSettings.command_prefix``).

What the container gets (``podman_argv``):
- the group's network namespace (``--network ns:PATH``; ``host`` for ``hostNetwork: true``
  or without namespaces), so ``{{host:TASK}}`` and the forwarded server port work as in the
  bubblewrap sandbox; the task's name as host name and the group's ``/etc/hosts``;
- the task's own ``/tmp`` (``<run_dir>/sandbox/root/tmp``, kept over RESTART), each of its
  ``files`` (written by the runner under ``<run_dir>/sandbox/root``, bound one by one so the
  image's own folders stay visible), its output, input and barrier folders at their host
  paths (the tokens name those);
- its environment by name only (``--env NAME``, inserted by the runner, see
  ``SandboxSettings.env_flag``): values never appear on a command line; ``PATH`` stays the
  image's;
- ``--pull never``: nothing is pulled (no registry may be reachable); an image that is not in
  podman's local storage fails the task at start (``missing_image_message``);
- ``--rm`` and a name derived from the run folder (``container_name``), so the backend can
  remove what a killed runner left (``remove_containers``): podman's container does not die
  with the ``podman run`` process that the runner stops;
- resource limits no higher than the runner's own (``_ulimit_args``): podman's defaults are
  higher, which a host without CAP_SYS_RESOURCE refuses;
- the OCI runtime ``runc`` where installed: Debian 12's crun refuses hosts with cgroup v1 and
  v2 controllers mounted together ("cgroups in hybrid mode not supported").
"""

from __future__ import annotations

import hashlib
import logging
import os
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.backends.sandbox import OSMO_WORKSPACE

__all__ = ["ContainerPlan", "podman_argv", "container_mounts", "container_name",
           "probe_podman", "image_present", "missing_image_message", "remove_containers",
           "RUNTIME"]

log = logging.getLogger("trainyard.backends.local")

RUNTIME = "podman"
"""The ``images`` runtime name that asks for a container."""
_NPROC_CEILING = 32768
"""podman 4.3 lowers its own RLIMIT_NPROC to this, and its container may not exceed it."""
_QUERY_TIMEOUT_S = 30.0
_REMOVE_TRIES = 5


@dataclass(frozen=True)
class ContainerPlan:
    """One task's container (see module docstring).

    Attributes:
        image: the spec's image, as podman names it.
        name: the container's name (``container_name``).
        hostname: the task's name.
        network: ``ns:PATH`` (a network namespace file) or ``host``.
        root_dir: the task's own folder that the runner writes files into (``/`` for it).
        hosts_file: bound read-only at ``/etc/hosts`` (None: podman's).
        files: absolute paths (inside) of the task's files, each bound from ``root_dir``.
        writable: host folders bound read-write at the same path.
    """

    image: str
    name: str
    hostname: str
    network: str
    root_dir: Path
    hosts_file: Path | None = None
    files: tuple[str, ...] = ()
    writable: tuple[str, ...] = field(default_factory=tuple)


def container_name(run_dir: Path) -> str:
    """A stable container name for an attempt's run folder."""
    digest = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:24]
    return f"trainyard-{digest}"


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _ulimit_args() -> list[str]:
    args = []
    for name, which, ceiling in (("nofile", resource.RLIMIT_NOFILE, None),
                                 ("nproc", resource.RLIMIT_NPROC, _NPROC_CEILING)):
        soft, hard = resource.getrlimit(which)
        hard = hard if hard != resource.RLIM_INFINITY else (ceiling or 1 << 20)
        hard = min(hard, ceiling) if ceiling else hard
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        args += ["--ulimit", f"{name}={soft}:{hard}"]
    return args


def _bind(host: str, inside: str, readonly: bool = False) -> list[str]:
    return ["--volume", f"{host}:{inside}:{'ro' if readonly else 'rw'}"]


def _bind_args(plan: ContainerPlan) -> list[str]:
    args = _bind(str(plan.root_dir / "tmp"), "/tmp")
    args += _bind(str(plan.root_dir) + OSMO_WORKSPACE, OSMO_WORKSPACE)  # made by _prepare
    shown = ["/tmp", OSMO_WORKSPACE, *plan.writable]
    for path in plan.files:
        if not any(_under(path, folder) for folder in shown):
            args += _bind(str(plan.root_dir) + path, path)
    for folder in sorted(set(plan.writable), key=lambda p: (len(Path(p).parts), p)):
        args += _bind(folder, folder)
    if plan.hosts_file is not None:
        args += _bind(str(plan.hosts_file), "/etc/hosts", readonly=True)
    return args


def podman_argv(plan: ContainerPlan, podman: str = "podman") -> list[str]:
    """``podman run ... IMAGE``: the prefix the task's command follows. Ends with the image,
    before which the runner inserts ``--env NAME`` pairs (``SandboxSettings.env_flag``)."""
    argv = [podman]
    if shutil.which("runc"):
        argv += ["--runtime", "runc"]
    argv += ["run", "--rm", "--pull", "never", "--name", plan.name,
             "--label", "trainyard=task", "--network", plan.network,
             "--hostname", plan.hostname, "--log-driver", "none", "--workdir", "/",
             *_ulimit_args(), *_bind_args(plan)]
    return [*argv, plan.image]


def container_mounts(plan: ContainerPlan) -> dict[str, str]:
    """Where the runner writes what the container shows (``SandboxSettings.mounts``): files
    under ``root_dir`` (``/``), the same-path folders as themselves."""
    mounts = {"/": str(plan.root_dir)}
    mounts.update({folder: folder for folder in plan.writable})
    return mounts


def probe_podman(podman: str = "podman") -> str | None:
    """None when podman is installed, else why not."""
    if shutil.which(podman) is None:
        return f"{podman} is not installed (Debian package podman)"
    return None


def image_present(image: str, podman: str = "podman") -> bool:
    """Whether ``image`` is in podman's local storage (``podman image exists``; never pulls)."""
    try:
        done = subprocess.run([podman, "image", "exists", image], capture_output=True,
                              timeout=_QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def missing_image_message(image: str) -> str:
    """The task log's line for an image that is not present locally."""
    return (f"image {image!r} is not present in podman's local storage and is never pulled "
            f"here: build or load it first (podman build, podman load, podman pull on a "
            f"machine with a registry), then restart the workflow")


def remove_containers(names: Iterable[str], podman: str = "podman",
                      background: bool = True) -> None:
    """Remove these containers with whatever still runs in them (``podman rm -f``);
    names that no longer exist are ignored. In a background thread unless asked."""
    wanted = sorted(set(names))
    if not wanted:
        return

    def work() -> None:
        for _ in range(_REMOVE_TRIES):
            try:
                done = subprocess.run([podman, "rm", "--force", "--ignore", "--time", "0",
                                       *wanted], capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not remove containers %s: %s", ", ".join(wanted), exc)
                return
            if done.returncode == 0:
                return
            log.warning("podman rm %s: %s", " ".join(wanted), done.stderr.strip()[-300:])
            time.sleep(1.0)

    if background:
        threading.Thread(target=work, name="podman-rm", daemon=True).start()
    else:
        work()
