"""The local backend's task sandbox: bubblewrap (``bwrap``) arguments that give a task what a
container gives it in OSMO, and nothing of the host or of trainyard beyond that.

Layout inside the sandbox:
- ``/`` is the task's own folder ``<run_dir>/sandbox/root`` (on disk, so it survives a RESTART
  in place); new top-level folders (``/app``, ``/experiments``), ``/tmp``, ``/root``,
  ``/home`` and ``/run`` live there, empty at first, so two tasks' ``/tmp/run.sh`` never meet.
- the host's system folders (``SYSTEM_TOP``: ``/usr``, ``/etc``, ``/var``, ``/opt`` ...) are
  seen with a private writable layer on top (``overlay_dir``: overlayfs mounted by the runner
  in a mount namespace of its own, see ``linux.safefs``; one layer ``ROOT_LAYER`` with the
  host's ``/`` as lower for every system folder on the root file system, of which bwrap binds
  only those folders; one layer per system folder that is a mount of its own): ``touch
  /var/tmp/m`` or ``pip install`` work and land in ``<run_dir>/sandbox/overlay/*/upper``, the
  host's folders never change. Without ``overlay_dir`` (not root), and for a system folder
  that holds the run folder, they are bound read-only, with trainyard's home (``hidden``)
  covered by an empty tmpfs. Top-level symlinks (``/bin -> usr/bin``) are re-created.
  With the uid remap, the system folders that hold no secrets by their purpose
  (``IDMAPPED``: ``/usr``, dpkg's and apt's state; ``SandboxPlan.idmapped``) get a layer of
  their own whose lower layer is the host folder *idmapped* (the host's root files seen as
  the task's root's), so the task may change their files in place (``echo >> /usr/share/x``,
  dpkg's state), in its upper layer only; their files and folders of the host's root (or
  group) that others may not read are covered (``idmapped_covers``, a deny list looked at
  once per process). ``/etc`` and the rest of ``/var`` are never idmapped (shadow, ssh and
  munge keys, debconf's passwords): there only what the task made or was given is its; the
  folders of ``/etc`` and of the top of ``/var`` that others may read and pass are given by a
  read-only layer of empty folders of the task's (``system_skeleton``), never their files.
  So that ``apt-get install`` works, apt's download folders, its and dpkg's logs and an apt
  setting are fresh and the task's (``FRESH``): a read-only layer built once per process
  (``fresh_layer``, opaque folders) stacked under the skeleton, or, without one, made by the
  runner in each task's layers (``fresh_paths``). So that ``groupadd``/``useradd`` work
  (a postinst, ``useradd -m trainer``), the account files are the task's own copies there
  too (``account_entries``): ``/etc/passwd`` and ``/etc/group`` as the host has them,
  ``/etc/shadow`` and ``/etc/gshadow`` with every password field scrubbed: no hash of the
  host's reaches a task.
- every other host folder (``/home``, ``/root``, ``/work``, ``/mnt``, ``$TRAINYARD_HOME`` with
  its tokens, store and other runs) is NOT there. What the task needs of them is bound at the
  same path: read-only the folders of trainyard's interpreter and import path (``readonly``:
  the ``trainyard``/``osmo`` CLI runs in tasks); read-write only its own ``{{output}}`` and
  ``{{input:N}}`` folders (``writable``) and the pool-allowed ``volumeMounts`` (``volumes``).
- ``/dev`` is a minimal one of its own (``null``, ``zero``, ``random``, ``tty``, ``pts``,
  ``shm``) with the host's GPU device nodes bound in (``GPU_DEVICES``); ``/proc`` is the task's
  own PID namespace's, ``/proc/sys`` and ``/sys`` read-only; ``/run`` is an empty folder of
  its own (no host sockets).
- privileges: a user namespace, uid and gid 0 inside, with no capability and no further user
  namespaces: no ``mount``, ``setns``, ``unshare``, raw sockets, ``chown`` to other users.
  As root (``probe_remap``), uid 0 inside is the host's ``nobody`` (``SandboxPlan.host_uid``,
  ``REMAP_ARGS``): bwrap itself runs as that uid, the runner writes the map
  (``linux.userns``), bwrap's ``--cap-drop ALL`` leaves the command none of the
  namespace's capabilities, so host files only root may read stay unreadable; the
  folders the task writes are given to that uid by the runner (``task_owned``). Otherwise
  (``PRIVILEGE_ARGS``) uid 0 inside is the runner's user, and the host's files that others
  may not read are covered (``secret_covers``, a deny list).
- PID, IPC and UTS namespaces are private: ``hostname`` is the task's name and ``/etc/hosts``
  maps the group's task names to their addresses. The working directory is ``/``.

The network namespace is not bwrap's: the backend joins the group's (see ``netns``) before
bwrap starts.

The task runner stays outside: it writes the task's files where the sandbox shows them
(``sandbox_mounts``) following no symlink the task made (``linux.safefs.write_inside``), and
runs only the command through the ``bwrap`` prefix, with ``--die-with-parent``: when the
runner dies, bwrap's init dies and the kernel kills everything left in the task's PID
namespace. Before each start the backend removes symlinks the task left where bwrap will
make mount points (``clear_links``): bwrap would follow them on the host.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.runfile import FreshPath, OverlayMount

__all__ = ["SandboxPlan", "bwrap_argv", "sandbox_mounts", "needs_bind", "probe_bwrap",
           "READ_ONLY_TOP", "SYSTEM_TOP", "PRIVILEGE_ARGS", "hosts_file_text", "overlays",
           "clear_links", "overlay_supported", "secret_covers", "REMAP_ARGS", "TASK_HOST_UID",
           "bwrap_end", "task_owned", "probe_remap", "OSMO_WORKSPACE", "IDMAPPED",
           "idmapped_covers", "warm_host_scans", "FRESH", "SKELETON", "system_skeleton",
           "fresh_paths", "skeleton_base", "SKELETON_BASE", "fresh_layer", "OPAQUE_XATTR",
           "ACCOUNTS", "PWD_LOCK", "account_entries", "scrub_passwords"]

SYSTEM_TOP = frozenset({
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "boot", "opt", "var",
    "snap", "nix",
})
"""Top-level host folders a task sees (with a private writable layer, or read-only); it sees
no other host folder."""
READ_ONLY_TOP = SYSTEM_TOP  # the name before the private writable layers came

PRIVILEGE_ARGS = ("--unshare-user", "--uid", "0", "--gid", "0", "--disable-userns",
                  "--cap-drop", "ALL")
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

FRESH = (("var/lib/apt/lists/partial", True, 0o700, ""),
         ("var/lib/apt/lists/auxfiles", True, 0o755, ""),
         ("var/cache/apt/archives/partial", True, 0o700, ""),
         ("var/log/apt", True, 0o755, ""),
         ("var/log/dpkg.log", False, 0o644, ""),
         ("etc/apt/apt.conf.d/99trainyard-sandbox", False, 0o644, APT_SANDBOX_CONF))
"""(path relative to the host's ``/``, is a folder, mode, text) a remapped task gets empty
and as its own, in its private layers, instead of the host's (``fresh_paths``): apt's
download folders (the host's are ``_apt``'s, which the task's root may neither write nor
``chmod``, and 0700: covered otherwise; a download is renamed from there into the idmapped
folder above, so they must lie in the same layer), apt's and dpkg's logs (the host's history
is not the task's; ``term.log`` is root's, 0640), and ``APT_SANDBOX_CONF``. Made only where
the parent folder exists (a host with apt); not covered by ``idmapped_covers``. Given by
``fresh_layer`` where there is a skeleton base, else made per task (``fresh_paths``)."""

_FRESH_NAMES = frozenset(rel for rel, *_rest in FRESH)

_ACCOUNT_FILES = (("etc/passwd", False), ("etc/group", False), ("etc/shadow", True),
                  ("etc/gshadow", True), ("etc/subuid", False), ("etc/subgid", False))

ACCOUNTS = tuple(item for rel, scrub in _ACCOUNT_FILES for item in ((rel, scrub),
                                                                    (f"{rel}-", scrub)))
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
    return frozenset(e.name for e in _system_tops(plan.host_root)
                     if e.link is None and e.name not in own and not e.empty)


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


def overlays(plan: SandboxPlan) -> list[OverlayMount]:
    """The overlay mounts the runner makes before the task starts (``SandboxSettings``)."""
    if plan.overlay_dir is None:
        return []
    layers = sorted({_layer(plan, name) for name in _overlaid(plan)})
    skeleton = _skeleton(plan)
    fresh = _fresh(plan)
    mounts = [OverlayMount(lower=str(plan.host_root if layer == ROOT_LAYER else plan.host_root / layer),
                           upper=str(plan.overlay_dir / layer / "upper"),
                           work=str(plan.overlay_dir / layer / "work"),
                           target=str(plan.overlay_dir / layer / "mnt"),
                           lower_above=[*_skeleton_above(skeleton, layer),
                                        *_skeleton_above(fresh, layer)])
              for layer in layers]
    idmapped = [_idmapped_layer(plan, rel).model_copy(
        update={"lower_above": _skeleton_above(fresh, rel)}) for rel in _idmapped(plan)]
    return mounts + idmapped  # on top of those


def _skeleton(plan: SandboxPlan) -> Path | None:
    """The ``system_skeleton`` layer of ``plan`` (built on first use), or None."""
    if plan.host_uid is None or plan.overlay_dir is None or plan.skeleton_dir is None:
        return None
    return system_skeleton(plan.skeleton_dir, plan.host_root, plan.host_uid)


def _fresh(plan: SandboxPlan) -> Path | None:
    """The ``fresh_layer`` of ``plan`` (built on first use), or None."""
    if plan.host_uid is None or plan.overlay_dir is None or plan.skeleton_dir is None:
        return None
    return fresh_layer(plan.skeleton_dir, plan.host_root, plan.host_uid,
                       tuple(_idmapped(plan)))


def _skeleton_above(skeleton: Path | None, layer: str) -> list[str]:
    if skeleton is None:
        return []
    above = skeleton if layer == ROOT_LAYER else skeleton / layer
    return [str(above)] if above.is_dir() else []


def system_skeleton(skeleton_dir: Path, host_root: Path, uid: int) -> Path | None:
    """A read-only overlay layer holding, for each ``SKELETON`` folder of the host's root
    that others may read and pass (mode ``o+rx``), an empty folder of the same mode owned by
    ``uid`` (the task's root): stacked over the host's ``/`` in the task's root layer, it
    makes those folders the task's (it may add, rename and remove entries, in its upper
    layer only) without one copy-up per task start. A folder closed to others
    (``/etc/ssl/private``, ``/etc/munge``) is not there, nor anything below it; no file is.

    Built once per content (``<skeleton_dir>/<digest>``, made in a temporary folder then
    renamed; never changed after), from a look at the host's folders once per process (like
    ``secret_covers``): a folder made on the host later stays root's. ``skeleton_dir`` must
    lie on another file system than the host's ``/``: overlayfs refuses a lower layer below
    another one ("overlapping lowerdir path").

    Returns:
        the layer's folder, or None when there is nothing to give (or it cannot be made).
    """
    with _SCAN_LOCK:  # one walk: a task start waits for the server's warm-up walk
        dirs = _skeleton_dirs(str(host_root))
        if not dirs:
            return None
        final = skeleton_dir / _skeleton_digest(dirs, uid)
        if final.is_dir():
            return final
        try:
            _build_skeleton(skeleton_dir, final, dirs, uid)
        except OSError:
            return None
    return final


SKELETON_BASE = Path("/dev/shm/trainyard-skeleton")
"""Where the skeleton layers live by default: a tmpfs (not the host's ``/``, see
``system_skeleton``), in a folder of root's, 0700."""


@functools.lru_cache(maxsize=4)
def skeleton_base(base: Path = SKELETON_BASE, host_root: Path = Path("/")) -> Path | None:
    """``base`` made (0700) if missing, when it is a folder of this process's user closed
    to others, not a link, on another file system than ``host_root``; else None (no
    skeleton: the ``SKELETON`` folders stay the host root's). Another user cannot have made
    it for us: a folder of root's that others may not enter is root's own. Asked once."""
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(base)
        other_fs = info.st_dev != os.stat(host_root).st_dev
    except OSError:
        return None
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid()
            or info.st_mode & 0o077 or not other_fs):
        return None
    return base


@functools.lru_cache(maxsize=8)
def _skeleton_digest(dirs: tuple[tuple[str, int], ...], uid: int) -> str:
    return hashlib.sha256(repr((uid, dirs)).encode()).hexdigest()[:20]


def _build_skeleton(skeleton_dir: Path, final: Path,
                    dirs: tuple[tuple[str, int], ...], uid: int) -> None:
    skeleton_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=".building-", dir=skeleton_dir))
    try:
        for rel, mode in dirs:  # parents first (sorted by depth)
            path = temporary / rel
            path.mkdir()
            os.chown(path, uid, uid, follow_symlinks=False)
            os.chmod(path, mode)
        temporary.chmod(0o755)
        os.rename(temporary, final)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
        if not final.is_dir():  # another process's rename won the race: fine
            raise


@functools.lru_cache(maxsize=8)
def _skeleton_dirs(host_root: str) -> tuple[tuple[str, int], ...]:
    """(path relative to ``host_root``, mode) of each ``SKELETON`` folder to give, parents
    before children."""
    found: list[tuple[str, int]] = []
    for top, depth in SKELETON:
        path = os.path.join(host_root, top)
        if not _gives(path):
            continue
        found.append((top, stat.S_IMODE(os.lstat(path).st_mode)))
        for current, dirs, _names in os.walk(path):
            level = os.path.relpath(current, path).count(os.sep) + (current != path)
            keep = []
            for name in sorted(dirs):
                child = os.path.join(current, name)
                if _gives(child) and os.path.relpath(child, host_root) not in _FRESH_NAMES:
                    found.append((os.path.relpath(child, host_root),
                                  stat.S_IMODE(os.lstat(child).st_mode)))
                    if depth is None or level + 1 < depth:
                        keep.append(name)
            dirs[:] = keep
    return tuple(sorted(found, key=lambda item: (item[0].count("/"), item[0])))


def _gives(path: str) -> bool:
    """A folder (not a link) of the host's root that others may read and pass."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == 0
            and info.st_mode & 0o005 == 0o005)


@dataclass(frozen=True)
class _FreshEntry:
    """One entry of ``fresh_layer``: a ``FRESH`` one (``opaque`` for a folder) or a parent
    folder of one, as the layer below shows it (its owner, group and mode)."""

    rel: str
    is_dir: bool
    uid: int
    gid: int
    mode: int
    text: str = ""
    opaque: bool = False


OPAQUE_XATTR = "trusted.overlay.opaque"
"""overlayfs' mark of a folder that hides what the layers below hold at its path (kernel
docs, filesystems/overlayfs "whiteouts and opaque directories"); honoured in a lower layer
too."""


def fresh_layer(skeleton_dir: Path, host_root: Path, uid: int,
                idmapped: tuple[str, ...] = ()) -> Path | None:
    """A read-only overlay layer holding the ``FRESH`` entries (and ``account_entries``) of
    the host's ``/`` as a remapped task gets them (owned by ``uid``, with ``FRESH``'s mode
    and text; a folder marked opaque, ``OPAQUE_XATTR``: the host's entries below it are
    hidden), built once per content instead of made in each task's upper layer
    (``linux.userns.make_fresh``, one copy-up of the parents per task). Its parent folders
    copy the host's owner, group and mode (below an ``idmapped`` folder, relative to
    ``host_root``: the host's root seen as ``uid``, as the idmapped layer shows it);
    ``system_skeleton``, stacked above, gives the open ones to the task. A ``FRESH`` entry
    whose parent folder is missing on the host, or a link on the way, is not there.

    Stacked over the layer of each overlay that shows a ``FRESH`` entry (``overlays``): the
    root layer for ``/etc`` and ``/var/log``, the idmapped ``/var/lib/apt`` and
    ``/var/cache/apt`` layers for their download folders (apt renames a download from
    ``partial/`` into its parent: both must be in the same overlay mount). What the task
    writes there lands in its upper layer (kept by RESTART, not by RESCHEDULE's new run
    folder). Built like ``system_skeleton`` (``<skeleton_dir>/fresh-<digest>``, a temporary
    folder renamed, never changed after; the host looked at once per process).

    Returns:
        the layer's folder, or None when there is nothing to give (or it cannot be made).
    """
    with _SCAN_LOCK:
        entries = _fresh_entries(str(host_root), uid, idmapped)
        if not entries:
            return None
        final = skeleton_dir / f"fresh-{_fresh_digest(entries)}"
        if final.is_dir():
            return final
        try:
            _build_fresh(skeleton_dir, final, entries)
        except OSError:
            return None
    return final


@functools.lru_cache(maxsize=8)
def _fresh_digest(entries: tuple[_FreshEntry, ...]) -> str:
    return hashlib.sha256(repr(entries).encode()).hexdigest()[:20]


@functools.lru_cache(maxsize=8)
def _fresh_entries(host_root: str, uid: int,
                   idmapped: tuple[str, ...]) -> tuple[_FreshEntry, ...]:
    """The entries of ``fresh_layer``, parents before children."""
    found: dict[str, _FreshEntry] = {}
    for rel, is_dir, mode, text in _fresh_items(host_root):
        parents = _host_parents(host_root, rel, uid, idmapped)
        if parents is None:
            continue
        for parent in parents:
            found.setdefault(parent.rel, parent)
        found[rel] = _FreshEntry(rel, is_dir, uid, uid, mode, text, opaque=is_dir)
    return tuple(found.values())


def _host_parents(host_root: str, rel: str, uid: int,
                  idmapped: tuple[str, ...]) -> list[_FreshEntry] | None:
    """The parent folders of ``rel`` as the host has them, top first; None when one is
    missing, a link or not a folder."""
    parts = rel.split("/")[:-1]
    found = []
    for depth in range(1, len(parts) + 1):
        below = "/".join(parts[:depth])
        try:
            info = os.lstat(os.path.join(host_root, below))
        except OSError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            return None
        mapped = any(_under(below, top) and below != top for top in idmapped)
        owner, group = info.st_uid, info.st_gid
        if mapped:
            owner, group = (uid if owner == 0 else owner), (uid if group == 0 else group)
        found.append(_FreshEntry(below, True, owner, group, stat.S_IMODE(info.st_mode)))
    return found


def _build_fresh(skeleton_dir: Path, final: Path, entries: tuple[_FreshEntry, ...]) -> None:
    skeleton_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=".building-", dir=skeleton_dir))
    try:
        for entry in entries:  # parents first
            _make_entry(temporary / entry.rel, entry)
        temporary.chmod(0o755)
        os.rename(temporary, final)
    except OSError:
        shutil.rmtree(temporary, ignore_errors=True)
        if not final.is_dir():  # another process's rename won the race: fine
            raise


def _make_entry(path: Path, entry: _FreshEntry) -> None:
    if entry.is_dir:
        path.mkdir()
        if entry.opaque:
            os.setxattr(path, OPAQUE_XATTR, b"y", follow_symlinks=False)
    else:
        path.write_text(entry.text)
    os.chown(path, entry.uid, entry.gid, follow_symlinks=False)
    os.chmod(path, entry.mode)


def fresh_paths(plan: SandboxPlan) -> list[FreshPath]:
    """The ``FRESH`` entries (and ``account_entries``) of ``plan`` as the runner makes them
    (``linux.userns`` ``make_fresh``): below the merged view of the private layer that
    shows them (an idmapped layer's, or a system folder's). Only with ``host_uid`` and
    ``overlay_dir``, and only those its ``fresh_layer`` does not hold (none where it is
    built)."""
    if plan.host_uid is None or plan.overlay_dir is None:
        return []
    overlaid = _overlaid(plan)
    idmapped = sorted(_idmapped(plan), key=len, reverse=True)
    in_layer = _in_fresh_layer(plan)
    found = []
    for rel, is_dir, mode, text in _fresh_items(str(plan.host_root)):
        if rel in in_layer:
            continue
        layer = next((r for r in idmapped if _under(rel, r)), None)
        if layer is not None:
            base, below = _idmapped_layer(plan, layer).target, rel[len(layer) + 1:]
        elif rel.split("/")[0] in overlaid:
            top, _, below = rel.partition("/")
            base = str(_layer_dir(plan, top, "mnt"))
        else:
            continue
        found.append(FreshPath(base=base, relative=below, is_dir=is_dir, mode=mode, text=text))
    return found


def _in_fresh_layer(plan: SandboxPlan) -> frozenset[str]:
    """The ``FRESH`` entries (relative) that ``plan``'s ``fresh_layer`` holds: none to make
    per task."""
    if _fresh(plan) is None or plan.host_uid is None:
        return frozenset()
    entries = _fresh_entries(str(plan.host_root), plan.host_uid, tuple(_idmapped(plan)))
    names = _fresh_names(str(plan.host_root))
    return frozenset(e.rel for e in entries if e.rel in names)


_FreshItem = tuple[str, bool, int, str]


def _fresh_items(host_root: str) -> tuple[_FreshItem, ...]:
    """``FRESH`` and the host's ``account_entries``: (relative path, is a folder, mode,
    text) of each entry a remapped task gets as its own."""
    return FRESH + account_entries(host_root)


@functools.lru_cache(maxsize=8)
def _fresh_names(host_root: str) -> frozenset[str]:
    return frozenset(rel for rel, *_rest in _fresh_items(host_root))


@functools.lru_cache(maxsize=8)
def account_entries(host_root: str) -> tuple[_FreshItem, ...]:
    """The ``ACCOUNTS`` files of the host (below ``host_root``) as a remapped task gets them
    (``FRESH``'s shape: relative path, False, mode, text): passwd, group, subuid and subgid
    as the host has them (others may read them there), shadow and gshadow through
    ``scrub_passwords``, each with the host's mode plus the owner's read and write bits (the
    owner is the task's root, which has no ``CAP_DAC_OVERRIDE`` to get past a 0000
    ``/etc/shadow`` as on Fedora), and, if any, an empty ``PWD_LOCK``. One that is missing,
    a link, not a regular file, unreadable or not UTF-8 is left out (the task sees the
    host's, and cannot add accounts). Read once per process, like the skeleton's look: an
    account added on the host later is not in tasks that process starts.
    """
    found: list[_FreshItem] = []
    for rel, scrub in ACCOUNTS:
        read = _read_account(os.path.join(host_root, rel))
        if read is None:
            continue
        text, mode = read
        found.append((rel, False, mode | 0o600, scrub_passwords(text) if scrub else text))
    return (*found, PWD_LOCK) if found else ()


def _read_account(path: str) -> tuple[str, int] | None:
    """The text and permission bits of the regular file ``path`` (a link is not followed),
    or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        try:
            return handle.read().decode("utf-8"), stat.S_IMODE(info.st_mode)
        except (OSError, UnicodeDecodeError):
            return None


def scrub_passwords(text: str) -> str:
    """``text`` of a shadow or gshadow file (shadow(5), gshadow(5): ``name:password:...``)
    with each entry's password field replaced: ``!`` where the host's was locked (starts
    with ``!``), else ``*`` (no password matches either). The other fields are kept (ageing,
    a group's administrators and members, as ``/etc/group`` shows them); a line without a
    ``:`` (blank, a comment) is left out. No hash of the host's is in the result.
    """
    lines = []
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        if not colon:
            continue
        password, sep, tail = rest.partition(":")
        lines.append(f"{name}:{'!' if password.startswith('!') else '*'}{sep}{tail}")
    return "".join(f"{line}\n" for line in lines)


def _idmapped(plan: SandboxPlan) -> list[str]:
    """The ``idmapped`` folders that get their idmapped layer (see ``SandboxPlan``)."""
    if plan.host_uid is None or plan.overlay_dir is None:
        return []
    return list(_idmapped_on_host(str(plan.host_root), plan.idmapped, _overlaid(plan)))


@functools.lru_cache(maxsize=16)  # asked ~8 times per task start, a realpath per folder
def _idmapped_on_host(host_root: str, idmapped: tuple[str, ...],
                      overlaid: frozenset[str]) -> tuple[str, ...]:
    """Of ``idmapped``, the folders below an ``overlaid`` system folder that the host has as
    real folders (not symlinks), looked at once per process like ``_system_tops``."""
    found = []
    for rel in idmapped:
        host = os.path.join(host_root, rel)
        if (rel.split("/")[0] in overlaid and os.path.isdir(host)
                and os.path.realpath(host) == os.path.normpath(host)):
            found.append(rel)
    return tuple(found)


def _idmapped_layer(plan: SandboxPlan, rel: str) -> OverlayMount:
    assert plan.overlay_dir is not None and plan.host_uid is not None
    lower, upper, work, target = _idmapped_layer_paths(plan, rel)
    return OverlayMount(lower=lower, upper=upper, work=work, target=target,
                        idmap_uid=plan.host_uid, idmap_gid=plan.host_uid)


@functools.lru_cache(maxsize=64)  # asked ~8 times per task start and folder
def _idmapped_layer_paths(plan: SandboxPlan, rel: str) -> tuple[str, str, str, str]:
    """(lower, upper, work, target) of the idmapped layer of ``rel``."""
    assert plan.overlay_dir is not None
    top, _, rest = rel.partition("/")
    base = plan.overlay_dir / "idmapped" / rel.replace("/", "-")
    target = _layer_dir(plan, top, "mnt") / rest if rest else _layer_dir(plan, top, "mnt")
    return (os.path.join(str(plan.host_root), rel), str(base / "upper"), str(base / "work"),
            str(target))


def idmapped_covers(plan: SandboxPlan) -> tuple[tuple[str, bool], ...]:
    """What the idmapped layers would show a task that it may not see: each file or folder
    below them of the host's root (owner or group 0) that others may not read, as (path
    inside, is a folder), a folder's contents not listed again. Covered like
    ``secret_covers``; looked at once per process, so one made later is not covered."""
    found: list[tuple[str, bool]] = []
    with _SCAN_LOCK:  # one walk: a task start waits for the server's warm-up walk
        for rel in _idmapped(plan):
            found += _scan_root_only(str(plan.host_root), rel)
    fresh = [f"/{rel}" for rel, *_rest in FRESH]  # replaced by the task's own, not covered
    return tuple(c for c in found if not any(_under(c[0], f) for f in fresh))


def warm_host_scans(host_root: Path = Path("/")) -> None:
    """Look at the host's folders once now (``secret_covers``, for each ``IDMAPPED`` folder
    what ``idmapped_covers`` covers, the ``SKELETON`` folders), so the first task does not
    wait for it: walking ``/usr`` takes 0.6-0.9 s on a machine with CUDA there. The server calls it on a thread of
    its own at start; the results are cached for the process. Never raises."""
    try:
        secret_covers(host_root)
        with _SCAN_LOCK:
            for rel in IDMAPPED:
                if os.path.isdir(os.path.join(str(host_root), rel)):
                    _scan_root_only(str(host_root), rel)
            _skeleton_dirs(str(host_root))
            account_entries(str(host_root))
    except OSError:
        pass


_SCAN_LOCK = threading.RLock()


@functools.lru_cache(maxsize=16)
def _scan_root_only(host_root: str, rel: str) -> tuple[tuple[str, bool], ...]:
    return tuple(_covers_below(host_root, os.path.join(host_root, rel), _root_only, None))


def _covers_below(host_root: str, top: str, hidden: Callable[[str], bool],
                  depth: int | None) -> list[tuple[str, bool]]:
    """Each file or folder below ``top`` for which ``hidden(path)`` holds, as (path inside the
    sandbox, is a folder); a hidden folder's contents are not listed again, and folders
    ``depth`` levels below ``top`` are not entered (None: all the way)."""
    found: list[tuple[str, bool]] = []
    for current, dirs, names in os.walk(top):
        level = os.path.relpath(current, top).count(os.sep) + (current != top)
        keep = []
        for name in sorted(dirs):
            path = os.path.join(current, name)
            if hidden(path):
                found.append(("/" + os.path.relpath(path, host_root), True))
            elif depth is None or level + 1 < depth:
                keep.append(name)
        dirs[:] = keep
        found += [("/" + os.path.relpath(os.path.join(current, n), host_root), False)
                  for n in sorted(names) if hidden(os.path.join(current, n))]
    return found


def _root_only(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISREG(info.st_mode) and info.st_size == 0:
        return False  # an empty file (dpkg's lock files) holds nothing to hide
    if info.st_uid != 0 and info.st_gid != 0:
        return False  # not mapped to the task's ids: its mode applies to the task as to others
    closed_dir = stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IXOTH
    return closed_dir or _mode_hides(info.st_mode)  # others may not read (or pass) it


def _cover_args(covers: tuple[tuple[str, bool], ...]) -> list[str]:
    args: list[str] = []
    for inside, is_dir in covers:
        if is_dir:
            args += ["--tmpfs", inside, "--remount-ro", inside]
        else:
            args += ["--ro-bind", "/dev/null", inside]
    return args


def _top_level_args(plan: SandboxPlan) -> list[str]:
    """The host's system folders; a symlink already in ``root_dir`` (an earlier start of the
    same sandbox) is kept, as bwrap refuses to make it again."""
    args: list[str] = []
    overlaid = _overlaid(plan)
    for entry in _system_tops(plan.host_root):
        target = f"/{entry.name}"
        if entry.link is not None:
            link = entry.link
            if not _has_symlink(plan.root_dir / entry.name, link):
                args += ["--symlink", link, target]
        elif entry.name in overlaid:
            assert plan.overlay_dir is not None
            args += ["--bind", str(_layer_dir(plan, entry.name, "mnt")), target]
        elif entry.empty:
            args += ["--dir", target]  # nothing to show: a folder of the sandbox's own
        else:
            args += ["--ro-bind", entry.path, target]
    for private in PRIVATE_DIRS:
        args += ["--dir", private]
    return args  # top-level files (/.dockerenv) belong to the host's image, not the task's


def _is_empty(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def secret_covers(host_root: Path = Path("/")) -> tuple[tuple[str, bool], ...]:
    """The host's files and folders under ``SECRET_SCAN`` that others may not read (mode
    without ``o+r``: ``/etc/shadow``, ``/etc/gshadow``, ``/etc/ssh/ssh_host_*_key``,
    ``/etc/munge``, ``/etc/ssl/private``, ``/var/lib/containers``...), as (path inside, is a
    folder), a folder's contents not listed again. The sandbox covers each (an empty
    read-only folder, or ``/dev/null``): a task's uid 0 is the host's uid 0 for file
    permissions (``PRIVILEGE_ARGS``), so the owner's read bit would let it read them. A deny
    list by file mode, looked at once per process: a secret readable by others, or one made
    after the backend started, is not covered.
    """
    with _SCAN_LOCK:
        return _scan_secrets(str(host_root))


@functools.lru_cache(maxsize=8)
def _scan_secrets(host_root: str) -> tuple[tuple[str, bool], ...]:
    found: list[tuple[str, bool]] = []
    for folder, depth in SECRET_SCAN:
        top = os.path.join(host_root, folder)
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        found += _covers_below(host_root, top, _hidden_from_others, depth)
    return tuple(found)


def _hidden_from_others(path: str) -> bool:
    try:
        return _mode_hides(os.lstat(path).st_mode)
    except OSError:
        return False


def _mode_hides(mode: int) -> bool:
    """A regular file or folder (not a link, device...) that others may not read."""
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return False
    return not mode & stat.S_IROTH


def _secret_args(host_root: Path) -> list[str]:
    """bwrap arguments covering ``secret_covers``."""
    args: list[str] = []
    for inside, is_dir in secret_covers(host_root):
        if is_dir:
            args += ["--tmpfs", inside, "--remount-ro", inside]
        else:
            args += ["--ro-bind", "/dev/null", inside]
    return args


def _system_args(host_root: Path) -> list[str]:
    """A minimal ``/dev`` (null, zero, random, tty, pts, shm) with the host's GPU device
    nodes; the task's own ``/proc`` with ``/proc/sys`` read-only (the task is uid 0 of the
    host for permission checks: sysctls would be writable); ``/sys`` read-only."""
    args = ["--dev", "/dev"]
    for node in gpu_device_nodes():
        args += ["--dev-bind", node, node]
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if (host_root / "sys").is_dir():
        args += ["--ro-bind", "/sys", "/sys"]
    return args


@functools.lru_cache(maxsize=4)
def gpu_device_nodes(dev: Path = Path("/dev")) -> tuple[str, ...]:
    """The host's GPU device nodes and folders (``GPU_DEVICES``), sorted; asked once per
    process (a driver loaded later needs a new backend process)."""
    found: set[str] = set()
    for pattern in GPU_DEVICES:
        found.update(str(p) for p in dev.glob(pattern))
    return tuple(sorted(found))


def _same_path_binds(plan: SandboxPlan) -> list[tuple[str, str, str]]:
    """(flag, host path, path inside) of the same-path binds, parents before children. A
    private top-level folder itself (``/tmp``) is never bound: that would hand the task the
    host's."""
    binds = [(real, "--ro-bind") for real in _realpaths(plan.readonly)]
    binds += [(os.path.realpath(p), "--bind") for p in plan.writable]
    out: list[tuple[str, str, str]] = []
    done: list[tuple[str, str]] = []
    for real, flag in sorted(set(binds), key=lambda b: (len(Path(b[0]).parts), b[0])):
        if any(flag == f and _under(real, d) for d, f in done):
            continue  # a folder already bound the same way shows it (bwrap's cost grows
            # with every mount: it reads /proc/self/mountinfo for each)
        if len(Path(real).parts) > 2 or _top(real) not in _PRIVATE_TOP | _HANDLED_APART:
            out.append((flag, real, real))
            done.append((real, flag))
    return out


@functools.lru_cache(maxsize=16)
def _realpaths(paths: tuple[str, ...]) -> tuple[str, ...]:
    """``os.path.realpath`` of each of ``paths``: the read-only binds (trainyard's
    interpreter and import path), the same for every task, resolved once per process."""
    return tuple(os.path.realpath(p) for p in paths)


def _binds(plan: SandboxPlan) -> list[tuple[str, str, str]]:
    """Every bind after the top-level ones: same-path binds, then the volumes. Remembered
    for the last few plans (asked four times per task start, a realpath per path)."""
    return list(_binds_of(plan))


@functools.lru_cache(maxsize=16)
def _binds_of(plan: SandboxPlan) -> tuple[tuple[str, str, str], ...]:
    volumes = [("--bind", host, inside) for host, inside in plan.volumes]
    return tuple(_same_path_binds(plan) + sorted(volumes, key=lambda b: len(Path(b[2]).parts)))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def bwrap_argv(plan: SandboxPlan, bwrap: str = "bwrap") -> list[str]:
    """The ``bwrap ... --`` prefix that runs a program in the sandbox of ``plan``."""
    args = [bwrap, "--bind", str(plan.root_dir), "/"]
    args += _top_level_args(plan)
    args += _system_args(plan.host_root)
    if plan.host_uid is None:
        args += _secret_args(plan.host_root)
    else:
        args += _cover_args(idmapped_covers(plan))
    for path in _covered(plan):  # before the binds: a task's output may be under it
        args += ["--tmpfs", path]
    if plan.host_uid is not None:
        args += _reachable_parents(plan)
    for flag, host, inside in _binds(plan):
        args += [flag, host, inside]
    if plan.hosts_file is not None:
        args += ["--ro-bind", str(plan.hosts_file), "/etc/hosts"]
    privileges = PRIVILEGE_ARGS if plan.host_uid is None else REMAP_ARGS
    args += [*privileges, "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--hostname", plan.hostname]
    return [*args, "--die-with-parent", "--chdir", "/", "--"]


def _reachable_parents(plan: SandboxPlan) -> list[str]:
    """``--perms 0755 --dir P`` for every folder above a bind's destination: bwrap makes
    missing ones with mode 0700 as the host's root, which a task whose uid 0 is not the
    host's could not pass (``/root/.pyenv`` above the interpreter, ``/tmp/...`` above its
    output folder, ``/mnt`` above a volume). Existing folders keep their mode."""
    tops = {f"/{e.name}" for e in _system_tops(plan.host_root)}
    parents: set[str] = set()
    for _flag, _host, inside in _binds(plan):
        parent = os.path.dirname(inside.rstrip("/"))
        while parent not in ("/", "") and parent not in tops:
            parents.add(parent)
            parent = os.path.dirname(parent)
    args: list[str] = []
    for parent in sorted(parents, key=lambda p: (len(Path(p).parts), p)):
        args += ["--perms", "0755", "--dir", parent]
    return args


def bwrap_end(prefix: list[str]) -> int:
    """The index of bwrap's ``--`` in a prefix made with ``bwrap_argv`` (after an optional
    ``nsenter ... --``): where ``--info-fd`` and ``--userns-block-fd`` go."""
    ends = [i for i, arg in enumerate(prefix) if arg == "--"]
    start = next((i for i, arg in enumerate(prefix) if os.path.basename(arg) == "bwrap"), 0)
    return next(i for i in ends if i > start)


def task_owned(plan: SandboxPlan) -> tuple[list[str], list[str]]:
    """With ``host_uid``: the host folders the runner gives to the task before it starts
    (its root, ``/tmp``, its private folders, the top of each system folder's private
    layer and of each idmapped layer) and those whose every folder below it also gives
    (``/usr/local``, only where ``/usr`` is not idmapped: an idmapped ``/usr`` already shows
    root's folders as the task's, and giving each folder would copy every one of them up)."""
    own = [str(plan.root_dir), str(plan.root_dir / "tmp"),
           *(str(plan.root_dir / d.lstrip("/")) for d in PRIVATE_DIRS)]
    below: list[str] = []
    idmapped = _idmapped(plan)
    for name in sorted(_overlaid(plan)):
        view = str(_layer_dir(plan, name, "mnt"))
        own.append(view)
        if name == "usr" and "usr" not in idmapped:
            # without the idmapped /usr, pip's /usr/local is given folder by folder: every
            # folder is copied up into the task's layer (hundreds where CUDA lives there)
            own.append(os.path.join(view, "local"))
            below.append(os.path.join(view, "local"))
    # an idmapped layer's top folder is its upper folder (made by the runner as root)
    own += [layer.target for layer in map(functools.partial(_idmapped_layer, plan), _idmapped(plan))
            if layer.target not in own]
    return own, below


def _covered(plan: SandboxPlan) -> list[str]:
    """The ``hidden`` folders that a shown system folder holds (those to cover)."""
    shown = {e.name for e in _system_tops(plan.host_root) if e.link is None and not e.empty}
    return [real for real in (os.path.realpath(p) for p in plan.hidden)
            if _top(real) in shown and len(Path(real).parts) > 2]


def clear_links(plan: SandboxPlan) -> list[str]:
    """Remove the symlinks (and files) a task left where bwrap will make a mount point or
    folder: in ``root_dir``, or in a system folder's private layer (``upper``). bwrap makes
    them as root before the task's view exists and would follow a link there to the host
    (``ln -s /etc /root`` then a bind at ``/root/.pyenv``). Call before each start.

    Returns:
        the paths inside the sandbox that were removed.
    """
    if not os.path.lexists(plan.root_dir) and (plan.overlay_dir is None
                                               or not os.path.lexists(plan.overlay_dir)):
        return []  # a fresh sandbox (not a RESTART in place): nothing a task left
    removed: list[str] = []
    overlaid = _overlaid(plan)
    inside = [f"/{e.name}" for e in _system_tops(plan.host_root) if e.link is None]
    secrets = secret_covers(plan.host_root)
    files = {"/etc/hosts", *(p for p, is_dir in secrets if not is_dir)}
    inside += [*PRIVATE_DIRS, "/tmp", "/etc/hosts", *(b[2] for b in _binds(plan))]
    inside += [p for p, _is_dir in secrets]
    covers = idmapped_covers(plan)
    files |= {p for p, is_dir in covers if not is_dir}
    inside += [p for p, _is_dir in covers]
    idmapped = {f"/{rel}": Path(_idmapped_layer(plan, rel).upper) for rel in _idmapped(plan)}
    for path in inside:
        parts = Path(path).parts[1:]
        base = plan.root_dir
        own = next((f for f in sorted(idmapped, key=len, reverse=True) if _under(path, f)), None)
        if own is not None:
            base, parts = idmapped[own], Path(path).parts[len(Path(own).parts):]
        elif parts and parts[0] in overlaid and plan.overlay_dir is not None:
            base, parts = _layer_dir(plan, parts[0], "upper"), parts[1:]
        gone = _clear_on_the_way(base, parts, last_may_be_file=path in files)
        if gone is not None:
            removed.append(path)
    return removed


def _clear_on_the_way(base: Path, parts: tuple[str, ...], last_may_be_file: bool) -> Path | None:
    """Unlink the first symlink (or misplaced file) on ``base/parts``; returns it if any."""
    place = base
    for index, part in enumerate(parts):
        place = place / part
        is_last = index == len(parts) - 1
        if place.is_symlink() or (place.exists() and not place.is_dir()
                                  and not (is_last and last_may_be_file)):
            place.unlink()
            return place
        if not place.exists():
            return None
    return None


def sandbox_mounts(plan: SandboxPlan) -> tuple[dict[str, str], list[str]]:
    """What the sandbox of ``plan`` shows where, for a process outside it (the runner, once
    the ``overlays`` are mounted).

    Returns:
        ``{path inside: host path}`` (``/`` is the root folder; a system folder is its
        overlay's merged view or the host's; a top-level symlink is what it points to; the
        binds are themselves) and the entries bound read-only. Feeds
        ``SandboxSettings.mounts`` and ``readonly``.
    """
    mounts = {"/": str(plan.root_dir)}
    readonly: set[str] = set()
    overlaid = _overlaid(plan)
    for entry in _system_tops(plan.host_root):
        name = entry.name
        if entry.link is not None or entry.empty and name not in overlaid:
            continue  # links are followed below; empty folders are the sandbox's own
        if name in overlaid:
            assert plan.overlay_dir is not None
            mounts[f"/{name}"] = str(_layer_dir(plan, name, "mnt"))
        else:
            mounts[f"/{name}"] = entry.path
            readonly.add(f"/{name}")
    for entry in _system_tops(plan.host_root):
        if entry.link is not None:
            _add_link(mounts, readonly, f"/{entry.name}", entry.link)
    for flag, host, inside in _binds(plan):
        mounts[inside] = host
        (readonly.add if flag == "--ro-bind" else readonly.discard)(inside)
    return mounts, sorted(readonly)


def _add_link(mounts: dict[str, str], readonly: set[str], link: str, target: str) -> None:
    """``/bin -> usr/bin``: ``/bin`` maps where ``/usr/bin`` does."""
    resolved = os.path.normpath(os.path.join("/", target))
    top = f"/{_top(resolved)}"
    if top in mounts:
        rest = resolved[len(top):].lstrip("/")
        mounts[link] = f"{mounts[top].rstrip('/')}/{rest}" if rest else mounts[top]
        if top in readonly:
            readonly.add(link)


@functools.lru_cache(maxsize=1)
def overlay_supported() -> bool:
    """Whether the runner can mount the private writable layers here: as root (it mounts in
    the init user namespace) with overlayfs in ``/proc/filesystems``. Asked once."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/filesystems", encoding="utf-8") as handle:
            return any(line.split()[-1:] == ["overlay"] for line in handle)
    except OSError:
        return False


def hosts_file_text(hosts: dict[str, str]) -> str:
    """``/etc/hosts`` for a task: localhost plus one line per task of its group, each IPv4
    address also in its IPv4-mapped IPv6 form (``::ffff:10.0.0.2``).

    Why the mapped lines: a dual-stack server (torch's TCPStore listens on ``::``) sees an
    IPv4 peer as ``::ffff:a.b.c.d`` and torch names every accepted peer with
    ``getnameinfo`` (c10d ``socket.cpp``, ``formatSockAddr``, no ``NI_NUMERICHOST``). glibc's
    ``files`` source does not map that form back to the IPv4 line, so without these lines
    each rendezvous connection asked DNS for a PTR record, and one unanswered query held the
    store's single thread for the resolver's timeout (10 s: ``resolv.conf(5)``, timeout 5 x
    attempts 2) while the whole gang waited.

    Args:
        hosts: task name -> IPv4 or IPv6 address of each task of the group.

    Returns:
        The file's text, one ``ADDRESS<TAB>NAME`` line per address.
    """
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             "::ffff:127.0.0.1\tlocalhost"]
    for name, address in sorted(hosts.items()):
        lines.append(f"{address}\t{name}")
        if ":" not in address:
            lines.append(f"::ffff:{address}\t{name}")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def probe_remap(bwrap: str = "bwrap") -> str | None:
    """Whether the task's uid 0 can be mapped to ``TASK_HOST_UID`` here (``REMAP_ARGS``):
    as root; runs ``id -u`` through a real handshake (``linux.userns``, bwrap started as
    ``TASK_HOST_UID``) once per process. Returns None if it works, else why not."""
    if os.geteuid() != 0:
        return "the server does not run as root (bwrap maps uid 0 to its own user)"
    from trainyard.runfile import UserNamespace
    from trainyard.linux.userns import Handshake

    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *REMAP_ARGS,
            "--unshare-pid", "--", "sh", "-c", "id -u; cat /proc/self/uid_map"]
    shake = Handshake(UserNamespace(host_uid=TASK_HOST_UID, host_gid=TASK_HOST_UID,
                                    args_at=argv.index("--")))
    try:
        proc = shake.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        shake.started()
        shake.close()
        return str(exc)
    shake.started()
    try:
        shake.finish(timeout_s=15)
        out, _ = proc.communicate(timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc.kill()
        proc.wait()
        shake.close()
        return f"the user namespace handshake failed: {exc}"
    lines = out.decode(errors="replace").split()
    if proc.returncode != 0 or lines[:3] != ["0", "0", str(TASK_HOST_UID)]:
        return f"the remapped sandbox said {out.decode(errors='replace').strip()!r}"
    return None


def probe_bwrap(prefix: list[str] | None = None, bwrap: str = "bwrap") -> str | None:
    """Run ``true`` in a minimal sandbox (after ``prefix``, e.g. an ``nsenter`` prefix).
    Returns None if bubblewrap works here, else why not."""
    if shutil.which(bwrap) is None:
        return f"{bwrap} is not installed"
    argv = [*(prefix or []), bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev",
            "--proc", "/proc", *PRIVILEGE_ARGS, "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
