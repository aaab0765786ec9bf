"""Task images as OCI containers (podman) on the local backend.

Where the pool maps an image to the ``podman`` runtime (``images: podman`` in pools.yaml, see
``backends.images``) and podman is installed, the runner stays on the host and puts
``podman run ... IMAGE`` before the task's command (``podman_argv``), as it puts
``bwrap ... --`` there otherwise (``SandboxSettings.command_prefix``). ``--pull never``: an
image missing from podman's storage is pulled at start only with the submitter's REGISTRY
credential (``pull_image``), else the task fails with FAILED_IMAGE_PULL. No privileges over
the host: uid 0 in the container is the host's ``nobody``, every capability dropped,
``no-new-privileges``, no nested user namespace (``seccomp_profile``).
What the container gets, flag by flag: docs/local-backend.md, "Containers (podman)".
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

from trainyard.backends.images import image_registry
from trainyard.backends.local.sandbox import OSMO_WORKSPACE, gpu_device_nodes
from trainyard.linux.safefs import MAPPED_OTHER_IDS
from trainyard.runfile import OverlayMount, TaskLimits, UserNamespace

__all__ = [
    "AUTH_FILE",
    "PULL_TIMEOUT_S",
    "auth_json",
    "pull_image",
    "pull_failed_message",
    "ContainerPlan",
    "podman_argv",
    "container_mounts",
    "container_name",
    "probe_podman",
    "image_present",
    "missing_image_message",
    "remove_containers",
    "RUNTIME",
    "TASK_HOST_ID",
    "container_userns",
    "containers_conf",
    "seccomp_profile",
    "no_nested_userns",
    "gpu_devices",
    "cdi_gpu_names",
    "CDI_DIRS",
    "CDI_GPU_KIND",
    "ImageInfo",
    "image_info",
    "inspect_image",
    "why_no_own_root",
    "root_overlay",
    "prepare_rootfs",
    "rootfs_path",
    "root_note",
    "ROOTFS_PARENT",
    "user_note",
    "image_links",
    "task_id_bases",
    "user_ids",
    "user_host_ids",
    "ID_RANGE_OWNER",
]

log = logging.getLogger("trainyard.backends.local")

RUNTIME = "podman"
"""The ``images`` runtime name that asks for a container."""
_NPROC_CEILING = 32768
"""podman 4.3 lowers its own RLIMIT_NPROC to this, and its container may not exceed it."""
_QUERY_TIMEOUT_S = 30.0
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


_ROOT_OWNED = ("tmp", "etc")
"""Folders of a container's own root given to its root (made if missing) before the start."""


def container_userns(
    plan: ContainerPlan, links: Iterable[str] = (), data_ids: tuple[int, int] | None = None
) -> UserNamespace:
    """What the runner gives the container's root before the start: its root folder (the
    files' parents), ``/tmp`` (1777) and ``/osmo/run/workspace`` (was the host root's, so
    not writable to the task), with ``rootfs`` also its ``/etc`` (podman makes
    its ``/etc/hosts``... mount points there as the container's root) unless the image has
    them as symlinks (``links``, ``image_links``: the runner never follows one); the output
    and input folders are given without being named (``runfile.UserNamespace``), to
    ``data_ids`` (host uid, gid: the image's ``USER``, ``user_host_ids``) where given. No
    ``args_at``: podman maps the ids."""
    workspace = str(plan.root_dir) + OSMO_WORKSPACE  # bound; the task cannot change its way
    own = [str(plan.root_dir), str(plan.root_dir / "tmp"), workspace]
    if plan.rootfs is not None:
        mine = [d for d in _ROOT_OWNED if d not in set(links)]
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


def image_links(info: ImageInfo, names: Iterable[str] = _ROOT_OWNED) -> set[str]:
    """Which top-level ``names`` the image has as symlinks (``/tmp -> /var/tmp``): as the
    top-most layer holding the name has it."""
    found = set()
    for name in names:
        for layer in info.layers:
            path = os.path.join(layer, name)
            if os.path.lexists(path):
                if os.path.islink(path):
                    found.add(name)
                break
    return found


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
"""Where the runner mounts the containers' own roots, each in its mount namespace (see the
module docstring); made 0711, the folders in it stay empty on the host."""


@dataclass(frozen=True)
class ImageInfo:
    """What ``inspect_image`` found of a local image.

    Attributes:
        id: podman's image id.
        layers: its layer folders in podman's storage, top first; empty unless podman's
            storage driver is ``overlay``.
        env: its ``ENV``, as ``NAME=VALUE``.
        user: its ``USER`` (``""``: root).
    """

    id: str
    layers: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    user: str = ""

    @property
    def runs_as_root(self) -> bool:
        """Whether its ``USER`` is root (user and group ``""``, ``root`` or ``0``): the only
        id a container's user namespace maps here (``_privilege_args``)."""
        return all(part in ("", "root", "0") for part in self.user.split(":", 1))


def image_info(doc: dict[str, Any]) -> ImageInfo:
    """An ``ImageInfo`` from one object of ``podman image inspect``'s JSON."""
    driver = doc.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    layers: tuple[str, ...] = ()
    if driver.get("Name") == "overlay" and data.get("UpperDir"):
        below = [p for p in str(data.get("LowerDir") or "").split(":") if p]
        layers = (str(data["UpperDir"]), *below)
    config = doc.get("Config") or {}
    env = tuple(str(v) for v in config.get("Env") or ())
    user = str(config.get("User") or doc.get("User") or "")
    return ImageInfo(id=str(doc.get("Id", "")), layers=layers, env=env, user=user)


def inspect_image(image: str, podman: str = "podman") -> ImageInfo | None:
    """``image`` as podman's local storage has it (``podman image inspect``; never pulls),
    or None when it is not there (or podman cannot say)."""
    try:
        done = subprocess.run(
            [podman, "image", "inspect", image],
            capture_output=True,
            text=True,
            timeout=_QUERY_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return image_info(json.loads(done.stdout)[0])
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return None


def why_no_own_root(info: ImageInfo, overlay_ok: bool) -> str | None:
    """None when an image task can get a root of its own (``root_overlay``), else why not.

    Args:
        info: the image (``inspect_image``).
        overlay_ok: whether the runner can mount overlayfs here (``sandbox.overlay_supported``).
    """
    if not overlay_ok:
        return "the runner cannot mount overlayfs here (needs root)"
    if not info.layers:
        return "podman's storage driver is not overlay, so its layers cannot be stacked"
    return None


def root_overlay(plan: ContainerPlan, info: ImageInfo, layer_dir: Path) -> OverlayMount:
    """The container's own root for the runner to mount at ``plan.rootfs``: the image's
    layers, idmapped, under ``layer_dir/upper`` (see the module docstring)."""
    assert plan.rootfs is not None and info.layers
    return OverlayMount(
        lower=info.layers[0],
        lower_below=list(info.layers[1:]),
        upper=str(layer_dir / "upper"),
        work=str(layer_dir / "work"),
        target=str(plan.rootfs),
        idmap_uid=TASK_HOST_ID,
        idmap_gid=TASK_HOST_ID,
        nodev=True,
        idmap_uid_base=plan.id_bases[0] if plan.id_bases else None,
        idmap_gid_base=plan.id_bases[1] if plan.id_bases else None,
    )


def prepare_rootfs(plan: ContainerPlan, layer: OverlayMount) -> None:
    """Make ``ROOTFS_PARENT`` (0711: the container's root passes, nobody lists it) and the
    upper folder (0755: the mode of the container's ``/``). Raises OSError."""
    assert plan.rootfs is not None
    for folder in (plan.rootfs.parent.parent, plan.rootfs.parent):
        folder.mkdir(mode=0o711, parents=True, exist_ok=True)
        folder.chmod(0o711)
    upper = Path(layer.upper)
    upper.mkdir(mode=0o755, parents=True, exist_ok=True)
    upper.chmod(0o755)


def rootfs_path(name: str) -> Path:
    """Where the container ``name``'s own root is mounted (``ROOTFS_PARENT``)."""
    return ROOTFS_PARENT / name


def root_note(why_not: str | None) -> str:
    """The task log's line on the container's root (``why_no_own_root``)."""
    if why_not is None:
        return (
            "container root: its own writable root (the image's layers under a layer of "
            "this attempt's: RESTART keeps it, RESCHEDULE starts afresh)"
        )
    return f"container root: podman's container layer, which RESTART does NOT keep ({why_not})"


ID_RANGE_OWNER = "trainyard"
"""The ``/etc/subuid`` and ``/etc/subgid`` entry (``trainyard:START:COUNT``, COUNT at least
65535) whose host ids a container's ids 1..65535 are, where it has its own root."""
SUBUID, SUBGID = Path("/etc/subuid"), Path("/etc/subgid")


def _range_start(path: Path, owner: str) -> int | None:
    """START of the first ``owner:START:COUNT`` line of ``path`` with COUNT >= 65535 and
    START above the ids a container's root may be (65535), else None."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] == owner and parts[1].isdigit() and parts[2].isdigit():
            start, count = int(parts[1]), int(parts[2])
            if count >= MAPPED_OTHER_IDS and start > MAPPED_OTHER_IDS:
                return start
    return None


def task_id_bases(
    subuid: Path = SUBUID, subgid: Path = SUBGID, owner: str = ID_RANGE_OWNER
) -> tuple[int, int] | None:
    """The host uid and gid of a container's id 1 (``ID_RANGE_OWNER``'s ranges), or None
    where the host lends no such range (then only the container's root is mapped)."""
    uid, gid = _range_start(subuid, owner), _range_start(subgid, owner)
    return None if uid is None or gid is None else (uid, gid)


def _image_file(info: ImageInfo, relative: str) -> str:
    """The text of the file ``relative`` in the image (its top-most layer that has the
    name; a link or anything but a regular file there: ""), or ""."""
    for layer in info.layers:
        path = os.path.join(layer, relative)
        if os.path.lexists(path):
            if os.path.islink(path) or not os.path.isfile(path):
                return ""
            try:
                return Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                return ""
    return ""


def _lookup(text: str, name: str, field_index: int) -> int | None:
    """Field ``field_index`` of the ``/etc/passwd``-like line whose first field is ``name``."""
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > field_index and fields[0] == name and fields[field_index].isdigit():
            return int(fields[field_index])
    return None


def user_ids(info: ImageInfo) -> tuple[int, int] | None:
    """The image's ``USER`` as (uid, gid) inside the container: numbers as given, names
    from its ``/etc/passwd`` and ``/etc/group``; without a group, a name's passwd group,
    and 0 for a number (as podman, for an id its ``/etc/passwd`` does not list). None when
    a name is not found or an id is above 65535 (not mapped)."""
    user, _, group = info.user.partition(":")
    passwd = "" if user.isdigit() else _image_file(info, "etc/passwd")
    uid = int(user) if user.isdigit() else _lookup(passwd, user, 2)
    if group.isdigit():
        gid: int | None = int(group)
    elif group:
        gid = _lookup(_image_file(info, "etc/group"), group, 2)
    else:
        gid = 0 if user.isdigit() else _lookup(passwd, user, 3)
    if uid is None or gid is None or max(uid, gid) > MAPPED_OTHER_IDS:
        return None
    return uid, gid


def user_host_ids(ids: tuple[int, int], bases: tuple[int, int]) -> tuple[int, int]:
    """The host uid and gid of the container's ``ids`` (0: ``TASK_HOST_ID``)."""
    return tuple(
        TASK_HOST_ID if i == 0 else base + i - 1  # type: ignore[return-value]
        for i, base in zip(ids, bases, strict=True)
    )


def user_note(
    image: str, info: ImageInfo, own_root: bool, mapped: bool = False
) -> tuple[str, str | None]:
    """What becomes of an image whose ``USER`` is not root: with ``mapped`` (its own root
    and ``task_id_bases``) it runs as that user, nothing to say; else only uid 0 is mapped:
    with its own root the command runs as root anyway (a line for the task log); with
    podman's container layer it cannot start (a start error). ``("", None)`` for a root
    image.

    Returns:
        (a line for the task log, or ""; a start error, or None).
    """
    if info.runs_as_root or mapped:
        return "", None
    if own_root:
        return (
            f"image USER {info.user!r} is not used: the command runs as root inside (uid "
            f"0, the host's nobody, is the only id mapped: no {ID_RANGE_OWNER} range in "
            f"{SUBUID} and {SUBGID}, or the user is not found in the image)"
        ), None
    return "", (
        f"image {image!r} runs as USER {info.user!r}, but uid 0 is the only id mapped "
        "in its container here and, without a root of its own, podman would start it "
        "as that user: use an image that runs as root, or a pool whose server runs as "
        "root with podman's overlay storage (docs/security.md, Images)"
    )


def probe_podman(podman: str = "podman") -> str | None:
    """None when podman is installed, else why not."""
    if shutil.which(podman) is None:
        return f"{podman} is not installed (Debian package podman)"
    return None


def image_present(image: str, podman: str = "podman") -> bool:
    """Whether ``image`` is in podman's local storage (``podman image exists``; never pulls)."""
    try:
        done = subprocess.run(
            [podman, "image", "exists", image], capture_output=True, timeout=_QUERY_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def missing_image_message(image: str) -> str:
    """The task log's line for an image that is not present locally."""
    return (
        f"image {image!r} is not present in podman's local storage and is pulled here "
        f"only with a registry credential of yours for {image_registry(image)} (trainyard "
        f"credential set NAME --type REGISTRY --payload registry={image_registry(image)} "
        f"username=USER auth=TOKEN), or build or load it first (podman build, podman "
        f"load), then restart the workflow"
    )


AUTH_FILE = "registry-auth.json"
"""The auth file of a pull (``pull_image``), in the attempt's run folder, for the pull only."""
PULL_TIMEOUT_S = 600.0
"""The longest a pull may take before the task fails at start (FAILED_IMAGE_PULL)."""


def _basic(payload: dict[str, str]) -> str:
    """docker's ``auth`` value, base64 of ``user:password``: OSMO's ``username`` and
    ``auth`` (the password or token); without ``username``, ``auth`` is taken as that value
    already (as in a docker ``config.json``)."""
    import base64

    if payload.get("username"):
        return base64.b64encode(f"{payload['username']}:{payload['auth']}".encode()).decode()
    return payload["auth"]


def auth_json(image: str, payloads: list[dict[str, str]]) -> str:
    """The ``containers-auth.json`` (``{"auths": {REGISTRY: {"auth": ...}}}``) that gives
    podman the first of ``payloads`` for ``image``'s registry (``images.image_registry``).

    Raises:
        ValueError: ``payloads`` is empty.
    """
    if not payloads:
        raise ValueError("no registry credential")
    return json.dumps({"auths": {image_registry(image): {"auth": _basic(payloads[0])}}})


def _write_auth(folder: Path, text: str) -> Path:
    """``folder/AUTH_FILE``, created 0600 (an old one removed first: never followed)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / AUTH_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return path


def _masked(text: str, payloads: list[dict[str, str]]) -> str:
    for payload in payloads:
        for value in (payload.get("auth", ""), _basic(payload) if payload.get("auth") else ""):
            if len(value) >= 4:
                text = text.replace(value, "***")
    return text


def pull_image(
    image: str,
    payloads: list[dict[str, str]],
    folder: Path,
    *,
    podman: str = "podman",
    tls_verify: bool = True,
    timeout_s: float = PULL_TIMEOUT_S,
) -> str | None:
    """Pull ``image`` with the first of ``payloads`` (REGISTRY credentials for its
    registry): ``podman pull --authfile folder/AUTH_FILE IMAGE``, the file 0600 and removed
    when the pull ends, whatever its outcome (the values never on podman's command line,
    which every user of the machine can read, nor in its environment).

    Args:
        folder: the attempt's private run folder (made 0700 if need be).
        tls_verify: False for a registry of the pool's ``insecure_registries`` (plain
            HTTP or an unverified certificate: podman's ``--tls-verify=false``).
        timeout_s: the longest the pull may take, seconds.

    Returns:
        None when pulled, else why not: one line, podman's own words, with no credential
        value in it.
    """
    path = _write_auth(folder, auth_json(image, payloads))
    argv = [podman, "pull", "--quiet", "--authfile", str(path)]
    argv += [] if tls_verify else ["--tls-verify=false"]
    try:
        done = subprocess.run(
            [*argv, image],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"podman pull took more than {timeout_s:g} s"
    except OSError as exc:
        return f"podman pull could not run: {exc.strerror}"
    finally:
        path.unlink(missing_ok=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return _masked(last, payloads)


def pull_failed_message(image: str, why: str) -> str:
    """The task log's line for an image that a pull with the submitter's registry
    credential could not fetch."""
    return (
        f"image {image!r} could not be pulled with your registry credential for "
        f"{image_registry(image)}: {why}; check the image's name and the credential "
        f"(trainyard credential list), then restart the workflow"
    )


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
