"""File system steps the runner does for a sandboxed task from outside its sandbox, safely.

- ``write_inside``: write a file into a folder the task controls without following any
  symlink below it (each component opened ``O_NOFOLLOW`` with ``openat``): a link left by an
  earlier attempt, or one swapped in between two steps, is refused, never followed.
- ``mount_overlays``: move the calling thread into a mount namespace of its own and mount the
  task's private writable layers (``OverlayMount``) there; the host's mount table never sees them.
- ``files_inside``/``open_no_links``: list and open a folder the task controls for an upload;
  a link to a regular file inside the folder is listed under its own name, any other link is
  skipped with a log line; opening is ``O_NOFOLLOW`` component by component.
Why each step: docs/security.md, "Steps outside the sandbox (safefs.py)".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from trainyard.linux.libc import libc as c_library
from trainyard.runfile import OverlayMount

__all__ = [
    "write_inside",
    "remove_inside",
    "open_folder_inside",
    "open_folder_at",
    "write_at",
    "link_at",
    "mount_overlays",
    "SymlinkRefused",
    "files_inside",
    "open_no_links",
    "no_links_path",
]

_CLONE_NEWNS = 0x00020000
_MS_NODEV = 0x4
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18


class SymlinkRefused(OSError):
    """A path component inside the task's folder is a symlink (or not a folder)."""


def _open_dir(parent_fd: int, name: str, create: bool, owner: tuple[int, int] | None = None) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass  # made meanwhile; opened below with the same checks
        fd = os.open(name, flags, dir_fd=parent_fd)
        if owner is not None:
            os.fchown(fd, *owner)
        return fd
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SymlinkRefused(
                exc.errno,
                f"{name!r} is a symlink or not a folder; the runner follows no link the task made",
            ) from exc
        raise


def write_inside(
    base: str, relative: str, text: str, mode: int = 0o755, owner: tuple[int, int] | None = None
) -> None:
    """Write ``text`` to ``base/relative``, making missing folders, following no symlink
    below ``base`` (``base`` itself is the backend's, trusted). With ``owner`` (uid, gid),
    the file and the folders made for it are given to it (a task whose uid 0 is not the
    host's may then change them, as a pod's root may change its files).

    Raises:
        SymlinkRefused: a component of ``relative`` is a symlink (or a file where a folder
            is needed).
        OSError: anything else (read-only file system, no space, ``relative`` empty).
    """
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, f"not a file path below the task's folder: {relative!r}")
    os.makedirs(base, exist_ok=True)  # the backend's folder (a root made on first use)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            next_fd = _open_dir(fd, name, create=True, owner=owner)
            os.close(fd)
            fd = next_fd
        _write_file(fd, parts[-1], text, mode, owner)
    finally:
        os.close(fd)


def open_folder_inside(base: str, relative: str, owner: tuple[int, int] | None = None) -> int:
    """A file descriptor of the folder ``base/relative`` (the caller closes it), missing
    folders made (given to ``owner``), following no symlink below ``base``.

    Raises:
        SymlinkRefused: a component of ``relative`` is a symlink (or a file).
        OSError: anything else.
    """
    os.makedirs(base, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_folder_at(fd, relative, owner)
    finally:
        os.close(fd)


def open_folder_at(dir_fd: int, relative: str, owner: tuple[int, int] | None = None) -> int:
    """``open_folder_inside`` below the folder ``dir_fd`` (left open)."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EINVAL, f"not a folder below the task's folder: {relative!r}")
    fd = os.dup(dir_fd)
    try:
        for name in parts:
            next_fd = _open_dir(fd, name, create=True, owner=owner)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_at(
    dir_fd: int, name: str, text: str, mode: int = 0o644, owner: tuple[int, int] | None = None
) -> None:
    """Write ``text`` to the file ``name`` of the folder ``dir_fd``, never through a link
    there (``SymlinkRefused``)."""
    _write_file(dir_fd, name, text, mode, owner)


def link_at(dir_fd: int, name: str, target: str, owner: tuple[int, int] | None = None) -> None:
    """Make ``name`` in the folder ``dir_fd`` a symlink to ``target``, replacing a link or
    file there (a folder there: IsADirectoryError); with ``owner``, the link is given to it."""
    try:
        if os.readlink(name, dir_fd=dir_fd) == target:
            return
    except OSError:
        pass
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    os.symlink(target, name, dir_fd=dir_fd)
    if owner is not None:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def remove_inside(base: str, relative: str) -> None:
    """Remove the file ``base/relative`` following no symlink below ``base`` (a folder the
    task swapped for a link is not followed; a link in the file's place is removed itself).

    Raises:
        SymlinkRefused: a folder of ``relative`` is a symlink.
        OSError: anything else (FileNotFoundError when it is gone).
    """
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, f"not a file path below the task's folder: {relative!r}")
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            next_fd = _open_dir(fd, name, create=False)
            os.close(fd)
            fd = next_fd
        os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def _write_file(
    dir_fd: int, name: str, text: str, mode: int, owner: tuple[int, int] | None = None
) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkRefused(
                exc.errno, f"{name!r} is a symlink; the runner follows no link the task made"
            ) from exc
        raise
    try:
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, *owner)
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as handle:
            handle.write(text)
    finally:
        os.close(fd)


def mount_overlays(overlays: Sequence[OverlayMount]) -> None:
    """Give the calling thread a private mount namespace holding ``overlays`` (see module
    docstring). Idempotent per thread only in the sense that calling it with no overlays
    does nothing. Needs CAP_SYS_ADMIN (root).

    Raises:
        OSError: the kernel refused (naming the step and the folder).
    """
    if not overlays:
        return
    libc = c_library()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(
        libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None),
        "making / private in the task's mount namespace",
    )
    for layer in overlays:
        _mount_overlay(libc, layer)


_LAYER_USERNS: dict[tuple[int, int, int | None, int | None], tuple[int, int, int, int]] = {}
"""(uid, gid, uid base, gid base) -> (pid that made it, fd, st_dev, st_ino) of the idmapped
layers' user namespace."""


def layer_userns_fds() -> set[int]:
    """The descriptors of the idmapped layers' user namespaces this process holds: a
    launcher's spare runner keeps them open (``backends.local.launcher``), so a forked runner
    uses the launcher's namespace instead of forking a child to make its own (on the start of
    a task with an output)."""
    return {fd for _pid, fd, _dev, _ino in _LAYER_USERNS.values()}


def _layer_userns(
    host_uid: int, host_gid: int, uid_base: int | None = None, gid_base: int | None = None
) -> int:
    """The user namespace of an idmapped layer (``_id_map`` with ``keep_others``), made
    once per process (a forked child each time otherwise: a hosted runner's launcher
    starts many tasks); its descriptor stays open for the process's life. A forked
    process uses the one it inherited while that descriptor still is that namespace;
    made again when it no longer is (closed by a process that closes every descriptor it
    does not know, its number reused)."""
    key = (host_uid, host_gid, uid_base, gid_base)
    known = _LAYER_USERNS.get(key)
    if known is not None:
        try:
            info = os.fstat(known[1])
            if (info.st_dev, info.st_ino) == known[2:]:
                return known[1]
        except OSError:
            pass
    fd = _mapped_userns(host_uid, host_gid, keep_others=True, bases=(uid_base, gid_base))
    info = os.fstat(fd)
    _LAYER_USERNS[key] = (os.getpid(), fd, info.st_dev, info.st_ino)
    return fd


def _mount_overlay(libc: ctypes.CDLL, layer: OverlayMount) -> None:
    """One layer of ``mount_overlays``: its idmapped lower attached first, if asked."""
    _make_folders(layer.upper, layer.work, layer.target)
    if layer.lower_below:
        _mount_stacked_overlay(libc, layer)
        return
    lower = layer.lower
    if layer.idmap_uid is not None:
        lower = os.path.join(os.path.dirname(layer.work), "lower")
        _make_folders(lower)
        gid = layer.idmap_uid if layer.idmap_gid is None else layer.idmap_gid
        _attach(layer.lower, lower, _layer_userns(layer.idmap_uid, gid))
    base = os.path.dirname(layer.work)
    lowers = ":".join(_escaped(_short(path, base)) for path in [*layer.lower_above, lower])
    options = (
        f"lowerdir={lowers},upperdir={_escaped(_short(layer.upper, base))},"
        f"workdir={_escaped(_short(layer.work, base))}"
    )
    _mount_in(libc, base, layer, options, f"overlay over {layer.lower} at {layer.target}")


def _short(path: str, base: str) -> str:
    """``path`` relative to ``base`` when it lies below it, else as given."""
    return path[len(base) + 1 :] if path.startswith(base.rstrip("/") + "/") else path


def _make_folders(*folders: str) -> None:
    """Make each of ``folders`` (and missing parents): one ``mkdir`` each where the parent
    is there (``os.makedirs`` looks at the parent first), a folder already there is fine."""
    for folder in folders:
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)


def _mount_in(libc: ctypes.CDLL, base: str, layer: OverlayMount, options: str, what: str) -> None:
    """Mount the overlay of ``layer`` with ``options``, whose paths are relative to ``base``
    (the folder holding its upper and work folders): the calling thread's working
    directory (its own since ``unshare(CLONE_NEWNS)`` implies ``CLONE_FS``) moves there for
    the mount and back. The kernel keeps the options as given and prints them in every
    line of ``/proc/self/mountinfo`` that shows the overlay: short ones make each of
    bwrap's reads of that table (one per bind, ~19 per task) cheaper."""
    back = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(base)
        _check(
            libc.mount(
                b"overlay", layer.target.encode(), b"overlay", _flags(layer), options.encode()
            ),
            what,
        )
    finally:
        os.fchdir(back)
        os.close(back)


def _flags(layer: OverlayMount) -> int:
    return _MS_NODEV if layer.nodev else 0


def _mount_stacked_overlay(libc: ctypes.CDLL, layer: OverlayMount) -> None:
    """``_mount_overlay`` of a layer with ``lower_below`` (a container image's layers, top
    first): each lower attached (idmapped, if asked) at ``lower``, ``lower.1``... in the
    folder holding ``work``, and the overlay mounted with paths relative to that folder (the
    calling thread's working directory, its own since ``unshare(CLONE_NEWNS)`` implies
    ``CLONE_FS``, moves there for the mount and back)."""
    base = os.path.dirname(layer.work)
    lowers = [layer.lower, *layer.lower_below]
    names = [os.path.relpath(folder, base) for folder in lowers]
    if layer.idmap_uid is not None:
        gid = layer.idmap_uid if layer.idmap_gid is None else layer.idmap_gid
        names = ["lower" if index == 0 else f"lower.{index}" for index in range(len(lowers))]
        userns = _layer_userns(layer.idmap_uid, gid, layer.idmap_uid_base, layer.idmap_gid_base)
        for folder, name in zip(lowers, names, strict=True):
            _make_folders(os.path.join(base, name))
            _attach(folder, os.path.join(base, name), userns)
    relative = [os.path.relpath(p, base) for p in (layer.upper, layer.work)]
    options = (
        f"lowerdir={':'.join(_escaped(n) for n in names)},"
        f"upperdir={_escaped(relative[0])},workdir={_escaped(relative[1])}"
    )
    _mount_in(
        libc,
        base,
        layer,
        options,
        f"overlay over {len(lowers)} layers ({layer.lower}...) at {layer.target}",
    )


def _escaped(path: str) -> str:
    """A path as overlayfs' option parser wants it (``\\``, ``,`` and ``:`` escaped)."""
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def files_inside(root: Path, log: Callable[[str], None] | None = None) -> list[tuple[Path, str]]:
    """The regular files below folder ``root`` (or ``root`` itself when it is a file) as
    (real path, path relative to ``root`` with ``/``), sorted by the relative path, following
    no symlink out of ``root`` (module docstring). Folders that are links are not entered;
    other links are kept only when they name a regular file inside ``root``; the others are
    skipped with ``REL: a symlink to TARGET, outside FOLDER (not uploaded)`` given to ``log``.
    FIFOs, sockets and devices are skipped silently.

    Raises:
        OSError: ``root`` cannot be read.
    """
    say = log or (lambda _line: None)
    if not root.is_dir():
        return [(Path(os.path.realpath(root)), root.name)] if root.is_file() else []
    base = os.path.realpath(root)
    found: list[tuple[Path, str]] = []
    for folder, dirs, names in os.walk(base):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, base).replace(os.sep, "/")
            if not os.path.islink(path):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append((Path(path), rel))
                continue
            real = os.path.realpath(path)
            if not (real.startswith(base.rstrip("/") + "/") and os.path.isfile(real)):
                say(
                    f"{rel}: a symlink to {os.readlink(path)}, outside {root} or not a file "
                    "there (not uploaded: uploads follow no link out of their folder)"
                )
                continue
            found.append((Path(real), rel))
    return sorted(found, key=lambda item: item[1])


def open_no_links(path: str | os.PathLike[str]) -> int:
    """Open the absolute ``path`` for reading, following no symlink on the way: each
    component is opened with ``O_NOFOLLOW`` relative to the one before, from ``/`` (give a
    real path, ``files_inside`` lists them). Only a regular file is accepted (a FIFO would
    block the reader).

    Returns:
        a file descriptor (``O_CLOEXEC``), the caller closes it.

    Raises:
        SymlinkRefused: a component is a symlink, or the file is not a regular file.
        OSError: anything else (missing, no permission).
    """
    parts = [p for p in os.fspath(path).split("/") if p not in ("", ".")]
    if not os.fspath(path).startswith("/") or not parts or ".." in parts:
        raise OSError(errno.EINVAL, f"not an absolute real path: {os.fspath(path)!r}")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                next_fd = os.open(
                    name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SymlinkRefused(
                        exc.errno,
                        f"{os.fspath(path)}: {name!r} is a symlink "
                        "or not a folder; uploads follow no link",
                    ) from exc
                raise
            os.close(fd)
            fd = next_fd
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            file_fd = os.open(parts[-1], flags, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SymlinkRefused(
                    exc.errno, f"{os.fspath(path)} is a symlink; uploads follow no link"
                ) from exc
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise SymlinkRefused(errno.EINVAL, f"{os.fspath(path)} is not a regular file")
    os.set_blocking(file_fd, True)
    return file_fd


@contextlib.contextmanager
def no_links_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """A path naming the file ``open_no_links`` opened (``/proc/self/fd/N``), for code that
    opens by name (``shutil``, fsspec): opening it reaches that very file, whatever happens
    to ``path`` meanwhile. Closed on exit."""
    fd = open_no_links(path)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # the same on every arch
_OPEN_TREE_CLONE = 1
_AT_EMPTY_PATH = 0x1000
_MOUNT_ATTR_IDMAP = 0x00100000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def private_mount_namespace() -> None:
    """Move the calling thread into a mount namespace of its own (as ``mount_overlays``
    does), for a caller that mounts nothing else. Raises OSError."""
    libc = c_library()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(
        libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None),
        "making / private in the task's mount namespace",
    )


def idmap_in_place(paths: Sequence[str], host_uid: int, host_gid: int) -> None:
    """Mount each host folder of ``paths`` over itself, idmapped so that what the host's
    root owns there is seen as owned by ``host_uid``/``host_gid`` and what they create is
    owned by the host's root on disk: a task whose uid 0 is ``host_uid`` writes a volume as
    the host's root would (as before the remap). Only in the calling thread's mount
    namespace (call ``mount_overlays`` or ``private_mount_namespace`` first). Needs the file
    system to support idmapped mounts (ext4, xfs, btrfs, tmpfs...).

    Raises:
        OSError: the kernel refused (naming the folder and the step).
    """
    if not paths:
        return
    userns_fd = _mapped_userns(host_uid, host_gid)
    try:
        for path in paths:
            _attach(path, path, userns_fd)
    finally:
        os.close(userns_fd)


def attach_idmapped(source: str, dest: str, host_uid: int, host_gid: int) -> None:
    """Attach a clone of the mount at ``source`` (that folder and below, not the mounts
    under it) at the folder ``dest``, idmapped as ``idmap_in_place`` does: the host's root
    files seen as owned by ``host_uid``/``host_gid``. Only in the calling thread's mount
    namespace. Unlike ``idmap_in_place`` the other ids keep theirs (and ``host_uid``'s own
    files are seen as the host root's, the two swapped): overlayfs refuses to copy up a file
    whose owner the mount does not map (``/usr/local/share/fonts`` of group ``staff``).
    Raises OSError (naming the folder and the step)."""
    userns_fd = _mapped_userns(host_uid, host_gid, keep_others=True)
    try:
        _attach(source, dest, userns_fd)
    finally:
        os.close(userns_fd)


def _attach(source: str, dest: str, userns_fd: int) -> None:
    libc = c_library()
    tree = libc.syscall(_SYS_OPEN_TREE, -100, source.encode(), _OPEN_TREE_CLONE | os.O_CLOEXEC)
    _check(0 if tree >= 0 else -1, f"open_tree({source})")
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
        _check(
            libc.syscall(
                _SYS_MOUNT_SETATTR,
                tree,
                b"",
                _AT_EMPTY_PATH,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            ),
            f"idmapping {source}",
        )
        _check(
            libc.syscall(_SYS_MOVE_MOUNT, tree, b"", -100, dest.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
            f"mounting {source} idmapped at {dest}",
        )
    finally:
        os.close(tree)


MAPPED_OTHER_IDS = 65535
"""With a base (``_id_map``), ids 1..65535 map to BASE..BASE + 65534."""


def _id_map(host_id: int, keep_others: bool, base: int | None = None) -> str:
    """0 to ``host_id``; with ``base`` also 1..65535 to ``base``.. (``MAPPED_OTHER_IDS``) and
    nothing else; else with ``keep_others`` also ``host_id`` to 0 and every other id to
    itself (a user namespace's map lines never overlap on either side)."""
    if base is not None:
        return f"0 {host_id} 1\n1 {base} {MAPPED_OTHER_IDS}\n"
    if not keep_others:
        return f"0 {host_id} 1\n"
    lines = [(0, host_id, 1), (host_id, 0, 1)]
    for start, end in ((1, host_id), (host_id + 1, (1 << 32) - 1)):  # -1 is no id
        if end > start:
            lines.append((start, start, end - start))
    return "".join(f"{a} {b} {n}\n" for a, b, n in lines)


def _mapped_userns(
    host_uid: int,
    host_gid: int,
    keep_others: bool = False,
    bases: tuple[int | None, int | None] = (None, None),
) -> int:
    """A descriptor of a new user namespace mapping 0 to ``host_uid``/``host_gid`` (see
    ``_id_map``): a forked child makes it and waits until its maps are written and the
    namespace is opened."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        code = 1
        try:
            libc = c_library()
            if libc.unshare(0x10000000) == 0:
                os.write(ready_w, b"1")
                os.read(go_r, 1)
                code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "cannot make a user namespace for an idmapped mount")
        for name, text in (
            ("uid_map", _id_map(host_uid, keep_others, bases[0])),
            ("gid_map", _id_map(host_gid, keep_others, bases[1])),
        ):
            with open(f"/proc/{child}/{name}", "w", encoding="ascii") as handle:
                handle.write(text)
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.write(go_w, b"1")
        os.close(go_w)
        os.close(ready_r)
        os.waitpid(child, 0)
