"""A task's private writable layers over the host's system folders (overlayfs, mounted by the
runner): the root layer, idmapped layers (``IDMAPPED``), the read-only skeleton of folders
(``system_skeleton``) and the fresh layer of apt's and dpkg's files (``fresh_layer``),
built once per process. See docs/local-backend.md "The task sandbox".
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainyard.backends.local.accounts import _FreshItem, account_entries
from trainyard.backends.local.hostscan import _scan_root_only, secret_covers
from trainyard.backends.local.sandboxplan import (
    _FRESH_NAMES,
    _SCAN_LOCK,
    FRESH,
    IDMAPPED,
    ROOT_LAYER,
    SKELETON,
    SandboxPlan,
    _layer,
    _layer_dir,
    _overlaid,
    _under,
)
from trainyard.runfile import FreshPath, OverlayMount

__all__ = [
    "OPAQUE_XATTR",
    "SKELETON_BASE",
    "fresh_layer",
    "fresh_paths",
    "idmapped_covers",
    "overlays",
    "skeleton_base",
    "system_skeleton",
    "warm_host_scans",
]


def overlays(plan: SandboxPlan) -> list[OverlayMount]:
    """The overlay mounts the runner makes before the task starts (``SandboxSettings``)."""
    if plan.overlay_dir is None:
        return []
    layers = sorted({_layer(plan, name) for name in _overlaid(plan)})
    skeleton = _skeleton(plan)
    fresh = _fresh(plan)
    mounts = [
        OverlayMount(
            lower=str(plan.host_root if layer == ROOT_LAYER else plan.host_root / layer),
            upper=str(plan.overlay_dir / layer / "upper"),
            work=str(plan.overlay_dir / layer / "work"),
            target=str(plan.overlay_dir / layer / "mnt"),
            lower_above=[*_skeleton_above(skeleton, layer), *_skeleton_above(fresh, layer)],
        )
        for layer in layers
    ]
    idmapped = [
        _idmapped_layer(plan, rel).model_copy(update={"lower_above": _skeleton_above(fresh, rel)})
        for rel in _idmapped(plan)
    ]
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
    return fresh_layer(plan.skeleton_dir, plan.host_root, plan.host_uid, tuple(_idmapped(plan)))


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
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_mode & 0o077
        or not other_fs
    ):
        return None
    return base


@functools.lru_cache(maxsize=8)
def _skeleton_digest(dirs: tuple[tuple[str, int], ...], uid: int) -> str:
    return hashlib.sha256(repr((uid, dirs)).encode()).hexdigest()[:20]


def _build_skeleton(
    skeleton_dir: Path, final: Path, dirs: tuple[tuple[str, int], ...], uid: int
) -> None:
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
                    found.append(
                        (os.path.relpath(child, host_root), stat.S_IMODE(os.lstat(child).st_mode))
                    )
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
    return stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and info.st_mode & 0o005 == 0o005


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


def fresh_layer(
    skeleton_dir: Path, host_root: Path, uid: int, idmapped: tuple[str, ...] = ()
) -> Path | None:
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
def _fresh_entries(host_root: str, uid: int, idmapped: tuple[str, ...]) -> tuple[_FreshEntry, ...]:
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


def _host_parents(
    host_root: str, rel: str, uid: int, idmapped: tuple[str, ...]
) -> list[_FreshEntry] | None:
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
            base, below = _idmapped_layer(plan, layer).target, rel[len(layer) + 1 :]
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


def _fresh_items(host_root: str) -> tuple[_FreshItem, ...]:
    """``FRESH`` and the host's ``account_entries``: (relative path, is a folder, mode,
    text) of each entry a remapped task gets as its own."""
    return FRESH + account_entries(host_root)


@functools.lru_cache(maxsize=8)
def _fresh_names(host_root: str) -> frozenset[str]:
    return frozenset(rel for rel, *_rest in _fresh_items(host_root))


def _idmapped(plan: SandboxPlan) -> list[str]:
    """The ``idmapped`` folders that get their idmapped layer (see ``SandboxPlan``)."""
    if plan.host_uid is None or plan.overlay_dir is None:
        return []
    return list(_idmapped_on_host(str(plan.host_root), plan.idmapped, _overlaid(plan)))


@functools.lru_cache(maxsize=16)  # asked ~8 times per task start, a realpath per folder
def _idmapped_on_host(
    host_root: str, idmapped: tuple[str, ...], overlaid: frozenset[str]
) -> tuple[str, ...]:
    """Of ``idmapped``, the folders below an ``overlaid`` system folder that the host has as
    real folders (not symlinks), looked at once per process like ``_system_tops``."""
    found = []
    for rel in idmapped:
        host = os.path.join(host_root, rel)
        if (
            rel.split("/")[0] in overlaid
            and os.path.isdir(host)
            and os.path.realpath(host) == os.path.normpath(host)
        ):
            found.append(rel)
    return tuple(found)


def _idmapped_layer(plan: SandboxPlan, rel: str) -> OverlayMount:
    assert plan.overlay_dir is not None and plan.host_uid is not None
    lower, upper, work, target = _idmapped_layer_paths(plan, rel)
    return OverlayMount(
        lower=lower,
        upper=upper,
        work=work,
        target=target,
        idmap_uid=plan.host_uid,
        idmap_gid=plan.host_uid,
    )


@functools.lru_cache(maxsize=64)  # asked ~8 times per task start and folder
def _idmapped_layer_paths(plan: SandboxPlan, rel: str) -> tuple[str, str, str, str]:
    """(lower, upper, work, target) of the idmapped layer of ``rel``."""
    assert plan.overlay_dir is not None
    top, _, rest = rel.partition("/")
    base = plan.overlay_dir / "idmapped" / rel.replace("/", "-")
    target = _layer_dir(plan, top, "mnt") / rest if rest else _layer_dir(plan, top, "mnt")
    return (
        os.path.join(str(plan.host_root), rel),
        str(base / "upper"),
        str(base / "work"),
        str(target),
    )


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
