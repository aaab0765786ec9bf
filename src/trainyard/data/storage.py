"""The fsspec edge: a URL becomes a ``Location`` (filesystem + root path), and the few
operations the data layer needs, each with one atomicity rule.

Protocols: ``file://`` and plain paths; ``s3://`` through s3fs (``DataConfig.s3_endpoint_url``,
the standard AWS variables); any other fsspec protocol whose package is installed.
``put_file``/``write_bytes``: in place on object stores (a PUT is atomic per object), else via
``<name>.trainyard-partial-<random>`` and a rename; ``get_file``: partial name and rename;
``create_exclusive``: whole content only if absent (a hard link on ``file://``,
``If-None-Match: *`` on S3; elsewhere a fallback that can lose a race). Listings skip partial
files and ``.trainyard/``. docs/data.md, "Atomicity rules".
"""

from __future__ import annotations

import hashlib
import itertools
import os
import posixpath
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from fsspec import AbstractFileSystem
from fsspec.callbacks import Callback
from fsspec.core import url_to_fs

from trainyard.data import localcopy
from trainyard.data.config import DataConfig
from trainyard.data.scrub import scrub
from trainyard.errors import DataError

__all__ = [
    "Location",
    "RemoteFile",
    "open_location",
    "list_files",
    "put_file",
    "get_file",
    "read_bytes",
    "write_bytes",
    "create_exclusive",
    "remove",
    "is_reserved",
    "PARTIAL_MARK",
    "META_DIR",
    "OBJECT_STORES",
    "Hashed",
]

PARTIAL_MARK = ".trainyard-partial-"
META_DIR = ".trainyard"
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
"""Protocols whose PUT is atomic per object: no temp name needed."""

_S3_CLIENT_CONFIG = {
    "retries": {"mode": "standard", "total_max_attempts": 1},
    "connect_timeout": 10,
    "read_timeout": 120,
}


@dataclass(frozen=True)
class RemoteFile:
    """A file under a location: ``path`` in the filesystem, ``rel`` below the root."""

    path: str
    rel: str
    size: int


@dataclass(frozen=True)
class Location:
    """A URL resolved to a filesystem and a root path (no trailing slash)."""

    fs: AbstractFileSystem
    root: str
    url: str

    @property
    def protocol(self) -> str:
        proto = self.fs.protocol
        return proto if isinstance(proto, str) else proto[0]

    @property
    def is_local(self) -> bool:
        return self.protocol in ("file", "local")

    @property
    def atomic_put(self) -> bool:
        """Whether a PUT is atomic per object here (no temp name needed)."""
        return self.protocol in OBJECT_STORES

    def join(self, *parts: str) -> str:
        """The filesystem path of ``parts`` below the root."""
        return posixpath.join(self.root, *[p.strip("/") for p in parts if p])

    def child(self, rel: str) -> Location:
        """The location ``rel`` below this one."""
        return Location(self.fs, self.join(rel), f"{self.url.rstrip('/')}/{rel.strip('/')}")

    def show(self, rel: str = "") -> str:
        """The URL (with ``rel``) for messages, credentials masked."""
        return scrub(f"{self.url.rstrip('/')}/{rel}" if rel else self.url)


def _options(protocol: str, config: DataConfig) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if protocol in ("s3", "s3a"):
        options["config_kwargs"] = dict(_S3_CLIENT_CONFIG)
        if config.s3_endpoint_url:
            options["endpoint_url"] = config.s3_endpoint_url
    options.update(config.storage_options.get(protocol, {}))
    return options


def _protocol_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def open_location(url: str | os.PathLike[str], config: DataConfig) -> Location:
    """Resolve ``url`` (a URL or a local path) through fsspec.

    Raises:
        DataError: no filesystem for the protocol (its package is missing; the message names
            the package to install where fsspec knows it) or the URL is malformed.
    """
    url = os.fspath(url)
    protocol = _protocol_of(url)
    options = _options(protocol, config)
    try:
        fs, root = url_to_fs(url, **options)
    except (ImportError, ValueError, TypeError) as exc:
        raise DataError(scrub(f"{url}: cannot open {protocol}:// storage: {exc}")) from exc
    if hasattr(fs, "retries"):
        fs.retries = 1  # the data layer retries (and logs it) itself
    root = root.rstrip("/") or ("/" if protocol == "file" else root)
    return Location(fs, root, url)


def is_reserved(rel: str) -> bool:
    """Whether a relative path is trainyard's own (metadata folder or a partial file)."""
    return rel == META_DIR or rel.startswith(META_DIR + "/") or PARTIAL_MARK in rel


def list_files(loc: Location) -> list[RemoteFile]:
    """Every file below ``loc`` (or ``loc`` itself when it is a file), sorted by ``rel``.

    Reserved paths (``is_reserved``) are left out.

    Raises:
        FileNotFoundError: nothing exists at ``loc``.
        OSError: the storage failed (transient or not: see ``retry.is_transient``).
    """
    fs = loc.fs
    fs.invalidate_cache()
    if not fs.exists(loc.root):
        raise FileNotFoundError(f"{loc.show()} does not exist")
    if fs.isfile(loc.root):
        return [RemoteFile(loc.root, posixpath.basename(loc.root), int(fs.size(loc.root)))]
    found = fs.find(loc.root, detail=True)
    prefix = loc.root.rstrip("/") + "/"
    files = []
    for path, info in found.items():
        rel = path[len(prefix) :] if path.startswith(prefix) else posixpath.basename(path)
        if (
            rel
            and not rel.endswith("/")
            and not is_reserved(rel)
            and info.get("type") != "directory"
        ):
            files.append(RemoteFile(path, rel, int(info.get("size") or 0)))
    return sorted(files, key=lambda f: f.rel)


def _partial(path: str) -> str:
    return f"{path}{PARTIAL_MARK}{uuid.uuid4().hex[:12]}"


def put_file(loc: Location, local: Path, path: str, callback: Callback | None = None) -> None:
    """Copy the local file to ``path`` in ``loc``'s filesystem, atomically (module rules).

    Raises:
        OSError: reading the local file or writing the storage failed.
    """
    fs = loc.fs
    if loc.is_local:
        _local_copy(local, Path(path))
        return
    if loc.atomic_put:
        fs.put_file(str(local), path, callback=callback)
        return
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    temp = _partial(path)
    fs.put_file(str(local), temp, callback=callback)
    fs.mv(temp, path)


def _local_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(_partial(str(target)))
    try:
        shutil.copyfile(source, temp)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def new_hasher(algo: str = "sha256") -> Any:
    """A hashlib-style object for ``algo``: ``sha256`` (hashlib) or ``blake3`` (the
    ``blake3`` package: several times faster, as strong). Raises DataError for another
    name, or for blake3 when the package is missing."""
    make = _HASHERS.get(algo)
    if make is None:
        make = _HASHERS[algo] = _hasher_class(algo)
    return make()


_HASHERS: dict[str, Any] = {"sha256": hashlib.sha256}
"""Hasher classes by name, filled on first use (one lookup per file, not an import)."""


def _hasher_class(algo: str) -> Any:
    if algo == "blake3":
        try:
            import blake3  # a declared dependency; imported on use
        except ImportError as exc:
            raise DataError(
                "this dataset's manifest uses BLAKE3 digests: install the "
                "'blake3' package (pip install blake3)"
            ) from exc
        return blake3.blake3
    raise DataError(f"unknown digest algorithm {algo!r} (known: sha256, blake3)")


class Hashed(NamedTuple):
    """What a hashing copy wrote: the hex digest and the size in bytes of the same bytes."""

    digest: str
    size: int


def copy_hashing(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    callback: Callback | None = None,
    algo: str = "sha256",
    *,
    atomic: bool = True,
) -> Hashed:
    """Copy a local file to a local ``target`` and return the hex digest (``algo``, see
    ``new_hasher``) and the count of the bytes written, computed while copying: each byte is
    read once (hashing after the copy would read everything twice). How (a reused buffer for small
    files, a kernel copy overlapped with hashing for large ones): ``localcopy``. Copies in
    several threads run in parallel (hashing and file I/O release the GIL).

    Args:
        atomic: write a temporary name and rename it onto ``target`` (module rules); False
            writes ``target`` in place, for a folder no reader uses before a manifest names
            its files (a dataset upload's ``data/<upload-id>/``): one rename less per file.

    Returns:
        ``Hashed(digest, size)`` of the bytes copied (a manifest records both: the size a
        listing saw earlier may be stale).

    Raises:
        localcopy.SourceChanged: the source changed while it was read (an OSError).
        OSError: reading or writing failed (the file written is removed).
        DataError: ``algo`` is not available.
    """
    digest = new_hasher(algo)
    progress = callback.relative_update if callback is not None else None
    target = os.fspath(target)
    temp = local_partial(target) if atomic else None
    size = localcopy.copy_file(os.fspath(source), target, digest, progress, temp)
    return Hashed(digest.hexdigest(), size)


_TEMP_TOKEN = uuid.uuid4().hex[:8]
_temp_count = itertools.count()


def local_partial(path: str) -> str:
    """A partial name for a local file, without a random draw per file: a random token per
    process, the pid (forked children share the token) and a counter. The file is created
    exclusively, so a clash fails rather than overwrite."""
    return f"{path}{PARTIAL_MARK}{_TEMP_TOKEN}{os.getpid():x}{next(_temp_count):x}"


def get_file(loc: Location, path: str, local: Path, callback: Callback | None = None) -> None:
    """Copy ``path`` of ``loc``'s filesystem to the local file, atomically (module rules).

    Raises:
        OSError: the storage or the local disk failed.
    """
    if loc.is_local:
        _local_copy(Path(path), local)
        return
    local.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(_partial(str(local)))
    try:
        loc.fs.get_file(path, str(temp), callback=callback)
        os.replace(temp, local)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def read_bytes(loc: Location, path: str) -> bytes:
    """The whole object at ``path``. Raises FileNotFoundError or OSError."""
    return bytes(loc.fs.cat_file(path))


def write_bytes(loc: Location, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, replacing what is there. Raises OSError."""
    if loc.is_local:
        _local_write(Path(path), data, replace=True)
    elif loc.atomic_put:
        loc.fs.pipe_file(path, data)
    else:
        temp = _partial(path)
        loc.fs.pipe_file(temp, data)
        loc.fs.mv(temp, path)


def _local_write(target: Path, data: bytes, replace: bool) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(_partial(str(target)))
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temp, target)
        else:
            os.link(temp, target)  # FileExistsError if taken: an exclusive create
    finally:
        temp.unlink(missing_ok=True)


def create_exclusive(loc: Location, path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` only if nothing is there; whole content or nothing.

    ``file://``: hard link of a finished, fsynced temp file. S3: a PUT with
    ``If-None-Match: *`` (AWS, MinIO, Ceph, R2 and moto honour it). A store that answers
    *not implemented* gets the fallback: exists? -> write -> read back and compare; two writers
    racing within that window can both believe they won (the last write stays). Other
    protocols use the fallback.

    Returns:
        True if this call created it, False if the path already existed.

    Raises:
        OSError: the storage failed.
    """
    if loc.is_local:
        try:
            _local_write(Path(path), data, replace=False)
        except FileExistsError:
            return False
        return True
    if loc.protocol in ("s3", "s3a"):
        try:
            loc.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if "NotImplemented" not in str(exc) and "501" not in str(exc):
                raise
    return _create_checked(loc, path, data)


def _create_checked(loc: Location, path: str, data: bytes) -> bool:
    loc.fs.invalidate_cache()
    if loc.fs.exists(path):
        return False
    write_bytes(loc, path, data)
    return read_bytes(loc, path) == data


def remove(loc: Location, path: str, recursive: bool = False) -> None:
    """Delete ``path`` (a folder with ``recursive``); a missing path is no error. Raises OSError."""
    try:
        if loc.is_local and recursive:
            shutil.rmtree(path)
        else:
            loc.fs.rm(path, recursive=recursive)
    except FileNotFoundError:
        pass
    finally:
        loc.fs.invalidate_cache()
