"""URL transfers: upload local files to a URL, download a URL, list it (OSMO docs, "Inputs
and Outputs", ``url:``; ``osmo data upload|download|list``).

Uploads are atomic per file (``storage`` module rules): a reader never sees half a file,
but a failed upload leaves the files sent before the failure (the transfer raises, and the
runner fails the task with 2012). Downloads of a URL that holds checkpoint rounds
(``.trainyard/rounds/``) read one committed round (``checkpoints`` module rule); other URLs
are read file by file as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

from trainyard.data.checkpoints import has_checkpoint, read_checkpoint
from trainyard.data.storage import Location, RemoteFile
from trainyard.data.transfer import Mover, TransferStats, file_filter, plan_uploads
from trainyard.errors import DataError

__all__ = ["upload", "download", "list_url", "delete"]


def upload(
    url: str | PathLike[str],
    paths: Sequence[str | Path],
    regex: str | None = None,
    mover: Mover | None = None,
) -> TransferStats:
    """Upload local files and folders below ``url`` (naming: ``transfer.plan_uploads``).

    Raises:
        DataError: a path is missing, the regex is bad, or a file failed for good (names the
            file and the cause).
    """
    mover = mover or Mover()
    files = plan_uploads(paths, regex)
    return mover.upload_files(files, mover.location(url))


def list_url(
    url: str | PathLike[str], regex: str | None = None, mover: Mover | None = None
) -> list[RemoteFile]:
    """The files at ``url`` whose path relative to it matches ``regex``.

    Raises:
        DataError: ``url`` does not exist or the storage failed.
    """
    mover = mover or Mover()
    keep = file_filter(regex)
    return [f for f in mover.list_files(mover.location(url)) if keep(f.rel)]


def delete(url: str | PathLike[str], regex: str | None = None, mover: Mover | None = None) -> int:
    """Delete the files at ``url`` whose path relative to it matches ``regex`` (OSMO's
    ``data delete``); how many.

    Raises:
        DataError: ``url`` does not exist, the regex is bad, or the storage failed.
    """
    mover = mover or Mover()
    loc = mover.location(url)
    files = [f for f in mover.list_files(loc) if file_filter(regex)(f.rel)]
    for found in files:
        mover.storage_call(f"delete {found.path}", functools.partial(loc.fs.rm_file, found.path))
    return len(files)


def download(
    url: str | PathLike[str],
    dest: Path,
    regex: str | None = None,
    mover: Mover | None = None,
    missing_ok: bool = False,
    resume: bool = False,
) -> int:
    """Download the files at ``url`` (a folder-like prefix, or one file) into ``dest``.

    Args:
        missing_ok: nothing at ``url`` gives an empty ``dest`` (and a log line) instead of an
            error. A task's ``url:`` input works so: an object store cannot tell an empty
            prefix from a missing one, and OSMO's reschedule sample reads its checkpoint
            location as an input before the first run has written anything there.
        resume: OSMO's ``data download --resume``: a file already in ``dest`` with the
            remote file's size is kept, not fetched again (an interrupted download goes on).

    Returns:
        The number of files written.

    Raises:
        DataError: ``url`` does not exist (unless ``missing_ok``), the regex is bad, or a
            file failed for good.
    """
    mover = mover or Mover()
    loc = mover.location(url)
    keep = file_filter(regex)
    dest.mkdir(parents=True, exist_ok=True)
    if has_checkpoint(mover, loc):
        return read_checkpoint(mover, loc, dest, regex)
    try:
        listed = mover.list_files(loc)
    except DataError as exc:
        if not (
            missing_ok and isinstance(exc.__cause__, FileNotFoundError) and _container_exists(loc)
        ):
            raise
        mover.log(f"{loc.show()}: nothing there yet, the input is an empty folder")
        return 0
    files = [f for f in listed if keep(f.rel) and not (resume and _have(dest, f.rel, f.size))]
    return mover.download_files(files, loc, dest).files


def _have(dest: Path, rel: str, size: int) -> bool:
    """Whether ``dest/rel`` is a file of ``size`` bytes already."""
    try:
        return (dest / rel).stat().st_size == size
    except OSError:
        return False


_FOLDER_LIKE = frozenset({"file", "local", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def _container_exists(loc: Location) -> bool:
    """Whether an empty ``loc`` is plausible: a folder-like store (not HTTP, where nothing
    there is an error) whose bucket exists (a local path needs no existing parent)."""
    if loc.protocol not in _FOLDER_LIKE:
        return False
    if loc.is_local:
        return True
    bucket = loc.root.split("/", 1)[0]
    try:
        return bool(loc.fs.exists(bucket))
    except OSError:
        return False
