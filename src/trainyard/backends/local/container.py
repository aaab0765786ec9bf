"""Task images as OCI containers (podman) on the local backend: the run.

Where the pool maps an image to the ``podman`` runtime (``images: podman`` in pools.yaml, see
``backends.images``) and podman is installed, the runner stays on the host and puts
``podman run ... IMAGE`` before the task's command (``podman_argv``), as it puts
``bwrap ... --`` there otherwise (``SandboxSettings.command_prefix``). No privileges over
the host: uid 0 in the container is the host's ``nobody``, every capability dropped,
``no-new-privileges``, no nested user namespace (``seccomp_profile``). The image and the
container's own root: ``container_image``; a pull with the submitter's credential:
``image_pull``. What the container gets, flag by flag: docs/local-backend.md,
"Containers (podman)".
"""

from __future__ import annotations

import functools
import hashlib
import json
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
from typing import Any

import yaml

from trainyard.backends.local.sandbox import OSMO_WORKSPACE, gpu_device_nodes
from trainyard.linux.safefs import MAPPED_OTHER_IDS
from trainyard.runfile import TaskLimits, UserNamespace

__all__ = [
    "ContainerPlan",
    "podman_argv",
    "container_mounts",
    "container_name",
    "probe_podman",
    "remove_containers",
    "RUNTIME",
    "TASK_HOST_ID",
    "ROOT_OWNED",
    "container_userns",
    "containers_conf",
    "seccomp_profile",
    "no_nested_userns",
    "gpu_devices",
    "cdi_gpu_names",
    "CDI_DIRS",
    "CDI_GPU_KIND",
    "rootfs_path",
    "ROOTFS_PARENT",
]

log = logging.getLogger("trainyard.backends.local")

RUNTIME = "podman"
"""The ``images`` runtime name that asks for a container."""
_NPROC_CEILING = 32768
"""podman 4.3 lowers its own RLIMIT_NPROC to this, and its container may not exceed it."""
TASK_HOST_ID = 65534
"""The host uid and gid of the container's root: ``nobody``, as ``sandbox.TASK_HOST_UID``."""
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
        volumes: the pool-allowed ``volumeMounts`` as ``(host folder, path inside)``, bound
            read-write; the runner first mounts each host folder over itself idmapped in its
            own mount namespace (``linux.safefs.idmap_in_place``: the host's root seen as
            the container's), in which podman then runs, so the container's root writes them
            as the bubblewrap sandbox's does.
        devices: ``--device`` values: the task's GPUs (``gpu_devices``).
        rootfs: where the runner mounts the container's own root (``root_overlay``), which
            podman then runs (``--rootfs``); None: podman's container layer over the image.
        image_env: the image's ``ENV`` (``NAME=VALUE``), passed with ``rootfs`` only.
        id_bases: the host uid and gid of the container's ids 1.. (``task_id_bases``), with
            ``rootfs`` only; None: only its root is mapped.
        user: ``--user`` (the image's ``USER``, with ``id_bases``); "": podman's choice.
        conf: podman's ``containers.conf`` (``containers_conf``; None: the host's).
        seccomp: the seccomp profile (``seccomp_profile``; None: podman's default).
        limits: the task's limits as podman's own flags (``--memory``, ``--memory-swap``
            the same: no swap beyond it, ``--pids-limit``, ``--cpus``); None: none.
    """

    image: str
    name: str
    hostname: str
    network: str
    root_dir: Path
    hosts_file: Path | None = None
    files: tuple[str, ...] = ()
    writable: tuple[str, ...] = field(default_factory=tuple)
    volumes: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = ()
    rootfs: Path | None = None
    image_env: tuple[str, ...] = ()
    id_bases: tuple[int, int] | None = None
    user: str = ""
    conf: Path | None = None
    seccomp: Path | None = None
    limits: TaskLimits | None = None


def container_name(run_dir: Path) -> str:
    """A stable container name for an attempt's run folder."""
    digest = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:24]
    return f"trainyard-{digest}"


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _limit_args(plan: ContainerPlan) -> list[str]:
    limits = plan.limits
    if limits is None:
        return []
    args = []
    if limits.memory_bytes:
        args += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    if limits.pids_max:
        args += ["--pids-limit", str(limits.pids_max)]
    if limits.cpu:
        args += ["--cpus", f"{limits.cpu:g}"]
    return args


def _ulimit_args() -> list[str]:
    args = []
    for name, which, ceiling in (
        ("nofile", resource.RLIMIT_NOFILE, None),
        ("nproc", resource.RLIMIT_NPROC, _NPROC_CEILING),
    ):
        soft, hard = resource.getrlimit(which)
        hard = hard if hard != resource.RLIM_INFINITY else (ceiling or 1 << 20)
        hard = min(hard, ceiling) if ceiling else hard
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        args += ["--ulimit", f"{name}={soft}:{hard}"]
    return args


def _privilege_args(plan: ContainerPlan | None = None) -> list[str]:
    """The user namespace (root inside is the host's ``nobody``; with ``id_bases`` its ids
    1..65535 are the host's ``BASE``.., else no other id is mapped), no capability,
    ``no_new_privs`` (see module docstring)."""
    ids = f"0:{TASK_HOST_ID}:1"
    maps = ["--uidmap", ids, "--gidmap", ids]
    if plan is not None and plan.id_bases is not None:
        uid_base, gid_base = plan.id_bases
        maps += [
            "--uidmap",
            f"1:{uid_base}:{MAPPED_OTHER_IDS}",
            "--gidmap",
            f"1:{gid_base}:{MAPPED_OTHER_IDS}",
        ]
    return [*maps, "--cap-drop", "all", "--security-opt", "no-new-privileges"]


def _seccomp_args(plan: ContainerPlan) -> list[str]:
    return [] if plan.seccomp is None else ["--security-opt", f"seccomp={plan.seccomp}"]


def _bind(host: str, inside: str, readonly: bool = False) -> list[str]:
    return ["--volume", f"{host}:{inside}:{'ro' if readonly else 'rw'}"]


def _bind_args(plan: ContainerPlan) -> list[str]:
    args = [] if plan.rootfs else _bind(str(plan.root_dir / "tmp"), "/tmp")
    args += _bind(str(plan.root_dir) + OSMO_WORKSPACE, OSMO_WORKSPACE)  # made by _prepare
    shown = ["/tmp", OSMO_WORKSPACE, *plan.writable, *(inside for _, inside in plan.volumes)]
    for path in [] if plan.rootfs else plan.files:  # in its own root they are written there
        if not any(_under(path, folder) for folder in shown):
            args += _bind(str(plan.root_dir) + path, path)
    for folder in sorted(set(plan.writable), key=lambda p: (len(Path(p).parts), p)):
        args += _bind(folder, folder)
    for host, inside in sorted(set(plan.volumes), key=lambda v: (len(Path(v[1]).parts), v)):
        args += _bind(host, inside)
    if plan.hosts_file is not None:
        args += _bind(str(plan.hosts_file), "/etc/hosts", readonly=True)
    return args


def podman_argv(plan: ContainerPlan, podman: str = "podman") -> list[str]:
    """``podman run ... IMAGE`` (or ``... --rootfs ROOT``): the prefix the task's command
    follows. Ends with the image (the root), before which the runner inserts ``--env-file
    FILE`` (``SandboxSettings.env_flag``); with ``rootfs`` the image's own ``ENV`` goes in
    that file first (``SandboxSettings.env_defaults``), so the task's variables win."""
    argv = [podman]
    if plan.conf is not None:
        argv = ["env", f"CONTAINERS_CONF={plan.conf}", *argv]
    if shutil.which("runc"):
        argv += ["--runtime", "runc"]
    argv += [
        "run",
        "--rm",
        "--pull",
        "never",
        "--name",
        plan.name,
        "--label",
        "trainyard=task",
        "--network",
        plan.network,
        "--hostname",
        plan.hostname,
        "--log-driver",
        "none",
        "--workdir",
        "/",
        *_privilege_args(plan),
        *_seccomp_args(plan),
        *_ulimit_args(),
        *_limit_args(plan),
        *_bind_args(plan),
    ]
    for device in plan.devices:
        argv += ["--device", device]
    if plan.user:
        argv += ["--user", plan.user]
    if plan.rootfs is None:
        return [*argv, plan.image]
    return [*argv, "--rootfs", str(plan.rootfs)]  # a flag without value: --env-file may follow


CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""Where podman looks for CDI specs (containers.conf ``cdi_spec_dirs``, its default)."""
CDI_GPU_KIND = "nvidia.com/gpu"
"""The CDI kind of NVIDIA's GPUs (``nvidia-ctk cdi generate`` names them ``0``, ``1``...)."""


@functools.lru_cache(maxsize=4)
def cdi_gpu_names(dirs: tuple[Path, ...] = CDI_DIRS) -> frozenset[str]:
    """The device names of the ``nvidia.com/gpu`` CDI specs in ``dirs`` (``*.yaml``,
    ``*.yml``, ``*.json``; a file that cannot be read or parsed is skipped). Asked once
    per process, as ``sandbox.gpu_device_nodes``."""
    names: set[str] = set()
    for folder in dirs:
        files = sorted(folder.glob("*.y*ml")) + sorted(folder.glob("*.json"))
        for path in files:
            try:
                doc = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError, UnicodeDecodeError):
                continue
            if isinstance(doc, dict) and doc.get("kind") == CDI_GPU_KIND:
                names.update(
                    str(d.get("name"))
                    for d in doc.get("devices") or []
                    if isinstance(d, dict) and d.get("name") is not None
                )
    return frozenset(names)


def gpu_devices(
    gpus: Iterable[int], nodes: Iterable[str] | None = None, cdi_names: Iterable[str] | None = None
) -> tuple[tuple[str, ...], str]:
    """The ``--device`` values and the ``CUDA_VISIBLE_DEVICES`` of a container lent ``gpus``
    (machine-wide indices, ``local.GpuLeases``); see the module docstring.

    Args:
        gpus: the lent GPUs' indices (empty: no device, ``CUDA_VISIBLE_DEVICES`` "").
        nodes: the host's GPU device nodes and folders (default ``gpu_device_nodes()``).
        cdi_names: the CDI ``nvidia.com/gpu`` device names (default ``cdi_gpu_names()``).

    Returns:
        (``--device`` values, ``CUDA_VISIBLE_DEVICES``).
    """
    lent = sorted(set(gpus))
    if not lent:
        return (), ""
    named = cdi_gpu_names() if cdi_names is None else frozenset(cdi_names)
    if all(str(g) in named for g in lent):
        return (
            tuple(f"{CDI_GPU_KIND}={g}" for g in lent),
            ",".join(str(i) for i in range(len(lent))),
        )
    found = gpu_device_nodes() if nodes is None else tuple(nodes)
    return tuple(found), ",".join(str(g) for g in lent)


CONTAINERS_CONF_TEXT = """# trainyard: podman's settings for task containers (backends/local/container.py).
# No default sysctls: a task's container joins its group's network namespace, which its
# remapped root may not change (net.ipv4.ping_group_range would fail the start).
[containers]
default_sysctls = []
"""


def containers_conf(state_dir: Path) -> Path:
    """trainyard's ``containers.conf`` for podman (``CONTAINERS_CONF_TEXT``), written once
    under ``state_dir`` (atomically; rewritten when its text changed). Raises OSError."""
    return _write_once(state_dir / "containers.conf", CONTAINERS_CONF_TEXT)


PODMAN_SECCOMP = Path("/usr/share/containers/seccomp.json")
"""podman's default seccomp profile (Debian package golang-github-containers-common)."""
_CLONE_NEWUSER = 0x10000000
_EPERM, _ENOSYS = 1, 38
_GUARDED = ("unshare", "clone", "clone3")


def no_nested_userns(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` (an OCI seccomp profile) with ``unshare`` and ``clone`` allowed only
    without ``CLONE_NEWUSER`` (EPERM with it) and ``clone3`` refused with ENOSYS."""
    syscalls = []
    for rule in profile.get("syscalls", []):
        if rule.get("name") in _GUARDED:  # the older one-name form
            continue
        names = [n for n in rule.get("names", []) if n not in _GUARDED]
        if names or not rule.get("names"):
            syscalls.append({**rule, "names": names} if "names" in rule else rule)

    def masked(action: str, value: int, **extra: Any) -> dict[str, Any]:
        arg = {"index": 0, "value": _CLONE_NEWUSER, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}
        return {"names": ["unshare", "clone"], "action": action, "args": [arg], **extra}

    syscalls += [
        masked("SCMP_ACT_ALLOW", 0),
        masked("SCMP_ACT_ERRNO", _CLONE_NEWUSER, errnoRet=_EPERM),
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ENOSYS},
    ]
    return {**profile, "syscalls": syscalls}


def seccomp_profile(state_dir: Path, source: Path = PODMAN_SECCOMP) -> Path | None:
    """podman's profile with no nested user namespaces (``no_nested_userns``), written under
    ``state_dir`` (atomically, when its text changed); None where ``source`` is missing."""
    try:
        profile = json.loads(source.read_text())
    except (OSError, ValueError):
        return None
    return _write_once(state_dir / "seccomp.json", json.dumps(no_nested_userns(profile), indent=1))


def _write_once(path: Path, text: str) -> Path:
    """``path`` holding ``text``: left alone when it already does, else replaced atomically."""
    if path.is_file() and path.read_text() == text:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    staging.write_text(text)
    staging.chmod(0o644)
    os.replace(staging, path)
    return path


ROOT_OWNED = ("tmp", "etc")
"""Folders of a container's own root given to its root (made if missing) before the start."""


def container_userns(
    plan: ContainerPlan, links: Iterable[str] = (), data_ids: tuple[int, int] | None = None
) -> UserNamespace:
    """What the runner gives the container's root before the start: its root folder (the
    files' parents), ``/tmp`` (1777) and ``/osmo/run/workspace`` (was the host root's, so
    not writable to the task), with ``rootfs`` also its ``/etc`` (podman makes
    its ``/etc/hosts``... mount points there as the container's root) unless the image has
    them as symlinks (``links``, ``container_image.image_links``: the runner never follows
    one); the output and input folders are given without being named
    (``runfile.UserNamespace``), to ``data_ids`` (host uid, gid: the image's ``USER``,
    ``container_image.user_host_ids``) where given. No ``args_at``: podman maps the ids."""
    workspace = str(plan.root_dir) + OSMO_WORKSPACE  # bound; the task cannot change its way
    own = [str(plan.root_dir), str(plan.root_dir / "tmp"), workspace]
    if plan.rootfs is not None:
        mine = [d for d in ROOT_OWNED if d not in set(links)]
        own = [
            str(plan.root_dir),
            workspace,
            str(plan.rootfs),
            *(str(plan.rootfs / d) for d in mine),
        ]
    data_uid, data_gid = data_ids if data_ids is not None else (None, None)
    return UserNamespace(
        host_uid=TASK_HOST_ID, host_gid=TASK_HOST_ID, own=own, data_uid=data_uid, data_gid=data_gid
    )


def container_mounts(plan: ContainerPlan) -> dict[str, str]:
    """Where the runner writes what the container shows (``SandboxSettings.mounts``): files
    under ``root_dir`` (``/``; ``rootfs`` when it has one, ``/osmo/run/workspace`` still in
    ``root_dir``), the same-path folders as themselves, a volume's path inside as its host
    folder."""
    mounts = {"/": str(plan.root_dir)}
    if plan.rootfs is not None:
        mounts = {"/": str(plan.rootfs), OSMO_WORKSPACE: str(plan.root_dir) + OSMO_WORKSPACE}
    mounts.update({folder: folder for folder in plan.writable})
    mounts.update({inside: host for host, inside in plan.volumes})
    return mounts


ROOTFS_PARENT = Path("/run/trainyard/rootfs")
"""Where the runner mounts the containers' own roots (``container_image.root_overlay``), each
in its mount namespace; made 0711, the folders in it stay empty on the host."""


def rootfs_path(name: str) -> Path:
    """Where the container ``name``'s own root is mounted (``ROOTFS_PARENT``)."""
    return ROOTFS_PARENT / name


def probe_podman(podman: str = "podman") -> str | None:
    """None when podman is installed, else why not."""
    if shutil.which(podman) is None:
        return f"{podman} is not installed (Debian package podman)"
    return None


def remove_containers(
    names: Iterable[str], podman: str = "podman", background: bool = True
) -> None:
    """Remove these containers with whatever still runs in them (``podman rm -f``);
    names that no longer exist are ignored. In a background thread unless asked."""
    wanted = sorted(set(names))
    if not wanted:
        return

    def work() -> None:
        for _ in range(_REMOVE_TRIES):
            try:
                done = subprocess.run(
                    [podman, "rm", "--force", "--ignore", "--time", "0", *wanted],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not remove containers %s: %s", ", ".join(wanted), exc)
                return
            if done.returncode == 0:
                _remove_mount_points(wanted)
                return
            log.warning("podman rm %s: %s", " ".join(wanted), done.stderr.strip()[-300:])
            time.sleep(1.0)

    if background:
        threading.Thread(target=work, name="podman-rm", daemon=True).start()
    else:
        work()


def _remove_mount_points(names: Iterable[str]) -> None:
    """Remove the (empty, on the host) ``rootfs_path`` folders of removed containers."""
    for name in names:
        try:
            rootfs_path(name).rmdir()
        except OSError:
            pass
