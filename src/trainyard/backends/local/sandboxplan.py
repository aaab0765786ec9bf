"""The vocabulary of a task's bubblewrap sandbox: which host folders it sees (``SYSTEM_TOP``),
which it gets fresh or as its own, the privileges bwrap gives it, and ``SandboxPlan``, what
one task's sandbox is built from. Layout and reasons: docs/local-backend.md "The task sandbox".
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ACCOUNTS",
    "APT_SANDBOX_CONF",
    "FRESH",
    "GPU_DEVICES",
    "IDMAPPED",
    "OSMO_WORKSPACE",
    "PRIVATE_DIRS",
    "PRIVILEGE_ARGS",
    "PWD_LOCK",
    "READ_ONLY_TOP",
    "REMAP_ARGS",
    "ROOT_LAYER",
    "SECRET_SCAN",
    "SKELETON",
    "SYSTEM_TOP",
    "SandboxPlan",
    "TASK_HOST_UID",
    "needs_bind",
]


SYSTEM_TOP = frozenset(
    {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "etc",
        "boot",
        "opt",
        "var",
        "snap",
        "nix",
    }
)
"""Top-level host folders a task sees (with a private writable layer, or read-only); it sees
no other host folder."""
READ_ONLY_TOP = SYSTEM_TOP  # the name before the private writable layers came

PRIVILEGE_ARGS = (
    "--unshare-user",
    "--uid",
    "0",
    "--gid",
    "0",
    "--disable-userns",
    "--cap-drop",
    "ALL",
)
"""Root inside a user namespace of its own, no capabilities, no nested user namespaces."""

REMAP_ARGS = ("--unshare-user", "--uid", "0", "--gid", "0", "--cap-drop", "ALL")
"""With ``SandboxPlan.host_uid``: bwrap runs as ``host_uid`` (the runner starts it so) in a
user namespace whose map the runner writes (``linux.userns``: ``host_uid`` is uid 0 there,
the host's root is seen while bwrap sets its mounts up); bwrap drops every capability before
the command, which is uid 0 of the namespace (``host_uid`` of the host) with none. (Before,
bwrap ran as the host's root and util-linux ``setpriv`` after its ``--`` switched the ids
and dropped the capabilities: one more program per task, ~1.1 ms of CPU.)"""

TASK_HOST_UID = 65534
"""The host uid (and gid) a task's uid 0 is, where the runner maps it (``nobody``): a file
of the host's that only root may read is not readable by a task."""

OSMO_WORKSPACE = "/osmo/run/workspace"
"""OSMO's workspace folder, in every task: "/osmo/run/workspace is always available as a
remote path" of ``osmo workflow rsync`` (OSMO user guide, Interactive > Rsync)."""

PRIVATE_DIRS = ("/root", "/home", "/run", "/osmo", "/osmo/run", OSMO_WORKSPACE)
"""Folders every task has as empty folders of its own: a container's ``$HOME``, ``/run``,
whose host sockets (a container engine's, D-Bus) a task must not reach: it is uid 0 of the
host for file permissions, and OSMO's ``OSMO_WORKSPACE`` (parents first: the runner makes
each with one ``mkdir``)."""

SECRET_SCAN = (("etc", None), ("var/lib", 1))
"""Host folders (relative to its ``/``) searched for secrets to cover (``secret_covers``), with
how deep (None: all the way)."""

GPU_DEVICES = ("nvidia*", "nvidia-caps", "dri")
"""``/dev`` entries (glob patterns) bound into a task's minimal ``/dev``: the GPUs."""

IDMAPPED = ("usr", "var/lib/dpkg", "var/lib/apt", "var/cache/apt")
"""System folders (relative to the host's ``/``) whose host-root files a remapped task owns
(an idmapped lower layer, see module docstring): none holds secrets by its purpose (FHS:
``/usr`` is shareable read-only data; dpkg's database, apt's package lists and downloaded
packages are readable by all; their 0700 download folders are ``FRESH``). Not ``/etc``,
not the rest of ``/var``."""

APT_SANDBOX_CONF = 'APT::Sandbox::User "root";\n'
"""apt's setting in a task's ``/etc/apt/apt.conf.d``: apt drops to its ``_apt`` user to
download (``setuid``), which a task without capabilities cannot; a pod's root can."""

FRESH = (
    ("var/lib/apt/lists/partial", True, 0o700, ""),
    ("var/lib/apt/lists/auxfiles", True, 0o755, ""),
    ("var/cache/apt/archives/partial", True, 0o700, ""),
    ("var/log/apt", True, 0o755, ""),
    ("var/log/dpkg.log", False, 0o644, ""),
    ("etc/apt/apt.conf.d/99trainyard-sandbox", False, 0o644, APT_SANDBOX_CONF),
)
"""(path relative to the host's ``/``, is a folder, mode, text) a remapped task gets empty
and as its own, in its private layers, instead of the host's (``fresh_paths``): apt's
download folders (the host's are ``_apt``'s, which the task's root may neither write nor
``chmod``, and 0700: covered otherwise; a download is renamed from there into the idmapped
folder above, so they must lie in the same layer), apt's and dpkg's logs (the host's history
is not the task's; ``term.log`` is root's, 0640), and ``APT_SANDBOX_CONF``. Made only where
the parent folder exists (a host with apt); not covered by ``idmapped_covers``. Given by
``fresh_layer`` where there is a skeleton base, else made per task (``fresh_paths``)."""

_FRESH_NAMES = frozenset(rel for rel, *_rest in FRESH)

_ACCOUNT_FILES = (
    ("etc/passwd", False),
    ("etc/group", False),
    ("etc/shadow", True),
    ("etc/gshadow", True),
    ("etc/subuid", False),
    ("etc/subgid", False),
)

ACCOUNTS = tuple(
    item for rel, scrub in _ACCOUNT_FILES for item in ((rel, scrub), (f"{rel}-", scrub))
)
"""(path relative to the host's ``/``, scrubbed) of the account files, and their backups
(``/etc/passwd-``), a remapped task gets as its own copies, with the host's mode
(``account_entries``): ``groupadd``, ``useradd`` and ``adduser`` (maintainer scripts:
``apt-get install cron``; ``useradd -m trainer`` in setup scripts) rewrite them
(shadow-utils' commonio: the old file copied over its backup, ``/etc/group+`` renamed over
``/etc/group``) and must read ``/etc/shadow`` and ``/etc/gshadow``, which are root's and
closed to others on the host (``/etc/shadow-`` too). Scrubbed ones have every password
field replaced (``scrub_passwords``): no hash of the host's ever reaches a task.
``useradd`` also adds ranges to ``/etc/subuid`` and ``/etc/subgid`` where they exist."""

PWD_LOCK = ("etc/.pwd.lock", False, 0o600, "")
"""shadow-utils' lock file (``lckpwdf``, opened for writing), given empty and the task's
with the account files: the host's is root's, 0600."""

SKELETON = (("etc", None), ("var", 2))
"""Host folders (relative to its ``/``) whose folders a remapped task owns in its private
layer, with how deep (None: all the way): each folder of the host's root that others may
read and pass (``system_skeleton``). Packages add files to ``/etc/ld.so.conf.d``,
``/etc/apt/sources.list.d``, ``/var/lib/PKG``... Only folders: every file keeps its owner,
so what only root may read stays unreadable (the uid remap, enforced by the kernel)."""

_HANDLED_APART = frozenset({"tmp", "proc", "dev", "sys", "lost+found"})
_PRIVATE_TOP = frozenset({"tmp"})


@dataclass(frozen=True)
class SandboxPlan:
    """What one task's sandbox looks like (see module docstring).

    Attributes:
        root_dir: host folder that becomes ``/``.
        hostname: the task's host name.
        hosts_file: host file bound read-only at ``/etc/hosts`` (None: the host's).
        writable: host paths bound read-write at the same path.
        readonly: host paths bound read-only at the same path.
        host_root: the host's ``/`` (tests give a folder of their own).
        overlay_dir: where the private writable layers of the system folders live
            (``<name>/upper``, ``/work``, ``/mnt``); None: system folders read-only.
        volumes: ``(host folder, path inside)`` bound read-write (``volumeMounts``).
        hidden: host folders never shown (trainyard's home): covered with an empty tmpfs
            when a shown system folder holds them (a home under ``/var``).
        host_uid: the host uid (and gid) the task's uid 0 is, the runner writing the map
            (``REMAP_ARGS``, ``linux.userns``); None: bwrap maps it to its caller's uid
            (``PRIVILEGE_ARGS``) and the host's secrets are covered (``secret_covers``).
        idmapped: system folders (relative, ``IDMAPPED``) given an idmapped lower layer
            (only with ``host_uid`` and ``overlay_dir``; one that is missing, a symlink or
            not under an overlaid folder is left as it is).
        skeleton_dir: where ``system_skeleton`` keeps the layers that give the task the
            ``SKELETON`` folders (only with ``host_uid`` and ``overlay_dir``), a folder of
            root's on another file system than the host's ``/`` (``skeleton_base``); None:
            none, those folders stay the host root's.
    """

    root_dir: Path
    hostname: str
    hosts_file: Path | None = None
    writable: tuple[str, ...] = ()
    readonly: tuple[str, ...] = ()
    host_root: Path = field(default=Path("/"))
    overlay_dir: Path | None = None
    volumes: tuple[tuple[str, str], ...] = ()
    hidden: tuple[str, ...] = ()
    host_uid: int | None = None
    idmapped: tuple[str, ...] = ()
    skeleton_dir: Path | None = None


def _top(path: str) -> str:
    parts = Path(path).parts
    return parts[1] if len(parts) > 1 else ""


def needs_bind(path: str, writable: bool, host_root: Path = Path("/")) -> bool:
    """Whether ``path`` must be bound again to be seen (and, if ``writable``, written
    through to the host) inside the sandbox. Symlinks are resolved first. A writable path
    always does: a system folder's writes go to the task's private layer."""
    real = os.path.realpath(path)
    if real == "/":
        return False
    top = _top(real)
    if writable or top in _PRIVATE_TOP or top in _HANDLED_APART:
        return True
    return top not in SYSTEM_TOP or not (host_root / top).exists()


def _has_symlink(path: Path, target: str) -> bool:
    return path.is_symlink() and os.readlink(path) == target


@dataclass(frozen=True)
class _Top:
    """One top-level system entry of the host: a folder (``empty`` or not) or a symlink."""

    name: str
    path: str
    link: str | None
    empty: bool


def _system_tops(host_root: Path) -> tuple[_Top, ...]:
    """The host's top-level system entries (``SYSTEM_TOP``), looked at once per process."""
    return _scan_tops(str(host_root))


@functools.lru_cache(maxsize=64)
def _scan_tops(host_root: str) -> tuple[_Top, ...]:
    found = []
    for e in sorted(os.scandir(host_root), key=lambda e: e.name):
        if e.name in SYSTEM_TOP and (e.is_symlink() or e.is_dir()):
            link = os.readlink(e.path) if e.is_symlink() else None
            found.append(_Top(e.name, e.path, link, link is None and _is_empty(e.path)))
    return tuple(found)


@functools.lru_cache(maxsize=16)  # asked ~20 times per task start, realpath each time
def _overlaid(plan: SandboxPlan) -> frozenset[str]:
    """The system folders that get a private writable layer: every non-empty one, except a
    folder holding the sandbox itself (it would show the task its own layers; it is bound
    read-only, with ``hidden`` covered)."""
    if plan.overlay_dir is None:
        return frozenset()
    own = {_top(os.path.realpath(plan.root_dir)), _top(os.path.realpath(plan.overlay_dir))}
    return frozenset(
        e.name
        for e in _system_tops(plan.host_root)
        if e.link is None and e.name not in own and not e.empty
    )


ROOT_LAYER = "rootfs"
"""The layer (folder under ``overlay_dir``) of the system folders that live on the host's root
file system: one overlay of the host's ``/`` serves them all (one mount per task, not one per
folder); only the folders bwrap binds from it are shown."""


def _layer(plan: SandboxPlan, name: str) -> str:
    """The layer of a system folder: ``ROOT_LAYER`` when it is on the host's root file system
    (overlayfs does not cross into other mounts), else its own (``/var`` on a partition)."""
    return name if _own_mount(str(plan.host_root), name) else ROOT_LAYER


@functools.lru_cache(maxsize=64)
def _own_mount(host_root: str, name: str) -> bool:
    path = os.path.join(host_root, name)
    return os.path.ismount(path) or os.stat(path).st_dev != os.stat(host_root).st_dev


@functools.lru_cache(maxsize=128)  # asked ~20 times per task start
def _layer_dir(plan: SandboxPlan, name: str, part: str) -> Path:
    """``upper``, ``work`` or ``mnt`` of the layer of system folder ``name``; for ``upper``
    and ``mnt``, the folder ``name`` itself within the layer."""
    assert plan.overlay_dir is not None
    layer = _layer(plan, name)
    base = plan.overlay_dir / layer / part
    return base / name if layer == ROOT_LAYER and part != "work" else base


_SCAN_LOCK = threading.RLock()


def _is_empty(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
